#pragma once
// ShapeRouter: one CUDA graph per shape (or per bucket of shapes), chosen at
// run time. A CUDA graph replays only the shapes it was captured with, but a
// service sees changing batch sizes and sequence lengths; the router keeps one
// graph per key, pads keys up to buckets when asked to, captures on demand
// (after N eager warm-ups) or all at start (largest first), bounds the number
// and bytes of graphs with LRU eviction, and falls back to eager execution,
// once logged and never thrown, when a shape cannot be captured.
//
//   replay::ShapeRouter<int> router(
//       [&](int batch, replay::StreamRef s) { model(batch, s); },   // issues one shape's work
//       {.policy = replay::RoutingPolicy::bucketed, .buckets = {{1, 2, 4, 8, 16, 32, 64}}});
//   router.capture_all(stream);                      // optional: every bucket now, largest first
//   const int padded = router.padded_shape(batch);   // pad inputs up to this
//   router.run(batch, stream);                       // a hit is one lookup and one cudaGraphLaunch
//
// The policy logic is a template over the backend (graph type plus how to
// capture, update and launch it): CudaGraphBackend (Graph + GraphExec) on the
// GPU, a stand-in in the CPU tests. See docs/shape_router.md.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <functional>
#include <limits>
#include <mutex>
#include <optional>
#include <source_location>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "replay/capture_scope.hpp"
#include "replay/detail/reentry_guard.hpp"
#include "replay/detail/shape_router_keys.hpp"
#include "replay/device.hpp"
#include "replay/error.hpp"
#include "replay/graph.hpp"
#include "replay/graph_exec.hpp"
#include "replay/stream_ref.hpp"

namespace replay {

// ---------------------------------------------------------------------------
// Policies and options
// ---------------------------------------------------------------------------

enum class RoutingPolicy : ::std::uint8_t {
  exact,     // one graph per distinct key
  bucketed,  // each dimension rounded up to the next bucket; one graph per bucket shape
};

// What run() does with a key above the largest bucket (bucketed policy only).
enum class OversizePolicy : ::std::uint8_t {
  run_eager,    // issue the work eagerly with the key as given (counted in stats().oversize)
  throw_error,  // throw usage_error naming the key and the largest bucket
};

// Called once per key whose capture failed (the key runs eagerly from then
// on): the padded key and what went wrong. Must not call back into the router.
template <class Key>
using CaptureFailureHandler = ::std::function<void(const Key& shape, ::std::string_view reason)>;

template <class Key>
struct ShapeRouterOptions {
  static constexpr ::std::size_t unlimited = ::std::numeric_limits<::std::size_t>::max();

  RoutingPolicy policy = RoutingPolicy::exact;
  // Bucketed only: for each dimension of the key, the sizes to round up to,
  // strictly ascending and positive. A single list serves every dimension.
  ::std::vector<::std::vector<::std::int64_t>> buckets{};
  OversizePolicy oversize = OversizePolicy::run_eager;
  // Eager runs of a key before it is captured (lazy capture), e.g. to let
  // libraries pick algorithms and allocators reach their steady state.
  ::std::uint32_t warmup_runs = 0;
  // Most graphs alive at once; the least recently used is evicted beyond it.
  ::std::size_t max_graphs = unlimited;
  // Most bytes of graph footprint (GraphMemory::footprint_bytes summed over
  // live graphs); least recently used graphs are evicted beyond it.
  ::std::size_t max_bytes = unlimited;
  // Empty: one line on stderr per failed key.
  CaptureFailureHandler<Key> on_capture_failure{};

