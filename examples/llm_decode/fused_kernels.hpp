#pragma once
// Fused CUDA kernels for the decode step (DecodeKernels::fused in model.hpp):
// what torch.compile's Inductor does to the same math, written by hand. The
// plain step issues about 20 ATen operators per layer; with these it issues
// 8 (4 products, 4 of these), and 2 for the step's bookkeeping instead of
// about 20. Defined in fused_kernels.cu (nvcc); declared here with plain
// types for the libtorch side. Each launch is checked
// (replay::check_last_launch) and runs on the given stream, so a capture of
// that stream records it. host_kernels() runs the kernels' code over host
// memory, one thread at a time: what the tests check the math and the
// indexing with where there is no GPU.
#include <bitset>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

namespace llm_decode::fused {

// The most query heads per key/value head decode_attention() handles, and the
// widest head (a value row is head_dim / 8 lanes' 16-byte loads, at most a
// warp's 32 lanes; keys are read 8 halves at a time).
inline constexpr int kMaxQueryGroup = 8;
inline constexpr int kMaxHeadDim = 256;

// The attention splits a row's keys kSplitKeys at a time over as many blocks
// per (row, key/value head), so a long context is read by many blocks at
// once rather than by one in turn (the split-K of flash decoding). A row's
// result depends on its keys alone: the same for any context that holds them.
inline constexpr int kSplitKeys = 256;

// Blocks per (row, key/value head) of an attention call over `context`
// positions: ceil(context / kSplitKeys).
__host__ __device__ inline constexpr int attention_splits(int context) {
  return (context + kSplitKeys - 1) / kSplitKeys;
}

// Where the blocks of a split row leave their states and count themselves
// in; needed when attention_splits(context) > 1 (the calls refuse null
// pointers then). `partials`: attention_partial_floats() floats, any
// contents. `counters`: rows * kv_heads, zero before a call and left zero
// after it, so one set serves every layer of a step in stream order; two
// calls running at once need their own.
struct AttentionWorkspace {
  float* partials = nullptr;
  unsigned int* counters = nullptr;
};

// Floats of AttentionWorkspace::partials for `rows` rows over `context`
// positions: 0 when one block per (row, key/value head) attends.
std::size_t attention_partial_floats(int rows, int heads, int kv_heads, int head_dim, int context);

// Throws std::invalid_argument, naming the sizes, for a head layout
// decode_attention() cannot take: heads not a multiple of kv_heads, more than
// kMaxQueryGroup query heads per key/value head, a head_dim that is not a
// multiple of 8 or over kMaxHeadDim, or a group and head_dim whose scaled
// queries and warps' states, 4 * group * (head_dim + 8 * (head_dim + 2))
// bytes of shared memory, exceed the 48 KB a kernel gets without opting in
// (groups 6 to 8 at width 256, 8 at 192). Any context length is fine.
void check_attention_shape(int heads, int kv_heads, int head_dim);

// The products of the step (Kernels::linear, Kernels::gated_linear), chosen
// by rows: for 1 to kMaxGemvRows rows a GEMV (16-byte loads of each weight
// row, fp32 sums on the CUDA cores), or at the counts the narrow set in
// force holds (product_sets_in_force(); 2 to kMaxGemvRows) a narrow product on
// the tensor cores (mma 16x8x16 with the rows as its 8-wide side, 16 weight
// rows a block, fp16 in, fp32 sums); for 16, 32, 48 or 64 rows a skinny
// GEMM on the tensor cores (WMMA 16x16x16), each weight read once, its
// input width split over blocks (split-K) where the outputs alone would
// give too few. Other row counts are refused: the caller uses a library
// GEMM (cuBLAS through at::linear) there.
inline constexpr int kMaxGemvRows = 8;
inline constexpr int kMinNarrowRows = 2;
inline constexpr int kMaxSkinnyRows = 64;
inline constexpr int kSkinnyOutputs = 32;  // a skinny block's outputs (two 16-wide tiles)

// Whether linear() and gated_linear() take this product: 1..kMaxGemvRows
// rows, or a multiple of 16 up to kMaxSkinnyRows rows with `out` a multiple
// of kSkinnyOutputs and `in` a multiple of 16; `in` a positive multiple of 8.
bool linear_fits(int rows, int in, int out);

// Throws std::invalid_argument, naming the sizes, where linear_fits() is false.
void check_linear_shape(int rows, int in, int out);

// The row counts at which the decode step uses these products rather than
// cuBLAS (through at::linear), where linear_fits() takes the shape: rows r
// at bit r - 1. Default: 1 row. On an H100 (the tuning's timings, context
// 64, docs/llm_decode.md), at 2 / 4 / 8 rows the GEMV made the `small`
// step 1.38 / 1.22 / 0.95x as fast as with cuBLAS's products and the `1b`
// step 1.12 / 0.86 / 0.53x, so no one row count suits both, and a model may
// want its own products at some counts and not at others. At 64 rows the skinny
// GEMM lost by far (`small`: 1.273 against 0.511 ms): it reads its input
// from L2 once per tile. Process-wide, read when a step is issued, so a
// graph keeps what was set when it was captured (a thread's
// ThreadProductSets, below, takes its place; an executor fixes its sets,
// its own or those in force, when it is made);
// `llm_decode --own-product-rows N` (1 to N) or `--own-products-at 1,2`, or
// chosen by timing the model's step each way (product_tuning.hpp,
// `--tune-own-products`).
using ProductRowCounts = std::bitset<kMaxSkinnyRows>;
// The counts the narrow product takes, kMinNarrowRows to kMaxGemvRows.
inline constexpr ProductRowCounts kNarrowRowCounts{((1ULL << kMaxGemvRows) - 1) & ~((1ULL << (kMinNarrowRows - 1)) - 1)};
inline constexpr bool narrow_takes(int rows) { return rows >= kMinNarrowRows && rows <= kMaxGemvRows; }
void set_own_products_at(ProductRowCounts row_counts);
// A number is not a set of counts (std::bitset would take 8 as row 4 alone):
// product_rows_up_to(8) or product_rows_of({8}).
template <std::integral Number>
void set_own_products_at(Number) = delete;
ProductRowCounts own_products_at();
// 1 to `rows` rows (0: none, cuBLAS for every product). Throws
// std::invalid_argument outside 0 to kMaxSkinnyRows.
ProductRowCounts product_rows_up_to(int rows);
// Exactly these counts. Throws std::invalid_argument, naming it, for a count
// outside 1 to kMaxSkinnyRows.
ProductRowCounts product_rows_of(const std::vector<int>& counts);
// The counts in ascending order.
std::vector<int> product_row_list(ProductRowCounts row_counts);
// The counts in words: "none", "1 to 8", "1, 2 and 4".
std::string describe_product_rows(ProductRowCounts row_counts);
// set_own_products_at(product_rows_up_to(rows)).
void set_own_product_rows(int rows);

// The row counts, kMinNarrowRows to kMaxGemvRows, at which the own products
// (where own_products_at() holds the count) are the narrow tensor-core
// product rather than the GEMV; rows r at bit r - 1. Default: none. Both
// read each weight once; the narrow product's multiply-adds run on the
// tensor cores, the GEMV's on the CUDA cores, whose work grows with the
// rows, so which is faster depends on the model and the count (the
// tuning times each, product_tuning.hpp). Read when a product is issued,
// as own_products_at() is. Throws std::invalid_argument, naming it, for a
// count outside kMinNarrowRows to kMaxGemvRows.
void set_narrow_products_at(ProductRowCounts row_counts);
template <std::integral Number>
void set_narrow_products_at(Number) = delete;
ProductRowCounts narrow_products_at();
// The 32-half chunks each warp of a narrow product keeps loading at once,
// for an input `in` halves wide: by default 4, or 8 where 4 would take the
// block's warps more than one pass over the width (a block holds 16 weight
// rows only, so most wide products launch few blocks, each pass waiting for
// its own loads); where force_narrow_chunks_in_flight() set a number, that.
// Each warp sums its chunks in the same order either way, so the outputs are
// the same bits.
int narrow_chunks_in_flight(int in);
// 4 or 8 at every width, to measure one against the other; 0: by the width
// (the default). Throws std::invalid_argument for another number.
// Process-wide, read when a product is issued, so a graph keeps what was
// set when it was captured; `llm_decode --narrow-chunks-in-flight 4`.
void force_narrow_chunks_in_flight(int chunks);
int forced_narrow_chunks_in_flight();
// Throws what set_narrow_products_at() throws, setting nothing.
void check_narrow_products(ProductRowCounts row_counts);

// Both sets, as a step reads them: cuBLAS at a count `own` lacks, else the
// narrow product where `narrow` holds it, else the own product.
struct ProductSets {
  ProductRowCounts own;
  ProductRowCounts narrow;  // within kNarrowRowCounts; where `own` lacks a count, unused
  friend bool operator==(const ProductSets&, const ProductSets&) = default;
};

// Throws std::invalid_argument, naming the count, for a narrow count the
// narrow product does not take or where `own` lacks it (it would change
// nothing): what an executor's and the tuning's sets must pass.
void check_product_sets(const ProductSets& sets);

// Sets both process-wide sets at once (a thread reading them gets both old
// or both new), or neither where check_product_sets() refuses them.
void set_product_sets(const ProductSets& sets);

// The sets this thread's steps read: the innermost ThreadProductSets open
// on this thread, else the process-wide ones (own_products_at(),
// narrow_products_at()).
ProductSets product_sets_in_force();

// Until the scope ends, the steps this thread issues or captures read
// `sets` in place of the process-wide ones (no sets: the scope changes
// nothing); other threads are not affected. Scopes nest, and must end
// innermost first on the thread that opened them (as block-scoped objects
// do). What an executor opens around each of its steps
// (ExecutorOptions::products). Throws std::invalid_argument as
// check_narrow_products() does.
class ThreadProductSets {
 public:
  explicit ThreadProductSets(const std::optional<ProductSets>& sets);
  ThreadProductSets(const ThreadProductSets&) = delete;
  ThreadProductSets& operator=(const ThreadProductSets&) = delete;
  ~ThreadProductSets();

