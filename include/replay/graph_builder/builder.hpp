#pragma once
#include <replay/detail/require_cxx20.hpp>
// GraphBuilder: adds typed nodes with explicit dependencies to a graph, a
// conditional node's body, or any cudaGraph_t it is given (it does not own
// it). Each add_* returns a handle to the new node, valid through
// instantiation for updates on the executable graph. Capture mixes in two
// ways: a captured Graph as a child node (add_child), or capture straight
// into this graph or body (capture(), cudaStreamBeginCaptureToGraph; in
// graph_builder/detail/capture.hpp). add_host, add_child and add_mem_alloc are defined
// in graph_builder/detail/builder_nodes.hpp, add_programmatic_dependency in
// graph_builder/detail/edges.hpp; ConditionalNode is in
// graph_builder/conditional_node.hpp.
//
//   replay::Graph graph = replay::make_graph();
//   replay::GraphBuilder b(graph);
//   auto fill = b.add_fill(std::span(x, n), 0.0f, {});
//   auto step = b.add_kernel(scale, grid, block, 0, {fill}, x, n, 2.0f);   // checked against scale's parameters
//   replay::GraphExec exec(graph);
//   step.set_args(exec, x, n, 3.0f);                                        // in place, typed
#include <cuda_runtime_api.h>

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <source_location>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "replay/capture_scope.hpp"
#include "replay/detail/capture_state.hpp"
#include "replay/graph_builder/detail/nodes.hpp"
#include "replay/detail/signature_checks.hpp"
#include "replay/error.hpp"
#include "replay/event.hpp"
#include "replay/graph.hpp"
#include "replay/graph_builder/child_graph_node.hpp"
#include "replay/graph_builder/conditional.hpp"
#include "replay/graph_builder/event_nodes.hpp"
#include "replay/graph_builder/host_node.hpp"
#include "replay/graph_builder/kernel_node.hpp"
#include "replay/graph_builder/memcpy_node.hpp"
#include "replay/graph_builder/memory_nodes.hpp"
#include "replay/graph_builder/memset_node.hpp"
#include "replay/graph_builder/node.hpp"
#include "replay/stream_ref.hpp"

namespace replay {

// A new, empty graph to build into.
[[nodiscard]] inline Graph make_graph(::std::source_location where = ::std::source_location::current()) {
  ::cudaGraph_t graph = nullptr;
  check(::cudaGraphCreate(&graph, 0), "cudaGraphCreate", where);
  return Graph::from_native_handle(graph);
}

class ConditionalNode;

class GraphBuilder {
 public:
  // Builds into `graph` (which must outlive the builder and the node handles).
  explicit GraphBuilder(Graph& graph, ::std::source_location where = ::std::source_location::current())
      : graph_(graph.handle(where)) {}
  // Builds into a graph owned elsewhere.
  [[nodiscard]] static GraphBuilder from_native_handle(::cudaGraph_t graph, bool conditional_body = false) noexcept {
    return GraphBuilder(graph, conditional_body);
  }

  ::cudaGraph_t get() const noexcept { return graph_; }
  // True when this builds a conditional node's body, where CUDA allows only
  // kernel, empty, memcpy, memset, child graph and conditional nodes.
  bool is_conditional_body() const noexcept { return body_; }

  // ---- inspection (GraphRef's, for bodies too) ----
  ::std::size_t node_count(::std::source_location where = ::std::source_location::current()) const {
    return view(where).node_count(where);
  }
  ::std::map<NodeType, ::std::size_t> node_counts(
      ::std::source_location where = ::std::source_location::current()) const {
    return view(where).node_counts(where);
  }
  ::std::size_t count(NodeType type, ::std::source_location where = ::std::source_location::current()) const {
    return view(where).count(type, where);
  }
  void write_dot(const ::std::filesystem::path& path, DotFlags flags = DotFlags::verbose,
                 ::std::source_location where = ::std::source_location::current()) const {
    view(where).write_dot(path, flags, where);
  }
  // Every edge with its kind (GraphRef::edges()).
  ::std::vector<GraphEdge> edges(::std::source_location where = ::std::source_location::current()) const {
    return view(where).edges(where);
  }
  // The graph in DOT, programmatic edges marked (GraphRef::to_dot()).
  ::std::string to_dot(::std::source_location where = ::std::source_location::current()) const {
    return view(where).to_dot(where);
  }