  static ShapeRouterOptions exact() { return {}; }
  // Buckets for a key of rank 1, or the same buckets for every dimension.
  static ShapeRouterOptions bucketed(::std::vector<::std::int64_t> sizes) {
    ShapeRouterOptions options;
    options.policy = RoutingPolicy::bucketed;
    options.buckets.push_back(::std::move(sizes));
    return options;
  }
  // One bucket list per dimension.
  static ShapeRouterOptions bucketed_per_dimension(::std::vector<::std::vector<::std::int64_t>> lists) {
    ShapeRouterOptions options;
    options.policy = RoutingPolicy::bucketed;
    options.buckets = ::std::move(lists);
    return options;
  }
};

// A bucket list 1, 2, 4, ... up to the first power of two >= `max` (max >= 1).
inline ::std::vector<::std::int64_t> power_of_two_buckets(::std::int64_t max,
                                                          ::std::source_location where = ::std::source_location::current()) {
  if (max <= 0 || max > (::std::numeric_limits<::std::int64_t>::max() >> 1)) {
    throw usage_error(detail::concat("power_of_two_buckets(): max must be in [1, 2^62], got ", max), where);
  }
  ::std::vector<::std::int64_t> out{1};
  while (out.back() < max) {
    out.push_back(out.back() * 2);
  }
  return out;
}
// A bucket list step, 2*step, ... up to the first multiple of `step` >= `max`
// (vLLM's capture sizes are 1, 2, 4 then stepped_buckets(8, 512)).
inline ::std::vector<::std::int64_t> stepped_buckets(::std::int64_t step, ::std::int64_t max,
                                                     ::std::source_location where = ::std::source_location::current()) {
  if (step <= 0 || max <= 0 || max > ::std::numeric_limits<::std::int64_t>::max() - step) {
    throw usage_error(detail::concat("stepped_buckets(): step and max must be positive, got step ", step, ", max ", max),
                      where);
  }
  ::std::vector<::std::int64_t> out{step};
  while (out.back() < max) {
    out.push_back(out.back() + step);
  }
  return out;
}

// ---------------------------------------------------------------------------
// Results, statistics, memory
// ---------------------------------------------------------------------------

enum class RouteKind : ::std::uint8_t {
  replayed,        // hit: the key's graph was launched
  captured,        // miss: captured now, then launched
  recaptured,      // the key was invalidated: re-captured, updated (or re-instantiated), launched
  warmup,          // eager warm-up run before capture
  eager_fallback,  // eager: the key's capture failed (now or earlier)
  eager_oversize,  // eager: the key is above the largest bucket
};

constexpr ::std::string_view to_string(RouteKind kind) noexcept {
  switch (kind) {
    case RouteKind::replayed: return "replayed";
    case RouteKind::captured: return "captured";
    case RouteKind::recaptured: return "recaptured";
    case RouteKind::warmup: return "warmup";
    case RouteKind::eager_fallback: return "eager_fallback";
    case RouteKind::eager_oversize: return "eager_oversize";
  }
  return "unknown";
}

// What run() did.
template <class Key>
struct Route {
  Key shape;       // the shape the work ran with: the padded key (the key itself when exact or oversize)
  RouteKind kind;  // how
  // True when a graph ran (as opposed to an eager issue of the work).
  constexpr bool graph() const noexcept {
    return kind == RouteKind::replayed || kind == RouteKind::captured || kind == RouteKind::recaptured;
  }
};

// Counters since construction or reset_stats(). Every run() is exactly one of
// a hit or a miss; a miss is a warm-up, a capture, a re-capture, or an eager
// fallback (failed key or oversize key).
struct RouterStats {
  ::std::uint64_t runs = 0;
  ::std::uint64_t hits = 0;
  ::std::uint64_t misses = 0;
  ::std::uint64_t warmups = 0;           // eager warm-up runs (in run() and capture_all())
  ::std::uint64_t captures = 0;          // new graphs (in run() and capture_all())
  ::std::uint64_t updates = 0;           // re-captures applied in place (cudaGraphExecUpdate)
  ::std::uint64_t reinstantiations = 0;  // re-captures that needed a new executable graph
  ::std::uint64_t evictions = 0;         // graphs dropped for max_graphs / max_bytes
  ::std::uint64_t capture_failures = 0;  // keys marked eager
  ::std::uint64_t eager_fallbacks = 0;   // runs issued eagerly because the key's capture failed
  ::std::uint64_t oversize = 0;          // runs issued eagerly because the key is above the largest bucket
  ::std::uint64_t real_elements = 0;     // sum over runs of the key's element count
  ::std::uint64_t padded_elements = 0;   // sum over runs of the padded shape's element count

