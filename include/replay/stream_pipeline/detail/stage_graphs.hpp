#pragma once
#include <replay/detail/require_cxx20.hpp>
// CudaStageRunner's compute stage and graph modes: running the compute, capturing the
// slot graphs, launching and re-pointing them; included by stream_pipeline/detail/cuda_stage_runner.hpp.
#include <cuda_runtime_api.h>

#include <cstddef>
#include <span>
#include <source_location>
#include <utility>
#include <vector>

#include "replay/capture_scope.hpp"
#include "replay/detail/copy_kernel.hpp"
#include "replay/stream_pipeline/detail/cuda_stage_runner.hpp"
#include "replay/stream_pipeline/detail/host_copy_pool.hpp"
#include "replay/stream_pipeline/detail/host_memory.hpp"
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
void CudaStageRunner<In, Out>::add_slot_chain(Graph& graph, Slot& slot, const Graph& compute_graph,
                                              ::cudaGraphNode_t& h2d_node, ::cudaGraphNode_t& d2h_node,
                                              const ::std::source_location& where) {
  ::cudaGraphNode_t compute_node = nullptr;
  check(::cudaGraphAddMemcpyNode1D(&h2d_node, graph.handle(where), nullptr, 0, slot.device_in.data(),
                                   slot.staging_in.data(), input_capacity_ * sizeof(In), ::cudaMemcpyHostToDevice),
        "cudaGraphAddMemcpyNode1D", where);
  check(::cudaGraphAddChildGraphNode(&compute_node, graph.handle(where), &h2d_node, 1, compute_graph.handle(where)),
        "cudaGraphAddChildGraphNode", where);
  ::cudaGraphNode_t last = compute_node;
  if (fixed_output_count_ != 0) {  // zero-length copies are not allowed in graphs
    check(::cudaGraphAddMemcpyNode1D(&d2h_node, graph.handle(where), &compute_node, 1, slot.staging_out.data(),
                                     slot.device_out.data(), fixed_output_count_ * sizeof(Out),
                                     ::cudaMemcpyDeviceToHost),
          "cudaGraphAddMemcpyNode1D", where);
    last = d2h_node;
  }
  ::cudaGraphNode_t record_node = nullptr;
  check(::cudaGraphAddEventRecordNode(&record_node, graph.handle(where), &last, 1, slot.copied_out.get()),
        "cudaGraphAddEventRecordNode", where);
}

template <BufferElement In, BufferElement Out>
void CudaStageRunner<In, Out>::capture_graphs(const ::std::source_location& where) {
  // One graph per slot, each captured on that slot's fixed buffers: a replay
  // never needs an address to change.
  const StreamRef capture_stream = compute_stream_->get();
  const bool grouped = has_flag(flags_, PipelineFlags::graph_slot) && items_per_launch_ > 1;
  ::std::vector<Graph> compute_graphs;  // for the group graphs
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
    // graph_slot: H2D -> compute (child graph) -> D2H -> record copied_out.
    // The graph records copied_out itself: one cudaGraphLaunch is the whole
    // per-item issue when the host addresses stay the same.
    slot.stream.emplace(StreamFlags::non_blocking, 0, where);
    Graph whole = Graph::create(where);
    add_slot_chain(whole, slot, compute_graph, slot.h2d_node, slot.d2h_node, where);
    slot.slot_graph.emplace(whole, InstantiateFlags::upload, slot.stream->get(), where);
    slot.slot_graph_source.emplace(::std::move(whole));
    slot.graph_source = slot.staging_in.data();
    slot.graph_target = slot.staging_out.data();
    if (grouped) {
      compute_graphs.push_back(::std::move(compute_graph));
    }
  }
  if (grouped) {
    build_groups(compute_graphs, where);
  }
}

