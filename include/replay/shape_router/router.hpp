#pragma once
// ShapeRouter: one graph per key (or per bucket of keys), chosen at run time,
// over a GraphBackend. See replay/shape_router.hpp for an overview.
#include <replay/detail/require_cxx20.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <initializer_list>
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

#include "replay/shape_router/detail/entry_table.hpp"
#include "replay/shape_router/detail/records.hpp"
#include "replay/shape_router/detail/shape_plan.hpp"
#include "replay/shape_router/detail/keys.hpp"
#include "replay/detail/signature_checks.hpp"
#include "replay/error.hpp"
#include "replay/shape_router/backend.hpp"
#include "replay/shape_router/cuda_backend.hpp"
#include "replay/shape_router/keys.hpp"
#include "replay/shape_router/options.hpp"
#include "replay/shape_router/stats.hpp"

namespace replay {

// Threading: every member function may be called from any thread. An
// internal mutex guards the key table for lookups and bookkeeping only, never
// across launches, warm-ups, eager runs or captures: a key being captured
// never stalls hits on other keys (its own runs issue the work eagerly,
// RouteKind::eager_busy). A graph being launched is locked, not referenced:
// its eviction waits for that launch.
//
// Streams: the graphs share their buffers, so by default
// (StreamSharing::lease_required) a router runs outside a lease on one stream
// only, the first that ran it, and refuses another with usage_error; leases
// and run_staged() order whole requests on any stream, and
// StreamSharing::caller_ordered leaves the copies to callers that order them
// (GraphedCallable). Either way the router orders what it issues across
// streams (a run on another stream waits, on the device, for the router's work
// on the previous one) and never touches a stream after the run on it has
// returned. docs/shape_router.md, "Threads and streams", has the details.
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
    if (options_.breaks == BreakPolicy::piecewise && !CapturesPiecewise<Backend>) {
      throw usage_error("ShapeRouterOptions::breaks = BreakPolicy::piecewise, but the backend cannot capture "
                        "piecewise (it has no piecewise_type, capture_piecewise, launch_piecewise); use "
                        "CudaGraphBackend, or BreakPolicy::eager",
                        where);
    }
    entries_.index_bucket_shapes();
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
  // Outside a lease, StreamSharing::lease_required binds the router to the
  // first stream run() is called with and refuses any other (usage_error).
  // Capture failures never escape: an interrupted capture is retried
  // (capture_attempts) and otherwise tried again later; a capture that fails
  // on its own work marks the key eager and the handler is told once. This
  // and later runs then issue the work eagerly. Exceptions from the work
  // itself when run eagerly, and launch errors, do propagate, and so does the
  // error of a failed piecewise capture (BreakPolicy::piecewise), which may
  // have run part of the work: it is not run again eagerly.
  Route<Key> run(const Key& key, stream_type stream,
                 ::std::source_location where = ::std::source_location::current());

  // Exclusive use of the router's shared buffers on `stream` for as long as
  // the returned object lives: waits until no other thread holds a lease and
  // every submission on another stream has been issued, then orders `stream`
  // after them on the device. Other threads' runs and leases wait until it is
  // released. Stage inputs, run() (from this thread, on this stream) and
  // issue the reads of the outputs while holding it; the next user of the
  // buffers on another stream is then ordered after all of that. Any stream
  // may be leased, whatever stream runs the router outside leases. usage_error
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
  [[nodiscard]] Lease lease(stream_type stream, ::std::source_location where = ::std::source_location::current());

  // One whole request on the router's shared buffers, the lease inside the
  // call: stage_in(key, shape, stream) copies the inputs in (and fills the
  // padding up to `shape`), run(), then read_out(route, stream) issues the
  // reads of the outputs, all under lease(stream). The safe way for several
  // threads or streams to share a router: a bad key, a lease this thread
  // already holds, or a call from inside the work is refused (usage_error)
  // before stage_in runs, so nothing is copied into buffers in use.
  template <class StageIn, class ReadOut>
  Route<Key> run_staged(const Key& key, stream_type stream, StageIn&& stage_in, ReadOut&& read_out,
                        ::std::source_location where = ::std::source_location::current());

