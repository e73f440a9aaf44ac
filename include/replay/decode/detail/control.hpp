#pragma once
#include <replay/detail/require_cxx20.hpp>
// What a decode request's handles share with the scheduler: the scheduler's
// lock and wake-up (kept alive by the handles, so that cancel() after the
// scheduler is gone is a harmless no-op) and the request's cancel flag.
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <utility>

namespace replay::detail {

struct DecodeWakeup {
  ::std::mutex mutex;             // the scheduler's lock: its queue, flags and stats
  ::std::condition_variable work;  // the worker waits on it for requests, cancellations and shutdown
  ::std::uint64_t cancel_epoch = 0;  // bumped by every cancel() (guarded by mutex)
};

struct DecodeControl {
  DecodeControl(::std::uint64_t request_id, ::std::shared_ptr<DecodeWakeup> scheduler_wakeup) noexcept
      : id(request_id), wakeup(::std::move(scheduler_wakeup)) {}

  const ::std::uint64_t id;
  ::std::atomic<bool> cancel_requested{false};
  ::std::atomic<bool> ended{false};  // the final update was (or is being) delivered
  const ::std::shared_ptr<DecodeWakeup> wakeup;

  // Any thread; the worker sees the flag at its next step boundary (and is
  // woken if it waits). Idempotent; a no-op once the request ended.
  void cancel() noexcept {
    if (ended.load(::std::memory_order_acquire) || cancel_requested.exchange(true, ::std::memory_order_acq_rel)) {
      return;
    }
    {
      // Under the lock, so that a worker between its check and its wait cannot miss it.
      ::std::lock_guard lock(wakeup->mutex);
      ++wakeup->cancel_epoch;
    }
    wakeup->work.notify_all();
  }
};

}  // namespace replay::detail
