#pragma once
// The percentile of a set of timings, shared by the benchmarks, the goodput
// search's spreads and the product tuning.
#include <algorithm>
#include <cstddef>
#include <vector>

namespace llm_decode {

// The p-th quantile (p in [0, 1]) of `values`, interpolated between the two
// nearest ranks (p = 0.5 of an even count: the mean of the middle two); 0
// for no values.
inline double percentile(std::vector<double> values, double p) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const double rank = p * static_cast<double>(values.size() - 1);
  const auto lo = static_cast<std::size_t>(rank);
  const std::size_t hi = std::min(lo + 1, values.size() - 1);
  return values[lo] + (values[hi] - values[lo]) * (rank - static_cast<double>(lo));
}

}  // namespace llm_decode
