#pragma once
// ShapeRouter: one graph per key (or per bucket of keys), chosen at run time,
// over a GraphBackend. See replay/shape_router.hpp for an overview.
#include <replay/detail/require_cxx20.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <functional>
#include <initializer_list>
#include <limits>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <source_location>
#include <span>
#include <thread>
#include <string>
#include <utility>
#include <vector>

#include "replay/detail/message.hpp"
#include "replay/detail/reentry_guard.hpp"
#include "replay/detail/shape_plan.hpp"
#include "replay/detail/shape_router_keys.hpp"
#include "replay/detail/signature_checks.hpp"
#include "replay/error.hpp"
#include "replay/shape_router/backend.hpp"
#include "replay/shape_router/cuda_backend.hpp"
#include "replay/shape_router/keys.hpp"
#include "replay/shape_router/options.hpp"
#include "replay/shape_router/stats.hpp"

namespace replay {

namespace detail {

// The router this thread is inside (its work callable or failure handler),
// to refuse re-entry: a nested run on another stream would wait for the
// outer one to finish. One slot for routers of every type.
struct ShapeRouterKind {};
using ActiveRouterScope = ReentryGuard<ShapeRouterKind>;

}  // namespace detail

// ---------------------------------------------------------------------------
// ShapeRouter
// ---------------------------------------------------------------------------

// Threading: every member function may be called from any thread. An
// internal mutex guards the key table for lookups and bookkeeping only: it is
// not held across launches, warm-ups, eager runs or captures, so a key being
// captured (its own state, "capturing") never stalls hits on other keys;
// runs of that key meanwhile issue the work eagerly (RouteKind::eager_busy).
// A graph is kept alive by reference while it is launched, so an eviction
// never frees a graph under a launch.
//
// Streams: the graphs of one router share the buffers they were captured
// with. A run on a stream other than the previous run's waits, on the device,
// for the work the router issued on that stream (backend order_after); a
// backend that cannot order streams makes such a run throw usage_error. The
// router orders only what it issues: copies into or out of the shared buffers
// that the caller issues around run() are the caller's to order (one router
// per stream, or a GraphedCallable, which orders whole calls).
template <RouterKey Key, GraphBackend Backend = CudaGraphBackend>
class ShapeRouter {
 public:
  using key_type = Key;
  using backend_type = Backend;
  using stream_type = typename Backend::stream_type;
  using exec_type = typename Backend::exec_type;
  using options_type = ShapeRouterOptions<Key>;
  using progress_type = CaptureProgress<Key>;
  // Issues the work of one shape on a stream. Called eagerly (warm-ups,
  // fallbacks) and under capture (on the stream the backend captures on);
  // the shape is the padded one. Called from several threads at once when
  // the router is.
  using work_type = ::std::function<void(const Key& shape, stream_type stream)>;

  // Validates `options`: usage_error for an empty, unsorted or duplicated
  // bucket list, a bucket that is not positive or does not fit the key type,
  // buckets with the exact policy, bucketing a key that is not a ShapeKey, or
  // a zero max_graphs / max_bytes / max_entries / capture_attempts.
  explicit ShapeRouter(work_type work, options_type options = {}, Backend backend = Backend{},
                       ::std::source_location where = ::std::source_location::current())
      : work_(::std::move(work)),
        options_(::std::move(options)),
        backend_(::std::move(backend)),
        on_capture_failure_(
            ::std::make_shared<const CaptureFailureHandler<Key>>(::std::exchange(options_.on_capture_failure, {}))) {
    if (!work_) {
      throw usage_error("ShapeRouter: the work callable is empty", where);
    }
    Plan::validate(options_, where);
  }
  // Any other callable: refused with a message that names the expected signature.
  template <class Work>
    requires(!::std::convertible_to<Work, work_type> && !::std::same_as<::std::remove_cvref_t<Work>, ShapeRouter>)
  explicit ShapeRouter(Work&&, options_type options = {}, Backend backend = Backend{},
                       ::std::source_location where = ::std::source_location::current())
      : ShapeRouter(work_type{}, ::std::move(options), ::std::move(backend), where) {
    detail::check_router_work<Work, Key, stream_type>();
  }

  ShapeRouter(const ShapeRouter&) = delete;
  ShapeRouter& operator=(const ShapeRouter&) = delete;
  ShapeRouter(ShapeRouter&&) = delete;  // holds a mutex; keep it in a unique_ptr to move it
  ShapeRouter& operator=(ShapeRouter&&) = delete;
  ~ShapeRouter() = default;

