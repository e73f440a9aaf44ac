#pragma once
// TorchGraphBackend: the ShapeRouter backend that captures torch work the way
// torch.cuda.graph does, and TorchGraphExec, the graph it keeps per key.
#include <replay/detail/require_cxx20.hpp>

#include <concepts>
#include <cstddef>
#include <functional>
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
#include "replay/flags.hpp"
#include "replay/graph.hpp"
#include "replay/graph_exec.hpp"
#include "replay/shape_router/backend.hpp"
#include "replay/shape_router/graph_memory.hpp"
#include "replay/stream_ref.hpp"
#include "replay/torch/capture_context.hpp"
#include "replay/torch/detail/capture.hpp"
#include "replay/torch/detail/operator_names.hpp"
#include "replay/torch/detail/piecewise.hpp"
#include "replay/torch/errors.hpp"
#include "replay/torch/piecewise.hpp"

namespace replay {

// One captured torch graph: the executable graph, and the static outputs its
// replays write (kept alive with it, dropped when the router evicts it).
struct TorchGraphExec {
  // The capture; it holds a reference on the pool the captured section's
  // tensors live in.
  ::std::unique_ptr<detail::TorchCudaGraph> graph;
  // What launch() launches: torch's executable graph, or wrapped_exec's.
  ::cudaGraphExec_t exec = nullptr;
  ::std::vector<::at::Tensor> outputs;
  bool uses_rng = false;
  // With a graph wrapper (see TorchGraphWrapper): the graph it built around
  // the captured section, kept for node handles the wrapper made. Declared
  // after `graph`, whose pool memory the section reads and writes, so that it
  // goes first.
  Graph wrapped;
  // With a graph wrapper: `wrapped` instantiated and uploaded (`exec` is its handle).
  ::std::optional<GraphExec> wrapped_exec;
  // A capture broken by operators on the eager list (TorchBreaks::piecewise):
  // its paths of segments; `graph` and `exec` are then empty, and launch()
  // goes through it.
  ::std::shared_ptr<detail::TorchPiecewise> piecewise;
};

// Builds the graph a TorchGraphBackend instantiates and launches in place of
// a captured torch section: `captured` is the section (torch's graph, owned
// by the backend, alive during the call), `stream` the context's capture
// stream, idle (for GraphBuilder::capture of work of your own; not for torch
// work, whose allocations would bypass the context's pool). Typically the
// section becomes a child node (GraphBuilder::add_child, which copies it) in
// the body of a WHILE node, so that one launch runs it several times.
// Called once per capture (recaptures included), right after the section was
// captured, on the capturing thread with the context's capture lock held:
// work that records which key it is capturing can tell the wrapper. What it
// throws makes the capture fail (capture_failed_error, naming the wrapper).
using TorchGraphWrapper = ::std::function<Graph(GraphRef captured, StreamRef stream)>;

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
// With a graph wrapper (TorchGraphWrapper) the graph launched for a key is
// the wrapper's, built around the captured section; without one (the
// default) it is the section itself, as torch.cuda.graph makes it. A key run
// eagerly (warm-up, failed capture) runs the work once, as issued: tell the
// two apart by Route::graph().
//
// Threads: captures of one context are serialized (they share its capture
// stream and pool); the device's default CUDA generator is not put into
// capture mode unless the context asks for it (see TorchCaptureContext), so
// eager random numbers in other threads keep working during a capture.
class TorchGraphBackend {
 public:
  using stream_type = StreamRef;
  using exec_type = TorchGraphExec;

  // `wrapper`: empty (the default), each key's graph is the captured section.
  explicit TorchGraphBackend(::std::shared_ptr<TorchCaptureContext> context, TorchGraphWrapper wrapper = {},
                             ::std::source_location where = ::std::source_location::current())
      : context_(checked_context(::std::move(context), where)),
        wrapper_(::std::move(wrapper)),
        order_(::std::make_shared<Order>()) {}

