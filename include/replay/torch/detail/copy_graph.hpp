#pragma once
#include <replay/detail/require_cxx20.hpp>
// A set of copies issued as one graph launch. GraphedCallable stages its
// inputs and copies its safe-mode outputs out this way: a cudaMemcpyAsync
// costs the calling thread about 4 us of host time, a cudaGraphLaunch of a
// few kernel nodes about 1.3 us and re-pointing a node well under that.
#include <cuda_runtime_api.h>

#include <cstddef>
#include <optional>
#include <source_location>
#include <span>
#include <vector>

#include "replay/detail/copy_kernel.hpp"
#include "replay/error.hpp"
#include "replay/graph.hpp"
#include "replay/graph_exec.hpp"
#include "replay/stream_ref.hpp"

namespace replay::detail {

// One copy: `bytes` from `source` to `target`, both device addresses
// (device memory, or pinned host memory through its device mapping).
struct ByteCopy {
  const void* source;
  void* target;
  ::std::size_t bytes;
  bool operator==(const ByteCopy&) const = default;
};

// One copy-kernel node per copy, all independent, in one executable graph.
// Before a launch, only the nodes whose copy changed are re-pointed (a copy
// the same as last time, or a node already left over, costs no call).
// cudaGraphExecKernelNodeSetParams changes only later launches, so the
// previous launch may still be running while the next one is set up. Not thread-safe: its owner serializes calls.
// The graph belongs to the device that was current when it was built.
class CopyGraph {
 public:
  CopyGraph() = default;
  CopyGraph(const CopyGraph&) = delete;
  CopyGraph& operator=(const CopyGraph&) = delete;
  CopyGraph(CopyGraph&&) noexcept = default;
  CopyGraph& operator=(CopyGraph&&) noexcept = default;
  ~CopyGraph() = default;

  // Enqueues `copies` on `stream` as one launch (nothing when there are
  // none). Builds the graph on first use and again only for more copies
  // than it has nodes; nodes left over copy nothing.
  void launch(::std::span<const ByteCopy> copies, StreamRef stream, const ::std::source_location& where) {
    if (copies.empty()) {
      return;
    }
    if (!exec_ || copies.size() > nodes_.size()) {
      build(copies, where);
    } else {
      for (::std::size_t i = 0; i < nodes_.size(); ++i) {
        const ByteCopy c = i < copies.size() ? copies[i] : ByteCopy{nullptr, nullptr, 0};
        if (Node& node = nodes_[i]; node.copy != c) {
          check(repoint_copy_node(exec_->get(), node.handle, c.source, c.target, c.bytes, where),
                "cudaGraphExecKernelNodeSetParams", where);
          node.copy = c;  // only once CUDA took it
          ++repoints_;
        }
      }
    }
    exec_->launch(stream, where);
  }

  // How many times the graph was built: launches after the first only
  // re-point its nodes, unless they bring more copies than ever before.
  ::std::size_t builds() const noexcept { return builds_; }
  ::std::size_t nodes() const noexcept { return nodes_.size(); }
  // How many node re-pointings (cudaGraphExecKernelNodeSetParams) launches made.
  ::std::size_t repoints() const noexcept { return repoints_; }

 private:
  void build(::std::span<const ByteCopy> copies, const ::std::source_location& where) {
    Graph graph = Graph::create(where);
    ::std::vector<Node> nodes;
    nodes.reserve(copies.size());
    for (const ByteCopy& c : copies) {
      nodes.push_back({add_copy_node(graph.get(), nullptr, c.source, c.target, c.bytes, where), c});
    }
    // An executable graph with launches in flight is freed when they finish
    // (cudaGraphExecDestroy), so the old one may go now.
    exec_.emplace(graph, InstantiateFlags::none, cudaStreamPerThread, where);
    graph_ = ::std::move(graph);
    nodes_ = ::std::move(nodes);
    ++builds_;
  }

  // A node of graph_ and the copy exec_ now makes it do.
  struct Node {
    ::cudaGraphNode_t handle;
    ByteCopy copy;
  };
  Graph graph_;
  ::std::optional<GraphExec> exec_;
  ::std::vector<Node> nodes_;  // one per copy, in order
  ::std::size_t builds_ = 0;
  ::std::size_t repoints_ = 0;
};

}  // namespace replay::detail
