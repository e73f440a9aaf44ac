// The fused decode kernels (fused_kernels.hpp). Written for decode shapes:
// a few to 64 rows, head_dim 64 or 128, contexts up to a few thousand.
//
// Each kernel's work is written once, as __host__ __device__ pieces that take
// the thread's index and the thread count: the kernels run them on a block's
// threads with barriers and block reductions between them; the host versions
// (host_kernels(), for tests on machines without a GPU) run the same pieces
// as one thread, in order.
#include "fused_kernels.hpp"

#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include <replay/error.hpp>

namespace llm_decode::fused {
namespace {

constexpr int kThreads = 128;

__host__ __device__ inline float inverse_sqrt(float v) {
#ifdef __CUDA_ARCH__
  return rsqrtf(v);
#else
  return 1.0F / std::sqrt(v);
#endif
}

// ---- the pieces ----

// Element i of row r: q and k rotated (i < (heads + kv_heads) * head_dim),
// then v copied; k and v written into the cache at (slot, position).
__host__ __device__ inline void rotary_element(const __half* qkv, std::int64_t qkv_stride, const __half* cos,
                                               const __half* sin, const std::int64_t* positions,
                                               const std::int64_t* slots, __half* q_out, __half* cache_k,
                                               __half* cache_v, int heads, int kv_heads, int head_dim,
                                               std::int64_t max_len, int r, int i) {
  const std::int64_t position = positions[r];
  const std::int64_t slot = slots[r];
  const __half* row = qkv + r * qkv_stride;
  const int rotated = (heads + kv_heads) * head_dim;  // q and k
  if (i < rotated) {
    const int head = i / head_dim;
    const int d = i % head_dim;
    const int half_dim = head_dim / 2;
    const __half* x = row + head * head_dim;
    // rotate_half(x) = cat(-x[half:], x[:half])
    const float partner = d < half_dim ? -__half2float(x[d + half_dim]) : __half2float(x[d - half_dim]);
    const float value = __half2float(x[d]) * __half2float(cos[position * head_dim + d]) +
                        partner * __half2float(sin[position * head_dim + d]);
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

// Where one (row, key/value head) of the attention reads and writes.
struct AttentionBlock {
  const __half* q;  // its `group` query heads, [group, head_dim]
  const __half* k;  // its slot's keys, [max_len, head_dim]
  const __half* v;
  __half* out;      // [group, head_dim]
  int group;
  int head_dim;
  int keys;         // positions 0..keys-1 attend
  int context;      // the scores' row stride
};

__host__ __device__ inline AttentionBlock attention_block(const __half* q, const __half* cache_k, const __half* cache_v,
                                                          const std::int64_t* slots, const std::int64_t* positions,
                                                          __half* out, int heads, int kv_heads, int head_dim,
                                                          std::int64_t max_len, int context, int r, int kv) {
  const int group = heads / kv_heads;
  const std::int64_t slot = slots[r];
  // Keys 0..position; positions < context by contract (clamped all the same).
  const std::int64_t last = positions[r] + 1;
  const int keys = static_cast<int>(last < context ? last : context);
  const std::int64_t first_head = static_cast<std::int64_t>(r) * heads + static_cast<std::int64_t>(kv) * group;
  return {q + first_head * head_dim, cache_k + (slot * kv_heads + kv) * max_len * head_dim,
          cache_v + (slot * kv_heads + kv) * max_len * head_dim, out + first_head * head_dim, group, head_dim, keys,
          context};
}

// Shared memory: the scaled queries [group, head_dim], then the scores
// [group, context] (later the unnormalized probabilities).
__host__ __device__ inline void attention_load_queries(const AttentionBlock& b, float* queries, float scale, int tid,
                                                       int threads) {
  for (int i = tid; i < b.group * b.head_dim; i += threads) queries[i] = __half2float(b.q[i]) * scale;
}

__host__ __device__ inline void attention_scores(const AttentionBlock& b, const float* queries, float* scores, int tid,
                                                 int threads) {
  for (int t = tid; t < b.keys; t += threads) {
    float dot[kMaxQueryGroup];
    for (int g = 0; g < b.group; ++g) dot[g] = 0.0F;
    const __half* k = b.k + static_cast<std::int64_t>(t) * b.head_dim;
    for (int d = 0; d < b.head_dim; ++d) {
      const float key = __half2float(k[d]);
      for (int g = 0; g < b.group; ++g) dot[g] += queries[g * b.head_dim + d] * key;
    }
    for (int g = 0; g < b.group; ++g) scores[g * b.context + t] = dot[g];
  }
}

__host__ __device__ inline float attention_max_part(const AttentionBlock& b, const float* row, int tid, int threads) {
  float largest = -INFINITY;
  for (int t = tid; t < b.keys; t += threads) largest = fmaxf(largest, row[t]);
  return largest;
}

// exp(score - largest) in place; returns this thread's part of their sum.
__host__ __device__ inline float attention_exp_part(const AttentionBlock& b, float* row, float largest, int tid,
                                                    int threads) {
  float sum = 0.0F;
  for (int t = tid; t < b.keys; t += threads) {
    const float e = expf(row[t] - largest);
    row[t] = e;
    sum += e;
  }
  return sum;
}

__host__ __device__ inline void attention_output(const AttentionBlock& b, const float* scores,
                                                 const float* inverse_sum, int tid, int threads) {
  for (int i = tid; i < b.group * b.head_dim; i += threads) {
    const int g = i / b.head_dim;
    const int d = i % b.head_dim;
    const float* p = scores + g * b.context;
    float acc = 0.0F;
    for (int t = 0; t < b.keys; ++t) acc += p[t] * __half2float(b.v[static_cast<std::int64_t>(t) * b.head_dim + d]);
    b.out[i] = __float2half(acc * inverse_sum[g]);
  }
}

// x += delta (the plain add's fp16 result) when delta is set; returns this
// thread's part of the row's sum of squares.
__host__ __device__ inline float add_squares_part(__half* x, const __half* delta, int width, int tid, int threads) {
  float squares = 0.0F;
  for (int i = tid; i < width; i += threads) {
    __half value = x[i];
    if (delta != nullptr) {
      value = __float2half(__half2float(value) + __half2float(delta[i]));
      x[i] = value;
    }
    const float v = __half2float(value);
    squares += v * v;
  }
  return squares;
}

__host__ __device__ inline void norm_write(const __half* x, const __half* weight, __half* out, int width,
                                           float inverse_rms, int tid, int threads) {
  for (int i = tid; i < width; i += threads) {
    out[i] = __float2half(__half2float(x[i]) * inverse_rms * __half2float(weight[i]));
  }
}

__host__ __device__ inline __half silu_times(__half gate, __half up) {
  const float g = __half2float(gate);
  return __float2half(g / (1.0F + expf(-g)) * __half2float(up));
}

// ---- the kernels ----

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
  const int total = (heads + 2 * kv_heads) * head_dim;
  for (int i = static_cast<int>(threadIdx.x); i < total; i += static_cast<int>(blockDim.x)) {
    rotary_element(qkv, qkv_stride, cos, sin, positions, slots, q_out, cache_k, cache_v, heads, kv_heads, head_dim,
                   max_len, r, i);
  }
}

// One block per (row, key/value head): its query heads attend to the same keys.
__global__ void decode_attention_kernel(const __half* q, const __half* cache_k, const __half* cache_v,
                                        const std::int64_t* slots, const std::int64_t* positions, __half* out,
                                        int heads, int kv_heads, int head_dim, std::int64_t max_len, int context,
                                        float scale) {
  extern __shared__ float shared[];
  __shared__ float scratch[kThreads / 32];
  __shared__ float inverse_sum[kMaxQueryGroup];
  const AttentionBlock b = attention_block(q, cache_k, cache_v, slots, positions, out, heads, kv_heads, head_dim,
                                           max_len, context, static_cast<int>(blockIdx.x), static_cast<int>(blockIdx.y));
  const int tid = static_cast<int>(threadIdx.x);
  const int threads = static_cast<int>(blockDim.x);
  float* queries = shared;
  float* scores = shared + b.group * b.head_dim;
  attention_load_queries(b, queries, scale, tid, threads);
  __syncthreads();
  attention_scores(b, queries, scores, tid, threads);
  __syncthreads();
  for (int g = 0; g < b.group; ++g) {
    float* row = scores + g * b.context;
    const float largest = block_reduce<true>(attention_max_part(b, row, tid, threads), scratch);
    const float sum = block_reduce<false>(attention_exp_part(b, row, largest, tid, threads), scratch);
    if (tid == 0) inverse_sum[g] = 1.0F / sum;
  }
  __syncthreads();
  attention_output(b, scores, inverse_sum, tid, threads);
}

__global__ void add_rms_norm_kernel(__half* x, const __half* delta, const __half* weight, __half* out, int width,
                                    float eps) {
  __shared__ float scratch[kThreads / 32];
  const std::int64_t base = static_cast<std::int64_t>(blockIdx.x) * width;
  const int tid = static_cast<int>(threadIdx.x);
  const int threads = static_cast<int>(blockDim.x);
  const float squares =
      block_reduce<false>(add_squares_part(x + base, delta == nullptr ? nullptr : delta + base, width, tid, threads),
                          scratch);
  norm_write(x + base, weight, out + base, width, inverse_sqrt(squares / static_cast<float>(width) + eps), tid,
             threads);
}

__global__ void silu_mul_kernel(const __half* gate_up, __half* out, int width) {
  const std::int64_t r = blockIdx.y;
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i >= width) return;
  out[r * width + i] = silu_times(gate_up[r * 2 * width + i], gate_up[r * 2 * width + width + i]);
}

void check_attention_shape(int heads, int kv_heads, int head_dim, int context) {
  if (kv_heads < 1 || heads % kv_heads != 0 || heads / kv_heads > kMaxQueryGroup) {
    throw std::invalid_argument("fused decode_attention: " + std::to_string(heads) + " query heads over " +
                                std::to_string(kv_heads) + " key/value heads; at most " +
                                std::to_string(kMaxQueryGroup) + " query heads per key/value head");
  }
  const std::size_t shared = attention_shared_bytes(heads / kv_heads, head_dim, context);
  if (shared > kAttentionSharedLimit) {
    throw std::invalid_argument("fused decode_attention: a context of " + std::to_string(context) +
                                " keys needs " + std::to_string(shared) + " bytes of shared memory for " +
                                std::to_string(heads / kv_heads) + " query heads; the kernel takes at most " +
                                std::to_string(kAttentionSharedLimit));
  }
}

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
  check_attention_shape(heads, kv_heads, head_dim, context);
  const std::size_t shared = attention_shared_bytes(heads / kv_heads, head_dim, context);
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

void host_rotary_and_cache_write(const __half* qkv, std::int64_t qkv_stride, const __half* cos, const __half* sin,
                            const std::int64_t* positions, const std::int64_t* slots, __half* q_out, __half* cache_k,
                            __half* cache_v, int rows, int heads, int kv_heads, int head_dim, std::int64_t max_len,
                            cudaStream_t /*stream*/) {
  if (head_dim % 2 != 0) throw std::invalid_argument("fused rotary: head_dim must be even");
  const int total = (heads + 2 * kv_heads) * head_dim;
  for (int r = 0; r < rows; ++r) {
    for (int i = 0; i < total; ++i) {
      rotary_element(qkv, qkv_stride, cos, sin, positions, slots, q_out, cache_k, cache_v, heads, kv_heads, head_dim,
                     max_len, r, i);
    }
  }
}

void host_decode_attention(const __half* q, const __half* cache_k, const __half* cache_v, const std::int64_t* slots,
                           const std::int64_t* positions, __half* out, int rows, int heads, int kv_heads, int head_dim,
                           std::int64_t max_len, int context, float scale, cudaStream_t /*stream*/) {
  check_attention_shape(heads, kv_heads, head_dim, context);
  const int group = heads / kv_heads;
  std::vector<float> shared(static_cast<std::size_t>(group) * static_cast<std::size_t>(head_dim + context));
  float inverse_sum[kMaxQueryGroup];
  for (int r = 0; r < rows; ++r) {
    for (int kv = 0; kv < kv_heads; ++kv) {
      const AttentionBlock b =
          attention_block(q, cache_k, cache_v, slots, positions, out, heads, kv_heads, head_dim, max_len, context, r, kv);
      float* queries = shared.data();
      float* scores = shared.data() + group * head_dim;
      attention_load_queries(b, queries, scale, 0, 1);
      attention_scores(b, queries, scores, 0, 1);
      for (int g = 0; g < group; ++g) {
        float* row = scores + g * context;
        inverse_sum[g] = 1.0F / attention_exp_part(b, row, attention_max_part(b, row, 0, 1), 0, 1);
      }
      attention_output(b, scores, inverse_sum, 0, 1);
    }
  }
}

void host_add_rms_norm(__half* x, const __half* delta, const __half* weight, __half* out, int rows, int width,
                       float eps, cudaStream_t /*stream*/) {
  for (int r = 0; r < rows; ++r) {
    const std::int64_t base = static_cast<std::int64_t>(r) * width;
    const float squares = add_squares_part(x + base, delta == nullptr ? nullptr : delta + base, width, 0, 1);
    norm_write(x + base, weight, out + base, width, inverse_sqrt(squares / static_cast<float>(width) + eps), 0, 1);
  }
}

void host_silu_mul(const __half* gate_up, __half* out, int rows, int width, cudaStream_t /*stream*/) {
  for (std::int64_t r = 0; r < rows; ++r) {
    for (int i = 0; i < width; ++i) out[r * width + i] = silu_times(gate_up[r * 2 * width + i], gate_up[r * 2 * width + width + i]);
  }
}

}  // namespace

const Kernels& kernels() {
  static constexpr Kernels table{rotary_and_cache_write, decode_attention, add_rms_norm, silu_mul};
  return table;
}

const Kernels& host_kernels() {
  static constexpr Kernels table{host_rotary_and_cache_write, host_decode_attention, host_add_rms_norm,
                                 host_silu_mul};
  return table;
}

}  // namespace llm_decode::fused
