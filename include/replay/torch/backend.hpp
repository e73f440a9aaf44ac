#pragma once
// TorchGraphBackend: the ShapeRouter backend that captures torch work the way
// torch.cuda.graph does, and TorchGraphExec, the graph it keeps per key.
#include <replay/detail/require_cxx20.hpp>

#include <concepts>
#include <cstddef>
#include <memory>
#include <source_location>
#include <string>
#include <utility>
#include <vector>

#include "replay/capture_scope.hpp"
#include "replay/detail/message.hpp"
#include "replay/error.hpp"
#include "replay/shape_router/backend.hpp"
#include "replay/stream_ref.hpp"
#include "replay/torch/capture_context.hpp"
#include "replay/torch/detail/capture.hpp"
#include "replay/torch/errors.hpp"

namespace replay {

// One captured torch graph: the executable graph, and the static outputs its
// replays write (kept alive with it, dropped when the router evicts it).
struct TorchGraphExec {
  ::std::unique_ptr<detail::TorchCudaGraph> graph;
  ::cudaGraphExec_t exec = nullptr;
  ::std::vector<::at::Tensor> outputs;
  bool uses_rng = false;
};

// ShapeRouter backend for torch work, captured the way torch.cuda.graph does:
// through at::cuda::CUDAGraph on the context's capture stream, which is also
// torch's current stream during the capture, with the caching allocator
// routed to the context's private pool (every graph passes the same pool id,
// so N buckets cost about the largest one when captured largest first) and
// the CUDA generators registered. A capture that throws is undone
// (TorchCudaGraph::abandon_capture) before the exception reaches the router,
// which then marks the key eager and keeps serving.
class TorchGraphBackend {
 public:
  using stream_type = StreamRef;
  using exec_type = TorchGraphExec;

  explicit TorchGraphBackend(::std::shared_ptr<TorchCaptureContext> context) : context_(::std::move(context)) {}

  const ::std::shared_ptr<TorchCaptureContext>& context() const noexcept { return context_; }

  // Captures what issue(capture stream) issues. `stream` is not captured on:
  // the device is synchronized first (as torch.cuda.graph does), which orders
  // the capture after everything issued on it.
  template <class Issue>
    requires ::std::invocable<Issue&, StreamRef>
  CapturedGraph<TorchGraphExec> capture(StreamRef /*stream*/, Issue&& issue,
                                        ::std::source_location where = ::std::source_location::current()) const {
    TorchCaptureContext& ctx = *context_;
    const ::c10::DeviceIndex device = ctx.device().index();
    ::c10::cuda::CUDAGuard device_guard(ctx.device());
    check(::cudaDeviceSynchronize(), "cudaDeviceSynchronize", where);
    TorchGraphExec exec;
    exec.graph = ::std::make_unique<detail::TorchCudaGraph>();
    const int uses_before = detail::TorchCudaGraph::pool_use_count(device, ctx.pool());
    const ::std::size_t reserved_before = detail::allocator_reserved_bytes(device);
    ctx.note_capture();
    (void)ctx.take_outputs();
    try {
      ::c10::cuda::CUDAStreamGuard stream_guard(detail::torch_stream(ctx.capture_stream(), device));
#ifdef REPLAY_TORCH_PREPARE_CUBLAS
      // cuBLAS handles keep a workspace per stream, allocated on first use
      // through the caching allocator. Made now, outside the capture, it comes
      // from the ordinary pool; made during the capture it would sit in the
      // private pool for good and keep it from being freed.
      (void)::at::cuda::getCurrentCUDABlasHandle();
      (void)::at::cuda::getCurrentCUDABlasLtHandle();
      (void)::at::cuda::getCUDABlasLtWorkspace();
#endif
      exec.graph->register_generator_state(::at::cuda::detail::getDefaultCUDAGenerator(device));
      for (const ::at::Generator& generator : ctx.generators()) {
        exec.graph->register_generator_state(generator);
      }
      exec.graph->capture_begin(ctx.pool(), static_cast<::cudaStreamCaptureMode>(ctx.mode()));
      ::std::invoke(issue, ctx.capture_stream());
      exec.graph->capture_end();
    } catch (...) {
      exec.graph->abandon_capture(device, ctx.pool(), uses_before, ctx.capture_stream().get());
      (void)ctx.take_outputs();
      throw capture_failed_error(detail::concat("replay: ", detail::describe_capture_failure(), " (capture begun at ",
                                                replay::to_string(where), ")"));
    }
    exec.outputs = ctx.take_outputs();
    exec.exec = exec.graph->raw_cuda_graph_exec();
    exec.uses_rng = exec.graph->uses_rng();
    // Uploaded now, so that the first replay in the serving path pays no upload.
    check(::cudaGraphUpload(exec.exec, ctx.capture_stream().get()), "cudaGraphUpload", where);
    check(::cudaStreamSynchronize(ctx.capture_stream().get()), "cudaStreamSynchronize", where);
    const ::std::size_t reserved_after = detail::allocator_reserved_bytes(device);
    GraphMemory memory;
    memory.footprint_bytes = reserved_after > reserved_before ? reserved_after - reserved_before : 0;
    return CapturedGraph<TorchGraphExec>{::std::move(exec), memory};
  }

  // Captures anew into a new graph that replaces `exec` (torch graphs are not
  // updated in place: the new capture may have drawn new pool memory).
  template <class Issue>
    requires ::std::invocable<Issue&, StreamRef>
  RecaptureResult recapture(TorchGraphExec& exec, StreamRef stream, Issue&& issue,
                            ::std::source_location where = ::std::source_location::current()) const {
    CapturedGraph<TorchGraphExec> fresh = capture(stream, issue, where);
    exec = ::std::move(fresh.exec);
    return RecaptureResult{UpdatePath::reinstantiated, fresh.memory};
  }

  // One cudaGraphLaunch on `stream`; through CUDAGraph::replay() (which
  // advances the generators first) when the capture drew random numbers.
  void launch(const TorchGraphExec& exec, StreamRef stream,
              ::std::source_location where = ::std::source_location::current()) const {
    if (exec.uses_rng) [[unlikely]] {
      const ::c10::DeviceIndex device = context_->device().index();
      ::c10::cuda::CUDAStreamGuard guard(detail::torch_stream(stream, device));
      exec.graph->replay();
    } else {
      check(::cudaGraphLaunch(exec.exec, stream.get()), "cudaGraphLaunch", where);
    }
    context_->note_launch(&exec.outputs);
  }

 private:
  ::std::shared_ptr<TorchCaptureContext> context_;
};

static_assert(GraphBackend<TorchGraphBackend>);

}  // namespace replay
