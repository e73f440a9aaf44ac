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
// choose_own_products() is the policy alone (host code, no device).
#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "executor.hpp"
#include "fused_kernels.hpp"
#include "kv_cache.hpp"
#include "launch_plan.hpp"
#include "model.hpp"

namespace llm_decode {

// One row count's decode step, timed both ways.
struct ProductTiming {
  int rows = 0;
  double own_seconds = 0;      // median seconds per step, the own products at this row count
  double library_seconds = 0;  // the same step with cuBLAS's products
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
  std::vector<ProductTiming> timings;  // the timed row counts, ascending
  fused::ProductRowCounts chosen;      // what set_own_products_at() should be given
};

namespace detail {
inline void check_rows(std::int64_t rows, const char* where) {
  if (rows < 1 || rows > fused::kMaxSkinnyRows) {
    invalid(std::string(where) + ": a row count of " + std::to_string(rows) + "; it must be 1 to " +
            std::to_string(fused::kMaxSkinnyRows));
  }
}

inline void check_margin(double margin) {
  if (!(margin >= 0 && margin < 1)) {
    invalid("product tuning: a margin of " + std::to_string(margin) + "; it must be in [0, 1)");
  }
}

inline double median_of(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}
}  // namespace detail

// From `start`, each timed row count takes the faster way where it is faster
// by at least `margin` (own_seconds <= (1 - margin) * library_seconds, or
// the reverse); near ties, exact ones, and counts not timed keep `start`'s
// choice.
// Throws std::invalid_argument for a count outside 1 to kMaxSkinnyRows, a
// count timed twice, a time that is not a positive finite number, or a
// margin outside [0, 1).
inline fused::ProductRowCounts choose_own_products(const std::vector<ProductTiming>& timings,
                                                   fused::ProductRowCounts start, double margin) {
  using detail::check_rows;
  using detail::invalid;
  detail::check_margin(margin);
  fused::ProductRowCounts chosen = start;
  fused::ProductRowCounts seen;
  for (const ProductTiming& t : timings) {
    check_rows(t.rows, "choose_own_products");
    const auto bit = static_cast<std::size_t>(t.rows - 1);
    if (seen.test(bit)) invalid("choose_own_products: row count " + std::to_string(t.rows) + " is timed twice");
    seen.set(bit);
    for (const double seconds : {t.own_seconds, t.library_seconds}) {
      if (!(std::isfinite(seconds) && seconds > 0)) {
        invalid("choose_own_products: row count " + std::to_string(t.rows) + " has a time of " +
                std::to_string(seconds) + " s; times must be positive and finite");
      }
    }
    if (t.own_seconds < t.library_seconds && t.own_seconds <= (1 - margin) * t.library_seconds) chosen.set(bit);
    if (t.library_seconds < t.own_seconds && t.library_seconds <= (1 - margin) * t.own_seconds) chosen.reset(bit);
  }
  return chosen;
}

// Whether the own products change a decode step of `rows` rows of this
// model: whether any of its products fits them (fused::linear_fits).
inline bool own_products_apply(const LlamaConfig& config, int rows) {
  const auto products = step_products(config, rows, rows);
  return std::any_of(products.begin(), products.end(),
                     [](const ProductShape& p) { return fused::linear_fits(p[0], p[1], p[2]); });
}

// Times `model`'s graphed fused decode step (DecodeKernels::fused, the
// programmatic launches and folded norms as set now) at each of
// options.rows where the own products apply, with and without them at that
// count, and returns the timings. The process-wide set
// (fused::own_products_at()) is changed while the two ways are captured and
// is as before when this returns or throws: run it before anything else
// captures or issues fused steps. Throws std::invalid_argument, naming it,
// for a model the fused kernels do not take or options out of range.
inline std::vector<ProductTiming> time_own_products(const LlamaModel& model, const ProductTuningOptions& options) {
  using detail::check_rows;
  using detail::invalid;
  if (options.context < 1 || options.context > model.config().max_len) {
    invalid("time_own_products: a context of " + std::to_string(options.context) + "; it must be 1 to " +
            std::to_string(model.config().max_len) + " (the model's max_len)");
  }
  if (options.steps < 1 || options.repeats < 1) {
    invalid("time_own_products: steps (" + std::to_string(options.steps) + ") and repeats (" +
            std::to_string(options.repeats) + ") must be at least 1");
  }
  detail::check_margin(options.margin);
  std::vector<std::int64_t> rows = options.rows;
  for (const std::int64_t r : rows) check_rows(r, "time_own_products");
  std::sort(rows.begin(), rows.end());
  rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
  if (model.dtype() != at::kHalf || !model.device().is_cuda()) {
    invalid("time_own_products needs an fp16 model on a CUDA device (the fused kernels); this one is " +
            std::string(c10::toString(model.dtype())) + " on " + model.device().str());
  }

  // Puts back the set it found, also when a capture or a step throws.
  struct RestoreOwnProducts {
    fused::ProductRowCounts saved = fused::own_products_at();
    RestoreOwnProducts() = default;
    RestoreOwnProducts(const RestoreOwnProducts&) = delete;
    RestoreOwnProducts& operator=(const RestoreOwnProducts&) = delete;
    ~RestoreOwnProducts() { fused::set_own_products_at(saved); }
  } restore;

  std::vector<ProductTiming> timings;
  if (rows.empty()) return timings;
  KvCache cache(model.config(), rows.back(), model.device(), model.dtype());
  for (const std::int64_t count : rows) {
    const auto r = static_cast<int>(count);
    if (!own_products_apply(model.config(), r)) continue;
    const ExecutorOptions executor_options{.mode = StepMode::graphed,
                                           .batch_buckets = {count},
                                           .context_buckets = {options.context},
                                           .kernels = DecodeKernels::fused,
                                           .prefill = PrefillMode::unpadded};
    // Each way's graph keeps the set it was captured under (set_own_products_at).
    fused::ProductRowCounts own_set = restore.saved;
    own_set.set(static_cast<std::size_t>(r - 1));
    fused::set_own_products_at(own_set);
    LlamaExecutor own(model, cache, executor_options);
    fused::ProductRowCounts library_set = restore.saved;
    library_set.reset(static_cast<std::size_t>(r - 1));
    fused::set_own_products_at(library_set);
    LlamaExecutor library(model, cache, executor_options);

    // Rows at the middle of the context; the cache is zeros (finite), and
    // each step writes the same positions again.
    std::vector<replay::DecodeRow> step_rows(static_cast<std::size_t>(r));
    for (std::size_t i = 0; i < step_rows.size(); ++i) {
      step_rows[i] = {.slot = i, .position = static_cast<std::size_t>(options.context / 2), .token = 1};
    }
    const auto seconds_per_step = [&](LlamaExecutor& executor, int steps) {
      const auto start = std::chrono::steady_clock::now();
      for (int s = 0; s < steps; ++s) (void)run_launch(executor, step_rows, count, options.context, 1, {});
      return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / steps;
    };
    (void)seconds_per_step(own, 2);  // warm-up: the first replays upload the graphs
    (void)seconds_per_step(library, 2);
    std::vector<double> own_seconds;
    std::vector<double> library_seconds;
    for (int repeat = 0; repeat < options.repeats; ++repeat) {
      // Alternating which goes first, so that neither always runs after the other.
      if (repeat % 2 == 0) {
        own_seconds.push_back(seconds_per_step(own, options.steps));
        library_seconds.push_back(seconds_per_step(library, options.steps));
      } else {
        library_seconds.push_back(seconds_per_step(library, options.steps));
        own_seconds.push_back(seconds_per_step(own, options.steps));
      }
    }
    timings.push_back({.rows = r,
                       .own_seconds = detail::median_of(own_seconds),
                       .library_seconds = detail::median_of(library_seconds)});
  }
  return timings;
}

// time_own_products(), then choose_own_products() from the set in use now.
// It does not set the result: give it to fused::set_own_products_at().
inline ProductTuning tune_own_products(const LlamaModel& model, const ProductTuningOptions& options = {}) {
  ProductTuning tuning{.timings = time_own_products(model, options), .chosen = {}};
  tuning.chosen = choose_own_products(tuning.timings, fused::own_products_at(), options.margin);
  return tuning;
}

}  // namespace llm_decode
