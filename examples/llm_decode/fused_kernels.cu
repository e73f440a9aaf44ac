// The fused decode kernels (fused_kernels.hpp). Written for decode shapes:
// a few to 64 rows, head_dim 64 or 128, contexts up to a few thousand.
//
// Each kernel's work is written once, as __host__ __device__ pieces that take
// the thread's (or lane's) index: the kernels run them on a block's threads
// with barriers, shuffles and block reductions between them; the host
// versions (host_kernels(), for tests on machines without a GPU) run the
// same pieces one thread at a time, each lane, warp or block thread in turn,
// passing through arrays what the kernels pass between lanes.
#include "fused_kernels.hpp"

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <mutex>
#include <optional>
#include <source_location>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <mma.h>

#include <replay/error.hpp>
#include <replay/launch.hpp>
#include <replay/pdl.hpp>

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

// Dimension d of head `head` of a qkv row (q heads, then k heads) rotated
// at `position`: rotate_half(x) = cat(-x[half:], x[:half]).
__host__ __device__ inline float rotated_value(const __half* row, const __half* cos, const __half* sin,
                                               std::int64_t position, int head, int d, int head_dim) {
  const int half_dim = head_dim / 2;
  const __half* x = row + head * head_dim;
  const float partner = d < half_dim ? -__half2float(x[d + half_dim]) : __half2float(x[d - half_dim]);
  return __half2float(x[d]) * __half2float(cos[position * head_dim + d]) +
         partner * __half2float(sin[position * head_dim + d]);
}

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
    const float value = rotated_value(row, cos, sin, position, head, d, head_dim);
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

// Where one block of the attention, (row, key/value head, key split), reads
// and writes. The row's keys are split kSplitKeys at a time (one pass of the
// block's warps); a row of more than kSplitKeys keys is attended by several
// blocks, whose states the last of them merges.
struct AttentionBlock {
  const __half* q;  // its `group` query heads, [group, head_dim]
  const __half* k;  // its slot's keys, [max_len, head_dim]
  const __half* v;
  __half* out;      // [group, head_dim]
  int group;
  int head_dim;
  int keys;         // positions 0..keys-1 attend
  int first;        // this block's keys: first..end-1
  int end;
  int splits;       // the row's blocks that have keys: ceil(keys / kSplitKeys)
};

__host__ __device__ inline AttentionBlock attention_block(const __half* q, const __half* cache_k, const __half* cache_v,
                                                          const std::int64_t* slots, const std::int64_t* positions,
                                                          __half* out, int heads, int kv_heads, int head_dim,
                                                          std::int64_t max_len, int context, int r, int kv, int split) {
  const int group = heads / kv_heads;
  const std::int64_t slot = slots[r];
  // Keys 0..position; positions < context by contract (clamped all the same).
  const std::int64_t last = positions[r] + 1;
  const int keys = static_cast<int>(last < context ? last : context);
  const int first = split * kSplitKeys;
  const int end = first + kSplitKeys < keys ? first + kSplitKeys : keys;
  const std::int64_t first_head = static_cast<std::int64_t>(r) * heads + static_cast<std::int64_t>(kv) * group;
  return {q + first_head * head_dim,
          cache_k + (slot * kv_heads + kv) * max_len * head_dim,
          cache_v + (slot * kv_heads + kv) * max_len * head_dim,
          out + first_head * head_dim,
          group,
          head_dim,
          keys,
          first,
          end,
          attention_splits(keys)};
}

// A block's keys (at most kSplitKeys) are split over its warps, each taking
// chunks of 32 / lanes_per_key keys (chunk c of the block goes to warp c %
// kAttentionWarps). Within a chunk, lanes_per_key lanes score each key
// against every query head, each over its share of the key row, and sum
// their shares (attention_lanes_per_key(): 1 for a block of more than 128
// keys; a block of fewer keys splits each row over 2, 4 or 8 lanes, so that
// more of its warps have keys and each lane's chain of loads and
// multiply-adds is shorter). Then the chunk's values: a value
// row is head_dim / 8 lanes' 16-byte loads, so a warp takes 32 / (head_dim /
// 8) keys per pass (4 at head_dim 64), lane l holding dimensions
// 8 (l % lanes_per_row) .. + 8 of key l / lanes_per_row of the pass, the
// weights passed from lane to lane. Each lane keeps a running softmax (the
// online softmax of flash decoding); at the end the lanes of one dimension
// block are summed, then the warps' states merged. Group (query heads per
// key/value head) is a template parameter: the state stays in registers and
// the query heads' work interleaves.
constexpr int kAttentionWarps = 8;
constexpr int kLanes = 32;
static_assert(kSplitKeys == kAttentionWarps * kLanes, "a key split is one pass of the block's warps");
constexpr int kKeyVector = 8;  // halves per 16-byte load of a key or value row
constexpr std::size_t kAttentionSharedLimit = 48 * 1024;  // the default, no opt-in
constexpr int kMaxLanesPerKey = 8;  // one 16-byte vector a lane at head width 64

// Lanes per key of a block with `keys` keys (1 to kSplitKeys): the most, up
// to kMaxLanesPerKey, that still give each warp one chunk at most and
// divide the row's 16-byte vectors evenly. A function of the block's keys
// and the head width alone, so a row's result does not depend on the
// context that holds it.
__host__ __device__ inline int attention_lanes_per_key(int keys, int head_dim) {
  const int vectors = head_dim / kKeyVector;
  int lanes = 1;
  while (2 * lanes <= kMaxLanesPerKey && kAttentionWarps * (kLanes / (2 * lanes)) >= keys &&
         vectors % (2 * lanes) == 0) {
    lanes *= 2;
  }
  return lanes;
}

template <int Group>
struct LaneState {
  float largest[Group];            // the largest score so far (the same in every lane of a warp)
  float sum[Group];                // this lane's key's share of the sum of exp(score - largest)
  float acc[Group][kKeyVector];    // of exp(score - largest) * value, this lane's dimensions and keys
};

// Where a lane works on the values: `row` (its key within a pass) and its
// dimensions 8 block .. + 8; a lane with row >= rows idles (head_dim / 8
// not a divisor of 32).
struct ValueLane {
  int lanes_per_row;
  int rows;   // keys per pass
  int row;
  int block;
  __host__ __device__ ValueLane(int head_dim, int lane)
      : lanes_per_row(head_dim / kKeyVector),
        rows(kLanes / lanes_per_row),
        row(lane / lanes_per_row),
        block(lane % lanes_per_row) {}
  __host__ __device__ bool idle() const { return row >= rows; }
};

template <int Group>
__host__ __device__ inline void lane_start(LaneState<Group>& s) {
  for (int g = 0; g < Group; ++g) {
    s.largest[g] = -INFINITY;
    s.sum[g] = 0.0F;
    for (int i = 0; i < kKeyVector; ++i) s.acc[g][i] = 0.0F;
  }
}

// Shared memory, floats: the scaled queries [Group, head_dim], then the merge
// of the warps' states: largest [warps, Group], sum [warps, Group], acc
// [warps, Group, head_dim].
__host__ __device__ inline std::size_t attention_shared_floats(int group, int head_dim) {
  return static_cast<std::size_t>(group) * static_cast<std::size_t>(head_dim) +
         static_cast<std::size_t>(kAttentionWarps) * static_cast<std::size_t>(group) *
             static_cast<std::size_t>(2 + head_dim);
}

__host__ __device__ inline void attention_load_queries(const AttentionBlock& b, float* queries, float scale, int i) {
  queries[i] = __half2float(b.q[i]) * scale;
}

// kKeyVector halves of a key or value row in one 16-byte load (the device's);
// the host copies (reading a uint4 through __half2 would break aliasing rules
// there).
__host__ __device__ inline void load_key_vector(const __half* p, __half2 (&out)[kKeyVector / 2]) {
#ifdef __CUDA_ARCH__
  const uint4 raw = *reinterpret_cast<const uint4*>(p);
  out[0] = *reinterpret_cast<const __half2*>(&raw.x);
  out[1] = *reinterpret_cast<const __half2*>(&raw.y);
  out[2] = *reinterpret_cast<const __half2*>(&raw.z);
  out[3] = *reinterpret_cast<const __half2*>(&raw.w);
#else
  std::memcpy(static_cast<void*>(out), p, sizeof(out));
#endif
}

// rotary_attention(): element i of a block's queries, rotated from the qkv
// row and rounded to fp16 as the separate kernels would store it; and
// dimension d of its key and value written into the cache.
__host__ __device__ inline void rotary_query(const __half* row, const __half* cos, const __half* sin,
                                             std::int64_t position, int first_head, int head_dim, float scale,
                                             float* queries, int i) {
  const float value = rotated_value(row, cos, sin, position, first_head + i / head_dim, i % head_dim, head_dim);
  queries[i] = __half2float(__float2half(value)) * scale;
}

__host__ __device__ inline void rotary_key_value(const __half* row, const __half* cos, const __half* sin,
                                                 std::int64_t position, int heads, int kv_heads, int kv,
                                                 int head_dim, __half* k_row, __half* v_row, int d) {
  k_row[d] = __float2half(rotated_value(row, cos, sin, position, heads + kv, d, head_dim));
  v_row[d] = row[(heads + kv_heads + kv) * head_dim + d];
}

// Key t's scores against the Group query heads over share `part` of
// `parts` of its row (dimensions part * head_dim / parts onwards); -inf
// past the last key.
template <int Group>
__host__ __device__ inline void key_scores(const AttentionBlock& b, const float* queries, int t, int part, int parts,
                                           float (&score)[Group]) {
  for (int g = 0; g < Group; ++g) score[g] = t < b.keys ? 0.0F : -INFINITY;
  if (t >= b.keys) return;
  const __half* row = b.k + static_cast<std::int64_t>(t) * b.head_dim;
  const int width = b.head_dim / parts;
  const int begin = part * width;
#pragma unroll 4
  for (int d0 = begin; d0 < begin + width; d0 += kKeyVector) {
    __half2 pairs[kKeyVector / 2];
    load_key_vector(row + d0, pairs);
    for (int i = 0; i < kKeyVector / 2; ++i) {
      const float2 x = __half22float2(pairs[i]);
      for (int g = 0; g < Group; ++g) {
        score[g] += queries[g * b.head_dim + d0 + 2 * i] * x.x + queries[g * b.head_dim + d0 + 2 * i + 1] * x.y;
      }
    }
  }
}

// A chunk's scores in: the running largest raised to the chunk's largest
// (`chunk_largest`, over the warp), this lane's key's weight out in
// `weight` (0 past the last key), the sums and values so far rescaled. The
// weight joins this lane's sum where `counted` (one lane of each key's).
template <int Group>
__host__ __device__ inline void chunk_weights(LaneState<Group>& s, const float (&score)[Group],
                                              const float (&chunk_largest)[Group], bool counted,
                                              float (&weight)[Group]) {
  for (int g = 0; g < Group; ++g) {
    const float largest = fmaxf(s.largest[g], chunk_largest[g]);
    const float rescale = expf(s.largest[g] - largest);  // 0 for the first chunk (largest was -inf)
    weight[g] = expf(score[g] - largest);                // 0 for a score of -inf
    s.sum[g] = s.sum[g] * rescale + (counted ? weight[g] : 0.0F);
    for (int i = 0; i < kKeyVector; ++i) s.acc[g][i] *= rescale;
    s.largest[g] = largest;
  }
}

// Key t's value row, this lane's dimensions, times key t's weights.
template <int Group>
__host__ __device__ inline void lane_add_value(LaneState<Group>& s, const AttentionBlock& b, int t, const ValueLane& v,
                                               const float (&weight)[Group]) {
  __half2 pairs[kKeyVector / 2];
  load_key_vector(b.v + static_cast<std::int64_t>(t) * b.head_dim + v.block * kKeyVector, pairs);
  for (int i = 0; i < kKeyVector / 2; ++i) {
    const float2 x = __half22float2(pairs[i]);
    for (int g = 0; g < Group; ++g) {
      s.acc[g][2 * i] += weight[g] * x.x;
      s.acc[g][2 * i + 1] += weight[g] * x.y;
    }
  }
}

// A lane of row 0 of the passes, its dimensions summed over the rows (its
// `acc`), into the merge area; `sum` is the warp's whole sum. Lane 0 writes
// the largest and the sum.
template <int Group>
__host__ __device__ inline void lane_store(const LaneState<Group>& s, const AttentionBlock& b,
                                           const float (&sum)[Group], const ValueLane& v, int warp, int lane,
                                           float* merge) {
  const int states = kAttentionWarps * Group;
  for (int g = 0; g < Group; ++g) {
    const int w = warp * Group + g;
    if (lane == 0) {
      merge[w] = s.largest[g];
      merge[states + w] = sum[g];
    }
    if (v.row == 0) {
      for (int i = 0; i < kKeyVector; ++i) merge[2 * states + w * b.head_dim + v.block * kKeyVector + i] = s.acc[g][i];
    }
  }
}

// Element i (query head i / head_dim, dimension i % head_dim) of the block's
// state: the warps' states rescaled to the largest score of all and summed.
struct MergedElement {
  float largest;
  float sum;
  float acc;
};

__host__ __device__ inline MergedElement merge_warps(const AttentionBlock& b, const float* merge, int i) {
  const int states = kAttentionWarps * b.group;
  const int g = i / b.head_dim;
  const int d = i % b.head_dim;
  MergedElement m{-INFINITY, 0.0F, 0.0F};
  for (int w = 0; w < kAttentionWarps; ++w) m.largest = fmaxf(m.largest, merge[w * b.group + g]);
  for (int w = 0; w < kAttentionWarps; ++w) {
    const int state = w * b.group + g;
    const float rescale = expf(merge[state] - m.largest);  // 0 for a warp that had no key
    m.sum += merge[states + state] * rescale;
    m.acc += merge[2 * states + state * b.head_dim + d] * rescale;
  }
  return m;
}

// Output element i of a row that one block attends (at most kSplitKeys keys).
__host__ __device__ inline void merge_output(const AttentionBlock& b, const float* merge, int i) {
  const MergedElement m = merge_warps(b, merge, i);
  b.out[i] = __float2half(m.acc / m.sum);
}

// Where a split block leaves its state for the merge: `partials` is the
// (row, key/value head)'s area, `grid_splits` blocks of
// partial_floats(group, head_dim) floats: acc [group, head_dim], then the
// largest [group], then the sum [group].
__host__ __device__ inline int partial_floats(int group, int head_dim) { return group * (head_dim + 2); }

// The (row, key/value head)'s area of the workspace's partials.
__host__ __device__ inline float* row_partials(const AttentionBlock& b, const AttentionWorkspace& workspace,
                                               int row_kv, int grid_splits) {
  return workspace.partials +
         static_cast<std::int64_t>(row_kv) * grid_splits * partial_floats(b.group, b.head_dim);
}

