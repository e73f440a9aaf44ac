#pragma once
#include <replay/detail/require_cxx20.hpp>
// Batcher: dynamic request batching in front of an executor (a ShapeRouter
// through StagedCudaExecutor, or anything satisfying BatchExecutor).
//
//   replay::Batcher batcher(replay::router_executor(router, input, output, 256, 10, stream),
//                           {.max_queue_delay = std::chrono::microseconds(200)});
//   auto future = batcher.submit(rows);              // from any thread; waits while the queue is full
//   replay::BatchResult<float> result = future.get();
//   if (result) use(result.output); else report(result.status, result.message);
//
// Many producer threads submit requests of one or more rows; one worker
// thread gathers them (plan_batch(): up to the largest batch, leaving at once
// when a preferred size is full, at the latest when the oldest has waited
// max_queue_delay), writes their rows into the executor's staging area, runs
// the batch, and completes each request with its own rows. Every request is
// completed exactly once, through a future or a callback, with a BatchResult
// that carries the output or the reason it has none. See docs/batching.md.
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <future>
#include <list>
#include <memory>
#include <mutex>
#include <source_location>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "replay/batcher/executor.hpp"
#include "replay/batcher/options.hpp"
#include "replay/batcher/policy.hpp"
#include "replay/batcher/stats.hpp"
#include "replay/batcher/status.hpp"
#include "replay/batcher/detail/completion_frame.hpp"
#include "replay/batcher/detail/message.hpp"
#include "replay/error.hpp"

namespace replay {

// What shutdown() does with requests still waiting.
enum class ShutdownMode : ::std::uint8_t {
  drain,   // run them (deadlines still apply), then stop
  cancel,  // complete them with BatchStatus::shut_down, then stop
};

template <BatchExecutor Executor>
class Batcher {
 public:
  using executor_type = Executor;
  using input_type = typename Executor::input_type;
  using output_type = typename Executor::output_type;
  using result_type = BatchResult<output_type>;
  // Called exactly once per request, on the worker thread, or on the
  // submitting thread when the request never enters the queue. Must not
  // throw, and should be quick (it holds up the next batch).
  using completion_type = ::std::function<void(result_type)>;
  using clock = ::std::chrono::steady_clock;

  explicit Batcher(Executor executor, BatcherOptions options = {},
                   ::std::source_location where = ::std::source_location::current())
      : executor_(::std::move(executor)), options_(::std::move(options)) {
    in_row_ = executor_.input_row_elements();
    out_row_ = executor_.output_row_elements();
    sizes_ = executor_.batch_sizes();
    validate(where);
    stats_.batch_rows_histogram.assign(options_.max_batch_rows + 1, 0);
    stats_.batch_requests_histogram.assign(options_.max_batch_rows + 1, 0);
    delays_.reserve(delay_window);
    worker_ = ::std::thread([this] { serve(); });
    worker_id_ = worker_.get_id();  // before any completion: those follow a submission
  }

  Batcher(const Batcher&) = delete;
  Batcher& operator=(const Batcher&) = delete;
  Batcher(Batcher&&) = delete;  // its worker points at it; keep it in a unique_ptr to move it
  Batcher& operator=(Batcher&&) = delete;

  // Drains: every waiting request runs (or expires) before the worker stops.
  // From one of its own completions on the worker (which dropped the last
  // owner, or whose request held it) the waiting requests run right here, and
  // the worker ends on its own without touching this object again.
  ~Batcher() {
    if (on_worker_thread()) {
      shutdown(ShutdownMode::drain);  // stops accepting; a thread cannot join itself
      serve();                        // drains here, on the worker thread
      worker_.detach();
    } else {
      shutdown(ShutdownMode::drain);
    }
    detail::CompletionFrame::mark_destroyed(this);
  }

  // ---- submission ------------------------------------------------------------