  // Padding waste: (padded - real) / real; 0 when nothing was padded.
  double padding_waste() const noexcept {
    return real_elements == 0 ? 0.0
                              : static_cast<double>(padded_elements - real_elements) /
                                    static_cast<double>(real_elements);
  }
  double hit_rate() const noexcept {
    return runs == 0 ? 0.0 : static_cast<double>(hits) / static_cast<double>(runs);
  }
};

// Memory of one graph.
struct GraphMemory {
  // Bytes the graph's memory-allocation nodes (cudaMallocAsync during capture)
  // draw from the device's shared graph memory pool while it runs. Exact.
  ::std::size_t alloc_bytes = 0;
  // Device memory that instantiating and uploading the graph took (drop in
  // free device memory, cudaMemGetInfo): executable-graph storage plus any
  // growth of the shared pool this graph caused. Approximate (device-wide,
  // page-granular); 0 where not measured.
  ::std::size_t footprint_bytes = 0;
};

// The device's graph memory pool (cudaDeviceGetGraphMemAttribute), shared by
// every graph on the device.
struct GraphPoolMemory {
  ::std::size_t used = 0;           // cudaGraphMemAttrUsedMemCurrent
  ::std::size_t used_high = 0;      // cudaGraphMemAttrUsedMemHigh
  ::std::size_t reserved = 0;       // cudaGraphMemAttrReservedMemCurrent
  ::std::size_t reserved_high = 0;  // cudaGraphMemAttrReservedMemHigh
};

// Memory of a router's live graphs.
struct RouterMemory {
  ::std::size_t graphs = 0;
  ::std::size_t alloc_bytes_sum = 0;  // what separate pools would hold
  ::std::size_t alloc_bytes_max = 0;  // what the shared pool needs at least
  ::std::size_t footprint_bytes = 0;  // sum of GraphMemory::footprint_bytes (what max_bytes bounds)
  ::std::optional<GraphPoolMemory> pool;  // device-wide, where the backend can tell
};

template <class Key>
struct GraphInfo {
  Key shape;
  GraphMemory memory;
  ::std::uint64_t replays = 0;  // launches of this graph, the capturing run included
  bool stale = false;           // invalidated; re-captured on next use
};

// ---------------------------------------------------------------------------
// Backends: the graph type and how to capture, update and launch it
// ---------------------------------------------------------------------------

// What a backend's capture() returns.
template <class Exec>
struct CapturedGraph {
  Exec exec;
  GraphMemory memory;
};

// What a backend's recapture() did.
struct RecaptureResult {
  UpdatePath path = UpdatePath::in_place;
  GraphMemory memory;
};

namespace detail {
// Stands for the router's "issue this shape's work on a stream" callable in
// the GraphBackend concept; never defined.
template <class Stream>
struct IssueArchetype {
  void operator()(Stream) const;
};
}  // namespace detail

// A backend provides stream_type, exec_type and:
//   CapturedGraph<exec_type> capture(stream_type, Issue&& issue, source_location)
//       captures what issue(stream) issues and makes it launchable; throws on
//       any failure (the router then marks the key eager);
//   RecaptureResult recapture(exec_type&, stream_type, Issue&&, source_location)
//       captures anew and updates `exec` in place where possible, else
//       re-instantiates; throws on failure;
//   void launch(const exec_type&, stream_type, source_location)   (the hot path).
// Optional: GraphPoolMemory pool_memory(source_location) const.
template <class B>
concept GraphBackend =
    requires { typename B::stream_type; typename B::exec_type; } && ::std::movable<typename B::exec_type> &&
    ::std::copyable<typename B::stream_type> &&
    requires(B& backend, typename B::exec_type& exec, const typename B::exec_type& const_exec,
             typename B::stream_type stream, detail::IssueArchetype<typename B::stream_type>& issue,
             ::std::source_location where) {
      { backend.capture(stream, issue, where) } -> ::std::same_as<CapturedGraph<typename B::exec_type>>;
      { backend.recapture(exec, stream, issue, where) } -> ::std::same_as<RecaptureResult>;
      backend.launch(const_exec, stream, where);
    };

template <class B>
concept ReportsPoolMemory = requires(const B& backend, ::std::source_location where) {
  { backend.pool_memory(where) } -> ::std::same_as<GraphPoolMemory>;
};

// ---- graph memory helpers (CUDA) -------------------------------------------

// The device's graph memory pool counters.
inline GraphPoolMemory graph_pool_memory(int device,
                                         ::std::source_location where = ::std::source_location::current()) {
  auto read = [&](::cudaGraphMemAttributeType attr) {
    unsigned long long value = 0;  // cuuint64_t
    check(::cudaDeviceGetGraphMemAttribute(device, attr, &value), "cudaDeviceGetGraphMemAttribute", where);
    return static_cast<::std::size_t>(value);
  };
  GraphPoolMemory out;
  out.used = read(::cudaGraphMemAttrUsedMemCurrent);
  out.used_high = read(::cudaGraphMemAttrUsedMemHigh);
  out.reserved = read(::cudaGraphMemAttrReservedMemCurrent);
  out.reserved_high = read(::cudaGraphMemAttrReservedMemHigh);
  return out;
}

// Resets the used and reserved high watermarks to zero (the only value CUDA allows).
inline void reset_graph_pool_high_watermarks(int device,
                                             ::std::source_location where = ::std::source_location::current()) {
  unsigned long long zero = 0;
  check(::cudaDeviceSetGraphMemAttribute(device, ::cudaGraphMemAttrUsedMemHigh, &zero),
        "cudaDeviceSetGraphMemAttribute", where);
  zero = 0;
  check(::cudaDeviceSetGraphMemAttribute(device, ::cudaGraphMemAttrReservedMemHigh, &zero),
        "cudaDeviceSetGraphMemAttribute", where);
}

// Returns graph-pool memory that no executing or scheduled graph uses to the
// OS (cudaDeviceGraphMemTrim). Idle graphs re-map on their next launch.
inline void trim_graph_pool(int device, ::std::source_location where = ::std::source_location::current()) {
  check(::cudaDeviceGraphMemTrim(device), "cudaDeviceGraphMemTrim", where);
}

namespace detail {
// Free device memory in bytes (cudaMemGetInfo) on the current device.
inline ::std::size_t free_device_bytes(const ::std::source_location& where) {
  ::std::size_t free_bytes = 0;
  ::std::size_t total_bytes = 0;
  check(::cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo", where);
  return free_bytes;
}
}  // namespace detail

// Bytes requested by the memory-allocation nodes of `graph` (top level: stream
// capture puts them there).
inline ::std::size_t graph_alloc_bytes(const Graph& graph,
                                       ::std::source_location where = ::std::source_location::current()) {
  ::std::size_t bytes = 0;
  for (::cudaGraphNode_t node : graph.nodes(where)) {
    ::cudaGraphNodeType type{};
    check(::cudaGraphNodeGetType(node, &type), "cudaGraphNodeGetType", where);
    if (type == ::cudaGraphNodeTypeMemAlloc) {
      ::cudaMemAllocNodeParams params{};
      check(::cudaGraphMemAllocNodeGetParams(node, &params), "cudaGraphMemAllocNodeGetParams", where);
      bytes += params.bytesize;
    }
  }
  return bytes;
}

// The GPU backend: stream capture into a Graph, instantiated as a GraphExec.
// Allocations the captured work makes with cudaMallocAsync/cudaFreeAsync
// become graph memory nodes, served from the device's graph memory pool, which
// all graphs launched into the same stream share (see docs/shape_router.md).
class CudaGraphBackend {
 public:
  using stream_type = StreamRef;
  using exec_type = GraphExec;

