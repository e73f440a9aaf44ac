#pragma once
// What ShapeRouter reports: the route a run took (RouteKind, Route), its
// counters (RouterStats), and the memory of its graphs (GraphMemory,
// GraphPoolMemory, RouterMemory, GraphInfo).
#include <replay/detail/require_cxx20.hpp>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace replay {

enum class RouteKind : ::std::uint8_t {
  replayed,        // hit: the key's graph was launched
  captured,        // miss: captured now, then launched
  recaptured,      // the key was invalidated: re-captured, updated (or re-instantiated), launched
  warmup,          // eager warm-up run before capture
  eager_fallback,  // eager: the key's capture failed (now or earlier)
  eager_oversize,  // eager: the key is above the largest bucket
  eager_busy,      // eager: another thread is capturing this key right now, or its capture
                   // was interrupted and it waits out a cool-down before the next attempt
};

constexpr ::std::string_view to_string(RouteKind kind) noexcept {
  switch (kind) {
    case RouteKind::replayed: return "replayed";
    case RouteKind::captured: return "captured";
    case RouteKind::recaptured: return "recaptured";
    case RouteKind::warmup: return "warmup";
    case RouteKind::eager_fallback: return "eager_fallback";
    case RouteKind::eager_oversize: return "eager_oversize";
    case RouteKind::eager_busy: return "eager_busy";
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
// run (failed key, oversize key, or a key busy being captured by another thread).
struct RouterStats {
  ::std::uint64_t runs = 0;
  ::std::uint64_t hits = 0;
  ::std::uint64_t misses = 0;
  ::std::uint64_t warmups = 0;           // eager warm-up runs (in run() and capture_all())
  ::std::uint64_t captures = 0;          // new graphs (in run() and capture_all()), piecewise ones included
  // Of those, the ones captured piecewise (BreakPolicy::piecewise).
  ::std::uint64_t piecewise_captures = 0;
  ::std::uint64_t updates = 0;           // re-captures applied in place (cudaGraphExecUpdate)
  ::std::uint64_t reinstantiations = 0;  // re-captures that needed a new executable graph
  ::std::uint64_t evictions = 0;         // graphs dropped for max_graphs / max_bytes
  ::std::uint64_t capture_failures = 0;  // keys marked eager (a capture failed on its own work)
  ::std::uint64_t interrupted_captures = 0;  // capture attempts interrupted from outside the work
  ::std::uint64_t capture_retries = 0;       // capture attempts after an interrupted one
  ::std::uint64_t entry_evictions = 0;       // keys forgotten for max_entries
  ::std::uint64_t stream_switches = 0;       // runs ordered after the previous run's stream
  ::std::uint64_t eager_fallbacks = 0;   // runs issued eagerly because the key's capture failed
  ::std::uint64_t eager_busy = 0;        // runs issued eagerly while the key was being captured elsewhere
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
  // Device memory this graph added where it lives: for CudaGraphBackend the
  // growth of the stream's device graph memory pool (reserved bytes) while it
  // was instantiated and uploaded; for TorchGraphBackend the growth of the
  // private pool's segments while it was captured (with a graph wrapper,
  // plus the device graph pool's growth while the wrapper's graph was
  // instantiated and uploaded). Not device-wide free
  // memory: other threads' allocations are not charged to it. 0 when the
  // graph fitted in what the pool already held, or where not measured.
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

// How a key is served (ShapeRouter::entry_info, entries()).
enum class RouterEntryKind : ::std::uint8_t {
  pending,    // no verdict yet: warming up, waiting for its capture, being captured, or evicted
  whole,      // one graph
  piecewise,  // graph segments and eager regions (its work declares breaks; BreakPolicy::piecewise)
  eager,      // runs eagerly: its capture failed (reason), or it is above the largest bucket
};

// The kind's name, as spelled in the enum.
constexpr ::std::string_view to_string(RouterEntryKind kind) noexcept {
  switch (kind) {
    case RouterEntryKind::pending: return "pending";
    case RouterEntryKind::whole: return "whole";
    case RouterEntryKind::piecewise: return "piecewise";
    case RouterEntryKind::eager: return "eager";
  }
  return "unknown";
}

// One key of a router, and how it is served.
template <class Key>
struct RouterEntryInfo {
  // The padded shape.
  Key shape;
  // How it is served.
  RouterEntryKind kind = RouterEntryKind::pending;
  // Piecewise: segments of the path captured first (empty ones included) and
  // the names of its regions, in order.
  ::std::size_t segments = 0;
  // Piecewise: the names of the regions on that path, in order.
  ::std::vector<::std::string> regions;
  // Eager: why (the capture failure, or oversize).
  ::std::string reason;
  // Whole or piecewise: its memory, as counted against max_bytes.
  GraphMemory memory;
  // Launches of its graph, the capturing run included.
  ::std::uint64_t replays = 0;
  // Invalidated: re-captured on its next run.
  bool stale = false;
};

template <class Key>
struct GraphInfo {
  Key shape;
  GraphMemory memory;
  ::std::uint64_t replays = 0;  // launches of this graph, the capturing run included
  bool stale = false;           // invalidated; re-captured on next use
};

}  // namespace replay
