#pragma once
#include <replay/detail/require_cxx20.hpp>
// Dynamic request batching: Batcher gathers single requests from many
// threads into batches for an executor (StagedCudaExecutor over a
// ShapeRouter, or any BatchExecutor). See docs/batching.md.
// IWYU pragma: begin_exports
#include "replay/batcher/batcher.hpp"
#include "replay/batcher/cuda_executor.hpp"
#include "replay/batcher/executor.hpp"
#include "replay/batcher/options.hpp"
#include "replay/batcher/policy.hpp"
#include "replay/batcher/stats.hpp"
#include "replay/batcher/status.hpp"
// IWYU pragma: end_exports
