#pragma once
// LlamaExecutor: the DecodeExecutor that runs a LlamaModel over its static KV
// cache for a replay::DecodeScheduler, eagerly or as CUDA graphs: one graph per
// (batch bucket, context bucket) through a ShapeRouter over TorchGraphBackend,
// all in one private memory pool, and with steps_per_launch > 1 the captured
// step repeated inside a WHILE node (loop_control.hpp) until every row is done
// or the launch's step budget is spent. Prefill: the admitted prompts packed
// into forwards padded to prefill buckets, one graph per bucket in the same
// pool (PrefillMode). With chunked prefill (replay::DecodePrefill::with_decode,
// DecodeKernels::fused) prefill_and_decode() packs prompt chunks and one
// decode step of the running rows into one such forward.
//
// Every launch, graphed or eager, reads one block of static device state and
// writes its tokens into a ring in the same block, so a launch costs one
// host-to-device copy, one replay and one device-to-host copy:
//
//   row 0 slots, 1 positions, 2 tokens (the input of the next step),
//   3 limits (tokens the row may produce in this launch; 0 for padding),
//   4 done (0/1), 5 [0] steps run, [1] the launch's step budget, [2] keep going,
//   6 counts (tokens produced), 7 .. 7 + K - 1 the ring (step j's tokens; -1 for
//   a row that was done). Columns: one per row of the largest batch bucket,
//   at least 3 (row 5's counters).
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
#include <span>
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

// How admitted prompts are prefilled (packed into forwards either way).
enum class PrefillMode : std::uint8_t {
  // Each forward padded to the smallest prefill bucket that holds it: a
  // replay of that bucket's graph in graphed mode, the same kernels op by op
  // in eager mode. A prompt longer than the largest bucket gets an unpadded
  // eager forward of its own.
  bucketed,
  // Every forward eager and unpadded, at most 512 packed tokens (a longer
  // prompt gets one of its own): what an engine without prefill graphs does.
  unpadded,
};

// ExecutorOptions::prefill_buckets when none are given: 64, 128, 256, 512
// (those up to max_len; {max_len} when it is below 64).
inline std::vector<std::int64_t> default_prefill_buckets(std::int64_t max_len) {
  std::vector<std::int64_t> buckets;
  for (const std::int64_t n : {64, 128, 256, 512}) {
    if (n <= max_len) buckets.push_back(n);
  }
  if (buckets.empty()) buckets.push_back(max_len);
  return buckets;
}

// The priority of an executor's stream.
enum class StreamPriority : std::uint8_t {
  normal,
  high,  // the highest of torch's stream pool: its waiting blocks are scheduled before a normal stream's
};

struct ExecutorOptions {
  StepMode mode = StepMode::graphed;
  std::vector<std::int64_t> batch_buckets;    // the scheduler's lists (DecodeOptions)
  std::vector<std::int64_t> context_buckets;  // each <= the model's max_len
  std::size_t steps_per_launch = 1;           // K steps per launch (a WHILE node when graphed and K > 1)
  std::vector<replay::TokenId> eos_tokens;
  // The kernels of the decode step and of the bucketed prefill (model.hpp):
  // ATen operators, or fused kernels.
  DecodeKernels kernels = DecodeKernels::aten;
  PrefillMode prefill = PrefillMode::bucketed;
  // Packed prompt tokens a bucketed prefill forward is padded to, strictly
  // ascending, each at most the model's max_len; the largest is the most
  // tokens packed into one forward. Empty: 64, 128, 256, 512 (those up to
  // max_len; {max_len} when it is below 64).
  std::vector<std::int64_t> prefill_buckets;
  // Capture every bucket (decode and prefill) in the constructor (true), or
  // each the first time a call needs it.
  bool capture_at_start = true;
  // Threads the start-up captures are spread over (captures into one memory
  // pool take turns, so this shows what threads buy, not a speed-up).
  int capture_threads = 1;
  // Told after each bucket the constructor captured: (done, total, bucket).
  replay::CaptureProgress<std::array<std::int64_t, 2>> on_capture_progress;
  // The priority of the executor's stream (a stream of torch's pool): what
  // the GPU schedules first when another executor's work runs beside it.
  StreamPriority stream_priority = StreamPriority::normal;
  // The fused step's products for this executor's steps and prefills,
  // eager and captured, on whatever thread issues them
  // (fused::ThreadProductSets around each); empty: the sets in force on the
  // thread that makes the executor (fused::product_sets_in_force(): its own
  // scope, else the process-wide sets), fixed then. So every graph and
  // eager step of one executor uses one set, whichever thread captures or
  // issues it (a capture worker, an engine's scheduler thread), and a later
  // change of the process-wide sets leaves a made executor alone. Two
  // executors of one model may differ. Throws std::invalid_argument as
  // fused::check_product_sets() does, when the executor is made.
  std::optional<fused::ProductSets> products;
};

