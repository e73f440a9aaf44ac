#pragma once
#include <replay/detail/require_cxx20.hpp>
// GraphBuilder::add_programmatic_dependency: an edge with CUDA's edge data
// (cudaGraphAddDependencies with a cudaGraphEdgeData, CUDA 12.3 and newer)
// between two kernel nodes, refused for other nodes and on devices older than
// compute capability 9.0; included by graph_builder/builder.hpp.
#include <cuda_runtime_api.h>

#include <source_location>

#include "replay/detail/device_caps.hpp"
#include "replay/detail/message.hpp"
#include "replay/error.hpp"
#include "replay/graph.hpp"
#include "replay/graph_builder/builder.hpp"
#include "replay/graph_builder/node.hpp"

namespace replay {

#if CUDART_VERSION >= 12030
inline void GraphBuilder::add_programmatic_dependency(const Node& from, const Node& to, EdgeKind kind,
                                                      ::std::source_location where) {
  constexpr const char* what = "add_programmatic_dependency";
  const ::cudaGraph_t graph = handle(where);
  const ::cudaGraphNode_t a = from.handle(where);
  const ::cudaGraphNode_t b = to.handle(where);
  if (kind != EdgeKind::programmatic && kind != EdgeKind::launch_completion) {
    throw usage_error(detail::concat(what, ": the kind must be EdgeKind::programmatic or EdgeKind::launch_completion, "
                                           "not ",
                                     to_string(kind), "; add_dependency makes a plain edge"),
                      where);
  }
  for (const Node* node : {&from, &to}) {
    if (node->type(where) != NodeType::kernel) {
      throw usage_error(detail::concat(what, ": a programmatic edge joins two kernel nodes, and the ",
                                       node == &from ? "upstream" : "downstream", " node (", node->describe(),
                                       ") is not one; add_dependency makes a plain edge"),
                        where);
    }
  }
  int device = 0;
  check(::cudaGetDevice(&device), "cudaGetDevice", where);
  detail::refuse_below_sm90(detail::compute_capability_major(device, where), device, what,
                            "a programmatic edge (programmatic dependent launch)",
                            "add_dependency makes a plain edge", where);
  const ::cudaGraphEdgeData data = detail::edge_data(kind);
#if CUDART_VERSION >= 13000
  check(::cudaGraphAddDependencies(graph, &a, &b, &data, 1), "cudaGraphAddDependencies", where);
#else
  check(::cudaGraphAddDependencies_v2(graph, &a, &b, &data, 1), "cudaGraphAddDependencies_v2", where);
#endif
}
#endif

}  // namespace replay
