#pragma once
// The CUDA stage runner behind StreamPipeline: each slot's buffers, events,
// streams and graphs, and the copy-in / compute / copy-out stages it issues.
#include <replay/detail/require_cxx20.hpp>

#include <cuda_runtime_api.h>

#include <atomic>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <source_location>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "replay/capture_scope.hpp"
#include "replay/stream_pipeline/detail/compute_stage.hpp"
#include "replay/detail/copy_kernel.hpp"
#include "replay/detail/device_scope.hpp"
#include "replay/stream_pipeline/detail/host_copy_pool.hpp"
#include "replay/stream_pipeline/detail/host_memory.hpp"
#include "replay/stream_pipeline/detail/options_check.hpp"
#include "replay/detail/message.hpp"
#include "replay/device.hpp"
#include "replay/error.hpp"
#include "replay/event.hpp"
#include "replay/flags.hpp"
#include "replay/graph.hpp"
#include "replay/graph_exec.hpp"
#include "replay/stream_pipeline/detail/stage_slot.hpp"
#include "replay/static_buffer.hpp"
#include "replay/stream.hpp"
#include "replay/stream_pipeline/host_range.hpp"
#include "replay/stream_pipeline/options.hpp"
#include "replay/stream_pipeline/stage_runner.hpp"
#include "replay/stream_pipeline/stats.hpp"
#include "replay/stream_ref.hpp"

namespace replay::detail {

// The CUDA stage runner: the slots' buffers, events, streams and graphs, and
// how one item's stages are issued and awaited.
template <BufferElement In, BufferElement Out>
class CudaStageRunner {
 public:
  using input_type = In;
  using output_type = Out;
  struct plan_type {
    bool input_pinned = false;        // copy to the device straight from the caller's memory
    bool destination_pinned = false;  // copy from the device straight into the caller's memory
  };

  CudaStageRunner(PipelineOptions options, ComputeStage<In, Out> compute, ::std::source_location where)
      : input_capacity_(options.input_capacity),
        output_capacity_(options.output_capacity != 0 ? options.output_capacity : options.input_capacity),
        flags_(options.flags),
        output_count_(::std::move(options.output_count)),
        compute_(::std::move(compute)),
        chunk_bytes_(options.staging_chunk_bytes),
        items_per_launch_(options.items_per_launch),
        group_copies_asked_(options.group_copies),
        copiers_(options.host_copy_threads, [this]() noexcept { (void)::cudaSetDevice(device_); }) {
    validate_pipeline_options(options, static_cast<bool>(compute_), where);
    device_ = current_device(where);
    event_flags_ = has_flag(flags_, PipelineFlags::blocking_wait)
                       ? EventFlags::disable_timing | EventFlags::blocking_sync
                       : EventFlags::disable_timing;
    const EventFlags event_flags = event_flags_;
    h2d_.emplace(StreamFlags::non_blocking, 0, where);
    compute_stream_.emplace(StreamFlags::non_blocking, 0, where);
    d2h_.emplace(StreamFlags::non_blocking, 0, where);
    slots_.reserve(options.slots);
    for (::std::size_t i = 0; i < options.slots; ++i) {
      slots_.emplace_back(input_capacity_, output_capacity_,
                          max_chunks_for(output_capacity_ * sizeof(Out), chunk_bytes_), event_flags, where);
    }
    if (has_flag(flags_, PipelineFlags::slot_streams)) {
      for (Slot& slot : slots_) {
        slot.stream.emplace(StreamFlags::non_blocking, 0, where);
      }
    }
    if (graph_mode()) {
      capture_graphs(where);
      if (has_flag(flags_, PipelineFlags::slot_streams)) {
        // The compute graphs were uploaded on the compute stream; they are
        // launched on the slot streams.
        compute_stream_->synchronize(where);
      }
    }
  }

