#pragma once
#include <replay/detail/require_cxx20.hpp>
// The Batcher's gathering policy as pure functions, so that it is tested
// without threads or clocks.
#include <algorithm>
#include <cstddef>
#include <span>
#include <vector>

namespace replay {

// What plan_batch() decides with.
struct BatchPlanLimits {
  ::std::size_t max_batch_rows = 1;           // most rows in a batch
  ::std::size_t max_batch_requests = 0;       // most requests in a batch; 0: no limit
  ::std::span<const ::std::size_t> preferred;  // strictly ascending, each <= max_batch_rows; may be empty
  bool trim_to_preferred = false;             // cut a batch back to exactly a preferred size (see below)
};

// How many of the waiting requests (their row counts in arrival order) leave
// now as one batch; 0 means wait for more. `overdue` is how many of the
// oldest have waited the maximum queue delay (or must leave now: draining).
//   - The batch is always a prefix: requests leave in arrival order.
//   - It leaves at once when the requests that fit reach the largest
//     preferred size (a full bucket; max_batch_rows when none is given), when
//     the next request does not fit, or when the request limit is reached.
//   - Otherwise it waits until the oldest request is overdue.
//   - It takes every request that fits. With trim_to_preferred it takes
//     instead the longest prefix whose rows are exactly a preferred size (no
//     padding) that still holds every overdue request, when there is one;
//     the requests left behind are younger than the delay. Padding costs
//     little when a batch is one CUDA-graph replay whatever its size, so
//     trimming is off by default; it pays when compute grows with the padded
//     size.
inline ::std::size_t plan_batch(::std::span<const ::std::size_t> waiting_rows, ::std::size_t overdue,
                                const BatchPlanLimits& limits) noexcept {
  const ::std::size_t request_limit =
      limits.max_batch_requests == 0 ? waiting_rows.size() : ::std::min(limits.max_batch_requests, waiting_rows.size());
  ::std::size_t fit = 0;
  ::std::size_t fit_rows = 0;
  while (fit < request_limit && fit_rows + waiting_rows[fit] <= limits.max_batch_rows) {
    fit_rows += waiting_rows[fit];
    ++fit;
  }
  if (fit == 0) {
    return 0;  // nothing waiting (a request above max_batch_rows is refused before it is queued)
  }
  const ::std::size_t full_rows = limits.preferred.empty() ? limits.max_batch_rows : limits.preferred.back();
  // The longest prefix of exactly a preferred size holding at least `must` requests; else all that fit.
  auto exact_prefix = [&](::std::size_t must) {
    ::std::size_t rows = fit_rows;
    for (::std::size_t k = fit; k >= must; --k) {
      if (::std::binary_search(limits.preferred.begin(), limits.preferred.end(), rows)) {
        return k;
      }
      rows -= waiting_rows[k - 1];
    }
    return fit;
  };
  const bool limit_reached = limits.max_batch_requests != 0 && fit == limits.max_batch_requests;
  const bool full = fit_rows >= full_rows || fit < waiting_rows.size() || limit_reached;
  if (!full && overdue == 0) {
    return 0;
  }
  if (!limits.trim_to_preferred) {
    return fit;
  }
  return exact_prefix(::std::max<::std::size_t>(1, ::std::min(overdue, fit)));
}

// The smallest of `sizes` (ascending) that holds `rows`; `rows` itself when
// none does.
inline ::std::size_t padded_batch_rows(::std::span<const ::std::size_t> sizes, ::std::size_t rows) noexcept {
  const auto it = ::std::lower_bound(sizes.begin(), sizes.end(), rows);
  return it == sizes.end() ? rows : *it;
}

}  // namespace replay
