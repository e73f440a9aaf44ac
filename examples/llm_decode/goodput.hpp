#pragma once
// Goodput under a service-level objective (SLO), as serving systems report it:
// the highest offered request rate at which the p99 time to first token and
// the p99 time per output token both stay within their limits. `llm_decode
// goodput` measures the points on the GPU; what is searched, what passes,
// and how repeats and policies are compared are the pure functions here (no
// CUDA, no Torch), tested on the host (tests/host/llm_goodput_test.cpp).
//
//   llm_decode::goodput::RateSearch search({.start_rate = 400, .min_rate = 50, .max_rate = 6400});
//   while (const auto rate = search.next()) search.record(meets(slo, measure_at(*rate)));
//   const llm_decode::goodput::Goodput g = search.goodput();
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "statistics.hpp"

namespace llm_decode::goodput {

// The limits a point must meet: TTFT p99 and TPOT p99, in ms.
struct Slo {
  double ttft_p99_ms = 100;
  double tpot_p99_ms = 0;
};

// The SLO of the serving goal: TTFT p99 within `ttft_p99_ms`, TPOT p99 within
// `tpot_factor` times the batch-1 decode step measured in the same run.
inline Slo slo_from_step(double batch1_step_ms, double ttft_p99_ms = 100, double tpot_factor = 2) {
  if (!(batch1_step_ms > 0) || !(ttft_p99_ms > 0) || !(tpot_factor > 0)) {
    throw std::invalid_argument("goodput: the batch-1 step, the TTFT limit and the TPOT factor must be positive");
  }
  return {.ttft_p99_ms = ttft_p99_ms, .tpot_p99_ms = tpot_factor * batch1_step_ms};
}

// What one load point measured.
struct PointMeasure {
  double ttft_p99_ms = 0;
  double tpot_p99_ms = 0;
  std::size_t requests = 0;
  std::size_t finished = 0;
};

// A point passes when every request finished (a refusal or a failure is a
// miss the percentiles would not show) and both p99s are within the SLO.
inline bool meets(const Slo& slo, const PointMeasure& m) {
  return m.requests > 0 && m.finished == m.requests && m.ttft_p99_ms <= slo.ttft_p99_ms &&
         m.tpot_p99_ms <= slo.tpot_p99_ms;
}

// The search over offered rates: a geometric ramp from `start_rate` (up by
// `growth` while points pass, down while they fail, within [min_rate,
// max_rate]), then bisection (geometric midpoints) between the highest
// passing and the lowest failing rate until they are within `resolution` of
// each other, in at most `max_points` points.
struct SearchOptions {
  double start_rate = 400;
  double min_rate = 50;
  double max_rate = 6400;
  double growth = 2;
  double resolution = 0.05;  // stop when lowest failing / highest passing <= 1 + resolution
  // A ramp over the whole range (5 points from 400 to 6,400) and the bisections
  // from a factor of 2 down to 1.05 (4): the default search always reaches its resolution.
  std::size_t max_points = 9;
};

inline void check(const SearchOptions& o) {
  if (!(o.min_rate > 0) || !(o.min_rate <= o.start_rate) || !(o.start_rate <= o.max_rate)) {
    throw std::invalid_argument("goodput: rates need 0 < min_rate <= start_rate <= max_rate (given " +
                                std::to_string(o.min_rate) + ", " + std::to_string(o.start_rate) + ", " +
                                std::to_string(o.max_rate) + ")");
  }
  if (!(o.growth > 1) || !(o.resolution > 0) || o.max_points == 0) {
    throw std::invalid_argument("goodput: the search needs growth > 1, resolution > 0 and max_points >= 1");
  }
}

// What a search's result says about the goodput.
enum class Bound {
  measured,  // `rate` passed and a rate at most (1 + resolution) x it failed
  at_least,  // `rate` passed, nothing above it failed (the ceiling, or out of points)
  below,     // no rate passed: the goodput is below `rate`, the lowest rate tried
  none,      // no point was measured
};

inline const char* to_string(Bound b) {
  switch (b) {
    case Bound::measured: return "measured";
    case Bound::at_least: return "at_least";
    case Bound::below: return "below";
    case Bound::none: return "none";
  }
  return "?";
}

struct Goodput {
  double rate = 0;
  Bound bound = Bound::none;
};

struct Point {
  double rate = 0;
  bool passed = false;
};

class RateSearch {
 public:
  explicit RateSearch(SearchOptions options) : options_(options) { check(options_); }

