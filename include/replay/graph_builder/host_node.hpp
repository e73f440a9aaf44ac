#pragma once
#include <replay/detail/require_cxx20.hpp>
// HostNode: a node that calls a C++ callable on a CUDA host thread. The graph
// owns the callable through a CUDA user object (cudaUserObjectCreate, moved
// into the graph with cudaGraphRetainUserObject), so it lives as long as the
// graph, every clone of it and every executable graph made from it, and is
// destroyed once the last of them is gone and their launches are done.
// The callable runs on a CUDA thread and must not call CUDA. An exception it
// throws cannot cross CUDA; the first one is kept and rethrown by
// HostNode::rethrow_if_failed().
#include <cuda_runtime_api.h>

#include <atomic>
#include <concepts>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <source_location>
#include <type_traits>
#include <utility>

#include "replay/error.hpp"
#include "replay/graph_builder/node.hpp"

namespace replay {

namespace detail {

// What a host node's user data points at: the failure slot is shared with
// every HostNode handle so that it outlives the callable if need be.
struct HostCallFailure {
  ::std::mutex mutex;
  ::std::exception_ptr error;
};

template <class F>
struct HostCallable {
  F fn;
  ::std::shared_ptr<HostCallFailure> failure;

  static void CUDART_CB call(void* self) noexcept {
    auto* holder = static_cast<HostCallable*>(self);
    try {
      ::std::invoke(holder->fn);
    } catch (...) {
      const ::std::lock_guard<::std::mutex> lock(holder->failure->mutex);
      if (!holder->failure->error) {
        holder->failure->error = ::std::current_exception();
      }
    }
  }
  static void CUDART_CB destroy(void* self) noexcept { delete static_cast<HostCallable*>(self); }
};

}  // namespace detail

class HostNode : public Node {
 public:
  HostNode() noexcept = default;

  // Rethrows the first exception the callable threw, if any (and forgets it).
  void rethrow_if_failed() const {
    if (!failure_) {
      return;
    }
    ::std::exception_ptr error;
    {
      const ::std::lock_guard<::std::mutex> lock(failure_->mutex);
      error = ::std::exchange(failure_->error, nullptr);
    }
    if (error) {
      ::std::rethrow_exception(error);
    }
  }

 private:
  friend class GraphBuilder;
  HostNode(::cudaGraphNode_t node, ::std::shared_ptr<detail::HostCallFailure> failure) noexcept
      : Node(node), failure_(::std::move(failure)) {}

  ::std::shared_ptr<detail::HostCallFailure> failure_;
};

}  // namespace replay
