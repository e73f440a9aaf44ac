#pragma once
// DecodeEngine: a Llama model served by continuous batching. It owns the KV
// cache, the LlamaExecutor (graphs per batch bucket x context bucket) and the
// replay::DecodeScheduler that drives it; requests come from any thread and
// get their tokens as they are produced (a callback or a DecodeStream).
//
//   llm_decode::DecodeEngine engine(model, {.batch_buckets = {1, 2, 4, 8}, .context_buckets = {128, 256, 512}});
//   replay::DecodeStream s = engine.submit({.prompt = prompt, .max_new_tokens = 64});
//   for (replay::TokenId t : s) print(t);
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <replay/decode.hpp>

#include "executor.hpp"
#include "kv_cache.hpp"
#include "model.hpp"

namespace llm_decode {

struct EngineOptions {
  std::vector<std::int64_t> batch_buckets{1, 2, 4, 8, 16, 32, 64};
  std::vector<std::int64_t> context_buckets{64, 128, 256, 512, 1024};
  std::size_t steps_per_launch = 1;
  StepMode mode = StepMode::graphed;
  bool capture_at_start = true;
  std::vector<replay::TokenId> eos_tokens{};
  std::size_t queue_capacity = 1024;
  std::size_t max_prefill_tokens = 0;
  // Continuous batching: group admissions (replay::DecodeOptions).
  std::size_t min_admission = 1;
  std::chrono::microseconds admission_delay{5000};
  DecodeKernels kernels = DecodeKernels::aten;
  PrefillMode prefill = PrefillMode::bucketed;
  std::vector<std::int64_t> prefill_buckets{};  // empty: the executor's default (ExecutorOptions)
  replay::DecodeBatching batching = replay::DecodeBatching::continuous;
  std::chrono::microseconds static_batch_delay{1000};
  // separate prefill calls, or chunked prefill (with_decode: needs
  // DecodeKernels::fused; max_prefill_tokens is then the chunk budget).
  replay::DecodePrefill decode_prefill = replay::DecodePrefill::separate;
  replay::CaptureProgress<std::array<std::int64_t, 2>> on_capture_progress{};
  // The executor's (ExecutorOptions): its product sets (empty: those in
  // force on the thread that makes the engine, fixed then) and its capture
  // threads.
  std::optional<fused::ProductSets> products{};
  int capture_threads = 1;
};

class DecodeEngine {
 public:
  // The cache has one slot per row of the largest batch bucket (and the
  // spare); max_len is the largest context bucket.
  DecodeEngine(const LlamaModel& model, EngineOptions options)
      : cache_(checked_cache(model, options)),
        executor_(std::make_unique<LlamaExecutor>(
            model, *cache_,
            ExecutorOptions{.mode = options.mode,
                            .batch_buckets = options.batch_buckets,
                            .context_buckets = options.context_buckets,
                            .steps_per_launch = options.steps_per_launch,
                            .eos_tokens = options.eos_tokens,
                            .kernels = options.kernels,
                            .prefill = options.prefill,
                            .prefill_buckets = options.prefill_buckets,
                            .capture_at_start = options.capture_at_start,
                            .capture_threads = options.capture_threads,
                            .on_capture_progress = options.on_capture_progress,
                            .products = options.products})),
        scheduler_(std::make_unique<replay::DecodeScheduler<LlamaExecutor&>>(
            *executor_, replay::DecodeOptions{.max_slots = static_cast<std::size_t>(options.batch_buckets.back()),
                                              .max_len = static_cast<std::size_t>(options.context_buckets.back()),
                                              .batch_buckets = options.batch_buckets,
                                              .context_buckets = options.context_buckets,
                                              .steps_per_launch = options.steps_per_launch,
                                              .eos_tokens = options.eos_tokens,
                                              .vocab_size = static_cast<std::size_t>(model.config().vocab_size),
                                              .queue_capacity = options.queue_capacity,
                                              .max_prefill_tokens = options.max_prefill_tokens,
                                              .min_admission = options.min_admission,
                                              .admission_delay = options.admission_delay,
                                              .batching = options.batching,
                                              .prefill = options.decode_prefill,
                                              .static_batch_delay = options.static_batch_delay})) {}

  DecodeEngine(const DecodeEngine&) = delete;
  DecodeEngine& operator=(const DecodeEngine&) = delete;
  // The scheduler stops (cancelling what is left) before the executor and
  // the cache it uses go.
  ~DecodeEngine() { scheduler_.reset(); }

  replay::DecodeHandle submit(replay::DecodeRequest request,
                              replay::DecodeScheduler<LlamaExecutor&>::update_callback on_update) {
    return scheduler_->submit(std::move(request), std::move(on_update));
  }
  [[nodiscard]] replay::DecodeStream submit(replay::DecodeRequest request) {
    return scheduler_->submit(std::move(request));
  }
  void shutdown(replay::DecodeShutdown mode) noexcept { scheduler_->shutdown(mode); }
  replay::DecodeStats stats() const { return scheduler_->stats(); }
  // The executor's own measurements; read them once the scheduler is idle or shut down.
  const LlamaExecutor& executor() const noexcept { return *executor_; }

 private:
  // What the members below read before the executor and the scheduler check
  // the rest. Chunked prefill that the executor could not run is refused
  // here, before any capture, rather than failing the requests of its first
  // mixed launch: it needs the fused kernels, bucketed prefill, and a chunk
  // budget that leaves room for every decode row in the largest prefill bucket.
  static void check_options(const LlamaModel& model, const EngineOptions& options) {
    if (options.batch_buckets.empty() || options.context_buckets.empty()) {
      throw std::invalid_argument("DecodeEngine: batch_buckets and context_buckets must not be empty");
    }
    if (options.decode_prefill != replay::DecodePrefill::with_decode) return;
    if (options.kernels != DecodeKernels::fused || options.prefill != PrefillMode::bucketed) {
      throw std::invalid_argument(
          "DecodeEngine: chunked prefill (decode_prefill = DecodePrefill::with_decode) needs kernels = "
          "DecodeKernels::fused and prefill = PrefillMode::bucketed (the operators' packed prefill attends within "
          "its forward only, not to the keys already in the cache)");
    }
    const std::vector<std::int64_t> buckets = options.prefill_buckets.empty()
                                                  ? default_prefill_buckets(model.config().max_len)
                                                  : options.prefill_buckets;
    const std::int64_t rows = options.batch_buckets.back();
    const std::int64_t room = buckets.back() - rows;
    if (options.max_prefill_tokens == 0 || static_cast<std::int64_t>(options.max_prefill_tokens) > room) {
      throw std::invalid_argument(
          "DecodeEngine: chunked prefill with max_prefill_tokens = " + std::to_string(options.max_prefill_tokens) +
          ": a mixed launch's " + std::to_string(rows) + " decode rows (the largest batch bucket) and its prompt "
          "tokens must fit the largest prefill bucket, " + std::to_string(buckets.back()) +
          " tokens, so the budget must be 1.." + (room > 0 ? std::to_string(room) : std::string("0 (none fits)")));
    }
  }

  // The options checked first, then the cache.
  static std::unique_ptr<KvCache> checked_cache(const LlamaModel& model, const EngineOptions& options) {
    check_options(model, options);
    return std::make_unique<KvCache>(model.config(), options.batch_buckets.back(), model.device(), model.dtype());
  }

  std::unique_ptr<KvCache> cache_;
  std::unique_ptr<LlamaExecutor> executor_;
  std::unique_ptr<replay::DecodeScheduler<LlamaExecutor&>> scheduler_;
};

}  // namespace llm_decode