// What the executor measured since it was made (or since reset_stats()).
struct ExecutorStats {
  std::uint64_t launches = 0;
  std::uint64_t steps = 0;               // steps run on the device (graphed multi-step: those the loop ran)
  std::uint64_t prefills = 0;             // prompts prefilled
  std::uint64_t prefill_forwards = 0;     // forwards they took (packed)
  double prefill_seconds = 0;             // prefill(): wall time, read-back included
  std::uint64_t mixed_launches = 0;       // prefill_and_decode() calls
  double mixed_seconds = 0;               // their wall time, read-back included
  double host_seconds = 0;               // decode(): CPU time before the launch returned and after the read-back
  double launch_seconds = 0;             // decode(): wall time of whole launches
  double capture_seconds = 0;            // the constructor's captures
  std::size_t graph_pool_bytes = 0;      // the private pool after the captures
  std::size_t graphs = 0;                // decode graphs
  std::size_t prefill_graphs = 0;
};

// One launch's rows of the state block (views into it; see above).
struct StepState {
  at::Tensor slots, positions, tokens, limits, done, counts;  // [rows]
  at::Tensor loop;                                            // [3]
  at::Tensor ring;                                            // [K, rows]
};

// A step's bookkeeping in ATen operators (DecodeKernels::aten). Before the
// model: the slots and positions it reads and writes, done rows sent to the
// spare slot at position 0.
inline std::pair<at::Tensor, at::Tensor> aten_step_inputs(const StepState& s, std::int64_t spare_slot) {
  const at::Tensor active = s.done.eq(0);
  return {at::where(active, s.slots, spare_slot), at::where(active, s.positions, 0)};
}

// After the argmax (`next`): each live row's token into the ring (-1 for a
// done row) and into tokens, its position and count advanced, done at its
// limit or an end-of-sequence token; then loop[0] advanced and loop[2] =
// some row live and loop[0] < loop[1].
inline void aten_step_update(const StepState& s, const at::Tensor& next, const at::Tensor& eos) {
  const at::Tensor active = s.done.eq(0);
  // The ring row of this step: loop[0] is the step index, below K within a
  // launch (staged as 0); warm-ups repeat the step without staging, hence
  // the remainder.
  const at::Tensor step = s.loop.narrow(0, 0, 1);
  s.ring.index_copy_(0, step.remainder(s.ring.size(0)), at::where(active, next, -1).unsqueeze(0));
  s.tokens.copy_(at::where(active, next, s.tokens));
  s.positions.add_(active);
  s.counts.add_(active);
  at::Tensor finished = s.counts.ge(s.limits);
  if (eos.numel() > 0) finished = finished.logical_or(next.unsqueeze(1).eq(eos.unsqueeze(0)).any(1));
  s.done.copy_(s.done.logical_or(active.logical_and(finished)));
  step.add_(1);
  // Keep going while a row is live and the launch's budget is not spent.
  s.loop.narrow(0, 2, 1).copy_(s.done.eq(0).any().logical_and(step.lt(s.loop.narrow(0, 1, 1))).view({1}));
}

// The same state for the fused bookkeeping kernels (fused_kernels.hpp), which
// do what the two functions above do in one kernel each. The rows must be
// contiguous, the ring's rows evenly spaced.
inline fused::StepRows fused_step_rows(const StepState& s, const at::Tensor& eos, std::int64_t spare_slot) {
  const std::int64_t rows = s.slots.numel();
  const at::Device device = s.slots.device();
  const auto check = [&](const at::Tensor& t, const char* name, std::int64_t size) {
    if (t.scalar_type() != at::kLong || t.dim() != 1 || (size >= 0 && t.size(0) != size) ||
        (t.numel() > 0 && !t.is_contiguous()) || t.device() != device) {
      detail::invalid(std::string("fused step bookkeeping: ") + name + " must be a contiguous 1-D int64 tensor of " +
                      (size >= 0 ? std::to_string(size) + " elements" : std::string("any length")) + " on " +
                      device.str() + " (the slots' device); it is " + std::string(t.toString()) + " " +
                      c10::str(t.sizes()) + " on " + t.device().str());
    }
  };
  check(s.slots, "slots", -1);
  check(s.positions, "positions", rows);
  check(s.tokens, "tokens", rows);
  check(s.limits, "limits", rows);
  check(s.done, "done", rows);
  check(s.counts, "counts", rows);
  check(s.loop, "loop", 3);
  check(eos, "eos", -1);
  if (s.ring.scalar_type() != at::kLong || s.ring.dim() != 2 || s.ring.size(1) != rows || s.ring.size(0) < 1 ||
      s.ring.stride(1) != 1 || s.ring.device() != device) {
    detail::invalid("fused step bookkeeping: the ring must be int64 [steps >= 1, " + std::to_string(rows) +
                    "] with contiguous rows on " + device.str() + "; it is " + std::string(s.ring.toString()) + " " +
                    c10::str(s.ring.sizes()));
  }
  const auto ptr = [](const at::Tensor& t) { return t.data_ptr<std::int64_t>(); };
  return {.rows = static_cast<int>(rows),
          .slots = ptr(s.slots),
          .positions = ptr(s.positions),
          .tokens = ptr(s.tokens),
          .limits = ptr(s.limits),
          .done = ptr(s.done),
          .counts = ptr(s.counts),
          .loop = ptr(s.loop),
          .ring = ptr(s.ring),
          .ring_stride = s.ring.stride(0),
          .ring_steps = s.ring.size(0),
          .eos = eos.numel() > 0 ? ptr(eos) : nullptr,
          .eos_count = static_cast<int>(eos.numel()),
          .spare_slot = spare_slot};
}

