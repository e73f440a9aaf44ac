// The llm_decode example's decoder model (examples/llm_decode/model.hpp) in
// float16 on CUDA: prefill + decode steps with the cache agree with
// forward_full (within float16 rounding: the products differ in shape), a
// context below max_len changes nothing, and decode() captured in a CUDA
// graph (TorchGraphBackend: torch's CUDAGraph on a private pool) replays to
// exactly the logits and cache writes of the eager call.
//
// libtorch first: c10's logging header defines a glog-style CHECK macro,
// which is dropped here so that doctest's CHECK is the one in force.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include "kv_cache.hpp"
#include "model.hpp"
#include "replay/graph.hpp"
#include "replay/programmatic_launch.hpp"
#include "replay/torch.hpp"

#undef CHECK
#include <doctest/doctest.h>

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "gpu_suite.hpp"
#include "llm_decode_support.hpp"
#include "threads_at_once.hpp"

namespace {

using llm_decode::KvCache;
using llm_decode::LlamaConfig;
using llm_decode::LlamaModel;
using llm_decode_test::Sequence;

const at::Device gpu(at::kCUDA, 0);

// float16 logits of two differently shaped computations of the same math:
// a few units in the last place of float16 (2^-11 relative), compounded over
// the layers, relative to the largest logit.
constexpr double kFp16Tolerance = 2e-2;

// A cache's keys and values as they are now; restore() puts them back (a
// decode step writes one position of each row's slot).
class CacheSnapshot {
 public:
  explicit CacheSnapshot(KvCache& cache) : cache_(cache), saved_(at::stack({cache.k, cache.v}).clone()) {}
  void restore() const {
    cache_.k.copy_(saved_.select(0, 0));
    cache_.v.copy_(saved_.select(0, 1));
  }

 private:
  KvCache& cache_;
  at::Tensor saved_;
};

// decode() with the fused kernels captured in a CUDA graph (TorchGraphBackend:
// torch's CUDAGraph on a private pool), then `replays(launch, logits)`:
// launch() replays the graph, which writes `logits`.
template <typename Replays>
void with_captured_fused_decode(const LlamaModel& model, KvCache& cache, const at::Tensor& slots,
                                const at::Tensor& positions, const at::Tensor& tokens, std::int64_t context,
                                Replays&& replays) {
  auto capture_context = std::make_shared<replay::TorchCaptureContext>(gpu);
  replay::TorchGraphBackend backend(capture_context);
  const replay::StreamRef stream(at::cuda::getCurrentCUDAStream().stream());
  at::Tensor graphed;
  replay::CapturedGraph<replay::TorchGraphExec> captured = backend.capture(stream, [&](replay::StreamRef) {
    graphed = model.decode(cache, slots, positions, tokens, context, llm_decode::DecodeKernels::fused);
  });
  REQUIRE(graphed.defined());
  replays([&] { backend.launch(captured.exec, stream); }, graphed);
}

// The programmatic edges into a fused kernel of decode() with the fused
// kernels, captured (the graph inspected before it is instantiated): how
// many, and how many leave a node that is not one of the fused kernels
// (torch's: cuBLAS products, index_select, fills).
struct ProgrammaticEdges {
  std::size_t total = 0;
  std::size_t from_torch = 0;
};
ProgrammaticEdges fused_decode_programmatic_edges(const LlamaModel& model, KvCache& cache, const at::Tensor& slots,
                                                  const at::Tensor& positions, const at::Tensor& tokens,
                                                  std::int64_t context) {
  ProgrammaticEdges counted;
  auto capture_context = std::make_shared<replay::TorchCaptureContext>(gpu);
  replay::TorchGraphBackend backend(capture_context, [&](replay::GraphRef captured, replay::StreamRef) {
    const auto fused_kernel = [](cudaGraphNode_t node) {
      return replay::describe_node(node).find("llm_decode") != std::string::npos;
    };
    for (const replay::GraphEdge& edge : captured.edges()) {
      if (edge.kind == replay::EdgeKind::plain || !fused_kernel(edge.to)) continue;
      ++counted.total;
      if (!fused_kernel(edge.from)) ++counted.from_torch;
    }
    return captured.clone();
  });
  const replay::StreamRef stream(at::cuda::getCurrentCUDAStream().stream());
  (void)backend.capture(stream, [&](replay::StreamRef) {
    (void)model.decode(cache, slots, positions, tokens, context, llm_decode::DecodeKernels::fused);
  });
  return counted;
}

// decode() with the fused kernels captured, then replayed `replays` times,
// each after restore() (the cache as before the step): how many replays'
// logits or cache differ from `expected` and `expected_cache`, bit for bit.
template <typename Restore>
int differing_fused_replays(const LlamaModel& model, KvCache& cache, const at::Tensor& slots,
                            const at::Tensor& positions, const at::Tensor& tokens, std::int64_t context, int replays,
                            Restore&& restore, const at::Tensor& expected, const at::Tensor& expected_cache) {
  int differing = 0;
  with_captured_fused_decode(model, cache, slots, positions, tokens, context,
                             [&](const auto& launch, const at::Tensor& graphed) {
                               for (int replay_index = 0; replay_index < replays; ++replay_index) {
                                 restore();
                                 launch();
                                 differing += graphed.equal(expected) &&
                                                      at::stack({cache.k, cache.v}).equal(expected_cache)
                                                  ? 0
                                                  : 1;
                               }
                             });
  return differing;
}

// A prompt of 17 tokens decoded to 30, among short ones.
std::vector<Sequence> three_sequences(std::int64_t vocab) { return llm_decode_test::three_sequences(vocab, 30, 17); }

}  // namespace

