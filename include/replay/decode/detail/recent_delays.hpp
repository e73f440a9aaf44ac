#pragma once
#include <replay/detail/require_cxx20.hpp>
// The most recent queue delays of a DecodeScheduler, for its percentiles.
#include <algorithm>
#include <cstddef>
#include <vector>

namespace replay::detail {

class RecentDelays {
 public:
  static constexpr ::std::size_t window = 8192;

  void record(double us) {
    if (values_.size() < window) {
      values_.push_back(us);
    } else {
      values_[next_] = us;
      next_ = (next_ + 1) % window;
    }
  }
  void clear() noexcept {
    values_.clear();
    next_ = 0;
  }
  const ::std::vector<double>& values() const noexcept { return values_; }

  // The q-quantile (0 <= q <= 1) of `values`, sorted in place; 0 when empty.
  static double quantile(::std::vector<double>& values, double q) {
    if (values.empty()) {
      return 0;
    }
    const auto i = static_cast<::std::size_t>(q * static_cast<double>(values.size() - 1) + 0.5);
    const auto at = values.begin() + static_cast<::std::ptrdiff_t>(::std::min(i, values.size() - 1));
    ::std::nth_element(values.begin(), at, values.end());
    return *at;
  }

 private:
  ::std::vector<double> values_;
  ::std::size_t next_ = 0;
};

}  // namespace replay::detail
