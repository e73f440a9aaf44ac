#pragma once
// The fused step's own products or cuBLAS's, chosen for one model on one GPU
// by timing its decode step both ways at each row count, the way cuBLASLt's
// and torch.compile's autotuning pick a kernel by running the candidates: no
// fixed set of row counts suits every model (fused::set_own_products_at says
// what was measured).
//
//   const llm_decode::ProductTuning tuning = llm_decode::tune_own_products(model, {.rows = {1, 2, 4, 8}});
//   llm_decode::fused::set_own_products_at(tuning.chosen);  // before any graph is captured
//
// The set is process-wide and per row count, not per phase: a count chosen
// from decode steps also sets the products of a bucketed prefill of that
// many tokens (and of its logits, over as many rows as the cache's slots),
// which are not timed. Tuning changes the set while it captures, so it must
// never run at the same time as anything else that captures or issues fused
// steps in the process. choose_own_products(), own_product_ways() and
// any_product_fits_own_kernels() are the policy alone (host code, no device).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "executor.hpp"
#include "fused_kernels.hpp"
#include "kv_cache.hpp"
#include "launch_plan.hpp"
#include "model.hpp"
#include "statistics.hpp"

namespace llm_decode {

// One row count's decode step, timed both ways.
struct ProductTiming {
  int rows = 0;
  double own_seconds = 0;     // median seconds per step, the own products at this row count
  double cublas_seconds = 0;  // the same step with cuBLAS's products
};

struct ProductTuningOptions {
  // The decode batches to time, each 1 to fused::kMaxSkinnyRows. A count at
  // which no product of the model fits the own kernels (fused::linear_fits)
  // gives the same step both ways and is not timed.
  std::vector<std::int64_t> rows{1, 2, 4, 8, 16, 32, 64};
  std::int64_t context = 64;  // the context bucket the timed steps run in, 1 to the model's max_len
  int steps = 32;             // steps per timing
  int repeats = 5;            // timings of each way, the two ways alternating
  // A row count leaves the choice it starts from only where the other way is
  // at least this much faster (0.02: 2%), so that noise does not flip it.
  double margin = 0.02;
};

struct ProductTuning {
  ProductTuningOptions options;        // what was asked
  fused::ProductRowCounts start;       // the set in use when it ran, which near ties keep
  std::vector<ProductTiming> timings;  // the timed row counts, ascending
  fused::ProductRowCounts chosen;      // what set_own_products_at() should be given
};

// The two sets one row count's ways are captured under: `start` with the
// count added (the own products there) and with it removed (cuBLAS's).
struct ProductWays {
  fused::ProductRowCounts own;
  fused::ProductRowCounts cublas;
};

namespace detail {
inline void check_margin(double margin) {
  if (!(margin >= 0 && margin < 1)) {
    invalid("product tuning: a margin of " + std::to_string(margin) + "; it must be in [0, 1)");
  }
}
}  // namespace detail

// From `start`, each timed row count takes the faster way where it is faster
// by at least `margin` (own_seconds <= (1 - margin) * cublas_seconds, or
// the reverse); near ties, exact ones, and counts not timed keep `start`'s
// choice. Throws std::invalid_argument for a count outside 1 to
// kMaxSkinnyRows (fused::product_rows_of), a count timed twice, a time that
// is not a positive finite number, or a margin outside [0, 1).
inline fused::ProductRowCounts choose_own_products(const std::vector<ProductTiming>& timings,
                                                   fused::ProductRowCounts start, double margin) {
  detail::check_margin(margin);
  fused::ProductRowCounts chosen = start;
  fused::ProductRowCounts seen;
  for (const ProductTiming& t : timings) {
    const fused::ProductRowCounts count = fused::product_rows_of({t.rows});
    if ((seen & count).any()) {
      detail::invalid("choose_own_products: row count " + std::to_string(t.rows) + " is timed twice");
    }
    seen |= count;
    for (const double seconds : {t.own_seconds, t.cublas_seconds}) {
      if (!(std::isfinite(seconds) && seconds > 0)) {
        detail::invalid("choose_own_products: row count " + std::to_string(t.rows) + " has a time of " +
                        std::to_string(seconds) + " s; times must be positive and finite");
      }
    }
    if (t.own_seconds < t.cublas_seconds && t.own_seconds <= (1 - margin) * t.cublas_seconds) chosen |= count;
    if (t.cublas_seconds < t.own_seconds && t.cublas_seconds <= (1 - margin) * t.own_seconds) chosen &= ~count;
  }
  return chosen;
}

// Throws std::invalid_argument for a count outside 1 to kMaxSkinnyRows
// (fused::product_rows_of).
inline ProductWays own_product_ways(fused::ProductRowCounts start, int rows) {
  const fused::ProductRowCounts count = fused::product_rows_of({rows});
  return ProductWays{.own = start | count, .cublas = start & ~count};
}

// Whether the own products change a decode step of `rows` rows of this
// model: whether any of its products fits their kernels (fused::linear_fits).
inline bool any_product_fits_own_kernels(const LlamaConfig& config, int rows) {
  const auto products = step_products(config, rows, rows);
  return std::any_of(products.begin(), products.end(),
                     [](const ProductShape& p) { return fused::linear_fits(p.rows, p.in, p.out); });
}

namespace detail {
// One row count's two ways: each captured under its set (a graph keeps the
// set it was captured under), then their launches timed in turn.
inline ProductTiming time_both_ways(const LlamaModel& model, KvCache& cache, const ProductWays& ways, int rows,
                                    const ProductTuningOptions& options) {
  const ExecutorOptions executor_options{.mode = StepMode::graphed,
                                         .batch_buckets = {rows},
                                         .context_buckets = {options.context},
                                         .kernels = DecodeKernels::fused,
                                         .prefill = PrefillMode::unpadded};
  const auto captured = [&](fused::ProductRowCounts set, const char* way) {
    fused::set_own_products_at(set);
    auto executor = std::make_unique<LlamaExecutor>(model, cache, executor_options);
    if (!executor->capture_failures().empty()) {
      throw std::runtime_error("llm_decode: tune_own_products: the " + std::string(way) + " way at " +
                               std::to_string(rows) + " rows was not captured: " +
                               executor->capture_failures().front());
    }
    return executor;
  };
  const std::unique_ptr<LlamaExecutor> own = captured(ways.own, "own products'");
  const std::unique_ptr<LlamaExecutor> cublas = captured(ways.cublas, "cuBLAS");

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
  (void)seconds_per_step(*own, 2);  // warm-up: the first replays upload the graphs
  (void)seconds_per_step(*cublas, 2);
  std::vector<double> own_seconds;
  std::vector<double> cublas_seconds;
  for (int repeat = 0; repeat < options.repeats; ++repeat) {
    // Alternating which goes first, so that neither always runs after the other.
    if (repeat % 2 == 0) {
      own_seconds.push_back(seconds_per_step(*own, options.steps));
      cublas_seconds.push_back(seconds_per_step(*cublas, options.steps));
    } else {
      cublas_seconds.push_back(seconds_per_step(*cublas, options.steps));
      own_seconds.push_back(seconds_per_step(*own, options.steps));
    }
  }
  return {.rows = rows,
          .own_seconds = percentile(own_seconds, 0.5),
          .cublas_seconds = percentile(cublas_seconds, 0.5)};
}
}  // namespace detail

// Times `model`'s graphed fused decode step (DecodeKernels::fused, the
// programmatic launches and folded norms as set now) at each of
// options.rows where any product fits the own kernels, with and without
// them at that count (own_product_ways() from the set in use, `start`), and
// chooses from the timings (choose_own_products()). It does not set the
// result: give `chosen` to fused::set_own_products_at().
//
// A timing is the median, over options.repeats runs of options.steps
// launches of one step, of a run's wall time per launch, as `llm_decode
// bench` times a step: the host's staging and its wait for the tokens are in
// it, the same both ways. The
// process-wide set is changed while the two ways are captured, cuBLAS's
// way stays in force while they are timed, and it is as before when this
// returns or throws (see the top of this file). Throws
// std::invalid_argument, naming it, for options out of range or a model the
// fused kernels do not take (before anything is captured or changed), and
// std::runtime_error where a way's graph could not be captured (its steps
// would run eagerly, under whatever set is in force, and time the wrong way).
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

  // Puts back the set it found, also when a capture or a step throws.
  const fused::ScopedOwnProducts restore(fused::own_products_at());
  ProductTuning tuning{.options = options, .start = restore.previous(), .timings = {}, .chosen = {}};
  if (!rows.empty()) {
    KvCache cache(model.config(), rows.back(), model.device(), model.dtype());
    for (const int r : rows) {
      if (!any_product_fits_own_kernels(model.config(), r)) continue;
      tuning.timings.push_back(detail::time_both_ways(model, cache, own_product_ways(tuning.start, r), r, options));
    }
  }
  tuning.chosen = choose_own_products(tuning.timings, tuning.start, options.margin);
  return tuning;
}

}  // namespace llm_decode
