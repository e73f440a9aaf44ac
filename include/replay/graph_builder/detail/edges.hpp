#pragma once
#include <replay/detail/require_cxx20.hpp>
// GraphBuilder's programmatic edges: add_programmatic_dependency, and
// add_kernel's Deps::programmatic. An edge with CUDA's edge data
// (cudaGraphAddDependencies with a cudaGraphEdgeData, CUDA 12.3 and newer)
// between two kernel nodes, refused for other nodes, on devices older than
// compute capability 9.0, and into a kernel whose code was compiled from PTX
// older than 9.0 (its wait compiled out); included by graph_builder/builder.hpp.
#include <cuda_runtime_api.h>

#include <cstddef>
#include <source_location>

#include "replay/detail/device_caps.hpp"
#include "replay/detail/kernel_ptx.hpp"
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
// cannot run programmatic edges; returns that device.
inline int refuse_programmatic_device(const char* what, const ::std::source_location& where) {
  int device = 0;
  check(::cudaGetDevice(&device), "cudaGetDevice", where);
  refuse_below_sm90(compute_capability_major(device, where), device, what,
                    "a programmatic edge (programmatic dependent launch)", "add_dependency makes a plain edge", where);
  return device;
}

// usage_error when `kernel`, the downstream end of a programmatic edge (the
// one that waits), runs code compiled from PTX older than 9.0 on `device`.
inline void refuse_programmatic_downstream(const void* kernel, const char* subject, int device, const char* what,
                                           const ::std::source_location& where) {
  refuse_ptx_below_sm90(kernel_ptx_version(kernel, device, where), device, what, subject,
                        "join them with add_dependency (a plain edge)", where);
}

// The same for kernel node `node`, when its kernel is a function the runtime
// knows; a node whose parameters name no such function (a driver-API kernel:
// cudaErrorInvalidDeviceFunction) is not refused, for want of an answer.
inline void refuse_programmatic_downstream(::cudaGraphNode_t node, int device, const char* what,
                                           const ::std::source_location& where) {
  ::cudaKernelNodeParams params{};
  const ::cudaError_t status = ::cudaGraphKernelNodeGetParams(node, &params);
  if (status == ::cudaErrorInvalidDeviceFunction) {
    clear_error_slot(status);
    return;
  }
  check(status, "cudaGraphKernelNodeGetParams", where);
  refuse_programmatic_downstream(params.func, concat("the downstream node (", describe_node(node), ")").c_str(),
                                 device, what, where);
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
  const int device = detail::refuse_programmatic_device(what, where);
  detail::refuse_programmatic_downstream(b, device, what, where);
  check(detail::add_edge(graph, a, b, kind), "cudaGraphAddDependencies", where);
}

inline void GraphBuilder::refuse_programmatic(const Deps& deps, const void* kernel, const char* adding,
                                              const ::std::source_location& where) const {
  for (::std::size_t i = 0; i < deps.size(); ++i) {
    detail::refuse_programmatic_edge(deps.data()[i], true, deps.kind(), adding, where);
  }
  const int device = detail::refuse_programmatic_device(adding, where);
  detail::refuse_programmatic_downstream(kernel, "the kernel", device, adding, where);
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
inline void GraphBuilder::refuse_programmatic(const Deps&, const void*, const char*,
                                              const ::std::source_location&) const {}
inline void GraphBuilder::add_edges_or_remove(const Deps&, ::cudaGraphNode_t, const ::std::source_location&) const {}
#endif

}  // namespace replay
