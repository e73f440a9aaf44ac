// examples/llm_decode/product_tuning.hpp without a device: the policy that
// turns each way's step times into the sets of row counts given the own and
// the narrow products (choose_own_products, with_way), the counts at which
// they change a step at all, the refusals tune_own_products makes before it
// captures or changes anything, and the scope that puts a set back. The timing itself runs in
// gpu/llm_decode_engine_test.cpp.
//
// libtorch first: c10's logging header defines a glog-style CHECK macro,
// which is dropped here so that doctest's CHECK is the one in force.
#include <ATen/ATen.h>

#include "config.hpp"
#include "fused_kernels.hpp"
#include "model.hpp"
#include "product_tuning.hpp"

#undef CHECK
#include <doctest/doctest.h>
#include "llm_decode_support.hpp"
#include "threads_at_once.hpp"

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

using llm_decode::ProductSets;
using llm_decode::ProductTiming;
using llm_decode::ProductWay;
using llm_decode::choose_own_products;
using llm_decode::fused::product_row_list;
using llm_decode::fused::product_rows_of;

ProductSets own_at(std::vector<int> rows) { return {.own = product_rows_of(rows), .narrow = {}}; }

}  // namespace

TEST_SUITE("host") {
  TEST_CASE("choose_own_products: each timed count takes the way faster by the margin; near ties and untimed counts keep the start") {
    const ProductSets start = own_at({1, 4, 32});
    const std::vector<ProductTiming> timings{
        {.rows = 1, .own_seconds = 1.00, .cublas_seconds = 1.20},  // own faster: stays own
        {.rows = 2, .own_seconds = 0.90, .cublas_seconds = 1.00},  // own 10% faster: becomes own
        {.rows = 4, .own_seconds = 1.10, .cublas_seconds = 1.00},  // cuBLAS 9% faster: becomes cuBLAS
        {.rows = 8, .own_seconds = 0.99, .cublas_seconds = 1.00},  // own 1% faster: a tie, stays cuBLAS
        {.rows = 32, .own_seconds = 1.01, .cublas_seconds = 1.00},  // cuBLAS 1% faster: a tie, stays own
        {.rows = 64, .own_seconds = 0.98, .cublas_seconds = 1.00},  // exactly the margin: becomes own
    };
    const ProductSets chosen = choose_own_products(timings, start, 0.02);
    CHECK(product_row_list(chosen.own) == std::vector<int>{1, 2, 32, 64});
    CHECK(chosen.narrow.none());
    // Counts not timed keep the start (1, 4 and 32 set, the rest clear), and
    // timed counts whose faster way the start already has change nothing.
    CHECK(choose_own_products({}, start, 0.02) == start);
    CHECK(choose_own_products({{.rows = 2, .own_seconds = 2.0, .cublas_seconds = 1.0},
                               {.rows = 4, .own_seconds = 1.0, .cublas_seconds = 2.0}},
                              start, 0.02) == start);
    // With no margin, any difference decides; an exact tie still keeps the start.
    CHECK(product_row_list(choose_own_products(timings, start, 0.0).own) == std::vector<int>{1, 2, 8, 64});
    CHECK(choose_own_products({{.rows = 4, .own_seconds = 1.0, .cublas_seconds = 1.0}}, start, 0.0) == start);
  }

  TEST_CASE("choose_own_products with the narrow products: the fastest of three ways, against the start's way") {
    const ProductSets start{.own = product_rows_of({1, 2, 4, 6}), .narrow = product_rows_of({6})};
    const std::vector<ProductTiming> timings{
        // GEMV at the start; narrow 20% faster: becomes narrow.
        {.rows = 2, .own_seconds = 1.00, .cublas_seconds = 1.10, .narrow_seconds = 0.80},
        // GEMV at the start; narrow 1% faster (a tie), cuBLAS slower: stays GEMV.
        {.rows = 4, .own_seconds = 1.00, .cublas_seconds = 1.50, .narrow_seconds = 0.99},
        // narrow at the start; cuBLAS fastest by 10%: becomes cuBLAS (and leaves the narrow set).
        {.rows = 6, .own_seconds = 1.20, .cublas_seconds = 0.90, .narrow_seconds = 1.00},
        // cuBLAS at the start; narrow fastest, GEMV also faster: becomes narrow.
        {.rows = 8, .own_seconds = 0.95, .cublas_seconds = 1.00, .narrow_seconds = 0.70},
    };
    const ProductSets chosen = choose_own_products(timings, start, 0.02);
    CHECK(product_row_list(chosen.own) == std::vector<int>{1, 2, 4, 8});
    CHECK(product_row_list(chosen.narrow) == std::vector<int>{2, 8});
    CHECK(llm_decode::way_at(chosen, 4) == ProductWay::own);
    CHECK(llm_decode::way_at(chosen, 6) == ProductWay::cublas);
    // The start's way not timed (narrow, without its time): kept, whatever the others took.
    CHECK(choose_own_products({{.rows = 6, .own_seconds = 1.0, .cublas_seconds = 0.5}}, start, 0.02) == start);
    // A narrow time where the narrow products do not take the count.
    for (const int rows : {1, 16}) {
      const std::string message =
          "row count " + std::to_string(rows) + " has a narrow time; the narrow products take 2 to 8";
      CHECK_THROWS_WITH_AS(
          (void)choose_own_products({{.rows = rows, .own_seconds = 1, .cublas_seconds = 1, .narrow_seconds = 1}},
                                    start, 0.02),
          doctest::Contains(message.c_str()), std::invalid_argument);
    }
    CHECK_THROWS_WITH_AS(
        (void)choose_own_products({{.rows = 3, .own_seconds = 1, .cublas_seconds = 1, .narrow_seconds = 0.0}}, start,
                                  0.02),
        doctest::Contains("row count 3 has a time of"), std::invalid_argument);
  }

  TEST_CASE("choose_own_products refuses counts out of range, a count timed twice, bad times and margins, naming them") {
    const ProductSets start = own_at({1});
    const auto timed = [](int rows, double own, double library) {
      return std::vector<ProductTiming>{{.rows = rows, .own_seconds = own, .cublas_seconds = library}};
    };
    CHECK_THROWS_WITH_AS((void)choose_own_products(timed(0, 1, 1), start, 0.02),
                         doctest::Contains("own products at 0 rows; a count is 1 to 64"), std::invalid_argument);
    CHECK_THROWS_WITH_AS((void)choose_own_products(timed(65, 1, 1), start, 0.02),
                         doctest::Contains("own products at 65 rows"), std::invalid_argument);
    CHECK_THROWS_WITH_AS((void)choose_own_products({{.rows = 2, .own_seconds = 1, .cublas_seconds = 2},
                                                    {.rows = 2, .own_seconds = 2, .cublas_seconds = 1}},
                                                   start, 0.02),
                         doctest::Contains("row count 2 is timed twice"), std::invalid_argument);
    for (const double bad : {0.0, -1.0, std::numeric_limits<double>::quiet_NaN(),
                             std::numeric_limits<double>::infinity()}) {
      CAPTURE(bad);
      CHECK_THROWS_WITH_AS((void)choose_own_products(timed(3, bad, 1), start, 0.02),
                           doctest::Contains("row count 3 has a time of"), std::invalid_argument);
      CHECK_THROWS_WITH_AS((void)choose_own_products(timed(3, 1, bad), start, 0.02),
                           doctest::Contains("times must be positive and finite"), std::invalid_argument);
    }
    for (const double margin : {-0.01, 1.0, std::numeric_limits<double>::quiet_NaN()}) {
      CAPTURE(margin);
      CHECK_THROWS_WITH_AS((void)choose_own_products(timed(3, 1, 2), start, margin),
                           doctest::Contains("it must be in [0, 1)"), std::invalid_argument);
    }
  }

  TEST_CASE("own_product_ways and with_way: the start with one count given each way, nothing else changed; bad counts named") {
    const ProductSets start{.own = product_rows_of({1, 4, 6, 32}), .narrow = product_rows_of({6})};
    const llm_decode::ProductWays at_four = llm_decode::own_product_ways(start, 4);
    CHECK(at_four.own == start);
    CHECK(at_four.cublas == ProductSets{.own = product_rows_of({1, 6, 32}), .narrow = product_rows_of({6})});
    REQUIRE(at_four.narrow.has_value());
    CHECK(*at_four.narrow == ProductSets{.own = start.own, .narrow = product_rows_of({4, 6})});
    const llm_decode::ProductWays at_two = llm_decode::own_product_ways(start, 2, /*narrow=*/false);
    CHECK(at_two.own == ProductSets{.own = product_rows_of({1, 2, 4, 6, 32}), .narrow = start.narrow});
    CHECK(at_two.cublas == start);
    CHECK_FALSE(at_two.narrow.has_value());
    // The narrow products take 2 to 8 rows: no narrow way at 1 or 16.
    CHECK_FALSE(llm_decode::own_product_ways(start, 1).narrow.has_value());
    CHECK_FALSE(llm_decode::own_product_ways(start, 16).narrow.has_value());
    // Off the narrow way, a count leaves the narrow set too.
    CHECK(llm_decode::with_way(start, 6, ProductWay::own) == ProductSets{.own = start.own, .narrow = {}});
    CHECK(llm_decode::with_way(start, 6, ProductWay::cublas) ==
          ProductSets{.own = product_rows_of({1, 4, 32}), .narrow = {}});
    CHECK(llm_decode::way_at(start, 6) == ProductWay::narrow);
    CHECK(llm_decode::way_at(start, 4) == ProductWay::own);
    CHECK(llm_decode::way_at(start, 8) == ProductWay::cublas);
    CHECK_THROWS_WITH_AS((void)llm_decode::with_way(start, 1, ProductWay::narrow),
                         doctest::Contains("the narrow products at 1 rows; they take 2 to 8"), std::invalid_argument);
    CHECK_THROWS_WITH_AS((void)llm_decode::own_product_ways(start, 0),
                         doctest::Contains("own products at 0 rows; a count is 1 to 64"), std::invalid_argument);
    CHECK_THROWS_WITH_AS((void)llm_decode::own_product_ways(start, 65), doctest::Contains("own products at 65 rows"),
                         std::invalid_argument);
  }

  TEST_CASE("set_product_sets sets both sets, or neither where the narrow set is refused") {
    const ProductSets before = llm_decode::fused::product_sets_in_force();
    const llm_decode_test::ScopedOwnProducts restore_own(before.own);
    const llm_decode_test::ScopedNarrowProducts restore_narrow(before.narrow);
    const ProductSets sets{.own = product_rows_of({1, 3}), .narrow = product_rows_of({3})};
    llm_decode::set_product_sets(sets);
    CHECK(llm_decode::fused::product_sets_in_force() == sets);
    CHECK_THROWS_WITH_AS(llm_decode::set_product_sets({.own = product_rows_of({2}), .narrow = product_rows_of({1})}),
                         doctest::Contains("narrow products at 1 rows"), std::invalid_argument);
    CHECK_THROWS_WITH_AS(llm_decode::set_product_sets({.own = product_rows_of({2}), .narrow = product_rows_of({3})}),
                         doctest::Contains("narrow products at 3 rows, where the own products are not used"),
                         std::invalid_argument);
    CHECK(llm_decode::fused::product_sets_in_force() == sets);
    {
      // Changed from one thread while three read: each read is one whole
      // pair (never the own set of one and the narrow set of the other).
      // The writer goes on until each reader has read 1,000 times, so the
      // reads overlap the writes.
      const ProductSets other{.own = product_rows_of({2, 4}), .narrow = {}};
      constexpr int kReads = 1000;
      std::atomic<bool> done{false};
      std::array<std::atomic<int>, 3> reads{};
      std::array<int, 3> mixed{};
      const std::vector<std::string> failures =
          replay_test::run_threads_at_once(4, [&](int t, replay_test::ThreadStart& start) {
            start.arrive_and_wait();
            if (t == 0) {
              const std::unique_ptr<std::atomic<bool>, void (*)(std::atomic<bool>*)> stop_readers(
                  &done, [](std::atomic<bool>* d) { *d = true; });  // even if a set throws
              const auto readers_done = [&] {
                return std::all_of(reads.begin(), reads.end(), [](const std::atomic<int>& r) { return r >= kReads; });
              };
              for (int i = 0; i < 10'000'000 && !readers_done(); ++i) {
                llm_decode::set_product_sets(i % 2 == 0 ? other : sets);
              }
              llm_decode::set_product_sets(sets);
              return;
            }
            const auto reader = static_cast<std::size_t>(t - 1);
            while (!done) {
              const ProductSets read = llm_decode::fused::product_sets_in_force();
              if (read != sets && read != other) ++mixed[reader];
              ++reads[reader];
            }
          });
      for (const std::string& failure : failures) CHECK_MESSAGE(failure.empty(), failure);
      for (const std::atomic<int>& r : reads) CHECK(r >= kReads);
      CHECK(mixed == std::array<int, 3>{});
      CHECK(llm_decode::fused::product_sets_in_force() == sets);
    }
    // The counts the narrow product takes, one constant.
    CHECK(llm_decode::fused::kNarrowRowCounts == product_rows_of({2, 3, 4, 5, 6, 7, 8}));
    CHECK(llm_decode::fused::narrow_takes(2));
    CHECK_FALSE(llm_decode::fused::narrow_takes(1));
    CHECK_FALSE(llm_decode::fused::narrow_takes(9));
  }

  TEST_CASE("any_product_fits_own_kernels: the counts at which some product of the model fits the own kernels") {
    // The presets: GEMVs at 1 to 8 rows, skinny GEMMs at 16, 32, 48 and 64.
    for (const char* preset : {"tiny", "small", "1b"}) {
      CAPTURE(preset);
      const llm_decode::LlamaConfig config = llm_decode::LlamaConfig::preset(preset);
      for (int rows = 1; rows <= llm_decode::fused::kMaxSkinnyRows; ++rows) {
        CAPTURE(rows);
        CHECK(llm_decode::any_product_fits_own_kernels(config, rows) == (rows <= 8 || rows % 16 == 0));
      }
    }
    // No output width here is a multiple of 32: GEMVs only.
    llm_decode::LlamaConfig narrow = llm_decode::LlamaConfig::preset("tiny");
    narrow.vocab_size = 100;
    narrow.hidden_size = 48;
    narrow.num_heads = 3;
    narrow.num_kv_heads = 1;
    narrow.intermediate_size = 40;
    CHECK(llm_decode::any_product_fits_own_kernels(narrow, 8));
    CHECK_FALSE(llm_decode::any_product_fits_own_kernels(narrow, 16));
    CHECK_FALSE(llm_decode::any_product_fits_own_kernels(narrow, 64));
  }

  TEST_CASE("tune_own_products refuses options out of range and models the fused kernels do not take, naming them") {
    const llm_decode::LlamaConfig config = llm_decode::LlamaConfig::preset("tiny");
    const llm_decode::LlamaModel cpu_model = llm_decode::LlamaModel::random(config, 1, at::Device(at::kCPU));
    const auto refusal = [&](llm_decode::ProductTuningOptions options) {
      try {
        (void)llm_decode::tune_own_products(cpu_model, options);
      } catch (const std::invalid_argument& e) {
        return std::string(e.what());
      }
      return std::string("no refusal");
    };
    CHECK(refusal({.rows = {1, 0}}) == "llm_decode: tune_own_products: a row count of 0; it must be 1 to 64");
    CHECK(refusal({.rows = {65}}).find("a row count of 65") != std::string::npos);
    CHECK(refusal({.rows = {std::int64_t{1} << 32}}).find("a row count of 4294967296") != std::string::npos);
    CHECK(refusal({.context = 0}) == "llm_decode: tune_own_products: a context of 0; it must be 1 to 64 (the "
                                     "model's max_len)");
    CHECK(refusal({.context = 65}).find("a context of 65") != std::string::npos);
    CHECK(refusal({.steps = 0}).find("steps (0) and repeats (5) must be at least 1") != std::string::npos);
    CHECK(refusal({.repeats = 0}).find("steps (32) and repeats (0) must be at least 1") != std::string::npos);
    CHECK(refusal({.margin = 1.5}).find("a margin of 1.5") != std::string::npos);
    // Options in range reach the model's check.
    CHECK(refusal({.context = 64}) == "llm_decode: tune_own_products: kernels = DecodeKernels::fused needs the model "
                                      "in fp16 on a CUDA device, not Half on cpu");
  }

  TEST_CASE("ScopedSetting (the tests' scope of a fused setting) sets for a scope and puts back what it found, also when the scope ends by an exception") {
    using llm_decode::fused::own_products_at;
    const auto before = own_products_at();
    {
      const llm_decode_test::ScopedOwnProducts scoped(product_rows_of({2, 5}));
      CHECK(own_products_at() == product_rows_of({2, 5}));
      CHECK(scoped.previous() == before);
    }
    CHECK(own_products_at() == before);
    CHECK_THROWS_AS(([] {
                      const llm_decode_test::ScopedOwnProducts scoped(product_rows_of({3}));
                      throw std::runtime_error("mid-scope");
                    }()),
                    std::runtime_error);
    CHECK(own_products_at() == before);
  }
}
