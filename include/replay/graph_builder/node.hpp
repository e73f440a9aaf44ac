#pragma once
#include <replay/detail/require_cxx20.hpp>
// Node: a non-owning handle to one node of a graph, valid for as long as the
// graph holds the node, and usable on every executable graph instantiated from
// that graph (the node names its counterpart there). Deps: the explicit
// dependencies of a node being added. LaunchConfig (launch_config.hpp): grid,
// block and dynamic shared memory of a kernel node.
#include <cuda_runtime_api.h>

#include <cstddef>
#include <initializer_list>
#include <source_location>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "replay/error.hpp"
#include "replay/graph.hpp"
#include "replay/graph_exec.hpp"
#include "replay/launch_config.hpp"

namespace replay {

namespace detail {

// Throws cuda_error for a failed node call, naming the node ("kernel node
// jacobi_step(...)"), and leaves no copy of the failure in the last-error slot.
[[noreturn, gnu::cold, gnu::noinline]] inline void throw_node_error(::cudaError_t status, const char* api,
                                                                   ::cudaGraphNode_t node, const char* doing,
                                                                   const ::std::source_location& where) {
  (void)::cudaGetLastError();
  throw cuda_error(status, api, where, ::std::string(doing) + " " + describe_node(node));
}
inline void check_node(::cudaError_t status, const char* api, ::cudaGraphNode_t node, const char* doing,
                       const ::std::source_location& where) {
  if (status != ::cudaSuccess) [[unlikely]] {
    throw_node_error(status, api, node, doing, where);
  }
}

}  // namespace detail

// The executable graph a variadic update applies to, with the caller's source
// line (a variadic call cannot take a defaulted source_location last, so it
// rides on the conversion from GraphExec&).
class ExecSite {
 public:
  ExecSite(GraphExec& exec, ::std::source_location where = ::std::source_location::current()) noexcept  // NOLINT
      : exec_(&exec), where_(where) {}
  GraphExec& exec() const noexcept { return *exec_; }
  const ::std::source_location& where() const noexcept { return where_; }

 private:
  GraphExec* exec_;
  ::std::source_location where_;
};

class Node {
 public:
  Node() noexcept = default;
  // Wraps a node made elsewhere (a captured graph's node, say).
  [[nodiscard]] static Node from_native_handle(::cudaGraphNode_t node) noexcept { return Node(node); }

  ::cudaGraphNode_t get() const noexcept { return node_; }
  explicit operator bool() const noexcept { return node_ != nullptr; }

  ::cudaGraphNode_t handle(::std::source_location where = ::std::source_location::current()) const {
    if (node_ == nullptr) [[unlikely]] {
      throw usage_error("Node: an empty node handle was used (default-constructed, or not from a graph)", where);
    }
    return node_;
  }

  NodeType type(::std::source_location where = ::std::source_location::current()) const {
    ::cudaGraphNodeType type{};
    check(::cudaGraphNodeGetType(handle(where), &type), "cudaGraphNodeGetType", where);
    return static_cast<NodeType>(type);
  }
  // "kernel node scale(float*, int)", "memset node": what error messages call it.
  ::std::string describe() const { return describe_node(node_); }

  // Turns this node off (or back on) in `exec` without touching its
  // parameters; a disabled node runs as an empty node. CUDA allows it for
  // kernel, memcpy and memset nodes.
  void set_enabled(GraphExec& exec, bool enabled,
                   ::std::source_location where = ::std::source_location::current()) const {
    detail::check_node(::cudaGraphNodeSetEnabled(exec.handle(where), handle(where), enabled ? 1U : 0U),
                       "cudaGraphNodeSetEnabled", node_, enabled ? "enabling" : "disabling", where);
  }
  bool enabled(const GraphExec& exec, ::std::source_location where = ::std::source_location::current()) const {
    unsigned int on = 0;
    detail::check_node(::cudaGraphNodeGetEnabled(exec.handle(where), handle(where), &on), "cudaGraphNodeGetEnabled",
                       node_, "querying", where);
    return on != 0;
  }

