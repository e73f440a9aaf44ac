// The goodput search of `llm_decode goodput` (examples/llm_decode/goodput.hpp)
// against simulated servers whose true goodput is known: a rate passes
// exactly when it is at or below it.
#include <doctest/doctest.h>

#include <cmath>
#include <cstddef>
#include <optional>
#include <stdexcept>
#include <vector>

#include "goodput.hpp"

namespace {

using llm_decode::goodput::Bound;
using llm_decode::goodput::Goodput;
using llm_decode::goodput::Ratio;
using llm_decode::goodput::RateSearch;
using llm_decode::goodput::SearchOptions;

// Runs the search against a server that passes every rate <= truth.
RateSearch search_against(double truth, SearchOptions options) {
  RateSearch search(options);
  while (const std::optional<double> rate = search.next()) search.record(*rate <= truth);
  return search;
}

// The search measured `truth`: a passing rate at or below it and the lowest
// failing rate above it, within `resolution` of each other.
void check_measured_bracket(const RateSearch& search, double truth, double resolution) {
  const Goodput g = search.goodput();
  CHECK(g.bound == Bound::measured);
  CHECK(g.rate <= truth);
  REQUIRE(search.lowest_failing());
  CHECK(*search.lowest_failing() > truth);
  CHECK(*search.lowest_failing() <= g.rate * (1 + resolution) * (1 + 1e-12));
}

}  // namespace

