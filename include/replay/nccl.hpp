#pragma once
#include <replay/detail/require_cxx20.hpp>
// replay's optional NCCL component (CMake target replay::nccl; never included
// by replay/replay.hpp): RAII communicators, collectives on typed buffers that
// are captured into graphs, per-device work taken from the stream's device,
// a multi-rank router whose ranks agree on the bucket every step, and a
// watchdog that reports a stuck replay. See docs/nccl.md.
#include "replay/nccl/error.hpp"
#include "replay/nccl/stream_device.hpp"
#include "replay/nccl/unique_id.hpp"
#include "replay/nccl/communicator.hpp"
#include "replay/nccl/collectives.hpp"
#include "replay/nccl/agreement.hpp"
#include "replay/nccl/watchdog.hpp"
#include "replay/nccl/multi_rank_router.hpp"
