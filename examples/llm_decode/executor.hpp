#pragma once
// LlamaExecutor: the DecodeExecutor that runs a LlamaModel over its static KV
// cache for a replay::DecodeScheduler, eagerly or as CUDA graphs: one graph per
// (batch bucket, context bucket) through a ShapeRouter over TorchGraphBackend,
// all in one private memory pool, and with steps_per_launch > 1 the captured
// step repeated inside a WHILE node (loop_control.hpp) until every row is done
// or the launch's step budget is spent.
//
// Every launch, graphed or eager, reads one block of static device state and
// writes its tokens into a ring in the same block, so a launch costs one
// host-to-device copy, one replay and one device-to-host copy:
//
//   row 0 slots, 1 positions, 2 tokens (the input of the next step),
//   3 limits (tokens the row may produce in this launch; 0 for padding),
//   4 done (0/1), 5 [0] steps run, [1] the launch's step budget, [2] keep going,
//   6 counts (tokens produced), 7 .. 7 + K - 1 the ring (step j's tokens; -1 for
//   a row that was done).
//
// A row that is done (padding, its limit reached, or an end-of-sequence token)
// keeps computing with its slot switched to the cache's spare slot at
// position 0, so it never writes into a live sequence's keys and values and
// the other rows' results do not depend on it.
#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <exception>
#include <set>
#include <thread>
#include <stdexcept>
#include <string_view>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/torch.h>

#include <cuda_runtime_api.h>

#include <replay/decode.hpp>
#include <replay/error.hpp>
#include <replay/torch.hpp>

#include "kv_cache.hpp"
#include "loop_control.hpp"
#include "model.hpp"

namespace llm_decode {

enum class StepMode : std::uint8_t {
  eager,    // every step issued op by op (the reference: the same kernels, no graphs)
  graphed,  // one replay per launch
};

struct ExecutorOptions {
  StepMode mode = StepMode::graphed;
  std::vector<std::int64_t> batch_buckets;    // the scheduler's lists (DecodeOptions)
  std::vector<std::int64_t> context_buckets;  // each <= the model's max_len
  std::size_t steps_per_launch = 1;           // K steps per launch (a WHILE node when graphed and K > 1)
  std::vector<replay::TokenId> eos_tokens;
  // Capture every (batch, context) bucket in the constructor (true), or each
  // the first time a launch needs it.
  bool capture_at_start = true;
  // Threads the start-up captures are spread over (captures into one memory
  // pool take turns, so this shows what threads buy, not a speed-up).
  int capture_threads = 1;
  // Told after each bucket the constructor captured: (done, total, bucket).
  replay::CaptureProgress<std::array<std::int64_t, 2>> on_capture_progress;
};

// What the executor measured since it was made (or since reset_stats()).
struct ExecutorStats {
  std::uint64_t launches = 0;
  std::uint64_t steps = 0;               // steps run on the device (graphed multi-step: those the loop ran)
  std::uint64_t prefills = 0;
  double host_seconds = 0;               // decode(): CPU time before the launch returned and after the read-back
  double launch_seconds = 0;             // decode(): wall time of whole launches
  double capture_seconds = 0;            // the constructor's captures
  std::size_t graph_pool_bytes = 0;      // the private pool after the captures
  std::size_t graphs = 0;
};

class LlamaExecutor {
 public:
  using Key = std::array<std::int64_t, 2>;  // {batch bucket, context bucket}
  using Router = replay::ShapeRouter<Key, replay::TorchGraphBackend>;