  // ---- nodes ----
  Node add_empty(const Deps& deps = {}, ::std::source_location where = ::std::source_location::current()) {
    prepare(NodeType::empty, deps, "add_empty", where);
    ::cudaGraphNode_t node = nullptr;
    check(::cudaGraphAddEmptyNode(&node, graph_, deps.data(), deps.size()), "cudaGraphAddEmptyNode", where);
    return Node::from_native_handle(node);
  }

  // A kernel node launching kernel<<<grid, block, shared_bytes>>>(args...).
  // The arguments are checked against the kernel's parameters at compile time
  // and copied into the node. With Deps::programmatic(...) the edges from the
  // dependencies are programmatic (see add_programmatic_dependency).
  template <class... Params, class... Args>
  KernelNode<Params...> add_kernel(void (*kernel)(Params...), ::dim3 grid, ::dim3 block, unsigned int shared_bytes,
                                   const Deps& deps, Args&&... args) {
    return add_kernel(kernel, LaunchConfig{grid, block, shared_bytes}, deps, ::std::forward<Args>(args)...);
  }
  template <class... Params, class... Args>
  KernelNode<Params...> add_kernel(void (*kernel)(Params...), const LaunchConfig& config, const Deps& deps,
                                   Args&&... args) {
    detail::kernel_arguments_check<Params...>::template check<Args...>();  // names a mismatched argument
    const ::std::source_location& where = deps.where();
    detail::refuse_null_kernel(kernel, "add_kernel", where);
    detail::validate_launch(config, "add_kernel", where);
    prepare(NodeType::kernel, deps, "add_kernel", where);
    const bool programmatic = deps.kind() != EdgeKind::plain;
    if (programmatic) {
      refuse_programmatic(deps, reinterpret_cast<const void*>(kernel), "add_kernel", where);
    }
    detail::KernelArgPack<Params...> pack(::std::forward<Args>(args)...);
    const ::cudaKernelNodeParams params = detail::kernel_node_params(kernel, config, pack);
    ::cudaGraphNode_t node = nullptr;
    check(::cudaGraphAddKernelNode(&node, graph_, programmatic ? nullptr : deps.data(), programmatic ? 0 : deps.size(),
                                   &params),
          "cudaGraphAddKernelNode", where);
    if (programmatic) {
      add_edges_or_remove(deps, node, where);
    }
    return KernelNode<Params...>(node, kernel, config);
  }

  // A 1-D copy of `bytes` bytes (kind cudaMemcpyDefault: CUDA infers it).
  MemcpyNode add_memcpy(void* dst, const void* src, ::std::size_t bytes, const Deps& deps = {},
                        ::cudaMemcpyKind kind = ::cudaMemcpyDefault,
                        ::std::source_location where = ::std::source_location::current()) {
    prepare(NodeType::memcpy, deps, "add_memcpy", where);
    if (bytes == 0) {
      throw usage_error("add_memcpy: nothing to copy (zero bytes); CUDA refuses an empty memcpy node", where);
    }
    ::cudaGraphNode_t node = nullptr;
    check(::cudaGraphAddMemcpyNode1D(&node, graph_, deps.data(), deps.size(), dst, src, bytes, kind),
          "cudaGraphAddMemcpyNode1D", where);
    return MemcpyNode(node);
  }
  // Typed copy: element counts must match.
  template <class T>
    requires ::std::is_trivially_copyable_v<T>
  MemcpyNode add_copy(::std::span<T> dst, ::std::span<const T> src, const Deps& deps = {},
                      ::std::source_location where = ::std::source_location::current()) {
    detail::check_copy_spans(dst, src, "add_copy", where);
    return add_memcpy(dst.data(), src.data(), dst.size_bytes(), deps, ::cudaMemcpyDefault, where);
  }