 private:
  bool opened_ = false;
  std::optional<ProductSets> previous_;  // the scope's sets it replaced, if any
};

// Whether the step computes this product with linear() / gated_linear():
// product_sets_in_force().own holds `rows` and linear_fits().
bool use_own_product(int rows, int in, int out);

// Threads per block of a GEMV over `in` input halves: one 16-byte vector of
// each weight row per thread per pass, 32 to 256 threads. Each thread sums
// its vectors in order, then the block in a fixed order: the result depends
// on the shape alone, never on the launch.
__host__ __device__ inline constexpr int linear_threads(int in) {
  const int vectors = in / 8;
  const int warps = (vectors + 31) / 32;
  return warps < 1 ? 32 : (warps > 8 ? 256 : warps * 32);
}

// Where a skinny GEMM's blocks leave their partial sums when its input width
// is split over blocks, and count themselves in (the last of an output tile
// sums the splits in order: no atomics on the sums). `partials`:
// linear_partial_floats() floats, any contents; `counters`:
// linear_counters() at zero before a call and left at zero after it, so one
// set serves every product of a step in stream order. Unused (may be null)
// where linear_partial_floats() is 0.
struct LinearWorkspace {
  float* partials = nullptr;
  unsigned int* counters = nullptr;
};

// Floats of LinearWorkspace::partials for a product: 0 unless a skinny GEMM
// splits its input width.
std::size_t linear_partial_floats(int rows, int in, int out);
// Counters of LinearWorkspace::counters for a product of `out` outputs.
std::size_t linear_counters(int out);

// Throws std::invalid_argument, naming the width, for a row add_rms_norm()
// cannot take: not a multiple of 8 halves, or over 8192.
void check_norm_width(int width);

// A step's per-row state, int64 on the device (the executor's state block):
// what the step's bookkeeping reads and writes around the model.
struct StepRows {
  int rows = 0;                      // the rows of this launch (its batch bucket)
  const std::int64_t* slots = nullptr;
  std::int64_t* positions = nullptr;
  std::int64_t* tokens = nullptr;
  const std::int64_t* limits = nullptr;  // new tokens a row may make
  std::int64_t* done = nullptr;      // 0 while the row is live
  std::int64_t* counts = nullptr;    // new tokens made so far
  std::int64_t* loop = nullptr;      // [0] the step within the launch, [1] the launch's steps, [2] keep going (0/1)
  std::int64_t* ring = nullptr;      // the launch's new tokens: ring[step * ring_stride + row], -1 for a done row
  std::int64_t ring_stride = 0;
  std::int64_t ring_steps = 0;       // rows of the ring (the steps a launch may take)
  const std::int64_t* eos = nullptr; // end-of-sequence tokens
  int eos_count = 0;
  std::int64_t spare_slot = 0;       // where done rows read and write
};

// Where the CUDA kernels are launched with programmatic stream serialization
// (where the device has it: compute capability 9.0 and later, running code
// compiled for it). The results are the same bit for bit in every mode (a
// kernel's wait and release do nothing after a plain launch). Read at each
// launch, so a graph keeps what was set when it was captured.
enum class ProgrammaticLaunches {
  // Every launch plain: to measure what the programmatic edges gain.
  off,
  // Under a capture, programmatic where every node the launch depends on is
  // a fused kernel's that this thread launched in the same capture
  // (OwnCapturedKernels); plain after torch's kernels (a cuBLAS product, the
  // embedding's index_select, a fill) and anything else. Such a kernel
  // never releases its dependents early, so a programmatic edge from it
  // gains no overlap, and it cost more than a plain one: on H100s at `1b`'s
  // batch 8, 0.64 µs from the end of cuBLAS's kernel to the start of the
  // next fused kernel, against 0.42 µs plainly (kernel traces of the
  // graphed step, the plain one on another host). Outside a capture the
  // predecessor cannot be seen: programmatic, as `always`. The default.
  after_own_kernels,
  // Programmatic after torch's kernels too.
  always,
};
void set_programmatic_launches(ProgrammaticLaunches where);
ProgrammaticLaunches programmatic_launches();

// What cudaStreamGetCaptureInfo says about a stream: whether it is
// capturing, and what the next node captured on it would depend on.
struct CaptureDependencies {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  unsigned long long capture = 0;            // the capture's id, unique in the process
  const cudaGraphNode_t* nodes = nullptr;    // the dependencies
  const cudaGraphEdgeData* edges = nullptr;  // their edges' data, beside `nodes` (null: all default)
  std::size_t count = 0;
};

// The kernel nodes one thread's fused launches added to the capture under
// way, which ProgrammaticLaunches::after_own_kernels asks about. A capture's
// id is unique in the process; a launch in another capture than the one
// held starts the record afresh, so a thread interleaving two captures
// launches some kernels plainly that could have been programmatic. Each
// thread keeps its own record: a node that another thread's launch added
// does not count. Either way the results are the same; at worst an edge
// costs a little more.
class OwnCapturedKernels {
 public:
  // For a launch whose stream reported `dependencies`: std::nullopt unless
  // the stream is capturing; otherwise whether every dependency is a node
  // record_launch() recorded in that capture, through a default edge (the
  // whole node complete, no port). True for none.
  [[nodiscard]] std::optional<bool> follows_own(const CaptureDependencies& dependencies) const;
  // After a fused launch: `after` is what its stream reported then, whose
  // one dependency, under a capture, is the launch's own node.
  void record_launch(const CaptureDependencies& after);