  friend bool operator==(const Node& a, const Node& b) noexcept { return a.node_ == b.node_; }

 protected:
  explicit Node(::cudaGraphNode_t node) noexcept : node_(node) {}

 private:
  ::cudaGraphNode_t node_ = nullptr;
};

// The nodes a new node depends on: none, one node, a braced list of nodes, or
// a span/vector of them (any node handle type slices to Node).
// A Deps also carries the caller's source line, for variadic calls such as
// GraphBuilder::add_kernel that cannot take a defaulted source_location last.
class Deps {
 public:
  Deps(::std::source_location where = ::std::source_location::current()) noexcept : where_(where) {}  // NOLINT
  Deps(const Node& node, ::std::source_location where = ::std::source_location::current())  // NOLINT
      : nodes_{node.get()}, where_(where) {}
  Deps(::std::initializer_list<Node> nodes, ::std::source_location where = ::std::source_location::current())
      : where_(where) {
    append(nodes);
  }
  Deps(::std::span<const Node> nodes, ::std::source_location where = ::std::source_location::current())  // NOLINT
      : where_(where) {
    append(nodes);
  }
  Deps(const ::std::vector<Node>& nodes, ::std::source_location where = ::std::source_location::current())  // NOLINT
      : where_(where) {
    append(::std::span<const Node>(nodes));
  }

#if CUDART_VERSION >= 12030
  // Dependencies by programmatic edges (`kind`: EdgeKind::programmatic or
  // EdgeKind::launch_completion), for GraphBuilder::add_kernel only: the new
  // kernel may start before these kernel nodes finish, and waits for them with
  // replay::wait_for_prerequisite_grid() (pdl.hpp). As
  // GraphBuilder::add_programmatic_dependency from each of them.
  [[nodiscard]] static Deps programmatic(const Node& node, EdgeKind kind = EdgeKind::programmatic,
                                         ::std::source_location where = ::std::source_location::current()) {
    Deps deps(node, where);
    deps.kind_ = kind;
    return deps;
  }
  // The same from several kernel nodes.
  [[nodiscard]] static Deps programmatic(::std::initializer_list<Node> nodes, EdgeKind kind = EdgeKind::programmatic,
                                         ::std::source_location where = ::std::source_location::current()) {
    Deps deps(nodes, where);
    deps.kind_ = kind;
    return deps;
  }
#endif

  const ::std::source_location& where() const noexcept { return where_; }
  // What the edges from these nodes wait for: EdgeKind::plain unless made by Deps::programmatic().
  EdgeKind kind() const noexcept { return kind_; }

  const ::cudaGraphNode_t* data() const noexcept { return nodes_.empty() ? nullptr : nodes_.data(); }
  ::std::size_t size() const noexcept { return nodes_.size(); }
  bool empty() const noexcept { return nodes_.empty(); }

  // usage_error for an empty handle in the list, and for programmatic
  // dependencies of anything but a kernel node (`to_kernel`), before CUDA sees them.
  void validate(const char* adding, const ::std::source_location& where, bool to_kernel = false) const {
    for (::cudaGraphNode_t node : nodes_) {
      if (node == nullptr) {
        throw usage_error(::std::string(adding) + ": a dependency is an empty node handle", where);
      }
    }
    if (kind_ != EdgeKind::plain && !to_kernel) {
      throw usage_error(::std::string(adding) +
                            ": programmatic dependencies (Deps::programmatic) lead only to a kernel node "
                            "(add_kernel); give plain dependencies here",
                        where);
    }
  }

 private:
  template <class Range>
  void append(const Range& nodes) {
    nodes_.reserve(nodes.size());
    for (const Node& node : nodes) {
      nodes_.push_back(node.get());
    }
  }
  ::std::vector<::cudaGraphNode_t> nodes_;
  ::std::source_location where_;
  EdgeKind kind_ = EdgeKind::plain;
};

}  // namespace replay