  // The shape the work will run with for `key`: each dimension rounded up to
  // its bucket (bucketed), or `key` itself (exact, or oversize with
  // OversizePolicy::run_eager). usage_error for a zero or negative dimension,
  // or an oversize key under OversizePolicy::throw_error. Lock-free.
  Key padded_shape(const Key& key, ::std::source_location where = ::std::source_location::current()) const {
    return Plan::plan(options_, key, where).shape;
  }

  // True when `key` is above the largest bucket in some dimension.
  bool is_oversize(const Key& key, ::std::source_location where = ::std::source_location::current()) const {
    Plan::check_extents(key, where);
    return options_.policy == RoutingPolicy::bucketed && Plan::oversize_dimension(options_, key) != Plan::no_dimension;
  }

  // Issues the work for `key` on `stream`: launches the padded shape's graph
  // (a hit), or warms up, captures, re-captures or runs eagerly (a miss).
  // Capture failures never escape: an interrupted capture is retried
  // (capture_attempts) and otherwise tried again later; a capture that fails
  // on its own work marks the key eager and the handler is told once. This
  // and later runs then issue the work eagerly. Exceptions from the work
  // itself when run eagerly, and launch errors, do propagate.
  Route<Key> run(const Key& key, stream_type stream,
                 ::std::source_location where = ::std::source_location::current()) {
    refuse_reentry(where);
    const Planned planned = Plan::plan(options_, key, where);
    ::std::unique_lock<::std::mutex> lock(mutex_);
    ++stats_.runs;
    stats_.real_elements += detail::element_count(key);
    stats_.padded_elements += detail::element_count(planned.shape);
    if (planned.oversize) [[unlikely]] {
      ++stats_.misses;
      ++stats_.oversize;
      issue_eager(lock, planned.shape, stream, where);
      return Route<Key>{planned.shape, RouteKind::eager_oversize};
    }
    if (const auto it = entries_.find(planned.shape); it != entries_.end() && it->second->state == State::captured)
        [[likely]] {
      Entry& entry = *it->second;
      touch(entry);
      ++entry.replays;
      ++stats_.hits;
      launch(lock, entry.graph, stream, where);
      return Route<Key>{planned.shape, RouteKind::replayed};
    }
    return run_miss(lock, planned.shape, stream, where);
  }

  // Exclusive use of the router's shared buffers on `stream` for as long as
  // the returned object lives: waits until no other thread holds a lease and
  // every submission on another stream has been issued, then orders `stream`
  // after them on the device. Other threads' runs and leases wait until it is
  // released. Stage inputs, run() (from this thread, on this stream) and
  // issue the reads of the outputs while holding it; the next user of the
  // buffers on another stream is then ordered after all of that. usage_error
  // for a second lease on the same thread, or a run on another stream inside it.
  class Lease {
   public:
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    ~Lease() { router_->end_lease(); }

