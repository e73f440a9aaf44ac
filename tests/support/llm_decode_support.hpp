#pragma once
// Shared by the llm_decode model's host and gpu cases: random prompts and the
// run that feeds sequences through prefill and decode steps with the cache,
// to be compared with forward_full on the whole sequence. No assertions here:
// the cases assert on what these return.
#include <ATen/ATen.h>

#include <algorithm>
#include <cstdint>
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

}  // namespace llm_decode_test