TEST_SUITE("gpu" * replay_test::needs_device()) {
  TEST_CASE("fp16 on CUDA: prefill then decode steps with the cache give forward_full's logits and greedy tokens") {
    for (const auto& [heads, kv_heads] : {std::pair{4, 4}, std::pair{4, 2}, std::pair{8, 2}}) {
      CAPTURE(heads);
      CAPTURE(kv_heads);
      const LlamaConfig config = llm_decode_test::tiny_config(heads, kv_heads);
      const LlamaModel model = LlamaModel::random(config, replay_test::case_seed(), gpu, at::kHalf);
      REQUIRE(model.device() == gpu);
      KvCache cache(config, 3, gpu, at::kHalf);
      const std::vector<Sequence> sequences = three_sequences(config.vocab_size);
      const std::vector<at::Tensor> cached = llm_decode_test::cached_logits(model, cache, sequences);
      for (std::size_t s = 0; s < sequences.size(); ++s) {
        CAPTURE(s);
        const at::Tensor full = llm_decode_test::full_logits(model, sequences[s]);
        REQUIRE(cached[s].sizes() == full.sizes());
        CHECK(llm_decode_test::max_error(cached[s], full) < kFp16Tolerance);
        const double scale = full.abs().max().item<double>();
        CHECK(llm_decode_test::clear_argmax_mismatches(cached[s], full, kFp16Tolerance * scale) == 0);
      }
    }
  }

  TEST_CASE("fp16 on CUDA: a decode context below max_len gives the logits of context = max_len") {
    const LlamaConfig config = LlamaConfig::preset("tiny");
    const LlamaModel model = LlamaModel::random(config, replay_test::case_seed(), gpu, at::kHalf);
    const std::vector<Sequence> sequences = three_sequences(config.vocab_size);
    KvCache full_context(config, 3, gpu, at::kHalf);
    const std::vector<at::Tensor> reference = llm_decode_test::cached_logits(model, full_context, sequences);
    for (const std::int64_t context : {std::int64_t{30}, std::int64_t{48}}) {
      CAPTURE(context);
      KvCache cache(config, 3, gpu, at::kHalf);
      cache.k.normal_();  // stale finite values past every position: masked, they weigh exactly 0
      cache.v.normal_();
      const std::vector<at::Tensor> cut = llm_decode_test::cached_logits(model, cache, sequences, context);
      for (std::size_t s = 0; s < sequences.size(); ++s) {
        CAPTURE(s);
        CHECK(llm_decode_test::max_error(cut[s], reference[s]) < kFp16Tolerance);
        const double scale = reference[s].abs().max().item<double>();
        CHECK(llm_decode_test::clear_argmax_mismatches(cut[s], reference[s], kFp16Tolerance * scale) == 0);
      }
    }
  }

  TEST_CASE("fp16 on CUDA: the fused decode kernels give the operators' logits, cache rows and greedy tokens") {
    // The default products (own at one row, cuBLAS's above), then the own
    // products at every row count with the narrow ones at 2 to 8 rows.
    for (const auto& [heads, kv_heads, narrow] : {std::tuple{4, 2, false}, std::tuple{4, 1, false},
                                                  std::tuple{4, 4, false}, std::tuple{4, 2, true}}) {
      CAPTURE(heads);
      CAPTURE(kv_heads);
      CAPTURE(narrow);
      const llm_decode_test::OwnProductRows own_products(narrow ? llm_decode::fused::kMaxSkinnyRows : 1);
      const llm_decode_test::NarrowProducts narrow_products(narrow);
      const LlamaConfig config = llm_decode_test::tiny_config(heads, kv_heads);
      const LlamaModel model = LlamaModel::random(config, replay_test::case_seed(), gpu, at::kHalf);
      const std::vector<Sequence> sequences = three_sequences(config.vocab_size);
      for (const std::int64_t context : {std::int64_t{0}, std::int64_t{32}}) {
        CAPTURE(context);
        KvCache aten_cache(config, 3, gpu, at::kHalf);
        KvCache fused_cache(config, 3, gpu, at::kHalf);
        // Two padding rows in the spare slot beside the sequences.
        const std::vector<at::Tensor> aten = llm_decode_test::cached_logits(model, aten_cache, sequences, context, 5);
        const std::vector<at::Tensor> fused = llm_decode_test::cached_logits(model, fused_cache, sequences, context, 5,
                                                                             llm_decode::DecodeKernels::fused);
        for (std::size_t s = 0; s < sequences.size(); ++s) {
          CAPTURE(s);
          REQUIRE(fused[s].sizes() == aten[s].sizes());
          CHECK(llm_decode_test::max_error(fused[s], aten[s]) < kFp16Tolerance);
          const at::Tensor full = llm_decode_test::full_logits(model, sequences[s]);
          CHECK(llm_decode_test::max_error(fused[s], full) < kFp16Tolerance);
          const double scale = full.abs().max().item<double>();
          CHECK(llm_decode_test::clear_argmax_mismatches(fused[s], full, kFp16Tolerance * scale) == 0);
        }
        // The same keys and values cached in the sequences' slots (the spare
        // slot holds whatever the padding rows wrote).
        for (at::Tensor KvCache::*side : {&KvCache::k, &KvCache::v}) {
          CHECK(llm_decode_test::max_error((fused_cache.*side).narrow(1, 0, 3), (aten_cache.*side).narrow(1, 0, 3)) <
                kFp16Tolerance);
        }
      }
    }
  }

  TEST_CASE("the fused attention kernels match a float64 reference past 256 keys (split over blocks) and at head widths that leave lanes idle") {
    at::manual_seed(replay_test::case_seed());
    for (const llm_decode_test::AttentionLayout& layout : llm_decode_test::attention_layouts()) {
      INFO(layout.heads << " query heads over " << layout.kv_heads << ", head_dim " << layout.head_dim);
      const auto errors = llm_decode_test::fused_attention_errors(llm_decode::fused::kernels(), gpu, layout, 600);
      CHECK(errors.decode < 2e-3);  // fp16 rounding of the output
      // One kernel or two: the same math, the query loads apart.
      CHECK(errors.rotary < 2e-3);
      CHECK(errors.rotary_cache == 0.0);  // the cache rows are rounded once either way
      CHECK(errors.same_for_every_context);  // 1, 2 or 3 blocks per row: the same bits
      CHECK(errors.counters_left_zero);      // the last block of each row reset its counter
    }
  }

  TEST_CASE("the fused products (GEMV, narrow and skinny tensor-core products, split over blocks) agree with a float32 linear, the same bits twice") {
    at::manual_seed(replay_test::case_seed());
    std::vector<llm_decode_test::ProductShape> shapes = llm_decode_test::product_shapes();
    // The presets' products at batch 1, 4, 8, 16 and 64 (1b: qkv, o, gate_up, down, lm_head).
    for (const int rows : {1, 4, 8, 16, 64}) {
      for (const auto& [in, out] : {std::pair{2048, 3072}, std::pair{2048, 2048}, std::pair{2048, 16384},
                                    std::pair{8192, 2048}, std::pair{2048, 32000}, std::pair{768, 1280}}) {
        shapes.push_back({rows, in, out});
      }
    }
    for (const bool narrow : {false, true}) {
      const llm_decode_test::NarrowProducts narrow_products(narrow);
      for (const llm_decode_test::ProductShape s : shapes) {
        if (narrow && (s.rows < 2 || s.rows > llm_decode::fused::kMaxGemvRows)) continue;
        INFO(s.rows << " rows of " << s.in << " halves into " << s.out << " outputs" << (narrow ? ", narrow" : ""));
        const llm_decode_test::ProductErrors errors =
            llm_decode_test::fused_product_errors(llm_decode::fused::kernels(), gpu, s);
        CHECK(errors.linear < 2e-3);
        CHECK(errors.gated < 2e-3);
        CHECK(errors.repeatable);
        CHECK(errors.counters_left_zero);
      }
    }
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  }

  TEST_CASE("the fused step bookkeeping kernels write what the ATen bookkeeping writes, bit for bit") {
    const llm_decode_test::BookkeepingComparison result =
        llm_decode_test::compare_step_bookkeeping(llm_decode::fused::kernels(), gpu, 200);
    CHECK(result.inputs_differing == 0);
    CHECK(result.differing == 0);
    CHECK(result.finished_by_eos > 0);
    CHECK(result.finished_by_limit > 0);
    CHECK(result.loops_stopped > 0);
    CHECK(result.loops_going > 0);
  }

  TEST_CASE("the fused decode kernels captured in a CUDA graph replay to their eager logits, bit for bit") {
    const llm_decode_test::OwnProductRows own_products(llm_decode::fused::kMaxSkinnyRows);  // at 4 and 16 rows too
    const LlamaConfig config = LlamaConfig::preset("tiny");
    const LlamaModel model = LlamaModel::random(config, replay_test::case_seed(), gpu, at::kHalf);
    KvCache cache(config, 3, gpu, at::kHalf);
    cache.k.normal_();  // some history in every slot
    cache.v.normal_();
    const std::int64_t context = 32;
    const at::Tensor slots = llm_decode_test::int64_tensor({1, 0, cache.spare_slot(), 2}, gpu);
    const at::Tensor positions = llm_decode_test::int64_tensor({11, 5, 0, 2}, gpu);
    const at::Tensor tokens = llm_decode_test::int64_tensor(llm_decode_test::random_tokens(4, config.vocab_size), gpu);
    const auto fused = llm_decode::DecodeKernels::fused;
    const CacheSnapshot snapshot(cache);
    const at::Tensor eager = model.decode(cache, slots, positions, tokens, context, fused).clone();
    const at::Tensor cache_after_eager = at::stack({cache.k, cache.v}).clone();

    with_captured_fused_decode(model, cache, slots, positions, tokens, context,
                               [&](const auto& launch, const at::Tensor& graphed) {
                                 snapshot.restore();
                                 launch();
                                 CHECK(graphed.equal(eager));
                                 CHECK(at::stack({cache.k, cache.v}).equal(cache_after_eager));
                               });
  }

  TEST_CASE("the fused step with programmatic launches, graphed and replayed 50 times, gives the plain launches' logits, bit for bit") {
    const llm_decode_test::OwnProductRows own_products(llm_decode::fused::kMaxSkinnyRows);  // at 4 and 16 rows too
    const LlamaConfig config = LlamaConfig::preset("tiny");
    const LlamaModel model = LlamaModel::random(config, replay_test::case_seed(), gpu, at::kHalf);
    const auto fused = llm_decode::DecodeKernels::fused;
    const std::int64_t context = 32;
    // 4 rows: the GEMV products, then the narrow ones; 16: the skinny ones.
    for (const auto& [rows, narrow] : {std::pair{std::int64_t{4}, false}, std::pair{std::int64_t{4}, true},
                                       std::pair{std::int64_t{16}, false}}) {
      INFO(rows << " rows" << (narrow ? ", narrow products" : ""));
      const llm_decode_test::NarrowProducts narrow_products(narrow);
      KvCache cache(config, rows, gpu, at::kHalf);
      cache.k.normal_();
      cache.v.normal_();
      const CacheSnapshot snapshot(cache);
      const at::Tensor slots = at::arange(rows, at::TensorOptions().device(gpu).dtype(at::kLong));
      const at::Tensor positions = at::randint(0, context, {rows}, slots.options());
      const at::Tensor tokens = at::randint(0, config.vocab_size, {rows}, slots.options());
      const auto restore = [&] { snapshot.restore(); };
      at::Tensor plain;
      at::Tensor plain_cache;
      {
        const llm_decode_test::ProgrammaticLaunchesSetting plain_launches(
            llm_decode::fused::ProgrammaticLaunches::off);
        plain = model.decode(cache, slots, positions, tokens, context, fused).clone();
        plain_cache = at::stack({cache.k, cache.v}).clone();
      }
      const llm_decode_test::ProgrammaticLaunchesSetting programmatic(llm_decode::fused::ProgrammaticLaunches::always);
      restore();
      CHECK(model.decode(cache, slots, positions, tokens, context, fused).equal(plain));

      CHECK(differing_fused_replays(model, cache, slots, positions, tokens, context, 50, restore, plain,
                                    plain_cache) == 0);
    }
  }

  TEST_CASE("a thread's own product sets: its steps give the logits of the same sets set process-wide, bit for bit, while another thread decodes under the process-wide sets at once") {
    const LlamaConfig config = LlamaConfig::preset("tiny");
    const LlamaModel model = LlamaModel::random(config, replay_test::case_seed(), gpu, at::kHalf);
    const auto fused = llm_decode::DecodeKernels::fused;
    const std::int64_t rows = 4;
    const std::int64_t context = 32;
    KvCache history(config, rows, gpu, at::kHalf);
    history.k.normal_();
    history.v.normal_();
    const at::Tensor slots = at::arange(rows, at::TensorOptions().device(gpu).dtype(at::kLong));
    at::Tensor positions;
    at::Tensor tokens;
    // Each step writes the same cache rows again, so it gives the same logits every time.
    const auto decode_on = [&](KvCache& cache) { return model.decode(cache, slots, positions, tokens, context, fused); };
    const auto copy_of = [&](const KvCache& from) {
      KvCache cache(config, rows, gpu, at::kHalf);
      cache.k.copy_(from.k);
      cache.v.copy_(from.v);
      return cache;
    };
    const llm_decode::fused::ProductSets own_sets{
        .own = llm_decode::fused::product_rows_up_to(llm_decode::fused::kMaxSkinnyRows),
        .narrow = llm_decode::fused::kNarrowRowCounts};
    const auto reference_under = [&](const llm_decode::fused::ProductSets& sets) {
      const llm_decode_test::OwnProductsAt own(sets.own);
      const llm_decode_test::ScopedNarrowProducts narrow(sets.narrow);
      KvCache cache = copy_of(history);
      return decode_on(cache).clone();
    };
    // The test can tell which sets ran only where the ways' logits differ:
    // the own sets' (the narrow product at 4 rows) from the process-wide
    // cuBLAS's, and from the GEMV's, which a scope that kept the own set but
    // lost the narrow one would run. They may round alike for some inputs,
    // so inputs are drawn until they do not (one draw, nearly always).
    at::Tensor own_reference;
    at::Tensor process_wide_reference;
    bool apart = false;
    for (int draw = 0; draw < 20 && !apart; ++draw) {
      positions = at::randint(0, context, {rows}, slots.options());
      tokens = at::randint(0, config.vocab_size, {rows}, slots.options());
      own_reference = reference_under(own_sets);
      process_wide_reference = reference_under({.own = {}, .narrow = {}});
      const at::Tensor gemv_reference = reference_under({.own = own_sets.own, .narrow = {}});
      apart = !own_reference.equal(process_wide_reference) && !own_reference.equal(gemv_reference);
    }
    REQUIRE(apart);
    const llm_decode_test::OwnProductRows process_wide(0);  // cuBLAS's products, for every thread without sets of its own

    constexpr int kRounds = 20;
    std::array<int, 2> differing{};
    const std::vector<std::string> failures =
        replay_test::run_threads_at_once(2, [&](int t, replay_test::ThreadStart& start) {
          const c10::cuda::CUDAStream stream = c10::cuda::getStreamFromPool();
          const c10::cuda::CUDAStreamGuard guard(stream);
          KvCache mine = copy_of(history);
          const std::optional<llm_decode::fused::ProductSets> sets = t == 0 ? std::optional{own_sets} : std::nullopt;
          const llm_decode::fused::ThreadProductSets scope(sets);
          const at::Tensor& expected = t == 0 ? own_reference : process_wide_reference;
          start.arrive_and_wait();
          for (int round = 0; round < kRounds; ++round) {
            if (!decode_on(mine).equal(expected)) ++differing[static_cast<std::size_t>(t)];
          }
        });
    for (int t = 0; t < 2; ++t) {
      INFO("thread " << t << (t == 0 ? " (own sets)" : " (process-wide sets)"));
      const auto index = static_cast<std::size_t>(t);
      CHECK_MESSAGE(failures[index].empty(), failures[index]);
      CHECK(differing[index] == 0);
    }
  }

  TEST_CASE("programmatic launches after own kernels only: no programmatic edge leaves a torch kernel, the same logits bit for bit") {
    using llm_decode::fused::ProgrammaticLaunches;
    LlamaConfig config = LlamaConfig::preset("tiny");
    config.max_len = 512;  // room for a context past fused::kSplitKeys
    const LlamaModel model = LlamaModel::random(config, replay_test::case_seed(), gpu, at::kHalf);
    const std::int64_t rows = 4;
    const bool pdl = replay::programmatic_launch_supported();
    // Own products up to 0 rows: cuBLAS for every product, so every fused
    // kernel follows one of torch's. Up to 8: the step's own products, so
    // only the first norm does (after the embedding's index_select); past
    // kSplitKeys positions the attention's counters are zeroed by torch
    // too, so the first product follows that fill.
    static_assert(llm_decode::fused::kSplitKeys < 300);
    for (const auto& [own_rows, context] : {std::pair{0, std::int64_t{32}}, std::pair{8, std::int64_t{32}},
                                            std::pair{8, std::int64_t{300}}}) {
      INFO("own products up to " << own_rows << " rows, context " << context);
      const llm_decode_test::OwnProductRows own_products(own_rows);
      KvCache cache(config, rows, gpu, at::kHalf);
      const at::Tensor slots = at::arange(rows, at::TensorOptions().device(gpu).dtype(at::kLong));
      const at::Tensor positions = at::randint(0, context, {rows}, slots.options());
      const at::Tensor tokens = at::randint(0, config.vocab_size, {rows}, slots.options());
      cache.k.normal_();
      cache.v.normal_();
      const CacheSnapshot snapshot(cache);
      const auto restore = [&] { snapshot.restore(); };
      const auto decode_with = [&](ProgrammaticLaunches where) {
        const llm_decode_test::ProgrammaticLaunchesSetting setting(where);
        restore();
        return model.decode(cache, slots, positions, tokens, context, llm_decode::DecodeKernels::fused).clone();
      };
      const auto edges_with = [&](ProgrammaticLaunches where) {
        const llm_decode_test::ProgrammaticLaunchesSetting setting(where);
        return fused_decode_programmatic_edges(model, cache, slots, positions, tokens, context);
      };
      const at::Tensor plain = decode_with(ProgrammaticLaunches::off);
      const at::Tensor plain_cache = at::stack({cache.k, cache.v}).clone();
      const ProgrammaticEdges always = edges_with(ProgrammaticLaunches::always);
      const ProgrammaticEdges after_own = edges_with(ProgrammaticLaunches::after_own_kernels);
      CHECK(after_own.from_torch == 0);
      if (pdl) {
        // Always: edges out of torch's kernels too (the index_select, the products).
        CHECK(always.from_torch > 0);
        CHECK(after_own.total == always.total - always.from_torch);
        if (own_rows > 0) CHECK(after_own.total > 0);
      } else {
        CHECK(always.total == 0);
      }
      // Eager and graphed after own kernels only: the plain launches' logits and cache, bit for bit.
      CHECK(decode_with(ProgrammaticLaunches::after_own_kernels).equal(plain));
      const llm_decode_test::ProgrammaticLaunchesSetting after_own_launches(ProgrammaticLaunches::after_own_kernels);
      CHECK(differing_fused_replays(model, cache, slots, positions, tokens, context, 20, restore, plain,
                                    plain_cache) == 0);
    }
  }

  TEST_CASE("programmatic launches after own kernels, 4 threads capturing at once: each graph gets the edges of one thread alone") {
    using llm_decode::fused::ProgrammaticLaunches;
    LlamaConfig config = LlamaConfig::preset("tiny");
    config.max_len = 512;
    const LlamaModel model = LlamaModel::random(config, replay_test::case_seed(), gpu, at::kHalf);
    const std::int64_t rows = 4;
    const llm_decode_test::ProgrammaticLaunchesSetting after_own(ProgrammaticLaunches::after_own_kernels);
    // The step's own products, so that fused kernels follow fused kernels;
    // past kSplitKeys positions torch zeroes the attention's counters too.
    const llm_decode_test::OwnProductRows own_products(8);
    for (const std::int64_t context : {32, 300}) {
      INFO("context " << context);
      // One eager step on the calling thread's current stream (this
      // thread's cuBLAS handle and workspace), then `ready`, then the
      // captured step's edges (captured on a stream of its own
      // TorchCaptureContext).
      const auto edges_after = [&](const std::function<void()>& ready) {
        KvCache cache(config, rows, gpu, at::kHalf);
        const at::Tensor slots = at::arange(rows, at::TensorOptions().device(gpu).dtype(at::kLong));
        const at::Tensor positions = at::full({rows}, context - 1, slots.options());
        const at::Tensor tokens = at::arange(rows, slots.options());
        (void)model.decode(cache, slots, positions, tokens, context, llm_decode::DecodeKernels::fused);
        at::cuda::getCurrentCUDAStream().synchronize();
        ready();
        return fused_decode_programmatic_edges(model, cache, slots, positions, tokens, context);
      };
      const ProgrammaticEdges alone = edges_after([] {});
      CHECK(alone.from_torch == 0);
      if (replay::programmatic_launch_supported()) CHECK(alone.total > 0);

      constexpr int kThreads = 4;
      std::vector<ProgrammaticEdges> edges(kThreads);
      // The threads capture together.
      const std::vector<std::string> failures =
          replay_test::run_threads_at_once(kThreads, [&](int t, replay_test::ThreadStart& start) {
            const c10::cuda::CUDAStream stream = c10::cuda::getStreamFromPool();
            const c10::cuda::CUDAStreamGuard guard(stream);
            edges[static_cast<std::size_t>(t)] = edges_after([&] { start.arrive_and_wait(); });
          });
      for (int t = 0; t < kThreads; ++t) {
        INFO("thread " << t);
        const auto index = static_cast<std::size_t>(t);
        CHECK_MESSAGE(failures[index].empty(), failures[index]);
        CHECK(edges[index].from_torch == 0);
        CHECK(edges[index].total == alone.total);
      }
    }
  }

  TEST_CASE("the fused norm_linear kernel gives add_rms_norm then linear, bit for bit, at the presets' widths") {
    at::manual_seed(replay_test::case_seed());
    // tiny; small's q, k, v; 1b's gate and up, and its logits.
    for (const auto& [in, out] : {std::pair{64, 256}, std::pair{768, 1280}, std::pair{2048, 16384}, std::pair{2048, 32000}}) {
      for (const bool with_delta : {false, true}) {
        INFO(in << " halves into " << out << " outputs, " << (with_delta ? "with" : "without") << " a delta");
        const llm_decode_test::NormLinearCheck r =
            llm_decode_test::norm_linear_against_two_kernels(llm_decode::fused::kernels(), gpu, in, out, with_delta);
        CHECK(r.same_product);
        CHECK(r.same_sum);
        CHECK(r.x_untouched);
      }
    }
  }

  TEST_CASE("the fused gate_up_silu kernel gives linear then silu_mul, bit for bit, 1 to 8 rows, GEMV and narrow") {
    at::manual_seed(replay_test::case_seed());
    // small's and 1b's MLPs; one warp; an odd width (a last block of one
    // output); more vectors than the preload takes, so the loop after it runs.
    for (const bool narrow : {false, true}) {
      const llm_decode_test::NarrowProducts narrow_products(narrow);
      for (const auto& [in, width] : {std::pair{768, 2048}, std::pair{2048, 8192}, std::pair{64, 37},
                                      std::pair{2056, 9}, std::pair{8200, 5}}) {
        for (int rows = 1; rows <= llm_decode::fused::kMaxGemvRows; ++rows) {
          INFO(rows << " rows of " << in << " halves into " << width << " outputs" << (narrow ? ", narrow" : ""));
          CHECK(llm_decode_test::gate_up_silu_as_two_kernels(llm_decode::fused::kernels(), gpu, {rows, in, width}));
        }
      }
    }
  }

  TEST_CASE("the narrow products give the same bits with 4 or 8 chunks of loads in flight a warp") {
    at::manual_seed(replay_test::case_seed());
    const llm_decode_test::NarrowProducts narrow_products(true);
    // Widths of one pass at either depth, of several passes, and with a
    // last chunk of 8 halves; the large terms in warp 0's first chunk and
    // in its last (chunk c is warp c % 8's; 32 halves a chunk).
    for (const auto& [in, cancel_at] : {std::pair{1024, 768}, std::pair{2056, 2048}, std::pair{8200, 8192}}) {
      for (int rows = llm_decode::fused::kMinNarrowRows; rows <= llm_decode::fused::kMaxGemvRows; ++rows) {
        INFO(rows << " rows of " << in << " halves");
        CHECK(llm_decode_test::same_bits_at_both_depths(llm_decode::fused::kernels(), gpu, rows, in, 40, cancel_at));
      }
    }
  }

  TEST_CASE("folded norms: one-row steps give the unfolded steps' logits bit for bit, eager and graphed (20 replays)") {
    const LlamaConfig config = LlamaConfig::preset("tiny");
    const LlamaModel model = LlamaModel::random(config, replay_test::case_seed(), gpu, at::kHalf);
    const auto fused = llm_decode::DecodeKernels::fused;
    const std::int64_t context = 32;
    KvCache cache(config, 2, gpu, at::kHalf);
    cache.k.normal_();
    cache.v.normal_();
    const CacheSnapshot snapshot(cache);
    const auto restore = [&] { snapshot.restore(); };
    const at::Tensor slots = llm_decode_test::int64_tensor({1}, gpu);
    const at::Tensor positions = llm_decode_test::int64_tensor({13}, gpu);
    const at::Tensor tokens = llm_decode_test::int64_tensor(llm_decode_test::random_tokens(1, config.vocab_size), gpu);
    const at::Tensor plain = model.decode(cache, slots, positions, tokens, context, fused).clone();
    const at::Tensor plain_cache = at::stack({cache.k, cache.v}).clone();
    const llm_decode_test::FoldNorms on(true);
    REQUIRE(llm_decode_test::folds_norms(config));
    restore();
    CHECK(model.decode(cache, slots, positions, tokens, context, fused).equal(plain));
    CHECK(at::stack({cache.k, cache.v}).equal(plain_cache));
    CHECK(differing_fused_replays(model, cache, slots, positions, tokens, context, 20, restore, plain,
                                  plain_cache) == 0);
  }

  TEST_CASE("decode captured in a CUDA graph replays to the eager logits and cache writes, bit for bit") {
    const LlamaConfig config = LlamaConfig::preset("tiny");
    const LlamaModel model = LlamaModel::random(config, replay_test::case_seed(), gpu, at::kHalf);
    KvCache cache(config, 3, gpu, at::kHalf);
    const std::vector<std::int64_t> lengths{5, 11, 2};
    for (std::int64_t slot = 0; slot < 3; ++slot) {
      const std::vector<std::int64_t> prompt =
          llm_decode_test::random_tokens(lengths[static_cast<std::size_t>(slot)], config.vocab_size);
      (void)model.prefill(cache, slot, llm_decode_test::int64_tensor(prompt, gpu));
    }
    // The graph's static inputs: three rows and one padding row (the spare slot).
    const std::int64_t spare = cache.spare_slot();
    const std::int64_t context = 32;
    const at::Tensor slots = llm_decode_test::int64_tensor({1, 0, spare, 2}, gpu);
    const at::Tensor positions = llm_decode_test::int64_tensor({11, 5, 0, 2}, gpu);
    const at::Tensor tokens = llm_decode_test::int64_tensor(llm_decode_test::random_tokens(4, config.vocab_size), gpu);
    model.check_decode_values(cache, slots, positions, tokens, context);

    // The eager step first (it also warms up the kernels the capture records).
    const CacheSnapshot snapshot(cache);
    const at::Tensor eager = model.decode(cache, slots, positions, tokens, context).clone();
    const at::Tensor cache_after_eager = at::stack({cache.k, cache.v}).clone();

    auto capture_context = std::make_shared<replay::TorchCaptureContext>(gpu);
    replay::TorchGraphBackend backend(capture_context);
    const replay::StreamRef stream(at::cuda::getCurrentCUDAStream().stream());
    at::Tensor graphed;  // allocated in the graph's private pool during the capture; every replay rewrites it
    replay::CapturedGraph<replay::TorchGraphExec> captured =
        backend.capture(stream, [&](replay::StreamRef) { graphed = model.decode(cache, slots, positions, tokens, context); });
    REQUIRE(graphed.defined());
    CHECK(cache.k.equal(cache_after_eager.select(0, 0)));  // a capture records, it runs nothing

    // Replayed from the cache as the eager step found it.
    snapshot.restore();
    backend.launch(captured.exec, stream);
    CHECK(graphed.equal(eager));
    CHECK(at::stack({cache.k, cache.v}).equal(cache_after_eager));

    // The next step: new values in the same input tensors, read anew by the replay.
    positions.copy_(llm_decode_test::int64_tensor({12, 6, 0, 3}, gpu));
    tokens.copy_(eager.argmax(-1));
    const at::Tensor before_next = at::stack({cache.k, cache.v}).clone();
    const at::Tensor eager_next = model.decode(cache, slots, positions, tokens, context).clone();
    const at::Tensor after_next = at::stack({cache.k, cache.v}).clone();
    CHECK_FALSE(eager_next.equal(eager));
    cache.k.copy_(before_next.select(0, 0));
    cache.v.copy_(before_next.select(0, 1));
    backend.launch(captured.exec, stream);
    CHECK(graphed.equal(eager_next));
    CHECK(at::stack({cache.k, cache.v}).equal(after_next));
    stream.synchronize();
  }
}