  // Queues `rows` (a whole number of input rows, copied). When the queue is
  // full, waits for room until the request's deadline.
  void submit(::std::span<const input_type> rows, completion_type done, SubmitOptions submit_options = {}) {
    enqueue(rows, ::std::move(done), submit_options, true);
  }
  ::std::future<result_type> submit(::std::span<const input_type> rows, SubmitOptions submit_options = {}) {
    return with_future([&](completion_type done) { enqueue(rows, ::std::move(done), submit_options, true); });
  }
  // As submit(), but a full queue completes the request at once with
  // BatchStatus::queue_full (back-pressure for callers that must not block,
  // e.g. a server answering 503).
  void try_submit(::std::span<const input_type> rows, completion_type done, SubmitOptions submit_options = {}) {
    enqueue(rows, ::std::move(done), submit_options, false);
  }
  ::std::future<result_type> try_submit(::std::span<const input_type> rows, SubmitOptions submit_options = {}) {
    return with_future([&](completion_type done) { enqueue(rows, ::std::move(done), submit_options, false); });
  }

  // ---- lifetime --------------------------------------------------------------

  // Stops accepting (later submissions complete with BatchStatus::shut_down,
  // and so do submit() calls waiting for room), deals with the waiting
  // requests as `mode` says, and joins the worker (unless called on it, from
  // a completion: the worker then stops once it is back in its loop). The
  // batch running now completes normally. Idempotent. Allocates nothing and
  // cannot throw: cancelled requests that cannot get their message (out of
  // memory) are completed with the status alone.
  void shutdown(ShutdownMode mode = ShutdownMode::drain) noexcept {
    ::std::list<Request> cancelled;
    {
      ::std::lock_guard lock(mutex_);
      if (!stopping_) {
        stopping_ = true;
        if (mode == ShutdownMode::cancel) {
          cancelled.splice(cancelled.end(), queue_);
          stats_.cancelled += cancelled.size();
          stats_.queue_depth = 0;
        }
      }
    }
    work_ready_.notify_all();
    room_.notify_all();
    if (!cancelled.empty()) {
      const detail::CompletionFrame frame(this);
      for (Request& request : cancelled) {
        finish(request, BatchStatus::shut_down,
               "the Batcher shut down (cancel) before this request ran; it was not run");
      }
      cancelled.clear();  // a request may hold the last owner
      if (frame.owner_destroyed()) {
        return;  // the destructor ran on this thread and joined the worker
      }
    }
    if (on_worker_thread()) {
      return;  // from a completion: the worker stops once back in its loop
    }
    ::std::lock_guard join_lock(join_mutex_);
    // std::thread::join throws only for a thread that is not joinable or is
    // the calling thread: both are excluded here.
    if (worker_.joinable()) {
      worker_.join();
    }
  }
  bool accepting() const {
    ::std::lock_guard lock(mutex_);
    return !stopping_;
  }

  // ---- introspection ---------------------------------------------------------

  BatcherStats stats() const {
    BatcherStats out;
    ::std::vector<double> sorted;
    {
      ::std::lock_guard lock(mutex_);
      out = stats_;
      sorted = delays_;
    }
    if (!sorted.empty()) {
      ::std::sort(sorted.begin(), sorted.end());  // outside the lock: the worker goes on
      auto at = [&](double q) {
        const auto i = static_cast<::std::size_t>(q * static_cast<double>(sorted.size() - 1) + 0.5);
        return sorted[::std::min(i, sorted.size() - 1)];
      };
      out.queue_delay_p50_us = at(0.50);
      out.queue_delay_p99_us = at(0.99);
    }
    return out;
  }
  void reset_stats() {
    ::std::lock_guard lock(mutex_);
    const ::std::size_t depth = stats_.queue_depth;
    stats_ = BatcherStats{};
    stats_.queue_depth = depth;
    stats_.batch_rows_histogram.assign(options_.max_batch_rows + 1, 0);
    stats_.batch_requests_histogram.assign(options_.max_batch_rows + 1, 0);
    delays_.clear();
    delay_next_ = 0;
  }

  // The options in force (max_batch_rows and preferred_batch_rows filled in).
  const BatcherOptions& options() const noexcept { return options_; }
  ::std::size_t input_row_elements() const noexcept { return in_row_; }
  ::std::size_t output_row_elements() const noexcept { return out_row_; }
  // The executor's batch sizes (what a batch is padded up to).
  const ::std::vector<::std::size_t>& batch_sizes() const noexcept { return sizes_; }

