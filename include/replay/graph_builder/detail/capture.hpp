#pragma once
#include <replay/detail/require_cxx20.hpp>
// GraphBuilder::capture: capturing a stream's work straight into a graph or a
// conditional body; included by graph_builder/builder.hpp.
#include <cuda_runtime_api.h>

#include <concepts>
#include <functional>
#include <source_location>
#include <string>
#include <vector>

#include "replay/capture_scope.hpp"
#include "replay/graph_builder/detail/borrowed_capture.hpp"
#include "replay/detail/capture_state.hpp"
#include "replay/graph_builder/detail/nodes.hpp"
#include "replay/error.hpp"
#include "replay/detail/signature_checks.hpp"
#include "replay/graph_builder/builder.hpp"
#include "replay/graph_builder/node.hpp"
#include "replay/stream_ref.hpp"

namespace replay {

template <class Work>
::std::vector<Node> GraphBuilder::capture(StreamRef stream, Work&& work, const Deps& deps, CaptureMode mode,
                                          ::std::source_location where) {
  detail::check_capture_work<Work>();
  deps.validate("capture", where);
  const auto before = GraphRef(handle(where)).nodes(where);
  {
    detail::BorrowedCapture scope(stream.get(), graph_, deps, mode, where);
    try {
      ::std::invoke(work, stream);
    } catch (...) {
      ::cudaGraph_t ignored = nullptr;
      if (scope.end(ignored) != ::cudaSuccess || is_capture_error(::cudaPeekAtLastError())) {
        (void)::cudaGetLastError();  // the capture's own failure; the exception says what happened
      }
      remove_new_nodes(before);
      throw;
    }
    ::cudaGraph_t captured = nullptr;
    const ::cudaError_t status = scope.end(captured);
    if (status != ::cudaSuccess) {
      (void)::cudaGetLastError();
      remove_new_nodes(before);
      const detail::CaptureBreak& broken = scope.broken();
      throw cuda_error(status, "cudaStreamEndCapture", where,
                       broken.seen ? "the capture into the graph was broken by " + broken.api + " at " +
                                         replay::to_string(broken.where)
                                   : ::std::string("the capture into the graph was broken"));
    }
  }
  ::std::vector<::cudaGraphNode_t> added = new_nodes(before, where);
  if (body_) {
    if (::cudaGraphNode_t bad = detail::find_node(
            added, [](NodeType t) { return !detail::allowed_in_conditional_body(t); }, where)) {
      const ::std::string name = describe_node(bad);
      remove_new_nodes(before);
      throw usage_error(::std::string("capture: ") + detail::conditional_body_rule + "; the capture made a " + name,
                        where);
    }
  }
  ::std::vector<Node> sinks;
  if (added.empty()) {  // nothing captured: what comes next still follows `deps`
    for (::std::size_t i = 0; i < deps.size(); ++i) {
      sinks.push_back(Node::from_native_handle(deps.data()[i]));
    }
    return sinks;
  }
  for (::cudaGraphNode_t node : added) {
    ::std::size_t dependents = 0;
#if CUDART_VERSION >= 13000
    check(::cudaGraphNodeGetDependentNodes(node, nullptr, nullptr, &dependents), "cudaGraphNodeGetDependentNodes",
          where);
#else
    check(::cudaGraphNodeGetDependentNodes(node, nullptr, &dependents), "cudaGraphNodeGetDependentNodes", where);
#endif
    if (dependents == 0) {
      sinks.push_back(Node::from_native_handle(node));
    }
  }
  return sinks;
}

}  // namespace replay
