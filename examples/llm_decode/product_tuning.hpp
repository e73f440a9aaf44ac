#pragma once
// The fused step's products chosen for one model on one GPU by timing its
// decode step each way at each row count (the own products, cuBLAS's, and
// from 2 to 8 rows the narrow tensor-core products), the way cuBLASLt's and
// torch.compile's autotuning pick a kernel by running the candidates: no
// fixed choice suits every model (fused::set_own_products_at says what was
// measured).
//
//   const llm_decode::ProductTuning tuning = llm_decode::tune_own_products(model, {.rows = {1, 2, 4, 8}});
//   ExecutorOptions options{..., .products = tuning.chosen};  // this executor's steps
//   llm_decode::set_product_sets(tuning.chosen);  // or the process-wide sets, before the executors are made
//
// The sets are per row count, not per phase: a count chosen from decode
// steps also sets the products of a bucketed prefill of that many tokens
// (and of its logits, over as many rows as the cache's slots), which are
// not timed. Tuning captures each way in an executor of its own sets
// (ExecutorOptions::products) and changes no process-wide setting, so other
// threads' steps are as they were (their work on the GPU meanwhile would
// disturb the timings, and so perhaps the choice, never a step's results).
// choose_own_products(),
// own_product_ways(), with_way() and any_product_fits_own_kernels() are the
// policy alone (host code, no device).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "executor.hpp"
#include "fused_kernels.hpp"
#include "kv_cache.hpp"
#include "launch_plan.hpp"
#include "model.hpp"
#include "statistics.hpp"