  // The next rate to measure, or nothing when the search is done.
  [[nodiscard]] std::optional<double> next() const {
    if (points_.size() >= options_.max_points) return std::nullopt;
    if (points_.empty()) return options_.start_rate;
    if (highest_pass_ && lowest_fail_) {
      if (*lowest_fail_ <= *highest_pass_ * (1 + options_.resolution)) return std::nullopt;
      return std::sqrt(*highest_pass_ * *lowest_fail_);
    }
    if (highest_pass_) {
      if (*highest_pass_ >= options_.max_rate) return std::nullopt;
      return std::min(*highest_pass_ * options_.growth, options_.max_rate);
    }
    if (*lowest_fail_ <= options_.min_rate) return std::nullopt;
    return std::max(*lowest_fail_ / options_.growth, options_.min_rate);
  }

  // Records whether the rate next() returned passed.
  void record(bool passed) {
    const std::optional<double> rate = next();
    if (!rate) throw std::logic_error("goodput: RateSearch::record after the search ended");
    points_.push_back({*rate, passed});
    if (passed) {
      highest_pass_ = *rate;
    } else {
      lowest_fail_ = *rate;
    }
  }

  [[nodiscard]] Goodput goodput() const {
    if (points_.empty()) return {};
    if (!highest_pass_) return {.rate = *lowest_fail_, .bound = Bound::below};
    const bool bracketed = lowest_fail_ && *lowest_fail_ <= *highest_pass_ * (1 + options_.resolution);
    return {.rate = *highest_pass_, .bound = bracketed ? Bound::measured : Bound::at_least};
  }
  // The lowest failing rate, if any: the goodput lies in [goodput().rate, this).
  [[nodiscard]] std::optional<double> lowest_failing() const { return lowest_fail_; }
  [[nodiscard]] const std::vector<Point>& points() const noexcept { return points_; }
  [[nodiscard]] const SearchOptions& options() const noexcept { return options_; }