  // Bucketed: captures a graph for every bucket shape (the cartesian product
  // of the bucket lists), largest first, after the configured warm-ups.
  // Returns how many bucket shapes have a graph afterwards (at most
  // max_graphs; it stops at max_bytes). Every shape has its verdict before it
  // returns: an interrupted capture is retried here (capture_attempts per
  // round, up to 8 rounds, the cool-downs slept out), and a shape still
  // without a graph is marked eager, counted in capture_failures and reported
  // through the handler; nothing about a failed capture is thrown. `progress`,
  // when given, is told after each shape (done, total, shape).
  ::std::size_t capture_all(stream_type stream, ::std::source_location where = ::std::source_location::current()) {
    return capture_all(stream, progress_type{}, where);
  }
  ::std::size_t capture_all(stream_type stream, const progress_type& progress,
                            ::std::source_location where = ::std::source_location::current());

  // Captures graphs for `keys` (padded, deduplicated), largest first. Oversize
  // keys are skipped (they never run as graphs). Returns how many of the
  // distinct padded keys have a graph afterwards; the others have their
  // verdict, as with capture_all().
  ::std::size_t capture(::std::span<const Key> keys, stream_type stream,
                        ::std::source_location where = ::std::source_location::current()) {
    return capture(keys, stream, progress_type{}, where);
  }
  ::std::size_t capture(::std::span<const Key> keys, stream_type stream, const progress_type& progress,
                        ::std::source_location where = ::std::source_location::current());
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
  bool invalidate(const Key& key, ::std::source_location where = ::std::source_location::current());
  // invalidate() for every key.
  void invalidate_all(::std::source_location where = ::std::source_location::current());

  // Drops the graph of `key`'s padded shape now (counted as an eviction).
  // False when it has none, or is being re-captured right now.
  bool evict(const Key& key, ::std::source_location where = ::std::source_location::current());

  // Drops every graph and forgets every key (warm-up counts, eager marks).
  // Captures in flight finish, launch once for their own run, and are then
  // dropped. Statistics are kept.
  void clear(::std::source_location where = ::std::source_location::current());

  // True when `key`'s padded shape has a graph (possibly stale).
  bool contains(const Key& key, ::std::source_location where = ::std::source_location::current()) const;
  // True when `key`'s padded shape is marked eager after a failed capture.
  bool is_eager(const Key& key, ::std::source_location where = ::std::source_location::current()) const;

  // How `key`'s padded shape is served: one graph, piecewise (its segments and
  // regions), eager (and why), or no verdict yet (pending).
  RouterEntryInfo<Key> entry_info(const Key& key,
                                  ::std::source_location where = ::std::source_location::current()) const;
  // entry_info() of every key the router holds state for, most recently used
  // first (e.g. after capture_all(), the verdict of each bucket shape).
  ::std::vector<RouterEntryInfo<Key>> entries() const;

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
  ::std::vector<GraphInfo<Key>> graphs() const;

  // Memory of the live graphs, and the device's graph pool where the backend reports it.
  RouterMemory memory(::std::source_location where = ::std::source_location::current()) const;

  RouterStats stats() const;
  void reset_stats();

  // Replaces the capture-failure handler (empty: one line on stderr).
  void set_capture_failure_handler(CaptureFailureHandler<Key> handler,
                                   ::std::source_location where = ::std::source_location::current());

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

  using State = detail::RouterEntryState;
  // What a slot holds: exec_type, or (a backend that captures piecewise) a
  // variant of it and the backend's piecewise_type.
  using held_type = typename detail::RouterExecs<Backend>::held;
  using pieces_type = typename detail::RouterExecs<Backend>::pieces;
  using GraphSlot = detail::RouterGraphSlot<held_type>;
  using GraphRef = ::std::shared_ptr<GraphSlot>;
  using Entry = detail::RouterEntry<Key, held_type>;
  using EntryRef = ::std::shared_ptr<Entry>;
  using Handler = ::std::shared_ptr<const CaptureFailureHandler<Key>>;
  using Outcome = detail::RouterCaptureOutcome;
  using Attempt = detail::RouterCaptureAttempt<exec_type, pieces_type>;

  // Ends a submission (see enter_stream) when it goes out of scope:
  // shape_router/detail/streams.hpp.
  class Submission;

  // usage_error from inside the router's own work, handler or progress
  // callback (a deadlock otherwise). Queries without a caller's location
  // report the router's own. shape_router/detail/streams.hpp.
  void refuse_reentry(const ::std::source_location& where = ::std::source_location::current()) const;