  // `flags` for every instantiation; with InstantiateFlags::upload (the
  // default) each new or re-instantiated graph is uploaded on the capturing
  // stream, so its first launch pays no upload and its pool memory is mapped
  // when it is captured, not in the serving path.
  explicit CudaGraphBackend(CaptureMode mode = CaptureMode::this_thread,
                            InstantiateFlags flags = InstantiateFlags::upload) noexcept
      : mode_(mode),
        upload_(has_flag(flags, InstantiateFlags::upload)),
        // Uploads are issued explicitly on the capturing stream (see upload_),
        // never on the stream a GraphExec remembers from its construction.
        flags_(flags & ~InstantiateFlags::upload) {}

  CaptureMode capture_mode() const noexcept { return mode_; }
  InstantiateFlags instantiate_flags() const noexcept {
    return upload_ ? flags_ | InstantiateFlags::upload : flags_;
  }

  template <class Issue>
    requires ::std::invocable<Issue&, StreamRef>
  CapturedGraph<GraphExec> capture(StreamRef stream, Issue&& issue,
                                   ::std::source_location where = ::std::source_location::current()) const {
    Graph graph = replay::capture(stream, issue, mode_, where);
    GraphMemory memory;
    memory.alloc_bytes = graph_alloc_bytes(graph, where);
    const ::std::size_t free_before = detail::free_device_bytes(where);
    GraphExec exec(graph, flags_, stream, where);
    if (upload_) {
      exec.upload(stream, where);
    }
    memory.footprint_bytes = drop(free_before, detail::free_device_bytes(where));
    return CapturedGraph<GraphExec>{::std::move(exec), memory};
  }

