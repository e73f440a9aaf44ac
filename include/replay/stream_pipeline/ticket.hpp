#pragma once
// PipelineTicket: the handle submit() returns, a move-only future of one item's result.
#include <replay/detail/require_cxx20.hpp>

#include <chrono>
#include <cstdint>
#include <memory>
#include <source_location>
#include <utility>

#include "replay/stream_pipeline/detail/ticket_state.hpp"
#include "replay/error.hpp"

namespace replay {

// The handle submit() returns: wait on it, poll it, or get() the result
// (which rethrows the item's error). Move-only, like std::future, and usable
// after the pipeline is gone. Its result lives in a record the pipeline
// reuses, so a ticket costs no allocation per item.
template <class T>
class PipelineTicket {
  using Pool = detail::TicketPool<T>;
  using Record = detail::TicketRecord<T>;

 public:
  PipelineTicket() noexcept = default;
  // Made by the pipeline: takes over the ticket's share of `record`.
  PipelineTicket(::std::uint64_t id, ::std::shared_ptr<Pool> pool, Record* record) noexcept
      : id_(id), pool_(::std::move(pool)), record_(record) {}
  PipelineTicket(const PipelineTicket&) = delete;
  PipelineTicket& operator=(const PipelineTicket&) = delete;
  PipelineTicket(PipelineTicket&& other) noexcept
      : id_(other.id_), pool_(::std::move(other.pool_)), record_(::std::exchange(other.record_, nullptr)) {}
  PipelineTicket& operator=(PipelineTicket&& other) noexcept {
    if (this != &other) {
      reset();
      id_ = other.id_;
      pool_ = ::std::move(other.pool_);
      record_ = ::std::exchange(other.record_, nullptr);
    }
    return *this;
  }
  // Dropping a ticket is fine: the item still runs, its result is discarded.
  ~PipelineTicket() { reset(); }

  // The item's submission number (0, 1, 2, ... per pipeline).
  ::std::uint64_t id() const noexcept { return id_; }
  // False for a default-constructed ticket and after get().
  bool valid() const noexcept { return record_ != nullptr; }

  // True when the item is done (output delivered or failed). Never blocks.
  bool ready(::std::source_location where = ::std::source_location::current()) const {
    require_valid(where);
    return Pool::is_ready(record_);
  }
  void wait(::std::source_location where = ::std::source_location::current()) const {
    require_valid(where);
    pool_->wait(record_);
  }
  template <class Rep, class Period>
  bool wait_for(::std::chrono::duration<Rep, Period> timeout,
                ::std::source_location where = ::std::source_location::current()) const {
    require_valid(where);
    return pool_->wait_for(record_, timeout);
  }
  // Waits, then returns the result or rethrows the item's error. Once.
  T get(::std::source_location where = ::std::source_location::current()) {
    require_valid(where);
    pool_->wait(record_);
    Record* record = ::std::exchange(record_, nullptr);
    if (record->error != nullptr) {
      ::std::exception_ptr error = record->error;
      pool_->release(record);
      ::std::rethrow_exception(error);
    }
    T value = ::std::move(*record->value);
    pool_->release(record);
    return value;
  }

 private:
  void require_valid(const ::std::source_location& where) const {
    if (record_ == nullptr) {
      throw usage_error("PipelineTicket used after get() (or default-constructed): each ticket yields its "
                        "result once",
                        where);
    }
  }
  void reset() noexcept {
    if (record_ != nullptr) {
      pool_->release(::std::exchange(record_, nullptr));
    }
  }

  ::std::uint64_t id_ = 0;
  ::std::shared_ptr<Pool> pool_;
  Record* record_ = nullptr;
};

}  // namespace replay