 private:
  std::optional<unsigned long long> capture_;  // the capture nodes_ belong to; none yet
  std::vector<cudaGraphNode_t> nodes_;
};

// What a fused launch asks for: programmatic stream serialization (true) or
// a plain launch. `follows_own_kernels`: OwnCapturedKernels::follows_own
// (std::nullopt outside a capture). The device then launches
// programmatically only where it can.
bool launch_programmatically(ProgrammaticLaunches where, std::optional<bool> follows_own_kernels);

// Whether a one-row decode step whose products are its own folds each
// residual add and RMSNorm into the product after it (Kernels::norm_linear:
// 5 kernels per layer instead of 7; default off). The same sums in the same
// order as add_rms_norm() then linear(). Read when a step is issued, so a
// graph keeps what was set when it was captured; `llm_decode --fold-norms`.
void set_fold_norms(bool enabled);
bool fold_norms();
// Whether a decode step of `rows` rows folds its norms: fold_norms(), one
// row, and the step's own products for the three products after a norm
// (hidden into qkv_width, into gate_up_width, into vocab).
bool folds_norms(int rows, int hidden, int qkv_width, int gate_up_width, int vocab);

// The kernels, as one table: kernels() launches them on `stream` (each
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
  // kMaxQueryGroup). positions[r] < context <= max_len; the keys are split
  // over blocks (kSplitKeys each) and a block's keys over its warps, each
  // keeping a running softmax (no scores stored, so no bound on the
  // context), merged at the end; float32 throughout.
  //   q: [rows, heads, head_dim]; out: [rows, heads * head_dim]
  // Throws std::invalid_argument for shapes it cannot take
  // (check_attention_shape), and for a split context without a workspace.
  void (*decode_attention)(const __half* q, const __half* cache_k, const __half* cache_v, const std::int64_t* slots,
                           const std::int64_t* positions, __half* out, int rows, int heads, int kv_heads,
                           int head_dim, std::int64_t max_len, int context, float scale,
                           const AttentionWorkspace& workspace, cudaStream_t stream);
  // rotary_and_cache_write() and decode_attention() in one kernel, for rows
  // whose slots differ (a decode step's; padding rows may share the spare
  // slot, whose contents nobody reads): each block rotates its own query
  // heads and writes its own key and value head, then attends. Not for a
  // packed prefill, whose rows read each other's keys.
  void (*rotary_attention)(const __half* qkv, std::int64_t qkv_stride, const __half* cos, const __half* sin,
                           const std::int64_t* positions, const std::int64_t* slots, __half* cache_k,
                           __half* cache_v, __half* out, int rows, int heads, int kv_heads, int head_dim,
                           std::int64_t max_len, int context, float scale, const AttentionWorkspace& workspace,
                           cudaStream_t stream);
  // The residual add and the RMSNorm after it: x += delta (rounded to fp16,
  // as the plain add), then out = x * rsqrt(mean(x^2) + eps) * weight in
  // float32, rounded once (as at::rms_norm). delta may be null: only the norm.
  //   x, delta, out: [rows, width]; weight: [width]
  void (*add_rms_norm)(__half* x, const __half* delta, const __half* weight, __half* out, int rows, int width,
                       float eps, cudaStream_t stream);
  // A product as torch's linear without bias: y = x weight^T, float32 sums
  // rounded once. The kernels of the table are launched with programmatic
  // stream serialization where set_programmatic_launches() puts it (a
  // captured step gets programmatic edges between them): each reads what
  // no kernel writes (its weights) before it waits for its predecessor.
  //   x: [rows, in]; weight: [out, in]; y: [rows, out]
  // Throws std::invalid_argument for shapes it cannot take (check_linear_shape),
  // for a split product without a workspace, and for x or weight not
  // 32-byte aligned (a tensor of its own is).
  void (*linear)(const __half* x, const __half* weight, __half* y, int rows, int in, int out,
                 const LinearWorkspace& workspace, cudaStream_t stream);
  // The same product over silu_mul()'s output computed as it is loaded (the
  // same fp16 values, never stored): y = (silu(gate) * up) weight^T.
  //   gate_up: [rows, 2 * in] (gate, then up); weight: [out, in]; y: [rows, out]
  void (*gated_linear)(const __half* gate_up, const __half* weight, __half* y, int rows, int in, int out,
                       const LinearWorkspace& workspace, cudaStream_t stream);
  // SwiGLU's product: out = silu(gate) * up in float32, rounded once.
  //   gate_up: [rows, 2 * width] (gate, then up); out: [rows, width]
  void (*silu_mul)(const __half* gate_up, __half* out, int rows, int width, cudaStream_t stream);
  // The step's bookkeeping before the model, one kernel: the slots and
  // positions the model reads and writes, done rows sent to the spare slot
  // at position 0. live_slots, live_positions: int64 [rows].
  void (*step_inputs)(const StepRows& state, std::int64_t* live_slots, std::int64_t* live_positions,
                      cudaStream_t stream);
  // The step's bookkeeping after the argmax, one kernel (one block): for each
  // live row, its next token into the ring (-1 for a done row) and into
  // tokens, its position and count advanced, done once it made its limit or
  // an end-of-sequence token; then loop[0] advanced and loop[2] = some row
  // live and loop[0] < loop[1]. What the executor's ATen bookkeeping does.
  //   next: int64 [rows], the greedy tokens
  void (*step_update)(const StepRows& state, const std::int64_t* next, cudaStream_t stream);
  // add_rms_norm() and then linear() of one row in one kernel: with
  // s = x + delta (rounded to fp16; x alone when delta is null), y = (s *
  // rsqrt(mean(s^2) + eps) * norm_weight) weight^T, the normed row never
  // stored. x is left as it is: s goes to x_out (when delta is set), a
  // buffer of its own, since every block reads x while one writes s. The
  // same values as the two kernels: each block computes the norm with
  // add_rms_norm()'s sums in its order, and the product with linear()'s.
  //   x, delta, x_out: [1, in]; norm_weight: [in]; weight: [out, in]; y: [1, out]
  // Throws std::invalid_argument for more than one row, for widths
  // add_rms_norm() or linear() cannot take, and for x_out aliasing x or delta.
  void (*norm_linear)(const __half* x, const __half* delta, const __half* norm_weight, float eps, __half* x_out,
                      const __half* weight, __half* y, int rows, int in, int out, const LinearWorkspace& workspace,
                      cudaStream_t stream);
  // The MLP's gate and up products and SwiGLU's product after them, one
  // kernel for 1 to kMaxGemvRows rows (the GEMV, or the narrow product at
  // the counts of the narrow set in force): each block reads gate rows
  // and their up rows together, so silu_mul()'s input is never stored and
  // the down product is a plain linear() (the SiLU computed once per
  // output, not once per block of the down product as gated_linear() does).
  // The same bits as linear() into [rows, 2 width] then silu_mul().
  //   x: [rows, in]; gate_up: [2 width, in] (gate rows, then up rows); out: [rows, width]
  // Throws std::invalid_argument for other row counts and for shapes or
  // alignments linear() refuses.
  void (*gate_up_silu)(const __half* x, const __half* gate_up, __half* out, int rows, int in, int width,
                       cudaStream_t stream);
};

// The CUDA kernels.
const Kernels& kernels();
// The same code over host memory, one thread at a time.
const Kernels& host_kernels();

}  // namespace llm_decode::fused
