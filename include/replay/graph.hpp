#pragma once
// GraphRef: a view of a cudaGraph_t, with the inspection a user needs to trust
// a capture: node counts by type, the names of the kernels inside, the edges
// with their kinds (graph_edge.hpp), DOT dumps, and clone(). Graph: the owning, move-only form, empty until made.
#include <replay/detail/require_cxx20.hpp>

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <source_location>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#if defined(__GNUC__) || defined(__clang__)
#include <cxxabi.h>
#define REPLAY_HAS_CXXABI 1
#endif

#include "replay/detail/kernel_node_symbol.hpp"
#include "replay/detail/message.hpp"
#include "replay/detail/unique_handle.hpp"
#include "replay/error.hpp"
#include "replay/flags.hpp"
#include "replay/graph_edge.hpp"

namespace replay {

enum class NodeType : int {
  kernel = ::cudaGraphNodeTypeKernel,
  memcpy = ::cudaGraphNodeTypeMemcpy,
  memset = ::cudaGraphNodeTypeMemset,
  host = ::cudaGraphNodeTypeHost,
  child_graph = ::cudaGraphNodeTypeGraph,
  empty = ::cudaGraphNodeTypeEmpty,
  wait_event = ::cudaGraphNodeTypeWaitEvent,
  event_record = ::cudaGraphNodeTypeEventRecord,
  ext_semaphore_signal = ::cudaGraphNodeTypeExtSemaphoreSignal,
  ext_semaphore_wait = ::cudaGraphNodeTypeExtSemaphoreWait,
  mem_alloc = ::cudaGraphNodeTypeMemAlloc,
  mem_free = ::cudaGraphNodeTypeMemFree,
  conditional = ::cudaGraphNodeTypeConditional,
};

constexpr ::std::string_view to_string(NodeType type) noexcept {
  switch (type) {
    case NodeType::kernel: return "kernel";
    case NodeType::memcpy: return "memcpy";
    case NodeType::memset: return "memset";
    case NodeType::host: return "host";
    case NodeType::child_graph: return "child_graph";
    case NodeType::empty: return "empty";
    case NodeType::wait_event: return "wait_event";
    case NodeType::event_record: return "event_record";
    case NodeType::ext_semaphore_signal: return "ext_semaphore_signal";
    case NodeType::ext_semaphore_wait: return "ext_semaphore_wait";
    case NodeType::mem_alloc: return "mem_alloc";
    case NodeType::mem_free: return "mem_free";
    case NodeType::conditional: return "conditional";
  }
  return "unknown";
}

enum class DotFlags : unsigned int {
  none = 0,
  verbose = ::cudaGraphDebugDotFlagsVerbose,
  kernel_params = ::cudaGraphDebugDotFlagsKernelNodeParams,
  memcpy_params = ::cudaGraphDebugDotFlagsMemcpyNodeParams,
  memset_params = ::cudaGraphDebugDotFlagsMemsetNodeParams,
  host_params = ::cudaGraphDebugDotFlagsHostNodeParams,
  event_params = ::cudaGraphDebugDotFlagsEventNodeParams,
  kernel_attributes = ::cudaGraphDebugDotFlagsKernelNodeAttributes,
  handles = ::cudaGraphDebugDotFlagsHandles,
};
template <>
inline constexpr bool enable_bitmask<DotFlags> = true;

// Demangles an Itanium C++ ABI name where the toolchain can; returns it unchanged otherwise.
inline ::std::string demangle(const char* name) {
  if (name == nullptr) {
    return {};
  }
#ifdef REPLAY_HAS_CXXABI
  int status = 0;
  ::std::unique_ptr<char, void (*)(void*)> out(abi::__cxa_demangle(name, nullptr, nullptr, &status), ::std::free);
  if (status == 0 && out) {
    return out.get();
  }
#endif
  return name;
}

namespace detail {
// kernel_node_name() of a node already known to be a kernel node (GraphRef's
// and describe_node()'s callers have read its type): no second type query.
inline ::std::string known_kernel_node_name(::cudaGraphNode_t node) {
  const char* symbol = kernel_node_symbol(node);
  return symbol == nullptr ? ::std::string("<unnamed kernel>") : demangle(symbol);
}
}  // namespace detail

// Name of the kernel a kernel node launches, demangled, e.g. "scale_kernel(float*, int)",
// whether the runtime or the driver API (cuLaunchKernel: cuBLAS, NVRTC code) launched
// it; "<unnamed kernel>" where neither can name it. usage_error for a node of another type.
inline ::std::string kernel_node_name(::cudaGraphNode_t node,
                                      ::std::source_location where = ::std::source_location::current()) {
  ::cudaGraphNodeType type{};
  check(::cudaGraphNodeGetType(node, &type), "cudaGraphNodeGetType", where);
  if (type != ::cudaGraphNodeTypeKernel) {
    throw usage_error("kernel_node_name: the node is not a kernel node", where);
  }
  return detail::known_kernel_node_name(node);
}

// "kernel node scale_kernel(float*, int)", "memcpy node": for error messages.
inline ::std::string describe_node(::cudaGraphNode_t node) noexcept {
  try {
    if (node == nullptr) {
      return "no particular node";
    }
    ::cudaGraphNodeType type{};
    if (const ::cudaError_t status = ::cudaGraphNodeGetType(node, &type); status != ::cudaSuccess) {
      detail::clear_error_slot(status);
      return "an unknown node";
    }
    const ::std::string_view kind = to_string(static_cast<NodeType>(type));
    return type == ::cudaGraphNodeTypeKernel ? detail::concat(kind, " node ", detail::known_kernel_node_name(node))
                                             : detail::concat(kind, " node");
  } catch (...) {
    return "an unknown node";
  }
}

namespace detail {
// A node's type; the one query behind GraphRef's and GraphBuilder's inspection.
inline NodeType node_type(::cudaGraphNode_t node, const ::std::source_location& where) {
  ::cudaGraphNodeType type{};
  check(::cudaGraphNodeGetType(node, &type), "cudaGraphNodeGetType", where);
  return static_cast<NodeType>(type);
}
}  // namespace detail

class Graph;

// A non-owning view of a cudaGraph_t (one a Graph owns, or one that torch or
// cudaStreamEndCapture handed out): the inspection queries, and clone().
class GraphRef {
 public:
  explicit constexpr GraphRef(::cudaGraph_t graph) noexcept : graph_(graph) {}
  GraphRef(int) = delete;
  GraphRef(::std::nullptr_t) = delete;

