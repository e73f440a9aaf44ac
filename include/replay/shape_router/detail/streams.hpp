#pragma once
#include <replay/detail/require_cxx20.hpp>
// ShapeRouter's hit path, stream ordering and leases: run(), submissions, stream switches, launches and eager issues.
#include <mutex>
#include <source_location>
#include <thread>
#include <utility>
#include <vector>

#include "replay/shape_router/router.hpp"
#include "replay/detail/message.hpp"
#include "replay/shape_router/detail/records.hpp"
#include "replay/shape_router/detail/keys.hpp"
#include "replay/error.hpp"
#include "replay/piecewise/region.hpp"
#include "replay/shape_router/backend.hpp"
#include "replay/shape_router/stats.hpp"

namespace replay {

// Ends a submission (see enter_stream) when it goes out of scope.
template <RouterKey Key, GraphBackend Backend>
class ShapeRouter<Key, Backend>::Submission {
 public:
  Submission(ShapeRouter* router, bool marks) noexcept : router_(router), marks_(marks) {}
  Submission(const Submission&) = delete;
  Submission& operator=(const Submission&) = delete;
  ~Submission() {
    if (router_ != nullptr) {
      router_->leave_stream(marks_);
    }
  }
  // The work is issued on `stream` (still alive: this thread issued it):
  // records the order event after it when the router orders streams.
  void issued(const stream_type& stream, const ::std::source_location& where) {
    if (marks_) {
      if constexpr (OrdersStreams<Backend>) {
        router_->backend_.mark(stream, where);
      }
      marks_ = false;
    }
  }
  // Kept open past this object (a Lease ends it).
  void keep() noexcept { router_ = nullptr; }

