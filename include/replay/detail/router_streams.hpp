#pragma once
#include <replay/detail/require_cxx20.hpp>
// ShapeRouter's stream ordering and leases: submissions, stream switches, launches and eager issues.
#include <mutex>
#include <source_location>
#include <thread>

#include "replay/shape_router/router.hpp"
#include "replay/detail/router_records.hpp"
#include "replay/error.hpp"
#include "replay/shape_router/backend.hpp"

namespace replay {

template <RouterKey Key, GraphBackend Backend>
inline auto ShapeRouter<Key, Backend>::lease(stream_type stream, ::std::source_location where) -> Lease {
  refuse_reentry(where);
  ::std::unique_lock<::std::mutex> lock(mutex_);
  if (lease_owner_ == ::std::this_thread::get_id()) {
    throw usage_error("ShapeRouter::lease(): this thread already holds a lease of this router", where);
  }
  switch_cv_.wait(lock, [&] { return lease_owner_ == ::std::thread::id(); });
  lease_owner_ = ::std::this_thread::get_id();
  try {
    Submission held = enter_stream_locked(lock, stream, where);
    held.keep();  // ended by ~Lease
  } catch (...) {
    lease_owner_ = ::std::thread::id();
    switch_cv_.notify_all();
    throw;
  }
  lease_stream_ = stream;
  return Lease(this);
}

template <RouterKey Key, GraphBackend Backend>
inline auto ShapeRouter<Key, Backend>::enter_stream(::std::unique_lock<::std::mutex>& lock, stream_type stream,
                                                    const ::std::source_location& where) -> Submission {
  if (lease_owner_ != ::std::thread::id()) [[unlikely]] {
    if (lease_owner_ == ::std::this_thread::get_id()) {
      if (!(lease_stream_ == stream)) {
        throw usage_error("ShapeRouter::run on another stream than the lease this thread holds; run on the "
                          "leased stream, or release the lease first",
                          where);
      }
      in_flight_.fetch_add(1);
      return Submission(this);
    }
    switch_cv_.wait(lock, [&] { return lease_owner_ == ::std::thread::id(); });
  }
  return enter_stream_locked(lock, stream, where);
}

template <RouterKey Key, GraphBackend Backend>
inline auto ShapeRouter<Key, Backend>::enter_stream_locked(::std::unique_lock<::std::mutex>& lock, stream_type stream,
                                                           const ::std::source_location& where) -> Submission {
  for (;;) {
    if (!switching_.load()) {
      if (!last_stream_.has_value() || *last_stream_ == stream) [[likely]] {
        last_stream_ = stream;
        in_flight_.fetch_add(1);
        return Submission(this);
      }
      if constexpr (!OrdersStreams<Backend>) {
        throw usage_error(
            "ShapeRouter::run on a second stream, but the backend cannot order streams (it has no "
            "order_after): the graphs share their buffers, so the runs would race. Use one router per stream",
            where);
      } else {
        switching_.store(true);
        switch_cv_.wait(lock, [&] { return in_flight_.load() == 0; });
        try {
          backend_.order_after(*last_stream_, stream, where);
        } catch (...) {
          switching_.store(false);
          switch_cv_.notify_all();
          throw;
        }
        last_stream_ = stream;
        ++stats_.stream_switches;
        in_flight_.fetch_add(1);
        switching_.store(false);
        switch_cv_.notify_all();
        return Submission(this);
      }
    }
    switch_cv_.wait(lock, [&] { return !switching_.load(); });
  }
}

template <RouterKey Key, GraphBackend Backend>
inline void ShapeRouter<Key, Backend>::end_lease() noexcept {
  {
    const ::std::lock_guard<::std::mutex> lock(mutex_);
    lease_owner_ = ::std::thread::id();
    in_flight_.fetch_sub(1);
  }
  switch_cv_.notify_all();
}

template <RouterKey Key, GraphBackend Backend>
inline void ShapeRouter<Key, Backend>::leave_stream() noexcept {
  if (in_flight_.fetch_sub(1) == 1 && switching_.load()) {
    const ::std::lock_guard<::std::mutex> lock(mutex_);
    switch_cv_.notify_all();
  }
}

template <RouterKey Key, GraphBackend Backend>
inline void ShapeRouter<Key, Backend>::launch(::std::unique_lock<::std::mutex>& lock, GraphRef graph,
                                              stream_type stream, const ::std::source_location& where) {
  const Submission submission = enter_stream(lock, stream, where);
  lock.unlock();
  const ::std::lock_guard<::std::mutex> exclusive(graph->mutex);
  backend_.launch(graph->exec, stream, where);
}

template <RouterKey Key, GraphBackend Backend>
inline void ShapeRouter<Key, Backend>::issue_eager(::std::unique_lock<::std::mutex>& lock, const Key& shape,
                                                   stream_type stream, const ::std::source_location& where) {
  const Submission submission = enter_stream(lock, stream, where);
  lock.unlock();
  const detail::ActiveRouterScope active(this);
  work_(shape, stream);
}

}  // namespace replay