  // Fills device memory `dst` with `value` (elements of 1, 2 or 4 bytes).
  template <memset_element T>
  MemsetNode add_fill(::std::span<T> dst, ::std::type_identity_t<T> value, const Deps& deps = {},
                      ::std::source_location where = ::std::source_location::current()) {
    prepare(NodeType::memset, deps, "add_fill", where);
    detail::refuse_empty_fill(dst.size(), "add_fill", where);
    const ::cudaMemsetParams params = detail::memset_params(dst, value);
    ::cudaGraphNode_t node = nullptr;
    check(::cudaGraphAddMemsetNode(&node, graph_, deps.data(), deps.size(), &params), "cudaGraphAddMemsetNode",
          where);
    return MemsetNode(node);
  }
  // Byte fill, like cudaMemset.
  MemsetNode add_memset(void* dst, unsigned char value, ::std::size_t bytes, const Deps& deps = {},
                        ::std::source_location where = ::std::source_location::current()) {
    return add_fill(::std::span<unsigned char>(static_cast<unsigned char*>(dst), bytes), value, deps, where);
  }

  // A node calling `fn()` on a CUDA host thread. The graph owns a copy of
  // `fn` (see host_node.hpp): it lives as long as the graph and every
  // executable graph made from it. `fn`, and its destructor, must not call CUDA.
  template <class F>
    requires ::std::invocable<::std::decay_t<F>&> && ::std::move_constructible<::std::decay_t<F>>
  HostNode add_host(F&& fn, const Deps& deps = {}, ::std::source_location where = ::std::source_location::current());

  // A node running a copy of `child` (a captured section, say: a Graph, or a
  // graph owned elsewhere, such as torch's). CUDA refuses child graphs holding
  // conditional or memory nodes; so does this, by name.
  ChildGraphNode add_child(GraphRef child, const Deps& deps = {},
                           ::std::source_location where = ::std::source_location::current());

  // Records `event` when the node runs. The event must outlive the launches.
  EventRecordNode add_event_record(const Event& event, const Deps& deps = {},
                                   ::std::source_location where = ::std::source_location::current()) {
    prepare(NodeType::event_record, deps, "add_event_record", where);
    ::cudaGraphNode_t node = nullptr;
    check(::cudaGraphAddEventRecordNode(&node, graph_, deps.data(), deps.size(),
                                        detail::event_handle(event, "add_event_record", where)),
          "cudaGraphAddEventRecordNode", where);
    return EventRecordNode(node);
  }
  // Waits, on the device, for the last record of `event` before the launch.
  EventWaitNode add_event_wait(const Event& event, const Deps& deps = {},
                               ::std::source_location where = ::std::source_location::current()) {
    prepare(NodeType::wait_event, deps, "add_event_wait", where);
    ::cudaGraphNode_t node = nullptr;
    check(::cudaGraphAddEventWaitNode(&node, graph_, deps.data(), deps.size(),
                                      detail::event_handle(event, "add_event_wait", where)),
          "cudaGraphAddEventWaitNode", where);
    return EventWaitNode(node);
  }

  // Allocates `bytes` of device memory on the current device, in graph order.
  MemAllocNode add_mem_alloc(::std::size_t bytes, const Deps& deps = {},
                             ::std::source_location where = ::std::source_location::current());
  // Frees memory a memory-allocation node (of this or an earlier-launched graph) made.
  MemFreeNode add_mem_free(void* ptr, const Deps& deps = {},
                           ::std::source_location where = ::std::source_location::current()) {
    prepare(NodeType::mem_free, deps, "add_mem_free", where);
    if (ptr == nullptr) {
      throw usage_error("add_mem_free: null pointer", where);
    }
    ::cudaGraphNode_t node = nullptr;
    check(::cudaGraphAddMemFreeNode(&node, graph_, deps.data(), deps.size(), ptr), "cudaGraphAddMemFreeNode", where);
    return MemFreeNode(node);
  }
  MemFreeNode add_mem_free(const MemAllocNode& allocation, const Deps& deps = {},
                           ::std::source_location where = ::std::source_location::current()) {
    return add_mem_free(allocation.ptr(), deps, where);
  }

