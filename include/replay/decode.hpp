#pragma once
#include <replay/detail/require_cxx20.hpp>
// LLM decoding: DecodeScheduler runs continuous (or static) batching of
// autoregressive decode steps over an executor that owns the model and its
// KV cache (any DecodeExecutor): requests from many threads, tokens streamed
// as produced, cancellation, K steps per launch, launches padded to batch x
// context buckets. Header-only policy with no CUDA call of its own. See
// docs/llm_decode.md.
// IWYU pragma: begin_exports
#include "replay/decode/batch.hpp"
#include "replay/decode/executor.hpp"
#include "replay/decode/handle.hpp"
#include "replay/decode/options.hpp"
#include "replay/decode/policy.hpp"
#include "replay/decode/request.hpp"
#include "replay/decode/scheduler.hpp"
#include "replay/decode/stats.hpp"
#include "replay/decode/status.hpp"
// IWYU pragma: end_exports