  constexpr ::cudaGraph_t get() const noexcept { return graph_; }

  // The handle; usage_error on an empty or moved-from Graph.
  ::cudaGraph_t handle(::std::source_location where = ::std::source_location::current()) const {
    if (graph_ == nullptr) [[unlikely]] {
      throw_empty(where);
    }
    return graph_;
  }

  ::std::vector<::cudaGraphNode_t> nodes(::std::source_location where = ::std::source_location::current()) const {
    ::std::size_t count = 0;
    check(::cudaGraphGetNodes(handle(where), nullptr, &count), "cudaGraphGetNodes", where);
    ::std::vector<::cudaGraphNode_t> out(count);
    if (count != 0) {
      check(::cudaGraphGetNodes(graph_, out.data(), &count), "cudaGraphGetNodes", where);
      out.resize(count);
    }
    return out;
  }

  ::std::size_t node_count(::std::source_location where = ::std::source_location::current()) const {
    ::std::size_t count = 0;
    check(::cudaGraphGetNodes(handle(where), nullptr, &count), "cudaGraphGetNodes", where);
    return count;
  }

  // Top-level nodes by type (child graphs count as one child_graph node).
  ::std::map<NodeType, ::std::size_t> node_counts(
      ::std::source_location where = ::std::source_location::current()) const {
    ::std::map<NodeType, ::std::size_t> counts;
    for (::cudaGraphNode_t node : nodes(where)) {
      ++counts[detail::node_type(node, where)];
    }
    return counts;
  }
  ::std::size_t count(NodeType type, ::std::source_location where = ::std::source_location::current()) const {
    const auto counts = node_counts(where);
    const auto it = counts.find(type);
    return it == counts.end() ? 0 : it->second;
  }

