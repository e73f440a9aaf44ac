#pragma once
// CudaGraphBackend: ShapeRouter's GPU backend, stream capture into a Graph
// instantiated (and uploaded) as a GraphExec.
#include <replay/detail/require_cxx20.hpp>

#include <cuda_runtime_api.h>

#include <concepts>
#include <cstddef>
#include <source_location>
#include <utility>

#include "replay/capture_scope.hpp"
#include "replay/device.hpp"
#include "replay/error.hpp"
#include "replay/flags.hpp"
#include "replay/graph.hpp"
#include "replay/graph_exec.hpp"
#include "replay/shape_router/backend.hpp"
#include "replay/shape_router/graph_memory.hpp"
#include "replay/shape_router/stats.hpp"
#include "replay/stream_ref.hpp"

namespace replay {

// The GPU backend: stream capture into a Graph, instantiated as a GraphExec.
// Allocations the captured work makes with cudaMallocAsync/cudaFreeAsync
// become graph memory nodes, served from the device's graph memory pool, which
// all graphs launched into the same stream share (see docs/shape_router.md).
class CudaGraphBackend {
 public:
  using stream_type = StreamRef;
  using exec_type = GraphExec;

  // `flags` for every instantiation; with InstantiateFlags::upload (the
  // default) each new or re-instantiated graph is uploaded on the capturing
  // stream, so its first launch pays no upload and its pool memory is mapped
  // when it is captured, not in the serving path.
  explicit CudaGraphBackend(CaptureMode mode = CaptureMode::this_thread,
                            InstantiateFlags flags = InstantiateFlags::upload) noexcept
      : mode_(mode),
        upload_(has_flag(flags, InstantiateFlags::upload)),
        // Uploads are issued explicitly on the capturing stream (see upload_),
        // never on the stream a GraphExec remembers from its construction.
        flags_(flags & ~InstantiateFlags::upload) {}

  template <class Issue>
    requires ::std::invocable<Issue&, StreamRef>
  CapturedGraph<GraphExec> capture(StreamRef stream, Issue&& issue,
                                   ::std::source_location where = ::std::source_location::current()) const {
    Graph graph = replay::capture(stream, issue, mode_, where);
    GraphMemory memory;
    memory.alloc_bytes = graph_alloc_bytes(graph, where);
    const ::std::size_t free_before = detail::free_device_bytes(where);
    GraphExec exec(graph, flags_, stream, where);
    if (upload_) {
      exec.upload(stream, where);
    }
    memory.footprint_bytes = drop(free_before, detail::free_device_bytes(where));
    return CapturedGraph<GraphExec>{::std::move(exec), memory};
  }

  // Captures anew and goes through GraphExec::update: cudaGraphExecUpdate in
  // place (same topology, new pointers or parameters), re-instantiation when
  // CUDA refuses. An update in place is safe while earlier launches still run
  // (they keep the old parameters); a replaced executable graph is freed by
  // CUDA once its launches finish.
  template <class Issue>
    requires ::std::invocable<Issue&, StreamRef>
  RecaptureResult recapture(GraphExec& exec, StreamRef stream, Issue&& issue,
                            ::std::source_location where = ::std::source_location::current()) const {
    Graph graph = replay::capture(stream, issue, mode_, where);
    RecaptureResult result;
    result.memory.alloc_bytes = graph_alloc_bytes(graph, where);
    const ::std::size_t free_before = detail::free_device_bytes(where);
    try {
      result.path = exec.update(graph, stream, where).path;
    } catch (const cuda_error& e) {
      // Some node kinds (e.g. memory nodes on some drivers) are refused with
      // an error status rather than cudaErrorGraphExecUpdateFailure: that is
      // still a refusal, so re-instantiate; a real error recurs right here.
      // (check() left no copy of the refusal in the runtime's last-error slot.)
      if (e.is_capture_error()) {
        throw;
      }
      exec = GraphExec(graph, flags_, stream, where);
      result.path = UpdatePath::reinstantiated;
    }
    if (upload_ && result.path == UpdatePath::reinstantiated) {
      exec.upload(stream, where);
    }
    result.memory.footprint_bytes = drop(free_before, detail::free_device_bytes(where));
    return result;
  }

  void launch(const GraphExec& exec, StreamRef stream,
              ::std::source_location where = ::std::source_location::current()) const {
    exec.launch(stream, where);
  }

  GraphPoolMemory pool_memory(::std::source_location where = ::std::source_location::current()) const {
    return graph_pool_memory(current_device(where), where);
  }

 private:
  static ::std::size_t drop(::std::size_t before, ::std::size_t after) noexcept {
    return before > after ? before - after : 0;
  }

  CaptureMode mode_;
  bool upload_;
  InstantiateFlags flags_;
};

static_assert(GraphBackend<CudaGraphBackend>);
static_assert(ReportsPoolMemory<CudaGraphBackend>);

}  // namespace replay
