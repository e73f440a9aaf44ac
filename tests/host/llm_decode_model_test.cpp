// The llm_decode example's decoder model (examples/llm_decode/model.hpp) on
// the CPU in float32, the "tiny" config: prefill + decode steps with the
// static KV cache agree with forward_full on the whole sequence; rows of a
// step are independent and padding rows in the spare slot change nothing;
// a context below max_len changes nothing; save/load and random(seed); the
// config file; and the refusals of bad inputs, made before any kernel runs.
//
// libtorch first: c10's logging header defines a glog-style CHECK macro,
// which is dropped here so that doctest's CHECK is the one in force.
#include <ATen/ATen.h>

#include "config.hpp"
#include "fused_kernels.hpp"
#include "kv_cache.hpp"
#include "model.hpp"

#undef CHECK
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "gpu_suite.hpp"
#include "llm_decode_support.hpp"

namespace {

using llm_decode::KvCache;
using llm_decode::LlamaConfig;
using llm_decode::LlamaModel;
using llm_decode_test::Sequence;

const at::Device cpu(at::kCPU);

// fp32 on the CPU: the cached path and the full one differ only in the
// shapes of their matrix products (rounding, not math).
constexpr double kFp32Tolerance = 1e-4;

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// The message of the std::invalid_argument that `call` throws ("" and a
// failed check when it throws nothing or something else).
std::string invalid_argument_message(const std::function<void()>& call) {
  try {
    call();
  } catch (const std::invalid_argument& e) {
    return e.what();
  } catch (const std::exception& e) {
    FAIL_CHECK("expected std::invalid_argument, got: " << e.what());
    return "";
  }
  FAIL_CHECK("expected std::invalid_argument, nothing was thrown");
  return "";
}

// A fresh directory under the system's temporary one, emptied of the files
// these cases write and removed at scope exit. Not std::filesystem::remove_all:
// libtorch's pip wheels export their own copy of std::filesystem, and theirs
// crashes when called from code built by a newer GCC.
struct TempDir {
  std::filesystem::path path;
  TempDir() {
    static int made = 0;
    path = std::filesystem::temp_directory_path() /
           ("llm_decode_test_" + std::to_string(replay_test::case_seed()) + "_" + std::to_string(++made));
    std::filesystem::create_directories(path);
  }
  ~TempDir() {
    for (const char* name : {"config.json", "weights.pt", "absent.json"}) {
      (void)std::remove((path / name).c_str());
    }
    (void)std::remove(path.c_str());
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
};

void write_text(const std::filesystem::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  REQUIRE(out.flush());
}

bool same_weights(const LlamaModel::StateDict& a, const LlamaModel::StateDict& b) {
  if (a.size() != b.size()) {
    return false;
  }
  for (const auto& entry : a) {
    const auto other = b.find(entry.key());
    if (other == b.end() || !entry.value().equal(other->value())) {
      return false;
    }
  }
  return true;
}

// A long sequence of 20 tokens, 5 of them the prompt, among short ones.
std::vector<Sequence> three_sequences(std::int64_t vocab) { return llm_decode_test::three_sequences(vocab, 20, 5); }

// Prompts packed the way the executor stages a bucketed prefill: each
// prompt's tokens in its slot at positions 0, 1, ..., segment = its index;
// then `padding` tokens 0 in the spare slot at positions 0, 1, ..., segment -1.
struct PackedPrompts {
  at::Tensor tokens;
  LlamaModel::Packing packing;
};

PackedPrompts pack_prompts(const std::vector<std::vector<std::int64_t>>& prompts, const std::vector<std::int64_t>& slots,
                           std::int64_t padding, std::int64_t spare_slot) {
  std::vector<std::int64_t> tokens, token_slots, positions, segments;
  for (std::size_t p = 0; p < prompts.size(); ++p) {
    for (std::size_t i = 0; i < prompts[p].size(); ++i) {
      tokens.push_back(prompts[p][i]);
      token_slots.push_back(slots[p]);
      positions.push_back(static_cast<std::int64_t>(i));
      segments.push_back(static_cast<std::int64_t>(p));
    }
  }
  for (std::int64_t t = 0; t < padding; ++t) {
    tokens.push_back(0);
    token_slots.push_back(spare_slot);
    positions.push_back(t);
    segments.push_back(-1);
  }
  return {llm_decode_test::int64_tensor(tokens, cpu),
          {.slots = llm_decode_test::int64_tensor(token_slots, cpu),
           .positions = llm_decode_test::int64_tensor(positions, cpu),
           .segments = llm_decode_test::int64_tensor(segments, cpu)}};
}

}  // namespace

TEST_SUITE("host") {
  TEST_CASE("prefill then decode steps with the cache give forward_full's logits (fp32, query groups 1, 2, 4)") {
    for (const auto& [heads, kv_heads] : {std::pair{4, 4}, std::pair{4, 2}, std::pair{4, 1}, std::pair{8, 2}}) {
      CAPTURE(heads);
      CAPTURE(kv_heads);
      const LlamaConfig config = llm_decode_test::tiny_config(heads, kv_heads);
      const LlamaModel model = LlamaModel::random(config, replay_test::case_seed(), cpu, at::kFloat);
      KvCache cache(config, 3, cpu, at::kFloat);
      std::vector<Sequence> sequences = three_sequences(config.vocab_size);
      const std::vector<at::Tensor> cached = llm_decode_test::cached_logits(model, cache, sequences);
      REQUIRE(cached.size() == sequences.size());
      for (std::size_t s = 0; s < sequences.size(); ++s) {
        const at::Tensor full = llm_decode_test::full_logits(model, sequences[s]);
        REQUIRE(cached[s].sizes() == full.sizes());
        CHECK(llm_decode_test::max_error(cached[s], full) < kFp32Tolerance);
        CHECK(llm_decode_test::clear_argmax_mismatches(cached[s], full, 1e-4) == 0);
      }
      // The slots again, for shorter sequences: the longer ones' keys still
      // in the cache past the new positions must not be attended to.
      sequences = {Sequence{llm_decode_test::random_tokens(4, config.vocab_size), 2, 0},
                   Sequence{llm_decode_test::random_tokens(6, config.vocab_size), 1, 2}};
      const std::vector<at::Tensor> reused = llm_decode_test::cached_logits(model, cache, sequences);
      for (std::size_t s = 0; s < sequences.size(); ++s) {
        CHECK(llm_decode_test::max_error(reused[s], llm_decode_test::full_logits(model, sequences[s])) < kFp32Tolerance);
      }
    }
  }

  TEST_CASE("the rows of a decode step are independent, and padding rows in the spare slot change nothing") {
    const LlamaConfig config = LlamaConfig::preset("tiny");
    const LlamaModel model = LlamaModel::random(config, replay_test::case_seed(), cpu, at::kFloat);
    KvCache cache(config, 4, cpu, at::kFloat);
    const std::vector<std::int64_t> lengths{3, 7, 1};
    for (std::int64_t slot = 0; slot < 3; ++slot) {
      const std::vector<std::int64_t> prompt =
          llm_decode_test::random_tokens(lengths[static_cast<std::size_t>(slot)], config.vocab_size);
      (void)model.prefill(cache, slot, llm_decode_test::int64_tensor(prompt, cpu));
    }
    // Rows in another order than the slots; each at its own next position.
    const std::vector<std::int64_t> slots{2, 0, 1};
    const std::vector<std::int64_t> positions{1, 3, 7};
    const std::vector<std::int64_t> tokens = llm_decode_test::random_tokens(3, config.vocab_size);
    const auto t = [](const std::vector<std::int64_t>& v) { return llm_decode_test::int64_tensor(v, cpu); };
    const at::Tensor batched = model.decode(cache, t(slots), t(positions), t(tokens), config.max_len);
    REQUIRE(batched.sizes() == at::IntArrayRef({3, config.vocab_size}));
    CHECK((batched.scalar_type() == at::kFloat));

    for (std::size_t r = 0; r < slots.size(); ++r) {
      CAPTURE(r);
      const at::Tensor alone = model.decode(cache, t({slots[r]}), t({positions[r]}), t({tokens[r]}), config.max_len);
      CHECK(llm_decode_test::max_error(alone[0], batched[static_cast<std::int64_t>(r)]) < 1e-5);
    }

    // Padding rows: the spare slot, position 0, token 0, any number of them.
    const std::int64_t spare = cache.spare_slot();
    const at::Tensor padded = model.decode(cache, t({2, 0, spare, 1, spare}), t({1, 3, 0, 7, 0}),
                                           t({tokens[0], tokens[1], 0, tokens[2], 0}), config.max_len);
    REQUIRE(padded.size(0) == 5);
    CHECK(llm_decode_test::max_error(padded.index_select(0, t({0, 1, 3})), batched) < 1e-5);

    // A step of padding rows only writes nothing outside the spare slot.
    const at::Tensor k_before = cache.k.narrow(1, 0, cache.slots()).clone();
    const at::Tensor v_before = cache.v.narrow(1, 0, cache.slots()).clone();
    const at::Tensor spare_before = cache.k.select(1, spare).clone();
    (void)model.decode(cache, t({spare, spare}), t({0, 0}), t({5, 9}), config.max_len);
    CHECK(cache.k.narrow(1, 0, cache.slots()).equal(k_before));
    CHECK(cache.v.narrow(1, 0, cache.slots()).equal(v_before));
    CHECK_FALSE(cache.k.select(1, spare).equal(spare_before));  // the padding did write somewhere: the spare slot
  }

  TEST_CASE("a decode context below max_len gives the logits of context = max_len, whatever lies past it") {
    const LlamaConfig config = LlamaConfig::preset("tiny");
    const LlamaModel model = LlamaModel::random(config, replay_test::case_seed(), cpu, at::kFloat);
    const std::vector<Sequence> sequences = three_sequences(config.vocab_size);
    KvCache full_context(config, 3, cpu, at::kFloat);
    const std::vector<at::Tensor> reference = llm_decode_test::cached_logits(model, full_context, sequences);
    // Stale finite values everywhere (another sequence's keys, say): masked,
    // they weigh exactly 0.
    for (const std::int64_t context : {std::int64_t{20}, std::int64_t{33}}) {
      CAPTURE(context);
      KvCache cache(config, 3, cpu, at::kFloat);
      cache.k.normal_();
      cache.v.normal_();
      const std::vector<at::Tensor> cut = llm_decode_test::cached_logits(model, cache, sequences, context);
      for (std::size_t s = 0; s < sequences.size(); ++s) {
        CHECK(llm_decode_test::max_error(cut[s], reference[s]) < 1e-5);
      }
    }
  }

  TEST_CASE("prefill_many packs prompts into one forward: each prompt's logits and cache rows as if prefilled alone") {
    const LlamaConfig config = llm_decode_test::tiny_config(4, 2);
    const LlamaModel model = LlamaModel::random(config, replay_test::case_seed(), cpu, at::kFloat);
    const std::vector<std::vector<std::int64_t>> prompts{llm_decode_test::random_tokens(7, config.vocab_size),
                                                         llm_decode_test::random_tokens(1, config.vocab_size),
                                                         llm_decode_test::random_tokens(12, config.vocab_size)};
    const std::vector<std::int64_t> slots{2, 0, 1};
    KvCache alone(config, 3, cpu, at::kFloat);
    KvCache packed(config, 3, cpu, at::kFloat);
    std::vector<at::Tensor> inputs;
    std::vector<at::Tensor> expected;
    for (std::size_t p = 0; p < prompts.size(); ++p) {
      inputs.push_back(llm_decode_test::int64_tensor(prompts[p], cpu));
      expected.push_back(model.prefill(alone, slots[p], inputs.back()));
    }
    const at::Tensor logits = model.prefill_many(packed, slots, inputs);
    REQUIRE(logits.sizes() == at::IntArrayRef({3, config.vocab_size}));
    for (std::size_t p = 0; p < prompts.size(); ++p) {
      CAPTURE(p);
      CHECK(llm_decode_test::max_error(logits[static_cast<std::int64_t>(p)], expected[p]) < 1e-5);
      const auto length = static_cast<std::int64_t>(prompts[p].size());
      for (at::Tensor KvCache::*side : {&KvCache::k, &KvCache::v}) {
        const at::Tensor a = (alone.*side).select(1, slots[p]).narrow(2, 0, length);
        const at::Tensor b = (packed.*side).select(1, slots[p]).narrow(2, 0, length);
        CHECK(llm_decode_test::max_error(b, a) < 1e-5);
      }
    }
    // Nothing beyond each prompt was written.
    CHECK(packed.k.select(1, 0).narrow(2, 1, config.max_len - 1).abs().max().item<float>() == 0.0F);
    // Refusals: one slot per prompt, each slot once.
    CHECK_THROWS_AS(model.prefill_many(packed, {0, 1}, {inputs[0]}), std::invalid_argument);
    CHECK_THROWS_AS(model.prefill_many(packed, {1, 1}, {inputs[0], inputs[1]}), std::invalid_argument);
    CHECK_THROWS_AS(model.prefill_many(packed, {}, {}), std::invalid_argument);
  }

  TEST_CASE("prefill_packed with padding tokens: each prompt's logits and cache rows as unpadded; padding writes only the spare slot") {
    const LlamaConfig config = llm_decode_test::tiny_config(4, 2);
    const LlamaModel model = LlamaModel::random(config, replay_test::case_seed(), cpu, at::kFloat);
    const std::vector<std::vector<std::int64_t>> prompts{llm_decode_test::random_tokens(5, config.vocab_size),
                                                         llm_decode_test::random_tokens(9, config.vocab_size)};
    const std::vector<std::int64_t> slots{1, 0};
    KvCache unpadded(config, 2, cpu, at::kFloat);
    KvCache padded(config, 2, cpu, at::kFloat);
    const at::Tensor expected = model.prefill_many(unpadded, slots, {llm_decode_test::int64_tensor(prompts[0], cpu),
                                                                     llm_decode_test::int64_tensor(prompts[1], cpu)});
    // 14 prompt tokens padded to 20 the way the executor stages them; logit
    // rows for 3 prompts (the third a padding row).
    const auto [tokens, packing] = pack_prompts(prompts, slots, 6, padded.spare_slot());
    const at::Tensor logits = model.prefill_packed(padded, tokens, packing, llm_decode_test::int64_tensor({4, 13, 0}, cpu));
    REQUIRE(logits.sizes() == at::IntArrayRef({3, config.vocab_size}));
    CHECK(llm_decode_test::max_error(logits.narrow(0, 0, 2), expected) < 1e-5);
    for (at::Tensor KvCache::*side : {&KvCache::k, &KvCache::v}) {
      // The prompts' slots hold what unpadded prefill wrote (and nothing else).
      CHECK(llm_decode_test::max_error((padded.*side).narrow(1, 0, 2), (unpadded.*side).narrow(1, 0, 2)) < 1e-5);
      // The padding went to the spare slot, positions 0..5 only.
      const at::Tensor spare = (padded.*side).select(1, padded.spare_slot());
      CHECK(spare.narrow(2, 0, 6).abs().max().item<float>() > 0.0F);
      CHECK(spare.narrow(2, 6, config.max_len - 6).abs().max().item<float>() == 0.0F);
    }
    // Sizes that do not match are refused before any kernel.
    const LlamaModel::Packing short_packing{.slots = packing.slots.narrow(0, 0, 10),
                                            .positions = packing.positions,
                                            .segments = packing.segments};
    CHECK_THROWS_WITH_AS(model.prefill_packed(padded, tokens, short_packing,
                                              llm_decode_test::int64_tensor({4}, cpu)),
                         doctest::Contains("slots"), std::invalid_argument);
    CHECK_THROWS_WITH_AS(model.prefill_packed(padded, tokens, packing,
                                              llm_decode_test::int64_tensor(std::vector<std::int64_t>{}, cpu)),
                         doctest::Contains("last_rows"), std::invalid_argument);
  }

  TEST_CASE("the fused decode kernels (their host versions) give the operators' logits, cache rows and greedy tokens") {
    const llm_decode_test::OwnProductRows own_products(llm_decode::fused::kMaxSkinnyRows);  // the products at every row count
    // fp16 on the CPU: the same kernel code as on a GPU, run as one thread.
    constexpr double kFp16Tolerance = 2e-2;
    for (const auto& [heads, kv_heads, narrow] : {std::tuple{4, 2, false}, std::tuple{4, 1, false},
                                                  std::tuple{4, 4, false}, std::tuple{4, 2, true}}) {
      CAPTURE(heads);
      CAPTURE(kv_heads);
      CAPTURE(narrow);  // the narrow products at 2 to 8 rows, or the GEMV
      const llm_decode_test::NarrowProducts narrow_products(narrow);
      const LlamaConfig config = llm_decode_test::tiny_config(heads, kv_heads);
      const LlamaModel model = LlamaModel::random(config, replay_test::case_seed(), cpu, at::kHalf);
      const std::vector<llm_decode_test::Sequence> sequences =
          llm_decode_test::three_sequences(config.vocab_size, 30, 17);
      for (const std::int64_t context : {std::int64_t{0}, std::int64_t{32}}) {
        CAPTURE(context);
        KvCache aten_cache(config, 3, cpu, at::kHalf);
        KvCache fused_cache(config, 3, cpu, at::kHalf);
        // Two padding rows in the spare slot beside the sequences.
        const std::vector<at::Tensor> aten = llm_decode_test::cached_logits(model, aten_cache, sequences, context, 5);
        const std::vector<at::Tensor> fused = llm_decode_test::cached_logits(model, fused_cache, sequences, context, 5,
                                                                             llm_decode::DecodeKernels::fused);
        for (std::size_t s = 0; s < sequences.size(); ++s) {
          CAPTURE(s);
          REQUIRE(fused[s].sizes() == aten[s].sizes());
          CHECK(llm_decode_test::max_error(fused[s], aten[s]) < kFp16Tolerance);
          const double scale = aten[s].abs().max().item<double>();
          CHECK(llm_decode_test::clear_argmax_mismatches(fused[s], aten[s], kFp16Tolerance * scale) == 0);
        }
        for (at::Tensor KvCache::*side : {&KvCache::k, &KvCache::v}) {
          CHECK(llm_decode_test::max_error((fused_cache.*side).narrow(1, 0, 3), (aten_cache.*side).narrow(1, 0, 3)) <
                kFp16Tolerance);
        }
      }
    }
  }

  TEST_CASE("prefill_packed with the fused kernels (their host versions): the operators' logits and cache rows") {
    constexpr double kFp16Tolerance = 2e-2;
    const LlamaConfig config = llm_decode_test::tiny_config(4, 2);
    const LlamaModel model = LlamaModel::random(config, replay_test::case_seed(), cpu, at::kHalf);
    // Two prompts (slots 1 and 0) and padding tokens in the spare slot, as the executor stages them.
    const std::vector<std::vector<std::int64_t>> prompts{llm_decode_test::random_tokens(6, config.vocab_size),
                                                         llm_decode_test::random_tokens(11, config.vocab_size)};
    const std::vector<std::int64_t> slots{1, 0};
    KvCache aten_cache(config, 2, cpu, at::kHalf);
    const auto [input, packing] = pack_prompts(prompts, slots, 7, aten_cache.spare_slot());
    const at::Tensor last_rows = llm_decode_test::int64_tensor({5, 16, 0}, cpu);
    KvCache fused_cache(config, 2, cpu, at::kHalf);
    const at::Tensor aten = model.prefill_packed(aten_cache, input, packing, last_rows).to(at::kFloat);
    const at::Tensor fused =
        model.prefill_packed(fused_cache, input, packing, last_rows, llm_decode::DecodeKernels::fused).to(at::kFloat);
    REQUIRE(fused.sizes() == aten.sizes());
    CHECK(llm_decode_test::max_error(fused.narrow(0, 0, 2), aten.narrow(0, 0, 2)) < kFp16Tolerance);
    CHECK(llm_decode_test::clear_argmax_mismatches(fused.narrow(0, 0, 2), aten.narrow(0, 0, 2),
                                                   kFp16Tolerance * aten.abs().max().item<double>()) == 0);
    for (at::Tensor KvCache::*side : {&KvCache::k, &KvCache::v}) {
      CHECK(llm_decode_test::max_error((fused_cache.*side).narrow(1, 0, 2), (aten_cache.*side).narrow(1, 0, 2)) <
            kFp16Tolerance);
    }
  }

  TEST_CASE("the fused rotary_attention (host versions) writes and returns what rotary_and_cache_write then decode_attention do, bit for bit") {
    at::manual_seed(replay_test::case_seed());
    // Query groups 1 to 4; value rows of 1 to 32 lanes (16-byte loads); 80
    // positions (three 32-key chunks at the longest).
    for (const llm_decode_test::AttentionLayout layout :
         {llm_decode_test::AttentionLayout{4, 2, 16}, {4, 1, 16}, {8, 8, 8}, {12, 4, 64}, {8, 2, 128}, {4, 1, 256}}) {
      INFO(layout.heads << " query heads over " << layout.kv_heads << ", head_dim " << layout.head_dim);
      const auto errors =
          llm_decode_test::fused_attention_errors(llm_decode::fused::host_kernels(), cpu, layout, 80);
      CHECK(errors.rotary == 0.0);
      CHECK(errors.rotary_cache == 0.0);
      CHECK(errors.cache_written);  // the keys were written
      CHECK(errors.finite);
      CHECK(errors.decode < 2e-3);
    }
  }

  TEST_CASE("the fused attention kernels (host versions) match a float64 reference past 256 keys (split over blocks) and at head widths that leave lanes idle") {
    at::manual_seed(replay_test::case_seed());
    for (const llm_decode_test::AttentionLayout& layout : llm_decode_test::attention_layouts()) {
      INFO(layout.heads << " query heads over " << layout.kv_heads << ", head_dim " << layout.head_dim);
      const auto errors = llm_decode_test::fused_attention_errors(llm_decode::fused::host_kernels(), cpu, layout, 600);
      CHECK(errors.decode < 2e-3);  // fp16 rounding of the output
      CHECK(errors.rotary == 0.0);  // the same code, one thread: bit for bit
      CHECK(errors.rotary_cache == 0.0);
      CHECK(errors.same_for_every_context);  // 1, 2 or 3 blocks per row: the same bits
      CHECK(errors.counters_left_zero);
    }
  }

  TEST_CASE("the fused kernels refuse head layouts and widths they cannot take, naming the size") {
    using llm_decode::fused::check_attention_shape;
    using llm_decode::fused::check_norm_width;
    CHECK_NOTHROW(check_attention_shape(12, 4, 64));
    CHECK_NOTHROW(check_attention_shape(32, 4, 128));  // 8 query heads of 128
    CHECK_NOTHROW(check_attention_shape(4, 1, 256));
    CHECK_THROWS_WITH_AS(check_attention_shape(9, 1, 64), doctest::Contains("at most 8 query heads"),
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(check_attention_shape(12, 5, 64), doctest::Contains("12 query heads over 5"),
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(check_attention_shape(4, 4, 12), doctest::Contains("head_dim 12"), std::invalid_argument);
    CHECK_THROWS_WITH_AS(check_attention_shape(4, 4, 264), doctest::Contains("head_dim 264"), std::invalid_argument);
    CHECK_THROWS_WITH_AS(check_attention_shape(8, 1, 256), doctest::Contains("bytes of shared memory"),
                         std::invalid_argument);
    // The shared-memory bound, 4 * group * (head_dim + 8 * (head_dim + 2)) <= 48 KB, at its edges.
    CHECK_NOTHROW(check_attention_shape(5, 1, 256));  // 46,400 bytes
    CHECK_THROWS_WITH_AS(check_attention_shape(6, 1, 256), doctest::Contains("need 55680 bytes"),
                         std::invalid_argument);
    CHECK_NOTHROW(check_attention_shape(7, 1, 192));  // 48,832 bytes
    CHECK_THROWS_WITH_AS(check_attention_shape(8, 1, 192), doctest::Contains("need 55808 bytes"),
                         std::invalid_argument);
    CHECK_NOTHROW(check_norm_width(768));
    CHECK_NOTHROW(check_norm_width(8192));
    CHECK_THROWS_WITH_AS(check_norm_width(12), doctest::Contains("a row of 12 halves"), std::invalid_argument);
    CHECK_THROWS_WITH_AS(check_norm_width(8200), doctest::Contains("a row of 8200 halves"), std::invalid_argument);
    // Views at an odd offset: the kernels' 16-byte loads could not read them.
    const llm_decode::fused::Kernels& k = llm_decode::fused::host_kernels();
    const at::Tensor storage = at::zeros({2 * 64 + 8}, at::TensorOptions().dtype(at::kHalf));
    using llm_decode_test::half_ptr;
    const at::Tensor aligned = storage.narrow(0, 0, 64);
    const at::Tensor odd = storage.narrow(0, 65, 64);  // 130 bytes in
    CHECK_NOTHROW(k.add_rms_norm(half_ptr(aligned), nullptr, half_ptr(aligned), half_ptr(aligned), 1, 64, 1e-5F, nullptr));
    CHECK_THROWS_WITH_AS(
        k.add_rms_norm(half_ptr(aligned), nullptr, half_ptr(odd), half_ptr(aligned), 1, 64, 1e-5F, nullptr),
        doctest::Contains("the weight must be 16-byte aligned"), std::invalid_argument);
    const std::int64_t zero = 0;
    CHECK_THROWS_WITH_AS(k.decode_attention(half_ptr(aligned), half_ptr(odd), half_ptr(aligned), &zero, &zero,
                                            half_ptr(aligned), 1, 1, 1, 8, 1, 1, 1.0F, {}, nullptr),
                         doctest::Contains("the key cache must be 16-byte aligned"), std::invalid_argument);
    // A context split over blocks, without the workspace their states need.
    CHECK_THROWS_WITH_AS(k.decode_attention(half_ptr(aligned), half_ptr(aligned), half_ptr(aligned), &zero, &zero,
                                            half_ptr(aligned), 1, 1, 1, 8, 512, 300, 1.0F, {}, nullptr),
                         doctest::Contains("a context of 300 positions is split over 2 blocks"),
                         std::invalid_argument);
  }

  TEST_CASE("the fused products (their host versions) agree with a float32 linear to fp16 rounding, every output") {
    at::manual_seed(replay_test::case_seed());
    for (const bool narrow : {false, true}) {
      const llm_decode_test::NarrowProducts narrow_products(narrow);
      for (const llm_decode_test::ProductShape s : llm_decode_test::product_shapes()) {
        if (narrow && (s.rows < 2 || s.rows > llm_decode::fused::kMaxGemvRows)) continue;
        INFO(s.rows << " rows of " << s.in << " halves into " << s.out << " outputs" << (narrow ? ", narrow" : ""));
        const llm_decode_test::ProductErrors errors =
            llm_decode_test::fused_product_errors(llm_decode::fused::host_kernels(), cpu, s);
        CHECK(errors.split == ((s.rows == 64 && s.in == 512) || (s.rows == 16 && s.in == 2048)));
        CHECK(errors.linear < 2e-3);
        CHECK(errors.gated < 2e-3);
        CHECK(errors.repeatable);
        CHECK(errors.counters_left_zero);
      }
    }
    // A split product without its workspace.
    const llm_decode::fused::Kernels& k = llm_decode::fused::host_kernels();
    using llm_decode_test::half_ptr;
    const at::Tensor x = at::zeros({16, 2048}, at::TensorOptions().dtype(at::kHalf));
    const at::Tensor w = at::zeros({64, 2048}, x.options());
    const at::Tensor out = at::empty({16, 64}, x.options());
    CHECK_THROWS_WITH_AS(k.linear(half_ptr(x), half_ptr(w), half_ptr(out), 16, 2048, 64, {}, nullptr),
                         doctest::Contains("split the width over blocks, which need a workspace"),
                         std::invalid_argument);
    using llm_decode::fused::check_linear_shape;
    using llm_decode::fused::linear_fits;
    CHECK(linear_fits(8, 2048, 1));
    CHECK(linear_fits(64, 2048, 32000));
    CHECK_FALSE(linear_fits(24, 2048, 64));
    CHECK_FALSE(linear_fits(16, 2048, 48));
    CHECK_FALSE(linear_fits(16, 2056, 64));
    CHECK_NOTHROW(check_linear_shape(8, 2048, 1));
    // The step uses them at own_products_at()'s row counts (default 1 row), cuBLAS elsewhere.
    using llm_decode::fused::describe_product_rows;
    using llm_decode::fused::own_products_at;
    using llm_decode::fused::product_rows_of;
    using llm_decode::fused::product_rows_up_to;
    using llm_decode::fused::use_own_product;
    CHECK(own_products_at() == product_rows_up_to(1));
    CHECK(use_own_product(1, 2048, 64));
    CHECK_FALSE(use_own_product(2, 2048, 64));
    {
      const llm_decode_test::OwnProductRows all(llm_decode::fused::kMaxSkinnyRows);
      CHECK(use_own_product(8, 2048, 64));
      CHECK(use_own_product(64, 2048, 64));
      CHECK_FALSE(use_own_product(24, 2048, 64));  // linear_fits() still decides the shapes
    }
    CHECK(own_products_at() == product_rows_up_to(1));
    {
      // Some counts and not others: 1, 2 and 16 rows, cuBLAS at the rest.
      const llm_decode_test::OwnProductsAt some(product_rows_of({16, 2, 1}));
      CHECK(use_own_product(1, 2048, 64));
      CHECK(use_own_product(2, 2048, 64));
      CHECK(use_own_product(16, 2048, 64));
      for (const int cublas_rows : {3, 4, 8, 32, 64}) {
        CHECK(linear_fits(cublas_rows, 2048, 64));
        CHECK_FALSE(use_own_product(cublas_rows, 2048, 64));
      }
      CHECK_FALSE(use_own_product(0, 2048, 64));
      CHECK_FALSE(use_own_product(65, 2048, 64));
    }
    {
      const llm_decode_test::OwnProductRows none(0);
      CHECK_FALSE(use_own_product(1, 2048, 64));
      CHECK(own_products_at().none());
    }
    CHECK(product_rows_up_to(3) == product_rows_of({1, 2, 3}));
    CHECK(product_rows_up_to(64).all());
    CHECK(product_rows_of({}).none());
    CHECK(product_rows_of({1, 3}).to_ullong() == 0b101);  // rows r at bit r - 1
    CHECK(llm_decode::fused::product_row_list(product_rows_of({64, 3, 1})) == std::vector<int>{1, 3, 64});
    static_assert(!std::is_constructible_v<llm_decode_test::OwnProductsAt, int>);  // 8 is not row 4 alone
    CHECK(describe_product_rows(product_rows_up_to(0)) == "none");
    CHECK(describe_product_rows(product_rows_up_to(1)) == "1");
    CHECK(describe_product_rows(product_rows_up_to(8)) == "1 to 8");
    CHECK(describe_product_rows(product_rows_of({1, 2, 4})) == "1, 2 and 4");
    CHECK(describe_product_rows(product_rows_of({1, 3, 4, 5, 64})) == "1, 3 to 5 and 64");
    CHECK(describe_product_rows(product_rows_of({1, 2})) == "1 and 2");
    CHECK(describe_product_rows(product_rows_up_to(64)) == "1 to 64");
    CHECK_THROWS_WITH_AS(llm_decode::fused::set_own_product_rows(65), doctest::Contains("0 to 64"),
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS((void)product_rows_up_to(-1), doctest::Contains("up to -1 rows"), std::invalid_argument);
    CHECK_THROWS_WITH_AS((void)product_rows_of({2, 0}), doctest::Contains("own products at 0 rows; a count is 1 to 64"),
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS((void)product_rows_of({65}), doctest::Contains("at 65 rows"), std::invalid_argument);
    CHECK(own_products_at() == product_rows_up_to(1));  // the refusals changed nothing
    // The narrow tensor-core product in place of the GEMV: 2 to 8 rows, none by default.
    using llm_decode::fused::narrow_products_at;
    using llm_decode::fused::set_narrow_products_at;
    CHECK(narrow_products_at().none());
    for (const int outside : {1, 9, 16}) {
      const std::string message = "narrow products at " + std::to_string(outside) + " rows; they take 2 to 8";
      CHECK_THROWS_WITH_AS(set_narrow_products_at(product_rows_of({4, outside})), doctest::Contains(message.c_str()),
                           std::invalid_argument);
    }
    CHECK(narrow_products_at().none());  // the refusals changed nothing
    {
      const llm_decode_test::NarrowProducts narrow(true);
      CHECK(narrow_products_at() == product_rows_of({2, 3, 4, 5, 6, 7, 8}));
      CHECK_FALSE(use_own_product(4, 2048, 64));  // the way of the own products, not whether they are used
    }
    CHECK(narrow_products_at().none());
    {
      // A thread's own sets: in force on that thread alone, nested, put back; none: no change.
      using llm_decode::fused::ProductSets;
      using llm_decode::fused::ThreadProductSets;
      using llm_decode::fused::product_sets_in_force;
      const ProductSets process_wide = product_sets_in_force();
      const ProductSets mine{.own = product_rows_of({4, 16}), .narrow = product_rows_of({4})};
      {
        const ThreadProductSets scope(mine);
        CHECK(product_sets_in_force() == mine);
        CHECK(use_own_product(4, 2048, 64));
        CHECK_FALSE(use_own_product(1, 2048, 64));  // the process-wide set has 1 row; this thread's does not
        CHECK(own_products_at() == product_rows_up_to(1));  // the process-wide set itself is unchanged
        ProductSets seen_elsewhere;
        std::thread([&] { seen_elsewhere = product_sets_in_force(); }).join();
        CHECK(seen_elsewhere == process_wide);
        {
          const ThreadProductSets inner(ProductSets{.own = {}, .narrow = {}});
          CHECK_FALSE(use_own_product(4, 2048, 64));
          const ThreadProductSets none(std::nullopt);
          CHECK(product_sets_in_force().own.none());
        }
        CHECK(product_sets_in_force() == mine);
        CHECK_THROWS_WITH_AS(ThreadProductSets(ProductSets{.own = {}, .narrow = product_rows_of({9})}),
                             doctest::Contains("narrow products at 9 rows"), std::invalid_argument);
        CHECK(product_sets_in_force() == mine);  // the refusal opened nothing
      }
      CHECK(product_sets_in_force() == process_wide);
      // The kernels (here their host versions) pick the narrow product by
      // this thread's sets: under a scope, the product of the same set
      // process-wide, bit for bit; not the GEMV's. Inputs whose sum depends
      // on its order: 16384 first and -16384 last among 4,094 values of
      // 0.001, so each way's fp32 sums lose different parts of the small
      // ones beside the large (the GEMV's 4.105 against the narrow
      // product's 4.094, rounded to fp16; random inputs can round alike).
      const at::Tensor ordered = at::full({4, 4096}, 0.001, at::TensorOptions().dtype(at::kHalf));
      ordered.select(1, 0).fill_(16384);
      ordered.select(1, 4095).fill_(-16384);
      const at::Tensor ones = at::ones({512, 4096}, ordered.options());
      const auto product = [&] {
        const at::Tensor y = at::empty({4, 512}, ordered.options());
        k.linear(half_ptr(ordered), half_ptr(ones), half_ptr(y), 4, 4096, 512, {}, nullptr);
        return y;
      };
      at::Tensor scoped_narrow;
      {
        const ThreadProductSets scope(mine);
        scoped_narrow = product();
      }
      const at::Tensor gemv = product();
      const llm_decode_test::NarrowProducts narrow_everywhere(true);
      CHECK(product().equal(scoped_narrow));
      CHECK_FALSE(gemv.equal(scoped_narrow));
    }
    CHECK_THROWS_WITH_AS(check_linear_shape(9, 2048, 16), doctest::Contains("9 rows of 2048 halves into 16 outputs"),
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(check_linear_shape(1, 12, 16), doctest::Contains("1 rows of 12 halves"),
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(check_linear_shape(1, 64, 0), doctest::Contains("into 0 outputs"), std::invalid_argument);
    CHECK_THROWS_WITH_AS(check_linear_shape(80, 64, 64), doctest::Contains("80 rows"), std::invalid_argument);
    // An input at an odd offset: the tensor cores' loads could not read it.
    const at::Tensor storage = at::zeros({64 + 64 * 64}, at::TensorOptions().dtype(at::kHalf));
    const at::Tensor odd = storage.narrow(0, 8, 64);  // 16 bytes in
    const at::Tensor weight = storage.narrow(0, 64, 64 * 64);
    at::Tensor y = at::empty({1, 64}, storage.options());
    CHECK_THROWS_WITH_AS(k.linear(half_ptr(odd), half_ptr(weight), half_ptr(y), 1, 64, 64, {}, nullptr),
                         doctest::Contains("the input must be 32-byte aligned"), std::invalid_argument);
  }

  TEST_CASE("the narrow products keep 4 chunks in flight a warp where one pass takes the width, else 8; forced to 4 or 8, other numbers refused") {
    using llm_decode::fused::narrow_chunks_in_flight;
    CHECK(narrow_chunks_in_flight(8) == 4);
    CHECK(narrow_chunks_in_flight(1024) == 4);  // 32 chunks of 32 halves: one pass of 8 warps x 4
    CHECK(narrow_chunks_in_flight(1032) == 8);  // 33 chunks, the last of 8 halves
    CHECK(narrow_chunks_in_flight(8192) == 8);
    {
      const llm_decode_test::NarrowChunksInFlight forced(4);
      CHECK(narrow_chunks_in_flight(8192) == 4);
      CHECK(llm_decode::fused::forced_narrow_chunks_in_flight() == 4);
    }
    CHECK(llm_decode::fused::forced_narrow_chunks_in_flight() == 0);
    CHECK_THROWS_WITH_AS(llm_decode::fused::force_narrow_chunks_in_flight(5),
                         "fused: 5 chunks in flight for the narrow products; they keep 4 or 8 (0: by the width)",
                         std::invalid_argument);
    CHECK(llm_decode::fused::forced_narrow_chunks_in_flight() == 0);
  }

  TEST_CASE("the fused norm_linear (its host version) gives add_rms_norm then linear, bit for bit; misuse is named") {
    at::manual_seed(replay_test::case_seed());
    const llm_decode::fused::Kernels& k = llm_decode::fused::host_kernels();
    for (const auto& [in, out] : {std::pair{64, 256}, std::pair{768, 100}, std::pair{2048, 64}}) {
      for (const bool with_delta : {false, true}) {
        INFO(in << " halves into " << out << " outputs, " << (with_delta ? "with" : "without") << " a delta");
        const llm_decode_test::NormLinearCheck r =
            llm_decode_test::norm_linear_against_two_kernels(k, cpu, in, out, with_delta);
        CHECK(r.same_product);
        CHECK(r.same_sum);
        CHECK(r.x_untouched);
      }
    }
    using llm_decode_test::half_ptr;
    const at::Tensor x = at::zeros({2, 64}, at::TensorOptions().dtype(at::kHalf));
    const at::Tensor delta = at::zeros_like(x);
    const at::Tensor sum = at::zeros_like(x);
    const at::Tensor norm_weight = at::ones({64}, x.options());
    const at::Tensor weight = at::zeros({16, 64}, x.options());
    const at::Tensor y = at::empty({2, 16}, x.options());
    CHECK_THROWS_WITH_AS(k.norm_linear(half_ptr(x), half_ptr(delta), half_ptr(norm_weight), 1e-5F, half_ptr(sum),
                                       half_ptr(weight), half_ptr(y), 2, 64, 16, {}, nullptr),
                         doctest::Contains("2 rows; it takes one"), std::invalid_argument);
    CHECK_THROWS_WITH_AS(k.norm_linear(half_ptr(x), half_ptr(delta), half_ptr(norm_weight), 1e-5F, half_ptr(x),
                                       half_ptr(weight), half_ptr(y), 1, 64, 16, {}, nullptr),
                         doctest::Contains("x_out must be a buffer of its own"), std::invalid_argument);
    CHECK_THROWS_WITH_AS(k.norm_linear(half_ptr(x), half_ptr(delta), half_ptr(norm_weight), 1e-5F, half_ptr(sum),
                                       half_ptr(weight), half_ptr(y), 1, 12, 16, {}, nullptr),
                         doctest::Contains("a row of 12 halves"), std::invalid_argument);
    // When a step folds: the switch, one row, and the step's own products.
    using llm_decode::fused::folds_norms;
    CHECK_FALSE(llm_decode::fused::fold_norms());  // off by default
    CHECK_FALSE(folds_norms(1, 64, 128, 256, 256));
    {
      const llm_decode_test::FoldNorms on(true);
      CHECK(folds_norms(1, 64, 128, 256, 256));
      CHECK_FALSE(folds_norms(2, 64, 128, 256, 256));
      const llm_decode_test::OwnProductRows cublas(0);
      CHECK_FALSE(folds_norms(1, 64, 128, 256, 256));
    }
    CHECK_FALSE(llm_decode::fused::fold_norms());
  }

  TEST_CASE("the fused gate_up_silu (its host version, GEMV and narrow) gives linear then silu_mul, bit for bit; misuse is named") {
    at::manual_seed(replay_test::case_seed());
    const llm_decode::fused::Kernels& k = llm_decode::fused::host_kernels();
    // Odd widths (a last block of one output), and more vectors than one
    // pass of the threads.
    for (const bool narrow : {false, true}) {
      const llm_decode_test::NarrowProducts narrow_products(narrow);
      for (const auto& [in, width] : {std::pair{64, 37}, std::pair{264, 16}, std::pair{8, 3}, std::pair{8200, 5}}) {
        for (const int rows : {1, 3, llm_decode::fused::kMaxGemvRows}) {
          INFO(rows << " rows of " << in << " halves into " << width << " outputs" << (narrow ? ", narrow" : ""));
          CHECK(llm_decode_test::gate_up_silu_as_two_kernels(k, cpu, {rows, in, width}));
        }
      }
    }
    using llm_decode_test::half_ptr;
    const at::Tensor x = at::zeros({16, 64}, at::TensorOptions().dtype(at::kHalf));
    const at::Tensor gate_up = at::zeros({32, 64}, x.options());
    const at::Tensor out = at::empty({16, 16}, x.options());
    CHECK_THROWS_WITH_AS(k.gate_up_silu(half_ptr(x), half_ptr(gate_up), half_ptr(out), 16, 64, 16, nullptr),
                         doctest::Contains("16 rows of 64 halves into 16 outputs; it takes 1 to 8 rows"),
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(k.gate_up_silu(half_ptr(x), half_ptr(gate_up), half_ptr(out), 1, 12, 16, nullptr),
                         doctest::Contains("1 rows of 12 halves"), std::invalid_argument);
    CHECK_THROWS_WITH_AS(k.gate_up_silu(half_ptr(x) + 8, half_ptr(gate_up), half_ptr(out), 1, 64, 16, nullptr),
                         doctest::Contains("the input must be 32-byte aligned"), std::invalid_argument);
  }

  TEST_CASE("folded norms (host versions): one-row decode steps give the unfolded steps' logits and cache, bit for bit") {
    for (const auto& [heads, kv_heads] : {std::pair{4, 2}, std::pair{4, 4}}) {
      CAPTURE(heads);
      const LlamaConfig config = llm_decode_test::tiny_config(heads, kv_heads, /*tied=*/heads == kv_heads);
      const LlamaModel model = LlamaModel::random(config, replay_test::case_seed(), cpu, at::kHalf);
      const std::vector<llm_decode_test::Sequence> one{llm_decode_test::three_sequences(config.vocab_size, 30, 17)[1]};
      const auto fused = llm_decode::DecodeKernels::fused;
      KvCache plain_cache(config, 3, cpu, at::kHalf);
      const std::vector<at::Tensor> plain = llm_decode_test::cached_logits(model, plain_cache, one, 0, 0, fused);
      KvCache folded_cache(config, 3, cpu, at::kHalf);
      std::vector<at::Tensor> folded;
      {
        const llm_decode_test::FoldNorms on(true);
        // The steps of this model fold (one row, its own products).
        REQUIRE(llm_decode_test::folds_norms(config));
        folded = llm_decode_test::cached_logits(model, folded_cache, one, 0, 0, fused);
      }
      REQUIRE(folded.size() == plain.size());
      REQUIRE(folded.front().sizes() == plain.front().sizes());
      CHECK(folded.front().equal(plain.front()));
      CHECK(folded_cache.k.equal(plain_cache.k));
      CHECK(folded_cache.v.equal(plain_cache.v));
    }
  }

  TEST_CASE("programmatic launches after own kernels: only where every dependency is a fused launch's node of the same capture") {
    using llm_decode::fused::launch_programmatically;
    using llm_decode::fused::OwnCapturedKernels;
    using llm_decode::fused::ProgrammaticLaunches;
    CHECK(llm_decode::fused::programmatic_launches() == ProgrammaticLaunches::after_own_kernels);  // the default
    for (const std::optional<bool> follows_own : {std::optional<bool>{}, std::optional<bool>{true}, std::optional<bool>{false}}) {
      CHECK(launch_programmatically(ProgrammaticLaunches::always, follows_own));
      CHECK_FALSE(launch_programmatically(ProgrammaticLaunches::off, follows_own));
    }
    CHECK(launch_programmatically(ProgrammaticLaunches::after_own_kernels, true));
    CHECK_FALSE(launch_programmatically(ProgrammaticLaunches::after_own_kernels, false));
    CHECK(launch_programmatically(ProgrammaticLaunches::after_own_kernels, std::nullopt));  // outside a capture

    // What a stream reports, with stand-in node handles: only compared, never passed to CUDA.
    const auto node = [](std::uintptr_t n) { return reinterpret_cast<cudaGraphNode_t>(n * 64); };
    const auto capturing = [](unsigned long long capture, const auto& nodes,
                              const cudaGraphEdgeData* edges = nullptr) {
      return llm_decode::fused::CaptureDependencies{.status = cudaStreamCaptureStatusActive,
                                                    .capture = capture,
                                                    .nodes = nodes.data(),
                                                    .edges = edges,
                                                    .count = nodes.size()};
    };
    const std::array<cudaGraphNode_t, 0> none{};
    const std::array first{node(1)};
    const std::array second{node(2)};
    const std::array torch_kernel{node(3)};
    const std::array both{first[0], second[0]};
    const std::array mixed{second[0], torch_kernel[0]};
    OwnCapturedKernels own;
    CHECK_FALSE(own.follows_own(llm_decode::fused::CaptureDependencies{}).has_value());  // not capturing
    CHECK(own.follows_own(capturing(7, none)) == true);  // a capture's first node depends on nothing
    CHECK(own.follows_own(capturing(7, first)) == false);
    own.record_launch(capturing(7, first));
    own.record_launch(capturing(7, second));
    own.record_launch(capturing(7, both));  // not one node: not a launch's own, ignored
    own.record_launch(llm_decode::fused::CaptureDependencies{.capture = 7, .nodes = torch_kernel.data(), .count = 1});
    CHECK(own.follows_own(capturing(7, first)) == true);
    CHECK(own.follows_own(capturing(7, second)) == true);
    CHECK(own.follows_own(capturing(7, torch_kernel)) == false);  // a node no fused launch added
    CHECK(own.follows_own(capturing(7, both)) == true);           // a join of two own kernels
    CHECK(own.follows_own(capturing(7, mixed)) == false);
    const std::array<cudaGraphEdgeData, 2> default_edges{};
    CHECK(own.follows_own(capturing(7, both, default_edges.data())) == true);
    std::array<cudaGraphEdgeData, 2> programmatic_edge{};
    programmatic_edge[1].type = cudaGraphDependencyTypeProgrammatic;
    CHECK(own.follows_own(capturing(7, both, programmatic_edge.data())) == false);
    std::array<cudaGraphEdgeData, 2> ported_edge{};
    ported_edge[0].from_port = cudaGraphKernelNodePortLaunchCompletion;
    CHECK(own.follows_own(capturing(7, both, ported_edge.data())) == false);
    CHECK(own.follows_own(capturing(8, first)) == false);  // the same handle in another capture is not ours
    own.record_launch(capturing(8, torch_kernel));          // a launch in another capture starts afresh
    CHECK(own.follows_own(capturing(8, torch_kernel)) == true);
    CHECK(own.follows_own(capturing(8, first)) == false);
    CHECK(own.follows_own(capturing(7, first)) == false);  // capture 7's nodes no longer count
  }

  TEST_CASE("the fused step bookkeeping (its host versions) writes what the ATen bookkeeping writes, bit for bit") {
    const llm_decode_test::BookkeepingComparison result =
        llm_decode_test::compare_step_bookkeeping(llm_decode::fused::host_kernels(), cpu, 200);
    CHECK(result.inputs_differing == 0);
    CHECK(result.differing == 0);
    // The trials reached every outcome.
    CHECK(result.finished_by_eos > 0);
    CHECK(result.finished_by_limit > 0);
    CHECK(result.loops_stopped > 0);
    CHECK(result.loops_going > 0);
  }

  TEST_CASE("weights given as views at odd offsets are stored aligned: the fused kernels' 16-byte loads take them") {
    const LlamaConfig config = LlamaConfig::preset("tiny");
    const LlamaModel aligned = LlamaModel::random(config, replay_test::case_seed(), cpu, at::kHalf);
    LlamaModel::StateDict weights = aligned.state_dict().copy();
    for (const std::string name : {"model.norm.weight", "model.layers.0.input_layernorm.weight",
                                   "model.layers.1.post_attention_layernorm.weight"}) {
      const at::Tensor weight = weights.at(name);
      const at::Tensor buffer = at::empty({weight.numel() + 1}, weight.options());
      const at::Tensor odd = buffer.narrow(0, 1, weight.numel()).copy_(weight);  // 2 bytes in
      REQUIRE(reinterpret_cast<std::uintptr_t>(odd.data_ptr()) % 16 != 0);
      weights.insert_or_assign(name, odd);
    }
    const LlamaModel model = LlamaModel::from_state_dict(config, weights, cpu, at::kHalf);
    KvCache cache(config, 1, cpu, at::kHalf);
    KvCache aligned_cache(config, 1, cpu, at::kHalf);
    const auto t = [](const std::vector<std::int64_t>& v) { return llm_decode_test::int64_tensor(v, cpu); };
    const at::Tensor logits = model.decode(cache, t({0}), t({0}), t({7}), 8, llm_decode::DecodeKernels::fused);
    const at::Tensor expected =
        aligned.decode(aligned_cache, t({0}), t({0}), t({7}), 8, llm_decode::DecodeKernels::fused);
    CHECK(logits.equal(expected));
  }

  TEST_CASE("fused_step_rows refuses state rows of other sizes, types or layouts, naming them") {
    const auto options = at::TensorOptions().dtype(at::kLong);
    const at::Tensor block = at::zeros({9, 4}, options);  // rows 0..6 of state, two ring rows
    const auto state = [&] {
      return llm_decode::StepState{.slots = block[0], .positions = block[1], .tokens = block[2], .limits = block[3],
                                   .done = block[4], .counts = block[6], .loop = block[5].narrow(0, 0, 3),
                                   .ring = block.narrow(0, 7, 2)};
    };
    const at::Tensor eos = llm_decode_test::int64_tensor({2}, cpu);
    const llm_decode::fused::StepRows rows = llm_decode::fused_step_rows(state(), eos, 9);
    CHECK(rows.rows == 4);
    CHECK(rows.ring_steps == 2);
    CHECK(rows.ring_stride == 4);
    CHECK(rows.eos_count == 1);
    llm_decode::StepState shorter = state();
    shorter.tokens = block[2].narrow(0, 0, 3);
    CHECK(contains(invalid_argument_message([&] { (void)llm_decode::fused_step_rows(shorter, eos, 9); }),
                   "tokens must be a contiguous 1-D int64 tensor of 4 elements"));
    llm_decode::StepState int32 = state();
    int32.done = block[4].to(at::kInt);
    CHECK(contains(invalid_argument_message([&] { (void)llm_decode::fused_step_rows(int32, eos, 9); }),
                   "done must be"));
    llm_decode::StepState strided = state();
    strided.counts = block.select(1, 0).narrow(0, 0, 4);  // a column: stride 4
    CHECK(contains(invalid_argument_message([&] { (void)llm_decode::fused_step_rows(strided, eos, 9); }),
                   "counts must be a contiguous"));
    llm_decode::StepState short_loop = state();
    short_loop.loop = block[5].narrow(0, 0, 2);
    CHECK(contains(invalid_argument_message([&] { (void)llm_decode::fused_step_rows(short_loop, eos, 9); }),
                   "loop must be a contiguous 1-D int64 tensor of 3 elements"));
    llm_decode::StepState narrow_ring = state();
    narrow_ring.ring = block.narrow(0, 7, 2).narrow(1, 0, 3);
    CHECK(contains(invalid_argument_message([&] { (void)llm_decode::fused_step_rows(narrow_ring, eos, 9); }),
                   "the ring must be int64 [steps >= 1, 4]"));
    CHECK(contains(invalid_argument_message([&] { (void)llm_decode::fused_step_rows(state(), eos.view({1, 1}), 9); }),
                   "eos must be"));
  }

  TEST_CASE("save and load round-trip the weights and the logits, with Hugging Face's names, tied or not") {
    for (const bool tied : {true, false}) {
      CAPTURE(tied);
      const LlamaConfig config = llm_decode_test::tiny_config(4, 2, tied);
      const LlamaModel model = LlamaModel::random(config, replay_test::case_seed(), cpu, at::kFloat);
      const TempDir dir;
      model.save(dir.path);
      REQUIRE(std::filesystem::exists(dir.path / "config.json"));
      REQUIRE(std::filesystem::exists(dir.path / "weights.pt"));
      // Python's torch.load (weights_only by default) refuses TorchScript's dict type tags.
      const std::vector<char> bytes = llm_decode::detail::read_binary_file(dir.path / "weights.pt");
      CHECK(std::string(bytes.begin(), bytes.end()).find("restore_type_tag") == std::string::npos);
      const LlamaModel loaded = LlamaModel::load(dir.path, cpu, at::kFloat);
      CHECK(loaded.config().tie_embeddings == tied);
      const LlamaModel::StateDict weights = loaded.state_dict();
      CHECK(same_weights(weights, model.state_dict()));
      CHECK(static_cast<std::int64_t>(weights.size()) == 2 + 9 * config.num_layers + (tied ? 0 : 1));
      CHECK(weights.contains("lm_head.weight") == !tied);
      for (const char* name : {"model.embed_tokens.weight", "model.layers.1.self_attn.k_proj.weight",
                               "model.layers.0.mlp.up_proj.weight", "model.layers.1.post_attention_layernorm.weight",
                               "model.norm.weight"}) {
        CAPTURE(name);
        REQUIRE(weights.contains(name));
        CHECK((weights.at(name).device() == cpu));
        CHECK(weights.at(name).is_contiguous());
      }
      // Unfused: k_proj is [kv_heads * head_dim, hidden], its own storage.
      const at::Tensor k_proj = weights.at("model.layers.1.self_attn.k_proj.weight");
      CHECK(k_proj.sizes() == at::IntArrayRef({config.num_kv_heads * config.head_dim(), config.hidden_size}));
      CHECK(k_proj.storage().nbytes() == static_cast<std::size_t>(k_proj.numel()) * sizeof(float));

      const at::Tensor tokens = llm_decode_test::int64_tensor(llm_decode_test::random_tokens(10, config.vocab_size), cpu);
      CHECK(loaded.forward_full(tokens).equal(model.forward_full(tokens)));
      // Loaded in float16 from float32 files: cast at load.
      CHECK((LlamaModel::load(dir.path, cpu, at::kHalf).state_dict().at("model.norm.weight").scalar_type() == at::kHalf));
    }
  }

  TEST_CASE("random(seed) is deterministic, draws what Python's torch draws, and different seeds differ") {
    const LlamaConfig config = LlamaConfig::preset("tiny");
    const LlamaModel::StateDict a = LlamaModel::random(config, 1234, cpu, at::kFloat).state_dict();
    CHECK(same_weights(a, LlamaModel::random(config, 1234, cpu, at::kFloat).state_dict()));
    CHECK_FALSE(same_weights(a, LlamaModel::random(config, 1235, cpu, at::kFloat).state_dict()));
    // g = torch.Generator().manual_seed(1234); then torch.empty(shape).normal_(0, 0.02, generator=g)
    // per matrix in weight_shapes() order: embed_tokens first, then layer 0's q_proj.
    const at::Tensor embed = a.at("model.embed_tokens.weight");
    CHECK(embed[0][0].item<double>() == -0.0022343711461871862);
    CHECK(embed[0][3].item<double>() == -0.017633754760026932);
    CHECK(embed[255][63].item<double>() == 0.031597260385751724);
    CHECK(a.at("model.layers.0.self_attn.q_proj.weight")[0][1].item<double>() == -0.005766363814473152);
    CHECK(a.at("model.layers.1.input_layernorm.weight").equal(at::ones({config.hidden_size})));
    const double spread = embed.std().item<double>();
    CHECK(spread > 0.018);
    CHECK(spread < 0.022);
    // Another dtype: the same float32 draws, cast.
    const LlamaModel::StateDict half = LlamaModel::random(config, 1234, cpu, at::kHalf).state_dict();
    CHECK(half.at("model.layers.1.mlp.down_proj.weight")
              .equal(a.at("model.layers.1.mlp.down_proj.weight").to(at::kHalf)));
  }

  TEST_CASE("config presets, config.json round trip, and bad configs named by their key") {
    const LlamaConfig small = LlamaConfig::preset("small");
    CHECK(small.vocab_size == 32000);
    CHECK(small.hidden_size == 768);
    CHECK(small.intermediate_size == 2048);
    CHECK(small.num_layers == 12);
    CHECK(small.head_dim() == 64);
    CHECK(small.group_size() == 3);
    CHECK(small.max_len == 1024);
    CHECK(small.tie_embeddings);
    const LlamaConfig big = LlamaConfig::preset("1b");
    CHECK(big.hidden_size == 2048);
    CHECK(big.intermediate_size == 8192);
    CHECK(big.num_layers == 16);
    CHECK(big.head_dim() == 64);
    CHECK(big.group_size() == 4);
    CHECK_FALSE(big.tie_embeddings);
    CHECK(LlamaConfig::preset("tiny").group_size() == 2);
    // A report names the preset of the sizes it measured (weights record sizes, not their preset).
    for (const char* name : {"tiny", "small", "1b"}) {
      CAPTURE(name);
      LlamaConfig config = LlamaConfig::preset(name);
      CHECK(LlamaConfig::preset_of(config) == name);
      config.max_len = 4096;  // a longer cache is still the preset
      config.rope_theta = 500000.0;
      CHECK(LlamaConfig::preset_of(config) == name);
      // Any size changed makes it another model.
      for (std::int64_t LlamaConfig::*size :
           {&LlamaConfig::vocab_size, &LlamaConfig::hidden_size, &LlamaConfig::intermediate_size,
            &LlamaConfig::num_layers, &LlamaConfig::num_heads, &LlamaConfig::num_kv_heads}) {
        LlamaConfig other = config;
        other.*size += 1;
        CHECK(LlamaConfig::preset_of(other) == "custom");
      }
      LlamaConfig retied = config;
      retied.tie_embeddings = !config.tie_embeddings;
      CHECK(LlamaConfig::preset_of(retied) == "custom");
    }
    const std::string unknown = invalid_argument_message([] { (void)LlamaConfig::preset("7b"); });
    CHECK(contains(unknown, "\"7b\""));
    CHECK(contains(unknown, "tiny, small and 1b"));

    const TempDir dir;
    const std::filesystem::path path = dir.path / "config.json";
    for (const char* name : {"tiny", "small", "1b"}) {
      CAPTURE(name);
      LlamaConfig config = LlamaConfig::preset(name);
      config.rope_theta = 500000.0;
      config.rms_norm_eps = 1e-6;
      llm_decode::write_config(config, path, "bfloat16");
      const LlamaConfig read = llm_decode::read_config(path);
      CHECK(LlamaConfig::preset_of(read) == name);
      CHECK(read.vocab_size == config.vocab_size);
      CHECK(read.hidden_size == config.hidden_size);
      CHECK(read.intermediate_size == config.intermediate_size);
      CHECK(read.num_layers == config.num_layers);
      CHECK(read.num_heads == config.num_heads);
      CHECK(read.num_kv_heads == config.num_kv_heads);
      CHECK(read.max_len == config.max_len);
      CHECK(read.rope_theta == config.rope_theta);
      CHECK(read.rms_norm_eps == config.rms_norm_eps);
      CHECK(read.tie_embeddings == config.tie_embeddings);
    }
    // Hugging Face's key names.
    std::ifstream in(path);
    const nlohmann::json written = nlohmann::json::parse(in);
    CHECK(written.at("num_hidden_layers") == 16);
    CHECK(written.at("num_key_value_heads") == 8);
    CHECK(written.at("max_position_embeddings") == 1024);
    CHECK(written.at("tie_word_embeddings") == false);
    CHECK(written.at("torch_dtype") == "bfloat16");
    CHECK(written.at("model_type") == "llama");

    // One key changed (or dropped) at a time; the message names it.
    const auto with = [&](const char* key, const nlohmann::json& value) {
      nlohmann::json j = written;
      if (value.is_discarded()) {
        j.erase(key);
      } else {
        j[key] = value;
      }
      write_text(path, j.dump());
      return invalid_argument_message([&] { (void)llm_decode::read_config(path); });
    };
    const nlohmann::json dropped = nlohmann::json(nlohmann::json::value_t::discarded);
    std::string message = with("num_key_value_heads", dropped);
    CHECK(contains(message, "\"num_key_value_heads\" is missing"));
    CHECK(contains(message, path.string()));
    CHECK(contains(with("rms_norm_eps", dropped), "\"rms_norm_eps\" is missing"));
    message = with("hidden_size", "2048");
    CHECK(contains(message, "\"hidden_size\" must be an integer"));
    CHECK(contains(message, "string"));
    CHECK(contains(with("num_hidden_layers", 2.5), "\"num_hidden_layers\" must be an integer"));
    CHECK(contains(with("tie_word_embeddings", 1), "\"tie_word_embeddings\" must be true or false"));
    CHECK(contains(with("rope_theta", "10000"), "\"rope_theta\" must be a number"));
    CHECK(contains(with("num_attention_heads", 4), "num_attention_heads must be a multiple of num_key_value_heads"));
    CHECK(contains(with("hidden_size", 0), "hidden_size must be positive"));
    CHECK(contains(with("rope_scaling", nlohmann::json{{"rope_type", "llama3"}}), "\"rope_scaling\""));
    CHECK(contains(with("hidden_act", "gelu"), "\"hidden_act\""));
    // Newer transformers releases keep rope_theta in rope_parameters.
    nlohmann::json moved = written;
    moved.erase("rope_theta");
    moved["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 250000.0}};
    write_text(path, moved.dump());
    CHECK(llm_decode::read_config(path).rope_theta == 250000.0);

    write_text(path, "{\"vocab_size\": 256,");
    CHECK(contains(invalid_argument_message([&] { (void)llm_decode::read_config(path); }), "not valid JSON"));
    write_text(path, "[1, 2]");
    CHECK(contains(invalid_argument_message([&] { (void)llm_decode::read_config(path); }), "JSON object"));
    CHECK_THROWS_AS((void)llm_decode::read_config(dir.path / "absent.json"), std::runtime_error);
  }

  TEST_CASE("bad prefill and decode inputs are refused before any kernel, with a message naming them") {
    const LlamaConfig config = LlamaConfig::preset("tiny");
    const LlamaModel model = LlamaModel::random(config, replay_test::case_seed(), cpu, at::kFloat);
    KvCache cache(config, 2, cpu, at::kFloat);
    const auto t = [](const std::vector<std::int64_t>& v) { return llm_decode_test::int64_tensor(v, cpu); };
    const at::Tensor prompt = t({1, 2, 3});
    (void)model.prefill(cache, 0, prompt);
    const at::Tensor k_before = cache.k.clone();

    // prefill: the prompt's length, dtype and rank; the slot's range (a host integer).
    const at::Tensor too_long = at::zeros({config.max_len + 1}, at::kLong);
    CHECK(contains(invalid_argument_message([&] { (void)model.prefill(cache, 0, too_long); }), "a prompt of 65 tokens"));
    CHECK(contains(invalid_argument_message([&] { (void)model.prefill(cache, 0, at::zeros({0}, at::kLong)); }),
                   "a prompt of 0 tokens"));
    CHECK(contains(invalid_argument_message([&] { (void)model.prefill(cache, 0, prompt.to(at::kInt)); }), "int64"));
    CHECK(contains(invalid_argument_message([&] { (void)model.prefill(cache, 0, prompt.view({1, 3})); }), "1-D"));
    for (const std::int64_t slot : {std::int64_t{-1}, std::int64_t{2}, std::int64_t{7}}) {
      CAPTURE(slot);
      const std::string message = invalid_argument_message([&] { (void)model.prefill(cache, slot, prompt); });
      CHECK(contains(message, "prefill slot " + std::to_string(slot) + " is out of range"));
      CHECK(contains(message, "spare"));
    }
    CHECK(contains(invalid_argument_message([&] { (void)model.forward_full(too_long); }), "max_position_embeddings"));

    // decode: sizes, dtypes and the context; values are left to check_decode_values.
    const at::Tensor slots = t({0, 1});
    const at::Tensor positions = t({3, 0});
    const at::Tensor tokens = t({4, 5});
    CHECK(contains(invalid_argument_message([&] { (void)model.decode(cache, t({0}), positions, tokens, 8); }),
                   "decode slots has 1 rows, tokens has 2"));
    CHECK(contains(invalid_argument_message([&] { (void)model.decode(cache, slots, t({3, 0, 1}), tokens, 8); }),
                   "decode positions has 3 rows"));
    CHECK(contains(invalid_argument_message([&] { (void)model.decode(cache, t({}), t({}), t({}), 8); }), "empty"));
    // The fused kernels: fp16 on a CUDA device only.
    CHECK(contains(invalid_argument_message([&] {
                     (void)model.decode(cache, slots, positions, tokens, 8, llm_decode::DecodeKernels::fused);
                   }),
                   "DecodeKernels::fused needs the model in fp16"));
    CHECK(contains(invalid_argument_message([&] { (void)model.decode(cache, slots.to(at::kInt), positions, tokens, 8); }),
                   "decode slots must be a 1-D int64 tensor"));
    CHECK(contains(invalid_argument_message([&] { (void)model.decode(cache, slots, positions, tokens, 0); }),
                   "decode context 0 must be in 1..64"));
    CHECK(contains(invalid_argument_message(
                       [&] { (void)model.decode(cache, slots, positions, tokens, config.max_len + 1); }),
                   "decode context 65"));
    // A cache made for another model (or dtype).
    KvCache other_heads(llm_decode_test::tiny_config(4, 4), 2, cpu, at::kFloat);
    CHECK(contains(invalid_argument_message([&] { (void)model.decode(other_heads, slots, positions, tokens, 8); }),
                   "the KV cache's k has shape [2, 3, 4, 64, 16]"));
    KvCache half_cache(config, 2, cpu, at::kHalf);
    CHECK(contains(invalid_argument_message([&] { (void)model.prefill(half_cache, 0, prompt); }), "Half"));
    CHECK(cache.k.equal(k_before));  // none of the refused calls wrote anything

    // The values, checked apart (they would need a synchronization inside decode).
    CHECK_NOTHROW(model.check_decode_values(cache, slots, positions, tokens, 8));
    CHECK_NOTHROW(model.check_decode_values(cache, t({2}), t({0}), t({0}), 1));  // the spare slot is a valid row
    CHECK(contains(invalid_argument_message([&] { model.check_decode_values(cache, slots, t({3, 8}), tokens, 8); }),
                   "decode positions[1] = 8 is out of range: it must be in 0..7"));
    CHECK(contains(invalid_argument_message([&] { model.check_decode_values(cache, t({0, 3}), positions, tokens, 8); }),
                   "decode slots[1] = 3"));
    CHECK(contains(invalid_argument_message([&] { model.check_decode_values(cache, slots, positions, t({4, 256}), 8); }),
                   "decode tokens[1] = 256"));
    // Two rows in one slot: refused, naming both; padding rows share the spare slot.
    CHECK(contains(invalid_argument_message(
                       [&] { model.check_decode_values(cache, t({1, 0, 1}), t({0, 1, 2}), t({4, 5, 6}), 8); }),
                   "decode slots[0] and slots[2] are both 1"));
    CHECK_NOTHROW(model.check_decode_values(cache, t({2, 0, 2}), t({0, 1, 0}), t({4, 5, 0}), 8));

    CHECK_THROWS_AS(KvCache(config, 0, cpu, at::kFloat), std::invalid_argument);
  }

  TEST_CASE("weights that do not fit the config are refused, naming the weight") {
    const LlamaConfig config = LlamaConfig::preset("tiny");
    const LlamaModel::StateDict good = LlamaModel::random(config, 5, cpu, at::kFloat).state_dict();
    const auto edited = [&](const std::function<void(LlamaModel::StateDict&)>& edit) {
      LlamaModel::StateDict weights = good.copy();
      edit(weights);
      return invalid_argument_message([&] { (void)LlamaModel::from_state_dict(config, weights, cpu, at::kFloat); });
    };
    CHECK(contains(edited([](LlamaModel::StateDict& w) { (void)w.erase("model.norm.weight"); }),
                   "weight \"model.norm.weight\" is missing"));
    CHECK(contains(edited([](LlamaModel::StateDict& w) {
                     w.insert_or_assign("model.layers.1.mlp.gate_proj.weight", at::zeros({64, 64}));
                   }),
                   "weight \"model.layers.1.mlp.gate_proj.weight\" has shape [64, 64], the config needs [128, 64]"));
    CHECK(contains(edited([](LlamaModel::StateDict& w) { w.insert("model.layers.2.mlp.up_proj.weight", at::zeros({1})); }),
                   "unexpected weight \"model.layers.2.mlp.up_proj.weight\""));
    // A tied model's lm_head.weight (Python's state_dict() lists it) is ignored.
    LlamaModel::StateDict with_head = good.copy();
    with_head.insert("lm_head.weight", at::zeros({config.vocab_size, config.hidden_size}));
    CHECK(same_weights(LlamaModel::from_state_dict(config, with_head, cpu, at::kFloat).state_dict(), good));
    CHECK(contains(invalid_argument_message([&] { (void)LlamaModel::random(config, 1, cpu, at::kInt); }),
                   "float16, bfloat16 or float32"));
  }
}