  // Demangled names of the kernels in this graph, one per kernel node, in node order.
  ::std::vector<::std::string> kernel_names(::std::source_location where = ::std::source_location::current()) const {
    ::std::vector<::std::string> names;
    for (::cudaGraphNode_t node : nodes(where)) {
      if (detail::node_type(node, where) == NodeType::kernel) {
        names.push_back(detail::known_kernel_node_name(node));
      }
    }
    return names;
  }
  // Number of kernel nodes whose demangled name contains `fragment`.
  ::std::size_t count_kernels(::std::string_view fragment,
                              ::std::source_location where = ::std::source_location::current()) const {
    ::std::size_t n = 0;
    for (const auto& name : kernel_names(where)) {
      n += name.find(fragment) != ::std::string::npos ? 1 : 0;
    }
    return n;
  }

  // Every edge, with its kind (programmatic edges included; before CUDA 12.3,
  // which has no edge data, every edge is plain).
  ::std::vector<GraphEdge> edges(::std::source_location where = ::std::source_location::current()) const {
    ::std::size_t count = 0;
    check(get_edges(handle(where), nullptr, nullptr, nullptr, &count), "cudaGraphGetEdges", where);
    ::std::vector<::cudaGraphNode_t> from(count);
    ::std::vector<::cudaGraphNode_t> to(count);
    ::std::vector<GraphEdge> out;
    if (count == 0) {
      return out;
    }
#if CUDART_VERSION >= 12030
    ::std::vector<::cudaGraphEdgeData> data(count);
    check(get_edges(graph_, from.data(), to.data(), data.data(), &count), "cudaGraphGetEdges", where);
#else
    check(get_edges(graph_, from.data(), to.data(), nullptr, &count), "cudaGraphGetEdges", where);
#endif
    out.reserve(count);
    for (::std::size_t i = 0; i < count; ++i) {
#if CUDART_VERSION >= 12030
      out.push_back(GraphEdge{from[i], to[i], detail::edge_kind(data[i])});
#else
      out.push_back(GraphEdge{from[i], to[i], EdgeKind::plain});
#endif
    }
    return out;
  }
  // The edges of one kind.
  ::std::size_t count_edges(EdgeKind kind, ::std::source_location where = ::std::source_location::current()) const {
    ::std::size_t n = 0;
    for (const GraphEdge& edge : edges(where)) {
      n += edge.kind == kind ? 1 : 0;
    }
    return n;
  }

  // The graph in Graphviz DOT, as replay draws it: one box per node (its type,
  // and a kernel's name), one arrow per edge; programmatic and
  // launch-completion edges dashed and labelled. write_dot() is CUDA's own
  // printer, with every node's parameters, which does not mark edge kinds.
  ::std::string to_dot(::std::source_location where = ::std::source_location::current()) const {
    const ::std::vector<::cudaGraphNode_t> all = nodes(where);
    const auto id = [&](::cudaGraphNode_t node) {
      for (::std::size_t i = 0; i < all.size(); ++i) {
        if (all[i] == node) {
          return i;
        }
      }
      return all.size();
    };
    ::std::string out = "digraph replay_graph {\n  node [shape=box];\n";
    for (::std::size_t i = 0; i < all.size(); ++i) {
      out += detail::concat("  n", i, " [label=\"", detail::dot_escaped(describe_node(all[i])), "\"];\n");
    }
    for (const GraphEdge& edge : edges(where)) {
      out += detail::concat("  n", id(edge.from), " -> n", id(edge.to), detail::dot_edge_style(edge.kind), ";\n");
    }
    return out + "}\n";
  }

