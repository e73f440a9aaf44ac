#pragma once
#include <replay/detail/require_cxx20.hpp>
// MemAllocNode and MemFreeNode: graph-ordered allocation. The allocation's
// address is fixed when the node is added (CUDA reserves it), so later nodes
// can use it; it is valid on the device from the alloc node until the free
// node (or, without one in the graph, until freed with cudaFreeAsync, another
// graph's free node, or InstantiateFlags::auto_free_on_launch). CUDA allows
// one executable graph at a time for a graph holding memory nodes, and no
// in-place update of their parameters.
#include <cuda_runtime_api.h>

#include <cstddef>

#include "replay/graph_builder/node.hpp"

namespace replay {

class MemAllocNode : public Node {
 public:
  MemAllocNode() noexcept = default;
  void* ptr() const noexcept { return ptr_; }
  template <class T>
  T* as() const noexcept {
    return static_cast<T*>(ptr_);
  }
  ::std::size_t bytes() const noexcept { return bytes_; }

 private:
  friend class GraphBuilder;
  MemAllocNode(::cudaGraphNode_t node, void* ptr, ::std::size_t bytes) noexcept
      : Node(node), ptr_(ptr), bytes_(bytes) {}
  void* ptr_ = nullptr;
  ::std::size_t bytes_ = 0;
};

class MemFreeNode : public Node {
 public:
  MemFreeNode() noexcept = default;

 private:
  friend class GraphBuilder;
  explicit MemFreeNode(::cudaGraphNode_t node) noexcept : Node(node) {}
};

}  // namespace replay
