#pragma once
// ShapeRouter: one graph per key (or per bucket of keys), chosen at run time,
// over a GraphBackend. See replay/shape_router.hpp for an overview.
#include <replay/detail/require_cxx20.hpp>

#include <algorithm>
#include <array>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <initializer_list>
#include <limits>
#include <mutex>
#include <optional>
#include <source_location>
#include <span>
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

// The router whose lock this thread holds (to refuse re-entry from the work
// callable, which would deadlock). One slot for routers of every type.
struct ShapeRouterKind {};
using ActiveRouterScope = ReentryGuard<ShapeRouterKind>;

}  // namespace detail

// ---------------------------------------------------------------------------
// ShapeRouter
// ---------------------------------------------------------------------------

// Threading: every member function may be called from any thread; an internal
// mutex serializes them (a hit holds it for one lookup and one launch). The
// router does not order device work: graphs of one router share the buffers
// they were captured with, so launches on different streams must be ordered by
// the caller (usual setup: one router, with its own buffers, per stream).
template <RouterKey Key, GraphBackend Backend = CudaGraphBackend>
class ShapeRouter {
 public:
  using key_type = Key;
  using backend_type = Backend;
  using stream_type = typename Backend::stream_type;
  using exec_type = typename Backend::exec_type;
  using options_type = ShapeRouterOptions<Key>;
  // Issues the work of one shape on a stream. Called eagerly (warm-ups,
  // fallbacks) and under capture; the shape is the padded one.
  using work_type = ::std::function<void(const Key& shape, stream_type stream)>;

