#pragma once
// Statistics shared by the benchmark programs.
#include <algorithm>
#include <cstddef>
#include <vector>

// The median of the samples (reorders them): a burst preempted by another
// process moves a mean by several percent, not a median.
inline double median(std::vector<double>& v) {
  if (v.empty()) {
    return 0.0;
  }
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
  return v[v.size() / 2];
}