  // An edge from `from` to `to` (both of this graph).
  void add_dependency(const Node& from, const Node& to,
                      ::std::source_location where = ::std::source_location::current()) {
    const ::cudaGraphNode_t a = from.handle(where);
    const ::cudaGraphNode_t b = to.handle(where);
#if CUDART_VERSION >= 13000
    check(::cudaGraphAddDependencies(handle(where), &a, &b, nullptr, 1), "cudaGraphAddDependencies", where);
#else
    check(::cudaGraphAddDependencies(handle(where), &a, &b, 1), "cudaGraphAddDependencies", where);
#endif
  }

#if CUDART_VERSION >= 12030
  // A programmatic edge from kernel node `from` to kernel node `to` (CUDA's
  // edge data): with EdgeKind::programmatic, `to` may start once every block
  // of `from` has called replay::release_dependent_grids() or exited, and must
  // call replay::wait_for_prerequisite_grid() before it reads what `from`
  // writes (pdl.hpp); with EdgeKind::launch_completion, once every block of
  // `from` has begun. usage_error when either node is not a kernel node, for
  // another kind (add_dependency makes plain edges), or when the current
  // device, where the graph will be instantiated, is older than compute
  // capability 9.0, or when `to`'s kernel code there was compiled from PTX
  // older than 9.0 (its wait compiled out: programmatic_launch_supported(kernel)
  // says). add_kernel(..., Deps::programmatic(from), ...) adds the kernel and
  // its programmatic edges in one call, with the same refusals.
  void add_programmatic_dependency(const Node& from, const Node& to, EdgeKind kind = EdgeKind::programmatic,
                                   ::std::source_location where = ::std::source_location::current());
#else
  // Programmatic edges need CUDA 12.3's edge data: refused at compile time here.
  template <class N = Node>
  void add_programmatic_dependency(const N&, const N&, EdgeKind = EdgeKind::programmatic) {
    static_assert(sizeof(N) == 0, "replay: programmatic edges need CUDA 12.3 or newer (cudaGraphEdgeData)");
  }
#endif

  // Captures what `work(stream)` issues on `stream` straight into this graph
  // (or body), after `deps` (cudaStreamBeginCaptureToGraph). Returns the new
  // nodes that nothing else among them depends on: depend on those to run
  // after the captured section (`deps` again when nothing was captured).
  // If `work` throws or the capture breaks, the nodes it added are removed
  // again and the error propagates; in a conditional body, capturing a node
  // type CUDA does not allow there is a usage_error naming the node.
  template <class Work>
  ::std::vector<Node> capture(StreamRef stream, Work&& work, const Deps& deps = {},
                              CaptureMode mode = CaptureMode::this_thread,
                              ::std::source_location where = ::std::source_location::current());

#if CUDART_VERSION >= 12040
  // ---- conditional nodes ----

  // A handle for a conditional node of this graph, reset to `default_value`
  // at the start of every launch; set on the device with handle.set(v).
  ConditionalHandle make_condition(unsigned int default_value = 0,
                                   ::std::source_location where = ::std::source_location::current()) {
    ::cudaGraphConditionalHandle handle_out = 0;
    check(::cudaGraphConditionalHandleCreate(&handle_out, handle(where), default_value, ::cudaGraphCondAssignDefault),
          "cudaGraphConditionalHandleCreate", where);
    return ConditionalHandle::from_native_handle(handle_out);
  }

  // IF: body(0) runs when the value is non-zero.
  ConditionalNode add_if(ConditionalHandle condition, const Deps& deps = {},
                         ::std::source_location where = ::std::source_location::current());
  // WHILE: body(0) runs as long as the value is non-zero (tested before each pass).
  ConditionalNode add_while(ConditionalHandle condition, const Deps& deps = {},
                            ::std::source_location where = ::std::source_location::current());
#if CUDART_VERSION >= 12080
  // IF/ELSE: body(0) runs when the value is non-zero, body(1) when it is zero.
  ConditionalNode add_if_else(ConditionalHandle condition, const Deps& deps = {},
                              ::std::source_location where = ::std::source_location::current());
  // SWITCH: body(v) runs for value v; for v >= cases no body runs (CUDA's rule).
  ConditionalNode add_switch(ConditionalHandle condition, unsigned int cases, const Deps& deps = {},
                             ::std::source_location where = ::std::source_location::current());
#else
  template <class Handle = ConditionalHandle>
  void add_if_else(Handle, const Deps& = {}) {
    static_assert(sizeof(Handle) == 0, "replay: IF/ELSE conditional nodes need CUDA 12.8 or newer");
  }
  template <class Handle = ConditionalHandle>
  void add_switch(Handle, unsigned int, const Deps& = {}) {
    static_assert(sizeof(Handle) == 0, "replay: SWITCH conditional nodes need CUDA 12.8 or newer");
  }
#endif
#endif  // CUDART_VERSION >= 12040