  LlamaExecutor(const LlamaModel& model, KvCache& cache, ExecutorOptions options)
      : model_(&model), cache_(&cache), options_(std::move(options)), device_(model.device()) {
    if (options_.batch_buckets.empty() || options_.context_buckets.empty()) {
      throw std::invalid_argument("LlamaExecutor: batch_buckets and context_buckets must not be empty");
    }
    if (options_.steps_per_launch == 0) {
      throw std::invalid_argument("LlamaExecutor: steps_per_launch must be at least 1");
    }
    if (options_.context_buckets.back() > model.config().max_len) {
      throw std::invalid_argument("LlamaExecutor: the largest context bucket (" +
                                  std::to_string(options_.context_buckets.back()) + ") exceeds the model's max_len (" +
                                  std::to_string(model.config().max_len) + ")");
    }
    if (options_.batch_buckets.back() > cache.slots()) {
      throw std::invalid_argument("LlamaExecutor: the largest batch bucket (" +
                                  std::to_string(options_.batch_buckets.back()) + ") exceeds the cache's slots (" +
                                  std::to_string(cache.slots()) + ")");
    }
    max_batch_ = options_.batch_buckets.back();
    steps_ = static_cast<std::int64_t>(options_.steps_per_launch);
    const c10::cuda::CUDAGuard guard(device_);
    stream_.emplace(c10::cuda::getStreamFromPool(/*isHighPriority=*/false, device_.index()));
    const c10::cuda::CUDAStreamGuard stream_guard(*stream_);
    const c10::InferenceMode inference;
    const auto i64 = at::TensorOptions().dtype(at::kLong);
    state_ = at::zeros({kRingRow + steps_, max_batch_}, i64.device(device_));
    host_in_ = at::zeros({kStagedRows, max_batch_}, i64.pinned_memory(true));
    host_out_ = at::zeros({kRingRow - kCountsRow + steps_, max_batch_}, i64.pinned_memory(true));
    eos_ = at::tensor(std::vector<std::int64_t>(options_.eos_tokens.begin(), options_.eos_tokens.end()), i64)
               .to(device_);
    stage_padding();
    if (options_.mode == StepMode::graphed) {
      make_router();
      if (options_.capture_at_start) {
        const auto start = std::chrono::steady_clock::now();
        if (options_.capture_threads > 1) {
          capture_on_threads();
        } else {
          stats_.graphs = router_->capture_all(replay::StreamRef(stream_->stream()), options_.on_capture_progress);
        }
        stream_->synchronize();
        stats_.capture_seconds = seconds_since(start);
        for (const std::int64_t b : options_.batch_buckets) {
          for (const std::int64_t c : options_.context_buckets) captured_.insert({b, c});
        }
      }
      stats_.graph_pool_bytes = context_->pool_reserved_bytes();
    }
  }

  LlamaExecutor(const LlamaExecutor&) = delete;
  LlamaExecutor& operator=(const LlamaExecutor&) = delete;
  ~LlamaExecutor() = default;

  // Prefills the prompts eagerly, packed into forwards of at most
  // kPrefillPackTokens tokens (a prompt longer than that gets one of its
  // own), and reads the first tokens back with one copy.
  void prefill(replay::PrefillBatch& batch) {
    const c10::cuda::CUDAGuard guard(device_);
    const c10::cuda::CUDAStreamGuard stream_guard(*stream_);
    const c10::InferenceMode inference;
    std::vector<at::Tensor> firsts;
    std::vector<std::int64_t> slots;
    std::vector<at::Tensor> prompts;
    std::int64_t packed = 0;
    const auto flush = [&] {
      if (prompts.empty()) return;
      firsts.push_back(model_->prefill_many(*cache_, slots, prompts).argmax(-1));
      slots.clear();
      prompts.clear();
      packed = 0;
    };
    for (const replay::PrefillRow& row : batch.rows) {
      const auto length = static_cast<std::int64_t>(row.prompt.size());
      if (packed > 0 && packed + length > kPrefillPackTokens) flush();
      slots.push_back(static_cast<std::int64_t>(row.slot));
      prompts.push_back(
          at::tensor(std::vector<std::int64_t>(row.prompt.begin(), row.prompt.end()), at::kLong).to(device_));
      packed += length;
    }
    flush();
    const at::Tensor tokens = at::cat(firsts).to(at::kCPU);  // waits for the prefills
    const auto* values = tokens.data_ptr<std::int64_t>();
    for (std::size_t r = 0; r < batch.rows.size(); ++r) batch.first_tokens[r] = static_cast<replay::TokenId>(values[r]);
    stats_.prefills += batch.rows.size();
  }