  CudaStageRunner(const CudaStageRunner&) = delete;
  CudaStageRunner& operator=(const CudaStageRunner&) = delete;
  CudaStageRunner(CudaStageRunner&&) = delete;
  CudaStageRunner& operator=(CudaStageRunner&&) = delete;

  ~CudaStageRunner() {
    // The pipeline settled every item; this also covers graph uploads.
    for (SlotGroup& group : groups_) {
      if (group.stream) {
        (void)::cudaStreamSynchronize(group.stream->get());
      }
    }
    for (Slot& slot : slots_) {
      if (slot.stream) {
        (void)::cudaStreamSynchronize(slot.stream->get());
      }
    }
    for (auto* stream : {&h2d_, &compute_stream_, &d2h_}) {
      if (*stream) {
        (void)::cudaStreamSynchronize((*stream)->get());
      }
    }
  }

  // ---- what the pipeline core asks -----------------------------------------

  ::std::size_t slot_count() const noexcept { return slots_.size(); }
  ::std::size_t input_capacity() const noexcept { return input_capacity_; }
  ::std::size_t output_capacity() const noexcept { return output_capacity_; }
  ::std::optional<::std::size_t> required_input_count() const noexcept {
    return graph_mode() ? ::std::optional<::std::size_t>(input_capacity_) : ::std::nullopt;
  }
  ::std::optional<::std::size_t> planned_output_count(::std::size_t n) const {
    if (graph_mode()) {
      return fixed_output_count_;
    }
    if (compute_.reports_count()) {
      return ::std::nullopt;
    }
    return output_count_ ? output_count_(n) : n;
  }

  plan_type plan(const HostRange<const In>& input, const ::std::optional<HostRange<Out>>& destination,
                 const ::std::source_location& where) const {
    plan_type plan;
    const HostMemory input_memory = host_memory_of(input);
    if (input_memory == HostMemory::device) {
      throw usage_error("StreamPipeline: the input points to device memory; submit host memory (pageable or "
                        "pinned), or do device-to-device work inside the compute stage",
                        where);
    }
    plan.input_pinned = input_memory == HostMemory::pinned && !has_flag(flags_, PipelineFlags::stage_inputs);
    if (destination) {
      const HostMemory out_memory = host_memory_of(*destination);
      if (out_memory == HostMemory::device) {
        throw usage_error("StreamPipeline: the destination points to device memory; pass host memory "
                          "(pageable or pinned)",
                          where);
      }
      plan.destination_pinned = out_memory == HostMemory::pinned;
    }
    return plan;
  }

  // Phase one, without the pipeline's serialization: the input's host
  // staging (chunk by chunk, each chunk's DMA issued as soon as it is in
  // staging) and the copy-in, then copied_in. The slot's staging and device
  // input are free: the slot's previous item was delivered.
  void prepare(::std::size_t index, ::std::uint64_t id, const HostRange<const In>& input, const plan_type& plan,
               const ::std::source_location& where) {
    Slot& slot = slots_[index];
    slot.id = id;
    slot.submitted_at = where;
    slot.needs_stream_sync = false;
    const ::std::size_t bytes = input.size_bytes();
    if (has_flag(flags_, PipelineFlags::graph_slot) && plan.input_pinned && slot.graph_source == input.data()) {
      // The slot graph reads this address already: nothing to issue here, and
      // start() is one cudaGraphLaunch when the destination is the same too.
      inputs_in_place_.fetch_add(1, ::std::memory_order_relaxed);  // bytes == capacity != 0
      return;
    }
    DeviceScope device(device_, where);
    try {
      bool in_place = plan.input_pinned;
      if (has_flag(flags_, PipelineFlags::graph_slot)) {
        in_place = in_place && point_h2d(slot, input.data(), bytes);  // bytes == capacity: checked by the core
        if (!in_place) {
          stage_input(slot, input, nullptr, where);
          if (!point_h2d(slot, slot.staging_in.data(), bytes)) {
            throw cuda_error(::cudaErrorInvalidValue, "cudaGraphExecMemcpyNodeSetParams1D", where,
                             "StreamPipeline: could not point the slot graph's copy-in back at its staging buffer");
          }
        }
      } else {
        // slot_streams: the copy-in is on the slot's own stream, ahead of its
        // compute, so no event is needed between them.
        const ::cudaStream_t copy_in = slot.stream ? slot.stream->get() : h2d_->get();
        if (bytes != 0 && in_place) {
          check(::cudaMemcpyAsync(slot.device_in.data(), input.data(), bytes, ::cudaMemcpyHostToDevice, copy_in),
                "cudaMemcpyAsync", where);
        } else if (bytes != 0) {
          stage_input(slot, input, copy_in, where);
        }
        if (!slot.stream) {
          slot.copied_in.record(h2d_->get(), where);
        }
      }
      if (bytes != 0) {
        (in_place ? inputs_in_place_ : inputs_staged_).fetch_add(1, ::std::memory_order_relaxed);
      }
    } catch (...) {
      fence(slot);
      throw;
    }
  }

