#pragma once
#include <replay/detail/require_cxx20.hpp>
// BatcherStats: what a Batcher did since construction or reset_stats().
#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace replay {

struct BatcherStats {
  // Upper bounds (microseconds, inclusive) of the queue-delay histogram's
  // buckets; one more bucket above the last holds everything slower.
  static constexpr ::std::array<double, 14> queue_delay_bounds_us{
      10, 25, 50, 100, 250, 500, 1'000, 2'500, 5'000, 10'000, 25'000, 50'000, 100'000, 1'000'000};

  // Every submission is exactly one of these once it completed; the first
  // four never enter the queue.
  ::std::uint64_t invalid = 0;    // BatchStatus::invalid_request
  ::std::uint64_t too_large = 0;  // BatchStatus::too_large
  ::std::uint64_t refused = 0;    // BatchStatus::queue_full (try_submit at capacity)
  ::std::uint64_t rejected_shut_down = 0;  // submitted after shutdown began
  ::std::uint64_t completed = 0;  // BatchStatus::ok
  ::std::uint64_t failed = 0;     // BatchStatus::failed
  ::std::uint64_t timed_out = 0;  // BatchStatus::timed_out
  ::std::uint64_t cancelled = 0;  // BatchStatus::shut_down after being queued (cancelling shutdown)

  ::std::uint64_t enqueued = 0;   // requests that entered the queue
  ::std::size_t queue_depth = 0;  // requests waiting now

  ::std::uint64_t batches = 0;        // executor runs
  ::std::uint64_t failed_batches = 0;  // runs that threw
  ::std::uint64_t rows = 0;           // real rows run
  ::std::uint64_t padded_rows = 0;    // rows run after padding to the executor's batch size
  // batch_rows_histogram[n]: batches of n real rows (index 0 unused).
  ::std::vector<::std::uint64_t> batch_rows_histogram;
  // batch_requests_histogram[n]: batches of n requests (index 0 unused).
  ::std::vector<::std::uint64_t> batch_requests_histogram;

  // Queue delay (submission to leaving the queue) of requests that ran:
  // counts per bucket of queue_delay_bounds_us (last: above them), their sum,
  // and percentiles over the most recent ones (up to 8192).
  ::std::array<::std::uint64_t, queue_delay_bounds_us.size() + 1> queue_delay_histogram{};
  double queue_delay_sum_us = 0;
  double queue_delay_p50_us = 0;
  double queue_delay_p99_us = 0;

  // Padding waste: (padded - real) / real rows; 0 before any batch.
  double padding_waste() const noexcept {
    return rows == 0 ? 0.0 : static_cast<double>(padded_rows - rows) / static_cast<double>(rows);
  }
  // Mean real rows per batch.
  double mean_batch_rows() const noexcept {
    return batches == 0 ? 0.0 : static_cast<double>(rows) / static_cast<double>(batches);
  }
};

}  // namespace replay