  // Stream ordering and leases: shape_router/detail/streams.hpp.
  // Registers one submission (launch or eager issue) on `stream`, under the
  // lock, which it may release while it waits. Submissions on one stream
  // overlap freely (the stream orders them); a submission on another stream
  // first waits until every submission on the previous one has been issued,
  // then orders `stream` after it on the device.
  [[nodiscard]] Submission enter_stream(::std::unique_lock<::std::mutex>& lock, stream_type stream,
                                        const ::std::source_location& where);
  // Outside a lease under StreamSharing::lease_required: `stream` must be the
  // router's stream; the first run() (`binds`) makes it so. Under the lock.
  void admit_stream(const stream_type& stream, bool binds, const ::std::source_location& where);
  [[gnu::noinline]] void admit_other_stream(const stream_type& stream, bool binds, const ::std::source_location& where);
  // enter_stream() without the lease check.
  [[nodiscard]] Submission enter_stream_locked(::std::unique_lock<::std::mutex>& lock, stream_type stream,
                                               const ::std::source_location& where);
  void end_lease() noexcept;
  // Called with the lock released. `unmarked`: a mark owed was not recorded
  // (the work threw): the next switch drains instead.
  void leave_stream(bool unmarked) noexcept;
  // Destroys the graphs dropped under the lock (drop_graph), and trims, with
  // it released for that time (held again on return). Never inside a submission.
  void release_retired(::std::unique_lock<::std::mutex>& lock) noexcept;
  // True when enter_stream(stream) would not wait (under the lock).
  bool enters_without_waiting(const stream_type& stream) const noexcept;
  void launch(::std::unique_lock<::std::mutex>& lock, GraphRef graph, stream_type stream,
              const ::std::source_location& where);
  // Launches what a slot holds (a graph, or a piecewise executable). The slot is taken.
  void launch_held(held_type& held, stream_type stream, const ::std::source_location& where);
  void issue_eager(::std::unique_lock<::std::mutex>& lock, const Key& shape, stream_type stream,
                   const ::std::source_location& where);

  // The key table, its LRU lists and eviction: shape_router/detail/table.hpp.
  // Recency: every use stamps the entry (last_used, from use_clock_). A miss
  // also moves it to the front of lru_; a hit only flags it (recent), and
  // forget_lru_entry gives a flagged entry a second chance, so that a hit
  // writes only the entry and the clock. Live graphs are evicted by stamp.
  void touch(Entry& entry) noexcept;
  void touch_hit(Entry& entry) noexcept {
    entry.last_used = ++use_clock_;
    entry.recent = true;
    ++entry.replays;
  }
  // The entry of `shape`, made (and the least recently used key forgotten
  // beyond max_entries) when new. Under the lock.
  EntryRef entry_for(const Key& shape);
  // Forgets the least recently used key that no thread is capturing.
  bool forget_lru_entry();
  // Evicts the least recently used live graph other than `keep` and those
  // being re-captured; false if none. Under the lock.
  bool evict_lru(const Entry* keep);
  // Unlinks the entry's graph; the graph itself goes to retired_, destroyed
  // by release_retired() once the lock is released (never under it).
  void drop_graph(Entry& entry, State next) noexcept;
  // Gives evicted graphs' memory back, where the backend can. No lock held.
  void trim() noexcept;
  bool invalidate_entry(Entry& entry) noexcept;

