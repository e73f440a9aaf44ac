// The fused decode kernels (fused_kernels.hpp). Written for decode shapes:
// a few to 64 rows, head_dim 64 or 128, contexts up to a few thousand.
#include "fused_kernels.hpp"

#include <cmath>
#include <stdexcept>
#include <string>

#include <replay/error.hpp>

namespace llm_decode::fused {
namespace {

constexpr int kThreads = 128;

__device__ float warp_sum(float v) {
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffU, v, offset);
  return v;
}

__device__ float warp_max(float v) {
  for (int offset = 16; offset > 0; offset /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffU, v, offset));
  return v;
}

// Sum (or max) over the block; every thread gets the result. `scratch`:
// shared, at least kThreads / 32 floats; the call synchronizes the block.
template <bool Max>
__device__ float block_reduce(float v, float* scratch) {
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int warp = static_cast<int>(threadIdx.x) / 32;
  v = Max ? warp_max(v) : warp_sum(v);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float total = Max ? -INFINITY : 0.0F;
  for (int w = 0; w < static_cast<int>(blockDim.x) / 32; ++w) total = Max ? fmaxf(total, scratch[w]) : total + scratch[w];
  __syncthreads();  // scratch is reused by the next call
  return total;
}

__global__ void rotary_and_cache_write_kernel(const __half* qkv, std::int64_t qkv_stride, const __half* cos,
                                              const __half* sin, const std::int64_t* positions,
                                              const std::int64_t* slots, __half* q_out, __half* cache_k,
                                              __half* cache_v, int heads, int kv_heads, int head_dim,
                                              std::int64_t max_len) {
  const int r = static_cast<int>(blockIdx.x);
  const std::int64_t position = positions[r];
  const std::int64_t slot = slots[r];
  const __half* row = qkv + r * qkv_stride;
  const __half* c = cos + position * head_dim;
  const __half* s = sin + position * head_dim;
  const int half_dim = head_dim / 2;
  const int rotated = (heads + kv_heads) * head_dim;  // q and k
  const int total = rotated + kv_heads * head_dim;    // and v
  for (int i = static_cast<int>(threadIdx.x); i < total; i += static_cast<int>(blockDim.x)) {
    if (i < rotated) {
      const int head = i / head_dim;
      const int d = i % head_dim;
      const __half* x = row + head * head_dim;
      // rotate_half(x) = cat(-x[half:], x[:half])
      const float partner = d < half_dim ? -__half2float(x[d + half_dim]) : __half2float(x[d - half_dim]);
      const float value = __half2float(x[d]) * __half2float(c[d]) + partner * __half2float(s[d]);
      if (head < heads) {
        q_out[(static_cast<std::int64_t>(r) * heads + head) * head_dim + d] = __float2half(value);
      } else {
        const std::int64_t kv = head - heads;
        cache_k[((slot * kv_heads + kv) * max_len + position) * head_dim + d] = __float2half(value);
      }
    } else {
      const int j = i - rotated;
      const std::int64_t kv = j / head_dim;
      const int d = j % head_dim;
      cache_v[((slot * kv_heads + kv) * max_len + position) * head_dim + d] = row[rotated + j];
    }
  }
}

// One block per (row, key/value head): its `group` query heads attend to the
// same keys. Shared memory: the scaled queries [group, head_dim] and the
// scores [group, context] (then the probabilities, unnormalized).
__global__ void decode_attention_kernel(const __half* q, const __half* cache_k, const __half* cache_v,
                                        const std::int64_t* slots, const std::int64_t* positions, __half* out,
                                        int heads, int kv_heads, int head_dim, std::int64_t max_len, int context,
                                        float scale) {
  extern __shared__ float shared[];
  __shared__ float scratch[kThreads / 32];
  __shared__ float inverse_sum[kMaxQueryGroup];
  const int r = static_cast<int>(blockIdx.x);
  const int kv = static_cast<int>(blockIdx.y);
  const int group = heads / kv_heads;
  const int tid = static_cast<int>(threadIdx.x);
  const int threads = static_cast<int>(blockDim.x);
  float* queries = shared;                       // [group, head_dim]
  float* scores = shared + group * head_dim;     // [group, context]
  const std::int64_t slot = slots[r];
  // Keys 0..position; positions < context by contract (clamped all the same).
  const int keys = static_cast<int>(min(positions[r] + 1, static_cast<std::int64_t>(context)));
  const __half* k_base = cache_k + (slot * kv_heads + kv) * max_len * head_dim;
  const __half* v_base = cache_v + (slot * kv_heads + kv) * max_len * head_dim;
  const __half* q_base = q + (static_cast<std::int64_t>(r) * heads + static_cast<std::int64_t>(kv) * group) * head_dim;

  for (int i = tid; i < group * head_dim; i += threads) queries[i] = __half2float(q_base[i]) * scale;
  __syncthreads();
  for (int t = tid; t < keys; t += threads) {
    float dot[kMaxQueryGroup];
    for (int g = 0; g < group; ++g) dot[g] = 0.0F;
    const __half* k = k_base + static_cast<std::int64_t>(t) * head_dim;
    for (int d = 0; d < head_dim; ++d) {
      const float key = __half2float(k[d]);
      for (int g = 0; g < group; ++g) dot[g] += queries[g * head_dim + d] * key;
    }
    for (int g = 0; g < group; ++g) scores[g * context + t] = dot[g];
  }
  __syncthreads();
  for (int g = 0; g < group; ++g) {
    float* row = scores + g * context;
    float largest = -INFINITY;
    for (int t = tid; t < keys; t += threads) largest = fmaxf(largest, row[t]);
    largest = block_reduce<true>(largest, scratch);
    float sum = 0.0F;
    for (int t = tid; t < keys; t += threads) {
      const float e = expf(row[t] - largest);
      row[t] = e;
      sum += e;
    }
    sum = block_reduce<false>(sum, scratch);
    if (tid == 0) inverse_sum[g] = 1.0F / sum;
  }
  __syncthreads();
  for (int i = tid; i < group * head_dim; i += threads) {
    const int g = i / head_dim;
    const int d = i % head_dim;
    const float* p = scores + g * context;
    float acc = 0.0F;
    for (int t = 0; t < keys; ++t) acc += p[t] * __half2float(v_base[static_cast<std::int64_t>(t) * head_dim + d]);
    out[(static_cast<std::int64_t>(r) * heads + static_cast<std::int64_t>(kv) * group + g) * head_dim + d] =
        __float2half(acc * inverse_sum[g]);
  }
}

