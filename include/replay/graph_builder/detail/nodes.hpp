#pragma once
#include <replay/detail/require_cxx20.hpp>
// Listing and classifying a graph's nodes (recursively through child graphs),
// and the node types CUDA allows in a conditional node's body.
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

inline ::std::vector<::cudaGraphNode_t> graph_nodes(::cudaGraph_t graph, const ::std::source_location& where) {
  ::std::size_t count = 0;
  check(::cudaGraphGetNodes(graph, nullptr, &count), "cudaGraphGetNodes", where);
  ::std::vector<::cudaGraphNode_t> out(count);
  if (count != 0) {
    check(::cudaGraphGetNodes(graph, out.data(), &count), "cudaGraphGetNodes", where);
    out.resize(count);
  }
  return out;
}
inline NodeType node_type(::cudaGraphNode_t node, const ::std::source_location& where) {
  ::cudaGraphNodeType type{};
  check(::cudaGraphNodeGetType(node, &type), "cudaGraphNodeGetType", where);
  return static_cast<NodeType>(type);
}

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
      if (::cudaGraphNode_t inner = find_node(graph_nodes(child, where), bad, where)) {
        return inner;
      }
    }
  }
  return nullptr;
}

}  // namespace replay::detail