 private:
  static constexpr ::std::size_t delay_window = 8192;

  struct Request {
    ::std::vector<input_type> input;
    ::std::size_t rows = 0;
    clock::time_point arrival;
    clock::time_point deadline;
    completion_type done;
  };

  void validate(const ::std::source_location& where) {
    if (in_row_ == 0 || out_row_ == 0) {
      throw usage_error(detail::batcher_message("Batcher: the executor's row sizes must be positive, got input ", in_row_,
                                       " and output ", out_row_, " elements per row"),
                        where);
    }
    if (sizes_.empty() || sizes_.front() == 0 || !::std::is_sorted(sizes_.begin(), sizes_.end()) ||
        ::std::adjacent_find(sizes_.begin(), sizes_.end()) != sizes_.end()) {
      throw usage_error("Batcher: the executor's batch_sizes() must be positive and strictly ascending", where);
    }
    const ::std::size_t largest = sizes_.back();
    if (options_.max_batch_rows == 0) {
      options_.max_batch_rows = largest;
    }
    if (options_.max_batch_rows > largest) {
      throw usage_error(detail::batcher_message("Batcher: max_batch_rows is ", options_.max_batch_rows,
                                       " but the executor's largest batch is ", largest, " rows"),
                        where);
    }
    auto& preferred = options_.preferred_batch_rows;
    if (preferred.empty()) {
      for (::std::size_t size : sizes_) {
        if (size <= options_.max_batch_rows) {
          preferred.push_back(size);
        }
      }
    }
    if (preferred.front() == 0 || !::std::is_sorted(preferred.begin(), preferred.end()) ||
        ::std::adjacent_find(preferred.begin(), preferred.end()) != preferred.end() ||
        preferred.back() > options_.max_batch_rows) {
      throw usage_error(detail::batcher_message("Batcher: preferred_batch_rows must be positive, strictly ascending and at "
                                       "most max_batch_rows (",
                                       options_.max_batch_rows, ")"),
                        where);
    }
    if (options_.queue_capacity == 0) {
      throw usage_error("Batcher: queue_capacity must be at least 1", where);
    }
    if (options_.max_queue_delay.count() < 0 || options_.default_timeout.count() < 0) {
      throw usage_error("Batcher: max_queue_delay and default_timeout must not be negative", where);
    }
  }

  template <class Enqueue>
  static ::std::future<result_type> with_future(Enqueue&& enqueue_with) {
    auto promise = ::std::make_shared<::std::promise<result_type>>();
    ::std::future<result_type> future = promise->get_future();
    enqueue_with([promise](result_type result) { promise->set_value(::std::move(result)); });
    return future;
  }

  static result_type failure(BatchStatus status, ::std::string message) {
    result_type result;
    result.status = status;
    result.message = ::std::move(message);
    return result;
  }

  static void finish(Request& request, result_type result) noexcept {
    try {
      request.done(::std::move(result));
    } catch (...) {
      // A completion must not throw; the Batcher keeps serving the others.
    }
  }
  // A failure without output; out of memory for the message, the status alone.
  static void finish(Request& request, BatchStatus status, const char* message) noexcept {
    result_type result;
    result.status = status;
    try {
      result.message = message;
    } catch (...) {
    }
    finish(request, ::std::move(result));
  }

  bool on_worker_thread() const noexcept { return worker_id_ == ::std::this_thread::get_id(); }

