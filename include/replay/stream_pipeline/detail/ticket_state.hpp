#pragma once
// Internals of PipelineTicket: a pool of reusable result records shared by a
// pipeline and its tickets, so that an item costs no allocation (a record is
// reused once both its ticket and the pipeline let go of it), and a record
// outlives the pipeline while a ticket still holds it.
#include <replay/detail/require_cxx20.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <mutex>
#include <optional>
#include <type_traits>
#include <utility>

namespace replay::detail {

template <class T>
struct TicketRecord {
  ::std::atomic<bool> ready{false};
  ::std::atomic<int> owners{0};  // the pipeline (until it delivers) and the ticket (until get() or destruction)
  ::std::optional<T> value;
  ::std::exception_ptr error;
  TicketRecord* next_free = nullptr;
};

template <class T>
class TicketPool {
 public:
  using record_type = TicketRecord<T>;

  // A record owned twice: by the pipeline and by the ticket. Allocates only
  // when every record is still held (more tickets alive than ever before).
  record_type* acquire() {
    ::std::lock_guard lock(mutex_);
    record_type* record = free_;
    if (record != nullptr) {
      free_ = record->next_free;
    } else {
      record = &records_.emplace_back();  // a deque never moves its elements
    }
    record->next_free = nullptr;
    record->ready.store(false, ::std::memory_order_relaxed);
    record->owners.store(2, ::std::memory_order_relaxed);
    return record;
  }
  // One owner lets go; the last one returns the record to the pool.
  void release(record_type* record) noexcept {
    if (record->owners.fetch_sub(1, ::std::memory_order_acq_rel) == 1) {
      record->value.reset();
      record->error = nullptr;
      ::std::lock_guard lock(mutex_);
      record->next_free = free_;
      free_ = record;
    }
  }

  // The pipeline's side: store the result, wake waiters, let go.
  void fulfill(record_type* record, T&& value) noexcept(::std::is_nothrow_move_constructible_v<T>) {
    record->value.emplace(::std::move(value));
    publish(record);
  }
  void fail(record_type* record, ::std::exception_ptr error) noexcept {
    record->error = ::std::move(error);
    publish(record);
  }

  // The ticket's side.
  // seq_cst: pairs with publish() (a store, then a load of waiters_) as in Dekker's pattern.
  static bool is_ready(const record_type* record) noexcept { return record->ready.load(::std::memory_order_seq_cst); }
  void wait(const record_type* record) {
    if (is_ready(record)) {
      return;
    }
    ::std::unique_lock lock(mutex_);
    waiters_.fetch_add(1, ::std::memory_order_seq_cst);
    cv_.wait(lock, [&] { return is_ready(record); });
    waiters_.fetch_sub(1, ::std::memory_order_relaxed);
  }
  template <class Rep, class Period>
  bool wait_for(const record_type* record, ::std::chrono::duration<Rep, Period> timeout) {
    if (is_ready(record)) {
      return true;
    }
    ::std::unique_lock lock(mutex_);
    waiters_.fetch_add(1, ::std::memory_order_seq_cst);
    const bool ready = cv_.wait_for(lock, timeout, [&] { return is_ready(record); });
    waiters_.fetch_sub(1, ::std::memory_order_relaxed);
    return ready;
  }

 private:
  void publish(record_type* record) noexcept {
    record->ready.store(true, ::std::memory_order_seq_cst);
    // A waiter counts itself before it checks `ready` under the mutex, so
    // either it sees ready, or this sees it and wakes it (through the mutex:
    // it is then inside wait()). No waiter: no lock at all.
    if (waiters_.load(::std::memory_order_seq_cst) != 0) {
      { ::std::lock_guard lock(mutex_); }
      cv_.notify_all();
    }
    release(record);
  }

  ::std::mutex mutex_;
  ::std::condition_variable cv_;
  ::std::atomic<int> waiters_{0};
  ::std::deque<record_type> records_;
  record_type* free_ = nullptr;
};

}  // namespace replay::detail