  // One launch: up to batch.max_steps steps for every row.
  void decode(replay::DecodeBatch& batch) {
    const auto start = std::chrono::steady_clock::now();
    const c10::cuda::CUDAGuard guard(device_);
    const c10::cuda::CUDAStreamGuard stream_guard(*stream_);
    const c10::InferenceMode inference;
    const Key key{batch.batch_bucket, batch.context_bucket};
    const auto steps = static_cast<std::int64_t>(batch.max_steps);
    if (steps > steps_) {
      throw std::invalid_argument("LlamaExecutor::decode: a launch of " + std::to_string(steps) +
                                  " steps; this executor was made for " + std::to_string(steps_));
    }
    if (options_.mode == StepMode::graphed && !captured_.contains(key)) capture_now(key);
    stage(batch, steps);
    std::int64_t ran = steps;
    if (options_.mode == StepMode::graphed) {
      (void)router_->run(key, replay::StreamRef(stream_->stream()));
    } else {
      // The same steps as the graph, issued op by op; no early end (that
      // would need a read-back per step), which changes no row's tokens.
      for (std::int64_t j = 0; j < steps; ++j) step(key[0], key[1]);
    }
    const std::int64_t read_rows = kRingRow - kCountsRow + steps;
    // Raw copies: at::Tensor::copy_ costs the host several microseconds of
    // dispatch per call, a share of a step that matters at batch 1.
    replay::check(::cudaMemcpyAsync(host_out_.data_ptr<std::int64_t>(),
                                    state_.data_ptr<std::int64_t>() + kCountsRow * max_batch_,
                                    static_cast<std::size_t>(read_rows * max_batch_) * sizeof(std::int64_t),
                                    ::cudaMemcpyDeviceToHost, stream_->stream()),
                  "cudaMemcpyAsync");
    const auto issued = std::chrono::steady_clock::now();
    stream_->synchronize();
    const auto returned = std::chrono::steady_clock::now();
    const auto* out = host_out_.data_ptr<std::int64_t>();
    if (options_.mode == StepMode::graphed) {
      // state_ row 5 [0] is not read back: count the steps from the ring.
      ran = 0;
      for (std::int64_t j = 0; j < steps; ++j) {
        bool any = false;
        for (std::size_t r = 0; r < batch.rows.size(); ++r) any |= out[(1 + j) * max_batch_ + r] >= 0;
        if (any) ran = j + 1;
      }
    }
    for (std::size_t r = 0; r < batch.rows.size(); ++r) {
      const std::int64_t count = out[r];
      for (std::int64_t j = 0; j < count; ++j) {
        batch.emit(r, static_cast<replay::TokenId>(out[(1 + j) * max_batch_ + static_cast<std::int64_t>(r)]));
      }
    }
    const auto end = std::chrono::steady_clock::now();
    stats_.launches += 1;
    stats_.steps += static_cast<std::uint64_t>(ran);
    stats_.host_seconds += std::chrono::duration<double>(issued - start).count() +
                           std::chrono::duration<double>(end - returned).count();
    stats_.launch_seconds += std::chrono::duration<double>(end - start).count();
  }

  const ExecutorStats& stats() const noexcept { return stats_; }
  void reset_stats() noexcept {
    const ExecutorStats kept = stats_;
    stats_ = {};
    stats_.capture_seconds = kept.capture_seconds;
    stats_.graph_pool_bytes = kept.graph_pool_bytes;
    stats_.graphs = kept.graphs;
  }
  // The router (graphed mode), for its statistics.
  const Router* router() const noexcept { return router_.get(); }
  std::size_t graph_pool_bytes() const { return context_ ? context_->pool_reserved_bytes() : 0; }
  const c10::cuda::CUDAStream& stream() const noexcept { return *stream_; }
  // One line per bucket whose capture failed (it runs eagerly); empty when every bucket is a graph.
  const std::vector<std::string>& capture_failures() const noexcept { return capture_failures_; }

 private:
  static constexpr std::int64_t kSlotsRow = 0, kPositionsRow = 1, kTokensRow = 2, kLimitsRow = 3, kDoneRow = 4,
                                kLoopRow = 5, kCountsRow = 6, kRingRow = 7;
  static constexpr std::int64_t kStagedRows = kRingRow;  // rows 0..6 are written by every launch's one copy
  // Most prompt tokens packed into one prefill forward (its attention is
  // [tokens x tokens] per head).
  static constexpr std::int64_t kPrefillPackTokens = 512;