   private:
    friend class ShapeRouter;
    explicit Lease(ShapeRouter* router) noexcept : router_(router) {}
    ShapeRouter* router_;
  };
  [[nodiscard]] Lease lease(stream_type stream, ::std::source_location where = ::std::source_location::current()) {
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

  // Bucketed: captures a graph for every bucket shape (the cartesian product
  // of the bucket lists), largest first, after the configured warm-ups.
  // Returns how many bucket shapes have a graph afterwards (at most
  // max_graphs; it stops at max_bytes). Failed shapes are marked eager and
  // reported through the handler; nothing about a failed capture is thrown.
  // `progress`, when given, is told after each shape (done, total, shape).
  ::std::size_t capture_all(stream_type stream, ::std::source_location where = ::std::source_location::current()) {
    return capture_all(stream, progress_type{}, where);
  }
  ::std::size_t capture_all(stream_type stream, const progress_type& progress,
                            ::std::source_location where = ::std::source_location::current()) {
    if (options_.policy != RoutingPolicy::bucketed) {
      throw usage_error("ShapeRouter::capture_all(stream) needs RoutingPolicy::bucketed; with the exact "
                        "policy pass the keys: capture(keys, stream)",
                        where);
    }
    const ::std::vector<Key> shapes = bucket_shapes();
    return capture(::std::span<const Key>(shapes), stream, progress, where);
  }

  // Captures graphs for `keys` (padded, deduplicated), largest first. Oversize
  // keys are skipped (they never run as graphs). Returns how many of the
  // distinct padded keys have a graph afterwards. An interrupted capture is
  // retried up to capture_attempts times here, then left for a later run.
  ::std::size_t capture(::std::span<const Key> keys, stream_type stream,
                        ::std::source_location where = ::std::source_location::current()) {
    return capture(keys, stream, progress_type{}, where);
  }
  ::std::size_t capture(::std::span<const Key> keys, stream_type stream, const progress_type& progress,
                        ::std::source_location where = ::std::source_location::current()) {
    refuse_reentry(where);
    ::std::vector<Key> shapes;
    shapes.reserve(keys.size());
    for (const Key& key : keys) {
      const Planned planned = Plan::plan(options_, key, where);
      if (!planned.oversize && ::std::find(shapes.begin(), shapes.end(), planned.shape) == shapes.end()) {
        shapes.push_back(planned.shape);
      }
    }
    Plan::sort_largest_first(shapes);
    ::std::atomic<::std::size_t> next{0};
    ::std::atomic<::std::size_t> with_graph{0};
    ::std::size_t done = 0;
    ::std::mutex progress_mutex;  // one progress call at a time, `done` in order
    ::std::exception_ptr first_error;
    auto capture_shapes = [&] {
      for (::std::size_t i = next++; i < shapes.size(); i = next++) {
        try {
          with_graph += capture_one(shapes[i], stream, where) ? 1 : 0;
          const ::std::lock_guard<::std::mutex> lock(progress_mutex);
          ++done;
          if (progress) {
            const detail::ActiveRouterScope active(this);
            progress(done, shapes.size(), shapes[i]);
          }
        } catch (...) {
          const ::std::lock_guard<::std::mutex> lock(progress_mutex);
          if (first_error == nullptr) {
            first_error = ::std::current_exception();
          }
          next = shapes.size();  // the others stop after their current shape
        }
      }
    };
    const ::std::size_t helpers =
        ::std::min<::std::size_t>(options_.capture_threads, shapes.size() == 0 ? 1 : shapes.size()) - 1;
    ::std::vector<::std::thread> threads;
    threads.reserve(helpers);
    try {
      for (::std::size_t t = 0; t < helpers; ++t) {
        threads.emplace_back(capture_shapes);
      }
    } catch (...) {  // fewer threads than asked: the rest still runs
    }
    capture_shapes();
    for (::std::thread& thread : threads) {
      thread.join();
    }
    if (first_error != nullptr) {
      ::std::rethrow_exception(first_error);
    }
    return with_graph.load();
  }
  ::std::size_t capture(::std::initializer_list<Key> keys, stream_type stream,
                        ::std::source_location where = ::std::source_location::current()) {
    return capture(::std::span<const Key>(keys.begin(), keys.size()), stream, progress_type{}, where);
  }

  // Marks the graph of `key`'s padded shape stale (e.g. the buffers it was
  // captured with moved): its next run re-captures it and updates the
  // executable graph in place where CUDA allows. A key marked eager after a
  // failed capture gets another chance. A key being captured right now is
  // marked stale as soon as that capture ends. Returns false when the key
  // has neither a graph nor an eager mark nor a capture in flight.
  bool invalidate(const Key& key, ::std::source_location where = ::std::source_location::current()) {
    refuse_reentry(where);
    const Planned planned = Plan::plan(options_, key, where);
    ::std::lock_guard<::std::mutex> lock(mutex_);
    const auto it = entries_.find(planned.shape);
    return it != entries_.end() && invalidate_entry(*it->second);
  }
  // invalidate() for every key.
  void invalidate_all(::std::source_location where = ::std::source_location::current()) {
    refuse_reentry(where);
    ::std::lock_guard<::std::mutex> lock(mutex_);
    for (auto& [shape, entry] : entries_) {
      (void)invalidate_entry(*entry);
    }
  }

  // Drops the graph of `key`'s padded shape now (counted as an eviction).
  // False when it has none, or is being re-captured right now.
  bool evict(const Key& key, ::std::source_location where = ::std::source_location::current()) {
    refuse_reentry(where);
    const Planned planned = Plan::plan(options_, key, where);
    {
      ::std::lock_guard<::std::mutex> lock(mutex_);
      const auto it = entries_.find(planned.shape);
      if (it == entries_.end() || !it->second->graph || it->second->state == State::capturing) {
        return false;
      }
      drop_graph(*it->second, State::ready);
      ++stats_.evictions;
    }
    trim();
    return true;
  }

  // Drops every graph and forgets every key (warm-up counts, eager marks).
  // Captures in flight finish, launch once for their own run, and are then
  // dropped. Statistics are kept.
  void clear(::std::source_location where = ::std::source_location::current()) {
    refuse_reentry(where);
    {
      ::std::lock_guard<::std::mutex> lock(mutex_);
      for (auto& [shape, entry] : entries_) {
        entry->detached = true;
      }
      entries_.clear();
      lru_.clear();
      graph_lru_.clear();
      live_graphs_ = 0;
      total_bytes_ = 0;
    }
    trim();
  }

  // True when `key`'s padded shape has a graph (possibly stale).
  bool contains(const Key& key, ::std::source_location where = ::std::source_location::current()) const {
    refuse_reentry(where);
    const Planned planned = Plan::plan(options_, key, where);
    ::std::lock_guard<::std::mutex> lock(mutex_);
    const auto it = entries_.find(planned.shape);
    return it != entries_.end() && it->second->graph != nullptr;
  }
  // True when `key`'s padded shape is marked eager after a failed capture.
  bool is_eager(const Key& key, ::std::source_location where = ::std::source_location::current()) const {
    refuse_reentry(where);
    const Planned planned = Plan::plan(options_, key, where);
    ::std::lock_guard<::std::mutex> lock(mutex_);
    const auto it = entries_.find(planned.shape);
    return it != entries_.end() && it->second->state == State::eager_only;
  }

  ::std::size_t graph_count() const {
    refuse_reentry();
    ::std::lock_guard<::std::mutex> lock(mutex_);
    return live_graphs_;
  }
  // Keys the router holds state for (at most max_entries).
  ::std::size_t entry_count() const {
    refuse_reentry();
    ::std::lock_guard<::std::mutex> lock(mutex_);
    return entries_.size();
  }

  // The live graphs, most recently used first.
  ::std::vector<GraphInfo<Key>> graphs() const {
    refuse_reentry();
    ::std::vector<GraphInfo<Key>> out;
    ::std::lock_guard<::std::mutex> lock(mutex_);
    out.reserve(graph_lru_.size());
    for (const Entry* entry : graph_lru_) {
      out.push_back(GraphInfo<Key>{entry->shape, entry->memory, entry->replays, entry->state == State::stale});
    }
    return out;
  }

  // Memory of the live graphs, and the device's graph pool where the backend reports it.
  RouterMemory memory(::std::source_location where = ::std::source_location::current()) const {
    refuse_reentry(where);
    RouterMemory out;
    {
      ::std::lock_guard<::std::mutex> lock(mutex_);
      for (const Entry* entry : graph_lru_) {
        ++out.graphs;
        out.alloc_bytes_sum += entry->memory.alloc_bytes;
        out.alloc_bytes_max = ::std::max(out.alloc_bytes_max, entry->memory.alloc_bytes);
        out.footprint_bytes += entry->memory.footprint_bytes;
      }
    }
    if constexpr (ReportsPoolMemory<Backend>) {
      out.pool = backend_.pool_memory(where);
    }
    return out;
  }

  RouterStats stats() const {
    refuse_reentry();
    ::std::lock_guard<::std::mutex> lock(mutex_);
    return stats_;
  }
  void reset_stats() {
    refuse_reentry();
    ::std::lock_guard<::std::mutex> lock(mutex_);
    stats_ = RouterStats{};
  }

  // Replaces the capture-failure handler (empty: one line on stderr).
  void set_capture_failure_handler(CaptureFailureHandler<Key> handler,
                                   ::std::source_location where = ::std::source_location::current()) {
    refuse_reentry(where);
    ::std::lock_guard<::std::mutex> lock(mutex_);
    on_capture_failure_ = ::std::make_shared<const CaptureFailureHandler<Key>>(::std::move(handler));
  }

  // The options given at construction, without on_capture_failure: the router
  // holds the handler (set_capture_failure_handler() replaces it).
  const options_type& options() const noexcept { return options_; }
  RoutingPolicy policy() const noexcept { return options_.policy; }
  // Bucket list of dimension `dim` (bucketed); empty with the exact policy.
  ::std::span<const ::std::int64_t> buckets(::std::size_t dim = 0) const noexcept {
    return Plan::buckets(options_, dim);
  }
  // Bucketed: every bucket shape (cartesian product of the lists), largest first.
  ::std::vector<Key> bucket_shapes() const { return Plan::bucket_shapes(options_); }

  // The backend (e.g. to read its settings). Not synchronized: do not change
  // it while another thread uses the router.
  Backend& backend() noexcept { return backend_; }
  const Backend& backend() const noexcept { return backend_; }

 private:
  using Plan = detail::ShapePlan<Key>;
  using Planned = typename Plan::Planned;
  using Clock = ::std::chrono::steady_clock;
  // Rounds of capture_attempts, all interrupted, after which a key is marked eager.
  static constexpr ::std::uint32_t max_interrupted_rounds = 8;

  enum class State : ::std::uint8_t {
    warming,     // seen fewer than warmup_runs times
    ready,       // warm, no graph (new, evicted, or an interrupted capture cooling down): the next run captures
    capturing,   // one thread captures (or re-captures) it now, outside the lock
    captured,    // graph live
    stale,       // graph live but invalidated: the next run re-captures
    eager_only,  // a capture failed on its own work: always eager
  };
  // A live graph: shared with launches in flight, so that an eviction never
  // frees it under them. Its own launches and its re-capture are serialized.
  struct GraphSlot {
    explicit GraphSlot(exec_type&& e) : exec(::std::move(e)) {}
    exec_type exec;
    ::std::mutex mutex;
  };
  using GraphRef = ::std::shared_ptr<GraphSlot>;
  struct Entry {
    explicit Entry(const Key& k) : shape(k) {}
    Key shape;
    GraphRef graph;
    GraphMemory memory;
    ::std::uint64_t replays = 0;
    ::std::uint32_t warmups = 0;
    ::std::uint32_t interrupted_rounds = 0;  // consecutive capture rounds interrupted from outside
    Clock::time_point retry_at{};
    State state = State::ready;
    bool detached = false;                // forgotten (clear, max_entries) while a capture was in flight
    bool invalidated_in_capture = false;  // invalidate() while capturing: stale as soon as it is in
    typename ::std::list<Entry*>::iterator lru;        // in lru_
    typename ::std::list<Entry*>::iterator graph_lru;  // in graph_lru_ while `graph`
  };
  using EntryRef = ::std::shared_ptr<Entry>;
  using Handler = ::std::shared_ptr<const CaptureFailureHandler<Key>>;

  enum class Outcome : ::std::uint8_t { captured, interrupted, failed };
  struct Attempt {
    Outcome outcome = Outcome::failed;
    ::std::optional<CapturedGraph<exec_type>> fresh;  // a new capture
    RecaptureResult updated{};                         // a re-capture of the entry's graph
    ::std::string reason;
    ::std::uint32_t interruptions = 0;
    ::std::uint32_t retries = 0;
  };

  // Ends a submission (see enter_stream) when it goes out of scope.
  class Submission {
   public:
    explicit Submission(ShapeRouter* router) noexcept : router_(router) {}
    Submission(const Submission&) = delete;
    Submission& operator=(const Submission&) = delete;
    ~Submission() {
      if (router_ != nullptr) {
        router_->leave_stream();
      }
    }
    // Kept open past this object (a Lease ends it).
    void keep() noexcept { router_ = nullptr; }

   private:
    ShapeRouter* router_;
  };

  // Queries without a caller's location report the router's own.
  void refuse_reentry(const ::std::source_location& where = ::std::source_location::current()) const {
    if (detail::ActiveRouterScope::inside(this)) [[unlikely]] {
      throw usage_error("ShapeRouter called from inside its own work callable (or failure handler or progress "
                        "callback); that would deadlock. Issue nested work directly on the stream",
                        where);
    }
  }

  // Registers one submission (launch or eager issue) on `stream`, under the
  // lock, which it may release while it waits. Submissions on one stream
  // overlap freely (the stream orders them); a submission on another stream
  // first waits until every submission on the previous one has been issued,
  // then orders `stream` after it on the device.
  [[nodiscard]] Submission enter_stream(::std::unique_lock<::std::mutex>& lock, stream_type stream,
                                        const ::std::source_location& where) {
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
  // enter_stream() without the lease check.
  [[nodiscard]] Submission enter_stream_locked(::std::unique_lock<::std::mutex>& lock, stream_type stream,
                                               const ::std::source_location& where) {
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
  void end_lease() noexcept {
    {
      const ::std::lock_guard<::std::mutex> lock(mutex_);
      lease_owner_ = ::std::thread::id();
      in_flight_.fetch_sub(1);
    }
    switch_cv_.notify_all();
  }
  // Called with the lock released.
  void leave_stream() noexcept {
    if (in_flight_.fetch_sub(1) == 1 && switching_.load()) {
      const ::std::lock_guard<::std::mutex> lock(mutex_);
      switch_cv_.notify_all();
    }
  }

  void launch(::std::unique_lock<::std::mutex>& lock, GraphRef graph, stream_type stream,
              const ::std::source_location& where) {
    const Submission submission = enter_stream(lock, stream, where);
    lock.unlock();
    const ::std::lock_guard<::std::mutex> exclusive(graph->mutex);
    backend_.launch(graph->exec, stream, where);
  }

  void issue_eager(::std::unique_lock<::std::mutex>& lock, const Key& shape, stream_type stream,
                   const ::std::source_location& where) {
    const Submission submission = enter_stream(lock, stream, where);
    lock.unlock();
    const detail::ActiveRouterScope active(this);
    work_(shape, stream);
  }

  void touch(Entry& entry) noexcept {
    lru_.splice(lru_.begin(), lru_, entry.lru);
    if (entry.graph) {
      graph_lru_.splice(graph_lru_.begin(), graph_lru_, entry.graph_lru);
    }
  }

  // The entry of `shape`, made (and the least recently used key forgotten
  // beyond max_entries) when new. Under the lock.
  EntryRef entry_for(const Key& shape) {
    if (const auto it = entries_.find(shape); it != entries_.end()) {
      touch(*it->second);
      return it->second;
    }
    while (entries_.size() >= options_.max_entries && forget_lru_entry()) {
    }
    EntryRef entry = ::std::make_shared<Entry>(shape);
    entry->state = options_.warmup_runs > 0 ? State::warming : State::ready;
    lru_.push_front(entry.get());
    entry->lru = lru_.begin();
    try {
      entries_.emplace(shape, entry);
    } catch (...) {
      lru_.pop_front();
      throw;
    }
    return entry;
  }

  // Forgets the least recently used key that no thread is capturing.
  bool forget_lru_entry() {
    for (auto it = lru_.rbegin(); it != lru_.rend(); ++it) {
      Entry& victim = **it;
      if (victim.state == State::capturing) {
        continue;
      }
      if (victim.graph) {
        drop_graph(victim, State::ready);
        ++stats_.evictions;
      }
      ++stats_.entry_evictions;
      victim.detached = true;
      lru_.erase(victim.lru);
      entries_.erase(victim.shape);  // `victim` dies here
      return true;
    }
    return false;
  }

  [[gnu::noinline]] Route<Key> run_miss(::std::unique_lock<::std::mutex>& lock, const Key& shape, stream_type stream,
                                        const ::std::source_location& where) {
    ++stats_.misses;
    const EntryRef entry = entry_for(shape);
    switch (entry->state) {
      case State::warming:
        if (++entry->warmups >= options_.warmup_runs) {
          entry->state = State::ready;
        }
        ++stats_.warmups;
        issue_eager(lock, shape, stream, where);
        return Route<Key>{shape, RouteKind::warmup};
      case State::ready:
      case State::stale: {
        if (entry->interrupted_rounds > 0 && Clock::now() < entry->retry_at) {
          break;  // cooling down after an interrupted capture: eager (busy)
        }
        const bool recapture = entry->state == State::stale;
        GraphRef graph = capture_locked(lock, entry, stream, where);
        if (graph) {
          launch(lock, ::std::move(graph), stream, where);
          return Route<Key>{shape, recapture ? RouteKind::recaptured : RouteKind::captured};
        }
        if (entry->state == State::eager_only) {
          ++stats_.eager_fallbacks;
          issue_eager(lock, shape, stream, where);
          return Route<Key>{shape, RouteKind::eager_fallback};
        }
        break;
      }
      case State::eager_only:
        ++stats_.eager_fallbacks;
        issue_eager(lock, shape, stream, where);
        return Route<Key>{shape, RouteKind::eager_fallback};
      case State::capturing:
        break;
      case State::captured: {  // captured by another thread since run() looked
        ++entry->replays;
        launch(lock, entry->graph, stream, where);
        return Route<Key>{shape, RouteKind::replayed};
      }
    }
    ++stats_.eager_busy;
    issue_eager(lock, shape, stream, where);
    return Route<Key>{shape, RouteKind::eager_busy};
  }

  // capture() for one shape: warm-ups, then a capture (or a re-capture).
  bool capture_one(const Key& shape, stream_type stream, const ::std::source_location& where) {
    ::std::unique_lock<::std::mutex> lock(mutex_);
    const EntryRef entry = entry_for(shape);
    if (entry->state == State::captured) {
      return true;
    }
    if (entry->state == State::capturing || entry->state == State::eager_only) {
      return false;
    }
    if (entry->state != State::stale && (live_graphs_ >= options_.max_graphs || total_bytes_ >= options_.max_bytes)) {
      return false;
    }
    while (entry->state == State::warming) {
      if (++entry->warmups >= options_.warmup_runs) {
        entry->state = State::ready;
      }
      ++stats_.warmups;
      issue_eager(lock, shape, stream, where);
      lock.lock();
      if (entry->detached) {
        return false;
      }
    }
    if (entry->state != State::ready && entry->state != State::stale) {
      return entry->state == State::captured;  // another thread got there meanwhile
    }
    return capture_locked(lock, entry, stream, where) != nullptr;
  }

  // Captures (state ready) or re-captures (state stale) `entry` with the lock
  // released, retrying interruptions; then installs the graph and evicts
  // beyond the limits (never before: a good graph goes only once its
  // replacement exists). Returns the new graph (the lock is held again), or
  // null when the capture failed: the key is then marked eager (own failure)
  // or left to cool down (interrupted).
  GraphRef capture_locked(::std::unique_lock<::std::mutex>& lock, const EntryRef& entry, stream_type stream,
                          const ::std::source_location& where) {
    const bool recapture = entry->state == State::stale;
    GraphRef graph = recapture ? entry->graph : nullptr;
    entry->state = State::capturing;
    entry->invalidated_in_capture = false;
    Handler handler = on_capture_failure_;
    lock.unlock();
    Attempt attempt = attempt_capture(entry->shape, graph.get(), stream, where);
    lock.lock();
    stats_.interrupted_captures += attempt.interruptions;
    stats_.capture_retries += attempt.retries;
    if (attempt.outcome == Outcome::interrupted) {
      if (++entry->interrupted_rounds < max_interrupted_rounds) {
        entry->state = recapture ? State::stale : State::ready;
        const ::std::uint32_t round = ::std::min<::std::uint32_t>(entry->interrupted_rounds - 1, 10);
        entry->retry_at = Clock::now() + options_.retry_backoff * (1U << round);
        return nullptr;
      }
      // Interrupted every time, round after round: most likely the work
      // itself breaks the capture in a way that looks external (a raw call
      // whose error was overwritten). Treated as its own failure.
      attempt.outcome = Outcome::failed;
      attempt.reason = detail::concat("every capture attempt was interrupted (", max_interrupted_rounds, " rounds of ",
                                      options_.capture_attempts, "); last: ", attempt.reason);
    }
    if (attempt.outcome == Outcome::failed) {
      if (!entry->detached) {
        if (entry->graph) {
          drop_graph(*entry, State::eager_only);
        }
        entry->state = State::eager_only;
        entry->interrupted_rounds = 0;
        ++stats_.capture_failures;
        lock.unlock();
        report_failure(handler, entry->shape, attempt.reason);
        lock.lock();
      }
      return nullptr;
    }
    entry->interrupted_rounds = 0;
    if (entry->detached) {
      // Forgotten meanwhile (clear(), max_entries): the graph serves this run, then goes.
      if (recapture) {
        return graph;
      }
      ++stats_.captures;
      return ::std::make_shared<GraphSlot>(::std::move(attempt.fresh->exec));
    }
    if (recapture) {
      total_bytes_ -= entry->memory.footprint_bytes;
      entry->memory.alloc_bytes = attempt.updated.memory.alloc_bytes;
      // An in-place update reuses the executable graph: it keeps its footprint.
      if (attempt.updated.path == UpdatePath::reinstantiated) {
        entry->memory.footprint_bytes = attempt.updated.memory.footprint_bytes;
        ++stats_.reinstantiations;
      } else {
        ++stats_.updates;
      }
      total_bytes_ += entry->memory.footprint_bytes;
    } else {
      graph = ::std::make_shared<GraphSlot>(::std::move(attempt.fresh->exec));
      ++stats_.captures;
      entry->graph = graph;
      entry->memory = attempt.fresh->memory;
      entry->replays = 0;
      graph_lru_.push_front(entry.get());
      entry->graph_lru = graph_lru_.begin();
      ++live_graphs_;
      total_bytes_ += entry->memory.footprint_bytes;
    }
    entry->state = entry->invalidated_in_capture ? State::stale : State::captured;
    ++entry->replays;  // the launch that follows
    touch(*entry);
    bool evicted = false;
    while ((live_graphs_ > options_.max_graphs || total_bytes_ > options_.max_bytes) && evict_lru(entry.get())) {
      evicted = true;
    }
    if (evicted) {
      lock.unlock();
      trim();
      lock.lock();
    }
    return graph;
  }

  // One capture (or re-capture of `graph`), retried while it is interrupted
  // from outside. No lock held.
  Attempt attempt_capture(const Key& shape, GraphSlot* graph, stream_type stream,
                          const ::std::source_location& where) {
    const detail::ActiveRouterScope active(this);
    Attempt attempt;
    auto issue = [&](stream_type s) { work_(shape, s); };
    auto backoff = options_.retry_backoff;
    for (::std::uint32_t i = 0; i < options_.capture_attempts; ++i) {
      if (i > 0) {
        ++attempt.retries;
        ::std::this_thread::sleep_for(backoff);
        backoff *= 2;
      }
      try {
        if (graph != nullptr) {
          const ::std::lock_guard<::std::mutex> exclusive(graph->mutex);
          attempt.updated = backend_.recapture(graph->exec, stream, issue, where);
        } else {
          attempt.fresh.emplace(backend_.capture(stream, issue, where));
        }
        attempt.outcome = Outcome::captured;
        break;
      } catch (const capture_interrupted_error& e) {
        ++attempt.interruptions;
        attempt.outcome = Outcome::interrupted;
        attempt.reason = e.what();
      } catch (...) {
        attempt.outcome = Outcome::failed;
        attempt.reason = detail::describe_current_exception();
        break;
      }
    }
    return attempt;
  }

  // Evicts the least recently used live graph other than `keep` and those
  // being re-captured; false if none. Under the lock.
  bool evict_lru(const Entry* keep) {
    for (auto it = graph_lru_.rbegin(); it != graph_lru_.rend(); ++it) {
      Entry& victim = **it;
      if (&victim == keep || victim.state == State::capturing) {
        continue;
      }
      drop_graph(victim, State::ready);
      ++stats_.evictions;
      return true;
    }
    return false;
  }

  void drop_graph(Entry& entry, State next) noexcept {
    if (entry.graph) {
      graph_lru_.erase(entry.graph_lru);
      entry.graph.reset();  // freed once the last launch holding it returns
      --live_graphs_;
      total_bytes_ -= entry.memory.footprint_bytes;
    }
    entry.memory = GraphMemory{};
    entry.replays = 0;
    entry.state = next;
  }

  // Gives evicted graphs' memory back, where the backend can. No lock held.
  void trim() noexcept {
    if constexpr (TrimsMemory<Backend>) {
      backend_.trim(::std::source_location::current());
    }
  }

  bool invalidate_entry(Entry& entry) noexcept {
    switch (entry.state) {
      case State::captured:
      case State::stale:
        entry.state = State::stale;
        return true;
      case State::eager_only:
        entry.state = State::ready;
        return true;
      case State::capturing:
        entry.invalidated_in_capture = true;
        return true;
      case State::ready:
        entry.interrupted_rounds = 0;  // no cool-down: try at once
        return false;
      case State::warming:
        return false;
    }
    return false;
  }

  void report_failure(const Handler& handler, const Key& shape, const ::std::string& reason) noexcept {
    try {
      const detail::ActiveRouterScope active(this);
      if (handler && *handler) {
        (*handler)(shape, reason);
      } else {
        const ::std::string line = detail::concat("replay::ShapeRouter: capturing shape ", detail::describe_key(shape),
                                                  " failed; it runs eagerly from now on. ", reason, "\n");
        ::std::fputs(line.c_str(), stderr);
      }
    } catch (...) {
      // A failing logger must not take the serving path down.
    }
  }

  work_type work_;
  options_type options_;
  Backend backend_;
  // Moved out of options_, which stays immutable (read unlocked); shared so
  // that a handler replaced meanwhile stays alive while it is being called.
  Handler on_capture_failure_;
  mutable ::std::mutex mutex_;
  detail::key_map<Key, EntryRef> entries_;
  ::std::list<Entry*> lru_;        // every entry, most recently used first
  ::std::list<Entry*> graph_lru_;  // entries with a graph, most recently used first
  ::std::size_t live_graphs_ = 0;
  ::std::size_t total_bytes_ = 0;
  RouterStats stats_;
  // Stream ordering (enter_stream): the stream of the latest submissions,
  // how many of them are still being issued, and a switch in progress.
  ::std::optional<stream_type> last_stream_;
  ::std::atomic<int> in_flight_{0};
  ::std::atomic<bool> switching_{false};
  ::std::condition_variable switch_cv_;  // a switch or a lease ended
  ::std::thread::id lease_owner_;         // the thread holding a Lease, if any
  ::std::optional<stream_type> lease_stream_;
};

}  // namespace replay
