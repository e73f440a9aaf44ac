#pragma once
#include <replay/detail/require_cxx20.hpp>
// MemsetNode: a 1-D fill of 1-, 2- or 4-byte elements, whose destination,
// value and count can be changed in place on an executable graph
// (cudaGraphExecMemsetNodeSetParams; the destination must stay in the same
// context and, as CUDA requires, be device memory).
#include <cuda_runtime_api.h>

#include <bit>
#include <cstddef>
#include <cstdint>
#include <source_location>
#include <span>
#include <type_traits>

#include "replay/error.hpp"
#include "replay/graph_builder/node.hpp"
#include "replay/graph_exec.hpp"

namespace replay {

// Element types a memset node can fill: trivially copyable, 1, 2 or 4 bytes.
template <class T>
concept memset_element = ::std::is_trivially_copyable_v<T> && (sizeof(T) == 1 || sizeof(T) == 2 || sizeof(T) == 4);

namespace detail {
template <memset_element T>
unsigned int memset_bits(const T& value) noexcept {
  if constexpr (sizeof(T) == 1) {
    return ::std::bit_cast<::std::uint8_t>(value);
  } else if constexpr (sizeof(T) == 2) {
    return ::std::bit_cast<::std::uint16_t>(value);
  } else {
    return ::std::bit_cast<::std::uint32_t>(value);
  }
}
template <memset_element T>
::cudaMemsetParams memset_params(::std::span<T> dst, const T& value) noexcept {
  ::cudaMemsetParams params{};
  params.dst = static_cast<void*>(dst.data());
  params.pitch = 0;
  params.value = memset_bits(value);
  params.elementSize = sizeof(T);
  params.width = dst.size();
  params.height = 1;
  return params;
}
inline void refuse_empty_fill(::std::size_t count, const char* what, const ::std::source_location& where) {
  if (count == 0) {
    throw usage_error(::std::string(what) + ": nothing to fill (zero elements); CUDA refuses an empty memset node",
                      where);
  }
}
}  // namespace detail

class MemsetNode : public Node {
 public:
  MemsetNode() noexcept = default;

  // New destination, value and count for this fill in `exec`.
  template <memset_element T>
  void set_params(GraphExec& exec, ::std::span<T> dst, T value,
                  ::std::source_location where = ::std::source_location::current()) const {
    detail::refuse_empty_fill(dst.size(), "MemsetNode::set_params", where);
    const ::cudaMemsetParams params = detail::memset_params(dst, value);
    detail::check_node(::cudaGraphExecMemsetNodeSetParams(exec.handle(where), handle(where), &params),
                       "cudaGraphExecMemsetNodeSetParams", get(), "updating", where);
  }

 private:
  friend class GraphBuilder;
  explicit MemsetNode(::cudaGraphNode_t node) noexcept : Node(node) {}
};

}  // namespace replay