  // Captures anew and goes through GraphExec::update: cudaGraphExecUpdate in
  // place (same topology, new pointers or parameters), re-instantiation when
  // CUDA refuses. An update in place is safe while earlier launches still run
  // (they keep the old parameters); a replaced executable graph is freed by
  // CUDA once its launches finish.
  template <class Issue>
    requires ::std::invocable<Issue&, StreamRef>
  RecaptureResult recapture(GraphExec& exec, StreamRef stream, Issue&& issue,
                            ::std::source_location where = ::std::source_location::current()) const {
    Graph graph = replay::capture(stream, issue, mode_, where);
    RecaptureResult result;
    result.memory.alloc_bytes = graph_alloc_bytes(graph, where);
    const ::std::size_t free_before = detail::free_device_bytes(where);
    try {
      result.path = exec.update(graph, stream, where).path;
    } catch (const cuda_error& e) {
      // Some node kinds (e.g. memory nodes on some drivers) are refused with
      // an error status rather than cudaErrorGraphExecUpdateFailure: that is
      // still a refusal, so re-instantiate; a real error recurs right here.
      if (e.is_capture_error()) {
        throw;
      }
      (void)::cudaGetLastError();
      exec = GraphExec(graph, flags_, stream, where);
      result.path = UpdatePath::reinstantiated;
    }
    if (upload_ && result.path == UpdatePath::reinstantiated) {
      exec.upload(stream, where);
    }
    result.memory.footprint_bytes = drop(free_before, detail::free_device_bytes(where));
    return result;
  }

  void launch(const GraphExec& exec, StreamRef stream,
              ::std::source_location where = ::std::source_location::current()) const {
    exec.launch(stream, where);
  }

  GraphPoolMemory pool_memory(::std::source_location where = ::std::source_location::current()) const {
    return graph_pool_memory(current_device(where), where);
  }

 private:
  static ::std::size_t drop(::std::size_t before, ::std::size_t after) noexcept {
    return before > after ? before - after : 0;
  }

  CaptureMode mode_;
  bool upload_;
  InstantiateFlags flags_;
};

static_assert(GraphBackend<CudaGraphBackend>);
static_assert(ReportsPoolMemory<CudaGraphBackend>);

namespace detail {

// The router whose lock this thread holds (to refuse re-entry from the work
// callable, which would deadlock). One slot for routers of every type.
struct ShapeRouterKind {};
using ActiveRouterScope = ReentryGuard<ShapeRouterKind>;

inline ::std::string describe_current_exception() {
  try {
    throw;
  } catch (const ::std::exception& e) {
    return e.what();
  } catch (...) {
    return "an exception not derived from std::exception";
  }
}

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
        on_capture_failure_(options_.on_capture_failure) {
    if (!work_) {
      throw usage_error("ShapeRouter: the work callable is empty", where);
    }
    validate(where);
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
    return plan(key, where).shape;
  }