  void enqueue(::std::span<const input_type> rows, completion_type done, SubmitOptions submit_options,
               bool wait_for_room) {
    if (!done) {
      throw usage_error("Batcher: submit()/try_submit() got an empty completion; give a callable (or use the future)");
    }
    Request request;
    request.done = ::std::move(done);
    request.arrival = clock::now();
    request.deadline = submit_options.deadline;
    if (request.deadline == clock::time_point::max() && options_.default_timeout.count() > 0) {
      request.deadline = request.arrival + options_.default_timeout;
    }
    if (rows.empty() || rows.size() % in_row_ != 0) {
      count(&BatcherStats::invalid);
      finish(request, failure(BatchStatus::invalid_request,
                              detail::batcher_message("a request of ", rows.size(), " elements is not a whole, positive number ",
                                             "of rows of ", in_row_, " elements")));
      return;
    }
    request.rows = rows.size() / in_row_;
    if (request.rows > options_.max_batch_rows) {
      count(&BatcherStats::too_large);
      finish(request, failure(BatchStatus::too_large,
                              detail::batcher_message("a request of ", request.rows, " rows is larger than the largest batch (",
                                             options_.max_batch_rows, " rows)")));
      return;
    }
    request.input.assign(rows.begin(), rows.end());

    BatchStatus refusal = BatchStatus::ok;
    {
      ::std::unique_lock lock(mutex_);
      auto has_room = [&] { return stopping_ || queue_.size() < options_.queue_capacity; };
      if (!has_room()) {
        if (!wait_for_room) {
          refusal = BatchStatus::queue_full;
        } else if (request.deadline == clock::time_point::max()) {
          room_.wait(lock, has_room);
        } else if (!room_.wait_until(lock, request.deadline, has_room)) {
          refusal = BatchStatus::timed_out;
        }
      }
      if (refusal == BatchStatus::ok && stopping_) {
        refusal = BatchStatus::shut_down;
      }
      switch (refusal) {
        case BatchStatus::ok:
          queue_.push_back(::std::move(request));
          ++stats_.enqueued;
          stats_.queue_depth = queue_.size();
          break;
        case BatchStatus::queue_full: ++stats_.refused; break;
        case BatchStatus::timed_out: ++stats_.timed_out; break;
        default: ++stats_.rejected_shut_down; break;
      }
    }
    switch (refusal) {
      case BatchStatus::ok: work_ready_.notify_one(); break;
      case BatchStatus::queue_full:
        finish(request, failure(refusal, detail::batcher_message("the queue is full (", options_.queue_capacity,
                                                        " requests waiting); try again later")));
        break;
      case BatchStatus::timed_out:
        finish(request, failure(refusal, "the deadline passed while waiting for room in the queue; not run"));
        break;
      default:
        finish(request, failure(BatchStatus::shut_down, "the Batcher is shutting down and accepts no requests"));
        break;
    }
  }

  void count(::std::uint64_t BatcherStats::*counter) {
    ::std::lock_guard lock(mutex_);
    ++(stats_.*counter);
  }

  // The worker: gather, run, complete; until stopped and (drain) empty.
  // Also run by the destructor when it runs on the worker thread. Returns at
  // once, touching nothing, when a completion destroyed this Batcher.
  void serve();

  // Moves the requests whose deadline has passed out of the queue (lock held).
  void take_expired(clock::time_point now, ::std::list<Request>& expired);

  static result_type expired_result(const Request& request, clock::time_point now);

  // Runs the batch and completes its requests; after the first completion it
  // touches nothing of this object (a completion may destroy it).
  void run_batch(::std::list<Request>& batch, clock::time_point dequeued);

  // Lock held.
  void record_delay(double us);

  Executor executor_;
  BatcherOptions options_;
  ::std::size_t in_row_ = 0;
  ::std::size_t out_row_ = 0;
  ::std::vector<::std::size_t> sizes_;

  mutable ::std::mutex mutex_;  // guards everything below but worker_
  ::std::condition_variable work_ready_;
  ::std::condition_variable room_;
  ::std::list<Request> queue_;  // a list: shutdown() splices it out without allocating
  bool stopping_ = false;
  BatcherStats stats_;
  ::std::vector<double> delays_;
  ::std::size_t delay_next_ = 0;

  ::std::mutex join_mutex_;
  ::std::thread::id worker_id_;  // set once, before any completion: read without a lock
  ::std::thread worker_;         // last: starts after everything it uses
};

template <class Executor>
Batcher(Executor, BatcherOptions = {}) -> Batcher<Executor>;

}  // namespace replay

// The out-of-line part: the worker (gather, run, complete).
#include "replay/batcher/detail/worker.hpp"
