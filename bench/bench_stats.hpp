#pragma once
// Statistics and timing helpers shared by the benchmark programs.
#include <time.h>

#include <algorithm>
#include <chrono>
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

// Wall seconds since `start`.
inline double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Wall seconds that `work()` took.
template <class Work>
double seconds_of(Work&& work) {
  const auto start = std::chrono::steady_clock::now();
  work();
  return seconds_since(start);
}

// CPU time of the calling thread (what submitting costs the host, waits excluded).
inline double thread_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
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

// The times of paired runs (a measured run and its baseline, timed through one
// AlternatingPair) and what a paired row reports of them: the median of each
// side, and the median of the pairs' ratios and differences, since a pair
// sees one host and device speed while the speed drifts between pairs.
class PairedSamples {
 public:
  // Times one pair and keeps it; returns {measured, baseline}.
  template <class Measured, class Baseline>
  std::pair<double, double> time(Measured&& measured, Baseline&& baseline) {
    const auto times = order_(measured, baseline);
    measured_.push_back(times.first);
    baseline_.push_back(times.second);
    return times;
  }

  double measured_median() const { return median_of(measured_); }
  double baseline_median() const { return median_of(baseline_); }
  // Of measured / baseline over the pairs (a pair with a zero baseline left out).
  double ratio_median() const {
    std::vector<double> ratios;
    for (std::size_t i = 0; i < measured_.size(); ++i) {
      if (baseline_[i] > 0.0) {
        ratios.push_back(measured_[i] / baseline_[i]);
      }
    }
    return median(ratios);
  }
  // Of measured - baseline over the pairs.
  double difference_median() const {
    std::vector<double> differences;
    for (std::size_t i = 0; i < measured_.size(); ++i) {
      differences.push_back(measured_[i] - baseline_[i]);
    }
    return median(differences);
  }
  double difference_mean() const {
    double sum = 0.0;
    for (std::size_t i = 0; i < measured_.size(); ++i) {
      sum += measured_[i] - baseline_[i];
    }
    return measured_.empty() ? 0.0 : sum / static_cast<double>(measured_.size());
  }

 private:
  static double median_of(std::vector<double> samples) { return median(samples); }

  AlternatingPair order_;
  std::vector<double> measured_;
  std::vector<double> baseline_;
};