__global__ void add_rms_norm_kernel(__half* x, const __half* delta, const __half* weight, __half* out, int width,
                                    float eps) {
  __shared__ float scratch[kThreads / 32];
  const std::int64_t base = static_cast<std::int64_t>(blockIdx.x) * width;
  float squares = 0.0F;
  for (int i = static_cast<int>(threadIdx.x); i < width; i += static_cast<int>(blockDim.x)) {
    __half value = x[base + i];
    if (delta != nullptr) {
      value = __float2half(__half2float(value) + __half2float(delta[base + i]));  // the plain add's fp16 result
      x[base + i] = value;
    }
    const float v = __half2float(value);
    squares += v * v;
  }
  const float inverse_rms = rsqrtf(block_reduce<false>(squares, scratch) / static_cast<float>(width) + eps);
  for (int i = static_cast<int>(threadIdx.x); i < width; i += static_cast<int>(blockDim.x)) {
    out[base + i] = __float2half(__half2float(x[base + i]) * inverse_rms * __half2float(weight[i]));
  }
}

__global__ void silu_mul_kernel(const __half* gate_up, __half* out, int width) {
  const std::int64_t r = blockIdx.y;
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i >= width) return;
  const float gate = __half2float(gate_up[r * 2 * width + i]);
  const float up = __half2float(gate_up[r * 2 * width + width + i]);
  out[r * width + i] = __float2half(gate / (1.0F + expf(-gate)) * up);
}

}  // namespace

void rotary_and_cache_write(const __half* qkv, std::int64_t qkv_stride, const __half* cos, const __half* sin,
                            const std::int64_t* positions, const std::int64_t* slots, __half* q_out, __half* cache_k,
                            __half* cache_v, int rows, int heads, int kv_heads, int head_dim, std::int64_t max_len,
                            cudaStream_t stream) {
  if (head_dim % 2 != 0) throw std::invalid_argument("fused rotary: head_dim must be even");
  rotary_and_cache_write_kernel<<<rows, kThreads, 0, stream>>>(qkv, qkv_stride, cos, sin, positions, slots, q_out,
                                                               cache_k, cache_v, heads, kv_heads, head_dim, max_len);
  replay::check_last_launch("fused rotary_and_cache_write");
}

void decode_attention(const __half* q, const __half* cache_k, const __half* cache_v, const std::int64_t* slots,
                      const std::int64_t* positions, __half* out, int rows, int heads, int kv_heads, int head_dim,
                      std::int64_t max_len, int context, float scale, cudaStream_t stream) {
  if (kv_heads < 1 || heads % kv_heads != 0 || heads / kv_heads > kMaxQueryGroup) {
    throw std::invalid_argument("fused decode_attention: " + std::to_string(heads) + " query heads over " +
                                std::to_string(kv_heads) + " key/value heads; at most " +
                                std::to_string(kMaxQueryGroup) + " query heads per key/value head");
  }
  const int group = heads / kv_heads;
  const std::size_t shared = attention_shared_bytes(group, head_dim, context);
  if (shared > kAttentionSharedLimit) {
    throw std::invalid_argument("fused decode_attention: a context of " + std::to_string(context) +
                                " keys needs " + std::to_string(shared) + " bytes of shared memory for " +
                                std::to_string(group) + " query heads; the kernel takes at most " +
                                std::to_string(kAttentionSharedLimit));
  }
  decode_attention_kernel<<<dim3(static_cast<unsigned>(rows), static_cast<unsigned>(kv_heads)), kThreads, shared,
                            stream>>>(q, cache_k, cache_v, slots, positions, out, heads, kv_heads, head_dim, max_len,
                                      context, scale);
  replay::check_last_launch("fused decode_attention");
}

void add_rms_norm(__half* x, const __half* delta, const __half* weight, __half* out, int rows, int width, float eps,
                  cudaStream_t stream) {
  add_rms_norm_kernel<<<rows, kThreads, 0, stream>>>(x, delta, weight, out, width, eps);
  replay::check_last_launch("fused add_rms_norm");
}

void silu_mul(const __half* gate_up, __half* out, int rows, int width, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>((width + kThreads - 1) / kThreads), static_cast<unsigned>(rows));
  silu_mul_kernel<<<grid, kThreads, 0, stream>>>(gate_up, out, width);
  replay::check_last_launch("fused silu_mul");
}

}  // namespace llm_decode::fused