TEST_SUITE("host") {
  TEST_CASE("goodput: a point passes only with every request finished and both p99s within the SLO") {
    const llm_decode::goodput::Slo slo{.ttft_p99_ms = 100, .tpot_p99_ms = 0.9};
    using llm_decode::goodput::meets;
    CHECK(meets(slo, {.ttft_p99_ms = 100, .tpot_p99_ms = 0.9, .requests = 1000, .finished = 1000}));
    CHECK_FALSE(meets(slo, {.ttft_p99_ms = 100.1, .tpot_p99_ms = 0.5, .requests = 1000, .finished = 1000}));
    CHECK_FALSE(meets(slo, {.ttft_p99_ms = 2, .tpot_p99_ms = 0.91, .requests = 1000, .finished = 1000}));
    CHECK_FALSE(meets(slo, {.ttft_p99_ms = 2, .tpot_p99_ms = 0.5, .requests = 1000, .finished = 999}));
    CHECK_FALSE(meets(slo, {.ttft_p99_ms = 0, .tpot_p99_ms = 0, .requests = 0, .finished = 0}));
  }

  TEST_CASE("goodput: the SLO's TPOT limit is the factor times the batch-1 step; nonpositive inputs are refused") {
    const llm_decode::goodput::Slo slo = llm_decode::goodput::slo_from_step(0.455);
    CHECK(slo.ttft_p99_ms == 100);
    CHECK(slo.tpot_p99_ms == doctest::Approx(0.91));
    CHECK(llm_decode::goodput::slo_from_step(0.5, 50, 3).tpot_p99_ms == doctest::Approx(1.5));
    CHECK_THROWS_AS(llm_decode::goodput::slo_from_step(0), std::invalid_argument);
    CHECK_THROWS_AS(llm_decode::goodput::slo_from_step(0.5, 100, 0), std::invalid_argument);
    CHECK_THROWS_AS(llm_decode::goodput::slo_from_step(0.5, -1), std::invalid_argument);
  }

  TEST_CASE("goodput: the search ramps up by its growth, then bisects between the last pass and the first fail") {
    const RateSearch search = search_against(1000, {.start_rate = 400, .min_rate = 100, .max_rate = 6400});
    const std::vector<double> expected{400, 800, 1600, std::sqrt(800.0 * 1600), std::sqrt(800 * std::sqrt(800.0 * 1600))};
    REQUIRE(search.points().size() >= expected.size());
    for (std::size_t i = 0; i < expected.size(); ++i) CHECK(search.points()[i].rate == doctest::Approx(expected[i]));
    CHECK(search.points()[0].passed);
    CHECK(search.points()[1].passed);
    CHECK_FALSE(search.points()[2].passed);
    CHECK_FALSE(search.points()[3].passed);  // 1131
    CHECK(search.points()[4].passed);        // 951
    const Goodput g = search.goodput();
    CHECK(g.bound == Bound::measured);
    CHECK(g.rate <= 1000);
    REQUIRE(search.lowest_failing());
    CHECK(*search.lowest_failing() > 1000);
    CHECK(*search.lowest_failing() <= g.rate * 1.10);
    CHECK_FALSE(search.next());
  }

  TEST_CASE("goodput: for any true goodput the result brackets it within the resolution, in the points allowed") {
    const SearchOptions options{.start_rate = 400, .min_rate = 100, .max_rate = 6400, .resolution = 0.08,
                                .max_points = 10};
    for (double truth = 30; truth < 20000; truth *= 1.07) {
      CAPTURE(truth);
      const RateSearch search = search_against(truth, options);
      CHECK(search.points().size() <= options.max_points);
      for (const auto& p : search.points()) {
        CHECK(p.rate >= options.min_rate);
        CHECK(p.rate <= options.max_rate);
        CHECK(p.passed == (p.rate <= truth));
      }
      const Goodput g = search.goodput();
      if (truth < options.min_rate) {
        CHECK(g.bound == Bound::below);
        CHECK(g.rate == options.min_rate);
      } else if (truth >= options.max_rate) {
        CHECK(g.bound == Bound::at_least);
        CHECK(g.rate == options.max_rate);
      } else {
        check_measured_bracket(search, truth, options.resolution);
      }
    }
  }

  TEST_CASE("goodput: the default search brackets any goodput between its floor and ceiling within 5%, in its points") {
    const SearchOptions defaults{};
    CHECK(defaults.resolution == doctest::Approx(0.05));
    CHECK(defaults.min_rate == 50);
    CHECK(defaults.max_rate == 6400);
    for (double truth = defaults.min_rate; truth < defaults.max_rate; truth *= 1.03) {
      CAPTURE(truth);
      const RateSearch search = search_against(truth, defaults);
      CHECK(search.points().size() <= defaults.max_points);
      check_measured_bracket(search, truth, defaults.resolution);
    }
  }

  TEST_CASE("goodput: out of points, a search that only passed says at least; one that only failed says below") {
    const RateSearch short_up = search_against(1000, {.start_rate = 400, .max_points = 2});
    CHECK(short_up.points().size() == 2);
    CHECK(short_up.goodput().bound == Bound::at_least);
    CHECK(short_up.goodput().rate == 800);
    // A bracket wider than the resolution when the points ran out: a lower bound.
    const RateSearch short_bracket = search_against(1000, {.start_rate = 400, .max_points = 3});
    CHECK(short_bracket.goodput().bound == Bound::at_least);
    CHECK(short_bracket.goodput().rate == 800);
    const RateSearch short_down = search_against(10, {.start_rate = 400, .min_rate = 25, .max_points = 2});
    CHECK(short_down.goodput().bound == Bound::below);
    CHECK(short_down.goodput().rate == 200);
    CHECK(RateSearch({}).goodput().bound == Bound::none);
  }

  TEST_CASE("goodput: the search refuses bad options and a record after its end") {
    CHECK_THROWS_AS(RateSearch({.start_rate = 50, .min_rate = 100}), std::invalid_argument);
    CHECK_THROWS_AS(RateSearch({.start_rate = 400, .max_rate = 200}), std::invalid_argument);
    CHECK_THROWS_AS(RateSearch({.min_rate = 0}), std::invalid_argument);
    CHECK_THROWS_AS(RateSearch({.growth = 1}), std::invalid_argument);
    CHECK_THROWS_AS(RateSearch({.resolution = 0}), std::invalid_argument);
    CHECK_THROWS_AS(RateSearch({.max_points = 0}), std::invalid_argument);
    RateSearch search({.start_rate = 100, .min_rate = 100, .max_points = 4});
    search.record(false);  // fails at the floor: done
    CHECK_FALSE(search.next());
    CHECK_THROWS_AS(search.record(true), std::logic_error);
  }

  TEST_CASE("goodput: the best policy passes at the highest rate; one that passed beats one that did not") {
    using llm_decode::goodput::best;
    CHECK_FALSE(best({}));
    CHECK(*best({{800, Bound::measured}, {1200, Bound::measured}, {900, Bound::at_least}}) == 1);
    CHECK(*best({{800, Bound::below}, {100, Bound::measured}}) == 1);
    CHECK(*best({{0, Bound::none}, {100, Bound::below}}) == 1);
    CHECK(*best({{6400, Bound::at_least}, {1000, Bound::measured}}) == 0);
    CHECK_FALSE(best({{0, Bound::none}}));
  }

  TEST_CASE("goodput: continuous / static keeps what the bounds allow") {
    using llm_decode::goodput::ratio;
    const Ratio measured = ratio({1000, Bound::measured}, {400, Bound::measured});
    CHECK(measured.kind == Ratio::Kind::measured);
    CHECK(measured.value == doctest::Approx(2.5));
    // Static batching passed nothing down to its floor of 100: at least 10x.
    const Ratio static_below = ratio({1000, Bound::measured}, {100, Bound::below});
    CHECK(static_below.kind == Ratio::Kind::at_least);
    CHECK(static_below.value == doctest::Approx(10));
    CHECK(ratio({6400, Bound::at_least}, {400, Bound::measured}).kind == Ratio::Kind::at_least);
    CHECK(ratio({6400, Bound::at_least}, {100, Bound::below}).kind == Ratio::Kind::at_least);
    CHECK(ratio({100, Bound::below}, {400, Bound::measured}).kind == Ratio::Kind::at_most);
    CHECK(ratio({1000, Bound::measured}, {6400, Bound::at_least}).kind == Ratio::Kind::at_most);
    CHECK(ratio({100, Bound::below}, {100, Bound::below}).kind == Ratio::Kind::unknown);
    CHECK(ratio({6400, Bound::at_least}, {6400, Bound::at_least}).kind == Ratio::Kind::unknown);
    CHECK(ratio({}, {400, Bound::measured}).kind == Ratio::Kind::unknown);
    using llm_decode::goodput::meets_target;
    CHECK(meets_target(measured, 2));
    CHECK_FALSE(meets_target(measured, 3));
    CHECK(meets_target(static_below, 2));
    CHECK_FALSE(meets_target({5, Ratio::Kind::at_most}, 2));
    CHECK_FALSE(meets_target({5, Ratio::Kind::unknown}, 2));
  }

  TEST_CASE("goodput: the spread of repeats is their min, median and max") {
    using llm_decode::goodput::spread;
    CHECK_FALSE(spread({}));
    const auto odd = spread({3, 1, 2});
    REQUIRE(odd);
    CHECK(odd->min == 1);
    CHECK(odd->median == 2);
    CHECK(odd->max == 3);
    CHECK(odd->count == 3);
    const auto even = spread({4, 1, 2, 10});
    REQUIRE(even);
    CHECK(even->median == 3);
    CHECK(even->max == 10);
  }

  TEST_CASE("goodput: a point starts only if its arrivals fit what is left of the budget") {
    using llm_decode::goodput::fits_budget;
    CHECK(fits_budget(100, 0, 1000, 10));  // no budget
    CHECK(fits_budget(100, 110, 1000, 100));
    CHECK_FALSE(fits_budget(100, 109, 1000, 100));
  }

  TEST_CASE("goodput: the mix's bound is E[longest of the rows] / E[length], from the lengths' probabilities") {
    using llm_decode::goodput::batching_bound;
    // Lengths 1 or 2, two rows: the longest is 1 only when both are (1/4).
    const llm_decode::goodput::BatchingBound two = batching_bound(llm_decode::goodput::uniform_lengths(1, 2), 2);
    CHECK(two.mean_length == doctest::Approx(1.5));
    CHECK(two.mean_longest == doctest::Approx(1.75));
    CHECK(two.ratio == doctest::Approx(1.75 / 1.5));
    // One row: static batching loses nothing.
    CHECK(batching_bound(llm_decode::goodput::uniform_lengths(16, 192), 1).ratio == doctest::Approx(1.0));
    // The load test's uniform mix at 64 rows, against the closed form for N
    // equally likely lengths up to 192: E[longest] = 192 - sum over j < N
    // of (j / N)^64; a mean of 104.
    const auto uniform = batching_bound(llm_decode::goodput::uniform_lengths(16, 192), 64);
    CHECK(uniform.mean_length == doctest::Approx(104.0));
    double closed_form = 192;
    for (int j = 1; j < 177; ++j) closed_form -= std::pow(j / 177.0, 64);
    CHECK(uniform.mean_longest == doctest::Approx(closed_form).epsilon(1e-9));
    CHECK(uniform.ratio == doctest::Approx(1.82).epsilon(0.005));
    // The exponential mix: the mean of min + an exponential tail, less for
    // the cut at max; the longest of 64 near min + mean tail x H(64).
    const auto exponential = batching_bound(llm_decode::goodput::exponential_lengths(8, 768, 128), 64);
    CHECK(exponential.mean_length > 120.0);
    CHECK(exponential.mean_length < 128.0);
    CHECK(exponential.mean_longest > 8 + 120 * 4.0);
    CHECK(exponential.mean_longest < 8 + 120 * 4.8);
    // More rows, a longer longest.
    CHECK(batching_bound(llm_decode::goodput::uniform_lengths(16, 192), 8).ratio < uniform.ratio);
    CHECK_THROWS_AS(batching_bound(llm_decode::goodput::uniform_lengths(1, 2), 0), std::invalid_argument);
    CHECK_THROWS_AS(batching_bound({0.5, 0.5}, 2), std::invalid_argument);  // a length of 0
    CHECK_THROWS_AS(batching_bound({0.0, 0.5}, 2), std::invalid_argument);  // sums to 0.5
    CHECK_THROWS_AS(llm_decode::goodput::exponential_lengths(8, 768, 800), std::invalid_argument);
    CHECK_THROWS_AS(llm_decode::goodput::uniform_lengths(0, 5), std::invalid_argument);
  }
}
