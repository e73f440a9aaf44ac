#pragma once
// The static key/value cache of the decoder: one fixed tensor per K and V for
// every slot (sequence) and position, so that a decode step reads and writes
// the same addresses on every call and can be captured in a CUDA graph once.
#include <ATen/ATen.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "config.hpp"

namespace llm_decode {

struct KvCache {
  // Zero-filled, not left uninitialized: positions past a row's own are
  // masked to a probability of exactly 0, and 0 * v is 0 only while v is
  // finite (stray NaNs in fresh memory would poison every row that reads them).
  KvCache(const LlamaConfig& config, std::int64_t slots, at::Device device, at::ScalarType dtype = at::kHalf) {
    config.validate();
    if (slots < 1) {
      throw std::invalid_argument("llm_decode: a KvCache needs at least one slot, not " + std::to_string(slots));
    }
    const at::TensorOptions options = at::TensorOptions().device(device).dtype(dtype);
    k = at::zeros({config.num_layers, slots + 1, config.num_kv_heads, config.max_len, config.head_dim()}, options);
    v = at::zeros_like(k);
  }

  // [layers, slots + 1, kv_heads, max_len, head_dim]; slot `slots()` is the spare one.
  at::Tensor k;
  at::Tensor v;

  std::int64_t slots() const { return k.size(1) - 1; }
  // Padding rows and finished rows write here (at position 0); what they read is ignored.
  std::int64_t spare_slot() const { return slots(); }
};

}  // namespace llm_decode