namespace llm_decode {

// The kernels that compute a decode step's products at one row count.
enum class ProductWay : std::uint8_t {
  cublas,  // torch's GEMM (cuBLAS through at::linear)
  own,     // the GEMV (1 to fused::kMaxGemvRows rows) or the skinny tensor-core GEMM (16 to 64)
  narrow,  // the narrow tensor-core product (fused::kMinNarrowRows to kMaxGemvRows rows)
};

inline const char* product_way_name(ProductWay way) {
  switch (way) {
    case ProductWay::cublas:
      return "cuBLAS";
    case ProductWay::own:
      return "own";
    case ProductWay::narrow:
      return "narrow";
  }
  return "unknown";
}

using fused::ProductSets;
using fused::set_product_sets;

// The way of `rows` rows under `sets`. Throws std::invalid_argument for a
// count outside 1 to kMaxSkinnyRows (fused::product_rows_of).
inline ProductWay way_at(const ProductSets& sets, int rows) {
  const fused::ProductRowCounts count = fused::product_rows_of({rows});
  if ((sets.own & count).none()) return ProductWay::cublas;
  return (sets.narrow & count).any() ? ProductWay::narrow : ProductWay::own;
}

// `sets` with `rows` rows given `way`, nothing else changed. Throws
// std::invalid_argument for a count outside 1 to kMaxSkinnyRows, or the
// narrow way at a count it does not take.
inline ProductSets with_way(ProductSets sets, int rows, ProductWay way) {
  const fused::ProductRowCounts count = fused::product_rows_of({rows});
  if (way == ProductWay::narrow && !fused::narrow_takes(rows)) {
    detail::invalid("the narrow products at " + std::to_string(rows) + " rows; they take " +
                    std::to_string(fused::kMinNarrowRows) + " to " + std::to_string(fused::kMaxGemvRows));
  }
  if (way == ProductWay::cublas) {
    sets.own &= ~count;
  } else {
    sets.own |= count;
  }
  if (way == ProductWay::narrow) {
    sets.narrow |= count;
  } else {
    sets.narrow &= ~count;
  }
  return sets;
}

// One row count's decode step, timed each way it can take.
struct ProductTiming {
  int rows = 0;
  double own_seconds = 0;     // median seconds per step, the own products at this row count
  double cublas_seconds = 0;  // the same step with cuBLAS's products
  // The same step with the narrow products, where they take the count and
  // were timed.
  std::optional<double> narrow_seconds;
};

struct ProductTuningOptions {
  // The decode batches to time, each 1 to fused::kMaxSkinnyRows. A count at
  // which no product of the model fits the own kernels (fused::linear_fits)
  // gives the same step every way and is not timed.
  std::vector<std::int64_t> rows{1, 2, 4, 8, 16, 32, 64};
  std::int64_t context = 64;  // the context bucket the timed steps run in, 1 to the model's max_len
  int steps = 32;             // steps per timing
  int repeats = 5;            // timings of each way, the ways taking turns to go first
  // A row count leaves the way it starts from only for one at least this
  // much faster (0.02: 2%), so that noise does not flip it.
  double margin = 0.02;
  // Whether the narrow products are timed too, at the counts they take.
  bool narrow = true;
};

struct ProductTuning {
  ProductTuningOptions options;        // what was asked
  ProductSets start;                   // the sets in use when it ran, which near ties keep
  std::vector<ProductTiming> timings;  // the timed row counts, ascending
  ProductSets chosen;                  // for set_product_sets() or ExecutorOptions::products
};

// The sets one row count's ways are captured under: `start` with the count
// given each way (with_way), the narrow one where it takes the count.
struct ProductWays {
  ProductSets own;
  ProductSets cublas;
  std::optional<ProductSets> narrow;
};

namespace detail {
inline void check_margin(double margin) {
  if (!(margin >= 0 && margin < 1)) {
    invalid("product tuning: a margin of " + std::to_string(margin) + "; it must be in [0, 1)");
  }
}

inline void check_time(int rows, double seconds) {
  if (!(std::isfinite(seconds) && seconds > 0)) {
    invalid("choose_own_products: row count " + std::to_string(rows) + " has a time of " + std::to_string(seconds) +
            " s; times must be positive and finite");
  }
}
}  // namespace detail

// From `start`, each timed row count takes its fastest way where that is
// faster than the count's way in `start` by at least `margin` (seconds <=
// (1 - margin) * the start's way's seconds); near ties, exact ones, and
// counts not timed, and counts whose start's way was not timed keep
// `start`'s way. Throws std::invalid_argument for a
// count outside 1 to kMaxSkinnyRows (fused::product_rows_of), a count timed
// twice, a narrow time at a count the narrow products do not take, a time
// that is not a positive finite number, or a margin outside [0, 1).
inline ProductSets choose_own_products(const std::vector<ProductTiming>& timings, const ProductSets& start,
                                       double margin) {
  detail::check_margin(margin);
  ProductSets chosen = start;
  fused::ProductRowCounts seen;
  for (const ProductTiming& t : timings) {
    const fused::ProductRowCounts count = fused::product_rows_of({t.rows});
    if ((seen & count).any()) {
      detail::invalid("choose_own_products: row count " + std::to_string(t.rows) + " is timed twice");
    }
    seen |= count;
    if (t.narrow_seconds.has_value() && !fused::narrow_takes(t.rows)) {
      detail::invalid("choose_own_products: row count " + std::to_string(t.rows) +
                      " has a narrow time; the narrow products take " + std::to_string(fused::kMinNarrowRows) +
                      " to " + std::to_string(fused::kMaxGemvRows) + " rows");
    }
    std::vector<std::pair<ProductWay, double>> ways{{ProductWay::own, t.own_seconds},
                                                    {ProductWay::cublas, t.cublas_seconds}};
    if (t.narrow_seconds.has_value()) ways.emplace_back(ProductWay::narrow, *t.narrow_seconds);
    for (const auto& [way, seconds] : ways) detail::check_time(t.rows, seconds);
    const ProductWay current = way_at(start, t.rows);
    const auto current_way = std::find_if(ways.begin(), ways.end(), [&](const auto& w) { return w.first == current; });
    if (current_way == ways.end()) continue;  // the start's way (narrow) not timed: nothing to compare it with
    const double current_seconds = current_way->second;
    const auto fastest = std::min_element(ways.begin(), ways.end(),
                                          [](const auto& a, const auto& b) { return a.second < b.second; });
    if (fastest->first != current && fastest->second < current_seconds &&
        fastest->second <= (1 - margin) * current_seconds) {
      chosen = with_way(chosen, t.rows, fastest->first);
    }
  }
  return chosen;
}

// Throws std::invalid_argument for a count outside 1 to kMaxSkinnyRows
// (fused::product_rows_of).
inline ProductWays own_product_ways(const ProductSets& start, int rows, bool narrow = true) {
  ProductWays ways{.own = with_way(start, rows, ProductWay::own),
                   .cublas = with_way(start, rows, ProductWay::cublas),
                   .narrow = std::nullopt};
  if (narrow && fused::narrow_takes(rows)) ways.narrow = with_way(start, rows, ProductWay::narrow);
  return ways;
}

// Whether the own products change a decode step of `rows` rows of this
// model: whether any of its products fits their kernels (fused::linear_fits).
inline bool any_product_fits_own_kernels(const LlamaConfig& config, int rows) {
  const auto products = step_products(config, rows, rows);
  return std::any_of(products.begin(), products.end(),
                     [](const ProductShape& p) { return fused::linear_fits(p.rows, p.in, p.out); });
}

namespace detail {
// One row count's ways: each captured under its sets (a graph keeps the sets
// it was captured under), then their launches timed in turn.
inline ProductTiming time_each_way(const LlamaModel& model, KvCache& cache, const ProductWays& ways, int rows,
                                   const ProductTuningOptions& options) {
  struct Way {
    ProductWay way;
    std::unique_ptr<LlamaExecutor> executor;
    std::vector<double> seconds;
  };
  std::vector<Way> captured;
  const auto capture = [&](const ProductSets& sets, ProductWay way) {
    auto executor = std::make_unique<LlamaExecutor>(model, cache,
                                                    ExecutorOptions{.mode = StepMode::graphed,
                                                                    .batch_buckets = {rows},
                                                                    .context_buckets = {options.context},
                                                                    .kernels = DecodeKernels::fused,
                                                                    .prefill = PrefillMode::unpadded,
                                                                    .products = sets});
    if (!executor->capture_failures().empty()) {
      throw std::runtime_error("llm_decode: tune_own_products: the " + std::string(product_way_name(way)) +
                               " way at " + std::to_string(rows) + " rows was not captured: " +
                               executor->capture_failures().front());
    }
    captured.push_back(Way{.way = way, .executor = std::move(executor), .seconds = {}});
  };
  capture(ways.own, ProductWay::own);
  capture(ways.cublas, ProductWay::cublas);
  if (ways.narrow.has_value()) capture(*ways.narrow, ProductWay::narrow);

  // Rows at the middle of the context; the cache is zeros (finite), and
  // each step writes the same positions again.
  std::vector<replay::DecodeRow> step_rows(static_cast<std::size_t>(rows));
  for (std::size_t i = 0; i < step_rows.size(); ++i) {
    step_rows[i] = {.slot = i, .position = static_cast<std::size_t>(options.context / 2), .token = 1};
  }
  const auto seconds_per_step = [&](LlamaExecutor& executor, int steps) {
    const auto start = std::chrono::steady_clock::now();
    for (int s = 0; s < steps; ++s) (void)run_launch(executor, step_rows, rows, options.context, 1, {});
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / steps;
  };
  for (Way& way : captured) (void)seconds_per_step(*way.executor, 2);  // warm-up: the first replays upload the graphs
  for (int repeat = 0; repeat < options.repeats; ++repeat) {
    // Each way goes first in turn, so that none always runs after another.
    for (std::size_t i = 0; i < captured.size(); ++i) {
      Way& way = captured[(i + static_cast<std::size_t>(repeat)) % captured.size()];
      way.seconds.push_back(seconds_per_step(*way.executor, options.steps));
    }
  }
  ProductTiming timing{.rows = rows};
  for (const Way& way : captured) {
    const double median = percentile(way.seconds, 0.5);
    switch (way.way) {
      case ProductWay::own:
        timing.own_seconds = median;
        break;
      case ProductWay::cublas:
        timing.cublas_seconds = median;
        break;
      case ProductWay::narrow:
        timing.narrow_seconds = median;
        break;
    }
  }
  return timing;
}
}  // namespace detail

// Times `model`'s graphed fused decode step (DecodeKernels::fused, the
// programmatic launches and folded norms as set now) at each of
// options.rows where any product fits the own kernels, each way at that
// count (own_product_ways() from the sets in use, `start`: own, cuBLAS, and
// narrow where it takes the count and options.narrow asks or `start` has
// it), and chooses from the timings (choose_own_products()). It does not
// set the result: give `chosen` to set_product_sets() or to an executor's
// ExecutorOptions::products.
//
// A timing is the median, over options.repeats runs of options.steps
// launches of one step, of a run's wall time per launch, as `llm_decode
// bench` times a step: the host's staging and its wait for the tokens are in
// it, the same every way. `start` is the sets in force on the calling
// thread (fused::product_sets_in_force(), less narrow counts the own set
// lacks); no setting changes. Throws
// std::invalid_argument, naming it, for options out of range or a model the
// fused kernels do not take (before anything is captured), and
// std::runtime_error where a way's graph could not be captured (its steps
// would run eagerly: not the graphed step it means to time).
inline ProductTuning tune_own_products(const LlamaModel& model, const ProductTuningOptions& options = {}) {
  const std::string who = "llm_decode: tune_own_products";
  if (options.context < 1 || options.context > model.config().max_len) {
    throw std::invalid_argument(who + ": a context of " + std::to_string(options.context) + "; it must be 1 to " +
                                std::to_string(model.config().max_len) + " (the model's max_len)");
  }
  if (options.steps < 1 || options.repeats < 1) {
    throw std::invalid_argument(who + ": steps (" + std::to_string(options.steps) + ") and repeats (" +
                                std::to_string(options.repeats) + ") must be at least 1");
  }
  detail::check_margin(options.margin);
  std::vector<int> rows;
  for (const std::int64_t r : options.rows) {
    if (r < 1 || r > fused::kMaxSkinnyRows) {
      throw std::invalid_argument(who + ": a row count of " + std::to_string(r) + "; it must be 1 to " +
                                  std::to_string(fused::kMaxSkinnyRows));
    }
    rows.push_back(static_cast<int>(r));
  }
  std::sort(rows.begin(), rows.end());
  rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
  check_fused_kernels_take(model, who);

  // The narrow counts where the own products are not used change nothing: dropped.
  ProductSets start = fused::product_sets_in_force();
  start.narrow &= start.own;
  ProductTuning tuning{.options = options, .start = start, .timings = {}, .chosen = {}};
  if (!rows.empty()) {
    KvCache cache(model.config(), rows.back(), model.device(), model.dtype());
    for (const int r : rows) {
      if (!any_product_fits_own_kernels(model.config(), r)) continue;
      // The narrow way where asked, and always where the start has it (so that it is compared).
      const bool narrow = options.narrow || way_at(tuning.start, r) == ProductWay::narrow;
      tuning.timings.push_back(
          detail::time_each_way(model, cache, own_product_ways(tuning.start, r, narrow), r, options));
    }
  }
  tuning.chosen = choose_own_products(tuning.timings, tuning.start, options.margin);
  return tuning;
}

}  // namespace llm_decode