__host__ __device__ inline void store_partial(const AttentionBlock& b, const float* merge, float* partials, int split,
                                              int i) {
  const MergedElement m = merge_warps(b, merge, i);
  float* mine = partials + split * partial_floats(b.group, b.head_dim);
  const int g = i / b.head_dim;
  mine[i] = m.acc;
  if (i % b.head_dim == 0) {
    mine[b.group * b.head_dim + g] = m.largest;
    mine[b.group * b.head_dim + b.group + g] = m.sum;
  }
}

// Another block's store, read past the (incoherent) L1 on the device.
__host__ __device__ inline float load_partial(const float* p) {
#ifdef __CUDA_ARCH__
  return __ldcg(p);
#else
  return *p;
#endif
}

// Output element i of a row split over b.splits blocks: their states merged
// in split order, so the result depends on the row's keys alone, not on how
// many blocks the launch's context gave it.
__host__ __device__ inline void merge_partials(const AttentionBlock& b, const float* partials, int i) {
  const int stride = partial_floats(b.group, b.head_dim);
  const int g = i / b.head_dim;
  float largest = -INFINITY;
  for (int s = 0; s < b.splits; ++s) {
    largest = fmaxf(largest, load_partial(partials + s * stride + b.group * b.head_dim + g));
  }
  float sum = 0.0F;
  float acc = 0.0F;
  for (int s = 0; s < b.splits; ++s) {
    const float* state = partials + s * stride;
    const float rescale = expf(load_partial(state + b.group * b.head_dim + g) - largest);
    sum += load_partial(state + b.group * b.head_dim + b.group + g) * rescale;
    acc += load_partial(state + i) * rescale;
  }
  b.out[i] = __float2half(acc / sum);
}

// The step's bookkeeping, row by row.
__host__ __device__ inline void step_inputs_row(const StepRows& s, std::int64_t* live_slots,
                                                std::int64_t* live_positions, int r) {
  const bool live = s.done[r] == 0;
  live_slots[r] = live ? s.slots[r] : s.spare_slot;
  live_positions[r] = live ? s.positions[r] : 0;
}

// Returns whether row r is still live after this step.
__host__ __device__ inline bool step_update_row(const StepRows& s, const std::int64_t* next, std::int64_t step, int r) {
  const bool live = s.done[r] == 0;
  const std::int64_t token = next[r];
  s.ring[(step % s.ring_steps) * s.ring_stride + r] = live ? token : -1;
  if (!live) return false;
  s.tokens[r] = token;
  s.positions[r] += 1;
  s.counts[r] += 1;
  bool finished = s.counts[r] >= s.limits[r];
  for (int e = 0; e < s.eos_count; ++e) finished = finished || token == s.eos[e];
  if (finished) s.done[r] = 1;
  return !finished;
}

__host__ __device__ inline void step_update_loop(const StepRows& s, bool any_live) {
  s.loop[0] += 1;
  s.loop[2] = any_live && s.loop[0] < s.loop[1] ? 1 : 0;
}

// The residual add and RMSNorm, one row per block: each thread holds its
// 16-byte vectors of the row (vector i = tid + k * threads) in registers
// between the two phases, its weights loaded with them, so the row is read
// once and the block waits for memory once.
constexpr int kNormVectors = 8;  // per thread: rows up to 8 * 8 * kThreads halves

struct NormThread {
  __half2 x[kNormVectors][kKeyVector / 2];
  __half2 weight[kNormVectors][kKeyVector / 2];
};

__host__ __device__ inline void store_vector(__half* p, const __half2 (&in)[kKeyVector / 2]) {
#ifdef __CUDA_ARCH__
  uint4 raw;
  raw.x = *reinterpret_cast<const unsigned*>(&in[0]);
  raw.y = *reinterpret_cast<const unsigned*>(&in[1]);
  raw.z = *reinterpret_cast<const unsigned*>(&in[2]);
  raw.w = *reinterpret_cast<const unsigned*>(&in[3]);
  *reinterpret_cast<uint4*>(p) = raw;
#else
  std::memcpy(p, static_cast<const void*>(in), sizeof(in));
#endif
}

// x's vector at i, plus delta's (rounded to fp16, as the plain add) when
// delta is set.
__host__ __device__ inline void residual_vector(const __half* x, const __half* delta, int i,
                                                __half2 (&out)[kKeyVector / 2]) {
  load_key_vector(x + i, out);
  if (delta == nullptr) return;
  __half2 d[kKeyVector / 2];
  load_key_vector(delta + i, d);
  for (int j = 0; j < kKeyVector / 2; ++j) {
    const float2 a = __half22float2(out[j]);
    const float2 b = __half22float2(d[j]);
    out[j] = __floats2half2_rn(a.x + b.x, a.y + b.y);
  }
}

// `squares` plus the squares of a vector's 8 values, in order.
__host__ __device__ inline float add_squares(float squares, const __half2 (&v)[kKeyVector / 2]) {
  for (int j = 0; j < kKeyVector / 2; ++j) {
    const float2 f = __half22float2(v[j]);
    squares += f.x * f.x + f.y * f.y;
  }
  return squares;
}

// x += delta (rounded to fp16, as the plain add) when delta is set, written
// back; returns this thread's part of the row's sum of squares.
__host__ __device__ inline float norm_load_add(NormThread& t, __half* x, const __half* delta, const __half* weight,
                                               int width, int tid, int threads) {
  float squares = 0.0F;
  for (int k = 0; k < kNormVectors; ++k) {
    const int i = (tid + k * threads) * kKeyVector;
    if (i >= width) break;
    residual_vector(x, delta, i, t.x[k]);
    load_key_vector(weight + i, t.weight[k]);
    if (delta != nullptr) store_vector(x + i, t.x[k]);
    squares = add_squares(squares, t.x[k]);
  }
  return squares;
}

// norm_load_add()'s sum of squares alone, x left as it is.
__host__ __device__ inline float norm_squares(const __half* x, const __half* delta, int width, int tid, int threads) {
  float squares = 0.0F;
  for (int k = 0; k < kNormVectors; ++k) {
    const int i = (tid + k * threads) * kKeyVector;
    if (i >= width) break;
    __half2 v[kKeyVector / 2];
    residual_vector(x, delta, i, v);
    squares = add_squares(squares, v);
  }
  return squares;
}

// x * inverse_rms * weight for a vector of 8, rounded once.
__host__ __device__ inline void scale_vector(const __half2 (&x)[kKeyVector / 2], const __half2 (&weight)[kKeyVector / 2],
                                             float inverse_rms, __half2 (&out)[kKeyVector / 2]) {
  for (int j = 0; j < kKeyVector / 2; ++j) {
    const float2 v = __half22float2(x[j]);
    const float2 w = __half22float2(weight[j]);
    out[j] = __floats2half2_rn(v.x * inverse_rms * w.x, v.y * inverse_rms * w.y);
  }
}

// out = x * inverse_rms * weight, rounded once.
__host__ __device__ inline void norm_store(const NormThread& t, __half* out, int width, float inverse_rms, int tid,
                                           int threads) {
  for (int k = 0; k < kNormVectors; ++k) {
    const int i = (tid + k * threads) * kKeyVector;
    if (i >= width) break;
    __half2 o[kKeyVector / 2];
    scale_vector(t.x[k], t.weight[k], inverse_rms, o);
    store_vector(out + i, o);
  }
}

__host__ __device__ inline __half silu_times(__half gate, __half up) {
  const float g = __half2float(gate);
  return __float2half(g / (1.0F + expf(-g)) * __half2float(up));
}

// ---- the products (linear, gated_linear) ----
//
// A block takes kLinearOutputs weight rows and every row of the input; its
// linear_threads(in) threads split the input width, thread t summing the
// 16-byte vectors t, t + threads, ... of each weight row in order, then the
// warps' sums (a butterfly of shuffles) and the block's (warp by warp, in
// order, through shared memory). No atomics: the same sums in the same order
// at every launch. A thread's first kLinearPreload vectors of each of its
// weight rows are loaded before the kernel waits for its predecessor (the
// weights are never written), so a graph's programmatic edge overlaps them
// with the predecessor's tail.
constexpr int kLinearOutputs = 4;
constexpr int kLinearPreload = 2;
constexpr int kLinearUnroll = 2;  // the vectors per weight row each thread has in flight after the preload
constexpr int kLinearWarps = 8;   // linear_threads() / 32 at most
constexpr int kVectorHalves = 8;

struct HalfVector {
  __half2 h[kVectorHalves / 2];
};

__host__ __device__ inline HalfVector load_half_vector(const __half* p) {
  HalfVector v{};
  load_key_vector(p, v.h);
  return v;
}

// A weight vector: through the read-only path on the device (the weights
// are never written while a step runs).
__host__ __device__ inline HalfVector load_weight_vector(const __half* p) {
#ifdef __CUDA_ARCH__
  const uint4 raw = __ldg(reinterpret_cast<const uint4*>(p));
  HalfVector v;
  v.h[0] = *reinterpret_cast<const __half2*>(&raw.x);
  v.h[1] = *reinterpret_cast<const __half2*>(&raw.y);
  v.h[2] = *reinterpret_cast<const __half2*>(&raw.z);
  v.h[3] = *reinterpret_cast<const __half2*>(&raw.w);
  return v;
#else
  return load_half_vector(p);
#endif
}

// silu(gate) * up in float32, rounded to fp16 as silu_mul() stores it, and
// returned as a float (exact).
__host__ __device__ inline float silu_times_value(float gate, float up) {
  return __half2float(silu_times(__float2half(gate), __float2half(up)));
}

// Input vector k / 8 of row r: x's, or (Gated) silu_mul()'s from the row's
// gate and up halves, `in` wide each.
template <bool Gated>
__host__ __device__ inline HalfVector linear_input(const __half* x, int in, int r, int k) {
  if constexpr (Gated) {
    const __half* row = x + static_cast<std::int64_t>(r) * 2 * in;
    const HalfVector gate = load_half_vector(row + k);
    const HalfVector up = load_half_vector(row + in + k);
    HalfVector out;
    for (int j = 0; j < kVectorHalves / 2; ++j) {
      const float2 g = __half22float2(gate.h[j]);
      const float2 u = __half22float2(up.h[j]);
      out.h[j] = __floats2half2_rn(silu_times_value(g.x, u.x), silu_times_value(g.y, u.y));
    }
    return out;
  } else {
    return load_half_vector(x + static_cast<std::int64_t>(r) * in + k);
  }
}

// acc + w . x over one vector, element by element in order.
__host__ __device__ inline float dot_vector(float acc, const HalfVector& w, const HalfVector& x) {
  for (int j = 0; j < kVectorHalves / 2; ++j) {
    const float2 a = __half22float2(w.h[j]);
    const float2 b = __half22float2(x.h[j]);
    acc = fmaf(a.x, b.x, acc);
    acc = fmaf(a.y, b.y, acc);
  }
  return acc;
}

__host__ __device__ inline const __half* weight_row(const __half* weight, int in, int o) {
  return weight + static_cast<std::int64_t>(o) * in;
}

// The skinny GEMM: a block takes kSkinnyOutputs outputs (two 16-wide tiles)
// of every row (Rows / 16 tiles of 16) over a range of the input width, in
// 16-wide steps: its kSkinnyWarps warps take the range's steps in turn (warp
// w steps w, w + kSkinnyWarps, ...: neighbouring warps read neighbouring
// 32 bytes of each weight row), then the block sums its warps in order. A
// width split over blocks (blockIdx.y) leaves the blocks' sums in the
// workspace; the last of an output tile to count in sums them in split
// order. The splits depend on the shape alone (skinny_split()).
constexpr int kSkinnyWarps = 4;
constexpr int kSkinnyStep = 16;           // WMMA's k
constexpr int kSkinnyTargetBlocks = 512;  // enough warps to keep every SM's loads in flight
constexpr int kSkinnyMinSteps = 4;        // per warp and split, at least

struct SkinnySplit {
  int splits;
  int steps_per_split;
};

__host__ __device__ inline SkinnySplit skinny_split(int in, int out) {
  const int steps = in / kSkinnyStep;
  const int tiles = out / kSkinnyOutputs;
  int splits = (kSkinnyTargetBlocks + tiles - 1) / tiles;
  const int most = steps / (kSkinnyMinSteps * kSkinnyWarps);
  if (splits > most) splits = most;
  if (splits < 1) splits = 1;
  const int per = (steps + splits - 1) / splits;
  return {(steps + per - 1) / per, per};
}

// Element i (row i / kSkinnyOutputs, output i % kSkinnyOutputs) of a skinny
// block's sum: its warps' sums, [kSkinnyWarps][rows][kSkinnyOutputs] from
// `warp_sums`, in order.
template <int Rows>
__host__ __device__ inline float skinny_warps_sum(const float* warp_sums, int i) {
  float total = 0.0F;
  for (int w = 0; w < kSkinnyWarps; ++w) total += warp_sums[w * Rows * kSkinnyOutputs + i];
  return total;
}

// Where split `split` leaves row r's sum of output o: [splits][rows][out].
__host__ __device__ inline std::int64_t skinny_partial_index(int split, int rows, int r, int out, int o) {
  return (static_cast<std::int64_t>(split) * rows + r) * out + o;
}

// ---- the kernels ----

// ---- programmatic dependent launch ----
//
// The kernels here are launched with programmatic stream serialization
// where set_programmatic_launches() puts it (launch_programmatic(), through
// replay::launch; the waits are replay/pdl.hpp's, which compile to nothing
// below sm_90); captured, consecutive launches become programmatic edges.
// A kernel may start while its predecessor finishes: before
// wait_for_prerequisite_grid() it reads only what no kernel writes (weights),
// and it writes nothing. Each kernel waits unconditionally at its start (a
// block that returned early without waiting would break the chain's
// transitivity: a kernel's completion must imply its predecessor's). It
// releases its dependents just before it waits, so their blocks are
// scheduled and load their weights sooner; their own wait still returns
// only once this kernel has completed (docs/pdl.md, *Where a kernel
// releases its successor*; the step's gain: docs/llm_decode.md).
using replay::release_dependent_grids;
using replay::wait_for_prerequisite_grid;

__device__ __forceinline__ void start_after_prerequisite_grid() {
  release_dependent_grids();
  wait_for_prerequisite_grid();
}

__device__ float warp_sum(float v) {
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffU, v, offset);
  return v;
}

__device__ float warp_max(float v) {
  for (int offset = 16; offset > 0; offset /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffU, v, offset));
  return v;
}

// Sum over the block; every thread gets the result. `scratch`: shared, at
// least kThreads / 32 floats; the call synchronizes the block.
__device__ float block_sum(float v, float* scratch) {
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int warp = static_cast<int>(threadIdx.x) / 32;
  v = warp_sum(v);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float total = 0.0F;
  for (int w = 0; w < static_cast<int>(blockDim.x) / 32; ++w) total += scratch[w];
  __syncthreads();  // scratch is reused by the next call
  return total;
}

