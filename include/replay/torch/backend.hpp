#pragma once
// TorchGraphBackend: the ShapeRouter backend that captures torch work the way
// torch.cuda.graph does, and TorchGraphExec, the graph it keeps per key.
#include <replay/detail/require_cxx20.hpp>

#include <concepts>
#include <cstddef>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <source_location>
#include <string>
#include <utility>
#include <vector>

#include "replay/capture_scope.hpp"
#include "replay/device.hpp"
#include "replay/detail/capture_coordinator.hpp"
#include "replay/detail/capture_observer.hpp"
#include "replay/detail/message.hpp"
#include "replay/error.hpp"
#include "replay/event.hpp"
#include "replay/shape_router/backend.hpp"
#include "replay/stream_ref.hpp"
#include "replay/torch/capture_context.hpp"
#include "replay/torch/detail/capture.hpp"
#include "replay/torch/detail/operator_names.hpp"
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
// the generators of the context registered. A capture that throws is undone
// (TorchCudaGraph::abandon_capture) before the exception reaches the router:
// capture_interrupted_error when something outside the work broke it (the
// router retries), capture_failed_error otherwise (the key is marked eager).
//
// Threads: captures of one context are serialized (they share its capture
// stream and pool); the device's default CUDA generator is not put into
// capture mode unless the context asks for it (see TorchCaptureContext), so
// eager random numbers in other threads keep working during a capture.
class TorchGraphBackend {
 public:
  using stream_type = StreamRef;
  using exec_type = TorchGraphExec;

  explicit TorchGraphBackend(::std::shared_ptr<TorchCaptureContext> context)
      : context_(::std::move(context)), order_(::std::make_shared<Order>()) {}

  const ::std::shared_ptr<TorchCaptureContext>& context() const noexcept { return context_; }