  static double seconds_since(std::chrono::steady_clock::time_point start) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }

  // Every row padding: what the warm-ups and captures run on, so that they
  // touch only the spare slot.
  void stage_padding() {
    host_in_.zero_();
    host_in_[kSlotsRow].fill_(cache_->spare_slot());
    host_in_[kDoneRow].fill_(1);
    host_in_[kLoopRow][1] = 1;  // a one-step budget
    host_in_[kLoopRow][2] = 1;
    state_.narrow(0, 0, kStagedRows).copy_(host_in_, /*non_blocking=*/true);
  }

  void stage(const replay::DecodeBatch& batch, std::int64_t steps) {
    // The pinned block is reused: the previous launch's copy from it has
    // completed (decode() synchronized before returning).
    auto* in = host_in_.data_ptr<std::int64_t>();
    const std::int64_t n = max_batch_;
    const std::int64_t spare = cache_->spare_slot();
    for (std::int64_t r = 0; r < n; ++r) {
      const bool real = r < static_cast<std::int64_t>(batch.rows.size());
      const replay::DecodeRow* row = real ? &batch.rows[static_cast<std::size_t>(r)] : nullptr;
      in[kSlotsRow * n + r] = real ? static_cast<std::int64_t>(row->slot) : spare;
      in[kPositionsRow * n + r] = real ? static_cast<std::int64_t>(row->position) : 0;
      in[kTokensRow * n + r] = real ? row->token : 0;
      in[kLimitsRow * n + r] = real ? static_cast<std::int64_t>(row->max_tokens) : 0;
      in[kDoneRow * n + r] = real ? 0 : 1;
      in[kLoopRow * n + r] = 0;
      in[kCountsRow * n + r] = 0;
    }
    in[kLoopRow * n + 1] = steps;
    in[kLoopRow * n + 2] = 1;
    replay::check(::cudaMemcpyAsync(state_.data_ptr<std::int64_t>(), in,
                                    static_cast<std::size_t>(kStagedRows * n) * sizeof(std::int64_t),
                                    ::cudaMemcpyHostToDevice, stream_->stream()),
                  "cudaMemcpyAsync");
  }

  // One decode step for the first `batch` rows, reading `context` positions:
  // capture-safe (only device tensors, no host read-back).
  void step(std::int64_t batch, std::int64_t context) {
    const at::Tensor rows = state_.narrow(1, 0, batch);
    const at::Tensor slots = rows[kSlotsRow];
    const at::Tensor positions = rows[kPositionsRow];
    at::Tensor tokens = rows[kTokensRow];
    const at::Tensor limits = rows[kLimitsRow];
    at::Tensor done = rows[kDoneRow];
    at::Tensor counts = rows[kCountsRow];
    at::Tensor loop = state_[kLoopRow];
    const at::Tensor active = done.eq(0);
    const at::Tensor live_slots = at::where(active, slots, cache_->spare_slot());
    const at::Tensor live_positions = at::where(active, positions, 0);
    const at::Tensor logits = model_->decode(*cache_, live_slots, live_positions, tokens, context);
    const at::Tensor next = logits.argmax(-1);
    // The ring row of this step: loop[0] is the step index, below K within a
    // launch (staged as 0); warm-ups repeat the step without staging, hence
    // the remainder.
    at::Tensor ring = state_.narrow(0, kRingRow, steps_).narrow(1, 0, batch);
    ring.index_copy_(0, loop.narrow(0, 0, 1).remainder(steps_), at::where(active, next, -1).unsqueeze(0));
    tokens.copy_(at::where(active, next, tokens));
    positions.add_(active);
    counts.add_(active);
    at::Tensor finished = counts.ge(limits);
    if (eos_.numel() > 0) finished = finished.logical_or(next.unsqueeze(1).eq(eos_.unsqueeze(0)).any(1));
    done.copy_(done.logical_or(active.logical_and(finished)));
    loop.narrow(0, 0, 1).add_(1);
    // Keep going while a row is live and the launch's budget is not spent.
    loop.narrow(0, 2, 1).copy_(done.eq(0).any().logical_and(loop.narrow(0, 0, 1).lt(loop.narrow(0, 1, 1))).view({1}));
  }