__global__ void rotary_and_cache_write_kernel(const __half* qkv, std::int64_t qkv_stride, const __half* cos,
                                              const __half* sin, const std::int64_t* positions,
                                              const std::int64_t* slots, __half* q_out, __half* cache_k,
                                              __half* cache_v, int heads, int kv_heads, int head_dim,
                                              std::int64_t max_len) {
  start_after_prerequisite_grid();
  const int r = static_cast<int>(blockIdx.x);
  const int total = (heads + 2 * kv_heads) * head_dim;
  for (int i = static_cast<int>(threadIdx.x); i < total; i += static_cast<int>(blockDim.x)) {
    rotary_element(qkv, qkv_stride, cos, sin, positions, slots, q_out, cache_k, cache_v, heads, kv_heads, head_dim,
                   max_len, r, i);
  }
}

// A block's attention once its scaled queries are in shared memory: each
// warp's chunks of the block's keys, the sums of the passes' rows, the
// warps' states into `merge` (visible to the block on return).
template <int Group>
__device__ void attend(const AttentionBlock& b, const float* queries, float* merge) {
  const int tid = static_cast<int>(threadIdx.x);
  const int warp = tid / kLanes;
  const int lane = tid % kLanes;
  const ValueLane v(b.head_dim, lane);
  const int lanes_per_key = attention_lanes_per_key(b.end - b.first, b.head_dim);
  const int chunk_keys = kLanes / lanes_per_key;
  const int part = lane % lanes_per_key;
  LaneState<Group> s;
  lane_start(s);
  for (int chunk = b.first + warp * chunk_keys; chunk < b.end; chunk += kAttentionWarps * chunk_keys) {
    float score[Group];
    key_scores(b, queries, chunk + lane / lanes_per_key, part, lanes_per_key, score);
    // The key's lanes sum their shares; each ends with the same bits (the
    // same sums, in the same pairs).
    for (int offset = 1; offset < lanes_per_key; offset *= 2) {
#pragma unroll
      for (int g = 0; g < Group; ++g) score[g] += __shfl_xor_sync(0xffffffffU, score[g], offset);
    }
    float chunk_largest[Group];
#pragma unroll
    for (int g = 0; g < Group; ++g) chunk_largest[g] = warp_max(score[g]);
    float weight[Group];
    chunk_weights(s, score, chunk_largest, part == 0, weight);
    const int count = min(chunk_keys, b.end - chunk);
#pragma unroll 4
    for (int first = 0; first < count; first += v.rows) {
      const int j = first + v.row;  // this lane's key of the pass
      float key_weight[Group];
#pragma unroll
      for (int g = 0; g < Group; ++g) {
        key_weight[g] = __shfl_sync(0xffffffffU, weight[g], (j * lanes_per_key) % kLanes);
      }
      if (!v.idle() && j < count) lane_add_value(s, b, chunk + j, v, key_weight);
    }
  }
  // Sum the rows of the passes (lanes lanes_per_row apart; idle lanes hold 0).
  for (int offset = v.lanes_per_row; offset < kLanes; offset *= 2) {
#pragma unroll
    for (int g = 0; g < Group; ++g) {
#pragma unroll
      for (int i = 0; i < kKeyVector; ++i) {
        const float other = __shfl_down_sync(0xffffffffU, s.acc[g][i], static_cast<unsigned>(offset));
        if (lane + offset < kLanes) s.acc[g][i] += other;
      }
    }
  }
  float sum[Group];
#pragma unroll
  for (int g = 0; g < Group; ++g) sum[g] = warp_sum(s.sum[g]);
  lane_store(s, b, sum, v, warp, lane, merge);
  __syncthreads();
}

// The block's output: the row's, when the block alone attends it. Otherwise
// its state into the workspace, counted in; the row's last block to count
// merges every block's state and leaves the counter at zero for the next
// call (the next layer's).
__device__ void finish_attention(const AttentionBlock& b, const float* merge, const AttentionWorkspace& workspace,
                                 int row_kv, int split, int grid_splits) {
  const int tid = static_cast<int>(threadIdx.x);
  const int threads = static_cast<int>(blockDim.x);
  const int elements = b.group * b.head_dim;
  if (b.splits == 1) {
    for (int i = tid; i < elements; i += threads) merge_output(b, merge, i);
    return;
  }
  float* partials = row_partials(b, workspace, row_kv, grid_splits);
  for (int i = tid; i < elements; i += threads) store_partial(b, merge, partials, split, i);
  __threadfence();  // this thread's stores reach the device before the count does
  __syncthreads();
  __shared__ bool last;
  if (tid == 0) last = atomicAdd(workspace.counters + row_kv, 1U) == static_cast<unsigned>(b.splits - 1);
  __syncthreads();
  if (!last) return;
  __threadfence();
  for (int i = tid; i < elements; i += threads) merge_partials(b, partials, i);
  if (tid == 0) workspace.counters[row_kv] = 0;
}

// One block per (row, key/value head, key split): its query heads attend to
// the same keys. A split past the row's keys has nothing to do. The
// attention kernels ask for one block an SM at least (their registers are
// not rationed for more): without it ptxas held a group of 3 query heads
// to 64 registers a thread and spilled.
template <int Group>
__global__ void __launch_bounds__(kAttentionWarps * kLanes, 1)
    decode_attention_kernel(const __half* q, const __half* cache_k, const __half* cache_v, const std::int64_t* slots,
                            const std::int64_t* positions, __half* out, int heads, int kv_heads, int head_dim,
                            std::int64_t max_len, int context, float scale, AttentionWorkspace workspace) {
  start_after_prerequisite_grid();
  extern __shared__ float shared[];
  const int r = static_cast<int>(blockIdx.x);
  const int kv = static_cast<int>(blockIdx.y);
  const int split = static_cast<int>(blockIdx.z);
  const AttentionBlock b = attention_block(q, cache_k, cache_v, slots, positions, out, heads, kv_heads, head_dim,
                                           max_len, context, r, kv, split);
  if (b.first >= b.keys) return;
  float* queries = shared;
  for (int i = static_cast<int>(threadIdx.x); i < Group * head_dim; i += static_cast<int>(blockDim.x)) {
    attention_load_queries(b, queries, scale, i);
  }
  __syncthreads();
  float* merge = shared + Group * head_dim;
  attend<Group>(b, queries, merge);
  finish_attention(b, merge, workspace, r * kv_heads + kv, split, static_cast<int>(gridDim.z));
}

// The same with the rotary embedding and the cache write of the block's key
// and value head first: its queries straight from the qkv row into shared
// memory, its key and value into the cache (by the split holding the row's
// position), visible to the block after the barrier. The other splits read
// earlier positions only. Only the row's own blocks read what it writes, so
// the rows' slots must differ (the spare slot aside, which padding rows share).
template <int Group>
__global__ void __launch_bounds__(kAttentionWarps * kLanes, 1)
    rotary_attention_kernel(const __half* qkv, std::int64_t qkv_stride, const __half* cos, const __half* sin,
                            const std::int64_t* positions, const std::int64_t* slots, __half* cache_k,
                            __half* cache_v, __half* out, int heads, int kv_heads, int head_dim, std::int64_t max_len,
                            int context, float scale, AttentionWorkspace workspace) {
  start_after_prerequisite_grid();
  extern __shared__ float shared[];
  const int r = static_cast<int>(blockIdx.x);
  const int kv = static_cast<int>(blockIdx.y);
  const int split = static_cast<int>(blockIdx.z);
  const AttentionBlock b = attention_block(nullptr, cache_k, cache_v, slots, positions, out, heads, kv_heads, head_dim,
                                           max_len, context, r, kv, split);
  if (b.first >= b.keys) return;
  const __half* row = qkv + r * qkv_stride;
  const std::int64_t position = positions[r];
  float* queries = shared;
  for (int i = static_cast<int>(threadIdx.x); i < Group * head_dim; i += static_cast<int>(blockDim.x)) {
    rotary_query(row, cos, sin, position, kv * Group, head_dim, scale, queries, i);
  }
  if (split == b.splits - 1) {
    __half* k_row = const_cast<__half*>(b.k) + position * head_dim;
    __half* v_row = const_cast<__half*>(b.v) + position * head_dim;
    for (int d = static_cast<int>(threadIdx.x); d < head_dim; d += static_cast<int>(blockDim.x)) {
      rotary_key_value(row, cos, sin, position, heads, kv_heads, kv, head_dim, k_row, v_row, d);
    }
  }
  __syncthreads();
  float* merge = shared + Group * head_dim;
  attend<Group>(b, queries, merge);
  finish_attention(b, merge, workspace, r * kv_heads + kv, split, static_cast<int>(gridDim.z));
}

__global__ void add_rms_norm_kernel(__half* x, const __half* delta, const __half* weight, __half* out, int width,
                                    float eps) {
  start_after_prerequisite_grid();
  __shared__ float scratch[kThreads / 32];
  const std::int64_t base = static_cast<std::int64_t>(blockIdx.x) * width;
  const int tid = static_cast<int>(threadIdx.x);
  const int threads = static_cast<int>(blockDim.x);
  NormThread t;
  const float squares = block_sum(
      norm_load_add(t, x + base, delta == nullptr ? nullptr : delta + base, weight, width, tid, threads), scratch);
  norm_store(t, out + base, width, inverse_sqrt(squares / static_cast<float>(width) + eps), tid, threads);
}

__global__ void silu_mul_kernel(const __half* gate_up, __half* out, int width) {
  start_after_prerequisite_grid();
  const std::int64_t r = blockIdx.y;
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i >= width) return;
  out[r * width + i] = silu_times(gate_up[r * 2 * width + i], gate_up[r * 2 * width + width + i]);
}

// A product block's weight rows, Slots of them: kLinearOutputs for a GEMV
// block, kNarrowOutputs for a narrow one. A plain block (linear(),
// gated_linear()) takes rows first .. first + Slots, fewer at the end. A
// paired block (gate_up_silu()) takes Slots / 2 outputs of SwiGLU's product
// from `first`: slot j < Slots / 2 is gate row first + j, slot up_slot(j) =
// Slots / 2 + j the up row up_offset rows further.
template <int Slots>
struct ProductBlock {
  static constexpr int kSlots = Slots;
  static constexpr int kPairs = Slots / 2;
  int first;      // the block's first output
  int outputs;    // its outputs from `first`: Slots (paired: kPairs), fewer at the end
  int up_offset;  // paired: where the up rows start in the weight (SwiGLU's width); 0 for a plain block
  // Block `block` of a product into `out` outputs, or of SwiGLU's product of `width` outputs.
  __host__ __device__ static ProductBlock plain_at(int block, int out) {
    const int first = block * Slots;
    return {first, out - first < Slots ? out - first : Slots, 0};
  }
  __host__ __device__ static ProductBlock paired_at(int block, int width) {
    const int first = block * kPairs;
    return {first, width - first < kPairs ? width - first : kPairs, width};
  }
  __device__ static ProductBlock plain(int out) { return plain_at(static_cast<int>(blockIdx.x), out); }
  __device__ static ProductBlock paired(int width) { return paired_at(static_cast<int>(blockIdx.x), width); }
  __host__ __device__ bool is_paired() const { return up_offset != 0; }
  __host__ __device__ static int up_slot(int output) { return kPairs + output; }
  __host__ __device__ bool holds(int slot) const { return (is_paired() ? slot % kPairs : slot) < outputs; }
  __host__ __device__ int weight_row_of(int slot) const {
    if (!is_paired()) return first + slot;
    return slot < kPairs ? first + slot : up_offset + first + slot - kPairs;
  }
};

using LinearBlock = ProductBlock<kLinearOutputs>;
// store_block_outputs(): one thread per output and row, and a GEMV block has at least 32.
static_assert(kLinearOutputs * kMaxGemvRows <= 32);

// Output j of a paired block from its slots' sums: each product rounded to
// fp16 as linear() stores it, then silu_times() as silu_mul() computes it.
__host__ __device__ inline __half paired_output(float gate_sum, float up_sum) {
  return silu_times(__float2half(gate_sum), __float2half(up_sum));
}

// A GEMV thread's vectors v0, v0 + threads, ... (Passes of them) of the
// block's weight rows; past the width, left as they are.
template <int Passes>
__device__ __forceinline__ void load_weight_vectors(HalfVector (&w)[Passes][kLinearOutputs], const __half* weight,
                                                    int in, const LinearBlock& block, int v0, int threads) {
  const int vectors = in / kVectorHalves;
#pragma unroll
  for (int p = 0; p < Passes; ++p) {
    const int v = v0 + p * threads;
#pragma unroll
    for (int j = 0; j < kLinearOutputs; ++j) {
      if (v < vectors && block.holds(j)) {
        w[p][j] = load_weight_vector(weight_row(weight, in, block.weight_row_of(j)) + v * kVectorHalves);
      }
    }
  }
}

// Those vectors' products with every input row added to the thread's sums, in order.
template <bool Gated, int Rows, int Passes>
__device__ __forceinline__ void add_products(float (&acc)[kLinearOutputs][Rows],
                                             const HalfVector (&w)[Passes][kLinearOutputs], const __half* x, int in,
                                             const LinearBlock& block, int v0, int threads) {
  const int vectors = in / kVectorHalves;
#pragma unroll
  for (int p = 0; p < Passes; ++p) {
    const int v = v0 + p * threads;
    if (v >= vectors) continue;
#pragma unroll
    for (int r = 0; r < Rows; ++r) {
      const HalfVector input = linear_input<Gated>(x, in, r, v * kVectorHalves);
#pragma unroll
      for (int j = 0; j < kLinearOutputs; ++j) {
        if (block.holds(j)) acc[j][r] = dot_vector(acc[j][r], w[p][j], input);
      }
    }
  }
}

// The block's first weight vectors, loaded before the kernel waits for its
// predecessor: nothing writes them, so a programmatic edge overlaps the
// loads with the predecessor's tail.
__device__ __forceinline__ void preload_then_wait(HalfVector (&preloaded)[kLinearPreload][kLinearOutputs],
                                                  const __half* weight, int in, const LinearBlock& block) {
  load_weight_vectors(preloaded, weight, in, block, static_cast<int>(threadIdx.x), static_cast<int>(blockDim.x));
  start_after_prerequisite_grid();
}

// A GEMV block's sums of slot j and row r, warp by warp: [warp][j * Rows + r].
template <int Rows>
using LinearWarpSums = float[kLinearWarps][kLinearOutputs * Rows];

// A product's block after the preload of its first weight vectors: the sums
// over the input `x` (global or shared memory) into `warp_sums` (visible to
// the block on return).
template <int Rows, bool Gated>
__device__ __forceinline__ void linear_warp_sums(const HalfVector (&preloaded)[kLinearPreload][kLinearOutputs],
                                                 const __half* x, const __half* weight, int in,
                                                 const LinearBlock& block, LinearWarpSums<Rows>& warp_sums) {
  const int tid = static_cast<int>(threadIdx.x);
  const int threads = static_cast<int>(blockDim.x);
  const int vectors = in / kVectorHalves;
  float acc[kLinearOutputs][Rows] = {};
  add_products<Gated>(acc, preloaded, x, in, block, tid, threads);
  for (int v0 = tid + kLinearPreload * threads; v0 < vectors; v0 += kLinearUnroll * threads) {
    HalfVector w[kLinearUnroll][kLinearOutputs]{};
    load_weight_vectors(w, weight, in, block, v0, threads);
    add_products<Gated>(acc, w, x, in, block, v0, threads);
  }
  const int lane = tid % 32;
  const int warp = tid / 32;
#pragma unroll
  for (int j = 0; j < kLinearOutputs; ++j) {
#pragma unroll
    for (int r = 0; r < Rows; ++r) {
      const float sum = warp_sum(acc[j][r]);
      if (lane == 0) warp_sums[warp][j * Rows + r] = sum;
    }
  }
  __syncthreads();
}