// Throws std::invalid_argument, beginning with `who`, where DecodeKernels::fused
// cannot run `model`: not fp16 on a CUDA device, or a head layout or width
// its kernels do not take.
inline void check_fused_kernels_take(const LlamaModel& model, const std::string& who) {
  const LlamaConfig& config = model.config();
  if (model.dtype() != at::kHalf || !model.device().is_cuda()) {
    throw std::invalid_argument(who + ": kernels = DecodeKernels::fused needs the model in fp16 on a CUDA device, not " +
                                std::string(c10::toString(model.dtype())) + " on " + model.device().str());
  }
  try {
    fused::check_attention_shape(static_cast<int>(config.num_heads), static_cast<int>(config.num_kv_heads),
                                 static_cast<int>(config.head_dim()));
    fused::check_norm_width(static_cast<int>(config.hidden_size));
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(who + ": kernels = DecodeKernels::fused cannot take this model: " + e.what());
  }
}

class LlamaExecutor {
 public:
  using Key = std::array<std::int64_t, 2>;  // {batch bucket, context bucket}
  using Router = replay::ShapeRouter<Key, replay::TorchGraphBackend>;
  using PrefillRouter = replay::ShapeRouter<std::int64_t, replay::TorchGraphBackend>;

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
    resolve_prefill_buckets(model.config().max_len);
    if (options_.kernels == DecodeKernels::fused) check_fused_kernels_take(model, "LlamaExecutor");
    // The sets given, checked, else those in force now: filled in, as the prefill buckets are.
    if (options_.products.has_value()) {
      fused::check_product_sets(*options_.products);
    } else {
      options_.products = fused::product_sets_in_force();
    }
    max_batch_ = options_.batch_buckets.back();
    columns_ = std::max<std::int64_t>(max_batch_, 3);  // row 5 holds 3 loop counters
    steps_ = static_cast<std::int64_t>(options_.steps_per_launch);
    const c10::cuda::CUDAGuard guard(device_);
    stream_.emplace(c10::cuda::getStreamFromPool(options_.stream_priority == StreamPriority::high, device_.index()));
    const c10::cuda::CUDAStreamGuard stream_guard(*stream_);
    const c10::InferenceMode inference;
    const auto i64 = at::TensorOptions().dtype(at::kLong);
    state_ = at::zeros({kRingRow + steps_, columns_}, i64.device(device_));
    host_in_ = at::zeros({kStagedRows, columns_}, i64.pinned_memory(true));
    host_out_ = at::zeros({kRingRow - kCountsRow + steps_, columns_}, i64.pinned_memory(true));
    host_first_ = at::zeros({cache.slots()}, i64.pinned_memory(true));
    eos_ = at::tensor(std::vector<std::int64_t>(options_.eos_tokens.begin(), options_.eos_tokens.end()), i64)
               .to(device_);
    stage_padding();
    if (options_.prefill == PrefillMode::bucketed) make_prefill_state();
    if (options_.mode == StepMode::graphed) {
      make_router();
      if (options_.capture_at_start) {
        const auto start = std::chrono::steady_clock::now();
        if (prefill_router_) {
          stage_prefill_padding();
          stats_.prefill_graphs = prefill_router_->capture_all(replay::StreamRef(stream_->stream()));
          for (const std::int64_t n : options_.prefill_buckets) prefill_captured_.insert(n);
        }
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

  // Prefills the admitted prompts, packed into as few forwards as fit (see
  // PrefillMode), and reads every first token back with one copy and one
  // synchronization.
  void prefill(replay::PrefillBatch& batch) {
    const auto start = std::chrono::steady_clock::now();
    for (std::size_t r = 0; r < batch.rows.size(); ++r) {
      if (batch.rows[r].start != 0) {
        throw std::invalid_argument("LlamaExecutor::prefill: row " + std::to_string(r) + " starts at position " +
                                    std::to_string(batch.rows[r].start) +
                                    "; prefill() takes whole prompts (chunks go through prefill_and_decode())");
      }
    }
    const c10::cuda::CUDAGuard guard(device_);
    const c10::cuda::CUDAStreamGuard stream_guard(*stream_);
    const c10::InferenceMode inference;
    const bool bucketed = options_.prefill == PrefillMode::bucketed;
    const std::int64_t pack_limit = bucketed ? options_.prefill_buckets.back() : kPrefillPackTokens;
    if (static_cast<std::int64_t>(batch.rows.size()) > cache_->slots()) {
      throw std::invalid_argument("LlamaExecutor::prefill: " + std::to_string(batch.rows.size()) +
                                  " prompts; the cache has " + std::to_string(cache_->slots()) + " slots");
    }
    // Packs of consecutive rows, each at most pack_limit tokens (a longer
    // prompt alone).
    std::vector<std::pair<std::size_t, std::size_t>> packs;  // [begin, end) rows
    std::int64_t packed = 0;
    for (std::size_t r = 0; r < batch.rows.size(); ++r) {
      const auto length = static_cast<std::int64_t>(batch.rows[r].prompt.size());
      if (packs.empty() || packed + length > pack_limit) {
        packs.emplace_back(r, r);
        packed = 0;
      }
      packs.back().second = r + 1;
      packed += length;
    }
    auto* firsts = host_first_.data_ptr<std::int64_t>();
    for (std::size_t p = 0; p < packs.size(); ++p) {
      const auto [begin, end] = packs[p];
      std::int64_t tokens = 0;
      for (std::size_t r = begin; r < end; ++r) tokens += static_cast<std::int64_t>(batch.rows[r].prompt.size());
      if (bucketed && tokens <= pack_limit) {
        const std::int64_t bucket = replay::smallest_bucket(options_.prefill_buckets, static_cast<std::size_t>(tokens));
        if (options_.mode == StepMode::graphed && !prefill_captured_.contains(bucket)) capture_prefill_now(bucket);
        stage_prefill(batch, begin, end, p);
        if (options_.mode == StepMode::graphed) {
          (void)prefill_router_->run(bucket, replay::StreamRef(stream_->stream()));
        } else {
          prefill_forward(bucket);
        }
        replay::check(::cudaMemcpyAsync(firsts + begin, prefill_first_.data_ptr<std::int64_t>(),
                                        (end - begin) * sizeof(std::int64_t), ::cudaMemcpyDeviceToHost,
                                        stream_->stream()),
                      "cudaMemcpyAsync");
      } else {
        std::vector<std::int64_t> slots;
        std::vector<at::Tensor> prompts;
        for (std::size_t r = begin; r < end; ++r) {
          slots.push_back(static_cast<std::int64_t>(batch.rows[r].slot));
          prompts.push_back(
              at::tensor(std::vector<std::int64_t>(batch.rows[r].prompt.begin(), batch.rows[r].prompt.end()), at::kLong)
                  .to(device_));
        }
        host_first_.narrow(0, static_cast<std::int64_t>(begin), static_cast<std::int64_t>(end - begin))
            .copy_(model_->prefill_many(*cache_, slots, prompts).argmax(-1), /*non_blocking=*/true);
      }
    }
    stream_->synchronize();
    for (std::size_t r = 0; r < batch.rows.size(); ++r) batch.first_tokens[r] = static_cast<replay::TokenId>(firsts[r]);
    stats_.prefills += batch.rows.size();
    stats_.prefill_forwards += packs.size();
    stats_.prefill_seconds += seconds_since(start);
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
                                    state_.data_ptr<std::int64_t>() + kCountsRow * columns_,
                                    static_cast<std::size_t>(read_rows * columns_) * sizeof(std::int64_t),
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
        for (std::size_t r = 0; r < batch.rows.size(); ++r) any |= out[(1 + j) * columns_ + r] >= 0;
        if (any) ran = j + 1;
      }
    }
    for (std::size_t r = 0; r < batch.rows.size(); ++r) {
      const std::int64_t count = out[r];
      for (std::int64_t j = 0; j < count; ++j) {
        batch.emit(r, static_cast<replay::TokenId>(out[(1 + j) * columns_ + static_cast<std::int64_t>(r)]));
      }
    }
    const auto end = std::chrono::steady_clock::now();
    stats_.launches += 1;
    stats_.steps += static_cast<std::uint64_t>(ran);
    stats_.host_seconds += std::chrono::duration<double>(issued - start).count() +
                           std::chrono::duration<double>(end - returned).count();
    stats_.launch_seconds += std::chrono::duration<double>(end - start).count();
  }