  // Writes the graph in Graphviz DOT (cudaGraphDebugDotPrint).
  void write_dot(const ::std::filesystem::path& path, DotFlags flags = DotFlags::verbose,
                 ::std::source_location where = ::std::source_location::current()) const {
    check(::cudaGraphDebugDotPrint(handle(where), path.string().c_str(), to_underlying(flags)),
          "cudaGraphDebugDotPrint", where);
  }

  // A deep copy: same nodes and parameters, independent lifetime.
  [[nodiscard]] Graph clone(::std::source_location where = ::std::source_location::current()) const;

  friend constexpr bool operator==(GraphRef a, GraphRef b) noexcept { return a.graph_ == b.graph_; }

 private:
  // cudaGraphGetEdges with edge data where the runtime has it (CUDA 13's
  // signature; cudaGraphGetEdges_v2 in CUDA 12.3 to 12.9).
  static ::cudaError_t get_edges(::cudaGraph_t graph, ::cudaGraphNode_t* from, ::cudaGraphNode_t* to,
                                 [[maybe_unused]] void* data, ::std::size_t* count) noexcept {
#if CUDART_VERSION >= 13000
    return ::cudaGraphGetEdges(graph, from, to, static_cast<::cudaGraphEdgeData*>(data), count);
#elif CUDART_VERSION >= 12030
    return ::cudaGraphGetEdges_v2(graph, from, to, static_cast<::cudaGraphEdgeData*>(data), count);
#else
    return ::cudaGraphGetEdges(graph, from, to, count);
#endif
  }
  [[noreturn, gnu::cold, gnu::noinline]] static void throw_empty(const ::std::source_location& where) {
    throw usage_error("Graph used after move (or after release()), or empty (default-constructed); make one with "
                      "Graph::create() or replay::capture()",
                      where);
  }
  ::cudaGraph_t graph_;
};

namespace detail {
struct graph_traits {
  using handle_type = ::cudaGraph_t;
  static constexpr ::cudaGraph_t empty() noexcept { return nullptr; }
  static void destroy(::cudaGraph_t graph) noexcept { (void)::cudaGraphDestroy(graph); }
};
}  // namespace detail

// An owning cudaGraph_t, and a GraphRef. Default-constructed it is empty (no
// graph; every query throws usage_error): Graph::create() makes a new graph
// to add nodes to or capture into, replay::capture() returns a captured one.
class Graph : public detail::unique_handle<GraphRef, detail::graph_traits> {
  using base = detail::unique_handle<GraphRef, detail::graph_traits>;

 public:
  // Empty: holds no graph.
  Graph() noexcept : base(nullptr) {}
  // A new graph with no nodes (cudaGraphCreate).
  [[nodiscard]] static Graph create(::std::source_location where = ::std::source_location::current()) {
    ::cudaGraph_t graph = nullptr;
    check(::cudaGraphCreate(&graph, 0), "cudaGraphCreate", where);
    return from_native_handle(graph);
  }
  // Adopts a graph created elsewhere; the Graph destroys it.
  [[nodiscard]] static Graph from_native_handle(::cudaGraph_t graph) noexcept { return Graph(graph); }
  static Graph from_native_handle(int) = delete;
  static Graph from_native_handle(::std::nullptr_t) = delete;

  Graph(Graph&&) noexcept = default;
  Graph& operator=(Graph&&) noexcept = default;
  ~Graph() = default;

 private:
  explicit Graph(::cudaGraph_t graph) noexcept : base(graph) {}
};

inline Graph GraphRef::clone(::std::source_location where) const {
  ::cudaGraph_t copy = nullptr;
  check(::cudaGraphClone(&copy, handle(where)), "cudaGraphClone", where);
  return Graph::from_native_handle(copy);
}

}  // namespace replay