// Sum i of the block: its warps' sums in order.
template <int Rows>
__device__ __forceinline__ float linear_block_sum(const LinearWarpSums<Rows>& warp_sums, int i) {
  float total = 0.0F;
  for (int w = 0; w < static_cast<int>(blockDim.x) / 32; ++w) total += warp_sums[w][i];
  return total;
}

// store(j, r) for each of the block's outputs j and input rows r, one thread
// each: thread j * Rows + r (a GEMV's index of that sum in LinearWarpSums).
template <int Rows, class Block, class Store>
__device__ __forceinline__ void store_block_outputs(const Block& block, Store store) {
  const int tid = static_cast<int>(threadIdx.x);
  const int j = tid / Rows;
  if (j < block.outputs) store(j, tid % Rows);
}

// The block's products after the preload, stored to y ([Rows, out]).
template <int Rows, bool Gated>
__device__ __forceinline__ void linear_block_sums(const HalfVector (&preloaded)[kLinearPreload][kLinearOutputs],
                                                  const __half* x, const __half* weight, __half* y, int in, int out,
                                                  const LinearBlock& block) {
  __shared__ LinearWarpSums<Rows> warp_sums;
  linear_warp_sums<Rows, Gated>(preloaded, x, weight, in, block, warp_sums);
  store_block_outputs<Rows>(block, [&](int j, int r) {
    y[static_cast<std::int64_t>(r) * out + block.first + j] =
        __float2half(linear_block_sum<Rows>(warp_sums, j * Rows + r));
  });
}

// linear() and gated_linear(): kLinearOutputs weight rows per block, Rows
// input rows.
template <int Rows, bool Gated>
__global__ void __launch_bounds__(kLinearWarps * 32)
    linear_kernel(const __half* x, const __half* weight, __half* y, int in, int out) {
  const LinearBlock block = LinearBlock::plain(out);
  HalfVector preloaded[kLinearPreload][kLinearOutputs]{};
  preload_then_wait(preloaded, weight, in, block);
  linear_block_sums<Rows, Gated>(preloaded, x, weight, y, in, out, block);
}

// gate_up_silu(): LinearBlock::kPairs outputs of SwiGLU's product per block, their
// gate and up rows read together; each product rounded to fp16 as linear()
// stores it, then silu_times() as silu_mul() computes it.
template <int Rows>
__global__ void __launch_bounds__(kLinearWarps * 32)
    gate_up_silu_kernel(const __half* x, const __half* gate_up, __half* out, int in, int width) {
  const LinearBlock block = LinearBlock::paired(width);
  HalfVector preloaded[kLinearPreload][kLinearOutputs]{};
  preload_then_wait(preloaded, gate_up, in, block);
  __shared__ LinearWarpSums<Rows> warp_sums;
  linear_warp_sums<Rows, false>(preloaded, x, gate_up, in, block, warp_sums);
  store_block_outputs<Rows>(block, [&](int j, int r) {
    out[static_cast<std::int64_t>(r) * width + block.first + j] =
        paired_output(linear_block_sum<Rows>(warp_sums, j * Rows + r),
                      linear_block_sum<Rows>(warp_sums, LinearBlock::up_slot(j) * Rows + r));
  });
}

// norm_linear(): add_rms_norm() of one row computed by every block for
// itself, with add_rms_norm_kernel's sums in its order (its kThreads
// threads' parts, each warp's butterfly, the warps in order; this block's
// warps take those warps in turn), the normed row kept in shared memory as
// the product's input; block 0 writes x + delta to x_out (every block reads
// x, so the sum cannot go back in place). One kernel where add_rms_norm()
// and linear() are two.
__global__ void __launch_bounds__(kLinearWarps * 32)
    norm_linear_kernel(const __half* x, const __half* delta, const __half* norm_weight, float eps, __half* x_out,
                       const __half* weight, __half* y, int in, int out) {
  extern __shared__ uint4 normed_vectors[];  // the normed row: in / 8 vectors of 8 halves
  __shared__ float warp_squares[kThreads / 32];
  __half* normed = reinterpret_cast<__half*>(normed_vectors);
  const int tid = static_cast<int>(threadIdx.x);
  const int threads = static_cast<int>(blockDim.x);
  const LinearBlock block = LinearBlock::plain(out);
  HalfVector preloaded[kLinearPreload][kLinearOutputs]{};
  preload_then_wait(preloaded, weight, in, block);
  const int lane = tid % 32;
  for (int w = tid / 32; w < kThreads / 32; w += threads / 32) {
    const float part = warp_sum(norm_squares(x, delta, in, w * 32 + lane, kThreads));
    if (lane == 0) warp_squares[w] = part;
  }
  __syncthreads();
  float squares = 0.0F;
  for (int w = 0; w < kThreads / 32; ++w) squares += warp_squares[w];
  const float inverse_rms = inverse_sqrt(squares / static_cast<float>(in) + eps);
  for (int v = tid; v < in / kKeyVector; v += threads) {
    __half2 sum[kKeyVector / 2];
    residual_vector(x, delta, v * kKeyVector, sum);
    if (blockIdx.x == 0 && delta != nullptr) store_vector(x_out + v * kKeyVector, sum);
    __half2 scale[kKeyVector / 2];
    load_key_vector(norm_weight + v * kKeyVector, scale);
    __half2 normed_sum[kKeyVector / 2];
    scale_vector(sum, scale, inverse_rms, normed_sum);
    store_vector(normed + v * kKeyVector, normed_sum);
  }
  __syncthreads();
  linear_block_sums<1, false>(preloaded, normed, weight, y, in, out, block);
}

// ---- the narrow product: 2 to kMaxGemvRows rows on the tensor cores ----
//
// mma.m16n8k16 with the input rows as its narrow side: A is 16 weight rows
// (the block's slots), B the input rows transposed (8 columns; those past
// Rows are zero), C their 16 x 8 sums in fp32. A block takes kNarrowOutputs
// slots; its kNarrowWarps warps take the width's kNarrowChunk-wide chunks in
// turn (warp w: chunks w, w + kNarrowWarps, ...: neighbouring warps read
// neighbouring 64 bytes of each weight row), then the block sums its warps
// in order. Thread (g = lane / 4, t = lane % 4) loads the 16 bytes at 8t of
// each chunk of slots g and g + 8 and of input row g, and mma's k positions
// {2t, 2t + 1, 2t + 8, 2t + 9} take halves 8t .. 8t + 3, then 8t + 4 ..
// 8t + 7: the same positions for A and B, so each mma sums 16 of the chunk's
// products. A paired block (gate_up_silu()) takes 8 gate rows as slots 0 to
// 7 and their up rows as 8 to 15. Each warp keeps narrow_chunks_in_flight(in)
// chunks of loads in flight, the weights of its first ones loaded before the
// kernel waits for its predecessor.
constexpr int kNarrowOutputs = 16;  // mma's m
constexpr int kNarrowColumns = 8;   // mma's n: the most input rows
constexpr int kNarrowWarps = 8;
constexpr int kNarrowChunk = 32;    // halves of a row per warp step: two mma k-steps
constexpr int kNarrowUnroll = 4;    // chunks per warp in flight where one pass of the block's warps takes the width
constexpr int kNarrowDeepUnroll = 8;  // where it would take more: each pass waits for its loads

// narrow_chunks_in_flight()'s default: 4 chunks per warp in flight where one
// pass of the block's warps takes the width (fewer registers, so more blocks
// share an SM), else 8: half as many passes, each waiting for its own loads.
constexpr int narrow_unroll(int in) {
  return (in + kNarrowChunk - 1) / kNarrowChunk > kNarrowWarps * kNarrowUnroll ? kNarrowDeepUnroll : kNarrowUnroll;
}
// The thread layout above: slots g and g + 8, columns 2t and 2t + 1, four
// threads of 16 bytes per chunk; one epilogue thread per slot and row.
static_assert(kNarrowOutputs == 16 && kNarrowColumns == 8 && kNarrowChunk == 4 * kVectorHalves);
static_assert(kMaxGemvRows <= kNarrowColumns && kNarrowOutputs * kMaxGemvRows <= kNarrowWarps * 32);
using NarrowBlock = ProductBlock<kNarrowOutputs>;

// A narrow block's sums of slot m and input row r, warp by warp: [warp][m][r].
using NarrowWarpSums = float[kNarrowWarps][kNarrowOutputs][kNarrowColumns];

__device__ __forceinline__ uint4 as_uint4(const HalfVector& v) {
  uint4 u;
  memcpy(&u, &v, sizeof(u));
  return u;
}

// c += A B for one m16n8k16 step: a's four registers (rows g, g + 8, g, g + 8
// at k 2t and 2t + 8), b's two (column g at k 2t and 2t + 8).
__device__ __forceinline__ void mma_16x8x16(float (&c)[4], unsigned a0, unsigned a1, unsigned a2, unsigned a3,
                                            unsigned b0, unsigned b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#elif defined(__CUDA_ARCH__)
  __trap();  // no mma.m16n8k16 below sm_80: fail loudly rather than sum nothing
#endif
}

// Weight vectors of slots g (low) and g + 8 (high) for the chunks
// first_chunk + u * kNarrowWarps; zero past the width or the block's slots.
template <int Unroll>
__device__ __forceinline__ void load_narrow_weights(uint4 (&low)[Unroll], uint4 (&high)[Unroll],
                                                    const __half* low_row, const __half* high_row,
                                                    int first_chunk, int t, int vectors) {
#pragma unroll
  for (int u = 0; u < Unroll; ++u) {
    const int v = (first_chunk + u * kNarrowWarps) * (kNarrowChunk / kVectorHalves) + t;
    const bool inside = v < vectors;
    low[u] = inside && low_row != nullptr ? as_uint4(load_weight_vector(low_row + v * kVectorHalves))
                                          : make_uint4(0, 0, 0, 0);
    high[u] = inside && high_row != nullptr ? as_uint4(load_weight_vector(high_row + v * kVectorHalves))
                                            : make_uint4(0, 0, 0, 0);
  }
}

// The block's sums into `warp_sums` (visible to the block on return), with
// Unroll (narrow_chunks_in_flight(in)) chunks per warp in flight.
template <int Rows, bool Gated, int Unroll>
__device__ __forceinline__ void narrow_warp_sums(const __half* x, const __half* weight, int in,
                                                 const NarrowBlock& block, NarrowWarpSums& warp_sums) {
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int g = lane / 4;
  const int t = lane % 4;
  const int vectors = in / kVectorHalves;
  const int chunks = (in + kNarrowChunk - 1) / kNarrowChunk;
  const __half* low_row = block.holds(g) ? weight_row(weight, in, block.weight_row_of(g)) : nullptr;
  const __half* high_row = block.holds(g + 8) ? weight_row(weight, in, block.weight_row_of(g + 8)) : nullptr;
  uint4 low[Unroll];
  uint4 high[Unroll];
  load_narrow_weights(low, high, low_row, high_row, warp, t, vectors);  // nothing writes them
  start_after_prerequisite_grid();
  float c[4] = {0.0F, 0.0F, 0.0F, 0.0F};
  for (int first_chunk = warp; first_chunk < chunks; first_chunk += kNarrowWarps * Unroll) {
    if (first_chunk != warp) load_narrow_weights(low, high, low_row, high_row, first_chunk, t, vectors);
    uint4 input[Unroll];
#pragma unroll
    for (int u = 0; u < Unroll; ++u) {
      const int v = (first_chunk + u * kNarrowWarps) * (kNarrowChunk / kVectorHalves) + t;
      input[u] = g < Rows && v < vectors ? as_uint4(linear_input<Gated>(x, in, g, v * kVectorHalves))
                                         : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < Unroll; ++u) {
      mma_16x8x16(c, low[u].x, high[u].x, low[u].y, high[u].y, input[u].x, input[u].y);
      mma_16x8x16(c, low[u].z, high[u].z, low[u].w, high[u].w, input[u].z, input[u].w);
    }
  }
  // c[0], c[1]: slot g, rows 2t and 2t + 1; c[2], c[3]: slot g + 8.
  warp_sums[warp][g][2 * t] = c[0];
  warp_sums[warp][g][2 * t + 1] = c[1];
  warp_sums[warp][g + 8][2 * t] = c[2];
  warp_sums[warp][g + 8][2 * t + 1] = c[3];
  __syncthreads();
}

// Slot m's sum for input row r: the warps' sums in order.
__device__ __forceinline__ float narrow_block_sum(const NarrowWarpSums& warp_sums, int m, int r) {
  float total = 0.0F;
#pragma unroll
  for (int w = 0; w < kNarrowWarps; ++w) total += warp_sums[w][m][r];
  return total;
}

// linear() and gated_linear() for 2 to kMaxGemvRows rows; Unroll =
// narrow_chunks_in_flight(in).
template <int Rows, bool Gated, int Unroll>
__global__ void __launch_bounds__(kNarrowWarps * 32)
    narrow_linear_kernel(const __half* x, const __half* weight, __half* y, int in, int out) {
  const NarrowBlock block = NarrowBlock::plain(out);
  __shared__ NarrowWarpSums warp_sums;
  narrow_warp_sums<Rows, Gated, Unroll>(x, weight, in, block, warp_sums);
  store_block_outputs<Rows>(block, [&](int j, int r) {
    y[static_cast<std::int64_t>(r) * out + block.first + j] = __float2half(narrow_block_sum(warp_sums, j, r));
  });
}

// gate_up_silu() for 2 to kMaxGemvRows rows: NarrowBlock::kPairs outputs per
// block, rounded as linear() and silu_mul() round them; Unroll =
// narrow_chunks_in_flight(in).
template <int Rows, int Unroll>
__global__ void __launch_bounds__(kNarrowWarps * 32)
    narrow_gate_up_silu_kernel(const __half* x, const __half* gate_up, __half* out, int in, int width) {
  const NarrowBlock block = NarrowBlock::paired(width);
  __shared__ NarrowWarpSums warp_sums;
  narrow_warp_sums<Rows, false, Unroll>(x, gate_up, in, block, warp_sums);
  store_block_outputs<Rows>(block, [&](int j, int r) {
    out[static_cast<std::int64_t>(r) * width + block.first + j] =
        paired_output(narrow_block_sum(warp_sums, j, r), narrow_block_sum(warp_sums, NarrowBlock::up_slot(j), r));
  });
}

