#pragma once
#include <replay/detail/require_cxx20.hpp>
// MemcpyNode: a 1-D copy node, whose addresses and size can be changed in
// place on an executable graph (cudaGraphExecMemcpyNodeSetParams1D; CUDA
// allows new addresses of the same kind of memory, in the same context).
#include <cuda_runtime_api.h>

#include <cstddef>
#include <source_location>
#include <span>
#include <string>
#include <type_traits>

#include "replay/error.hpp"
#include "replay/graph_builder/node.hpp"
#include "replay/graph_exec.hpp"

namespace replay {

namespace detail {
template <class T, class U>
void check_copy_spans(::std::span<T> dst, ::std::span<U> src, const char* what, const ::std::source_location& where) {
  if (dst.size() != src.size()) {
    throw usage_error(::std::string(what) + ": destination holds " + ::std::to_string(dst.size()) +
                          " elements, source " + ::std::to_string(src.size()),
                      where);
  }
}
}  // namespace detail

class MemcpyNode : public Node {
 public:
  MemcpyNode() noexcept = default;

  // New addresses and size for this copy in `exec`.
  void set_params(GraphExec& exec, void* dst, const void* src, ::std::size_t bytes,
                  ::cudaMemcpyKind kind = ::cudaMemcpyDefault,
                  ::std::source_location where = ::std::source_location::current()) const {
    detail::check_node(::cudaGraphExecMemcpyNodeSetParams1D(exec.handle(where), handle(where), dst, src, bytes, kind),
                       "cudaGraphExecMemcpyNodeSetParams1D", get(), "updating", where);
  }
  // Typed: element counts must match (usage_error otherwise).
  template <class T>
    requires ::std::is_trivially_copyable_v<T>
  void set_params(GraphExec& exec, ::std::span<T> dst, ::std::span<const T> src,
                  ::std::source_location where = ::std::source_location::current()) const {
    detail::check_copy_spans(dst, src, "MemcpyNode::set_params", where);
    set_params(exec, dst.data(), src.data(), dst.size_bytes(), ::cudaMemcpyDefault, where);
  }

 private:
  friend class GraphBuilder;
  explicit MemcpyNode(::cudaGraphNode_t node) noexcept : Node(node) {}
};

}  // namespace replay
