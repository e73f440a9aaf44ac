#pragma once
#include <replay/detail/require_cxx20.hpp>
// ShapeRouter's internal records: the per-key entry, its graph slot, a capture attempt, the re-entry guard.
#include <atomic>
#include <chrono>
#include <exception>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <variant>
#include <vector>

#include "replay/detail/reentry_guard.hpp"
#include "replay/shape_router/backend.hpp"
#include "replay/shape_router/stats.hpp"

namespace replay::detail {

// The router this thread is inside (its work callable or failure handler),
// to refuse re-entry: a nested run on another stream would wait for the
// outer one to finish. One slot for routers of every type.
struct ShapeRouterKind {};
using ActiveRouterScope = ReentryGuard<ShapeRouterKind>;

enum class RouterEntryState : ::std::uint8_t {
  warming,     // seen fewer than warmup_runs times
  ready,       // warm, no graph (new, evicted, or an interrupted capture cooling down): the next run captures
  capturing,   // one thread captures (or re-captures) it now, outside the lock
  captured,    // graph live
  stale,       // graph live but invalidated: the next run re-captures
  eager_only,  // a capture failed on its own work: always eager
};

// What a router keeps per key: the backend's executable graph, or, for a
// backend that captures piecewise, either that or its piecewise executable.
struct RouterNoPieces {};
template <class Backend>
struct RouterExecs {
  using pieces = RouterNoPieces;
  using held = typename Backend::exec_type;
};
template <class Backend>
  requires CapturesPiecewise<Backend>
struct RouterExecs<Backend> {
  using pieces = typename Backend::piecewise_type;
  using held = ::std::variant<typename Backend::exec_type, pieces>;
};

// A live graph. Its own launches, its re-capture and its destruction are
// serialized by `held`: a hit takes it under the router's lock and launches
// after releasing that lock, holding no reference; the destructor waits for
// such a launch to end, so an eviction never frees a graph under a launch.
// `held` is taken only under the router's lock (which orders the takers) and
// released with a plain store: a hit pays no read-modify-write for it, where
// a mutex costs two. Whoever finds it held waits by polling (wait_released),
// which only contention on one graph (its own launches from several threads,
// a re-capture, a destruction) ever does.
template <class Exec>
struct RouterGraphSlot {
  explicit RouterGraphSlot(Exec&& e) : exec(::std::move(e)) {}
  RouterGraphSlot(const RouterGraphSlot&) = delete;
  RouterGraphSlot& operator=(const RouterGraphSlot&) = delete;
  ~RouterGraphSlot() { wait_released(); }

  // Under the router's lock: takes the graph, or false when another thread holds it.
  bool try_take_locked() noexcept {
    if (held.load(::std::memory_order_acquire)) {
      return false;
    }
    held.store(true, ::std::memory_order_relaxed);
    return true;
  }
  // Takes the graph, waiting with `router_lock` (held on entry and on return) released meanwhile.
  void take(::std::unique_lock<::std::mutex>& router_lock) {
    while (!try_take_locked()) {
      router_lock.unlock();
      wait_released();
      router_lock.lock();
    }
  }
  void release() noexcept { held.store(false, ::std::memory_order_release); }
  // Polls (yielding at first, then sleeping 20 us at a time) until no thread holds it.
  void wait_released() const noexcept {
    for (unsigned round = 0; held.load(::std::memory_order_acquire); ++round) {
      if (round < 256) {
        ::std::this_thread::yield();
      } else {
        ::std::this_thread::sleep_for(::std::chrono::microseconds(20));
      }
    }
  }

  Exec exec;
  ::std::atomic<bool> held{false};
};

// Releases a taken graph when it goes out of scope.
template <class Exec>
class RouterGraphHold {
 public:
  explicit RouterGraphHold(RouterGraphSlot<Exec>& graph) noexcept : graph_(graph) {}
  RouterGraphHold(const RouterGraphHold&) = delete;
  RouterGraphHold& operator=(const RouterGraphHold&) = delete;
  ~RouterGraphHold() { graph_.release(); }

 private:
  RouterGraphSlot<Exec>& graph_;
};

// One key of the router's table.
template <class Key, class Exec>
struct RouterEntry {
  explicit RouterEntry(const Key& k) : shape(k) {}
  // What a hit reads and writes first.
  RouterEntryState state = RouterEntryState::ready;
  bool recent = false;  // hit since it was last moved in the router's lru_ (a second chance there)
  ::std::shared_ptr<RouterGraphSlot<Exec>> graph;
  ::std::uint64_t replays = 0;
  ::std::uint64_t last_used = 0;  // the router's use stamp: recency of the key and its graph
  Key shape;
  GraphMemory memory;
  ::std::uint32_t warmups = 0;
  ::std::uint32_t interrupted_rounds = 0;  // consecutive capture rounds interrupted from outside
  ::std::chrono::steady_clock::time_point retry_at{};
  bool detached = false;                // forgotten (clear, max_entries) while a capture was in flight
  bool invalidated_in_capture = false;  // invalidate() while capturing: stale as soon as it is in
  bool piecewise = false;               // its graph is piecewise (segments and regions)
  ::std::size_t segments = 0;           // piecewise: segments of the path captured first
  ::std::vector<::std::string> regions;  // piecewise: that path's regions
  ::std::string reason;                 // eager_only: why its capture failed
  typename ::std::list<RouterEntry*>::iterator lru;        // in lru_
  typename ::std::list<RouterEntry*>::iterator graph_lru;  // in graph_lru_ while `graph`
};

// `breaks`: the whole capture met a declared break (region_in_capture_error).
enum class RouterCaptureOutcome : ::std::uint8_t { captured, interrupted, failed, breaks };

// What one capture (with its retries) came to.
template <class Exec, class Pieces>
struct RouterCaptureAttempt {
  RouterCaptureOutcome outcome = RouterCaptureOutcome::failed;
  ::std::optional<CapturedGraph<Exec>> fresh;  // a new capture
  ::std::optional<CapturedPieces<Pieces>> pieces;  // a new piecewise capture (it ran the work)
  bool ran = false;                                // the work ran on the caller's stream (piecewise)
  ::std::exception_ptr partial;                    // a piecewise capture that failed after running part of it
  RecaptureResult updated{};                   // a re-capture of the entry's graph
  ::std::string reason;
  ::std::uint32_t interruptions = 0;
  ::std::uint32_t retries = 0;
};

}  // namespace replay::detail