  // Chunked prefill: the prompt chunks and one decode step of every decode
  // row in one packed forward (model.hpp's prefill_packed), padded to the
  // smallest prefill bucket that holds both (that bucket's graph in graphed
  // mode, the same kernels op by op in eager mode): each chunk's tokens go
  // to its slot's positions start.., each decode row's token to its
  // position, and every token attends to its own slot up to its own
  // position. One copy in, one forward, one copy out, one synchronization.
  // Needs DecodeKernels::fused (the operators' packed prefill attends within
  // the forward only, not to the keys already in the cache) and
  // PrefillMode::bucketed; the decode rows plus the chunks' tokens must fit
  // the largest prefill bucket.
  void prefill_and_decode(replay::MixedBatch& batch) {
    const auto start = std::chrono::steady_clock::now();
    if (options_.kernels != DecodeKernels::fused || options_.prefill != PrefillMode::bucketed) {
      throw std::invalid_argument(
          "LlamaExecutor::prefill_and_decode: chunked prefill needs kernels = DecodeKernels::fused and prefill = "
          "PrefillMode::bucketed (the operators' packed prefill attends within its forward only, not to the keys "
          "already in the cache); use replay::DecodePrefill::separate with these options");
    }
    const c10::cuda::CUDAGuard guard(device_);
    const c10::cuda::CUDAStreamGuard stream_guard(*stream_);
    const c10::InferenceMode inference;
    const std::span<const replay::PrefillRow> chunks = batch.prefill.rows;
    const std::span<const replay::DecodeRow> rows = batch.decode.rows;
    if (chunks.empty() || batch.prefill.first_tokens.size() != chunks.size() || batch.decode.max_steps != 1) {
      throw std::invalid_argument("LlamaExecutor::prefill_and_decode: a mixed launch has at least one chunk, one "
                                  "first token per chunk and one step (max_steps " +
                                  std::to_string(batch.decode.max_steps) + ")");
    }
    std::vector<Segment>& segments = segments_;
    segments.clear();
    std::int64_t tokens = 0;
    for (const replay::DecodeRow& row : rows) {
      segments.push_back({static_cast<std::int64_t>(row.slot), static_cast<std::int64_t>(row.position),
                          std::span<const replay::TokenId>(&row.token, 1)});
      tokens += 1;
    }
    for (const replay::PrefillRow& chunk : chunks) {
      segments.push_back({static_cast<std::int64_t>(chunk.slot), static_cast<std::int64_t>(chunk.start), chunk.prompt});
      tokens += static_cast<std::int64_t>(chunk.prompt.size());
    }
    const std::int64_t largest = options_.prefill_buckets.back();
    if (tokens > largest || static_cast<std::int64_t>(segments.size()) > cache_->slots()) {
      throw std::invalid_argument(
          "LlamaExecutor::prefill_and_decode: " + std::to_string(rows.size()) + " decode rows and " +
          std::to_string(tokens - static_cast<std::int64_t>(rows.size())) + " prompt tokens make " +
          std::to_string(tokens) + " packed tokens; the largest prefill bucket is " + std::to_string(largest) +
          ": set the scheduler's max_prefill_tokens to at most " + std::to_string(largest) + " - max_slots");
    }
    const std::int64_t bucket = replay::smallest_bucket(options_.prefill_buckets, static_cast<std::size_t>(tokens));
    if (options_.mode == StepMode::graphed && !prefill_captured_.contains(bucket)) capture_prefill_now(bucket);
    stage_packed(segments, 0);
    if (options_.mode == StepMode::graphed) {
      (void)prefill_router_->run(bucket, replay::StreamRef(stream_->stream()));
    } else {
      prefill_forward(bucket);
    }
    auto* out = host_first_.data_ptr<std::int64_t>();
    replay::check(::cudaMemcpyAsync(out, prefill_first_.data_ptr<std::int64_t>(),
                                    segments.size() * sizeof(std::int64_t), ::cudaMemcpyDeviceToHost,
                                    stream_->stream()),
                  "cudaMemcpyAsync");
    stream_->synchronize();
    for (std::size_t r = 0; r < rows.size(); ++r) batch.decode.emit(r, static_cast<replay::TokenId>(out[r]));
    for (std::size_t c = 0; c < chunks.size(); ++c) {
      batch.prefill.first_tokens[c] = static_cast<replay::TokenId>(out[rows.size() + c]);
    }
    stats_.mixed_launches += 1;
    stats_.steps += rows.empty() ? 0 : 1;
    stats_.mixed_seconds += seconds_since(start);
  }