  // Phase two, serialized and in id order: compute and copy-out.
  void start(::std::size_t index, ::std::uint64_t id, const HostRange<const In>& input,
             const ::std::optional<HostRange<Out>>& destination, const plan_type& plan,
             const ::std::source_location& where) {
    Slot& slot = slots_[index];
    slot.begin(id, destination ? destination->data() : nullptr, destination ? destination->size() : 0,
               where);
    DeviceScope device(device_, where);
    try {
      if (has_flag(flags_, PipelineFlags::graph_slot)) {
        start_slot_graph(slot, destination.has_value(), plan, where);
      } else {
        start_on_streams(slot, input.size(), destination.has_value(), plan, where);
      }
    } catch (...) {
      fence(slot);
      throw;
    }
  }

  // ---- groups (GroupedPipelineStageRunner) ----------------------------------

  ::std::size_t items_per_launch() const noexcept { return groups_.empty() ? 1 : items_per_launch_; }
  const GroupCopiesUsed& group_copies() const noexcept { return group_copies_; }
  bool launches_together(::std::span<const ::std::size_t> slots) const noexcept {
    if (groups_.empty() || slots.size() != items_per_launch_ || slots[0] % items_per_launch_ != 0) {
      return false;
    }
    for (::std::size_t m = 1; m < slots.size(); ++m) {
      if (slots[m] != slots[0] + m) {
        return false;
      }
    }
    return true;
  }
  ::std::size_t launch_room(::std::size_t slot) const noexcept {
    return groups_.empty() ? 1 : items_per_launch_ - slot % items_per_launch_;
  }
  // start() for a whole group with one launch of the group's graph.
  void start_group(::std::span<const PipelineGroupItem<CudaStageRunner>> items, const ::std::source_location& where);

  // Waits for the item. A staged output bound for the caller's memory (a
  // pageable destination, or the sink) is copied out chunk by chunk as each
  // chunk's DMA completes, by this thread and the copy helpers together.
  ::std::span<const Out> finish(::std::size_t index, PipelineOutputSink<Out> sink);

  void settle(::std::size_t index) noexcept {
    Slot& slot = slots_[index];
    if (slot.needs_stream_sync) {
      // The fence could not be recorded: wait for everything this slot may use.
      // The item's error was delivered: leave none of these waits' behind.
      if (slot.stream) {
        clear_error_slot(::cudaStreamSynchronize(slot.stream->get()));
      }
      for (auto* stream : {&h2d_, &compute_stream_, &d2h_}) {
        clear_error_slot(::cudaStreamSynchronize((*stream)->get()));
      }
      for (SlotGroup& group : groups_) {
        clear_error_slot(::cudaStreamSynchronize(group.stream->get()));
      }
    } else {
      clear_error_slot(::cudaEventSynchronize(slot.done));
    }
  }

