#pragma once
#include <replay/detail/require_cxx20.hpp>
// EdgeKind and GraphEdge: a graph's edges with what they wait for. A plain
// edge waits for its upstream node to complete; a programmatic edge, between
// two kernel nodes, lets the downstream kernel start once every block of the
// upstream one has called replay::release_dependent_grids() or exited (and
// its replay::wait_for_prerequisite_grid() waits for the rest); a
// launch-completion edge lets it start once every upstream block has begun.
// The last two are CUDA's edge data (cudaGraphEdgeData, CUDA 12.3 and newer).
// GraphRef::edges() lists them, GraphRef::to_dot() draws them.
#include <cuda_runtime_api.h>

#include <string>
#include <string_view>

namespace replay {

// What an edge of a graph waits for.
enum class EdgeKind : int {
  // The upstream node's completion (CUDA's default edge).
  plain = 0,
  // Programmatic dependent launch: the upstream kernel's blocks have all
  // triggered or exited (cudaGraphKernelNodePortProgrammatic).
  programmatic = 1,
  // The upstream kernel's blocks have all begun (cudaGraphKernelNodePortLaunchCompletion).
  launch_completion = 2,
  // Edge data replay does not name (a port of a future node type, say).
  other = 3,
};

// "plain", "programmatic", "launch_completion", "other".
constexpr ::std::string_view to_string(EdgeKind kind) noexcept {
  switch (kind) {
    case EdgeKind::plain: return "plain";
    case EdgeKind::programmatic: return "programmatic";
    case EdgeKind::launch_completion: return "launch_completion";
    case EdgeKind::other: return "other";
  }
  return "other";
}

// One edge of a graph: `to` depends on `from`, as `kind` says.
struct GraphEdge {
  // The upstream node.
  ::cudaGraphNode_t from = nullptr;
  // The downstream node.
  ::cudaGraphNode_t to = nullptr;
  // What the edge waits for.
  EdgeKind kind = EdgeKind::plain;
};

namespace detail {

#if CUDART_VERSION >= 12030
// The kind of CUDA's edge data.
constexpr EdgeKind edge_kind(const ::cudaGraphEdgeData& data) noexcept {
  if (data.type == ::cudaGraphDependencyTypeProgrammatic) {
    if (data.from_port == cudaGraphKernelNodePortLaunchCompletion) {
      return EdgeKind::launch_completion;
    }
    return data.from_port == cudaGraphKernelNodePortProgrammatic ? EdgeKind::programmatic : EdgeKind::other;
  }
  return data.from_port == cudaGraphKernelNodePortDefault && data.to_port == 0 ? EdgeKind::plain
                                                                               : EdgeKind::other;
}
// CUDA's edge data for `kind` (plain for `other`, which names no one edge).
constexpr ::cudaGraphEdgeData edge_data(EdgeKind kind) noexcept {
  ::cudaGraphEdgeData data{};
  if (kind == EdgeKind::programmatic || kind == EdgeKind::launch_completion) {
    data.type = ::cudaGraphDependencyTypeProgrammatic;
    data.from_port = static_cast<unsigned char>(
        kind == EdgeKind::programmatic ? cudaGraphKernelNodePortProgrammatic : cudaGraphKernelNodePortLaunchCompletion);
  }
  return data;
}
#endif

// Text for a double-quoted DOT string.
inline ::std::string dot_escaped(::std::string_view text) {
  ::std::string out;
  for (const char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
    }
    out += c;
  }
  return out;
}

// A DOT edge's attributes for `kind`: none for plain edges, dashed and
// labelled for the others.
constexpr ::std::string_view dot_edge_style(EdgeKind kind) noexcept {
  switch (kind) {
    case EdgeKind::plain: return "";
    case EdgeKind::programmatic: return " [style=dashed, color=blue, label=\"programmatic\"]";
    case EdgeKind::launch_completion: return " [style=dashed, color=purple, label=\"launch completion\"]";
    case EdgeKind::other: return " [style=dotted, label=\"edge data\"]";
  }
  return "";
}

}  // namespace detail
}  // namespace replay
