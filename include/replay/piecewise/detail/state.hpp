#pragma once
// A piecewise executable's state: the work (kept for captures after a miss),
// the segment tree, the stats, and what serializes launches across threads
// and orders them across streams.
#include <replay/detail/require_cxx20.hpp>

#include <cuda_runtime_api.h>

#include <atomic>
#include <mutex>
#include <optional>
#include <source_location>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "replay/detail/capture_state.hpp"
#include "replay/detail/message.hpp"
#include "replay/error.hpp"
#include "replay/event.hpp"
#include "replay/piecewise/detail/capture.hpp"
#include "replay/piecewise/detail/segment_tree.hpp"
#include "replay/piecewise/detail/session.hpp"
#include "replay/piecewise/options.hpp"
#include "replay/stream_ref.hpp"

namespace replay::detail {

// Refuses a capture or launch where its regions could not run as regions.
inline void refuse_piecewise_here(const char* what, const ::std::source_location& where) {
  const PiecewiseThreadState& state = piecewise_thread_state();
  if (state.regions_running > 0) {
    throw usage_error(concat(what, " inside a region; a region runs eagerly: issue its work directly"), where);
  }
  if (state.capture != nullptr) {
    throw usage_error(concat(what, " inside a piecewise capture's work; piecewise captures do not nest"), where);
  }
  if (open_capture_scopes() > 0) {
    throw usage_error(concat(what,
                             " inside a stream capture: its regions run on the host at each launch, which a graph "
                             "cannot hold; call it outside the capture"),
                      where);
  }
}

class PiecewiseState {
  // Marks this thread as the one holding the state's mutex while it lives.
  class Owned {
   public:
    explicit Owned(::std::atomic<::std::thread::id>& owner) noexcept : owner_(owner) {
      owner_.store(::std::this_thread::get_id(), ::std::memory_order_relaxed);
    }
    Owned(const Owned&) = delete;
    Owned& operator=(const Owned&) = delete;
    ~Owned() { owner_.store(::std::thread::id(), ::std::memory_order_relaxed); }

   private:
    ::std::atomic<::std::thread::id>& owner_;
  };

 public:
  PiecewiseState(PiecewiseCallable work, const PiecewiseOptions& options, const ::std::source_location& where)
      : work_(::std::move(work)), options_(options), done_(EventFlags::disable_timing, where) {}

  // The first capture: runs the work once, live, on `stream`.
  void capture(StreamRef stream, const ::std::source_location& where) {
    const ::std::lock_guard lock(mutex_);
    PiecewiseCapture capture(stream, options_.mode, {}, {}, stats_);
    PiecewiseNode* leaf = tree_.attach(nullptr, {}, capture.run(work_, where));
    ++stats_.captures;
    admit(leaf, where);
    finish_launch(leaf, stream, where);
  }

  void launch(StreamRef stream, const ::std::source_location& where) {
    refuse_piecewise_here("PiecewiseExec::launch()", where);
    if (stream.capture_status(where) != CaptureStatus::none) {
      // A capture replay does not know of (raw, or another library's): its
      // regions would run once, now, and the graph would replay without them.
      throw usage_error(concat("PiecewiseExec::launch() on ", describe_piecewise_stream(stream),
                               ", which is capturing: its regions run on the host at each launch, which a graph "
                               "cannot hold; launch it outside the capture"),
                        where);
    }
    if (owner_.load(::std::memory_order_relaxed) == ::std::this_thread::get_id()) {
      // Inside this thread's lease (a launch inside its own launch is a region's, refused above).
      if (!(*lease_stream_ == stream)) {
        throw usage_error(concat("PiecewiseExec::launch() on ", describe_piecewise_stream(stream),
                                 " inside this thread's lease on ", describe_piecewise_stream(*lease_stream_),
                                 "; launch on the leased stream, or end the lease first"),
                          where);
      }
      launch_locked(stream, where);
      return;
    }
    const ::std::lock_guard lock(mutex_);
    const Owned owned(owner_);
    enter(stream, where);
    try {
      launch_locked(stream, where);
    } catch (...) {
      leave(stream);
      throw;
    }
    done_.record(stream, where);
    last_stream_ = stream;
  }

  void begin_lease(StreamRef stream, const ::std::source_location& where) {
    refuse_piecewise_here("PiecewiseExec::lease()", where);
    if (owner_.load(::std::memory_order_relaxed) == ::std::this_thread::get_id()) {
      throw usage_error("PiecewiseExec::lease(): this thread already holds a lease of this executable", where);
    }
    mutex_.lock();
    try {
      enter(stream, where);
    } catch (...) {
      mutex_.unlock();
      throw;
    }
    lease_stream_ = stream;
    owner_.store(::std::this_thread::get_id(), ::std::memory_order_relaxed);
  }
  void end_lease() noexcept {
    leave(*lease_stream_);
    owner_.store(::std::thread::id(), ::std::memory_order_relaxed);
    lease_stream_.reset();
    mutex_.unlock();
  }

