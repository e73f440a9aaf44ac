#pragma once
// Statistics and timing helpers shared by the benchmark programs.
#include <algorithm>
#include <cstddef>
#include <utility>
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

// A measured run and, when `paired`, a baseline run just before or just after
// it, which of the two goes first alternating from call to call (the baseline
// first on the first call): a run right after a synchronization and the one
// after it do not start alike, and a pair sees one host and device speed. Each
// callable returns its seconds (or any time unit); so does this, {measured,
// baseline}, the baseline 0 when not paired.
class AlternatingPair {
 public:
  template <class Measured, class Baseline>
  std::pair<double, double> operator()(bool paired, Measured&& measured, Baseline&& baseline) {
    double baseline_s = 0.0;
    if (paired && baseline_first_) {
      baseline_s = baseline();
    }
    const double measured_s = measured();
    if (paired && !baseline_first_) {
      baseline_s = baseline();
    }
    baseline_first_ = !baseline_first_;
    return {measured_s, baseline_s};
  }

  template <class Measured, class Baseline>
  std::pair<double, double> operator()(Measured&& measured, Baseline&& baseline) {
    return (*this)(true, measured, baseline);
  }

 private:
  bool baseline_first_ = true;
};