// linear() and gated_linear() for Rows = 16, 32, 48 or 64 rows: the tensor
// cores' 16x16x16 products. A's fragment is x's rows (row major, or for
// Gated silu(gate) * up computed element by element from the gate's and the
// up's fragments of the same layout); B's is the weight as a column-major
// [in, out] matrix (its rows are torch's [out, in] rows).
template <int Rows, bool Gated>
__global__ void __launch_bounds__(kSkinnyWarps * 32)
    skinny_linear_kernel(const __half* x, const __half* weight, __half* y, int in, int out, int steps_per_split,
                         LinearWorkspace workspace) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
  namespace wmma = nvcuda::wmma;
  using InputFragment = wmma::fragment<wmma::matrix_a, 16, 16, kSkinnyStep, __half, wmma::row_major>;
  using WeightFragment = wmma::fragment<wmma::matrix_b, 16, 16, kSkinnyStep, __half, wmma::col_major>;
  using SumFragment = wmma::fragment<wmma::accumulator, 16, 16, kSkinnyStep, float>;
  constexpr int kTiles = Rows / 16;
  constexpr int kOutputTiles = kSkinnyOutputs / 16;
  __shared__ __align__(32) float sums[kSkinnyWarps][Rows][kSkinnyOutputs];
  __shared__ bool last;
  const int tid = static_cast<int>(threadIdx.x);
  const int warp = tid / 32;
  const int tile = static_cast<int>(blockIdx.x);
  const int split = static_cast<int>(blockIdx.y);
  const int splits = static_cast<int>(gridDim.y);
  const int first_output = tile * kSkinnyOutputs;
  const int steps = in / kSkinnyStep;
  const int end = min((split + 1) * steps_per_split, steps);
  const int x_stride = Gated ? 2 * in : in;
  const auto load_weights = [&](WeightFragment (&b)[kOutputTiles], int step) {
#pragma unroll
    for (int n = 0; n < kOutputTiles; ++n) {
      wmma::load_matrix_sync(b[n], weight_row(weight, in, first_output + n * 16) + step * kSkinnyStep, in);
    }
  };
  SumFragment acc[kTiles][kOutputTiles];
  const auto multiply = [&](const WeightFragment (&b)[kOutputTiles], int step) {
#pragma unroll
    for (int m = 0; m < kTiles; ++m) {
      InputFragment a;
      const __half* row = x + static_cast<std::int64_t>(m) * 16 * x_stride + step * kSkinnyStep;
      wmma::load_matrix_sync(a, row, x_stride);
      if constexpr (Gated) {
        InputFragment up;
        wmma::load_matrix_sync(up, row + in, x_stride);
#pragma unroll
        for (int i = 0; i < a.num_elements; ++i) a.x[i] = silu_times(a.x[i], up.x[i]);
      }
#pragma unroll
      for (int n = 0; n < kOutputTiles; ++n) wmma::mma_sync(acc[m][n], a, b[n], acc[m][n]);
    }
  };
  // The weights first: nothing writes them.
  int step = split * steps_per_split + warp;
  WeightFragment preloaded[kOutputTiles];
  if (step < end) load_weights(preloaded, step);
  start_after_prerequisite_grid();
#pragma unroll
  for (int m = 0; m < kTiles; ++m) {
#pragma unroll
    for (int n = 0; n < kOutputTiles; ++n) wmma::fill_fragment(acc[m][n], 0.0F);
  }
  if (step < end) multiply(preloaded, step);
  step += kSkinnyWarps;
  for (; step + kSkinnyWarps < end; step += 2 * kSkinnyWarps) {
    WeightFragment b0[kOutputTiles];
    WeightFragment b1[kOutputTiles];
    load_weights(b0, step);
    load_weights(b1, step + kSkinnyWarps);
    multiply(b0, step);
    multiply(b1, step + kSkinnyWarps);
  }
  if (step < end) {
    WeightFragment b[kOutputTiles];
    load_weights(b, step);
    multiply(b, step);
  }
#pragma unroll
  for (int m = 0; m < kTiles; ++m) {
#pragma unroll
    for (int n = 0; n < kOutputTiles; ++n) {
      wmma::store_matrix_sync(&sums[warp][m * 16][n * 16], acc[m][n], kSkinnyOutputs, wmma::mem_row_major);
    }
  }
  __syncthreads();
  const int threads = static_cast<int>(blockDim.x);
  constexpr int kElements = Rows * kSkinnyOutputs;
  if (splits == 1) {
    for (int i = tid; i < kElements; i += threads) {
      const int r = i / kSkinnyOutputs;
      const int n = i % kSkinnyOutputs;
      y[static_cast<std::int64_t>(r) * out + first_output + n] = __float2half(skinny_warps_sum<Rows>(&sums[0][0][0], i));
    }
    return;
  }
  for (int i = tid; i < kElements; i += threads) {
    const int r = i / kSkinnyOutputs;
    const int n = i % kSkinnyOutputs;
    workspace.partials[skinny_partial_index(split, Rows, r, out, first_output + n)] =
        skinny_warps_sum<Rows>(&sums[0][0][0], i);
  }
  __threadfence();  // this thread's stores reach the device before the count does
  __syncthreads();
  if (tid == 0) last = atomicAdd(workspace.counters + tile, 1U) == static_cast<unsigned>(splits - 1);
  __syncthreads();
  if (!last) return;
  __threadfence();
  for (int i = tid; i < kElements; i += threads) {
    const int r = i / kSkinnyOutputs;
    const int n = i % kSkinnyOutputs;
    float total = 0.0F;
    for (int s = 0; s < splits; ++s) {
      total += load_partial(workspace.partials + skinny_partial_index(s, Rows, r, out, first_output + n));
    }
    y[static_cast<std::int64_t>(r) * out + first_output + n] = __float2half(total);
  }
  if (tid == 0) workspace.counters[tile] = 0;
#endif
}

__global__ void step_inputs_kernel(StepRows state, std::int64_t* live_slots, std::int64_t* live_positions) {
  start_after_prerequisite_grid();
  const int r = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (r < state.rows) step_inputs_row(state, live_slots, live_positions, r);
}

// One block: the loop row needs every row's answer.
__global__ void step_update_kernel(StepRows state, const std::int64_t* next) {
  start_after_prerequisite_grid();
  const std::int64_t step = state.loop[0];
  bool live = false;
  for (int r = static_cast<int>(threadIdx.x); r < state.rows; r += static_cast<int>(blockDim.x)) {
    live = step_update_row(state, next, step, r) || live;
  }
  // Every thread read loop[0] before any writes it.
  const bool any_live = __syncthreads_or(live ? 1 : 0) != 0;
  if (threadIdx.x == 0) step_update_loop(state, any_live);
}

// set_programmatic_launches()
std::atomic<ProgrammaticLaunches> programmatic_launches_set{ProgrammaticLaunches::after_own_kernels};
// The nodes this thread's launches added to the capture under way (after_own_kernels).
thread_local OwnCapturedKernels own_captured_kernels;
// The process-wide product sets (rows r at bit r - 1), both under one lock:
// set_product_sets() changes the pair at once, so a reader never sees half
// of it (72 bits, more than one atomic holds). Read once per step, by a
// thread without a scope of its own.
std::mutex process_wide_sets_lock;
ProductSets process_wide_sets{.own = ProductRowCounts(1), .narrow = {}};

// Whether a product of `rows` rows (1 to kMaxGemvRows) is the narrow
// tensor-core product rather than the GEMV.
bool uses_narrow_product(int rows) {
  return narrow_takes(rows) && product_sets_in_force().narrow.test(static_cast<std::size_t>(rows - 1));
}
// ThreadProductSets: the innermost scope's sets on this thread, if any.
thread_local std::optional<ProductSets> thread_product_sets;
std::atomic<bool> fold_norms_on{false};            // set_fold_norms()
std::atomic<int> narrow_chunks_forced{0};          // force_narrow_chunks_in_flight(); 0: by the width

// What a launch on `stream` would depend on: cudaStreamGetCaptureInfo (CUDA
// 13; cudaStreamGetCaptureInfo_v3 before), the edges' data asked for too,
// since without it the query fails (cudaErrorLossyQuery) where an edge is
// not a default one. A driver older than CUDA 12.3 cannot answer: reported
// as not capturing, so the launches are programmatic, as `always`.
CaptureDependencies capture_dependencies(cudaStream_t stream, const std::source_location& where) {
  CaptureDependencies reported;
#if CUDART_VERSION >= 13000
  const cudaError_t status = cudaStreamGetCaptureInfo(stream, &reported.status, &reported.capture, nullptr,
                                                      &reported.nodes, &reported.edges, &reported.count);
#else
  const cudaError_t status = cudaStreamGetCaptureInfo_v3(stream, &reported.status, &reported.capture, nullptr,
                                                         &reported.nodes, &reported.edges, &reported.count);
#endif
  if (status == cudaErrorCallRequiresNewerDriver) {
    if (cudaPeekAtLastError() == status) (void)cudaGetLastError();  // this query's own failure, taken back
    return CaptureDependencies{};
  }
  replay::check(status, "cudaStreamGetCaptureInfo", where);
  return reported;
}

// The one place the fused kernels are launched: replay::launch on `stream`
// (the arguments checked against the kernel's parameters at compile time,
// errors naming the call's line), with programmatic stream serialization
// where set_programmatic_launches() puts it and the device supports it
// (LaunchAttributes::programmatic_where_supported: the device is sm_90 or
// later and the kernel's code there was compiled for it, so that it waits
// for its predecessor); plainly elsewhere.
template <typename... Params, typename... Args>
void launch_programmatic(void (*kernel)(Params...), const replay::LaunchOptions& options, cudaStream_t stream,
                         Args&&... args) {
  const ProgrammaticLaunches mode = programmatic_launches_set.load(std::memory_order_relaxed);
  // after_own_kernels: what the launch will depend on, if it is captured.
  const std::optional<bool> follows_own_kernels =
      mode == ProgrammaticLaunches::after_own_kernels
          ? own_captured_kernels.follows_own(capture_dependencies(stream, options.where()))
          : std::nullopt;
  replay::launch(replay::StreamRef(stream),
                 replay::LaunchOptions(options.config(),
                                       launch_programmatically(mode, follows_own_kernels)
                                           ? replay::LaunchAttributes::programmatic_where_supported()
                                           : replay::LaunchAttributes{},
                                       options.where()),
                 kernel, std::forward<Args>(args)...);
  if (follows_own_kernels.has_value()) own_captured_kernels.record_launch(capture_dependencies(stream, options.where()));
}

// The kernels read and write 16 bytes at a time where these point; a
// misaligned address would be a sticky device error, so it is refused here.
void check_aligned(const void* p, const char* what, const char* kernel) {
  if (reinterpret_cast<std::uintptr_t>(p) % 16 != 0) {
    throw std::invalid_argument(std::string("fused ") + kernel + ": " + what +
                                " must be 16-byte aligned (a tensor of its own, not a view at an odd offset)");
  }
}

// What an attention call (kernel or host version) checks before it runs;
// returns the shared memory it needs, in floats.
std::size_t check_attention_call(const char* kernel, int heads, int kv_heads, int head_dim, int context,
                                 const __half* cache_k, const __half* cache_v, const AttentionWorkspace& workspace) {
  check_attention_shape(heads, kv_heads, head_dim);
  if (context < 1) {
    throw std::invalid_argument(std::string("fused ") + kernel + ": the context must be at least 1 position");
  }
  if (attention_splits(context) > 1 && (workspace.partials == nullptr || workspace.counters == nullptr)) {
    throw std::invalid_argument(std::string("fused ") + kernel + ": a context of " + std::to_string(context) +
                                " positions is split over " + std::to_string(attention_splits(context)) +
                                " blocks per row and key/value head, which need a workspace: "
                                "attention_partial_floats() floats and rows * kv_heads counters at zero");
  }
  check_aligned(cache_k, "the key cache", kernel);
  check_aligned(cache_v, "the value cache", kernel);
  return attention_shared_floats(heads / kv_heads, head_dim);
}

void rotary_and_cache_write(const __half* qkv, std::int64_t qkv_stride, const __half* cos, const __half* sin,
                            const std::int64_t* positions, const std::int64_t* slots, __half* q_out, __half* cache_k,
                            __half* cache_v, int rows, int heads, int kv_heads, int head_dim, std::int64_t max_len,
                            cudaStream_t stream) {
  if (head_dim % 2 != 0) throw std::invalid_argument("fused rotary: head_dim must be even");
  launch_programmatic(rotary_and_cache_write_kernel, {dim3(static_cast<unsigned>(rows)), dim3(kThreads)}, stream, qkv, qkv_stride, cos, sin,
                      positions, slots, q_out, cache_k, cache_v, heads, kv_heads, head_dim, max_len);
}

// Calls f(Group) with the group as a constant (integral_constant), 1 to kMaxQueryGroup.
template <int Group = 1, typename F>
void with_query_group(int group, F&& f) {
  if constexpr (Group <= kMaxQueryGroup) {
    if (group != Group) return with_query_group<Group + 1>(group, std::forward<F>(f));
    return f(std::integral_constant<int, Group>{});
  }
}

void decode_attention(const __half* q, const __half* cache_k, const __half* cache_v, const std::int64_t* slots,
                      const std::int64_t* positions, __half* out, int rows, int heads, int kv_heads, int head_dim,
                      std::int64_t max_len, int context, float scale, const AttentionWorkspace& workspace,
                      cudaStream_t stream) {
  const std::size_t shared_floats =
      check_attention_call("decode_attention", heads, kv_heads, head_dim, context, cache_k, cache_v, workspace);
  const std::size_t shared = shared_floats * sizeof(float);
  const dim3 grid(static_cast<unsigned>(rows), static_cast<unsigned>(kv_heads),
                  static_cast<unsigned>(attention_splits(context)));
  with_query_group(heads / kv_heads, [&](auto group) {
    launch_programmatic(decode_attention_kernel<group()>,
                        {grid, dim3(kAttentionWarps * kLanes), static_cast<unsigned>(shared)}, stream, q, cache_k, cache_v, slots, positions, out,
                        heads, kv_heads, head_dim, max_len, context, scale, workspace);
  });
}

void rotary_attention(const __half* qkv, std::int64_t qkv_stride, const __half* cos, const __half* sin,
                      const std::int64_t* positions, const std::int64_t* slots, __half* cache_k, __half* cache_v,
                      __half* out, int rows, int heads, int kv_heads, int head_dim, std::int64_t max_len, int context,
                      float scale, const AttentionWorkspace& workspace, cudaStream_t stream) {
  const std::size_t shared_floats =
      check_attention_call("rotary_attention", heads, kv_heads, head_dim, context, cache_k, cache_v, workspace);
  const std::size_t shared = shared_floats * sizeof(float);
  const dim3 grid(static_cast<unsigned>(rows), static_cast<unsigned>(kv_heads),
                  static_cast<unsigned>(attention_splits(context)));
  with_query_group(heads / kv_heads, [&](auto group) {
    launch_programmatic(rotary_attention_kernel<group()>,
                        {grid, dim3(kAttentionWarps * kLanes), static_cast<unsigned>(shared)}, stream, qkv, qkv_stride, cos, sin, positions, slots,
                        cache_k, cache_v, out, heads, kv_heads, head_dim, max_len, context, scale, workspace);
  });
}