  // Misses, captures, retries and failure reports: shape_router/detail/capture.hpp.
  [[gnu::noinline]] Route<Key> run_miss(::std::unique_lock<::std::mutex>& lock, const Key& shape, stream_type stream,
                                        const ::std::source_location& where);
  // capture() for one shape: warm-ups, then a capture (or a re-capture).
  bool capture_one(const Key& shape, stream_type stream, const ::std::source_location& where);
  // Captures (state ready) or re-captures (state stale) `entry` with the lock
  // released, retrying interruptions; then installs the graph and evicts
  // beyond the limits (never before: a good graph goes only once its
  // replacement exists). Returns the new graph (the lock is held again), or
  // null when the capture failed: the key is then marked eager (own failure)
  // or left to cool down (interrupted).
  // `ran`: the capture ran the work on `stream` (piecewise): the caller
  // launches nothing for this run. `partial`: a piecewise capture that failed
  // after running part of the work (the caller decides whether to throw it).
  GraphRef capture_locked(::std::unique_lock<::std::mutex>& lock, const EntryRef& entry, stream_type stream,
                          const ::std::source_location& where, bool* ran = nullptr,
                          ::std::exception_ptr* partial = nullptr);
  // The piecewise capture of a key whose whole capture met a declared break:
  // inside a submission on `stream` (it runs the work there). Lock held on
  // entry and on return, released meanwhile.
  void capture_pieces(::std::unique_lock<::std::mutex>& lock, const Key& shape, Attempt& attempt,
                      stream_type stream, const ::std::source_location& where);
  // The slot of a new capture (whole or piecewise).
  GraphRef slot_of(Attempt& attempt);
  RouterEntryInfo<Key> info_of(const Entry& entry) const;
  static RouterEntryInfo<Key> pending_info(const Key& shape) {
    return RouterEntryInfo<Key>{shape, RouterEntryKind::pending, 0, {}, {}, {}, 0, false};
  }
  // One capture (or re-capture of `graph`), retried while it is interrupted
  // from outside. No lock held.
  Attempt attempt_capture(const Key& shape, GraphSlot* graph, stream_type stream,
                          const ::std::source_location& where);
  void report_failure(const Handler& handler, const Key& shape, const ::std::string& reason) noexcept;

  work_type work_;
  options_type options_;
  Backend backend_;
  // Moved out of options_, which stays immutable (read unlocked); shared so
  // that a handler replaced meanwhile stays alive while it is being called.
  Handler on_capture_failure_;
  // What a hit reads and writes, together (a launch between two hits
  // evicts much of the host's cache): the lock, the table, the counters a
  // hit updates, the stream-ordering state. The rest of the statistics,
  // the LRU lists and the capture bookkeeping come after.
  mutable ::std::mutex mutex_;
  detail::RouterEntryTable<Key, Entry> entries_{options_};
  // The counters of RouterStats a hit updates (stats() merges them in).
  struct HotCounters {
    ::std::uint64_t runs = 0;
    ::std::uint64_t hits = 0;
    ::std::uint64_t real_elements = 0;
    ::std::uint64_t padded_elements = 0;
  } hot_;
  ::std::uint64_t use_clock_ = 0;  // stamps Entry::last_used
  // Stream ordering (enter_stream): the stream of the latest submissions;
  // submissions entered (under the lock) and issued (counted without it):
  // the difference is how many are still being issued; a switch in
  // progress; whether every submission marks (a second stream was seen);
  // whether work on last_stream_ may follow the latest mark.
  // Every submission is counted, single-stream hits too: a switch must wait
  // for launches still being issued, and one that skipped the count could
  // only be found through its graph, which may be retired and being
  // destroyed by another thread meanwhile (its destructor waiting for a
  // launch that in turn waits for the switch).
  ::std::optional<stream_type> last_stream_;
  ::std::size_t entered_ = 0;
  ::std::atomic<::std::size_t> issued_{0};
  ::std::thread::id lease_owner_;  // the thread holding a Lease, if any
  ::std::atomic<bool> switching_{false};
  bool marking_ = false;
  bool unmarked_ = false;
  ::std::condition_variable switch_cv_;  // a switch or a lease ended
  ::std::optional<stream_type> lease_stream_;
  // StreamSharing::lease_required: the stream that runs the router outside leases.
  ::std::optional<stream_type> home_stream_;
  ::std::list<Entry*> lru_;        // every entry; see touch()
  ::std::list<Entry*> graph_lru_;  // entries with a graph (their order is their stamps')
  ::std::size_t live_graphs_ = 0;
  ::std::size_t total_bytes_ = 0;
  RouterStats stats_;  // without the HotCounters
  // Graphs dropped under the lock, destroyed once it is released.
  ::std::vector<GraphRef> retired_;
  bool evicted_memory_ = false;  // a dropped graph held graph memory: trim
};

}  // namespace replay

// The out-of-line parts: stream ordering and leases, the key table, capture.
#include "replay/shape_router/detail/streams.hpp"
#include "replay/shape_router/detail/table.hpp"
#include "replay/shape_router/detail/capture.hpp"
#include "replay/shape_router/detail/attempt.hpp"