  void bind_completion_thread() noexcept { (void)::cudaSetDevice(device_); }

  void add_stats(PipelineStats& stats) const noexcept {
    stats.inputs_in_place = inputs_in_place_.load(::std::memory_order_relaxed);
    stats.inputs_staged = inputs_staged_.load(::std::memory_order_relaxed);
    stats.outputs_direct = outputs_direct_.load(::std::memory_order_relaxed);
    stats.outputs_staged = outputs_staged_.load(::std::memory_order_relaxed);
    stats.graph_retargets = graph_retargets_.load(::std::memory_order_relaxed);
    stats.grouped_items = grouped_items_.load(::std::memory_order_relaxed);
  }

  // ---- for StreamPipeline's accessors ----------------------------------------

  int device() const noexcept { return device_; }
  PipelineFlags flags() const noexcept { return flags_; }
  StreamRef h2d_stream() const noexcept { return h2d_->get(); }
  StreamRef compute_stream() const noexcept { return compute_stream_->get(); }
  StreamRef d2h_stream() const noexcept { return d2h_->get(); }
  const DeviceBuffer<In>& device_input(::std::size_t index) const { return slots_.at(index).device_in; }
  const DeviceBuffer<Out>& device_output(::std::size_t index) const { return slots_.at(index).device_out; }

 private:
  using Slot = StageSlot<In, Out>;

  bool graph_mode() const noexcept {
    return has_flag(flags_, PipelineFlags::graph_compute) || has_flag(flags_, PipelineFlags::graph_slot);
  }

  // Runs the compute stage for `slot`'s item of n elements; returns the output count.
  ::std::size_t run_compute(Slot& slot, ::std::size_t n, StreamRef stream, const ::std::source_location& where);

  void capture_graphs(const ::std::source_location& where);

  void start_on_streams(Slot& slot, ::std::size_t n, bool has_destination, const plan_type& plan,
                        const ::std::source_location& where);

  void start_slot_graph(Slot& slot, bool has_destination, const plan_type& plan,
                        const ::std::source_location& where);

  // The input's host copy into the slot's staging, chunk by chunk on this
  // thread and the copy helpers; with a `dma` stream, each chunk's H2D copy
  // is issued on it as soon as the chunk is in staging.
  void stage_input(Slot& slot, const HostRange<const In>& input, ::cudaStream_t dma,
                   const ::std::source_location& where);

  // Waits for one of the slot's events; an error is the item's asynchronous failure.
  static void await(const Slot& slot, ::cudaEvent_t event, const char* api);

  // Where the D2H copy writes: the caller's pinned destination, or the slot's
  // staging (for a pageable destination, finish() copies on from there).
  Out* output_target(Slot& slot, ::std::size_t produced, bool has_destination, const plan_type& plan,
                     const ::std::source_location& where);

  void count_output_path(const Slot& slot) {
    if (!slot.copy_to_destination) {
      // Staged outputs delivered through a pageable destination are counted in finish().
      (slot.output == slot.staging_out.data() ? outputs_staged_ : outputs_direct_)
          .fetch_add(1, ::std::memory_order_relaxed);
    }
  }

  bool point_h2d(Slot& slot, const void* source, ::std::size_t bytes) noexcept;
  bool point_d2h(Slot& slot, void* target, ::std::size_t bytes) noexcept;
  // Points a group member's copy-in at host `source` (false: the device
  // cannot address it, or CUDA refused) and its copy-out at host `target`.
  bool point_member_in(SlotGroup& group, ::std::size_t member, const Slot& slot, const void* source,
                       const ::std::source_location& where);
  bool point_member_out(SlotGroup& group, ::std::size_t member, const Slot& slot, void* target,
                        const ::std::source_location& where);

