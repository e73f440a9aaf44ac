#pragma once
#include <replay/detail/require_cxx20.hpp>
// The Batcher's worker thread: gathering a batch, expiring requests, running the
// batch and completing its requests; included by batcher/batcher.hpp.
#include <algorithm>
#include <chrono>
#include <cstddef>
#include <exception>
#include <iterator>
#include <list>
#include <mutex>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "replay/batcher/batcher.hpp"
#include "replay/batcher/policy.hpp"
#include "replay/batcher/stats.hpp"
#include "replay/batcher/status.hpp"
#include "replay/batcher/detail/completion_frame.hpp"
#include "replay/batcher/detail/message.hpp"
#include "replay/error.hpp"

namespace replay {

template <BatchExecutor Executor>
void Batcher<Executor>::serve() {
  // Registered first, so it outlives the requests below: destroying one may
  // destroy this Batcher (a completion holding its last owner).
  const detail::CompletionFrame frame(this);
  ::std::list<Request> batch;  // lists: moved out of the queue by splicing, no allocation
  ::std::list<Request> expired;
  ::std::vector<::std::size_t> waiting_rows;
  ::std::unique_lock lock(mutex_);
  for (;;) {
    work_ready_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) {
      return;  // stopping, nothing left
    }
    const clock::time_point now = clock::now();
    take_expired(now, expired);
    if (!expired.empty()) {
      lock.unlock();
      room_.notify_all();
      for (Request& request : expired) {
        finish(request, expired_result(request, now));
      }
      expired.clear();
      if (frame.owner_destroyed()) {
        return;
      }
      lock.lock();
      continue;
    }
    // Requests arrive in order, so the overdue ones are a prefix.
    waiting_rows.clear();
    ::std::size_t overdue = 0;
    for (const Request& request : queue_) {
      if (waiting_rows.size() == options_.max_batch_rows + 1) {
        break;  // enough to know whether the next one fits
      }
      waiting_rows.push_back(request.rows);
      if (stopping_ || request.arrival + options_.max_queue_delay <= now) {
        ++overdue;
      }
    }
    const BatchPlanLimits limits{options_.max_batch_rows, options_.max_batch_requests,
                                 options_.preferred_batch_rows, options_.trim_to_preferred};
    const ::std::size_t take = plan_batch(waiting_rows, overdue, limits);
    if (take == 0) {
      // Wait for more, for the oldest to fall due, or for the first deadline.
      clock::time_point wake = queue_.front().arrival + options_.max_queue_delay;
      for (const Request& request : queue_) {
        wake = ::std::min(wake, request.deadline);
      }
      work_ready_.wait_until(lock, wake);
      continue;
    }
    batch.splice(batch.end(), queue_, queue_.begin(),
                 ::std::next(queue_.begin(), static_cast<::std::ptrdiff_t>(take)));
    stats_.queue_depth = queue_.size();
    lock.unlock();
    room_.notify_all();
    run_batch(batch, now);
    batch.clear();
    if (frame.owner_destroyed()) {
      return;
    }
    lock.lock();
  }
}

template <BatchExecutor Executor>
void Batcher<Executor>::take_expired(clock::time_point now, ::std::list<Request>& expired) {
  for (auto it = queue_.begin(); it != queue_.end();) {
    const auto next = ::std::next(it);
    if (it->deadline <= now) {
      expired.splice(expired.end(), queue_, it);
    }
    it = next;
  }
  stats_.timed_out += expired.size();
  stats_.queue_depth = queue_.size();
}

template <BatchExecutor Executor>
auto Batcher<Executor>::expired_result(const Request& request, clock::time_point now) -> result_type {
  result_type result = failure(
      BatchStatus::timed_out,
      detail::batcher_message("the deadline passed after ",
                     ::std::chrono::duration_cast<::std::chrono::microseconds>(now - request.arrival).count(),
                     " us in the queue; not run"));
  result.queue_delay = ::std::chrono::duration_cast<::std::chrono::microseconds>(now - request.arrival);
  return result;
}

template <BatchExecutor Executor>
void Batcher<Executor>::run_batch(::std::list<Request>& batch, clock::time_point dequeued) {
  ::std::size_t rows = 0;
  for (const Request& request : batch) {
    rows += request.rows;
  }
  const ::std::size_t padded = padded_batch_rows(sizes_, rows);
  ::std::vector<result_type> results(batch.size());
  bool ok = true;
  ::std::string error;
  try {
    const ::std::span<input_type> staging = executor_.input_staging();
    if (staging.size() < rows * in_row_) {
      throw usage_error(detail::batcher_message("Batcher: the executor's input_staging() holds ", staging.size(),
                                       " elements, a batch of ", rows, " rows needs ", rows * in_row_));
    }
    ::std::size_t offset = 0;
    for (const Request& request : batch) {
      ::std::copy(request.input.begin(), request.input.end(), staging.begin() + static_cast<::std::ptrdiff_t>(offset));
      offset += request.input.size();
    }
    const ::std::span<const output_type> output = executor_.run(rows);
    if (output.size() < rows * out_row_) {
      throw usage_error(detail::batcher_message("Batcher: the executor's run(", rows, ") returned ", output.size(),
                                       " elements, expected ", rows * out_row_));
    }
    offset = 0;
    auto result = results.begin();
    for (const Request& request : batch) {
      const ::std::size_t n = request.rows * out_row_;
      (result++)->output.assign(output.begin() + static_cast<::std::ptrdiff_t>(offset),
                                output.begin() + static_cast<::std::ptrdiff_t>(offset + n));
      offset += n;
    }
  } catch (const ::std::exception& e) {
    ok = false;
    error = detail::batcher_message("the batch of ", rows, " rows (", batch.size(), " requests) failed: ", e.what());
  } catch (...) {
    ok = false;
    error = detail::batcher_message("the batch of ", rows, " rows (", batch.size(), " requests) failed: unknown exception");
  }
  {
    ::std::lock_guard lock(mutex_);
    ++stats_.batches;
    stats_.rows += rows;
    stats_.padded_rows += padded;
    ++stats_.batch_rows_histogram[rows];
    ++stats_.batch_requests_histogram[batch.size()];
    if (ok) {
      stats_.completed += batch.size();
    } else {
      ++stats_.failed_batches;
      stats_.failed += batch.size();
    }
    for (Request& request : batch) {
      record_delay(static_cast<double>(
                       ::std::chrono::duration_cast<::std::chrono::nanoseconds>(dequeued - request.arrival).count()) /
                   1000.0);
    }
  }
  // From the first completion on, only locals: a completion may destroy this Batcher.
  auto result = results.begin();
  for (Request& request : batch) {
    if (!ok) {
      result->status = BatchStatus::failed;
      result->message = error;
      result->output.clear();
    }
    result->batch_rows = rows;
    result->padded_rows = padded;
    result->queue_delay = ::std::chrono::duration_cast<::std::chrono::microseconds>(dequeued - request.arrival);
    finish(request, ::std::move(*result++));
  }
}

template <BatchExecutor Executor>
void Batcher<Executor>::record_delay(double us) {
  const auto& bounds = BatcherStats::queue_delay_bounds_us;
  const auto bucket = static_cast<::std::size_t>(::std::lower_bound(bounds.begin(), bounds.end(), us) - bounds.begin());
  ++stats_.queue_delay_histogram[bucket];
  stats_.queue_delay_sum_us += us;
  if (delays_.size() < delay_window) {
    delays_.push_back(us);
  } else {
    delays_[delay_next_] = us;
    delay_next_ = (delay_next_ + 1) % delay_window;
  }
}

}  // namespace replay
