#pragma once
#include <replay/detail/require_cxx20.hpp>
// GraphBuilder's node-adding members that take more than one CUDA call:
// add_host (the graph owns the callable through a user object), add_child
// (refuses node types a child graph cannot hold) and add_mem_alloc (the
// allocation's pool on the current device); included by graph_builder/builder.hpp.
#include <cuda_runtime_api.h>

#include <concepts>
#include <cstddef>
#include <memory>
#include <source_location>
#include <type_traits>
#include <utility>

#include "replay/graph_builder/detail/nodes.hpp"
#include "replay/error.hpp"
#include "replay/graph.hpp"
#include "replay/graph_builder/builder.hpp"
#include "replay/graph_builder/child_graph_node.hpp"
#include "replay/graph_builder/host_node.hpp"
#include "replay/graph_builder/memory_nodes.hpp"
#include "replay/graph_builder/node.hpp"

namespace replay {

template <class F>
  requires ::std::invocable<::std::decay_t<F>&> && ::std::move_constructible<::std::decay_t<F>>
HostNode GraphBuilder::add_host(F&& fn, const Deps& deps, ::std::source_location where) {
  prepare(NodeType::host, deps, "add_host", where);
  using Holder = detail::HostCallable<::std::decay_t<F>>;
  auto failure = ::std::make_shared<detail::HostCallFailure>();
  auto holder = ::std::make_unique<Holder>(Holder{::std::forward<F>(fn), failure});
  ::cudaUserObject_t object = nullptr;
  check(::cudaUserObjectCreate(&object, holder.get(), &Holder::destroy, 1, ::cudaUserObjectNoDestructorSync),
        "cudaUserObjectCreate", where);
  Holder* raw = holder.release();  // the user object owns it now
  const ::cudaError_t retained = ::cudaGraphRetainUserObject(graph_, object, 1, ::cudaGraphUserObjectMove);
  if (retained != ::cudaSuccess) {
    (void)::cudaUserObjectRelease(object, 1);
    check(retained, "cudaGraphRetainUserObject", where);
  }
  // From here the graph holds the only reference: it frees the callable.
  ::cudaHostNodeParams params{};
  params.fn = &Holder::call;
  params.userData = raw;
  ::cudaGraphNode_t node = nullptr;
  check(::cudaGraphAddHostNode(&node, graph_, deps.data(), deps.size(), &params), "cudaGraphAddHostNode", where);
  return HostNode(node, ::std::move(failure));
}

inline ChildGraphNode GraphBuilder::add_child(GraphRef child, const Deps& deps, ::std::source_location where) {
  prepare(NodeType::child_graph, deps, "add_child", where);
  const auto nodes = child.nodes(where);
  if (::cudaGraphNode_t bad = detail::find_node(
          nodes,
          [](NodeType t) {
            return t == NodeType::conditional || t == NodeType::mem_alloc || t == NodeType::mem_free;
          },
          where)) {
    throw usage_error("add_child: the child graph holds a " + describe_node(bad) +
                          "; CUDA does not allow conditional, memory-allocation or memory-free nodes in a child "
                          "graph (add them to the parent instead)",
                      where);
  }
  if (body_) {
    refuse_in_body(nodes, "add_child", where);
  }
  ::cudaGraphNode_t node = nullptr;
  check(::cudaGraphAddChildGraphNode(&node, graph_, deps.data(), deps.size(), child.get()),
        "cudaGraphAddChildGraphNode", where);
  return ChildGraphNode(node);
}

inline MemAllocNode GraphBuilder::add_mem_alloc(::std::size_t bytes, const Deps& deps, ::std::source_location where) {
  prepare(NodeType::mem_alloc, deps, "add_mem_alloc", where);
  if (bytes == 0) {
    throw usage_error("add_mem_alloc: zero bytes requested", where);
  }
  int device = 0;
  check(::cudaGetDevice(&device), "cudaGetDevice", where);
  ::cudaMemAllocNodeParams params{};
  params.poolProps.allocType = ::cudaMemAllocationTypePinned;
  params.poolProps.handleTypes = ::cudaMemHandleTypeNone;
  params.poolProps.location.type = ::cudaMemLocationTypeDevice;
  params.poolProps.location.id = device;
  params.accessDescs = nullptr;
  params.accessDescCount = 0;
  params.bytesize = bytes;
  ::cudaGraphNode_t node = nullptr;
  check(::cudaGraphAddMemAllocNode(&node, graph_, deps.data(), deps.size(), &params), "cudaGraphAddMemAllocNode",
        where);
  return MemAllocNode(node, params.dptr, bytes);
}

}  // namespace replay
