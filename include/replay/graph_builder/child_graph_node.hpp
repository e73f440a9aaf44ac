#pragma once
#include <replay/detail/require_cxx20.hpp>
// ChildGraphNode: a node that runs a copy of another graph (a captured
// section, say). CUDA clones the graph into the node; the original stays the
// caller's. On an executable graph the child can be replaced by a graph of
// the same topology (cudaGraphExecChildGraphNodeSetParams).
#include <cuda_runtime_api.h>

#include <source_location>

#include "replay/error.hpp"
#include "replay/graph.hpp"
#include "replay/graph_builder/node.hpp"
#include "replay/graph_exec.hpp"

namespace replay {

class ChildGraphNode : public Node {
 public:
  ChildGraphNode() noexcept = default;

  // The node's own copy of the child graph (owned by the node; do not destroy).
  ::cudaGraph_t child_graph(::std::source_location where = ::std::source_location::current()) const {
    ::cudaGraph_t child = nullptr;
    detail::check_node(::cudaGraphChildGraphNodeGetGraph(handle(where), &child), "cudaGraphChildGraphNodeGetGraph",
                       get(), "querying", where);
    return child;
  }

  // Runs `graph` (same topology, new parameters) as this child in `exec`.
  void set_graph(GraphExec& exec, GraphRef graph,
                 ::std::source_location where = ::std::source_location::current()) const {
    detail::check_node(::cudaGraphExecChildGraphNodeSetParams(exec.handle(where), handle(where), graph.handle(where)),
                       "cudaGraphExecChildGraphNodeSetParams", get(), "updating", where);
  }

 private:
  friend class GraphBuilder;
  explicit ChildGraphNode(::cudaGraphNode_t node) noexcept : Node(node) {}
};

}  // namespace replay