void add_rms_norm(__half* x, const __half* delta, const __half* weight, __half* out, int rows, int width, float eps,
                  cudaStream_t stream) {
  check_norm_width(width);
  check_aligned(x, "x", "add_rms_norm");
  if (delta != nullptr) check_aligned(delta, "delta", "add_rms_norm");
  check_aligned(weight, "the weight", "add_rms_norm");
  check_aligned(out, "out", "add_rms_norm");
  launch_programmatic(add_rms_norm_kernel, {dim3(static_cast<unsigned>(rows)), dim3(kThreads)}, stream, x, delta, weight, out, width, eps);
}

void silu_mul(const __half* gate_up, __half* out, int rows, int width, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>((width + kThreads - 1) / kThreads), static_cast<unsigned>(rows));
  launch_programmatic(silu_mul_kernel, {grid, dim3(kThreads)}, stream, gate_up,
                      out, width);
}

// Calls f(rows) with the rows as a constant (integral_constant), for rows
// from Rows to kMaxGemvRows.
template <int Rows, typename F>
void with_linear_rows(int rows, F&& f) {
  if constexpr (Rows <= kMaxGemvRows) {
    if (rows != Rows) return with_linear_rows<Rows + 1>(rows, std::forward<F>(f));
    return f(std::integral_constant<int, Rows>{});
  } else {
    // The callers' checks keep rows in range: a launch of nothing would be a silent wrong answer.
    throw std::logic_error("fused: no product kernel for " + std::to_string(rows) + " rows");
  }
}

// Calls f(unroll) with narrow_chunks_in_flight(in) as a constant (integral_constant).
template <typename F>
void with_narrow_unroll(int in, F&& f) {
  if (narrow_chunks_in_flight(in) == kNarrowDeepUnroll) return f(std::integral_constant<int, kNarrowDeepUnroll>{});
  return f(std::integral_constant<int, kNarrowUnroll>{});
}

// What a product (kernel or host version) checks before it runs.
void check_linear_call(const char* kernel, const __half* x, const __half* weight, int rows, int in, int out,
                       const LinearWorkspace& workspace) {
  check_linear_shape(rows, in, out);
  // 32 bytes: WMMA's loads need it; the GEMV's 16-byte loads are served too.
  for (const auto& [p, what] : {std::pair{static_cast<const void*>(x), "the input"},
                                std::pair{static_cast<const void*>(weight), "the weight"}}) {
    if (reinterpret_cast<std::uintptr_t>(p) % 32 != 0) {
      throw std::invalid_argument(std::string("fused ") + kernel + ": " + what +
                                  " must be 32-byte aligned (a tensor of its own, not a view at an odd offset)");
    }
  }
  if (linear_partial_floats(rows, in, out) > 0 && (workspace.partials == nullptr || workspace.counters == nullptr)) {
    throw std::invalid_argument(std::string("fused ") + kernel + ": " + std::to_string(rows) + " rows of " +
                                std::to_string(in) + " halves into " + std::to_string(out) +
                                " outputs split the width over blocks, which need a workspace: "
                                "linear_partial_floats() floats and linear_counters() counters at zero");
  }
}

template <bool Gated>
void launch_linear(const __half* x, const __half* weight, __half* y, int rows, int in, int out,
                   const LinearWorkspace& workspace, cudaStream_t stream) {
  if (rows <= kMaxGemvRows && !uses_narrow_product(rows)) {
    const dim3 grid(static_cast<unsigned>((out + kLinearOutputs - 1) / kLinearOutputs));
    with_linear_rows<1>(rows, [&](auto r) {
      launch_programmatic(linear_kernel<r(), Gated>, {grid, dim3(static_cast<unsigned>(linear_threads(in)))}, stream,
                          x, weight, y, in, out);
    });
    return;
  }
  if (rows <= kMaxGemvRows) {
    const dim3 grid(static_cast<unsigned>((out + kNarrowOutputs - 1) / kNarrowOutputs));
    with_linear_rows<2>(rows, [&](auto r) {
      with_narrow_unroll(in, [&](auto unroll) {
        launch_programmatic(narrow_linear_kernel<r(), Gated, unroll()>, {grid, dim3(kNarrowWarps * 32)}, stream, x,
                            weight, y, in, out);
      });
    });
    return;
  }
  const SkinnySplit split = skinny_split(in, out);
  const dim3 grid(static_cast<unsigned>(out / kSkinnyOutputs), static_cast<unsigned>(split.splits));
  const auto launch = [&](auto kernel) {
    launch_programmatic(kernel, {grid, dim3(kSkinnyWarps * 32)}, stream, x, weight, y, in, out,
                        split.steps_per_split, workspace);
  };
  switch (rows) {
    case 16: return launch(skinny_linear_kernel<16, Gated>);
    case 32: return launch(skinny_linear_kernel<32, Gated>);
    case 48: return launch(skinny_linear_kernel<48, Gated>);
    default: return launch(skinny_linear_kernel<64, Gated>);  // check_linear_shape() left 64
  }
}

void linear(const __half* x, const __half* weight, __half* y, int rows, int in, int out,
            const LinearWorkspace& workspace, cudaStream_t stream) {
  check_linear_call("linear", x, weight, rows, in, out, workspace);
  launch_linear<false>(x, weight, y, rows, in, out, workspace, stream);
}

void gated_linear(const __half* gate_up, const __half* weight, __half* y, int rows, int in, int out,
                  const LinearWorkspace& workspace, cudaStream_t stream) {
  check_linear_call("gated_linear", gate_up, weight, rows, in, out, workspace);
  launch_linear<true>(gate_up, weight, y, rows, in, out, workspace,
                      stream);
}

// What gate_up_silu() (kernel or host version) checks before it runs.
void check_gate_up_silu_call(const __half* x, const __half* gate_up, int rows, int in, int width) {
  if (rows < 1 || rows > kMaxGemvRows || width < 1 || width > std::numeric_limits<int>::max() / 2 ||
      !linear_fits(rows, in, 2 * width)) {
    throw std::invalid_argument("fused gate_up_silu: " + std::to_string(rows) + " rows of " + std::to_string(in) +
                                " halves into " + std::to_string(width) + " outputs; it takes 1 to " +
                                std::to_string(kMaxGemvRows) + " rows of a positive multiple of " +
                                std::to_string(kVectorHalves) + " halves into at least one output");
  }
  check_linear_call("gate_up_silu", x, gate_up, rows, in, 2 * width, {});
}

void gate_up_silu(const __half* x, const __half* gate_up, __half* out, int rows, int in, int width,
                  cudaStream_t stream) {
  check_gate_up_silu_call(x, gate_up, rows, in, width);
  if (!uses_narrow_product(rows)) {
    const dim3 grid(static_cast<unsigned>((width + LinearBlock::kPairs - 1) / LinearBlock::kPairs));
    with_linear_rows<1>(rows, [&](auto r) {
      launch_programmatic(gate_up_silu_kernel<r()>, {grid, dim3(static_cast<unsigned>(linear_threads(in)))}, stream,
                          x, gate_up, out, in, width);
    });
    return;
  }
  const dim3 grid(static_cast<unsigned>((width + NarrowBlock::kPairs - 1) / NarrowBlock::kPairs));
  with_linear_rows<2>(rows, [&](auto r) {
    with_narrow_unroll(in, [&](auto unroll) {
      launch_programmatic(narrow_gate_up_silu_kernel<r(), unroll()>, {grid, dim3(kNarrowWarps * 32)}, stream, x,
                          gate_up, out, in, width);
    });
  });
}

// What norm_linear() (kernel or host version) checks before it runs.
void check_norm_linear_call(const __half* x, const __half* delta, const __half* norm_weight, const __half* x_out,
                            const __half* weight, int rows, int in, int out, const LinearWorkspace& workspace) {
  if (rows != 1) {
    throw std::invalid_argument("fused norm_linear: " + std::to_string(rows) +
                                " rows; it takes one (add_rms_norm() and linear() take more)");
  }
  check_norm_width(in);
  check_linear_call("norm_linear", x, weight, rows, in, out, workspace);
  if (delta != nullptr) check_aligned(delta, "delta", "norm_linear");
  check_aligned(norm_weight, "the norm's weight", "norm_linear");
  if (delta != nullptr) {
    check_aligned(x_out, "x_out", "norm_linear");
    if (x_out == x || x_out == delta) {
      throw std::invalid_argument(
          "fused norm_linear: x_out must be a buffer of its own: every block reads x and delta while block 0 "
          "writes their sum");
    }
  }
}

void norm_linear(const __half* x, const __half* delta, const __half* norm_weight, float eps, __half* x_out,
                 const __half* weight, __half* y, int rows, int in, int out, const LinearWorkspace& workspace,
                 cudaStream_t stream) {
  check_norm_linear_call(x, delta, norm_weight, x_out, weight, rows, in, out, workspace);
  const dim3 grid(static_cast<unsigned>((out + kLinearOutputs - 1) / kLinearOutputs));
  const auto shared = static_cast<unsigned>(static_cast<std::size_t>(in) * sizeof(__half));
  launch_programmatic(norm_linear_kernel, {grid, dim3(static_cast<unsigned>(linear_threads(in))), shared}, stream, x,
                      delta, norm_weight, eps, x_out, weight, y, in, out);
}

void check_step_rows(const StepRows& state) {
  if (state.rows < 1 || state.ring_steps < 1) {
    throw std::invalid_argument("fused step bookkeeping: " + std::to_string(state.rows) + " rows and " +
                                std::to_string(state.ring_steps) + " ring steps (both must be at least 1)");
  }
  if (state.eos_count < 0 || (state.eos_count > 0 && state.eos == nullptr)) {
    throw std::invalid_argument("fused step bookkeeping: " + std::to_string(state.eos_count) +
                                " end-of-sequence tokens at " + (state.eos == nullptr ? "null" : "an address") +
                                " (a count of at least 0, and an address if above 0)");
  }
}

void step_inputs(const StepRows& state, std::int64_t* live_slots, std::int64_t* live_positions, cudaStream_t stream) {
  check_step_rows(state);
  launch_programmatic(step_inputs_kernel,
                      {dim3(static_cast<unsigned>((state.rows + kThreads - 1) / kThreads)), dim3(kThreads)}, stream,
                      state, live_slots, live_positions);
}