  const ExecutorStats& stats() const noexcept { return stats_; }
  void reset_stats() noexcept {
    const ExecutorStats kept = stats_;
    stats_ = {};
    stats_.capture_seconds = kept.capture_seconds;
    stats_.graph_pool_bytes = kept.graph_pool_bytes;
    stats_.graphs = kept.graphs;
  }
  // The routers (graphed mode), for their statistics.
  const Router* router() const noexcept { return router_.get(); }
  const PrefillRouter* prefill_router() const noexcept { return prefill_router_.get(); }
  // The prefill buckets in use (the default filled in when none were given).
  const std::vector<std::int64_t>& prefill_buckets() const noexcept { return options_.prefill_buckets; }
  std::size_t graph_pool_bytes() const { return context_ ? context_->pool_reserved_bytes() : 0; }
  const c10::cuda::CUDAStream& stream() const noexcept { return *stream_; }
  // One line per bucket (decode or prefill) whose capture failed (it runs
  // eagerly); empty when every bucket is a graph.
  const std::vector<std::string>& capture_failures() const noexcept { return capture_failures_; }
  // The product sets every step and prefill of this executor uses
  // (ExecutorOptions::products, else those in force when it was made).
  const fused::ProductSets& products() const noexcept { return *options_.products; }

 private:
  static constexpr std::int64_t kSlotsRow = 0, kPositionsRow = 1, kTokensRow = 2, kLimitsRow = 3, kDoneRow = 4,
                                kLoopRow = 5, kCountsRow = 6, kRingRow = 7;
  static constexpr std::int64_t kStagedRows = kRingRow;  // rows 0..6 are written by every launch's one copy
  // Most prompt tokens packed into one unpadded prefill forward (its
  // attention is [tokens x tokens] per head).
  static constexpr std::int64_t kPrefillPackTokens = 512;
  // The bucketed prefill's device block, [5, width]: the packed tokens, their
  // slots, positions and segments (-1 for padding), and the rows whose
  // logits give each prompt's first token (the first cache.slots() entries).
  static constexpr std::int64_t kPrefillTokensRow = 0, kPrefillSlotsRow = 1, kPrefillPositionsRow = 2,
                                kPrefillSegmentsRow = 3, kPrefillLastRow = 4, kPrefillRows = 5;

