#pragma once
#include <replay/detail/require_cxx20.hpp>
// KernelNode<Params...>: a kernel node typed over its kernel's own parameter
// list. Arguments are checked at compile time against void(*)(Params...)
// (count and convertibility, as a <<<>>> launch would), never passed as void**.
// The node's arguments and launch configuration can be updated in place on an
// executable graph (cudaGraphExecKernelNodeSetParams) with the same checks.
#include <cuda_runtime_api.h>

#include <concepts>
#include <cstddef>
#include <source_location>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#include "replay/detail/kernel_args.hpp"
#include "replay/error.hpp"
#include "replay/graph.hpp"
#include "replay/graph_builder/node.hpp"
#include "replay/graph_exec.hpp"

namespace replay {

namespace detail {

template <class... Params>
::cudaKernelNodeParams kernel_node_params(void (*kernel)(Params...), const LaunchConfig& config,
                                          KernelArgPack<Params...>& args) noexcept {
  ::cudaKernelNodeParams params{};
  params.func = reinterpret_cast<void*>(kernel);
  params.gridDim = config.grid;
  params.blockDim = config.block;
  params.sharedMemBytes = config.shared_bytes;
  params.kernelParams = args.data();
  params.extra = nullptr;
  return params;
}

inline void validate_launch(const LaunchConfig& config, const char* what, const ::std::source_location& where) {
  validate_dimensions(config.grid, config.block, what, where);
}

}  // namespace detail

template <class... Params>
class KernelNode : public Node {
 public:
  using kernel_type = void (*)(Params...);

  KernelNode() noexcept = default;

  // The typed handle of a kernel node made elsewhere (by capture, say). Checks
  // that the node is a kernel node and launches `kernel`; usage_error naming
  // the node otherwise.
  [[nodiscard]] static KernelNode from_node(Node node, kernel_type kernel,
                                            ::std::source_location where = ::std::source_location::current()) {
    ::cudaKernelNodeParams params{};
    if (node.type(where) != NodeType::kernel) {
      throw usage_error("KernelNode::from_node: " + node.describe() + " is not a kernel node", where);
    }
    check(::cudaGraphKernelNodeGetParams(node.get(), &params), "cudaGraphKernelNodeGetParams", where);
    if (params.func != reinterpret_cast<void*>(kernel)) {
      throw usage_error("KernelNode::from_node: " + node.describe() +
                            " launches a different kernel than the one given",
                        where);
    }
    return KernelNode(node.get(), kernel, LaunchConfig{params.gridDim, params.blockDim, params.sharedMemBytes});
  }

  kernel_type kernel() const noexcept { return kernel_; }
  // The launch configuration the node was made with (an exec's later
  // set_params() does not change it).
  const LaunchConfig& config() const noexcept { return config_; }

  // New arguments for this node in `exec`, with the launch configuration it
  // was made with. Takes effect for launches made after the call.
  template <class... Args>
    requires(kernel_signature<Params...>::template accepts<Args...>)
  void set_args(ExecSite exec, Args&&... args) const {
    apply(exec, config_, ::std::forward<Args>(args)...);
  }

  // New launch configuration and arguments for this node in `exec`.
  template <class... Args>
    requires(kernel_signature<Params...>::template accepts<Args...>)
  void set_params(ExecSite exec, const LaunchConfig& config, Args&&... args) const {
    detail::validate_launch(config, "KernelNode::set_params", exec.where());
    apply(exec, config, ::std::forward<Args>(args)...);
  }

 private:
  friend class GraphBuilder;
  KernelNode(::cudaGraphNode_t node, kernel_type fn, const LaunchConfig& launch) noexcept
      : Node(node), kernel_(fn), config_(launch) {}

  template <class... Args>
  void apply(const ExecSite& site, const LaunchConfig& config, Args&&... args) const {
    detail::KernelArgPack<Params...> pack(::std::forward<Args>(args)...);
    const ::cudaKernelNodeParams params = detail::kernel_node_params(kernel_, config, pack);
    detail::check_node(
        ::cudaGraphExecKernelNodeSetParams(site.exec().handle(site.where()), handle(site.where()), &params),
        "cudaGraphExecKernelNodeSetParams", get(), "updating", site.where());
  }

  kernel_type kernel_ = nullptr;
  LaunchConfig config_{};
};

// The one kernel node of `graph` that launches `kernel`, typed; usage_error
// when there is none or more than one.
template <class... Params>
[[nodiscard]] KernelNode<Params...> find_kernel_node(const Graph& graph, void (*kernel)(Params...),
                                                     ::std::source_location where = ::std::source_location::current()) {
  Node found;
  for (::cudaGraphNode_t node : graph.nodes(where)) {
    ::cudaGraphNodeType type{};
    check(::cudaGraphNodeGetType(node, &type), "cudaGraphNodeGetType", where);
    if (type != ::cudaGraphNodeTypeKernel) {
      continue;
    }
    ::cudaKernelNodeParams params{};
    check(::cudaGraphKernelNodeGetParams(node, &params), "cudaGraphKernelNodeGetParams", where);
    if (params.func == reinterpret_cast<void*>(kernel)) {
      if (found) {
        throw usage_error("find_kernel_node: the graph launches this kernel from more than one node (" +
                              found.describe() + " and another)",
                          where);
      }
      found = Node::from_native_handle(node);
    }
  }
  if (!found) {
    throw usage_error("find_kernel_node: no kernel node of the graph launches this kernel", where);
  }
  return KernelNode<Params...>::from_node(found, kernel, where);
}

}  // namespace replay
