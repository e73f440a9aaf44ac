#pragma once
// The GraphBackend concept: the graph type ShapeRouter keeps per key and how
// to capture, update and launch it (CudaGraphBackend on the GPU, a stand-in
// in the CPU tests), and what capture() / recapture() return.
#include <replay/detail/require_cxx20.hpp>

#include <concepts>
#include <cstddef>
#include <source_location>
#include <stdexcept>
#include <string>
#include <vector>

#include "replay/graph_exec.hpp"
#include "replay/shape_router/stats.hpp"

namespace replay {

// What a backend's capture() returns.
template <class Exec>
struct CapturedGraph {
  Exec exec;
  GraphMemory memory;
};

// What a backend's capture_piecewise() returns: the executable of graph
// segments and eager regions, its memory, and the path its capture took.
template <class Pieces>
struct CapturedPieces {
  // The executable (it ran the work once).
  Pieces exec;
  // Its memory, as the router counts it against max_bytes.
  GraphMemory memory;
  // Segments of the path captured (empty ones included).
  ::std::size_t segments = 0;
  // The names of the regions on that path, in order.
  ::std::vector<::std::string> regions;
};

// What a backend's recapture() did.
struct RecaptureResult {
  UpdatePath path = UpdatePath::in_place;
  GraphMemory memory;
};

// Thrown by a backend's capture() / recapture() when the capture failed for
// a reason outside the captured work: another thread invalidated it, memory
// ran out while instantiating. ShapeRouter retries it (capture_attempts, with
// back-off) and never marks the key eager for it. Any other exception means
// the work itself cannot be captured: the key is marked eager, once.
class capture_interrupted_error : public ::std::runtime_error {
 public:
  explicit capture_interrupted_error(const ::std::string& what) : ::std::runtime_error(what) {}
};

namespace detail {
// Stands for the router's "issue this shape's work on a stream" callable in
// the GraphBackend concept; never defined.
template <class Stream>
struct IssueArchetype {
  void operator()(Stream) const;
};
// The same, for a callable the backend keeps (a piecewise executable runs it
// again after a miss): copyable.
template <class Stream>
struct KeptIssueArchetype {
  void operator()(Stream) const;
};
}  // namespace detail

// A backend provides stream_type, exec_type and:
//   CapturedGraph<exec_type> capture(stream_type, Issue&& issue, source_location)
//       captures what issue(s) issues (on `stream` or a stream of the
//       backend's own) and makes it launchable; throws on any failure:
//       capture_interrupted_error when the cause was outside the work (the
//       router retries), anything else when the work cannot be captured (the
//       router marks the key eager);
//   RecaptureResult recapture(exec_type&, stream_type, Issue&&, source_location)
//       captures anew and updates `exec` in place where possible, else
//       re-instantiates; throws on failure;
//   void launch(const exec_type&, stream_type, source_location)   (the hot path).
// Captures run outside the router's lock, possibly several at once on
// different threads; launch() may be called from several threads at once
// for different graphs (a graph's own launches and recapture are serialized
// by the router).
// Optional: GraphPoolMemory pool_memory(source_location) const;
//   stream ordering (concept OrdersStreams; without it, the router refuses a
//   run on a second stream):
//     void mark(stream_type s, source_location): records the router's order
//         point after the work issued on `s` so far (cudaEventRecord). Called
//         by the thread that issued that work, while `s` is surely alive, and
//         from several threads at once on the same stream;
//     void wait_mark(stream_type to, source_location): makes later work on
//         `to` wait for the latest mark (cudaStreamWaitEvent);
//     void drain(stream_type to, source_location): makes later work on `to`
//         wait for everything the router issued on any stream, without naming
//         those streams (they may be gone): a device-wide synchronization.
//         Used once, at the first stream switch of a router whose runs were
//         not marked (a router used from one stream marks nothing, so that
//         its hits pay no event record);
//   void trim(source_location) noexcept: gives memory of evicted graphs back;
//   piecewise capture (concept CapturesPiecewise; ShapeRouterOptions::breaks =
//   BreakPolicy::piecewise needs it):
//     using piecewise_type (movable): graph segments and eager regions;
//     CapturedPieces<piecewise_type> capture_piecewise(stream_type, Issue, source_location)
//         captures issue(s) piecewise. Unlike capture(), this runs the work
//         once, in `stream`'s order (work issued on `stream` later runs after
//         it): the router counts it as the run. `issue` is kept by the result
//         (run again after a region returns a value never seen) and refers
//         to the router, which outlives it. Called inside a submission on `stream`;
//     void launch_piecewise(piecewise_type&, stream_type, source_location)
//         replays it; it orders streams and serializes its own launches.
// A capture() whose work declares a break (replay::eager inside a capture
// that makes one graph) throws region_in_capture_error from the work: the
// router then captures the key piecewise, under that policy.
template <class B>
concept GraphBackend =
    requires { typename B::stream_type; typename B::exec_type; } && ::std::movable<typename B::exec_type> &&
    ::std::copyable<typename B::stream_type> && ::std::equality_comparable<typename B::stream_type> &&
    requires(B& backend, typename B::exec_type& exec, const typename B::exec_type& const_exec,
             typename B::stream_type stream, detail::IssueArchetype<typename B::stream_type>& issue,
             ::std::source_location where) {
      { backend.capture(stream, issue, where) } -> ::std::same_as<CapturedGraph<typename B::exec_type>>;
      { backend.recapture(exec, stream, issue, where) } -> ::std::same_as<RecaptureResult>;
      backend.launch(const_exec, stream, where);
    };

template <class B>
concept OrdersStreams = requires(B& backend, typename B::stream_type stream, ::std::source_location where) {
  backend.mark(stream, where);
  backend.wait_mark(stream, where);
  backend.drain(stream, where);
};

template <class B>
concept CapturesPiecewise =
    requires { typename B::piecewise_type; } && ::std::movable<typename B::piecewise_type> &&
    requires(B& backend, typename B::piecewise_type& pieces, typename B::stream_type stream,
             detail::KeptIssueArchetype<typename B::stream_type> issue, ::std::source_location where) {
      { backend.capture_piecewise(stream, issue, where) } -> ::std::same_as<CapturedPieces<typename B::piecewise_type>>;
      backend.launch_piecewise(pieces, stream, where);
    };

template <class B>
concept TrimsMemory = requires(B& backend, ::std::source_location where) {
  { backend.trim(where) } noexcept;
};

template <class B>
concept ReportsPoolMemory = requires(const B& backend, ::std::source_location where) {
  { backend.pool_memory(where) } -> ::std::same_as<GraphPoolMemory>;
};

}  // namespace replay