 private:
  ShapeRouter* router_;
  bool marks_;  // a mark is owed (and not yet recorded)
};

template <RouterKey Key, GraphBackend Backend>
inline Route<Key> ShapeRouter<Key, Backend>::run(const Key& key, stream_type stream, ::std::source_location where) {
  refuse_reentry(where);
  const Planned planned = Plan::plan(options_, key, where);
  ::std::unique_lock<::std::mutex> lock(mutex_);
  admit_stream(stream, true, where);
  ++hot_.runs;
  hot_.real_elements += detail::element_count(key);
  hot_.padded_elements += detail::element_count(planned.shape);
  if (planned.oversize) [[unlikely]] {
    ++stats_.misses;
    ++stats_.oversize;
    issue_eager(lock, planned.shape, stream, where);
    return Route<Key>{planned.shape, RouteKind::eager_oversize};
  }
  if (Entry* const found = entries_.find(planned); found != nullptr && found->state == State::captured) [[likely]] {
    Entry& entry = *found;
    // The hit: the graph is locked (not referenced) under the router's
    // lock, which is released before the launch. When entering the stream
    // would wait (a lease, a switch) or the graph is busy (another thread
    // launches it): the reference-holding path below, which never waits
    // while it holds the graph's lock. A hit moves nothing in the LRU lists
    // (see touch_hit).
    touch_hit(entry);
    ++hot_.hits;
    if (GraphSlot& graph = *entry.graph; enters_without_waiting(stream) && graph.try_take_locked()) [[likely]] {
      const detail::RouterGraphHold<held_type> held(graph);
      Submission submission = enter_stream(lock, stream, where);
      lock.unlock();
      launch_held(graph.exec, stream, where);
      submission.issued(stream, where);
      return Route<Key>{planned.shape, RouteKind::replayed};
    }
    launch(lock, entry.graph, stream, where);
    return Route<Key>{planned.shape, RouteKind::replayed};
  }
  return run_miss(lock, planned.shape, stream, where);
}

template <RouterKey Key, GraphBackend Backend>
void ShapeRouter<Key, Backend>::refuse_reentry(const ::std::source_location& where) const {
  if (detail::ActiveRouterScope::inside(this)) [[unlikely]] {
    throw usage_error("ShapeRouter called from inside its own work callable (or failure handler or progress "
                      "callback); that would deadlock. Issue nested work directly on the stream",
                      where);
  }
}

template <RouterKey Key, GraphBackend Backend>
template <class StageIn, class ReadOut>
Route<Key> ShapeRouter<Key, Backend>::run_staged(const Key& key, stream_type stream, StageIn&& stage_in,
                                                 ReadOut&& read_out, ::std::source_location where) {
  detail::check_router_staging<StageIn, ReadOut, Key, Route<Key>, stream_type>();
  // Every refusal comes before stage_in: the key's plan, then the lease
  // (re-entry from the work, a second lease on this thread).
  const Key shape = Plan::plan(options_, key, where).shape;
  const Lease held = lease(stream, where);
  stage_in(key, shape, stream);
  const Route<Key> route = run(key, stream, where);
  read_out(route, stream);
  return route;
}

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
inline void ShapeRouter<Key, Backend>::admit_stream(const stream_type& stream, bool binds,
                                                    const ::std::source_location& where) {
  if (options_.stream_sharing == StreamSharing::lease_required &&
      !(home_stream_.has_value() && *home_stream_ == stream)) [[unlikely]] {
    admit_other_stream(stream, binds, where);
  }
}

template <RouterKey Key, GraphBackend Backend>
void ShapeRouter<Key, Backend>::admit_other_stream(const stream_type& stream, bool binds,
                                                   const ::std::source_location& where) {
  if (lease_owner_ == ::std::this_thread::get_id()) {
    return;  // inside this thread's lease: enter_stream() checks it is the leased stream
  }
  if (!home_stream_.has_value()) {
    if (binds) {
      home_stream_ = stream;
    }
    return;
  }
  throw usage_error(
      detail::concat("ShapeRouter used outside a lease on ", detail::describe_stream(stream),
                     ", but it runs outside leases on ", detail::describe_stream(*home_stream_),
                     " (the first stream that ran it). Its graphs share their input and output buffers, so copies "
                     "into and out of them issued around run() on two streams would mix requests. Hold "
                     "router.lease(stream) around staging the inputs, run() and reading the outputs on every stream, "
                     "or use one router per stream (ShapeRouterOptions::stream_sharing = "
                     "StreamSharing::caller_ordered if you order those copies yourself)"),
      where);
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
      ++entered_;
      return Submission(this, false);  // the lease's end marks
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
        if (!last_stream_.has_value()) [[unlikely]] {
          last_stream_ = stream;
        }
        ++entered_;
        if (!marking_) {
          unmarked_ = true;
        }
        return Submission(this, marking_);
      }
      if constexpr (!OrdersStreams<Backend>) {
        throw usage_error(
            "ShapeRouter::run on a second stream, but the backend cannot order streams (it has no "
            "mark/wait_mark/drain): the graphs share their buffers, so the runs would race. Use one router "
            "per stream",
            where);
      } else {
        // Every submission on the previous stream is issued (and, when
        // marking, marked by its own thread) before this one is ordered
        // after them. The previous stream is never named: it may be gone.
        switching_.store(true);
        try {
          switch_cv_.wait(lock, [&] { return issued_.load() == entered_; });
          if (unmarked_) {
            // Runs on one stream so far recorded nothing: order after all of
            // the device's work, once; from now on every submission marks.
            lock.unlock();
            try {
              backend_.drain(stream, where);
            } catch (...) {
              lock.lock();
              throw;
            }
            lock.lock();
          } else {
            backend_.wait_mark(stream, where);
          }
        } catch (...) {
          switching_.store(false);
          switch_cv_.notify_all();
          throw;
        }
        marking_ = true;
        unmarked_ = false;
        last_stream_ = stream;
        ++stats_.stream_switches;
        ++entered_;
        switching_.store(false);
        switch_cv_.notify_all();
        return Submission(this, true);
      }
    }
    switch_cv_.wait(lock, [&] { return !switching_.load(); });
  }
}