 private:
  GraphBuilder(::cudaGraph_t graph, bool body) noexcept : graph_(graph), body_(body) {}

  ::cudaGraph_t handle(const ::std::source_location& where) const {
    if (graph_ == nullptr) [[unlikely]] {
      throw usage_error("GraphBuilder: no graph (built from a null cudaGraph_t)", where);
    }
    return graph_;
  }
  // The graph as a GraphRef, whose inspection this builder's is.
  GraphRef view(const ::std::source_location& where) const { return GraphRef(handle(where)); }

  void prepare(NodeType type, const Deps& deps, const char* adding, const ::std::source_location& where) const {
    (void)handle(where);
    deps.validate(adding, where, type == NodeType::kernel);
    if (body_ && !detail::allowed_in_conditional_body(type)) {
      throw usage_error(::std::string(adding) + ": " + detail::conditional_body_rule + "; cannot add a " +
                            ::std::string(to_string(type)) + " node",
                        where);
    }
  }
  void refuse_in_body(const ::std::vector<::cudaGraphNode_t>& nodes, const char* adding,
                      const ::std::source_location& where) const {
    if (::cudaGraphNode_t bad = detail::find_node(
            nodes, [](NodeType t) { return !detail::allowed_in_conditional_body(t); }, where)) {
      throw usage_error(::std::string(adding) + ": " + detail::conditional_body_rule + "; the child graph holds a " +
                            describe_node(bad),
                        where);
    }
  }

  ::std::vector<::cudaGraphNode_t> new_nodes(const ::std::vector<::cudaGraphNode_t>& before,
                                             const ::std::source_location& where) const {
    auto after = GraphRef(graph_).nodes(where);
    auto old = before;
    ::std::sort(old.begin(), old.end());
    ::std::erase_if(after, [&](::cudaGraphNode_t n) { return ::std::binary_search(old.begin(), old.end(), n); });
    return after;
  }
  void remove_new_nodes(const ::std::vector<::cudaGraphNode_t>& before) const noexcept {
    try {
      for (::cudaGraphNode_t node : new_nodes(before, ::std::source_location::current())) {
        (void)::cudaGraphDestroyNode(node);
      }
    } catch (...) {
      (void)::cudaGetLastError();
    }
  }

  // Programmatic dependencies of a new kernel node (graph_builder/detail/edges.hpp):
  // refused for non-kernel nodes, older devices and a `kernel` compiled from
  // older PTX, before the node is added;
  // the edges, the node removed again when CUDA refuses one.
  void refuse_programmatic(const Deps& deps, const void* kernel, const char* adding,
                           const ::std::source_location& where) const;
  void add_edges_or_remove(const Deps& deps, ::cudaGraphNode_t node, const ::std::source_location& where) const;

#if CUDART_VERSION >= 12040
  ConditionalNode add_conditional(ConditionalKind kind, ConditionalHandle condition, unsigned int bodies,
                                  const Deps& deps, const ::std::source_location& where);
#endif

  ::cudaGraph_t graph_ = nullptr;
  bool body_ = false;
};

}  // namespace replay

// The out-of-line parts: the nodes that take more than one CUDA call, capture
// into the graph, conditional nodes.
#include "replay/graph_builder/detail/builder_nodes.hpp"
#include "replay/graph_builder/detail/capture.hpp"
#include "replay/graph_builder/detail/edges.hpp"
#include "replay/graph_builder/conditional_node.hpp"