  // For inspection: a lock on the state (none where this thread holds it
  // already: inside its lease, or in a region of its launch).
  ::std::unique_lock<::std::mutex> inspect() const {
    if (owner_.load(::std::memory_order_relaxed) == ::std::this_thread::get_id()) {
      return {};
    }
    return ::std::unique_lock(mutex_);
  }
  const PiecewiseTree& tree() const noexcept { return tree_; }
  const PiecewiseNode* last_leaf() const noexcept { return last_leaf_; }
  const PiecewiseOptions& options() const noexcept { return options_; }
  PiecewiseStats stats() const noexcept {
    PiecewiseStats out = stats_;
    out.paths = tree_.paths();
    out.segments = tree_.segments();
    out.nodes = tree_.cost().nodes;
    out.alloc_bytes = tree_.cost().alloc_bytes;
    return out;
  }

 private:
  // Orders `stream` after the work of the previous launch on another stream:
  // the segments share their buffers.
  void enter(StreamRef stream, const ::std::source_location& where) {
    if (last_stream_ && !(*last_stream_ == stream)) {
      done_.wait_on(stream, where);
    }
  }
  // The same as done_.record(), for paths that must not throw: an exception
  // leaving, a lease ending.
  void leave(StreamRef stream) noexcept {
    const ::cudaError_t status = ::cudaEventRecord(done_.get(), stream.get());
    if (status == ::cudaSuccess) {
      last_stream_ = stream;
    } else {
      clear_error_slot(status);
      last_stream_.reset();  // nothing to order after: the next stream waits for nothing recorded
    }
  }

  void launch_locked(StreamRef stream, const ::std::source_location& where) {
    values_.clear();
    path_.clear();
    PiecewiseNode* node = tree_.root();
    for (;;) {
      path_.push_back(node);
      const PiecewiseSegment& segment = node->segment;
      if (segment.exec) {
        segment.exec->launch(stream, where);
        ++stats_.segment_launches;
      }
      if (!segment.has_region) {
        break;
      }
      run_region(segment, stream, values_.emplace_back(), where);
      ++stats_.region_runs;
      PiecewiseNode* next = PiecewiseTree::child(*node, values_.back());
      if (next == nullptr) {
        node = capture_after_miss(*node, stream, where);
        break;
      }
      node = next;
    }
    tree_.touch(node);
    last_leaf_ = node;
    ++stats_.launches;
  }

  // The region before `node`'s children returned a value never seen there:
  // captures the rest of the path live, after the regions this launch ran.
  PiecewiseNode* capture_after_miss(PiecewiseNode& node, StreamRef stream, const ::std::source_location& where) {
    ++stats_.misses;
    last_leaf_ = nullptr;
    PiecewiseCapture capture(stream, options_.mode, values_, path_, stats_);
    auto chain = capture.run(work_, where);
    PiecewiseNode* leaf = tree_.attach(&node, values_.back(), ::std::move(chain));
    ++stats_.captures;
    admit(leaf, where);
    return leaf;
  }

  void admit(PiecewiseNode* leaf, const ::std::source_location& where) {
    const auto admission = tree_.admit(leaf, options_);
    stats_.evictions += admission.evicted;
    if (admission.exceeded != nullptr) {
      ++stats_.refusals;
      throw usage_error(concat("the path just captured alone exceeds PiecewiseOptions::", admission.exceeded,
                               "; it ran once and was not kept (the work it issued is on the stream): raise the "
                               "bound, or break the work where fewer paths or smaller segments follow"),
                        where);
    }
  }

  void finish_launch(PiecewiseNode* leaf, StreamRef stream, const ::std::source_location& where) {
    tree_.touch(leaf);
    last_leaf_ = leaf;
    done_.record(stream, where);
    last_stream_ = stream;
  }

  PiecewiseCallable work_;
  PiecewiseOptions options_;
  PiecewiseTree tree_;
  PiecewiseStats stats_;
  mutable ::std::mutex mutex_;
  // The thread holding mutex_ for a launch or a lease, and the leased stream (a lease only).
  ::std::atomic<::std::thread::id> owner_{};
  ::std::optional<StreamRef> lease_stream_;
  Event done_;                               // recorded after the latest launch or lease
  ::std::optional<StreamRef> last_stream_;   // the stream done_ was recorded on
  ::std::vector<::std::string> values_;      // this launch's region values
  ::std::vector<PiecewiseNode*> path_;       // this launch's nodes
  PiecewiseNode* last_leaf_ = nullptr;
};

}  // namespace replay::detail
