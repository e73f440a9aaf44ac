#pragma once
#include <replay/detail/require_cxx20.hpp>
// Finding a node by type (recursively through child graphs), and the node
// types CUDA allows in a conditional node's body. Listing and typing nodes is
// GraphRef's (graph.hpp).
#include <cuda_runtime_api.h>

#include <cstddef>
#include <source_location>
#include <vector>

#include "replay/error.hpp"
#include "replay/graph.hpp"

namespace replay::detail {

// Node types CUDA allows inside a conditional body (and, recursively, inside
// the child graphs and conditionals there).
constexpr bool allowed_in_conditional_body(NodeType type) noexcept {
  switch (type) {
    case NodeType::kernel:
    case NodeType::empty:
    case NodeType::memcpy:
    case NodeType::memset:
    case NodeType::child_graph:
    case NodeType::conditional:
      return true;
    default:
      return false;
  }
}
inline constexpr const char* conditional_body_rule =
    "a conditional node's body may hold only kernel, empty, memcpy, memset, child graph and conditional nodes";

// The first node of `nodes` (and of the child graphs among them, recursively)
// for which `bad(type)` holds; null when none does.
template <class Bad>
::cudaGraphNode_t find_node(const ::std::vector<::cudaGraphNode_t>& nodes, const Bad& bad,
                            const ::std::source_location& where) {
  for (::cudaGraphNode_t node : nodes) {
    const NodeType type = node_type(node, where);
    if (bad(type)) {
      return node;
    }
    if (type == NodeType::child_graph) {
      ::cudaGraph_t child = nullptr;
      check(::cudaGraphChildGraphNodeGetGraph(node, &child), "cudaGraphChildGraphNodeGetGraph", where);
      if (::cudaGraphNode_t inner = find_node(GraphRef(child).nodes(where), bad, where)) {
        return inner;
      }
    }
  }
  return nullptr;
}

}  // namespace replay::detail