template <BufferElement In, BufferElement Out>
void CudaStageRunner<In, Out>::build_groups(const ::std::vector<Graph>& compute_graphs,
                                            const ::std::source_location& where) {
  // Members alternate between the lanes (SlotGroup says why two); each
  // starts on its staging buffers, as the slot graphs do.
  choose_group_copies(where);
  const ::std::size_t k = items_per_launch_;
  groups_.resize(slots_.size() / k);
  for (::std::size_t g = 0; g < groups_.size(); ++g) {
    SlotGroup& group = groups_[g];
    const ::std::size_t first_slot = g * k;
    group.members.resize(k);
    group.stream.emplace(StreamFlags::non_blocking, 0, where);
    group.done.emplace(event_flags_, where);
    Graph whole = Graph::create(where);
    ::std::vector<::cudaGraphNode_t> lane_tail(SlotGroup::lanes, nullptr);
    for (::std::size_t m = 0; m < k; ++m) {
      Slot& slot = slots_[first_slot + m];
      SlotGroup::Member& member = group.members[m];
      ::cudaGraphNode_t& tail = lane_tail[m % SlotGroup::lanes];
      member.copy_in = add_group_copy(whole, tail, slot.staging_in.data(), slot.device_in.data(),
                                      input_capacity_ * sizeof(In), ::cudaMemcpyHostToDevice, where);
      ::cudaGraphNode_t compute_node = nullptr;
      check(::cudaGraphAddChildGraphNode(&compute_node, whole.handle(where), &member.copy_in, 1,
                                         compute_graphs[first_slot + m].handle(where)),
            "cudaGraphAddChildGraphNode", where);
      tail = compute_node;
      if (fixed_output_count_ != 0) {
        member.copy_out = add_group_copy(whole, compute_node, slot.device_out.data(), slot.staging_out.data(),
                                         fixed_output_count_ * sizeof(Out), ::cudaMemcpyDeviceToHost, where);
        tail = member.copy_out;
      }
      member.source = slot.staging_in.data();
      member.target = slot.staging_out.data();
    }
    ::std::erase(lane_tail, nullptr);
    ::cudaGraphNode_t record_node = nullptr;
    check(::cudaGraphAddEventRecordNode(&record_node, whole.handle(where), lane_tail.data(), lane_tail.size(),
                                        group.done->get()),
          "cudaGraphAddEventRecordNode", where);
    group.exec.emplace(whole, InstantiateFlags::upload, group.stream->get(), where);
    group.source_graph.emplace(::std::move(whole));
  }
}

template <BufferElement In, BufferElement Out>
void CudaStageRunner<In, Out>::choose_group_copies(const ::std::source_location& where) {
  if (group_copies_asked_ == GroupCopies::memcpy_nodes) {
    group_copies_ = {GroupCopies::memcpy_nodes, "PipelineOptions::group_copies is GroupCopies::memcpy_nodes"};
    return;
  }
  const CopyKernelLoad& kernel = copy_kernel_on(device_, where);
  if (kernel.kernel != nullptr) {
    group_copies_ = {GroupCopies::copy_kernel, {}};
    return;
  }
  if (group_copies_asked_ == GroupCopies::copy_kernel) {
    throw cuda_error(kernel.status, kernel.api, where,
                     detail::concat("StreamPipeline: PipelineOptions::group_copies is GroupCopies::copy_kernel, "
                                    "but ", kernel.unavailable, "; use GroupCopies::automatic or memcpy_nodes"));
  }
  group_copies_ = {GroupCopies::memcpy_nodes, kernel.unavailable};
}

// A copy-kernel node's ends: the host end through its device mapping (null
// where it has none), the device end as it is.
inline ::std::pair<const void*, void*> mapped_copy_ends(const void* source, void* target,
                                                        ::cudaMemcpyKind kind) noexcept {
  if (kind == ::cudaMemcpyHostToDevice) {
    return {device_address_of_host(source), target};
  }
  return {source, device_address_of_host(target)};
}

template <BufferElement In, BufferElement Out>
::cudaGraphNode_t CudaStageRunner<In, Out>::add_group_copy(Graph& graph, ::cudaGraphNode_t dependency,
                                                           const void* source, void* target, ::std::size_t bytes,
                                                           ::cudaMemcpyKind kind,
                                                           const ::std::source_location& where) {
  if (group_copies_.copies == GroupCopies::memcpy_nodes) {
    ::cudaGraphNode_t node = nullptr;
    check(::cudaGraphAddMemcpyNode1D(&node, graph.handle(where), dependency != nullptr ? &dependency : nullptr,
                                     dependency != nullptr ? 1 : 0, target, source, bytes, kind),
          "cudaGraphAddMemcpyNode1D", where);
    return node;
  }
  // The kernel reads and writes the pinned staging in place, through its device mapping.
  const auto [device_source, device_target] = mapped_copy_ends(source, target, kind);
  if (device_source == nullptr || device_target == nullptr) {
    throw cuda_error(::cudaErrorInvalidValue, "cudaPointerGetAttributes", where,
                     "StreamPipeline: the device cannot address the slots' pinned staging, which launch groups "
                     "copy in place (GroupCopies::copy_kernel needs unified addressing; "
                     "GroupCopies::memcpy_nodes does not)");
  }
  return add_copy_node(graph.handle(where), dependency, device_source, device_target, bytes, where);
}