  // Adds one slot's chain to `graph`: H2D (from staging) -> the compute
  // stage (a child graph) -> D2H (to staging, when there is output) ->
  // record copied_out; the copy nodes come back for re-pointing.
  void add_slot_chain(Graph& graph, Slot& slot, const Graph& compute_graph, ::cudaGraphNode_t& h2d_node,
                      ::cudaGraphNode_t& d2h_node, const ::std::source_location& where);
  // The group graphs, from each slot's captured compute stage.
  void build_groups(const ::std::vector<Graph>& compute_graphs, const ::std::source_location& where);
  // What the groups copy with: group_copies_asked_, the copy kernel where it loads on device_.
  void choose_group_copies(const ::std::source_location& where);
  // A group member's copy node, and re-pointing it (false when CUDA refuses):
  // a copy-kernel node between device addresses, or a memcpy node.
  ::cudaGraphNode_t add_group_copy(Graph& graph, ::cudaGraphNode_t dependency, const void* source, void* target,
                                   ::std::size_t bytes, ::cudaMemcpyKind kind, const ::std::source_location& where);
  bool set_group_copy(SlotGroup& group, ::cudaGraphNode_t node, const void* source, void* target, ::std::size_t bytes,
                      ::cudaMemcpyKind kind, const ::std::source_location& where);


  // After start() failed part-way: order whatever the item issued before
  // copied_out, so that finish/settle wait for it and the slot is reused only
  // when its buffers are idle. Never throws.
  void fence(Slot& slot) noexcept {
    slot.done = slot.copied_out.get();
    bool ok = true;
    if (slot.stream) {
      ok = succeeded(::cudaEventRecord(slot.copied_out.get(), slot.stream->get()));
    } else {
      ok = succeeded(::cudaEventRecord(slot.copied_in.get(), h2d_->get())) &&
           succeeded(::cudaEventRecord(slot.computed.get(), compute_stream_->get())) &&
           succeeded(::cudaStreamWaitEvent(d2h_->get(), slot.copied_in.get(), 0)) &&
           succeeded(::cudaStreamWaitEvent(d2h_->get(), slot.computed.get(), 0)) &&
           succeeded(::cudaEventRecord(slot.copied_out.get(), d2h_->get()));
    }
    if (!ok) {
      slot.needs_stream_sync = true;
    }
  }

  ::std::size_t input_capacity_;
  ::std::size_t output_capacity_;
  PipelineFlags flags_;
  ::std::function<::std::size_t(::std::size_t)> output_count_;
  ComputeStage<In, Out> compute_;
  ::std::size_t chunk_bytes_;
  ::std::size_t items_per_launch_;  // PipelineOptions::items_per_launch
  GroupCopies group_copies_asked_;  // PipelineOptions::group_copies
  GroupCopiesUsed group_copies_;    // what the groups use, once built
  EventFlags event_flags_ = EventFlags::disable_timing;
  HostCopyPool copiers_;  // helpers for large staged copies (started on first use)
  ::std::size_t fixed_output_count_ = 0;  // graph modes
  int device_ = 0;
  // Streams first: destroyed after the slots' buffers, events and graphs.
  ::std::optional<Stream> h2d_;
  ::std::optional<Stream> compute_stream_;
  ::std::optional<Stream> d2h_;
  ::std::vector<Slot> slots_;
  ::std::vector<SlotGroup> groups_;  // after the slots: destroyed before the events their graphs record
  ::std::atomic<::std::uint64_t> inputs_in_place_{0};
  ::std::atomic<::std::uint64_t> inputs_staged_{0};
  ::std::atomic<::std::uint64_t> outputs_direct_{0};
  ::std::atomic<::std::uint64_t> outputs_staged_{0};
  ::std::atomic<::std::uint64_t> graph_retargets_{0};
  ::std::atomic<::std::uint64_t> grouped_items_{0};
};

}  // namespace replay::detail

// The out-of-line parts: the chunked copies, the compute stage and graph modes.
#include "replay/stream_pipeline/detail/staged_copies.hpp"
#include "replay/stream_pipeline/detail/stage_graphs.hpp"
