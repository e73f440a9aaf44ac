#pragma once
// ShapeRouter's options: the routing and oversize policies, the capture-failure
// handler, ShapeRouterOptions, and bucket-list builders.
#include <replay/detail/require_cxx20.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <source_location>
#include <string_view>
#include <utility>
#include <vector>

#include "replay/audit_switch.hpp"
#include "replay/detail/message.hpp"
#include "replay/error.hpp"

namespace replay {

enum class RoutingPolicy : ::std::uint8_t {
  exact,     // one graph per distinct key
  bucketed,  // each dimension rounded up to the next bucket; one graph per bucket shape
};

// What run() does with a key above the largest bucket (bucketed policy only).
enum class OversizePolicy : ::std::uint8_t {
  run_eager,    // issue the work eagerly with the key as given (counted in stats().oversize)
  throw_error,  // throw usage_error naming the key and the largest bucket
};

// Which streams may run a router outside a lease (ShapeRouterOptions::stream_sharing).
// A router's graphs share the input and output buffers they were captured
// with; the router orders what it issues, but not the copies the caller
// issues into and out of those buffers around run().
enum class StreamSharing : ::std::uint8_t {
  // Outside a lease, the router runs on one stream: the first stream that
  // runs it outside a lease (run() binds it; capture() and capture_all() do
  // not). Outside a lease, run(), and the warm-ups of capture() and
  // capture_all(), on any other stream throw usage_error naming both
  // streams: with the caller's copies on two streams the requests would
  // silently mix. A lease (router.lease(stream)) may be taken on any stream at
  // any time, and runs inside it on its stream are never refused; two threads
  // on two streams hold a lease each around staging, run() and the reads, or
  // use one router per stream.
  lease_required,
  // Any stream may run the router outside a lease: it orders what it issues
  // (launches and eager work) across streams, and the caller orders its own
  // copies into and out of the shared buffers (whole calls under a lock of
  // its own, as GraphedCallable does, or one stream at a time).
  caller_ordered,
};

// What a capture of a key whose work declares a break (calls replay::eager)
// becomes (ShapeRouterOptions::breaks).
enum class BreakPolicy : ::std::uint8_t {
  // Its capture fails: the key runs eagerly, with the reason (the regions run in place).
  eager,
  // The key is captured with capture_piecewise and replayed as graph segments
  // and eager regions (the backend must capture piecewise: CudaGraphBackend
  // does). A break that is not declared (a stray synchronization, a call
  // that refuses capture) still makes the key eager.
  piecewise,
};

// Called once per key whose capture failed (the key runs eagerly from then
// on): the padded key and what went wrong. Must not call back into the router.
template <class Key>
using CaptureFailureHandler = ::std::function<void(const Key& shape, ::std::string_view reason)>;

// Told after each shape of capture() / capture_all(): how many of the `total`
// distinct shapes are done (captured, failed or skipped) and which one just was.
template <class Key>
using CaptureProgress = ::std::function<void(::std::size_t done, ::std::size_t total, const Key& shape)>;

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
  // Most keys the router keeps state for (graphs, warm-up counts, eager
  // marks). Beyond it the least recently used key is forgotten (its graph
  // evicted; a key hit since its last miss gets a second chance first), so
  // keys from an open domain cost bounded memory and a miss costs the same
  // however many keys were ever seen.
  ::std::size_t max_entries = 65536;
  // Attempts per capture when a capture is interrupted by something outside
  // the work (another thread invalidated it, out of memory while
  // instantiating; the backend throws capture_interrupted_error). Between
  // attempts the capturing thread sleeps retry_backoff, doubled each time.
  // When every attempt of a round is interrupted the key runs eagerly and is
  // tried again after a cool-down (retry_backoff, doubled per failed round,
  // at most 1024 times it); after 8 such rounds in a row the key is marked
  // eager. capture() and capture_all() run those rounds themselves, the
  // cool-downs slept out, so each shape has its verdict when they return. A
  // capture that fails on its own work is never retried: the key is marked
  // eager, once, with the reason.
  ::std::uint32_t capture_attempts = 3;
  ::std::chrono::microseconds retry_backoff{1000};
  // Threads capture() / capture_all() use: each captures and instantiates
  // whole shapes, in parallel (the CUDA backend captures each on a stream of
  // its own; warm-ups go to the caller's stream from every thread). 1 (the
  // default): the calling thread alone, which was the faster on an H200 for
  // kernel-only work (docs/shape_router.md, "At start"); measure before
  // raising it. The work callable must then be safe to capture from several
  // threads at once.
  ::std::uint32_t capture_threads = 1;
  // Which streams may run the router outside a lease (see StreamSharing).
  StreamSharing stream_sharing = StreamSharing::lease_required;
  // What a key whose work declares a break (replay::eager) becomes: eager
  // (the default), or piecewise (see BreakPolicy, docs/shape_router.md).
  BreakPolicy breaks = BreakPolicy::eager;
  // Audits the router's captures (replay/audit.hpp and replay::audit in the
  // program): a failed capture's reason, given to on_capture_failure, then
  // names the call that broke it, its thread and its source line. By
  // default it follows the environment variable REPLAY_AUDIT.
  AuditSwitch audit = AuditSwitch::from_environment;

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

}  // namespace replay
