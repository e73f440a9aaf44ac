#pragma once
// Fused CUDA kernels for the decode step (DecodeKernels::fused in model.hpp):
// what torch.compile's Inductor does to the same math, written by hand. The
// plain step issues about 20 ATen operators per layer; with these it issues
// 8 (4 products, 4 of these). Defined in fused_kernels.cu (nvcc); declared
// here with plain types for the libtorch side. Each launch is checked
// (replay::check_last_launch) and runs on the given stream, so a capture of
// that stream records it. host_kernels() runs the kernels' code over host
// memory as one thread: what the tests check the math and the indexing with
// where there is no GPU.
#include <cstddef>
#include <cstdint>

#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

namespace llm_decode::fused {

// The most query heads per key/value head decode_attention() handles.
inline constexpr int kMaxQueryGroup = 8;
// The shared memory decode_attention() may use (without opting in to more),
// and what it needs: the scaled queries and the scores of one key/value head.
inline constexpr std::size_t kAttentionSharedLimit = 44 * 1024;  // under the 48 KB default, with room for the static part
constexpr std::size_t attention_shared_bytes(int group, int head_dim, std::int64_t context) {
  return static_cast<std::size_t>(group) * static_cast<std::size_t>(head_dim + context) * sizeof(float);
}

// The four kernels, as one table: kernels() launches them on `stream` (each
// launch checked), host_kernels() runs the same code over host memory as one
// thread (the stream is not used). fp16 data, contiguous rows.
struct Kernels {
  // Rotary embedding of q and k (rotate-half, as Hugging Face's Llama) and
  // the cache write of k and v, one kernel for a step's rows.
  //   qkv: [rows, (heads + 2 kv_heads) * head_dim], row stride `qkv_stride`
  //   cos, sin: [max_len, head_dim]; positions, slots: int64 [rows]
  //   q_out: [rows, heads, head_dim]
  //   cache_k, cache_v: one layer, [slots + 1, kv_heads, max_len, head_dim]
  // Writes k and v at (slots[r], :, positions[r]); computes in float32 and
  // rounds once.
  void (*rotary_and_cache_write)(const __half* qkv, std::int64_t qkv_stride, const __half* cos, const __half* sin,
                                 const std::int64_t* positions, const std::int64_t* slots, __half* q_out,
                                 __half* cache_k, __half* cache_v, int rows, int heads, int kv_heads, int head_dim,
                                 std::int64_t max_len, cudaStream_t stream);
  // Decode attention reading the cache by slot (no gather): row r's query
  // heads attend to keys 0..positions[r] of slot slots[r]; grouped-query
  // (heads / kv_heads query heads per key/value head, at most
  // kMaxQueryGroup). positions[r] < context <= max_len; scores, softmax and
  // the weighted sum in float32.
  //   q: [rows, heads, head_dim]; out: [rows, heads * head_dim]
  // Throws std::invalid_argument for shapes it cannot take (a group over
  // kMaxQueryGroup, a context whose scores do not fit in shared memory).
  void (*decode_attention)(const __half* q, const __half* cache_k, const __half* cache_v, const std::int64_t* slots,
                           const std::int64_t* positions, __half* out, int rows, int heads, int kv_heads,
                           int head_dim, std::int64_t max_len, int context, float scale, cudaStream_t stream);
  // The residual add and the RMSNorm after it: x += delta (rounded to fp16,
  // as the plain add), then out = x * rsqrt(mean(x^2) + eps) * weight in
  // float32, rounded once (as at::rms_norm). delta may be null: only the norm.
  //   x, delta, out: [rows, width]; weight: [width]
  void (*add_rms_norm)(__half* x, const __half* delta, const __half* weight, __half* out, int rows, int width,
                       float eps, cudaStream_t stream);
  // SwiGLU's product: out = silu(gate) * up in float32, rounded once.
  //   gate_up: [rows, 2 * width] (gate, then up); out: [rows, width]
  void (*silu_mul)(const __half* gate_up, __half* out, int rows, int width, cudaStream_t stream);
};

// The CUDA kernels.
const Kernels& kernels();
// The same code over host memory, one thread at a time.
const Kernels& host_kernels();

}  // namespace llm_decode::fused
