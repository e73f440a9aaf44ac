#pragma once
// replay: CUDA Graphs and multi-stream pipelines made easy, safe and fast.
// The umbrella header; each header below also stands alone. The optional
// components are not included here: replay/decode.hpp (replay::decode),
// replay/torch.hpp (replay::torch), replay/nccl.hpp (replay::nccl) and
// replay/audit.hpp (replay::audit).
#include <replay/detail/require_cxx20.hpp>

#include "replay/version.hpp"
#include "replay/flags.hpp"
#include "replay/error.hpp"
#include "replay/device.hpp"
#include "replay/stream_ref.hpp"
#include "replay/stream.hpp"
#include "replay/event.hpp"
#include "replay/fork_join.hpp"
#include "replay/static_buffer.hpp"
#include "replay/kernel_signature.hpp"
#include "replay/launch_config.hpp"
#include "replay/launch.hpp"
#include "replay/programmatic_launch.hpp"
#include "replay/pdl.hpp"
#include "replay/graph_edge.hpp"
#include "replay/graph.hpp"
#include "replay/capture_scope.hpp"
#include "replay/graph_exec.hpp"
#include "replay/graph_builder.hpp"
#include "replay/piecewise.hpp"
#include "replay/shape_router.hpp"
#include "replay/stream_pipeline.hpp"
#include "replay/batcher.hpp"