  static double seconds_since(std::chrono::steady_clock::time_point start) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }

  // The default prefill buckets filled in, or the given ones checked.
  void resolve_prefill_buckets(std::int64_t max_len) {
    std::vector<std::int64_t>& buckets = options_.prefill_buckets;
    if (buckets.empty()) {
      buckets = default_prefill_buckets(max_len);
      return;
    }
    for (std::size_t i = 0; i < buckets.size(); ++i) {
      if (buckets[i] < 1 || buckets[i] > max_len || (i > 0 && buckets[i] <= buckets[i - 1])) {
        throw std::invalid_argument("LlamaExecutor: prefill_buckets must be strictly ascending, each in 1.." +
                                    std::to_string(max_len) + " (the model's max_len); entry " + std::to_string(i) +
                                    " is " + std::to_string(buckets[i]));
      }
    }
  }

  void make_prefill_state() {
    const auto i64 = at::TensorOptions().dtype(at::kLong);
    prefill_width_ = std::max(options_.prefill_buckets.back(), cache_->slots());
    prefill_state_ = at::zeros({kPrefillRows, prefill_width_}, i64.device(device_));
    prefill_first_ = at::zeros({cache_->slots()}, i64.device(device_));
    // One staging block per possible pack (at most one per slot) and one for
    // the padding the captures run on: a pack's block is not rewritten before
    // its copy ran (one synchronization per prefill() call).
    host_prefill_in_ = at::zeros({cache_->slots() + 1, kPrefillRows, prefill_width_}, i64.pinned_memory(true));
  }

  // The block a capture and its warm-ups run on: every token padding.
  void stage_prefill_padding() {
    auto* in = host_prefill_in_.data_ptr<std::int64_t>() + cache_->slots() * kPrefillRows * prefill_width_;
    fill_prefill_padding(in, 0);
    copy_prefill_block(in);
  }

  // A staged block into the device block the prefill forwards read.
  void copy_prefill_block(const std::int64_t* in) {
    replay::check(::cudaMemcpyAsync(prefill_state_.data_ptr<std::int64_t>(), in,
                                    static_cast<std::size_t>(kPrefillRows * prefill_width_) * sizeof(std::int64_t),
                                    ::cudaMemcpyHostToDevice, stream_->stream()),
                  "cudaMemcpyAsync");
  }

  // Padding tokens from column `from` on: token 0 at positions 0, 1, ... of
  // the spare slot, a segment (-1) of their own; logit rows 0.
  void fill_prefill_padding(std::int64_t* in, std::int64_t from) const {
    const std::int64_t w = prefill_width_;
    const std::int64_t max_len = model_->config().max_len;
    for (std::int64_t t = from; t < w; ++t) {
      in[kPrefillTokensRow * w + t] = 0;
      in[kPrefillSlotsRow * w + t] = cache_->spare_slot();
      in[kPrefillPositionsRow * w + t] = (t - from) % max_len;
      in[kPrefillSegmentsRow * w + t] = -1;
    }
    for (std::int64_t r = 0; r < w; ++r) in[kPrefillLastRow * w + r] = 0;
  }

  // What one packed forward carries per prompt, chunk or decode row: its
  // tokens go to `slot` at positions start, start + 1, ...
  struct Segment {
    std::int64_t slot = 0;
    std::int64_t start = 0;
    std::span<const replay::TokenId> tokens;
  };

  // Rows [begin, end) of the batch packed into staging block `block`, padding after them.
  void stage_prefill(const replay::PrefillBatch& batch, std::size_t begin, std::size_t end, std::size_t block) {
    segments_.clear();
    for (std::size_t r = begin; r < end; ++r) {
      segments_.push_back({static_cast<std::int64_t>(batch.rows[r].slot), 0, batch.rows[r].prompt});
    }
    stage_packed(segments_, block);
  }

  // Segments packed one after another into staging block `block`, padding
  // after them; segment i's logits are the forward's row i.
  void stage_packed(std::span<const Segment> segments, std::size_t block) {
    const std::int64_t w = prefill_width_;
    auto* in = host_prefill_in_.data_ptr<std::int64_t>() + static_cast<std::int64_t>(block) * kPrefillRows * w;
    std::int64_t t = 0;
    std::vector<std::int64_t> last_rows;
    for (std::size_t s = 0; s < segments.size(); ++s) {
      const Segment& segment = segments[s];
      for (std::size_t i = 0; i < segment.tokens.size(); ++i, ++t) {
        in[kPrefillTokensRow * w + t] = segment.tokens[i];
        in[kPrefillSlotsRow * w + t] = segment.slot;
        in[kPrefillPositionsRow * w + t] = segment.start + static_cast<std::int64_t>(i);
        in[kPrefillSegmentsRow * w + t] = static_cast<std::int64_t>(s);
      }
      last_rows.push_back(t - 1);
    }
    fill_prefill_padding(in, t);
    std::copy(last_rows.begin(), last_rows.end(), in + kPrefillLastRow * w);
    copy_prefill_block(in);
  }

  // The bucketed prefill of `bucket` packed tokens, capture-safe: reads the
  // staged block, writes every prompt's first token into prefill_first_.
  void prefill_forward(std::int64_t bucket) {
    const at::Tensor block = prefill_state_.narrow(1, 0, bucket);
    const LlamaModel::Packing packing{.slots = block[kPrefillSlotsRow],
                                      .positions = block[kPrefillPositionsRow],
                                      .segments = block[kPrefillSegmentsRow]};
    const fused::ThreadProductSets products(options_.products);
    const at::Tensor logits =
        model_->prefill_packed(*cache_, block[kPrefillTokensRow], packing,
                               prefill_state_[kPrefillLastRow].narrow(0, 0, cache_->slots()), options_.kernels);
    prefill_first_.copy_(logits.argmax(-1));
  }

  // Lazy prefill capture: the warm-ups and the capture run on padding only.
  void capture_prefill_now(std::int64_t bucket) {
    stage_prefill_padding();
    capture_one(*prefill_router_, bucket, prefill_captured_, stats_.prefill_graphs);
  }

  // One key of `router` captured now (lazily), counted in the stats.
  template <class AnyRouter, class AnyKey>
  void capture_one(AnyRouter& router, const AnyKey& key, std::set<AnyKey>& captured, std::size_t& graphs) {
    const auto start = std::chrono::steady_clock::now();
    (void)router.capture({key}, replay::StreamRef(stream_->stream()));
    stats_.capture_seconds += seconds_since(start);
    captured.insert(key);
    graphs = captured.size();
    stats_.graph_pool_bytes = context_->pool_reserved_bytes();
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
    const std::int64_t n = columns_;
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
    const fused::ThreadProductSets products(options_.products);  // eager, a warm-up or a capture
    const at::Tensor rows = state_.narrow(1, 0, batch);
    const StepState s{.slots = rows[kSlotsRow],
                      .positions = rows[kPositionsRow],
                      .tokens = rows[kTokensRow],
                      .limits = rows[kLimitsRow],
                      .done = rows[kDoneRow],
                      .counts = rows[kCountsRow],
                      .loop = state_[kLoopRow].narrow(0, 0, 3),
                      .ring = state_.narrow(0, kRingRow, steps_).narrow(1, 0, batch)};
    if (options_.kernels == DecodeKernels::fused) {
      // The bookkeeping as two kernels instead of about twenty operators.
      const fused::StepRows rows_state = fused_step_rows(s, eos_, cache_->spare_slot());
      const fused::Kernels& kernels = fused::kernels();
      // The stream the model's operators run on: the capturing one under a capture.
      const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device_.index()).stream();
      const at::Tensor live = at::empty({2, batch}, state_.options());
      kernels.step_inputs(rows_state, live[0].data_ptr<std::int64_t>(), live[1].data_ptr<std::int64_t>(), stream);
      const at::Tensor next = model_->decode(*cache_, live[0], live[1], s.tokens, context, options_.kernels).argmax(-1);
      kernels.step_update(rows_state, next.data_ptr<std::int64_t>(), stream);
      return;
    }
    const auto [live_slots, live_positions] = aten_step_inputs(s, cache_->spare_slot());
    const at::Tensor next = model_->decode(*cache_, live_slots, live_positions, s.tokens, context, options_.kernels)
                                .argmax(-1);
    aten_step_update(s, next, eos_);
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
      const std::int64_t* keep_going = state_.data_ptr<std::int64_t>() + kLoopRow * columns_ + 2;
      wrapper = [keep_going](replay::GraphRef captured, replay::StreamRef) {
        return make_decode_loop(captured, keep_going);
      };
    }
    router_ = std::make_unique<Router>(
        [this](const Key& key, replay::StreamRef) { step(key[0], key[1]); }, std::move(router_options),
        replay::TorchGraphBackend(context_, std::move(wrapper)));
    if (options_.prefill == PrefillMode::bucketed) {
      // The prefill graphs share the decode graphs' pool: one stream runs
      // them all, one at a time.
      replay::ShapeRouterOptions<std::int64_t> prefill_options =
          replay::ShapeRouterOptions<std::int64_t>::bucketed(options_.prefill_buckets);
      prefill_options.warmup_runs = 2;
      prefill_options.oversize = replay::OversizePolicy::throw_error;
      prefill_options.on_capture_failure = [this](const std::int64_t& tokens, std::string_view reason) {
        capture_failures_.push_back("prefill bucket " + std::to_string(tokens) + ": " + std::string(reason));
      };
      prefill_router_ = std::make_unique<PrefillRouter>(
          [this](const std::int64_t& tokens, replay::StreamRef) { prefill_forward(tokens); },
          std::move(prefill_options), replay::TorchGraphBackend(context_));
    }
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
    capture_one(*router_, key, captured_, stats_.graphs);
  }

  const LlamaModel* model_;
  KvCache* cache_;
  ExecutorOptions options_;
  at::Device device_;
  std::optional<c10::cuda::CUDAStream> stream_;  // set in the constructor, after the options are checked
  std::int64_t max_batch_ = 0;
  std::int64_t columns_ = 0;  // of state_: max_batch_, at least 3
  std::int64_t steps_ = 1;
  at::Tensor state_;     // device, [7 + K, max_batch] int64 (see the top of this file)
  at::Tensor host_in_;   // pinned, rows 0..6
  at::Tensor host_out_;  // pinned, counts and the ring
  at::Tensor eos_;       // device, the end-of-sequence tokens
  std::shared_ptr<replay::TorchCaptureContext> context_;
  std::unique_ptr<Router> router_;
  std::set<Key> captured_;
  std::int64_t prefill_width_ = 0;
  at::Tensor prefill_state_;    // device, [5, prefill_width_] int64 (bucketed prefill)
  at::Tensor prefill_first_;    // device, [slots] int64: the last prefill forward's first tokens
  at::Tensor host_prefill_in_;  // pinned, [slots + 1, 5, prefill_width_]: staging blocks
  at::Tensor host_first_;       // pinned, [slots] int64: every prompt's first token
  std::unique_ptr<PrefillRouter> prefill_router_;
  std::set<std::int64_t> prefill_captured_;
  std::vector<std::string> capture_failures_;
  std::vector<Segment> segments_;  // a packed forward's, reused from call to call
  ExecutorStats stats_;
};

static_assert(replay::MixedDecodeExecutor<LlamaExecutor>);

}  // namespace llm_decode