  // True when `key` is above the largest bucket in some dimension.
  bool is_oversize(const Key& key, ::std::source_location where = ::std::source_location::current()) const {
    check_extents(key, where);
    return options_.policy == RoutingPolicy::bucketed && oversize_dimension(key) != no_dimension;
  }

  // Issues the work for `key` on `stream`: launches the padded shape's graph
  // (a hit), or warms up, captures, re-captures or runs eagerly (a miss).
  // Capture failures never escape: the key is marked eager, the handler is
  // told once, and this and later runs issue the work eagerly. Exceptions from
  // the work itself when run eagerly, and launch errors, do propagate.
  Route<Key> run(const Key& key, stream_type stream,
                 ::std::source_location where = ::std::source_location::current()) {
    refuse_reentry(where);
    const Planned planned = plan(key, where);
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
      const Planned planned = plan(key, where);
      if (!planned.oversize && ::std::find(shapes.begin(), shapes.end(), planned.shape) == shapes.end()) {
        shapes.push_back(planned.shape);
      }
    }
    sort_largest_first(shapes);
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
    const Planned planned = plan(key, where);
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
    const Planned planned = plan(key, where);
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
    const Planned planned = plan(key, where);
    ::std::lock_guard<::std::mutex> lock(mutex_);
    const auto it = entries_.find(planned.shape);
    return it != entries_.end() && it->second.exec.has_value();
  }
  // True when `key`'s padded shape is marked eager after a failed capture.
  bool is_eager(const Key& key, ::std::source_location where = ::std::source_location::current()) const {
    refuse_reentry(where);
    const Planned planned = plan(key, where);
    ::std::lock_guard<::std::mutex> lock(mutex_);
    const auto it = entries_.find(planned.shape);
    return it != entries_.end() && it->second.state == State::eager_only;
  }

  ::std::size_t graph_count(::std::source_location where = ::std::source_location::current()) const {
    refuse_reentry(where);
    ::std::lock_guard<::std::mutex> lock(mutex_);
    return live_graphs_;
  }

