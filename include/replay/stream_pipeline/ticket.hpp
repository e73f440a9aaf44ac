#pragma once
// PipelineTicket: the handle submit() returns, a move-only future of one item's result.
#include <replay/detail/require_cxx20.hpp>

#include <chrono>
#include <cstdint>
#include <future>
#include <source_location>
#include <utility>

#include "replay/error.hpp"

namespace replay {

// The handle submit() returns: wait on it, poll it, or get() the result
// (which rethrows the item's error). Move-only, like std::future.
template <class T>
class PipelineTicket {
 public:
  PipelineTicket() = default;
  // Made by the pipeline.
  PipelineTicket(::std::uint64_t id, ::std::future<T> future) noexcept : id_(id), future_(::std::move(future)) {}

  // The item's submission number (0, 1, 2, ... per pipeline).
  ::std::uint64_t id() const noexcept { return id_; }
  // False for a default-constructed ticket and after get().
  bool valid() const noexcept { return future_.valid(); }

  // True when the item is done (output delivered or failed). Never blocks.
  bool ready(::std::source_location where = ::std::source_location::current()) const {
    require_valid(where);
    return future_.wait_for(::std::chrono::seconds(0)) == ::std::future_status::ready;
  }
  void wait(::std::source_location where = ::std::source_location::current()) const {
    require_valid(where);
    future_.wait();
  }
  template <class Rep, class Period>
  bool wait_for(::std::chrono::duration<Rep, Period> timeout,
                ::std::source_location where = ::std::source_location::current()) const {
    require_valid(where);
    return future_.wait_for(timeout) == ::std::future_status::ready;
  }
  // Waits, then returns the result or rethrows the item's error. Once.
  T get(::std::source_location where = ::std::source_location::current()) {
    require_valid(where);
    return future_.get();
  }

 private:
  void require_valid(const ::std::source_location& where) const {
    if (!future_.valid()) {
      throw usage_error("PipelineTicket used after get() (or default-constructed): each ticket yields its "
                        "result once",
                        where);
    }
  }

  ::std::uint64_t id_ = 0;
  ::std::future<T> future_;
};

}  // namespace replay
