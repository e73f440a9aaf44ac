#pragma once
// Shared by the llm_decode model's host and gpu cases: random prompts and the
// run that feeds sequences through prefill and decode steps with the cache,
// to be compared with forward_full on the whole sequence. No assertions here:
// the cases assert on what these return.
#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "executor.hpp"
#include "gpu_suite.hpp"
#include "kv_cache.hpp"
#include "model.hpp"

namespace llm_decode_test {

// max |actual - expected| / max |expected|: one element far off shows, where
// a norm over thousands of logits would hide it.
inline double max_error(const at::Tensor& actual, const at::Tensor& expected) {
  const at::Tensor a = actual.to(at::kCPU).to(at::kDouble);
  const at::Tensor e = expected.to(at::kCPU).to(at::kDouble);
  const double scale = e.abs().max().item<double>();
  return (a - e).abs().max().item<double>() / (scale > 0.0 ? scale : 1.0);
}

// `count` tokens below `vocab`, fresh each run (replayable with the run's seed).
inline std::vector<std::int64_t> random_tokens(std::int64_t count, std::int64_t vocab) {
  std::uniform_int_distribution<std::int64_t> dist(0, vocab - 1);
  std::vector<std::int64_t> tokens(static_cast<std::size_t>(count));
  for (std::int64_t& token : tokens) {
    token = dist(replay_test::rng());
  }
  return tokens;
}

inline at::Tensor int64_tensor(const std::vector<std::int64_t>& values, at::Device device) {
  return at::tensor(values, at::TensorOptions().dtype(at::kLong)).to(device);
}

// One sequence of a run: its tokens, how many of them are the prompt, its slot.
struct Sequence {
  std::vector<std::int64_t> tokens;
  std::int64_t prompt = 1;
  std::int64_t slot = 0;
};

// Three sequences decoded together in slots 2, 0 and 1: a one-token prompt,
// one of `prompt` tokens out of `total`, and one that is all prompt (it
// decodes nothing). They finish at different steps.
inline std::vector<Sequence> three_sequences(std::int64_t vocab, std::int64_t total, std::int64_t prompt) {
  return {Sequence{random_tokens(12, vocab), 1, 2}, Sequence{random_tokens(total, vocab), prompt, 0},
          Sequence{random_tokens(9, vocab), 9, 1}};
}

// Per sequence, the logits [tokens - prompt + 1, vocab] float32 of positions
// prompt-1 .. tokens-1: the first row from prefill, each next one from the
// decode step that fed the token at that position. The sequences still
// running decode together, one row each, plus padding rows (spare slot,
// position 0, token 0) up to `pad_to` rows; `context` 0 means max_len.
inline std::vector<at::Tensor> cached_logits(const llm_decode::LlamaModel& model, llm_decode::KvCache& cache,
                                             const std::vector<Sequence>& sequences, std::int64_t context = 0,
                                             std::int64_t pad_to = 0,
                                             llm_decode::DecodeKernels kernels = llm_decode::DecodeKernels::aten) {
  const at::Device device = model.device();
  if (context == 0) {
    context = model.config().max_len;
  }
  std::vector<std::vector<at::Tensor>> rows(sequences.size());
  for (std::size_t s = 0; s < sequences.size(); ++s) {
    const Sequence& seq = sequences[s];
    const std::vector<std::int64_t> prompt(seq.tokens.begin(), seq.tokens.begin() + seq.prompt);
    rows[s].push_back(model.prefill(cache, seq.slot, int64_tensor(prompt, device)));
  }
  for (std::int64_t step = 0;; ++step) {
    std::vector<std::int64_t> slots;
    std::vector<std::int64_t> positions;
    std::vector<std::int64_t> tokens;
    std::vector<std::size_t> running;
    for (std::size_t s = 0; s < sequences.size(); ++s) {
      const Sequence& seq = sequences[s];
      const std::int64_t position = seq.prompt + step;
      if (position < static_cast<std::int64_t>(seq.tokens.size())) {
        slots.push_back(seq.slot);
        positions.push_back(position);
        tokens.push_back(seq.tokens[static_cast<std::size_t>(position)]);
        running.push_back(s);
      }
    }
    if (running.empty()) {
      break;
    }
    while (static_cast<std::int64_t>(slots.size()) < pad_to) {
      slots.push_back(cache.spare_slot());
      positions.push_back(0);
      tokens.push_back(0);
    }
    const at::Tensor logits = model.decode(cache, int64_tensor(slots, device), int64_tensor(positions, device),
                                           int64_tensor(tokens, device), context, kernels);
    for (std::size_t r = 0; r < running.size(); ++r) {
      rows[running[r]].push_back(logits[static_cast<std::int64_t>(r)].to(at::kFloat));
    }
  }
  std::vector<at::Tensor> out;
  for (const std::vector<at::Tensor>& sequence_rows : rows) {
    out.push_back(at::stack(sequence_rows));
  }
  return out;
}

// forward_full's logits of the positions cached_logits() returns for `seq`.
inline at::Tensor full_logits(const llm_decode::LlamaModel& model, const Sequence& seq) {
  const at::Tensor full = model.forward_full(int64_tensor(seq.tokens, model.device()));
  return full.narrow(0, seq.prompt - 1, static_cast<std::int64_t>(seq.tokens.size()) - seq.prompt + 1);
}

// Rows whose greedy token differs although the reference's best logit leads
// its second by more than `margin` (a near tie may flip under rounding).
inline std::int64_t clear_argmax_mismatches(const at::Tensor& actual, const at::Tensor& expected, double margin) {
  const at::Tensor a = actual.to(at::kCPU).to(at::kFloat);
  const at::Tensor e = expected.to(at::kCPU).to(at::kFloat);
  const at::Tensor top2 = std::get<0>(e.topk(2, -1));
  const at::Tensor lead = (top2.select(-1, 0) - top2.select(-1, 1)).gt(margin);
  const at::Tensor differ = a.argmax(-1).ne(e.argmax(-1));
  return differ.logical_and(lead).sum().item<std::int64_t>();
}

// The "tiny" config with another grouping of query heads (group = heads / kv_heads).
inline llm_decode::LlamaConfig tiny_config(std::int64_t heads, std::int64_t kv_heads, bool tied = true) {
  llm_decode::LlamaConfig config = llm_decode::LlamaConfig::preset("tiny");
  config.num_heads = heads;
  config.num_kv_heads = kv_heads;
  config.tie_embeddings = tied;
  return config;
}

// What the fused step bookkeeping (`kernels`: the CUDA ones or their host
// versions) and the ATen one made of the same random states: how many
// trials differed anywhere in the state block, and how often each outcome
// came up (so that a case can tell that the trials covered them).
struct BookkeepingComparison {
  int differing = 0;
  int inputs_differing = 0;
  int finished_by_eos = 0;
  int finished_by_limit = 0;
  int loops_stopped = 0;
  int loops_going = 0;
};

inline BookkeepingComparison compare_step_bookkeeping(const llm_decode::fused::Kernels& kernels, at::Device device,
                                                      int trials) {
  BookkeepingComparison result;
  auto& rng = replay_test::rng();
  const auto draw = [&](std::int64_t low, std::int64_t high) {
    return std::uniform_int_distribution<std::int64_t>(low, high)(rng);
  };
  const auto options = at::TensorOptions().dtype(at::kLong);
  for (int trial = 0; trial < trials; ++trial) {
    const std::int64_t rows = draw(1, 9);
    const std::int64_t steps = draw(1, 4);
    const std::int64_t spare_slot = 9;
    // The executor's layout: rows 0..6 of the state, then the ring.
    at::Tensor block = at::full({7 + steps, std::max<std::int64_t>(rows, 3)}, -7, options);
    for (std::int64_t r = 0; r < rows; ++r) {
      block[0][r] = draw(0, 8);        // slots
      block[1][r] = draw(0, 50);       // positions
      block[2][r] = draw(0, 99);       // tokens
      block[3][r] = draw(0, 5);        // limits
      block[4][r] = draw(0, 3) == 0;   // done, a quarter of the rows
      block[6][r] = draw(0, 5);        // counts
    }
    block[5][0] = draw(0, 2 * steps);  // warm-ups run past the ring: the remainder
    block[5][1] = draw(1, steps);
    block[5][2] = 1;
    const at::Tensor eos = int64_tensor(random_tokens(draw(0, 2), 10), at::kCPU).to(device);
    const at::Tensor next = int64_tensor(random_tokens(rows, 12), at::kCPU).to(device);
    const auto views = [&](const at::Tensor& b) {
      const at::Tensor r = b.narrow(1, 0, rows);
      return llm_decode::StepState{.slots = r[0], .positions = r[1], .tokens = r[2], .limits = r[3], .done = r[4],
                                   .counts = r[6], .loop = b[5].narrow(0, 0, 3), .ring = b.narrow(0, 7, steps).narrow(1, 0, rows)};
    };
    // Copies (to() on the same device would return `block` itself).
    const at::Tensor aten_block = block.to(device, /*non_blocking=*/false, /*copy=*/true);
    const at::Tensor fused_block = block.to(device, /*non_blocking=*/false, /*copy=*/true);
    const llm_decode::StepState aten_state = views(aten_block);
    const llm_decode::StepState fused_state = views(fused_block);
    const llm_decode::fused::StepRows fused_rows = llm_decode::fused_step_rows(fused_state, eos, spare_slot);
    const cudaStream_t stream =
        device.is_cuda() ? c10::cuda::getCurrentCUDAStream(device.index()).stream() : nullptr;

    const auto [live_slots, live_positions] = llm_decode::aten_step_inputs(aten_state, spare_slot);
    const at::Tensor live = at::empty({2, rows}, options.device(device));
    kernels.step_inputs(fused_rows, live[0].data_ptr<std::int64_t>(), live[1].data_ptr<std::int64_t>(), stream);
    result.inputs_differing += !(live[0].equal(live_slots) && live[1].equal(live_positions));

    llm_decode::aten_step_update(aten_state, next, eos);
    kernels.step_update(fused_rows, next.data_ptr<std::int64_t>(), stream);
    result.differing += !fused_block.equal(aten_block);

    const at::Tensor before = block.narrow(1, 0, rows);
    const at::Tensor after = aten_block.to(at::kCPU).narrow(1, 0, rows);
    const at::Tensor next_cpu = next.to(at::kCPU);
    const at::Tensor eos_cpu = eos.to(at::kCPU);
    for (std::int64_t r = 0; r < rows; ++r) {
      if (before[4][r].item<std::int64_t>() != 0 || after[4][r].item<std::int64_t>() == 0) continue;
      const bool eos_hit = eos_cpu.numel() > 0 && eos_cpu.eq(next_cpu[r]).any().item<bool>();
      ++(eos_hit ? result.finished_by_eos : result.finished_by_limit);
    }
    ++(aten_block[5][2].item<std::int64_t>() != 0 ? result.loops_going : result.loops_stopped);
  }
  return result;
}

// Sets one of the fused kernels' process-wide settings for a scope and puts
// back what it found when the scope ends, also by an exception: `Get` and
// `Set` are the setting's reader and writer.
template <typename Value, Value (*Get)(), void (*Set)(Value)>
class ScopedSetting {
 public:
  explicit ScopedSetting(Value value) : previous_(Get()) { Set(value); }
  ScopedSetting(const ScopedSetting&) = delete;
  ScopedSetting& operator=(const ScopedSetting&) = delete;
  ~ScopedSetting() { Set(previous_); }
  // What was in force before, and is again after.
  Value previous() const { return previous_; }

