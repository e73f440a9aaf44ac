#pragma once
#include <replay/detail/require_cxx20.hpp>
// GraphBuilder's programmatic edges: add_programmatic_dependency, and
// add_kernel's Deps::programmatic. An edge with CUDA's edge data
// (cudaGraphAddDependencies with a cudaGraphEdgeData, CUDA 12.3 and newer)
// between two kernel nodes, refused for other nodes and on devices older than
// compute capability 9.0; included by graph_builder/builder.hpp.
#include <cuda_runtime_api.h>

#include <cstddef>
#include <source_location>

#include "replay/detail/device_caps.hpp"
#include "replay/detail/message.hpp"
#include "replay/error.hpp"
#include "replay/graph.hpp"
#include "replay/graph_builder/builder.hpp"
#include "replay/graph_builder/node.hpp"

namespace replay {

namespace detail {

#if CUDART_VERSION >= 12030
// usage_error unless `node` is a kernel node and `kind` a programmatic kind.
inline void refuse_programmatic_edge(::cudaGraphNode_t node, bool upstream, EdgeKind kind, const char* what,
                                     const ::std::source_location& where) {
  if (kind != EdgeKind::programmatic && kind != EdgeKind::launch_completion) {
    throw usage_error(concat(what, ": the kind must be EdgeKind::programmatic or EdgeKind::launch_completion, not ",
                             to_string(kind), "; add_dependency makes a plain edge"),
                      where);
  }
  if (node_type(node, where) != NodeType::kernel) {
    throw usage_error(concat(what, ": a programmatic edge joins two kernel nodes, and the ",
                             upstream ? "upstream" : "downstream", " node (", describe_node(node),
                             ") is not one; add_dependency makes a plain edge"),
                      where);
  }
}

// usage_error when the current device, where the graph will be instantiated,
// cannot run programmatic edges.
inline void refuse_programmatic_device(const char* what, const ::std::source_location& where) {
  int device = 0;
  check(::cudaGetDevice(&device), "cudaGetDevice", where);
  refuse_below_sm90(compute_capability_major(device, where), device, what,
                    "a programmatic edge (programmatic dependent launch)", "add_dependency makes a plain edge", where);
}

inline ::cudaError_t add_edge(::cudaGraph_t graph, ::cudaGraphNode_t from, ::cudaGraphNode_t to,
                              EdgeKind kind) noexcept {
  const ::cudaGraphEdgeData data = edge_data(kind);
#if CUDART_VERSION >= 13000
  return ::cudaGraphAddDependencies(graph, &from, &to, &data, 1);
#else
  return ::cudaGraphAddDependencies_v2(graph, &from, &to, &data, 1);
#endif
}
#endif

}  // namespace detail

#if CUDART_VERSION >= 12030
inline void GraphBuilder::add_programmatic_dependency(const Node& from, const Node& to, EdgeKind kind,
                                                      ::std::source_location where) {
  constexpr const char* what = "add_programmatic_dependency";
  const ::cudaGraph_t graph = handle(where);
  const ::cudaGraphNode_t a = from.handle(where);
  const ::cudaGraphNode_t b = to.handle(where);
  detail::refuse_programmatic_edge(a, true, kind, what, where);
  detail::refuse_programmatic_edge(b, false, kind, what, where);
  detail::refuse_programmatic_device(what, where);
  check(detail::add_edge(graph, a, b, kind), "cudaGraphAddDependencies", where);
}

inline void GraphBuilder::refuse_programmatic(const Deps& deps, const char* adding,
                                              const ::std::source_location& where) const {
  for (::std::size_t i = 0; i < deps.size(); ++i) {
    detail::refuse_programmatic_edge(deps.data()[i], true, deps.kind(), adding, where);
  }
  detail::refuse_programmatic_device(adding, where);
}

inline void GraphBuilder::add_edges_or_remove(const Deps& deps, ::cudaGraphNode_t node,
                                              const ::std::source_location& where) const {
  for (::std::size_t i = 0; i < deps.size(); ++i) {
    if (const ::cudaError_t status = detail::add_edge(graph_, deps.data()[i], node, deps.kind());
        status != ::cudaSuccess) {
      (void)::cudaGraphDestroyNode(node);  // its edges go with it
      check(status, "cudaGraphAddDependencies", where);
    }
  }
}
#else
inline void GraphBuilder::refuse_programmatic(const Deps&, const char*, const ::std::source_location&) const {}
inline void GraphBuilder::add_edges_or_remove(const Deps&, ::cudaGraphNode_t, const ::std::source_location&) const {}
#endif

}  // namespace replay
