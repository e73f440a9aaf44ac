#pragma once
#include <replay/detail/require_cxx20.hpp>
// DecodeStats: what a DecodeScheduler did since construction or reset_stats().
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace replay {

// Counters of a DecodeScheduler (DecodeScheduler::stats()).
struct DecodeStats {
  // Upper bounds (microseconds, inclusive) of the queue-delay histogram's
  // buckets; one more bucket above the last holds everything slower.
  static constexpr ::std::array<double, 12> queue_delay_bounds_us{
      100, 250, 500, 1'000, 2'500, 5'000, 10'000, 25'000, 100'000, 250'000, 1'000'000, 10'000'000};

  // Every submission is counted once, by how it ended. The first four never
  // enter the queue.
  ::std::uint64_t invalid = 0;             // DecodeStatus::invalid_request
  ::std::uint64_t prompt_too_long = 0;     // DecodeStatus::prompt_too_long
  ::std::uint64_t refused = 0;             // DecodeStatus::queue_full
  ::std::uint64_t rejected_shut_down = 0;  // submitted after shutdown began
  ::std::uint64_t finished_eos = 0;            // DecodeStatus::eos
  ::std::uint64_t finished_token_limit = 0;    // DecodeStatus::token_limit
  ::std::uint64_t finished_context_limit = 0;  // DecodeStatus::context_limit
  ::std::uint64_t cancelled = 0;  // DecodeStatus::cancelled (queued or running)
  ::std::uint64_t failed = 0;     // DecodeStatus::failed
  ::std::uint64_t shut_down = 0;  // ended by a cancelling shutdown after being queued

  ::std::uint64_t enqueued = 0;   // requests that entered the queue
  ::std::uint64_t admitted = 0;   // requests given a slot
  ::std::size_t queue_depth = 0;  // requests waiting now
  ::std::size_t active = 0;       // sequences holding a slot now

  ::std::uint64_t prefills = 0;         // executor prefill() calls
  ::std::uint64_t failed_prefills = 0;  // ... that threw
  ::std::uint64_t prefill_tokens = 0;   // prompt tokens prefilled (by prefill() or in chunks)
  ::std::uint64_t launches = 0;         // executor decode() calls
  ::std::uint64_t failed_launches = 0;  // ... that threw or reported bad counts
  ::std::uint64_t steps = 0;            // decode steps run: per launch, the most tokens a row got
  ::std::uint64_t tokens = 0;           // tokens produced (each prompt's first token included)
  ::std::uint64_t rows = 0;             // sequences over all decode() launches
  ::std::uint64_t padded_rows = 0;      // the same, padded to the batch buckets
  // Chunked prefill (DecodePrefill::with_decode): executor
  // prefill_and_decode() calls.
  ::std::uint64_t mixed_launches = 0;
  // prefill_and_decode() calls that threw or reported bad counts.
  ::std::uint64_t failed_mixed_launches = 0;
  // Prompt chunks the mixed launches carried (a whole prompt is one chunk).
  ::std::uint64_t prefill_chunks = 0;
  // Running sequences the mixed launches stepped.
  ::std::uint64_t mixed_rows = 0;

  // decode() launches per bucket: bucket_launches[b * context_buckets.size() + c] is
  // the number of launches in batch bucket batch_buckets[b] and context
  // bucket context_buckets[c].
  ::std::vector<::std::int64_t> batch_buckets;
  ::std::vector<::std::int64_t> context_buckets;
  ::std::vector<::std::uint64_t> bucket_launches;

  // Queue delay (submission to admission) of admitted requests: counts per
  // bucket of queue_delay_bounds_us (last: above them), their sum and
  // maximum, and percentiles over the most recent ones (up to 8192).
  ::std::array<::std::uint64_t, queue_delay_bounds_us.size() + 1> queue_delay_histogram{};
  double queue_delay_sum_us = 0;
  double queue_delay_max_us = 0;
  double queue_delay_p50_us = 0;
  double queue_delay_p99_us = 0;

  // Launches in the bucket of `batch` rows and `context` positions (0 for a
  // pair that is no bucket).
  ::std::uint64_t launches_in(::std::int64_t batch, ::std::int64_t context) const noexcept {
    const auto b = ::std::find(batch_buckets.begin(), batch_buckets.end(), batch);
    const auto c = ::std::find(context_buckets.begin(), context_buckets.end(), context);
    if (b == batch_buckets.end() || c == context_buckets.end()) {
      return 0;
    }
    const auto index = static_cast<::std::size_t>(b - batch_buckets.begin()) * context_buckets.size() +
                       static_cast<::std::size_t>(c - context_buckets.begin());
    return index < bucket_launches.size() ? bucket_launches[index] : 0;
  }
  // Requests that ended normally (eos, token_limit, context_limit).
  ::std::uint64_t finished() const noexcept {
    return finished_eos + finished_token_limit + finished_context_limit;
  }
  // Padding waste: (padded - real) / real rows; 0 before any launch.
  double padding_waste() const noexcept {
    return rows == 0 ? 0.0 : static_cast<double>(padded_rows - rows) / static_cast<double>(rows);
  }
  // Mean sequences per launch.
  double mean_batch_rows() const noexcept {
    return launches == 0 ? 0.0 : static_cast<double>(rows) / static_cast<double>(launches);
  }
};

}  // namespace replay