void step_update(const StepRows& state, const std::int64_t* next, cudaStream_t stream) {
  check_step_rows(state);
  launch_programmatic(step_update_kernel, {dim3(1), dim3(kThreads)}, stream,
                      state, next);
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

// The kernel's work as one thread: each warp's lanes in turn, where the
// kernel passes values between lanes (the chunk's largest score, the keys'
// weights, the sums) the host reads them from arrays. Leaves the warps'
// states in `merge`.
template <int Group>
void host_attend(const AttentionBlock& b, const float* queries, float* merge) {
  std::vector<LaneState<Group>> lanes(kLanes);
  std::vector<std::array<float, Group>> scores(kLanes);
  std::vector<std::array<float, Group>> weights(kLanes);
  const auto at = [](int i) { return static_cast<std::size_t>(i); };
  const int lanes_per_key = attention_lanes_per_key(b.end - b.first, b.head_dim);
  const int chunk_keys = kLanes / lanes_per_key;
  for (int warp = 0; warp < kAttentionWarps; ++warp) {
    for (LaneState<Group>& s : lanes) lane_start(s);
    for (int chunk = b.first + warp * chunk_keys; chunk < b.end; chunk += kAttentionWarps * chunk_keys) {
      for (int lane = 0; lane < kLanes; ++lane) {
        float score[Group];
        key_scores(b, queries, chunk + lane / lanes_per_key, lane % lanes_per_key, lanes_per_key, score);
        for (int g = 0; g < Group; ++g) scores[at(lane)][at(g)] = score[g];
      }
      // The key's lanes' shares summed in the kernel's pairs.
      for (int offset = 1; offset < lanes_per_key; offset *= 2) {
        const std::vector<std::array<float, Group>> before = scores;
        for (int lane = 0; lane < kLanes; ++lane) {
          for (int g = 0; g < Group; ++g) scores[at(lane)][at(g)] += before[at(lane ^ offset)][at(g)];
        }
      }
      float chunk_largest[Group];
      for (int g = 0; g < Group; ++g) chunk_largest[g] = -INFINITY;
      for (int lane = 0; lane < kLanes; ++lane) {
        for (int g = 0; g < Group; ++g) chunk_largest[g] = fmaxf(chunk_largest[g], scores[at(lane)][at(g)]);
      }
      for (int lane = 0; lane < kLanes; ++lane) {
        float score[Group];
        float weight[Group];
        for (int g = 0; g < Group; ++g) score[g] = scores[at(lane)][at(g)];
        chunk_weights(lanes[at(lane)], score, chunk_largest, lane % lanes_per_key == 0, weight);
        for (int g = 0; g < Group; ++g) weights[at(lane)][at(g)] = weight[g];
      }
      const int count = std::min(chunk_keys, b.end - chunk);
      for (int lane = 0; lane < kLanes; ++lane) {
        const ValueLane v(b.head_dim, lane);
        if (v.idle()) continue;
        for (int j = v.row; j < count; j += v.rows) {
          float key_weight[Group];
          for (int g = 0; g < Group; ++g) key_weight[g] = weights[at(j * lanes_per_key)][at(g)];
          lane_add_value(lanes[at(lane)], b, chunk + j, v, key_weight);
        }
      }
    }
    // The rows of the passes summed into row 0's lanes.
    for (int lane = 0; lane < kLanes; ++lane) {
      const ValueLane v(b.head_dim, lane);
      if (v.row == 0) {
        for (int other = lane + v.lanes_per_row; other < kLanes; other += v.lanes_per_row) {
          for (int g = 0; g < Group; ++g) {
            for (int i = 0; i < kKeyVector; ++i) lanes[at(lane)].acc[g][i] += lanes[at(other)].acc[g][i];
          }
        }
      }
    }
    float sum[Group];
    for (int g = 0; g < Group; ++g) {
      sum[g] = 0.0F;
      for (const LaneState<Group>& s : lanes) sum[g] += s.sum[g];
    }
    for (int lane = 0; lane < kLanes; ++lane) {
      lane_store(lanes[at(lane)], b, sum, ValueLane(b.head_dim, lane), warp, lane, merge);
    }
  }
}

// finish_attention() as one thread; the splits of a row run in order, so the
// last to count is the last split.
void host_finish_attention(const AttentionBlock& b, const float* merge, const AttentionWorkspace& workspace,
                           int row_kv, int split, int grid_splits) {
  const int elements = b.group * b.head_dim;
  if (b.splits == 1) {
    for (int i = 0; i < elements; ++i) merge_output(b, merge, i);
    return;
  }
  float* partials = row_partials(b, workspace, row_kv, grid_splits);
  for (int i = 0; i < elements; ++i) store_partial(b, merge, partials, split, i);
  if (workspace.counters[row_kv]++ != static_cast<unsigned>(b.splits - 1)) return;
  for (int i = 0; i < elements; ++i) merge_partials(b, partials, i);
  workspace.counters[row_kv] = 0;
}

void host_decode_attention(const __half* q, const __half* cache_k, const __half* cache_v, const std::int64_t* slots,
                           const std::int64_t* positions, __half* out, int rows, int heads, int kv_heads, int head_dim,
                           std::int64_t max_len, int context, float scale, const AttentionWorkspace& workspace,
                           cudaStream_t /*stream*/) {
  const std::size_t shared_floats =
      check_attention_call("decode_attention", heads, kv_heads, head_dim, context, cache_k, cache_v, workspace);
  std::vector<float> shared(shared_floats);
  const int grid_splits = attention_splits(context);
  for (int r = 0; r < rows; ++r) {
    for (int kv = 0; kv < kv_heads; ++kv) {
      for (int split = 0; split < grid_splits; ++split) {
        const AttentionBlock b = attention_block(q, cache_k, cache_v, slots, positions, out, heads, kv_heads, head_dim,
                                                 max_len, context, r, kv, split);
        if (b.first >= b.keys) continue;
        for (int i = 0; i < b.group * head_dim; ++i) attention_load_queries(b, shared.data(), scale, i);
        float* merge = shared.data() + b.group * head_dim;
        with_query_group(b.group, [&](auto group) { host_attend<group()>(b, shared.data(), merge); });
        host_finish_attention(b, merge, workspace, r * kv_heads + kv, split, grid_splits);
      }
    }
  }
}

void host_rotary_attention(const __half* qkv, std::int64_t qkv_stride, const __half* cos, const __half* sin,
                           const std::int64_t* positions, const std::int64_t* slots, __half* cache_k, __half* cache_v,
                           __half* out, int rows, int heads, int kv_heads, int head_dim, std::int64_t max_len,
                           int context, float scale, const AttentionWorkspace& workspace, cudaStream_t /*stream*/) {
  const std::size_t shared_floats =
      check_attention_call("rotary_attention", heads, kv_heads, head_dim, context, cache_k, cache_v, workspace);
  const int group = heads / kv_heads;
  std::vector<float> shared(shared_floats);
  const int grid_splits = attention_splits(context);
  for (int r = 0; r < rows; ++r) {
    for (int kv = 0; kv < kv_heads; ++kv) {
      for (int split = 0; split < grid_splits; ++split) {
        const AttentionBlock b = attention_block(nullptr, cache_k, cache_v, slots, positions, out, heads, kv_heads,
                                                 head_dim, max_len, context, r, kv, split);
        if (b.first >= b.keys) continue;
        const __half* row = qkv + r * qkv_stride;
        const std::int64_t position = positions[r];
        for (int i = 0; i < group * head_dim; ++i) {
          rotary_query(row, cos, sin, position, kv * group, head_dim, scale, shared.data(), i);
        }
        if (split == b.splits - 1) {
          for (int d = 0; d < head_dim; ++d) {
            rotary_key_value(row, cos, sin, position, heads, kv_heads, kv, head_dim,
                             const_cast<__half*>(b.k) + position * head_dim,
                             const_cast<__half*>(b.v) + position * head_dim, d);
          }
        }
        float* merge = shared.data() + group * head_dim;
        with_query_group(group, [&](auto g) { host_attend<g()>(b, shared.data(), merge); });
        host_finish_attention(b, merge, workspace, r * kv_heads + kv, split, grid_splits);
      }
    }
  }
}

// The block's threads in turn, each keeping its vectors (as its registers).
void host_add_rms_norm(__half* x, const __half* delta, const __half* weight, __half* out, int rows, int width,
                       float eps, cudaStream_t /*stream*/) {
  check_norm_width(width);
  check_aligned(x, "x", "add_rms_norm");
  if (delta != nullptr) check_aligned(delta, "delta", "add_rms_norm");
  check_aligned(weight, "the weight", "add_rms_norm");
  check_aligned(out, "out", "add_rms_norm");
  std::vector<NormThread> threads(kThreads);
  for (int r = 0; r < rows; ++r) {
    const std::int64_t base = static_cast<std::int64_t>(r) * width;
    float squares = 0.0F;
    for (int tid = 0; tid < kThreads; ++tid) {
      squares += norm_load_add(threads[static_cast<std::size_t>(tid)], x + base,
                               delta == nullptr ? nullptr : delta + base, weight, width, tid, kThreads);
    }
    const float inverse_rms = inverse_sqrt(squares / static_cast<float>(width) + eps);
    for (int tid = 0; tid < kThreads; ++tid) {
      norm_store(threads[static_cast<std::size_t>(tid)], out + base, width, inverse_rms, tid, kThreads);
    }
  }
}

void host_silu_mul(const __half* gate_up, __half* out, int rows, int width, cudaStream_t /*stream*/) {
  for (std::int64_t r = 0; r < rows; ++r) {
    for (int i = 0; i < width; ++i) out[r * width + i] = silu_times(gate_up[r * 2 * width + i], gate_up[r * 2 * width + width + i]);
  }
}

// A GEMV block's sum of weight row `w` against input row r, as one thread:
// each of the block's threads' sums in turn (its vectors in order), then each
// warp's butterfly of shuffles over its lanes' sums, then the warps' sums in
// order. `lanes`: linear_threads(in) floats of scratch.
template <bool Gated>
float host_block_sum(const __half* x, const __half* w, int in, int r, std::vector<float>& lanes) {
  const int threads = linear_threads(in);
  const int vectors = in / kVectorHalves;
  for (int tid = 0; tid < threads; ++tid) {
    float acc = 0.0F;
    for (int v = tid; v < vectors; v += threads) {
      acc = dot_vector(acc, load_weight_vector(w + v * kVectorHalves), linear_input<Gated>(x, in, r, v * kVectorHalves));
    }
    lanes[static_cast<std::size_t>(tid)] = acc;
  }
  float total = 0.0F;
  for (int warp = 0; warp < threads / 32; ++warp) {
    float* lane = lanes.data() + warp * 32;
    for (int offset = 16; offset > 0; offset /= 2) {
      float next[32];
      for (int l = 0; l < 32; ++l) next[l] = lane[l] + lane[l ^ offset];
      std::memcpy(lane, next, sizeof(next));
    }
    total += lane[0];
  }
  return total;
}

// Element e of a vector of halves, as a float.
inline float vector_element(const HalfVector& v, int e) {
  const float2 pair = __half22float2(v.h[e / 2]);
  return e % 2 == 0 ? pair.x : pair.y;
}

// A narrow block's sum of weight row `w` against input row r, as one thread:
// each warp's chunks in turn (warp w: w, w + kNarrowWarps, ...), each chunk's
// two mma steps as their 16 products summed in the step's k order (the tensor
// cores' sums within a step are in an order of their own; this proves the
// tiling and the k positions), then the warps' sums in order.
template <bool Gated>
float host_narrow_sum(const __half* x, const __half* w, int in, int r) {
  constexpr int kThreadsPerRow = kNarrowChunk / kVectorHalves;  // t = 0 .. 3
  const int vectors = in / kVectorHalves;
  const int chunks = (in + kNarrowChunk - 1) / kNarrowChunk;
  float total = 0.0F;
  for (int warp = 0; warp < kNarrowWarps; ++warp) {
    float acc = 0.0F;
    for (int chunk = warp; chunk < chunks; chunk += kNarrowWarps) {
      std::array<HalfVector, kThreadsPerRow> weights{};
      std::array<HalfVector, kThreadsPerRow> inputs{};
      for (int t = 0; t < kThreadsPerRow; ++t) {
        const int v = chunk * kThreadsPerRow + t;
        if (v >= vectors) continue;
        weights[static_cast<std::size_t>(t)] = load_weight_vector(w + v * kVectorHalves);
        inputs[static_cast<std::size_t>(t)] = linear_input<Gated>(x, in, r, v * kVectorHalves);
      }
      for (int step = 0; step < 2; ++step) {
        float product = 0.0F;
        for (int k = 0; k < 16; ++k) {  // k = 2t + e and 2t + 8 + e take halves 4 step + e and 4 step + 2 + e
          const auto t = static_cast<std::size_t>((k % 8) / 2);
          const int e = 4 * step + (k >= 8 ? 2 : 0) + k % 2;
          product = fmaf(vector_element(weights[t], e), vector_element(inputs[t], e), product);
        }
        acc += product;
      }
    }
    total += acc;
  }
  return total;
}

// A GEMV's (Block = LinearBlock) or narrow product's (NarrowBlock) blocks,
// 1 to kMaxGemvRows rows, as one thread: block b's slots (plain_at,
// or paired_at for gate_up_silu) summed as that kernel sums them, then
// store(block, sums, r) for each input row r.
template <class Block, bool Gated, class Store>
void host_product_blocks(const __half* x, const __half* weight, int rows, int in, int outputs, bool paired,
                         Store store) {
  std::vector<float> lanes;  // the GEMV's
  if constexpr (std::is_same_v<Block, LinearBlock>) lanes.resize(static_cast<std::size_t>(linear_threads(in)));
  const int per_block = paired ? Block::kPairs : Block::kSlots;
  for (int b = 0; b < (outputs + per_block - 1) / per_block; ++b) {
    const Block block = paired ? Block::paired_at(b, outputs) : Block::plain_at(b, outputs);
    for (int r = 0; r < rows; ++r) {
      std::array<float, Block::kSlots> sums{};
      for (int slot = 0; slot < Block::kSlots; ++slot) {
        if (!block.holds(slot)) continue;
        const __half* w = weight_row(weight, in, block.weight_row_of(slot));
        if constexpr (std::is_same_v<Block, NarrowBlock>) {
          sums[static_cast<std::size_t>(slot)] = host_narrow_sum<Gated>(x, w, in, r);
        } else {
          sums[static_cast<std::size_t>(slot)] = host_block_sum<Gated>(x, w, in, r, lanes);
        }
      }
      store(block, sums, r);
    }
  }
}

// The GEMV's or the narrow product's blocks (as uses_narrow_product() picks) as one thread.
template <bool Gated>
void host_linear_product(const __half* x, const __half* weight, __half* y, int rows, int in, int out) {
  const auto store = [&](const auto& block, const auto& sums, int r) {
    for (int j = 0; j < block.outputs; ++j) {
      y[static_cast<std::int64_t>(r) * out + block.first + j] = __float2half(sums[static_cast<std::size_t>(j)]);
    }
  };
  if (!uses_narrow_product(rows)) {
    host_product_blocks<LinearBlock, Gated>(x, weight, rows, in, out, false, store);
  } else {
    host_product_blocks<NarrowBlock, Gated>(x, weight, rows, in, out, false, store);
  }
}

// The skinny kernel's blocks as one thread, in split order (so the last to
// count is the last split): each warp's 16x16x16 products over its steps
// (the tensor cores' sums within a product are in an order of their own;
// this proves the tiling and indexing), the warps summed in order, the
// splits through the workspace.
template <bool Gated>
void host_skinny_product(const __half* x, const __half* weight, __half* y, int rows, int in, int out,
                         const LinearWorkspace& workspace) {
  const SkinnySplit split = skinny_split(in, out);
  const int steps = in / kSkinnyStep;
  const auto input = [&](int r, int k) {
    if constexpr (Gated) {
      const __half* row = x + static_cast<std::int64_t>(r) * 2 * in;
      return __half2float(silu_times(row[k], row[in + k]));
    } else {
      return __half2float(x[static_cast<std::int64_t>(r) * in + k]);
    }
  };
  std::vector<float> sums(static_cast<std::size_t>(kSkinnyWarps * rows * kSkinnyOutputs));
  for (int tile = 0; tile < out / kSkinnyOutputs; ++tile) {
    const int first_output = tile * kSkinnyOutputs;
    for (int s = 0; s < split.splits; ++s) {
      const int end = std::min((s + 1) * split.steps_per_split, steps);
      std::fill(sums.begin(), sums.end(), 0.0F);
      for (int warp = 0; warp < kSkinnyWarps; ++warp) {
        float* mine = sums.data() + static_cast<std::ptrdiff_t>(warp) * rows * kSkinnyOutputs;
        for (int step = s * split.steps_per_split + warp; step < end; step += kSkinnyWarps) {
          for (int r = 0; r < rows; ++r) {
            for (int n = 0; n < kSkinnyOutputs; ++n) {
              const __half* w = weight_row(weight, in, first_output + n) + step * kSkinnyStep;
              float product = 0.0F;
              for (int k = 0; k < kSkinnyStep; ++k) {
                product = fmaf(input(r, step * kSkinnyStep + k), __half2float(w[k]), product);
              }
              mine[r * kSkinnyOutputs + n] += product;
            }
          }
        }
      }
      const int elements = rows * kSkinnyOutputs;
      for (int i = 0; i < elements; ++i) {
        const int r = i / kSkinnyOutputs;
        const int n = i % kSkinnyOutputs;
        float total = 0.0F;
        for (int w = 0; w < kSkinnyWarps; ++w) total += sums[static_cast<std::size_t>(w * elements + i)];
        if (split.splits == 1) {
          y[static_cast<std::int64_t>(r) * out + first_output + n] = __float2half(total);
        } else {
          workspace.partials[skinny_partial_index(s, rows, r, out, first_output + n)] = total;
        }
      }
      if (split.splits == 1) continue;
      if (workspace.counters[tile]++ != static_cast<unsigned>(split.splits - 1)) continue;
      for (int i = 0; i < elements; ++i) {
        const int r = i / kSkinnyOutputs;
        const int n = i % kSkinnyOutputs;
        float total = 0.0F;
        for (int p = 0; p < split.splits; ++p) {
          total += workspace.partials[skinny_partial_index(p, rows, r, out, first_output + n)];
        }
        y[static_cast<std::int64_t>(r) * out + first_output + n] = __float2half(total);
      }
      workspace.counters[tile] = 0;
    }
  }
}

// host_linear() and host_gated_linear(): the GEMV's or the skinny GEMM's host version, as launch_linear() picks.
template <bool Gated>
void host_product(const __half* x, const __half* weight, __half* y, int rows, int in, int out,
                  const LinearWorkspace& workspace) {
  check_linear_call(Gated ? "gated_linear" : "linear", x, weight, rows, in, out, workspace);
  if (rows <= kMaxGemvRows) {
    host_linear_product<Gated>(x, weight, y, rows, in, out);
  } else {
    host_skinny_product<Gated>(x, weight, y, rows, in, out, workspace);
  }
}

void host_linear(const __half* x, const __half* weight, __half* y, int rows, int in, int out,
                 const LinearWorkspace& workspace, cudaStream_t /*stream*/) {
  host_product<false>(x, weight, y, rows, in, out, workspace);
}

void host_gated_linear(const __half* gate_up, const __half* weight, __half* y, int rows, int in, int out,
                       const LinearWorkspace& workspace, cudaStream_t /*stream*/) {
  host_product<true>(gate_up, weight, y, rows, in, out, workspace);
}

// gate_up_silu_kernel's or narrow_gate_up_silu_kernel's blocks (as
// uses_narrow_product() picks) as one thread: each block's gate and up
// slots (paired_at) summed as that kernel sums them, then the epilogue's
// paired_output() for its outputs.
void host_gate_up_silu(const __half* x, const __half* gate_up, __half* out, int rows, int in, int width,
                       cudaStream_t /*stream*/) {
  check_gate_up_silu_call(x, gate_up, rows, in, width);
  const auto store = [&](const auto& block, const auto& sums, int r) {
    for (int j = 0; j < block.outputs; ++j) {
      out[static_cast<std::int64_t>(r) * width + block.first + j] = paired_output(
          sums[static_cast<std::size_t>(j)], sums[static_cast<std::size_t>(block.up_slot(j))]);
    }
  };
  if (!uses_narrow_product(rows)) {
    host_product_blocks<LinearBlock, false>(x, gate_up, rows, in, width, true, store);
  } else {
    host_product_blocks<NarrowBlock, false>(x, gate_up, rows, in, width, true, store);
  }
}

// add_rms_norm()'s host version on a copy of x, then linear()'s: what the
// two kernels compute, the sum kept in x_out.
void host_norm_linear(const __half* x, const __half* delta, const __half* norm_weight, float eps, __half* x_out,
                      const __half* weight, __half* y, int rows, int in, int out, const LinearWorkspace& workspace,
                      cudaStream_t stream) {
  check_norm_linear_call(x, delta, norm_weight, x_out, weight, rows, in, out, workspace);
  struct alignas(32) Aligned {
    __half values[16];
  };
  const std::size_t blocks = (static_cast<std::size_t>(in) + 15) / 16;
  std::vector<Aligned> residual(blocks);
  std::vector<Aligned> normed(blocks);
  __half* sum = residual.front().values;
  std::memcpy(static_cast<void*>(sum), x, static_cast<std::size_t>(in) * sizeof(__half));
  host_add_rms_norm(sum, delta, norm_weight, normed.front().values, 1, in, eps, stream);
  if (delta != nullptr) std::memcpy(static_cast<void*>(x_out), sum, static_cast<std::size_t>(in) * sizeof(__half));
  host_linear(normed.front().values, weight, y, 1, in, out, workspace, stream);
}

void host_step_inputs(const StepRows& state, std::int64_t* live_slots, std::int64_t* live_positions,
                      cudaStream_t /*stream*/) {
  check_step_rows(state);
  for (int r = 0; r < state.rows; ++r) step_inputs_row(state, live_slots, live_positions, r);
}

void host_step_update(const StepRows& state, const std::int64_t* next, cudaStream_t /*stream*/) {
  check_step_rows(state);
  const std::int64_t step = state.loop[0];
  bool any_live = false;
  for (int r = 0; r < state.rows; ++r) any_live = step_update_row(state, next, step, r) || any_live;
  step_update_loop(state, any_live);
}

}  // namespace