  // Captures what issue(capture stream) issues. The capture stream is first
  // ordered after `stream` (an event, not a device-wide synchronization: that
  // would break other threads' captures) and drained, which orders the
  // capture after everything issued on `stream`.
  template <class Issue>
    requires ::std::invocable<Issue&, StreamRef>
  CapturedGraph<TorchGraphExec> capture(StreamRef stream, Issue&& issue,
                                        ::std::source_location where = ::std::source_location::current()) const {
    TorchCaptureContext& ctx = *context_;
    const ::c10::DeviceIndex device = ctx.device().index();
    ::c10::cuda::CUDAGuard device_guard(ctx.device());
    const ::std::lock_guard<::std::mutex> one_capture(ctx.capture_mutex());
    const StreamRef side = ctx.capture_stream();
    if (!(stream == side)) {
      Event ordered(EventFlags::disable_timing, where);
      ordered.record(stream, where);
      ordered.wait_on(side, where);
    }
    check(::cudaStreamSynchronize(side.get()), "cudaStreamSynchronize", where);
    // Captures that put generators into capture mode take turns (see
    // generator_capture_mutex); the others run side by side.
    const bool default_generator = ctx.captures_default_generator();
    const bool exclusive = default_generator || !ctx.generators().empty();
    ::std::unique_lock<::std::shared_mutex> generators_exclusive(detail::generator_capture_mutex(), ::std::defer_lock);
    ::std::shared_lock<::std::shared_mutex> generators_shared(detail::generator_capture_mutex(), ::std::defer_lock);
    if (exclusive) {
      generators_exclusive.lock();
    } else {
      generators_shared.lock();
    }
    // The capture audit, when switched on (GraphedOptions::audit, the
    // router's switch, or REPLAY_AUDIT=1): recording from capture_begin to
    // capture_end, its verdict added to a failure's message.
    ::std::unique_ptr<detail::CaptureObservation> observation =
        detail::observe_capture(AuditSwitch::from_environment, where);
    TorchGraphExec exec;
    exec.graph = ::std::make_unique<detail::TorchCudaGraph>();
    const int uses_before = detail::TorchCudaGraph::pool_use_count(device, ctx.pool());
    const ::std::size_t reserved_before = ctx.pool_reserved_bytes();
    ctx.note_capture();
    (void)ctx.take_outputs();
    try {
      ::c10::cuda::CUDAStreamGuard stream_guard(detail::torch_stream(side, device));
#ifdef REPLAY_TORCH_PREPARE_CUBLAS
      // cuBLAS handles keep a workspace per stream, allocated on first use
      // through the caching allocator. Made now, outside the capture, it comes
      // from the ordinary pool; made during the capture it would sit in the
      // private pool for good and keep it from being freed.
      (void)::at::cuda::getCurrentCUDABlasHandle();
      (void)::at::cuda::getCurrentCUDABlasLtHandle();
      (void)::at::cuda::getCUDABlasLtWorkspace();
#endif
      if (default_generator) {
        exec.graph->register_generator_state(::at::cuda::detail::getDefaultCUDAGenerator(device));
      }
      for (const ::at::Generator& generator : ctx.generators()) {
        exec.graph->register_generator_state(generator);
      }
      // Counted as open on the device, so that synchronize_device() waits for it.
      const detail::CaptureToken token(static_cast<int>(device));
      {
        // capture_begin puts the default generator into capture mode; unless
        // asked for, it is taken out again before any other thread's eager
        // random numbers (which lock this mutex) can see it.
        ::at::Generator default_gen = ::at::cuda::detail::getDefaultCUDAGenerator(device);
        ::std::unique_lock<::std::mutex> default_gen_lock(default_gen.mutex(), ::std::defer_lock);
        if (!default_generator) {
          default_gen_lock.lock();
        }
        const ::std::vector<const void*> keep = exec.graph->registered_generator_states();
        exec.graph->capture_begin(ctx.pool(), static_cast<::cudaStreamCaptureMode>(ctx.mode()));
        if (!default_generator) {
          exec.graph->leave_capture_mode_except(keep);
        }
      }
      ::std::optional<detail::OperatorTracking> operators;
      if (observation) {
        operators.emplace();  // each finding names the aten operator that was running
        observation->begin(side.get(), static_cast<int>(ctx.mode()), where);
      }
      ::std::invoke(issue, side);
      if (observation) {
        observation->stop();
      }
      exec.graph->capture_end();
    } catch (...) {
      const bool interrupted = detail::capture_was_interrupted();
      if (observation) {
        observation->stop();
      }
      exec.graph->abandon_capture(device, ctx.pool(), uses_before, side.get());
      (void)ctx.take_outputs();
      ::std::string message = detail::concat("replay: ", detail::describe_capture_failure(), " (capture begun at ",
                                             replay::to_string(where), ")");
      if (observation) {
        // The end status is not known here (capture_end may not have run).
        if (const ::std::string verdict = observation->end(-1, nullptr); !verdict.empty()) {
          message += "; ";
          message += verdict;
        }
      }
      if (interrupted) {
        throw capture_interrupted_error(message);
      }
      throw capture_failed_error(message);
    }
    if (observation) {
      // Reports escaped work of a capture that succeeded (the graph itself
      // is kept by CUDAGraph only as its executable: no inventory here).
      (void)observation->end(::cudaSuccess, nullptr);
      observation.reset();
    }
    generators_exclusive = {};
    generators_shared = {};
    exec.outputs = ctx.take_outputs();
    exec.exec = exec.graph->raw_cuda_graph_exec();
    exec.uses_rng = exec.graph->uses_rng();
    // Uploaded now, so that the first replay in the serving path pays no upload.
    check(::cudaGraphUpload(exec.exec, side.get()), "cudaGraphUpload", where);
    check(::cudaStreamSynchronize(side.get()), "cudaStreamSynchronize", where);
    GraphMemory memory;
    // What this graph added to the private pool (other threads' allocations
    // go to other pools and are not counted).
    const ::std::size_t reserved_after = ctx.pool_reserved_bytes();
    memory.footprint_bytes = reserved_after > reserved_before ? reserved_after - reserved_before : 0;
    return CapturedGraph<TorchGraphExec>{::std::move(exec), memory};
  }

  // Stream ordering (see OrdersStreams): mark() records the order event on
  // `s` right after the router's work on it, wait_mark() makes `to` wait for
  // the latest record, drain() synchronizes the device once no replay
  // capture is open on it (the first switch of a router whose runs were not
  // marked: the earlier stream may be gone).
  void mark(StreamRef s, ::std::source_location where = ::std::source_location::current()) {
    order_event(where).record(s, where);
  }
  void wait_mark(StreamRef to, ::std::source_location where = ::std::source_location::current()) {
    order_event(where).wait_on(to, where);
  }
  void drain(StreamRef /*to*/, ::std::source_location where = ::std::source_location::current()) {
    ::c10::cuda::CUDAGuard device_guard(context_->device());
    synchronize_device(where);
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
  EventRef order_event(const ::std::source_location& where) {
    const ::std::lock_guard<::std::mutex> lock(order_->mutex);
    if (!order_->event.has_value()) {
      ::c10::cuda::CUDAGuard device_guard(context_->device());
      order_->event.emplace(EventFlags::disable_timing, where);
    }
    return *order_->event;
  }
  struct Order {
    ::std::mutex mutex;
    ::std::optional<Event> event;  // made on the first mark or switch
  };
  ::std::shared_ptr<Order> order_;
};

static_assert(GraphBackend<TorchGraphBackend>);
static_assert(OrdersStreams<TorchGraphBackend>);

}  // namespace replay