  // The live graphs, most recently used first.
  ::std::vector<GraphInfo<Key>> graphs(::std::source_location where = ::std::source_location::current()) const {
    refuse_reentry(where);
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

  RouterStats stats(::std::source_location where = ::std::source_location::current()) const {
    refuse_reentry(where);
    ::std::lock_guard<::std::mutex> lock(mutex_);
    return stats_;
  }
  void reset_stats(::std::source_location where = ::std::source_location::current()) {
    refuse_reentry(where);
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

  // The options given at construction (on_capture_failure as given there).
  const options_type& options() const noexcept { return options_; }
  RoutingPolicy policy() const noexcept { return options_.policy; }
  // Bucket list of dimension `dim` (bucketed); empty with the exact policy.
  ::std::span<const ::std::int64_t> buckets(::std::size_t dim = 0) const noexcept {
    if (options_.buckets.empty()) {
      return {};
    }
    return options_.buckets.size() == 1 ? options_.buckets[0] : options_.buckets[dim];
  }

  // Bucketed: every bucket shape (cartesian product of the lists), largest first.
  ::std::vector<Key> bucket_shapes() const {
    ::std::vector<Key> out;
    if constexpr (ShapeKey<Key>) {
      if (options_.policy != RoutingPolicy::bucketed) {
        return out;
      }
      static_assert(::std::default_initializable<Key>, "bucket_shapes() builds keys: the key type must be "
                                                       "default-constructible");
      constexpr ::std::size_t rank = shape_traits<Key>::rank;
      ::std::array<::std::size_t, rank> index{};
      for (;;) {
        Key shape{};
        for (::std::size_t d = 0; d < rank; ++d) {
          shape_traits<Key>::set_extent(shape, d, buckets(d)[index[d]]);
        }
        out.push_back(shape);
        ::std::size_t d = 0;
        for (; d < rank; ++d) {
          if (++index[d] < buckets(d).size()) {
            break;
          }
          index[d] = 0;
        }
        if (d == rank) {
          break;
        }
      }
      sort_largest_first(out);
    }
    return out;
  }

  // The backend (e.g. to read its settings). Not synchronized: do not change
  // it while another thread uses the router.
  Backend& backend() noexcept { return backend_; }
  const Backend& backend() const noexcept { return backend_; }

 private:
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
  struct Planned {
    Key shape;
    bool oversize = false;
  };
  static constexpr ::std::size_t no_dimension = ::std::numeric_limits<::std::size_t>::max();

  void validate(const ::std::source_location& where) {
    if (options_.max_graphs == 0) {
      throw usage_error("ShapeRouter: max_graphs is 0; it must allow at least one graph (leave it at "
                        "ShapeRouterOptions::unlimited for no limit)",
                        where);
    }
    if (options_.max_bytes == 0) {
      throw usage_error("ShapeRouter: max_bytes is 0; leave it at ShapeRouterOptions::unlimited for no limit", where);
    }
    if (options_.policy == RoutingPolicy::exact) {
      if (!options_.buckets.empty()) {
        throw usage_error("ShapeRouter: bucket lists were given but the policy is RoutingPolicy::exact; set "
                          ".policy = RoutingPolicy::bucketed (or use ShapeRouterOptions::bucketed())",
                          where);
      }
      return;
    }
    if constexpr (!ShapeKey<Key>) {
      throw usage_error("ShapeRouter: RoutingPolicy::bucketed needs a shape key (an integer, std::array, "
                        "std::tuple or std::pair of integers, or a type with a replay::shape_traits "
                        "specialization)",
                        where);
    } else {
      constexpr ::std::size_t rank = shape_traits<Key>::rank;
      if (options_.buckets.empty()) {
        throw usage_error("ShapeRouter: RoutingPolicy::bucketed with no bucket list; give one sorted list "
                          "of sizes (or one per dimension)",
                          where);
      }
      if (options_.buckets.size() != 1 && options_.buckets.size() != rank) {
        throw usage_error(detail::concat("ShapeRouter: ", options_.buckets.size(), " bucket lists for a key of rank ",
                                         rank, "; give one list per dimension, or one list for all"),
                          where);
      }
      for (::std::size_t d = 0; d < options_.buckets.size(); ++d) {
        const auto& list = options_.buckets[d];
        const ::std::string dim = options_.buckets.size() == 1
                                      ? ::std::string("the bucket list")
                                      : detail::concat("the bucket list of dimension ", d);
        if (list.empty()) {
          throw usage_error(detail::concat("ShapeRouter: ", dim, " is empty; give at least one size"), where);
        }
        for (::std::size_t i = 0; i < list.size(); ++i) {
          if (list[i] <= 0) {
            throw usage_error(detail::concat("ShapeRouter: ", dim, " holds ", list[i], "; bucket sizes must be positive"),
                              where);
          }
          const ::std::size_t checked_dim = options_.buckets.size() == 1 ? 0 : d;
          for (::std::size_t k = 0; k < rank; ++k) {
            if ((options_.buckets.size() == 1 || k == checked_dim) && list[i] > detail::max_extent<Key>(k)) {
              throw usage_error(detail::concat("ShapeRouter: ", dim, " holds ", list[i],
                                               ", which does not fit the key's type (max ",
                                               detail::max_extent<Key>(k), ")"),
                                where);
            }
          }
          if (i > 0 && list[i] == list[i - 1]) {
            throw usage_error(detail::concat("ShapeRouter: ", dim, " holds ", list[i],
                                             " twice; bucket sizes must be distinct"),
                              where);
          }
          if (i > 0 && list[i] < list[i - 1]) {
            throw usage_error(detail::concat("ShapeRouter: ", dim, " is not sorted (", list[i - 1], " comes before ",
                                             list[i], "); give the sizes in ascending order"),
                              where);
          }
        }
      }
    }
  }

  void check_extents(const Key& key, const ::std::source_location& where) const {
    if constexpr (ShapeKey<Key>) {
      for (::std::size_t d = 0; d < shape_traits<Key>::rank; ++d) {
        if (shape_traits<Key>::extent(key, d) <= 0) [[unlikely]] {
          throw_bad_extent(key, d, where);
        }
      }
    }
  }

  // Out of line: message building stays off the hot path.
  [[noreturn, gnu::cold, gnu::noinline]] static void throw_bad_extent(const Key& key, ::std::size_t d,
                                                                     const ::std::source_location& where) {
    if constexpr (ShapeKey<Key>) {
      throw usage_error(detail::concat("ShapeRouter: key ", detail::describe_key(key), " has a ",
                                       shape_traits<Key>::extent(key, d) == 0 ? "zero" : "negative", " dimension (",
                                       d, "); every dimension must be positive"),
                        where);
    } else {
      throw usage_error("ShapeRouter: bad key", where);
    }
  }
  [[noreturn, gnu::cold, gnu::noinline]] static void throw_oversize(const Key& key, ::std::size_t d,
                                                                   ::std::int64_t largest,
                                                                   const ::std::source_location& where) {
    throw usage_error(detail::concat("ShapeRouter: key ", detail::describe_key(key), " is above the largest bucket (",
                                     largest, ") in dimension ", d,
                                     "; add a larger bucket or set OversizePolicy::run_eager"),
                      where);
  }

  ::std::size_t oversize_dimension(const Key& key) const noexcept {
    if constexpr (ShapeKey<Key>) {
      for (::std::size_t d = 0; d < shape_traits<Key>::rank; ++d) {
        if (shape_traits<Key>::extent(key, d) > buckets(d).back()) {
          return d;
        }
      }
    }
    return no_dimension;
  }

  Planned plan(const Key& key, const ::std::source_location& where) const {
    check_extents(key, where);
    if (options_.policy == RoutingPolicy::exact) {
      return Planned{key, false};
    }
    if constexpr (ShapeKey<Key>) {
      Planned out{key, false};
      for (::std::size_t d = 0; d < shape_traits<Key>::rank; ++d) {
        const auto list = buckets(d);
        const ::std::int64_t extent = shape_traits<Key>::extent(key, d);
        const auto it = ::std::lower_bound(list.begin(), list.end(), extent);
        if (it == list.end()) [[unlikely]] {
          if (options_.oversize == OversizePolicy::throw_error) {
            throw_oversize(key, d, list.back(), where);
          }
          return Planned{key, true};
        }
        shape_traits<Key>::set_extent(out.shape, d, *it);
      }
      return out;
    } else {
      return Planned{key, false};  // unreachable: validate() refused bucketing a non-shape key
    }
  }

  void refuse_reentry(const ::std::source_location& where) const {
    if (detail::ActiveRouterScope::inside(this)) [[unlikely]] {
      throw usage_error("ShapeRouter called from inside its own work callable (or failure handler); that "
                        "would deadlock. Issue nested work directly on the stream",
                        where);
    }
  }

  static void sort_largest_first(::std::vector<Key>& shapes) {
    if constexpr (ShapeKey<Key>) {
      ::std::stable_sort(shapes.begin(), shapes.end(), [](const Key& a, const Key& b) {
        const auto ea = detail::element_count(a);
        const auto eb = detail::element_count(b);
        if (ea != eb) {
          return ea > eb;
        }
        for (::std::size_t d = 0; d < shape_traits<Key>::rank; ++d) {
          const auto xa = shape_traits<Key>::extent(a, d);
          const auto xb = shape_traits<Key>::extent(b, d);
          if (xa != xb) {
            return xa > xb;
          }
        }
        return false;
      });
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
  CaptureFailureHandler<Key> on_capture_failure_;  // options_ stays immutable: padded_shape() reads it unlocked
  mutable ::std::mutex mutex_;
  detail::key_map<Key, Entry> entries_;
  ::std::size_t live_graphs_ = 0;
  ::std::size_t total_bytes_ = 0;
  ::std::uint64_t tick_ = 0;
  RouterStats stats_;
};

}  // namespace replay