void check_norm_width(int width) {
  if (width < kKeyVector || width % kKeyVector != 0 || width > kNormVectors * kKeyVector * kThreads) {
    throw std::invalid_argument("fused add_rms_norm: a row of " + std::to_string(width) + " halves; it takes a multiple of " +
                                std::to_string(kKeyVector) + " up to " + std::to_string(kNormVectors * kKeyVector * kThreads));
  }
}

void set_programmatic_launches(ProgrammaticLaunches where) {
  programmatic_launches_set.store(where, std::memory_order_relaxed);
}

ProgrammaticLaunches programmatic_launches() { return programmatic_launches_set.load(std::memory_order_relaxed); }

std::optional<bool> OwnCapturedKernels::follows_own(const CaptureDependencies& dependencies) const {
  if (dependencies.status != cudaStreamCaptureStatusActive) return std::nullopt;
  if (dependencies.count == 0) return true;
  if (capture_ != dependencies.capture) return false;
  for (std::size_t i = 0; i < dependencies.count; ++i) {
    if (dependencies.edges != nullptr) {
      const cudaGraphEdgeData& edge = dependencies.edges[i];
      if (edge.from_port != 0 || edge.to_port != 0 || edge.type != cudaGraphDependencyTypeDefault) return false;
    }
    // From the back: the node a launch follows is most often the last one added.
    if (std::find(nodes_.rbegin(), nodes_.rend(), dependencies.nodes[i]) == nodes_.rend()) return false;
  }
  return true;
}

void OwnCapturedKernels::record_launch(const CaptureDependencies& after) {
  if (after.status != cudaStreamCaptureStatusActive || after.count != 1) return;
  if (capture_ != after.capture) {
    nodes_.clear();
    capture_ = after.capture;
  }
  nodes_.push_back(after.nodes[0]);
}

bool launch_programmatically(ProgrammaticLaunches where, std::optional<bool> follows_own_kernels) {
  switch (where) {
    case ProgrammaticLaunches::off:
      return false;
    case ProgrammaticLaunches::after_own_kernels:
      return follows_own_kernels.value_or(true);
    case ProgrammaticLaunches::always:
      break;
  }
  return true;
}

void set_fold_norms(bool enabled) { fold_norms_on.store(enabled, std::memory_order_relaxed); }

bool fold_norms() { return fold_norms_on.load(std::memory_order_relaxed); }

bool folds_norms(int rows, int hidden, int qkv_width, int gate_up_width, int vocab) {
  return fold_norms() && rows == 1 && use_own_product(rows, hidden, qkv_width) &&
         use_own_product(rows, hidden, gate_up_width) && use_own_product(rows, hidden, vocab);
}

void set_own_products_at(ProductRowCounts row_counts) {
  const std::scoped_lock lock(process_wide_sets_lock);
  process_wide_sets.own = row_counts;
}

ProductRowCounts own_products_at() {
  const std::scoped_lock lock(process_wide_sets_lock);
  return process_wide_sets.own;
}

namespace {
// The fewest rows among `counts` (which holds some).
int first_count(ProductRowCounts counts) {
  int rows = 1;
  while (!counts.test(static_cast<std::size_t>(rows - 1))) ++rows;
  return rows;
}
}  // namespace

void check_narrow_products(ProductRowCounts row_counts) {
  const ProductRowCounts outside = row_counts & ~kNarrowRowCounts;
  if (outside.any()) {
    throw std::invalid_argument("fused: narrow products at " + std::to_string(first_count(outside)) +
                                " rows; they take " + std::to_string(kMinNarrowRows) + " to " +
                                std::to_string(kMaxGemvRows));
  }
}

void check_product_sets(const ProductSets& sets) {
  check_narrow_products(sets.narrow);
  const ProductRowCounts without_own = sets.narrow & ~sets.own;
  if (without_own.any()) {
    throw std::invalid_argument("fused: narrow products at " + std::to_string(first_count(without_own)) +
                                " rows, where the own products are not used (it would change nothing)");
  }
}

void set_narrow_products_at(ProductRowCounts row_counts) {
  check_narrow_products(row_counts);
  const std::scoped_lock lock(process_wide_sets_lock);
  process_wide_sets.narrow = row_counts;
}

void set_product_sets(const ProductSets& sets) {
  check_product_sets(sets);
  const std::scoped_lock lock(process_wide_sets_lock);
  process_wide_sets = sets;
}

ProductSets product_sets_in_force() {
  if (thread_product_sets.has_value()) return *thread_product_sets;
  const std::scoped_lock lock(process_wide_sets_lock);
  return process_wide_sets;
}

ThreadProductSets::ThreadProductSets(const std::optional<ProductSets>& sets) {
  if (!sets.has_value()) return;
  check_narrow_products(sets->narrow);
  previous_ = thread_product_sets;
  thread_product_sets = *sets;
  opened_ = true;
}

ThreadProductSets::~ThreadProductSets() {
  if (opened_) thread_product_sets = previous_;
}

ProductRowCounts narrow_products_at() {
  const std::scoped_lock lock(process_wide_sets_lock);
  return process_wide_sets.narrow;
}

int narrow_chunks_in_flight(int in) {
  const int forced = forced_narrow_chunks_in_flight();
  return forced != 0 ? forced : narrow_unroll(in);
}

void force_narrow_chunks_in_flight(int chunks) {
  if (chunks != 0 && chunks != kNarrowUnroll && chunks != kNarrowDeepUnroll) {
    throw std::invalid_argument("fused: " + std::to_string(chunks) + " chunks in flight for the narrow products; " +
                                "they keep " + std::to_string(kNarrowUnroll) + " or " +
                                std::to_string(kNarrowDeepUnroll) + " (0: by the width)");
  }
  narrow_chunks_forced.store(chunks, std::memory_order_relaxed);
}

int forced_narrow_chunks_in_flight() { return narrow_chunks_forced.load(std::memory_order_relaxed); }

ProductRowCounts product_rows_up_to(int rows) {
  if (rows < 0 || rows > kMaxSkinnyRows) {
    throw std::invalid_argument("fused: own products for up to " + std::to_string(rows) + " rows; it takes 0 to " +
                                std::to_string(kMaxSkinnyRows));
  }
  ProductRowCounts counts;
  for (int r = 1; r <= rows; ++r) counts.set(static_cast<std::size_t>(r - 1));
  return counts;
}

ProductRowCounts product_rows_of(const std::vector<int>& counts) {
  ProductRowCounts set;
  for (const int rows : counts) {
    if (rows < 1 || rows > kMaxSkinnyRows) {
      throw std::invalid_argument("fused: own products at " + std::to_string(rows) + " rows; a count is 1 to " +
                                  std::to_string(kMaxSkinnyRows));
    }
    set.set(static_cast<std::size_t>(rows - 1));
  }
  return set;
}

std::vector<int> product_row_list(ProductRowCounts row_counts) {
  std::vector<int> rows;
  for (int r = 1; r <= kMaxSkinnyRows; ++r) {
    if (row_counts.test(static_cast<std::size_t>(r - 1))) rows.push_back(r);
  }
  return rows;
}

std::string describe_product_rows(ProductRowCounts row_counts) {
  const std::vector<int> rows = product_row_list(row_counts);
  if (rows.empty()) return "none";
  std::vector<std::string> runs;  // "4", or "1 to 8" for three or more in a row
  for (std::size_t first = 0; first < rows.size();) {
    std::size_t last = first;
    while (last + 1 < rows.size() && rows[last + 1] == rows[last] + 1) ++last;
    if (last - first >= 2) {
      runs.push_back(std::to_string(rows[first]) + " to " + std::to_string(rows[last]));
    } else {
      for (std::size_t i = first; i <= last; ++i) runs.push_back(std::to_string(rows[i]));
    }
    first = last + 1;
  }
  std::string words = runs.front();
  for (std::size_t i = 1; i < runs.size(); ++i) words += (i + 1 == runs.size() ? " and " : ", ") + runs[i];
  return words;
}

void set_own_product_rows(int rows) { set_own_products_at(product_rows_up_to(rows)); }

bool use_own_product(int rows, int in, int out) {
  return rows >= 1 && rows <= kMaxSkinnyRows &&
         product_sets_in_force().own.test(static_cast<std::size_t>(rows - 1)) && linear_fits(rows, in, out);
}

bool linear_fits(int rows, int in, int out) {
  if (in < kVectorHalves || in % kVectorHalves != 0 || out < 1) return false;
  if (rows >= 1 && rows <= kMaxGemvRows) return true;
  return rows >= 16 && rows <= kMaxSkinnyRows && rows % 16 == 0 && in % kSkinnyStep == 0 &&
         out % kSkinnyOutputs == 0;
}

void check_linear_shape(int rows, int in, int out) {
  if (!linear_fits(rows, in, out)) {
    throw std::invalid_argument("fused linear: " + std::to_string(rows) + " rows of " + std::to_string(in) +
                                " halves into " + std::to_string(out) + " outputs; it takes 1 to " +
                                std::to_string(kMaxGemvRows) + " rows of a positive multiple of " +
                                std::to_string(kVectorHalves) + " halves into at least one output, or 16, 32, 48 or " +
                                std::to_string(kMaxSkinnyRows) + " rows of a multiple of " +
                                std::to_string(kSkinnyStep) + " halves into a multiple of " +
                                std::to_string(kSkinnyOutputs) + " outputs");
  }
}

std::size_t linear_partial_floats(int rows, int in, int out) {
  if (!linear_fits(rows, in, out) || rows <= kMaxGemvRows) return 0;
  const SkinnySplit split = skinny_split(in, out);
  if (split.splits <= 1) return 0;
  return static_cast<std::size_t>(split.splits) * static_cast<std::size_t>(rows) * static_cast<std::size_t>(out);
}

std::size_t linear_counters(int out) {
  return out < kSkinnyOutputs ? 0 : static_cast<std::size_t>(out / kSkinnyOutputs);
}

void check_attention_shape(int heads, int kv_heads, int head_dim) {
  if (kv_heads < 1 || heads < 1 || heads % kv_heads != 0 || heads / kv_heads > kMaxQueryGroup) {
    throw std::invalid_argument("fused decode_attention: " + std::to_string(heads) + " query heads over " +
                                std::to_string(kv_heads) + " key/value heads; it takes a multiple, at most " +
                                std::to_string(kMaxQueryGroup) + " query heads per key/value head");
  }
  if (head_dim < kKeyVector || head_dim % kKeyVector != 0 || head_dim > kMaxHeadDim) {
    throw std::invalid_argument("fused decode_attention: head_dim " + std::to_string(head_dim) +
                                "; it takes a multiple of " + std::to_string(kKeyVector) + " up to " +
                                std::to_string(kMaxHeadDim));
  }
  const std::size_t shared = attention_shared_floats(heads / kv_heads, head_dim) * sizeof(float);
  if (shared > kAttentionSharedLimit) {
    throw std::invalid_argument("fused decode_attention: " + std::to_string(heads / kv_heads) +
                                " query heads per key/value head of width " + std::to_string(head_dim) + " need " +
                                std::to_string(shared) + " bytes of shared memory; it takes at most " +
                                std::to_string(kAttentionSharedLimit));
  }
}

std::size_t attention_partial_floats(int rows, int heads, int kv_heads, int head_dim, int context) {
  const int splits = attention_splits(context);
  if (splits <= 1 || kv_heads < 1) return 0;
  return static_cast<std::size_t>(rows) * static_cast<std::size_t>(kv_heads) * static_cast<std::size_t>(splits) *
         static_cast<std::size_t>(partial_floats(heads / kv_heads, head_dim));
}

const Kernels& kernels() {
  static constexpr Kernels table{rotary_and_cache_write, decode_attention, rotary_attention, add_rms_norm,
                                 linear,                 gated_linear,     silu_mul,         step_inputs,
                                 step_update,            norm_linear,      gate_up_silu};
  return table;
}

const Kernels& host_kernels() {
  static constexpr Kernels table{host_rotary_and_cache_write, host_decode_attention, host_rotary_attention,
                                 host_add_rms_norm,           host_linear,           host_gated_linear,
                                 host_silu_mul,               host_step_inputs,      host_step_update,
                                 host_norm_linear,            host_gate_up_silu};
  return table;
}

}  // namespace llm_decode::fused