 private:
  SearchOptions options_;
  std::vector<Point> points_;
  // The ramp and the bisection keep every pass below every fail, so the
  // last pass is the highest and the last fail the lowest.
  std::optional<double> highest_pass_, lowest_fail_;
};

// Which of several policies' goodputs is best: a passing rate beats none, a
// higher rate beats a lower one, and among policies that passed nothing the
// one whose floor is lowest says the least (the first one is kept). Returns
// the index, or nothing if `all` is empty.
inline std::optional<std::size_t> best(const std::vector<Goodput>& all) {
  std::optional<std::size_t> best_index;
  const auto passed = [](const Goodput& g) { return g.bound == Bound::measured || g.bound == Bound::at_least; };
  for (std::size_t i = 0; i < all.size(); ++i) {
    if (all[i].bound == Bound::none) continue;
    if (!best_index) {
      best_index = i;
      continue;
    }
    const Goodput& b = all[*best_index];
    if (passed(all[i]) != passed(b)) {
      if (passed(all[i])) best_index = i;
    } else if (all[i].rate > b.rate) {
      best_index = i;
    }
  }
  return best_index;
}

// One goodput over another (continuous batching's over static batching's),
// with what the bounds allow: `measured` where both were bracketed; a lower
// bound where the numerator's is one (`at_least`) or the denominator passed
// nothing (its goodput is below its floor); an upper bound the other way
// round; nothing where both are open the same way.
struct Ratio {
  double value = 0;
  enum class Kind { measured, at_least, at_most, unknown } kind = Kind::unknown;
};

inline const char* to_string(Ratio::Kind k) {
  switch (k) {
    case Ratio::Kind::measured: return "measured";
    case Ratio::Kind::at_least: return "at_least";
    case Ratio::Kind::at_most: return "at_most";
    case Ratio::Kind::unknown: return "unknown";
  }
  return "?";
}

inline Ratio ratio(const Goodput& over, const Goodput& under) {
  if (over.bound == Bound::none || under.bound == Bound::none || !(under.rate > 0)) return {};
  // Which way each goodput may still move from its rate: up, down, or neither.
  const auto direction = [](Bound b) { return b == Bound::at_least ? 1 : b == Bound::below ? -1 : 0; };
  const int up = direction(over.bound) - direction(under.bound);  // the ratio's own direction
  const double value = over.rate / under.rate;
  if (direction(over.bound) != 0 && direction(over.bound) == direction(under.bound)) return {value, Ratio::Kind::unknown};
  if (up > 0) return {value, Ratio::Kind::at_least};
  if (up < 0) return {value, Ratio::Kind::at_most};
  return {value, Ratio::Kind::measured};
}

// Whether a ratio shows the target met: a measured value or a lower bound at
// or above it.
inline bool meets_target(const Ratio& r, double target) {
  return (r.kind == Ratio::Kind::measured || r.kind == Ratio::Kind::at_least) && r.value >= target;
}

// Min, median and max of the repeats' values (median of an even count: the
// mean of the middle two).
struct Spread {
  double min = 0, median = 0, max = 0;
  std::size_t count = 0;
};

inline std::optional<Spread> spread(std::vector<double> values) {
  if (values.empty()) return std::nullopt;
  const auto [min, max] = std::minmax_element(values.begin(), values.end());
  return Spread{.min = *min, .median = percentile(values, 0.5), .max = *max, .count = values.size()};
}

// Whether a point of `requests` requests at `rate` may start with
// `elapsed_s` of `budget_s` spent: its arrivals alone take requests / rate
// seconds (budget_s <= 0: no budget).
inline bool fits_budget(double elapsed_s, double budget_s, std::size_t requests, double rate) {
  if (budget_s <= 0) return true;
  return elapsed_s + static_cast<double>(requests) / rate <= budget_s;
}

// ---- what the output-length mix alone allows ----
//
// With the same rows and the same step for both policies, a static batch
// holds its rows until its longest request ends, while continuous batching
// refills a row as soon as its request ends. At saturation static batching
// serves `rows` requests per E[longest of rows] steps and continuous batching
// `rows` per E[length] steps, so the mix alone bounds the ratio of their
// request rates near E[longest of rows] / E[length], whatever the engine
// (prefill, the steps' lengths at each batch and the SLO's margins move it
// either way). A static batch also lasts E[longest] steps, which a request
// arriving during it waits out: above the TTFT limit, static batching passes
// no rate.

// The probabilities of 0, 1, ... new tokens: pmf[n] = P(length = n).
using LengthPmf = std::vector<double>;

// Uniform over [min, max].
inline LengthPmf uniform_lengths(std::size_t min, std::size_t max) {
  if (min < 1 || min > max) throw std::invalid_argument("goodput: uniform lengths need 1 <= min <= max");
  LengthPmf pmf(max + 1, 0.0);
  for (std::size_t n = min; n <= max; ++n) pmf[n] = 1.0 / static_cast<double>(max - min + 1);
  return pmf;
}

// min plus the whole part of an exponential tail of mean (mean - min), redrawn
// above max (`llm_decode load --output-lengths exponential`).
inline LengthPmf exponential_lengths(std::size_t min, std::size_t max, std::size_t mean) {
  if (min < 1 || !(min < mean && mean < max)) {
    throw std::invalid_argument("goodput: exponential lengths need 1 <= min < mean < max");
  }
  const double rate = 1.0 / static_cast<double>(mean - min);
  LengthPmf pmf(max + 1, 0.0);
  double total = 0;
  for (std::size_t n = min; n <= max; ++n) {
    // P(floor(tail) = n - min) = e^(-rate (n - min)) (1 - e^(-rate)); the redraw scales them alike.
    pmf[n] = std::exp(-rate * static_cast<double>(n - min)) * -std::expm1(-rate);
    total += pmf[n];
  }
  for (double& p : pmf) p /= total;
  return pmf;
}

struct BatchingBound {
  double mean_length = 0;   // E[length], tokens
  double mean_longest = 0;  // E[longest of `rows` lengths], tokens
  double ratio = 0;         // mean_longest / mean_length
};

// E[longest of rows] = sum over n >= 1 of P(longest >= n) = 1 - F(n - 1)^rows.
inline BatchingBound batching_bound(const LengthPmf& pmf, std::size_t rows) {
  double mass = 0;
  for (const double p : pmf) {
    if (!(p >= 0)) throw std::invalid_argument("goodput: a length's probability must be >= 0");
    mass += p;
  }
  if (rows == 0 || std::abs(mass - 1) > 1e-9 || pmf.empty() || pmf[0] > 0) {
    throw std::invalid_argument("goodput: the bound needs rows >= 1 and probabilities of lengths >= 1 that sum to 1");
  }
  BatchingBound b;
  double below = 0;  // F(n - 1)
  for (std::size_t n = 1; n < pmf.size(); ++n) {
    below += pmf[n - 1];
    b.mean_length += static_cast<double>(n) * pmf[n];
    b.mean_longest += 1 - std::pow(std::min(below, 1.0), static_cast<double>(rows));
  }
  b.ratio = b.mean_longest / b.mean_length;
  return b;
}

}  // namespace llm_decode::goodput