  const ::std::shared_ptr<TorchCaptureContext>& context() const noexcept { return context_; }
  // True when constructed with a graph wrapper.
  bool wraps_graphs() const noexcept { return static_cast<bool>(wrapper_); }

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
    // TorchBreaks::piecewise: the operators on the eager list break the
    // capture into segments (not with a wrapper, which wraps one section,
    // nor with registered generators, which advance once per graph launch).
    if (ctx.breaks() == TorchBreaks::piecewise && !wraps_graphs() && !exclusive) {
      return capture_piecewise(ctx, side, issue, where);
    }
    // The capture audit, when switched on (GraphedOptions::audit, the
    // router's switch, or REPLAY_AUDIT=1): recording from capture_begin to
    // capture_end, its verdict added to a failure's message.
    ::std::unique_ptr<detail::CaptureObservation> observation =
        detail::observe_capture(AuditSwitch::from_environment, where);
    TorchGraphExec exec;
    // With a wrapper, torch keeps the captured graph and never instantiates it.
    exec.graph = ::std::make_unique<detail::TorchCudaGraph>(/*keep_graph=*/wraps_graphs());
    const int uses_before = detail::TorchCudaGraph::pool_use_count(device, ctx.pool());
    const ::std::size_t reserved_before = ctx.pool_reserved_bytes();
    ctx.note_capture();
    (void)ctx.take_outputs();
    try {
      ::c10::cuda::CUDAStreamGuard stream_guard(detail::torch_stream(side, device));
      detail::prepare_cublas_for_capture();
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
      // The end status is not known here (capture_end may not have run).
      const detail::CaptureVerdict verdict = observation ? observation->end(-1, nullptr) : detail::CaptureVerdict{};
      ::std::string message =
          detail::concat("replay: ",
                         detail::describe_capture_failure(verdict.names_cause ? CaptureErrorHint::omitted
                                                                              : CaptureErrorHint::likely_causes),
                         " (capture begun at ", replay::to_string(where), ")");
      if (!verdict.text.empty()) {
        message += "; ";
        message += verdict.text;
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
    exec.uses_rng = exec.graph->uses_rng();
    GraphMemory memory;
    // Whatever throws from here leaves a finished capture: destroying `exec`
    // gives its pool reference back (CUDAGraph::reset()).
    if (wraps_graphs()) {
      wrap(exec, memory, side, where);  // instantiated and uploaded
    } else {
      exec.exec = exec.graph->raw_cuda_graph_exec();
      // Uploaded now, so that the first replay in the serving path pays no upload.
      check(::cudaGraphUpload(exec.exec, side.get()), "cudaGraphUpload", where);
    }
    check(::cudaStreamSynchronize(side.get()), "cudaStreamSynchronize", where);
    // What this graph added to the private pool (other threads' allocations
    // go to other pools and are not counted).
    const ::std::size_t reserved_after = ctx.pool_reserved_bytes();
    memory.footprint_bytes += reserved_after > reserved_before ? reserved_after - reserved_before : 0;
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

  // Gives back the device graph-pool memory that no live graph uses
  // (cudaDeviceGraphMemTrim): the memory nodes of wrapped graphs the router
  // evicted. Nothing to do without a wrapper.
  void trim(::std::source_location /*where*/ = ::std::source_location::current()) noexcept {
    if (wraps_graphs()) {
      (void)detail::succeeded(::cudaDeviceGraphMemTrim(static_cast<int>(context_->device().index())));
    }
  }

  // One cudaGraphLaunch on `stream` (of the wrapper's graph, where there is
  // one); through CUDAGraph::replay() (which advances the generators first)
  // when the capture drew random numbers.
  void launch(const TorchGraphExec& exec, StreamRef stream,
              ::std::source_location where = ::std::source_location::current()) const {
    if (exec.piecewise) [[unlikely]] {
      exec.piecewise->launch(stream, where);  // notes the launched path's outputs
      return;
    }
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
  static ::std::shared_ptr<TorchCaptureContext> checked_context(::std::shared_ptr<TorchCaptureContext> context,
                                                                const ::std::source_location& where) {
    if (!context) {
      throw usage_error("TorchGraphBackend: no TorchCaptureContext (a null pointer)", where);
    }
    return context;
  }

  // The piecewise capture (the context's locks held): runs the work once,
  // live, on the capture stream, breaking at the operators on the eager list.
  // Without a break the key keeps one graph, as capture() makes it.
  template <class Issue>
  CapturedGraph<TorchGraphExec> capture_piecewise(TorchCaptureContext& ctx, StreamRef side, Issue& issue,
                                                  const ::std::source_location& where) const {
    const ::c10::DeviceIndex device = ctx.device().index();
    const bool audit = detail::effective_audit_switch(AuditSwitch::from_environment) != AuditSwitch::off;
    const detail::TorchPiecewiseConfig config = detail::TorchPiecewiseConfig::of(ctx, audit);
    const ::std::size_t reserved_before = ctx.pool_reserved_bytes();
    ctx.note_capture();
    (void)ctx.take_outputs();
    (void)ctx.take_work();
    ::std::unique_ptr<detail::TorchPath> path;
    try {
      ::c10::cuda::CUDAStreamGuard stream_guard(detail::torch_stream(side, device));
      detail::prepare_cublas_for_capture();
      const detail::CaptureToken token(static_cast<int>(device));
      detail::TorchPathRecorder recorder(config, side);
      path = recorder.record([&issue](StreamRef s) { ::std::invoke(issue, s); }, where);
    } catch (...) {
      const bool interrupted = detail::capture_was_interrupted();
      (void)ctx.take_outputs();
      const ::std::string message = detail::concat("replay: ", detail::describe_capture_failure(), " (capture begun at ",
                                                   replay::to_string(where), ")");
      if (interrupted) {
        throw capture_interrupted_error(message);
      }
      throw capture_failed_error(message);
    }
    path->outputs = ctx.take_outputs();
    ::std::function<void(StreamRef)> work = ctx.take_work();
    check(::cudaStreamSynchronize(side.get()), "cudaStreamSynchronize", where);  // the work ran, live
    GraphMemory memory;
    const ::std::size_t reserved_after = ctx.pool_reserved_bytes();
    memory.footprint_bytes = reserved_after > reserved_before ? reserved_after - reserved_before : 0;
    TorchGraphExec exec;
    if (path->regions.empty()) {
      exec.graph = ::std::move(path->segments.front().graph);
      exec.exec = path->segments.front().exec;
      exec.outputs = ::std::move(path->outputs);
      return CapturedGraph<TorchGraphExec>{::std::move(exec), memory};
    }
    exec.piecewise = ::std::make_shared<detail::TorchPiecewise>(config, ::std::move(work), context_);
    exec.piecewise->add(::std::move(path));
    ctx.note_piecewise(ctx.work_key(), exec.piecewise);
    return CapturedGraph<TorchGraphExec>{::std::move(exec), memory};
  }

  // Hands the captured section to the wrapper, then instantiates (with
  // InstantiateFlags::use_node_priority, as torch instantiates a section) and
  // uploads the graph it returns; `memory` gets that graph's allocation
  // nodes and the device graph pool's growth.
  void wrap(TorchGraphExec& exec, GraphMemory& memory, StreamRef side, const ::std::source_location& where) const {
    if (exec.uses_rng) {
      // CUDAGraph::replay() moves a generator's offset on once per launch;
      // every run of the section inside one launch would draw the same numbers.
      throw usage_error("TorchGraphBackend: the captured work draws random numbers from a registered generator, "
                        "which a graph wrapper cannot serve: the generator advances once per launch, so every run "
                        "of the section inside the wrapper's graph would repeat the same numbers; draw them outside "
                        "the wrapped work, or use a backend without a wrapper",
                        where);
    }
    Graph wrapped;
    try {
      wrapped = wrapper_(GraphRef(exec.graph->raw_cuda_graph()), side);
    } catch (...) {
      throw capture_failed_error(detail::concat("replay: TorchGraphBackend's graph wrapper failed: ",
                                                detail::describe_torch_exception(), " (capture begun at ",
                                                replay::to_string(where), ")"));
    }
    if (!wrapped) {
      throw capture_failed_error(detail::concat("replay: TorchGraphBackend's graph wrapper returned an empty Graph "
                                                "(capture begun at ",
                                                replay::to_string(where), ")"));
    }
    const int device = static_cast<int>(context_->device().index());
    memory.alloc_bytes = graph_alloc_bytes(wrapped, where);
    const ::std::size_t graph_pool_before = graph_pool_memory(device, where).reserved;
    try {
      exec.wrapped_exec.emplace(wrapped, InstantiateFlags::use_node_priority | InstantiateFlags::upload, side, where);
    } catch (const cuda_error& e) {
      if (e.status() == ::cudaErrorMemoryAllocation) {
        throw capture_interrupted_error(e.what());
      }
      throw capture_failed_error(
          detail::concat("replay: instantiating the graph TorchGraphBackend's graph wrapper returned failed: ",
                         e.what()));
    }
    const ::std::size_t graph_pool_after = graph_pool_memory(device, where).reserved;
    memory.footprint_bytes = graph_pool_after > graph_pool_before ? graph_pool_after - graph_pool_before : 0;
    exec.wrapped = ::std::move(wrapped);
    exec.exec = exec.wrapped_exec->get();
  }

  ::std::shared_ptr<TorchCaptureContext> context_;
  TorchGraphWrapper wrapper_;
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
static_assert(TrimsMemory<TorchGraphBackend>);

}  // namespace replay
