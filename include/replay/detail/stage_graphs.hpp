#pragma once
#include <replay/detail/require_cxx20.hpp>
// CudaStageRunner's compute stage and graph modes: running the compute, capturing the
// slot graphs, launching and re-pointing them; included by detail/cuda_stage_runner.hpp.
#include <cuda_runtime_api.h>

#include <cstddef>
#include <source_location>
#include <utility>

#include "replay/capture_scope.hpp"
#include "replay/detail/cuda_stage_runner.hpp"
#include "replay/detail/host_copy_pool.hpp"
#include "replay/detail/message.hpp"
#include "replay/error.hpp"
#include "replay/flags.hpp"
#include "replay/graph.hpp"
#include "replay/graph_exec.hpp"
#include "replay/stream_ref.hpp"

namespace replay::detail {

template <BufferElement In, BufferElement Out>
::std::size_t CudaStageRunner<In, Out>::run_compute(Slot& slot, ::std::size_t n, StreamRef stream,
                                                    const ::std::source_location& where) {
  // A compute that reports its count gets the whole output; otherwise the planned count.
  const ::std::size_t planned =
      compute_.reports_count() ? output_capacity_ : (output_count_ ? output_count_(n) : n);
  if (planned > output_capacity_) {
    throw usage_error(detail::concat("StreamPipeline: output_count(", n, ") is ", detail::elements(planned),
                                     " but a slot's output holds at most ", detail::elements(output_capacity_)),
                      where);
  }
  const ::std::size_t produced =
      compute_(slot.device_in.first(n, where), slot.device_out.first(planned, where), stream);
  if (produced > output_capacity_) {
    throw usage_error(detail::concat("StreamPipeline: the compute stage reported ", detail::elements(produced),
                                     " of output but a slot holds at most ", detail::elements(output_capacity_)),
                      where);
  }
  return produced;
}

template <BufferElement In, BufferElement Out>
void CudaStageRunner<In, Out>::capture_graphs(const ::std::source_location& where) {
  // One graph per slot, each captured on that slot's fixed buffers: a replay
  // never needs an address to change.
  const StreamRef capture_stream = compute_stream_->get();
  for (::std::size_t i = 0; i < slots_.size(); ++i) {
    Slot& slot = slots_[i];
    ::std::size_t produced = 0;
    Graph compute_graph = capture(
        capture_stream, [&](StreamRef s) { produced = run_compute(slot, input_capacity_, s, where); },
        CaptureMode::this_thread, where);
    if (i == 0) {
      fixed_output_count_ = produced;
    } else if (produced != fixed_output_count_) {
      throw usage_error(
          detail::concat("StreamPipeline graph mode: the compute stage reported ", detail::elements(produced),
                         " for slot ", i, " but ", detail::elements(fixed_output_count_),
                         " for slot 0; a captured stage must produce a fixed count"),
          where);
    }
    if (has_flag(flags_, PipelineFlags::graph_compute)) {
      slot.compute_graph.emplace(compute_graph, InstantiateFlags::upload, capture_stream, where);
      continue;
    }
    // graph_slot: H2D -> compute (child graph) -> D2H.
    slot.stream.emplace(StreamFlags::non_blocking, 0, where);
    Graph whole = Graph::create(where);
    ::cudaGraphNode_t compute_node = nullptr;
    check(::cudaGraphAddMemcpyNode1D(&slot.h2d_node, whole.handle(where), nullptr, 0, slot.device_in.data(),
                                     slot.staging_in.data(), input_capacity_ * sizeof(In),
                                     ::cudaMemcpyHostToDevice),
          "cudaGraphAddMemcpyNode1D", where);
    check(::cudaGraphAddChildGraphNode(&compute_node, whole.handle(where), &slot.h2d_node, 1,
                                       compute_graph.handle(where)),
          "cudaGraphAddChildGraphNode", where);
    if (fixed_output_count_ != 0) {  // zero-length copies are not allowed in graphs
      check(::cudaGraphAddMemcpyNode1D(&slot.d2h_node, whole.handle(where), &compute_node, 1,
                                       slot.staging_out.data(), slot.device_out.data(),
                                       fixed_output_count_ * sizeof(Out), ::cudaMemcpyDeviceToHost),
            "cudaGraphAddMemcpyNode1D", where);
    }
    // The graph records copied_out itself: one cudaGraphLaunch is the whole
    // per-item issue when the host addresses stay the same.
    ::cudaGraphNode_t last = slot.d2h_node != nullptr ? slot.d2h_node : compute_node;
    ::cudaGraphNode_t record_node = nullptr;
    check(::cudaGraphAddEventRecordNode(&record_node, whole.handle(where), &last, 1, slot.copied_out.get()),
          "cudaGraphAddEventRecordNode", where);
    slot.slot_graph.emplace(whole, InstantiateFlags::upload, slot.stream->get(), where);
    slot.slot_graph_source.emplace(::std::move(whole));
    slot.graph_source = slot.staging_in.data();
    slot.graph_target = slot.staging_out.data();
  }
}

template <BufferElement In, BufferElement Out>
void CudaStageRunner<In, Out>::start_slot_graph(Slot& slot, bool has_destination, const plan_type& plan,
                                                const ::std::source_location& where) {
  const ::std::size_t produced = fixed_output_count_;
  Out* target = output_target(slot, produced, has_destination, plan, where);
  if (produced != 0 && !point_d2h(slot, target, produced * sizeof(Out))) {
    // The graph refused the caller's buffer: go through staging instead.
    target = slot.staging_out.data();
    slot.output = target;
    slot.copy_to_destination = has_destination;
    if (!point_d2h(slot, target, produced * sizeof(Out))) {
      throw cuda_error(::cudaErrorInvalidValue, "cudaGraphExecMemcpyNodeSetParams1D", where,
                       "StreamPipeline: could not point the slot graph's copy-out back at its staging buffer");
    }
  }
  if (target == slot.staging_out.data()) {
    slot.out_chunks = plan_chunks(produced * sizeof(Out), chunk_bytes_);  // copied out after the graph, in parallel
  }
  slot.slot_graph->launch(slot.stream->get(), where);  // records copied_out at its end
  count_output_path(slot);
}

template <BufferElement In, BufferElement Out>
bool CudaStageRunner<In, Out>::point_h2d(Slot& slot, const void* source, ::std::size_t bytes) noexcept {
  if (slot.graph_source == source) {
    return true;
  }
  if (!succeeded(::cudaGraphExecMemcpyNodeSetParams1D(slot.slot_graph->get(), slot.h2d_node, slot.device_in.data(),
                                                      source, bytes, ::cudaMemcpyHostToDevice))) {
    return false;
  }
  slot.graph_source = source;
  graph_retargets_.fetch_add(1, ::std::memory_order_relaxed);
  return true;
}

template <BufferElement In, BufferElement Out>
bool CudaStageRunner<In, Out>::point_d2h(Slot& slot, void* target, ::std::size_t bytes) noexcept {
  if (slot.graph_target == target) {
    return true;
  }
  if (!succeeded(::cudaGraphExecMemcpyNodeSetParams1D(slot.slot_graph->get(), slot.d2h_node, target,
                                                      slot.device_out.data(), bytes, ::cudaMemcpyDeviceToHost))) {
    return false;
  }
  slot.graph_target = target;
  graph_retargets_.fetch_add(1, ::std::memory_order_relaxed);
  return true;
}

}  // namespace replay::detail