 private:
  Value previous_;
};
using ScopedOwnProducts =
    ScopedSetting<llm_decode::fused::ProductRowCounts, &llm_decode::fused::own_products_at,
                  &llm_decode::fused::set_own_products_at>;
using ScopedNarrowProducts =
    ScopedSetting<llm_decode::fused::ProductRowCounts, &llm_decode::fused::narrow_products_at,
                  &llm_decode::fused::set_narrow_products_at>;

// The step's own products at these row counts (the default uses them at
// batch 1 only), so that a test covers them inside a whole step.
class OwnProductsAt : public ScopedOwnProducts {
 public:
  explicit OwnProductsAt(llm_decode::fused::ProductRowCounts row_counts)
      : ScopedOwnProducts(row_counts) {}
  // A number is not a set of counts: OwnProductRows(8), or product_rows_of({8}).
  template <std::integral Number>
  explicit OwnProductsAt(Number) = delete;
};
// The same, 1 to `rows` rows (a count, never the set's bits).
class OwnProductRows : public OwnProductsAt {
 public:
  explicit OwnProductRows(int rows) : OwnProductsAt(llm_decode::fused::product_rows_up_to(rows)) {}
};
// The own products of 2 to 8 rows as the narrow tensor-core product (on),
// or the GEMV (off), for a scope.
class NarrowProducts : public ScopedNarrowProducts {
 public:
  explicit NarrowProducts(bool on)
      : ScopedNarrowProducts(on ? llm_decode::fused::kNarrowRowCounts
                                                   : llm_decode::fused::ProductRowCounts{}) {}
};
// Where the fused kernels are launched programmatically.
using ProgrammaticLaunchesSetting =
    ScopedSetting<llm_decode::fused::ProgrammaticLaunches, &llm_decode::fused::programmatic_launches,
                  &llm_decode::fused::set_programmatic_launches>;
// The narrow products' chunks in flight a warp, forced (0: by the width).
using NarrowChunksInFlight = ScopedSetting<int, &llm_decode::fused::forced_narrow_chunks_in_flight,
                                           &llm_decode::fused::force_narrow_chunks_in_flight>;
// Whether one-row steps fold their norms into the products.
using FoldNorms = ScopedSetting<bool, &llm_decode::fused::fold_norms, &llm_decode::fused::set_fold_norms>;

// Whether a one-row decode step of `config` folds its norms (fused::folds_norms).
inline bool folds_norms(const llm_decode::LlamaConfig& config) {
  [[maybe_unused]] const auto [qkv, o, gate_up, down, logits] = llm_decode::step_products(config, 1, 1);
  return llm_decode::fused::folds_norms(1, qkv.in, qkv.out, gate_up.out, logits.out);
}

// A half tensor's data as the kernels' pointer type.
inline __half* half_ptr(const at::Tensor& t) { return reinterpret_cast<__half*>(t.data_ptr<at::Half>()); }

// Whether fp16 outputs `a` and `b` hold the same bits (as 16-bit integers,
// so -0 and +0 differ) and `a` was written where it started as NaN.
inline bool same_written_bits(const at::Tensor& a, const at::Tensor& b) {
  return a.view(at::kShort).equal(b.view(at::kShort)) && !a.isnan().any().item<bool>();
}

// The head layouts (heads, kv_heads, head_dim) the attention cases run:
// query groups 1 to 8; widths 48, 80 and 96 leave 2, 2 and 8 of a warp's
// lanes without a value row.
struct AttentionLayout {
  int heads, kv_heads, head_dim;
};
inline std::vector<AttentionLayout> attention_layouts() {
  return {{4, 2, 16}, {12, 4, 64}, {2, 2, 48}, {8, 8, 80}, {6, 2, 96}, {16, 2, 128}, {4, 1, 256}};
}

// A product's sizes (rows of `in` halves into `out` outputs): the model's.
using llm_decode::ProductShape;

// The fused products (linear, gated_linear) of one shape on `device`, each
// against a float32 linear of the same fp16 inputs (gated: of silu(gate) *
// up rounded to fp16, as silu_mul() stores it), as max_error(); outputs
// start as NaN, so one left unwritten shows. Each product runs twice: the
// second must give the same bits (split sums in a fixed order) and leave
// the workspace's counters at zero.
struct ProductErrors {
  bool split = false;  // the width split over blocks (linear_partial_floats() > 0)
  double linear = 0;
  double gated = 0;
  bool repeatable = true;
  bool counters_left_zero = true;
};

// Shapes of every kind: 1 to 8 rows (GEMVs, or narrow products from 2 rows)
// over widths giving 1 to 8 warps and several vectors per thread or a last
// chunk of 8 halves, outputs not a multiple of a block's weight rows (4 or
// 16); skinny GEMMs of 16 to 64 rows, one block per output tile or the
// width split over 2 and 8 blocks.
inline std::vector<ProductShape> product_shapes() {
  return {{1, 64, 128}, {3, 768, 37},   {8, 2056, 9},  {5, 8, 3},      {2, 4096, 6},  {7, 264, 5}, {6, 520, 40},
          {16, 64, 128}, {32, 96, 32}, {64, 512, 96}, {16, 2048, 64}, {48, 256, 64}};
}

inline ProductErrors fused_product_errors(const llm_decode::fused::Kernels& kernels, at::Device device,
                                          ProductShape s) {
  const at::TensorOptions half = at::TensorOptions().device(device).dtype(at::kHalf);
  const std::size_t floats = llm_decode::fused::linear_partial_floats(s.rows, s.in, s.out);
  const std::size_t count = llm_decode::fused::linear_counters(s.out);
  const at::Tensor partials = at::empty({static_cast<std::int64_t>(std::max<std::size_t>(floats, 1))},
                                        half.dtype(at::kFloat));
  const at::Tensor counters = at::zeros({static_cast<std::int64_t>(std::max<std::size_t>(count, 1))},
                                        half.dtype(at::kInt));
  const llm_decode::fused::LinearWorkspace workspace{
      .partials = partials.data_ptr<float>(), .counters = reinterpret_cast<unsigned int*>(counters.data_ptr<int>())};
  const cudaStream_t stream = device.is_cuda() ? c10::cuda::getCurrentCUDAStream(device.index()).stream() : nullptr;
  const at::Tensor x = at::randn({s.rows, s.in}, half.dtype(at::kFloat)).to(at::kHalf);
  const at::Tensor gate_up = at::randn({s.rows, 2 * s.in}, half.dtype(at::kFloat)).to(at::kHalf);
  const at::Tensor weight =
      (at::randn({s.out, s.in}, half.dtype(at::kFloat)) / std::sqrt(static_cast<double>(s.in))).to(at::kHalf);
  const at::Tensor act = (at::silu(gate_up.narrow(1, 0, s.in).to(at::kFloat)) *
                          gate_up.narrow(1, s.in, s.in).to(at::kFloat))
                             .to(at::kHalf);
  ProductErrors errors;
  errors.split = floats > 0;
  for (const bool gated : {false, true}) {
    at::Tensor first;
    for (int run = 0; run < 2; ++run) {
      const at::Tensor y = at::full({s.rows, s.out}, std::numeric_limits<double>::quiet_NaN(), half);
      if (gated) {
        kernels.gated_linear(half_ptr(gate_up), half_ptr(weight), half_ptr(y), s.rows, s.in, s.out, workspace, stream);
      } else {
        kernels.linear(half_ptr(x), half_ptr(weight), half_ptr(y), s.rows, s.in, s.out, workspace, stream);
      }
      if (run == 0) {
        first = y;
      } else {
        errors.repeatable = errors.repeatable && y.equal(first);
      }
    }
    const at::Tensor expected = at::linear((gated ? act : x).to(at::kFloat), weight.to(at::kFloat));
    // NaN (an output never written) compares false: an error of infinity.
    const double error = first.isnan().any().item<bool>() ? INFINITY : max_error(first.to(at::kFloat), expected);
    (gated ? errors.gated : errors.linear) = error;
  }
  errors.counters_left_zero = counters.eq(0).all().item<bool>();
  return errors;
}

// Kernels::norm_linear against add_rms_norm() then linear() of the same
// table, on random data: whether the product and the sum (x_out) are the same
// bits, and x is left as it was.
struct NormLinearCheck {
  bool same_product = false;
  bool same_sum = false;
  bool x_untouched = false;
};

inline NormLinearCheck norm_linear_against_two_kernels(const llm_decode::fused::Kernels& kernels, at::Device device,
                                                       int in, int out, bool with_delta) {
  const at::TensorOptions half = at::TensorOptions().device(device).dtype(at::kHalf);
  const cudaStream_t stream = device.is_cuda() ? c10::cuda::getCurrentCUDAStream(device.index()).stream() : nullptr;
  const at::Tensor x = at::randn({1, in}, half.dtype(at::kFloat)).to(at::kHalf);
  const at::Tensor delta = at::randn({1, in}, half.dtype(at::kFloat)).to(at::kHalf);
  const at::Tensor norm_weight = (1 + 0.1 * at::randn({in}, half.dtype(at::kFloat))).to(at::kHalf);
  const at::Tensor weight =
      (at::randn({out, in}, half.dtype(at::kFloat)) / std::sqrt(static_cast<double>(in))).to(at::kHalf);
  const __half* added = with_delta ? half_ptr(delta) : nullptr;
  constexpr float kEps = 1e-5F;
  const at::Tensor two_sum = x.clone();
  const at::Tensor normed = at::empty_like(x);
  const at::Tensor two_y = at::full({1, out}, std::numeric_limits<double>::quiet_NaN(), half);
  kernels.add_rms_norm(half_ptr(two_sum), added, half_ptr(norm_weight), half_ptr(normed), 1, in, kEps, stream);
  kernels.linear(half_ptr(normed), half_ptr(weight), half_ptr(two_y), 1, in, out, {}, stream);
  const at::Tensor x_before = x.clone();
  const at::Tensor one_sum = at::zeros_like(x);
  const at::Tensor one_y = at::full({1, out}, std::numeric_limits<double>::quiet_NaN(), half);
  kernels.norm_linear(half_ptr(x), added, half_ptr(norm_weight), kEps, half_ptr(one_sum), half_ptr(weight),
                      half_ptr(one_y), 1, in, out, {}, stream);
  // NaN (an output never written) compares unequal.
  return {.same_product = one_y.equal(two_y) && !one_y.isnan().any().item<bool>(),
          .same_sum = !with_delta || one_sum.equal(two_sum),
          .x_untouched = x.equal(x_before)};
}


// Kernels::gate_up_silu against linear() into [rows, 2 width] then
// silu_mul() of the same table, on random data (s.out: SwiGLU's width, the
// outputs): whether the outputs are the same bits (compared as 16-bit
// integers, so -0 and +0 differ); they start as NaN, so one left unwritten
// shows.
inline bool gate_up_silu_as_two_kernels(const llm_decode::fused::Kernels& kernels, at::Device device,
                                        ProductShape s) {
  const at::TensorOptions half = at::TensorOptions().device(device).dtype(at::kHalf);
  const cudaStream_t stream = device.is_cuda() ? c10::cuda::getCurrentCUDAStream(device.index()).stream() : nullptr;
  const at::Tensor x = at::randn({s.rows, s.in}, half.dtype(at::kFloat)).to(at::kHalf);
  const at::Tensor gate_up =
      (at::randn({2 * s.out, s.in}, half.dtype(at::kFloat)) / std::sqrt(static_cast<double>(s.in))).to(at::kHalf);
  const at::Tensor products = at::empty({s.rows, 2 * s.out}, half);
  const at::Tensor two = at::full({s.rows, s.out}, std::numeric_limits<double>::quiet_NaN(), half);
  kernels.linear(half_ptr(x), half_ptr(gate_up), half_ptr(products), s.rows, s.in, 2 * s.out, {}, stream);
  kernels.silu_mul(half_ptr(products), half_ptr(two), s.rows, s.out, stream);
  const at::Tensor one = at::full({s.rows, s.out}, std::numeric_limits<double>::quiet_NaN(), half);
  kernels.gate_up_silu(half_ptr(x), half_ptr(gate_up), half_ptr(one), s.rows, s.in, s.out, stream);
  return same_written_bits(one, two);
}

// The narrow products with 4 and with 8 chunks in flight a warp
// (fused::force_narrow_chunks_in_flight), Kernels::linear (of 2 * out
// outputs) and Kernels::gate_up_silu (of out) on `rows` rows `in` halves
// wide: whether both depths give the same bits (as 16-bit integers; the
// outputs start as NaN, so one left unwritten shows). They would differ if
// a depth summed in another order: every weight row holds 2048 at half 0
// and -2048 at half `cancel_at`, the inputs 1 there, so each sum cancels
// two large terms around small ones (weights of about 0.01) and its
// rounding depends on which small terms meet the large ones.
inline bool same_bits_at_both_depths(const llm_decode::fused::Kernels& kernels, at::Device device, int rows, int in,
                                     int out, int cancel_at) {
  const at::TensorOptions half = at::TensorOptions().device(device).dtype(at::kHalf);
  const cudaStream_t stream = device.is_cuda() ? c10::cuda::getCurrentCUDAStream(device.index()).stream() : nullptr;
  at::Tensor x = (1 + 0.1 * at::randn({rows, in}, half.dtype(at::kFloat))).to(at::kHalf);
  at::Tensor weight = (0.01 * at::randn({2 * out, in}, half.dtype(at::kFloat))).to(at::kHalf);
  x.select(1, 0).fill_(1);
  x.select(1, cancel_at).fill_(1);
  weight.select(1, 0).fill_(2048);
  weight.select(1, cancel_at).fill_(-2048);
  const auto outputs = [&](int chunks) {
    const NarrowChunksInFlight depth(chunks);
    const at::Tensor y = at::full({rows, 2 * out}, std::numeric_limits<double>::quiet_NaN(), half);
    kernels.linear(half_ptr(x), half_ptr(weight), half_ptr(y), rows, in, 2 * out, {}, stream);
    const at::Tensor activated = at::full({rows, out}, std::numeric_limits<double>::quiet_NaN(), half);
    kernels.gate_up_silu(half_ptr(x), half_ptr(weight), half_ptr(activated), rows, in, out, stream);
    return std::pair{y, activated};
  };
  const auto [y, activated] = outputs(4);
  const auto [deep_y, deep_activated] = outputs(8);
  return same_written_bits(y, deep_y) && same_written_bits(activated, deep_activated);
}

// The fused attention kernels (`kernels`: the CUDA ones or their host
// versions) against a float64 reference, for one head layout over contexts
// of up to `max_len` keys (past 256 keys a row is split over blocks).
// Rows sit in slots of their own at positions across chunk boundaries, and
// one padding row in the spare slot (the last) at position 0.
// Returns the largest error, relative to the largest output, of
// decode_attention (against softmax(scale q k^T) v of the cached keys) and
// of rotary_attention (against rotary_and_cache_write then decode_attention,
// both outputs and caches). The host and device versions round alike but
// are not bit for bit the same (the device contracts into fused
// multiply-adds and uses its own exp), hence a reference, not a bit compare.
struct AttentionErrors {
  double decode = 0;
  double rotary = 0;
  double rotary_cache = 0;
  bool cache_written = false;  // rotary_attention changed the key cache
  bool finite = false;         // rotary_attention's output is finite
  // decode_attention over a shorter context (256, 512 where shorter than
  // max_len: fewer blocks per row) gave the rows it holds the same bits.
  bool same_for_every_context = false;
  bool counters_left_zero = false;  // after every call
};

inline AttentionErrors fused_attention_errors(const llm_decode::fused::Kernels& kernels, at::Device device,
                                              const AttentionLayout& layout, std::int64_t max_len) {
  const auto [heads, kv_heads, head_dim] = layout;
  const auto half = at::TensorOptions().dtype(at::kHalf).device(device);
  const auto ptr64 = [](const at::Tensor& t) { return t.data_ptr<std::int64_t>(); };
  const auto random_half = [&](at::IntArrayRef sizes) { return at::randn(sizes).to(at::kHalf).to(device); };
  // Positions at and around the chunk boundaries (32 keys per warp, 256 per
  // pass of the block's 8 warps) and where a block's keys change the lanes
  // per key (at head widths 64, 128 and 256: 8 up to 32 keys, 4 up to 64,
  // 2 up to 128, then 1), the last one included.
  std::vector<std::int64_t> positions_list;
  for (const std::int64_t p : {std::int64_t{0}, std::int64_t{31}, std::int64_t{32}, std::int64_t{63},
                               std::int64_t{64}, std::int64_t{127}, std::int64_t{128}, std::int64_t{255},
                               std::int64_t{256}, std::int64_t{300}, std::int64_t{511}, std::int64_t{513}}) {
    if (p < max_len - 1) positions_list.push_back(p);
  }
  positions_list.push_back(max_len - 1);
  const int live = static_cast<int>(positions_list.size());
  std::vector<std::int64_t> slots_list(static_cast<std::size_t>(live));
  // Distinct slots, not in row order; then the padding row.
  for (int r = 0; r < live; ++r) slots_list[static_cast<std::size_t>(r)] = (r + live / 2) % live;
  slots_list.push_back(live);
  positions_list.push_back(0);
  const int rows = live + 1;
  const at::Tensor slots = int64_tensor(slots_list, device);
  const at::Tensor positions = int64_tensor(positions_list, device);
  const at::Tensor cache_k = random_half({live + 1, kv_heads, max_len, head_dim});
  const at::Tensor cache_v = random_half({live + 1, kv_heads, max_len, head_dim});
  const at::Tensor q = random_half({rows, heads, head_dim});
  const float scale = 1.0F / std::sqrt(static_cast<float>(head_dim));
  const int context = static_cast<int>(max_len);
  const cudaStream_t stream = device.is_cuda() ? c10::cuda::getCurrentCUDAStream(device.index()).stream() : nullptr;

  AttentionErrors errors;
  const llm_decode::AttentionWorkspaceTensors scratch =
      llm_decode::attention_workspace(at::TensorOptions().device(device), rows, heads, kv_heads, head_dim, context);
  errors.counters_left_zero = true;
  const auto check_counters = [&] {
    if (scratch.counters.defined()) errors.counters_left_zero &= scratch.counters.eq(0).all().item<bool>();
  };
  const at::Tensor out = at::empty({rows, heads * head_dim}, half);
  kernels.decode_attention(half_ptr(q), half_ptr(cache_k), half_ptr(cache_v), ptr64(slots), ptr64(positions),
                           half_ptr(out), rows, heads, kv_heads, head_dim, max_len, context, scale,
                           scratch.view(), stream);
  check_counters();
  errors.same_for_every_context = true;
  for (const int shorter : {256, 512}) {
    if (shorter >= context) continue;
    const at::Tensor short_out = at::empty({rows, heads * head_dim}, half);
    std::vector<std::int64_t> held;  // the rows whose keys the shorter context holds
    for (int r = 0; r < rows; ++r) {
      if (positions_list[static_cast<std::size_t>(r)] < shorter) held.push_back(r);
    }
    const at::Tensor held_rows = int64_tensor(held, device);
    kernels.decode_attention(half_ptr(q), half_ptr(cache_k), half_ptr(cache_v), ptr64(slots), ptr64(positions),
                             half_ptr(short_out), rows, heads, kv_heads, head_dim, max_len, shorter, scale,
                             scratch.view(), stream);
    check_counters();
    // Rows past the shorter context read it clamped; only the held ones compare.
    errors.same_for_every_context &= short_out.index_select(0, held_rows).equal(out.index_select(0, held_rows));
  }
  const at::Tensor k64 = cache_k.to(at::kCPU).to(at::kDouble);
  const at::Tensor v64 = cache_v.to(at::kCPU).to(at::kDouble);
  const at::Tensor q64 = q.to(at::kCPU).to(at::kDouble);
  const int group = heads / kv_heads;
  std::vector<at::Tensor> expected_rows;
  for (int r = 0; r < rows; ++r) {
    const std::int64_t slot = slots_list[static_cast<std::size_t>(r)];
    const std::int64_t keys = positions_list[static_cast<std::size_t>(r)] + 1;
    std::vector<at::Tensor> heads_out;
    for (int h = 0; h < heads; ++h) {
      const at::Tensor k = k64[slot][h / group].narrow(0, 0, keys);  // [keys, head_dim]
      const at::Tensor v = v64[slot][h / group].narrow(0, 0, keys);
      const at::Tensor weights = at::softmax(k.matmul(q64[r][h]) * static_cast<double>(scale), 0);
      heads_out.push_back(weights.matmul(v));
    }
    expected_rows.push_back(at::cat(heads_out));
  }
  errors.decode = max_error(out, at::stack(expected_rows));

  // rotary_attention against its two steps, from the same qkv rows and caches.
  const at::Tensor qkv = random_half({rows, (heads + 2 * kv_heads) * head_dim});
  const at::Tensor cos = random_half({max_len, head_dim});
  const at::Tensor sin = random_half({max_len, head_dim});
  const at::Tensor two_k = cache_k.clone();
  const at::Tensor two_v = cache_v.clone();
  const at::Tensor rotated = at::empty({rows, heads, head_dim}, half);
  const at::Tensor two_out = at::empty({rows, heads * head_dim}, half);
  kernels.rotary_and_cache_write(half_ptr(qkv), qkv.stride(0), half_ptr(cos), half_ptr(sin), ptr64(positions),
                                 ptr64(slots), half_ptr(rotated), half_ptr(two_k), half_ptr(two_v), rows, heads,
                                 kv_heads, head_dim, max_len, stream);
  kernels.decode_attention(half_ptr(rotated), half_ptr(two_k), half_ptr(two_v), ptr64(slots), ptr64(positions),
                           half_ptr(two_out), rows, heads, kv_heads, head_dim, max_len, context, scale,
                           scratch.view(), stream);
  check_counters();
  const at::Tensor one_k = cache_k.clone();
  const at::Tensor one_v = cache_v.clone();
  const at::Tensor one_out = at::empty({rows, heads * head_dim}, half);
  kernels.rotary_attention(half_ptr(qkv), qkv.stride(0), half_ptr(cos), half_ptr(sin), ptr64(positions), ptr64(slots),
                           half_ptr(one_k), half_ptr(one_v), half_ptr(one_out), rows, heads, kv_heads, head_dim,
                           max_len, context, scale, scratch.view(), stream);
  check_counters();
  errors.rotary = max_error(one_out, two_out);
  errors.rotary_cache = std::max(max_error(one_k, two_k), max_error(one_v, two_v));
  errors.cache_written = !one_k.equal(cache_k);
  errors.finite = one_out.isfinite().all().item<bool>();
  return errors;
}

}  // namespace llm_decode_test