template <RouterKey Key, GraphBackend Backend>
inline void ShapeRouter<Key, Backend>::end_lease() noexcept {
  bool marked = false;
  if constexpr (OrdersStreams<Backend>) {
    try {
      // The leased stream is alive (the lease is on it): the next user on
      // another stream is ordered after everything issued under the lease.
      backend_.mark(*lease_stream_, ::std::source_location::current());
      marked = true;
    } catch (...) {
    }
  }
  {
    const ::std::lock_guard<::std::mutex> lock(mutex_);
    lease_owner_ = ::std::thread::id();
    unmarked_ = !marked;
    issued_.fetch_add(1);
  }
  switch_cv_.notify_all();
}

template <RouterKey Key, GraphBackend Backend>
inline void ShapeRouter<Key, Backend>::leave_stream(bool unmarked) noexcept {
  if (unmarked) [[unlikely]] {
    const ::std::lock_guard<::std::mutex> lock(mutex_);
    unmarked_ = true;
    issued_.fetch_add(1);
    switch_cv_.notify_all();
    return;
  }
  issued_.fetch_add(1);
  if (switching_.load()) [[unlikely]] {
    const ::std::lock_guard<::std::mutex> lock(mutex_);
    switch_cv_.notify_all();
  }
}

// Lock order: a submission is entered before a graph is waited for, and no
// thread waits for a submission, a lease or a switch while it holds a graph
// (the hit path above takes it only when entering cannot wait; re-captures
// and destructors hold it without waiting on the router). A switch or a lease, which waits for every entered submission to
// be issued, therefore never waits on a thread that waits for it.
template <RouterKey Key, GraphBackend Backend>
inline void ShapeRouter<Key, Backend>::launch(::std::unique_lock<::std::mutex>& lock, GraphRef graph,
                                              stream_type stream, const ::std::source_location& where) {
  release_retired(lock);
  Submission submission = enter_stream(lock, stream, where);
  graph->take(lock);  // kept alive by `graph` meanwhile
  lock.unlock();
  const detail::RouterGraphHold<held_type> held(*graph);
  launch_held(graph->exec, stream, where);
  submission.issued(stream, where);
}

template <RouterKey Key, GraphBackend Backend>
inline void ShapeRouter<Key, Backend>::launch_held(held_type& held, stream_type stream,
                                                   const ::std::source_location& where) {
  if constexpr (CapturesPiecewise<Backend>) {
    if (const exec_type* const whole = ::std::get_if<exec_type>(&held)) [[likely]] {
      backend_.launch(*whole, stream, where);
    } else {
      backend_.launch_piecewise(::std::get<pieces_type>(held), stream, where);
    }
  } else {
    backend_.launch(held, stream, where);
  }
}

template <RouterKey Key, GraphBackend Backend>
inline bool ShapeRouter<Key, Backend>::enters_without_waiting(const stream_type& stream) const noexcept {
  if (lease_owner_ != ::std::thread::id()) {
    return lease_owner_ == ::std::this_thread::get_id() && lease_stream_ == stream;
  }
  return !switching_.load() && (!last_stream_.has_value() || *last_stream_ == stream);
}

template <RouterKey Key, GraphBackend Backend>
inline void ShapeRouter<Key, Backend>::issue_eager(::std::unique_lock<::std::mutex>& lock, const Key& shape,
                                                   stream_type stream, const ::std::source_location& where) {
  release_retired(lock);
  Submission submission = enter_stream(lock, stream, where);
  lock.unlock();
  {
    const detail::ActiveRouterScope active(this);
    const detail::RegionsInline regions_in_place;  // a work that declares breaks runs them in place
    work_(shape, stream);
  }
  submission.issued(stream, where);
}

template <RouterKey Key, GraphBackend Backend>
inline void ShapeRouter<Key, Backend>::release_retired(::std::unique_lock<::std::mutex>& lock) noexcept {
  if (retired_.empty() && !evicted_memory_) [[likely]] {
    return;
  }
  ::std::vector<GraphRef> retired;
  retired.swap(retired_);
  const bool trim_memory = ::std::exchange(evicted_memory_, false);
  lock.unlock();
  retired.clear();  // each waits for a launch of it in progress, then is destroyed
  if (trim_memory) {
    trim();
  }
  lock.lock();
}

}  // namespace replay