template <BufferElement In, BufferElement Out>
bool CudaStageRunner<In, Out>::set_group_copy(SlotGroup& group, ::cudaGraphNode_t node, const void* source,
                                              void* target, ::std::size_t bytes, ::cudaMemcpyKind kind,
                                              const ::std::source_location& where) {
  if (group_copies_.copies == GroupCopies::memcpy_nodes) {
    // Pinned host memory only, as on the copy-kernel path: anything else goes through the staging.
    const void* const host = kind == ::cudaMemcpyHostToDevice ? source : target;
    return host_memory_at(host) == HostMemory::pinned &&
           succeeded(::cudaGraphExecMemcpyNodeSetParams1D(group.exec->get(), node, target, source, bytes, kind));
  }
  const auto [device_source, device_target] = mapped_copy_ends(source, target, kind);
  return device_source != nullptr && device_target != nullptr &&
         set_copy_node(group.exec->get(), node, device_source, device_target, bytes, where);
}

template <BufferElement In, BufferElement Out>
void CudaStageRunner<In, Out>::start_group(::std::span<const PipelineGroupItem<CudaStageRunner>> items,
                                           const ::std::source_location& where) {
  SlotGroup& group = groups_[items[0].slot / items_per_launch_];
  const ::std::size_t produced = fixed_output_count_;
  DeviceScope device(device_, where);
  try {
    for (::std::size_t m = 0; m < items.size(); ++m) {
      const PipelineGroupItem<CudaStageRunner>& item = items[m];
      Slot& slot = slots_[item.slot];
      slot.begin(item.id, item.destination ? item.destination->data() : nullptr,
                 item.destination ? item.destination->size() : 0, where);
      // prepare() left the input where this slot's own graph reads it (the
      // caller's pinned memory, or the staging): the member reads the same,
      // unless the device cannot address that memory; then it goes through
      // the staging after all.
      if (!point_member_in(group, m, slot, slot.graph_source, where)) {
        if (slot.graph_source != slot.staging_in.data()) {
          stage_input(slot, item.input, nullptr, where);
          inputs_in_place_.fetch_sub(1, ::std::memory_order_relaxed);  // counted in place by prepare()
          inputs_staged_.fetch_add(1, ::std::memory_order_relaxed);
        }
        if (!point_member_in(group, m, slot, slot.staging_in.data(), where)) {
          throw cuda_error(::cudaErrorInvalidValue, "cudaGraphExecKernelNodeSetParams", where,
                           "StreamPipeline: could not point a group's copy-in at the slot's staging");
        }
      }
      Out* target = output_target(slot, produced, item.destination.has_value(), item.plan, where);
      if (produced != 0 && !point_member_out(group, m, slot, target, where)) {
        // The device cannot address the caller's buffer: go through staging instead.
        target = slot.staging_out.data();
        slot.output = target;
        slot.copy_to_destination = item.destination.has_value();
        if (!point_member_out(group, m, slot, target, where)) {
          throw cuda_error(::cudaErrorInvalidValue, "cudaGraphExecKernelNodeSetParams", where,
                           "StreamPipeline: could not point a group's copy-out at the slot's staging");
        }
      }
      if (target == slot.staging_out.data()) {
        slot.out_chunks = plan_chunks(produced * sizeof(Out), chunk_bytes_);
      }
    }
    group.exec->launch(group.stream->get(), where);  // records group.done at its end
  } catch (...) {
    for (const auto& item : items) {
      fence(slots_[item.slot]);
    }
    throw;
  }
  for (const auto& item : items) {
    Slot& slot = slots_[item.slot];
    slot.done = group.done->get();
    count_output_path(slot);
  }
  grouped_items_.fetch_add(items.size(), ::std::memory_order_relaxed);
}

template <BufferElement In, BufferElement Out>
bool CudaStageRunner<In, Out>::point_member_in(SlotGroup& group, ::std::size_t m, const Slot& slot,
                                               const void* source, const ::std::source_location& where) {
  SlotGroup::Member& member = group.members[m];
  if (member.source == source) {
    return true;
  }
  if (!set_group_copy(group, member.copy_in, source, slot.device_in.data(), input_capacity_ * sizeof(In),
                      ::cudaMemcpyHostToDevice, where)) {
    return false;
  }
  member.source = source;
  graph_retargets_.fetch_add(1, ::std::memory_order_relaxed);
  return true;
}

template <BufferElement In, BufferElement Out>
bool CudaStageRunner<In, Out>::point_member_out(SlotGroup& group, ::std::size_t m, const Slot& slot, void* target,
                                                const ::std::source_location& where) {
  SlotGroup::Member& member = group.members[m];
  if (member.target == target) {
    return true;
  }
  if (!set_group_copy(group, member.copy_out, slot.device_out.data(), target, fixed_output_count_ * sizeof(Out),
                      ::cudaMemcpyDeviceToHost, where)) {
    return false;
  }
  member.target = target;
  graph_retargets_.fetch_add(1, ::std::memory_order_relaxed);
  return true;
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
