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

}  // namespace llm_decode_test