  void make_router() {
    context_ = std::make_shared<replay::TorchCaptureContext>(device_);
    replay::ShapeRouterOptions<Key> router_options =
        replay::ShapeRouterOptions<Key>::bucketed_per_dimension({options_.batch_buckets, options_.context_buckets});
    router_options.warmup_runs = 2;
    router_options.oversize = replay::OversizePolicy::throw_error;
    // A bucket whose capture failed runs eagerly (the same kernels, so the
    // same tokens, only slower); the reason is kept for capture_failures().
    router_options.on_capture_failure = [this](const Key& key, std::string_view reason) {
      capture_failures_.push_back("bucket {" + std::to_string(key[0]) + ", " + std::to_string(key[1]) +
                                  "}: " + std::string(reason));
    };
    replay::TorchGraphWrapper wrapper;
    if (steps_ > 1) {
      const std::int64_t* keep_going = state_.data_ptr<std::int64_t>() + kLoopRow * max_batch_ + 2;
      wrapper = [keep_going](replay::GraphRef captured, replay::StreamRef) {
        return make_decode_loop(captured, keep_going);
      };
    }
    router_ = std::make_unique<Router>(
        [this](const Key& key, replay::StreamRef) { step(key[0], key[1]); }, std::move(router_options),
        replay::TorchGraphBackend(context_, std::move(wrapper)));
  }

  // The start-up captures spread over options_.capture_threads threads.
  void capture_on_threads() {
    std::vector<Key> keys;
    for (const std::int64_t b : options_.batch_buckets) {
      for (const std::int64_t c : options_.context_buckets) keys.push_back({b, c});
    }
    std::reverse(keys.begin(), keys.end());  // largest first: the smaller reuse its memory
    const auto threads = static_cast<std::size_t>(options_.capture_threads);
    std::vector<std::thread> workers;
    std::vector<std::exception_ptr> errors(threads);
    std::atomic<std::size_t> graphs{0};
    for (std::size_t t = 0; t < threads; ++t) {
      workers.emplace_back([&, t] {
        try {
          const c10::cuda::CUDAGuard guard(device_);
          const c10::cuda::CUDAStreamGuard stream_guard(*stream_);
          const c10::InferenceMode inference;
          std::vector<Key> mine;
          for (std::size_t i = t; i < keys.size(); i += threads) mine.push_back(keys[i]);
          graphs += router_->capture(mine, replay::StreamRef(stream_->stream()));
        } catch (...) {
          errors[t] = std::current_exception();
        }
      });
    }
    for (auto& w : workers) w.join();
    for (const auto& e : errors) {
      if (e) std::rethrow_exception(e);
    }
    stats_.graphs = graphs.load();
  }

  // Lazy capture: the warm-ups and the capture run on padding rows only,
  // before this launch's rows are staged.
  void capture_now(const Key& key) {
    stage_padding();
    const auto start = std::chrono::steady_clock::now();
    (void)router_->capture({key}, replay::StreamRef(stream_->stream()));
    stats_.capture_seconds += seconds_since(start);
    captured_.insert(key);
    stats_.graphs = captured_.size();
    stats_.graph_pool_bytes = context_->pool_reserved_bytes();
  }

  const LlamaModel* model_;
  KvCache* cache_;
  ExecutorOptions options_;
  at::Device device_;
  std::optional<c10::cuda::CUDAStream> stream_;  // set in the constructor, after the options are checked
  std::int64_t max_batch_ = 0;
  std::int64_t steps_ = 1;
  at::Tensor state_;     // device, [7 + K, max_batch] int64 (see the top of this file)
  at::Tensor host_in_;   // pinned, rows 0..6
  at::Tensor host_out_;  // pinned, counts and the ring
  at::Tensor eos_;       // device, the end-of-sequence tokens
  std::shared_ptr<replay::TorchCaptureContext> context_;
  std::unique_ptr<Router> router_;
  std::set<Key> captured_;
  std::vector<std::string> capture_failures_;
  ExecutorStats stats_;
};

static_assert(replay::DecodeExecutor<LlamaExecutor>);

}  // namespace llm_decode
