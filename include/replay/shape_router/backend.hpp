#pragma once
// The GraphBackend concept: the graph type ShapeRouter keeps per key and how
// to capture, update and launch it (CudaGraphBackend on the GPU, a stand-in
// in the CPU tests), and what capture() / recapture() return.
#include <replay/detail/require_cxx20.hpp>

#include <concepts>
#include <source_location>

#include "replay/graph_exec.hpp"
#include "replay/shape_router/stats.hpp"

namespace replay {

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

}  // namespace replay