  // Validates `options`: usage_error for an empty, unsorted or duplicated
  // bucket list, a bucket that is not positive or does not fit the key type,
  // buckets with the exact policy, bucketing a key that is not a ShapeKey, or
  // a zero max_graphs / max_bytes.
  explicit ShapeRouter(work_type work, options_type options = {}, Backend backend = Backend{},
                       ::std::source_location where = ::std::source_location::current())
      : work_(::std::move(work)),
        options_(::std::move(options)),
        backend_(::std::move(backend)),
        on_capture_failure_(::std::exchange(options_.on_capture_failure, {})) {
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
  // Capture failures never escape: the key is marked eager, the handler is
  // told once, and this and later runs issue the work eagerly. Exceptions from
  // the work itself when run eagerly, and launch errors, do propagate.
  Route<Key> run(const Key& key, stream_type stream,
                 ::std::source_location where = ::std::source_location::current()) {
    refuse_reentry(where);
    const Planned planned = Plan::plan(options_, key, where);
    ::std::lock_guard<::std::mutex> lock(mutex_);
    detail::ActiveRouterScope active(this);
    ++stats_.runs;
    stats_.real_elements += detail::element_count(key);
    stats_.padded_elements += detail::element_count(planned.shape);
    if (planned.oversize) [[unlikely]] {
      return run_oversize(planned.shape, stream);
    }
    const auto it = entries_.find(planned.shape);
    if (it != entries_.end() && it->second.state == State::captured) [[likely]] {
      Entry& entry = it->second;
      backend_.launch(*entry.exec, stream, where);
      entry.last_used = ++tick_;
      ++entry.replays;
      ++stats_.hits;
      return Route<Key>{planned.shape, RouteKind::replayed};
    }
    return run_miss(planned.shape, stream, where);
  }

  // Bucketed: captures a graph for every bucket shape (the cartesian product
  // of the bucket lists), largest first, after the configured warm-ups.
  // Returns how many bucket shapes have a graph afterwards (at most
  // max_graphs; it stops at max_bytes). Failed shapes are marked eager and
  // reported through the handler; nothing about a failed capture is thrown.
  ::std::size_t capture_all(stream_type stream, ::std::source_location where = ::std::source_location::current()) {
    if (options_.policy != RoutingPolicy::bucketed) {
      throw usage_error("ShapeRouter::capture_all(stream) needs RoutingPolicy::bucketed; with the exact "
                        "policy pass the keys: capture(keys, stream)",
                        where);
    }
    const ::std::vector<Key> shapes = bucket_shapes();
    return capture(::std::span<const Key>(shapes), stream, where);
  }

  // Captures graphs for `keys` (padded, deduplicated), largest first. Oversize
  // keys are skipped (they never run as graphs). Returns how many of the
  // distinct padded keys have a graph afterwards.
  ::std::size_t capture(::std::span<const Key> keys, stream_type stream,
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
    ::std::lock_guard<::std::mutex> lock(mutex_);
    detail::ActiveRouterScope active(this);
    ::std::size_t with_graph = 0;
    for (const Key& shape : shapes) {
      Entry& entry = entry_for(shape);
      if (entry.state == State::captured) {
        ++with_graph;
        continue;
      }
      if (entry.state == State::stale) {
        with_graph += recapture_entry(entry, shape, stream, where) ? 1 : 0;
        continue;
      }
      if (entry.state == State::eager_only || live_graphs_ >= options_.max_graphs ||
          total_bytes_ >= options_.max_bytes) {
        continue;
      }
      while (entry.state == State::warming) {
        warm_up(entry, shape, stream);
      }
      with_graph += capture_entry(entry, shape, stream, where) ? 1 : 0;
    }
    return with_graph;
  }
  ::std::size_t capture(::std::initializer_list<Key> keys, stream_type stream,
                        ::std::source_location where = ::std::source_location::current()) {
    return capture(::std::span<const Key>(keys.begin(), keys.size()), stream, where);
  }

  // Marks the graph of `key`'s padded shape stale (e.g. the buffers it was
  // captured with moved): its next run re-captures it and updates the
  // executable graph in place where CUDA allows. A key marked eager after a
  // failed capture gets another chance. Returns false when the key has neither
  // a graph nor an eager mark.
  bool invalidate(const Key& key, ::std::source_location where = ::std::source_location::current()) {
    refuse_reentry(where);
    const Planned planned = Plan::plan(options_, key, where);
    ::std::lock_guard<::std::mutex> lock(mutex_);
    const auto it = entries_.find(planned.shape);
    return it != entries_.end() && invalidate_entry(it->second);
  }
  // invalidate() for every key.
  void invalidate_all(::std::source_location where = ::std::source_location::current()) {
    refuse_reentry(where);
    ::std::lock_guard<::std::mutex> lock(mutex_);
    for (auto& [shape, entry] : entries_) {
      (void)invalidate_entry(entry);
    }
  }

  // Drops the graph of `key`'s padded shape now (counted as an eviction).
  bool evict(const Key& key, ::std::source_location where = ::std::source_location::current()) {
    refuse_reentry(where);
    const Planned planned = Plan::plan(options_, key, where);
    ::std::lock_guard<::std::mutex> lock(mutex_);
    const auto it = entries_.find(planned.shape);
    if (it == entries_.end() || !it->second.exec) {
      return false;
    }
    drop_graph(it->second, State::ready);
    ++stats_.evictions;
    return true;
  }

  // Drops every graph and forgets every key (warm-up counts, eager marks).
  // Statistics are kept.
  void clear(::std::source_location where = ::std::source_location::current()) {
    refuse_reentry(where);
    ::std::lock_guard<::std::mutex> lock(mutex_);
    entries_.clear();
    live_graphs_ = 0;
    total_bytes_ = 0;
  }

  // True when `key`'s padded shape has a graph (possibly stale).
  bool contains(const Key& key, ::std::source_location where = ::std::source_location::current()) const {
    refuse_reentry(where);
    const Planned planned = Plan::plan(options_, key, where);
    ::std::lock_guard<::std::mutex> lock(mutex_);
    const auto it = entries_.find(planned.shape);
    return it != entries_.end() && it->second.exec.has_value();
  }
  // True when `key`'s padded shape is marked eager after a failed capture.
  bool is_eager(const Key& key, ::std::source_location where = ::std::source_location::current()) const {
    refuse_reentry(where);
    const Planned planned = Plan::plan(options_, key, where);
    ::std::lock_guard<::std::mutex> lock(mutex_);
    const auto it = entries_.find(planned.shape);
    return it != entries_.end() && it->second.state == State::eager_only;
  }

  ::std::size_t graph_count() const {
    refuse_reentry();
    ::std::lock_guard<::std::mutex> lock(mutex_);
    return live_graphs_;
  }

  // The live graphs, most recently used first.
  ::std::vector<GraphInfo<Key>> graphs() const {
    refuse_reentry();
    ::std::vector<::std::pair<::std::uint64_t, GraphInfo<Key>>> found;
    {
      ::std::lock_guard<::std::mutex> lock(mutex_);
      for (const auto& [shape, entry] : entries_) {
        if (entry.exec) {
          found.push_back({entry.last_used, GraphInfo<Key>{shape, entry.memory, entry.replays,
                                                           entry.state == State::stale}});
        }
      }
    }
    ::std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
    ::std::vector<GraphInfo<Key>> out;
    out.reserve(found.size());
    for (auto& f : found) {
      out.push_back(::std::move(f.second));
    }
    return out;
  }

  // Memory of the live graphs, and the device's graph pool where the backend reports it.
  RouterMemory memory(::std::source_location where = ::std::source_location::current()) const {
    refuse_reentry(where);
    RouterMemory out;
    {
      ::std::lock_guard<::std::mutex> lock(mutex_);
      for (const auto& [shape, entry] : entries_) {
        if (entry.exec) {
          ++out.graphs;
          out.alloc_bytes_sum += entry.memory.alloc_bytes;
          out.alloc_bytes_max = ::std::max(out.alloc_bytes_max, entry.memory.alloc_bytes);
          out.footprint_bytes += entry.memory.footprint_bytes;
        }
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
    on_capture_failure_ = ::std::move(handler);
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

  enum class State : ::std::uint8_t {
    warming,     // seen fewer than warmup_runs times
    ready,       // warm, no graph (new, or evicted): the next run captures
    captured,    // graph live
    stale,       // graph live but invalidated: the next run re-captures
    eager_only,  // capture failed: always eager
  };
  struct Entry {
    ::std::optional<exec_type> exec;
    GraphMemory memory;
    ::std::uint64_t last_used = 0;
    ::std::uint64_t replays = 0;
    ::std::uint32_t warmups = 0;
    State state = State::ready;
  };
  // Queries without a caller's location report the router's own.
  void refuse_reentry(const ::std::source_location& where = ::std::source_location::current()) const {
    if (detail::ActiveRouterScope::inside(this)) [[unlikely]] {
      throw usage_error("ShapeRouter called from inside its own work callable (or failure handler); that "
                        "would deadlock. Issue nested work directly on the stream",
                        where);
    }
  }

  Entry& entry_for(const Key& shape) {
    auto [it, inserted] = entries_.try_emplace(shape);
    if (inserted) {
      it->second.state = options_.warmup_runs > 0 ? State::warming : State::ready;
    }
    return it->second;
  }

  [[gnu::noinline]] Route<Key> run_oversize(const Key& key, stream_type stream) {
    ++stats_.misses;
    ++stats_.oversize;
    work_(key, stream);
    return Route<Key>{key, RouteKind::eager_oversize};
  }

  [[gnu::noinline]] Route<Key> run_miss(const Key& shape, stream_type stream, const ::std::source_location& where) {
    ++stats_.misses;
    Entry& entry = entry_for(shape);
    switch (entry.state) {
      case State::warming:
        warm_up(entry, shape, stream);
        return Route<Key>{shape, RouteKind::warmup};
      case State::ready:
        if (capture_entry(entry, shape, stream, where)) {
          launch_fresh(entry, stream, where);
          return Route<Key>{shape, RouteKind::captured};
        }
        break;
      case State::stale:
        if (recapture_entry(entry, shape, stream, where)) {
          launch_fresh(entry, stream, where);
          return Route<Key>{shape, RouteKind::recaptured};
        }
        break;
      case State::captured:  // not a miss; run() handles it
      case State::eager_only:
        break;
    }
    ++stats_.eager_fallbacks;
    work_(shape, stream);
    return Route<Key>{shape, RouteKind::eager_fallback};
  }

  void warm_up(Entry& entry, const Key& shape, stream_type stream) {
    work_(shape, stream);
    ++stats_.warmups;
    if (++entry.warmups >= options_.warmup_runs) {
      entry.state = State::ready;
    }
  }

  void launch_fresh(Entry& entry, stream_type stream, const ::std::source_location& where) {
    backend_.launch(*entry.exec, stream, where);
    ++entry.replays;
  }

  // Captures a new graph for `entry`, evicting least recently used graphs to
  // stay within max_graphs first (so the new one never briefly exceeds it) and
  // within max_bytes after (its footprint is known only then).
  bool capture_entry(Entry& entry, const Key& shape, stream_type stream, const ::std::source_location& where) {
    while (live_graphs_ >= options_.max_graphs && evict_lru(&entry)) {
    }
    try {
      auto issue = [&](stream_type s) { work_(shape, s); };
      CapturedGraph<exec_type> captured = backend_.capture(stream, issue, where);
      entry.exec.emplace(::std::move(captured.exec));
      entry.memory = captured.memory;
    } catch (...) {
      mark_failed(entry, shape, detail::describe_current_exception());
      return false;
    }
    entry.state = State::captured;
    entry.last_used = ++tick_;
    ++live_graphs_;
    total_bytes_ += entry.memory.footprint_bytes;
    ++stats_.captures;
    enforce_byte_limit(entry);
    return true;
  }

  bool recapture_entry(Entry& entry, const Key& shape, stream_type stream, const ::std::source_location& where) {
    RecaptureResult result;
    try {
      auto issue = [&](stream_type s) { work_(shape, s); };
      result = backend_.recapture(*entry.exec, stream, issue, where);
    } catch (...) {
      mark_failed(entry, shape, detail::describe_current_exception());
      return false;
    }
    total_bytes_ -= entry.memory.footprint_bytes;
    entry.memory.alloc_bytes = result.memory.alloc_bytes;
    // An in-place update reuses the executable graph: it keeps its footprint.
    if (result.path == UpdatePath::reinstantiated) {
      entry.memory.footprint_bytes = result.memory.footprint_bytes;
      ++stats_.reinstantiations;
    } else {
      ++stats_.updates;
    }
    total_bytes_ += entry.memory.footprint_bytes;
    entry.state = State::captured;
    entry.last_used = ++tick_;
    enforce_byte_limit(entry);
    return true;
  }

  void enforce_byte_limit(const Entry& keep) {
    while (total_bytes_ > options_.max_bytes && evict_lru(&keep)) {
    }
  }

  // Evicts the least recently used live graph other than `keep`; false if none.
  bool evict_lru(const Entry* keep) {
    Entry* victim = nullptr;
    for (auto& [shape, entry] : entries_) {
      if (entry.exec && &entry != keep && (victim == nullptr || entry.last_used < victim->last_used)) {
        victim = &entry;
      }
    }
    if (victim == nullptr) {
      return false;
    }
    drop_graph(*victim, State::ready);
    ++stats_.evictions;
    return true;
  }

  void drop_graph(Entry& entry, State next) noexcept {
    if (entry.exec) {
      entry.exec.reset();
      --live_graphs_;
      total_bytes_ -= entry.memory.footprint_bytes;
    }
    entry.memory = GraphMemory{};
    entry.replays = 0;
    entry.state = next;
  }

  bool invalidate_entry(Entry& entry) noexcept {
    if (entry.state == State::captured || entry.state == State::stale) {
      entry.state = State::stale;
      return true;
    }
    if (entry.state == State::eager_only) {
      entry.state = State::ready;
      return true;
    }
    return false;
  }

  void mark_failed(Entry& entry, const Key& shape, const ::std::string& reason) noexcept {
    drop_graph(entry, State::eager_only);
    ++stats_.capture_failures;
    try {
      if (on_capture_failure_) {
        on_capture_failure_(shape, reason);
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
  CaptureFailureHandler<Key> on_capture_failure_;  // moved out of options_, which stays immutable (read unlocked)
  mutable ::std::mutex mutex_;
  detail::key_map<Key, Entry> entries_;
  ::std::size_t live_graphs_ = 0;
  ::std::size_t total_bytes_ = 0;
  ::std::uint64_t tick_ = 0;
  RouterStats stats_;
};

}  // namespace replay
