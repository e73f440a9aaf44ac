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
#include "replay/detail/host_copy_pool.hpp"
#include "replay/detail/device_scope.hpp"
#include "replay/detail/message.hpp"
#include "replay/device.hpp"
#include "replay/error.hpp"
#include "replay/event.hpp"
#include "replay/flags.hpp"
#include "replay/graph.hpp"
#include "replay/graph_exec.hpp"
#include "replay/static_buffer.hpp"
#include "replay/stream.hpp"
#include "replay/stream_pipeline/host_range.hpp"
#include "replay/stream_pipeline/options.hpp"
#include "replay/stream_pipeline/stage_runner.hpp"
#include "replay/stream_pipeline/stats.hpp"
#include "replay/stream_ref.hpp"

namespace replay::detail {

enum class HostMemory { pageable, pinned, device };

inline HostMemory host_memory_at(const void* address) noexcept {
  ::cudaPointerAttributes attributes{};
  if (const ::cudaError_t status = ::cudaPointerGetAttributes(&attributes, address); status != ::cudaSuccess) {
    clear_error_slot(status);
    return HostMemory::pageable;
  }
  switch (attributes.type) {
    case ::cudaMemoryTypeHost: return HostMemory::pinned;  // cudaMallocHost, cudaHostAlloc, cudaHostRegister
    case ::cudaMemoryTypeDevice: return HostMemory::device;
    default: return HostMemory::pageable;  // unregistered, or managed (host-accessible: staged)
  }
}

// Pinned only when both ends of the range are: a range that runs off a pinned
// allocation would make the copy engine fall back to a synchronous path. A
// range that starts in pageable memory is pageable (one query).
inline HostMemory host_memory_of(const void* data, ::std::size_t bytes) noexcept {
  if (bytes == 0 || data == nullptr) {
    return HostMemory::pageable;
  }
  const HostMemory first = host_memory_at(data);
  if (first == HostMemory::pageable) {
    return first;
  }
  const HostMemory last = host_memory_at(static_cast<const unsigned char*>(data) + bytes - 1);
  if (first == HostMemory::device || last == HostMemory::device) {
    return HostMemory::device;
  }
  return first == HostMemory::pinned && last == HostMemory::pinned ? HostMemory::pinned : HostMemory::pageable;
}

// The kind of a HostRange: from its type when known, else asked.
template <class T>
HostMemory host_memory_of(const HostRange<T>& range) noexcept {
  switch (range.kind()) {
    case HostMemoryKind::pinned: return HostMemory::pinned;
    case HostMemoryKind::pageable: return HostMemory::pageable;
    default: return host_memory_of(range.data(), range.size_bytes());
  }
}

// The compute stage, type-erased; move-only callables (holding a GraphExec,
// say) are fine.
template <class In, class Out>
class ComputeStage {
 public:
  ComputeStage() = default;
  template <class F>
  explicit ComputeStage(F compute) : holder_(::std::make_unique<Holder<F>>(::std::move(compute))) {}

  explicit operator bool() const noexcept { return holder_ != nullptr; }
  bool reports_count() const noexcept { return holder_->reports_count(); }
  ::std::size_t operator()(BufferView<In> in, BufferView<Out> out, StreamRef stream) const {
    return holder_->run(in, out, stream);
  }

 private:
  struct Base {
    virtual ~Base() = default;
    virtual bool reports_count() const noexcept = 0;
    virtual ::std::size_t run(BufferView<In> in, BufferView<Out> out, StreamRef stream) = 0;
  };
  template <class F>
  struct Holder final : Base {
    explicit Holder(F f) : compute(::std::move(f)) {}
    using result = ::std::invoke_result_t<F&, BufferView<In>, BufferView<Out>, StreamRef>;
    bool reports_count() const noexcept override { return !::std::is_void_v<result>; }
    ::std::size_t run(BufferView<In> in, BufferView<Out> out, StreamRef stream) override {
      if constexpr (::std::is_void_v<result>) {
        ::std::invoke(compute, in, out, stream);
        return out.size();
      } else {
        return static_cast<::std::size_t>(::std::invoke(compute, in, out, stream));
      }
    }
    F compute;
  };
  ::std::unique_ptr<Base> holder_;
};

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
        copiers_(options.host_copy_threads, [this]() noexcept { (void)::cudaSetDevice(device_); }) {
    validate(options, where);
    device_ = current_device(where);
    const EventFlags event_flags =
        has_flag(flags_, PipelineFlags::blocking_wait) ? EventFlags::disable_timing | EventFlags::blocking_sync
                                                       : EventFlags::disable_timing;
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
    slot.id = id;
    slot.submitted_at = where;
    slot.output = nullptr;
    slot.count = 0;
    slot.destination = destination ? destination->data() : nullptr;
    slot.destination_size = destination ? destination->size() : 0;
    slot.copy_to_destination = false;
    slot.out_chunks = ChunkPlan{};
    slot.out_chunk_events = false;
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

  // Waits for the item. A staged output bound for the caller's memory (a
  // pageable destination, or the sink) is copied out chunk by chunk as each
  // chunk's DMA completes, by this thread and the copy helpers together.
  ::std::span<const Out> finish(::std::size_t index, PipelineOutputSink<Out> sink) {
    Slot& slot = slots_[index];
    Out* target = nullptr;
    if (slot.copy_to_destination) {
      target = slot.destination;
    } else if (sink && slot.output == slot.staging_out.data()) {
      target = sink.allocate(sink.context, slot.count);
    }
    if (target == nullptr) {
      await(slot, slot.copied_out.get(), "cudaEventSynchronize");
      return {slot.output, slot.count};
    }
    const ChunkPlan& chunks = slot.out_chunks;
    const auto* from = reinterpret_cast<const unsigned char*>(slot.staging_out.data());
    auto* to = reinterpret_cast<unsigned char*>(target);
    const bool per_chunk = slot.out_chunk_events;
    auto copy_chunk = [&](::std::size_t k) {
      if (per_chunk) {
        await(slot, slot.chunk_events[k].get(), "cudaEventSynchronize");
      }
      ::std::memcpy(to + chunks.offset(k), from + chunks.offset(k), chunks.length(k));
    };
    if (!per_chunk) {
      await(slot, slot.copied_out.get(), "cudaEventSynchronize");
    }
    copiers_.run(chunks.count, copy_chunk);
    if (per_chunk) {
      await(slot, slot.copied_out.get(), "cudaEventSynchronize");
    }
    if (slot.copy_to_destination) {
      outputs_staged_.fetch_add(1, ::std::memory_order_relaxed);
    }
    return {target, slot.count};
  }

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
    } else {
      clear_error_slot(::cudaEventSynchronize(slot.copied_out.get()));
    }
  }

  void bind_completion_thread() noexcept { (void)::cudaSetDevice(device_); }

  void add_stats(PipelineStats& stats) const noexcept {
    stats.inputs_in_place = inputs_in_place_.load(::std::memory_order_relaxed);
    stats.inputs_staged = inputs_staged_.load(::std::memory_order_relaxed);
    stats.outputs_direct = outputs_direct_.load(::std::memory_order_relaxed);
    stats.outputs_staged = outputs_staged_.load(::std::memory_order_relaxed);
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
  struct Slot {
    Slot(::std::size_t in_capacity, ::std::size_t out_capacity, ::std::size_t out_chunk_count,
         EventFlags event_flags, const ::std::source_location& where)
        : staging_in(in_capacity, where),
          staging_out(out_capacity, where),
          device_in(in_capacity, where),
          device_out(out_capacity, where),
          copied_in(event_flags, where),
          computed(event_flags, where),
          copied_out(event_flags, where) {
      if (out_chunk_count >= 2) {
        chunk_events.reserve(out_chunk_count);
        for (::std::size_t k = 0; k < out_chunk_count; ++k) {
          chunk_events.emplace_back(event_flags, where);
        }
      }
    }

    PinnedBuffer<In> staging_in;
    PinnedBuffer<Out> staging_out;
    DeviceBuffer<In> device_in;
    DeviceBuffer<Out> device_out;
    Event copied_in;   // H2D done: compute may read device_in
    Event computed;    // compute done: D2H may read device_out
    Event copied_out;  // everything the item issued is done: the slot may be reused
    // A staged output's chunk k is in staging_out: its host copy may start.
    ::std::vector<Event> chunk_events;

    // graph_compute: the compute stage captured on this slot's buffers.
    ::std::optional<GraphExec> compute_graph;
    // graph_slot: the whole slot as one graph, on its own stream. The Graph is
    // kept because the node handles used for per-item updates belong to it.
    ::std::optional<Stream> stream;
    ::std::optional<Graph> slot_graph_source;
    ::std::optional<GraphExec> slot_graph;
    ::cudaGraphNode_t h2d_node = nullptr;
    ::cudaGraphNode_t d2h_node = nullptr;
    const void* graph_source = nullptr;  // where the H2D node reads now
    void* graph_target = nullptr;        // where the D2H node writes now

    // The item in flight (written by start, read by finish: ordered by the core's lock).
    ::std::uint64_t id = 0;
    ::std::source_location submitted_at;
    const Out* output = nullptr;  // where the D2H copy put the output
    ::std::size_t count = 0;      // output elements
    Out* destination = nullptr;
    ::std::size_t destination_size = 0;
    bool copy_to_destination = false;  // pageable destination: copy from staging in finish()
    ChunkPlan out_chunks;              // how a staged output is copied out
    bool out_chunk_events = false;     // chunk_events were recorded for it
    bool needs_stream_sync = false;    // fence failed: settle() synchronizes the streams
  };

  bool graph_mode() const noexcept {
    return has_flag(flags_, PipelineFlags::graph_compute) || has_flag(flags_, PipelineFlags::graph_slot);
  }

  void validate(const PipelineOptions& options, const ::std::source_location& where) const {
    if (options.input_capacity == 0) {
      throw usage_error("PipelineOptions::input_capacity must be positive: the most elements one item holds", where);
    }
    if (options.slots == 0 || options.slots > 1024) {
      throw usage_error(detail::concat("PipelineOptions::slots must be between 1 and 1024 (got ", options.slots,
                                       "); 3 or 4 is typical"),
                        where);
    }
    if (has_flag(flags_, PipelineFlags::graph_compute) && has_flag(flags_, PipelineFlags::graph_slot)) {
      throw usage_error("PipelineFlags::graph_compute and graph_slot exclude each other: graph_slot already "
                        "captures the compute stage",
                        where);
    }
    if (has_flag(flags_, PipelineFlags::slot_streams) && has_flag(flags_, PipelineFlags::graph_slot)) {
      throw usage_error("PipelineFlags::slot_streams and graph_slot exclude each other: graph_slot already runs "
                        "each slot on a stream of its own",
                        where);
    }
    constexpr auto known = PipelineFlags::stage_inputs | PipelineFlags::graph_compute | PipelineFlags::graph_slot |
                           PipelineFlags::blocking_wait | PipelineFlags::slot_streams;
    if ((flags_ & ~known) != PipelineFlags::none) {
      throw usage_error("PipelineFlags holds unknown bits", where);
    }
    if (!compute_) {
      throw usage_error("StreamPipeline needs a compute stage", where);
    }
    if (options.staging_chunk_bytes == 0 || options.staging_chunk_bytes % staging_page_bytes != 0) {
      throw usage_error(detail::concat("PipelineOptions::staging_chunk_bytes must be a positive multiple of ",
                                       staging_page_bytes, " (got ", options.staging_chunk_bytes,
                                       "); 1 MiB or 2 MiB is typical"),
                        where);
    }
    if (options.host_copy_threads > 64) {
      throw usage_error(detail::concat("PipelineOptions::host_copy_threads must be at most 64 (got ",
                                       options.host_copy_threads, "); a few are enough to outrun the link"),
                        where);
    }
  }

  // Runs the compute stage for `slot`'s item of n elements; returns the output count.
  ::std::size_t run_compute(Slot& slot, ::std::size_t n, StreamRef stream, const ::std::source_location& where) {
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

  void capture_graphs(const ::std::source_location& where) {
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
      slot.slot_graph.emplace(whole, InstantiateFlags::upload, slot.stream->get(), where);
      slot.slot_graph_source.emplace(::std::move(whole));
      slot.graph_source = slot.staging_in.data();
      slot.graph_target = slot.staging_out.data();
    }
  }

  void start_on_streams(Slot& slot, ::std::size_t n, bool has_destination, const plan_type& plan,
                        const ::std::source_location& where) {
    // slot_streams: every stage on the slot's stream, in order, no events between.
    const bool own_stream = slot.stream.has_value();
    const StreamRef compute = own_stream ? slot.stream->get() : compute_stream_->get();
    const StreamRef d2h = own_stream ? slot.stream->get() : d2h_->get();

    // Compute, once prepare()'s copy-in is done.
    if (!own_stream) {
      slot.copied_in.wait_on(compute, where);
    }
    ::std::size_t produced = 0;
    if (slot.compute_graph) {
      slot.compute_graph->launch(compute, where);
      produced = fixed_output_count_;
    } else {
      produced = run_compute(slot, n, compute, where);
    }
    if (!own_stream) {
      slot.computed.record(compute, where);
    }

    // Copy-out: a staged output of several chunks gets an event per chunk, so
    // that finish() copies each one out as soon as it has landed.
    Out* target = output_target(slot, produced, has_destination, plan, where);
    if (!own_stream) {
      slot.computed.wait_on(d2h, where);
    }
    const ::std::size_t bytes = produced * sizeof(Out);
    if (target == slot.staging_out.data()) {
      slot.out_chunks = plan_chunks(bytes, chunk_bytes_);
    }
    if (slot.out_chunks.count >= 2 && slot.out_chunks.count <= slot.chunk_events.size()) {
      const auto* from = reinterpret_cast<const unsigned char*>(slot.device_out.data());
      auto* to = reinterpret_cast<unsigned char*>(target);
      for (::std::size_t k = 0; k < slot.out_chunks.count; ++k) {
        check(::cudaMemcpyAsync(to + slot.out_chunks.offset(k), from + slot.out_chunks.offset(k),
                                slot.out_chunks.length(k), ::cudaMemcpyDeviceToHost, d2h.get()),
              "cudaMemcpyAsync", where);
        slot.chunk_events[k].record(d2h, where);
      }
      slot.out_chunk_events = true;
    } else if (bytes != 0) {
      check(::cudaMemcpyAsync(target, slot.device_out.data(), bytes, ::cudaMemcpyDeviceToHost, d2h.get()),
            "cudaMemcpyAsync", where);
    }
    slot.copied_out.record(d2h, where);
    count_output_path(slot);
  }

  void start_slot_graph(Slot& slot, bool has_destination, const plan_type& plan,
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
    slot.slot_graph->launch(slot.stream->get(), where);
    slot.copied_out.record(slot.stream->get(), where);
    count_output_path(slot);
  }

  // The input's host copy into the slot's staging, chunk by chunk on this
  // thread and the copy helpers; with a `dma` stream, each chunk's H2D copy
  // is issued on it as soon as the chunk is in staging.
  void stage_input(Slot& slot, const HostRange<const In>& input, ::cudaStream_t dma,
                   const ::std::source_location& where) {
    const ChunkPlan chunks = plan_chunks(input.size_bytes(), chunk_bytes_);
    const auto* from = reinterpret_cast<const unsigned char*>(input.data());
    auto* staging = reinterpret_cast<unsigned char*>(slot.staging_in.data());
    auto* device = reinterpret_cast<unsigned char*>(slot.device_in.data());
    auto copy_chunk = [&](::std::size_t k) {
      const ::std::size_t offset = chunks.offset(k);
      ::std::memcpy(staging + offset, from + offset, chunks.length(k));
      if (dma != nullptr) {
        check(::cudaMemcpyAsync(device + offset, staging + offset, chunks.length(k), ::cudaMemcpyHostToDevice, dma),
              "cudaMemcpyAsync", where);
      }
    };
    copiers_.run(chunks.count, copy_chunk);
  }

  // Waits for one of the slot's events; an error is the item's asynchronous failure.
  static void await(const Slot& slot, ::cudaEvent_t event, const char* api) {
    const ::cudaError_t status = ::cudaEventSynchronize(event);
    if (status != ::cudaSuccess) {
      clear_error_slot(status);
      throw cuda_error(status, api, slot.submitted_at,
                       detail::concat("StreamPipeline item ", slot.id,
                                      ": an asynchronous error in its copy-in, compute or copy-out stage (a sticky "
                                      "error, such as an illegal address, fails every later item too)"));
    }
  }

  // Where the D2H copy writes: the caller's pinned destination, or the slot's
  // staging (for a pageable destination, finish() copies on from there).
  Out* output_target(Slot& slot, ::std::size_t produced, bool has_destination, const plan_type& plan,
                     const ::std::source_location& where) {
    if (has_destination && produced > slot.destination_size) {
      throw usage_error(detail::concat("StreamPipeline: the compute stage produced ", detail::elements(produced),
                                       " but the destination holds ", detail::elements(slot.destination_size)),
                        where);
    }
    Out* target = slot.staging_out.data();
    if (has_destination && plan.destination_pinned) {
      target = slot.destination;
    }
    slot.output = target;
    slot.count = produced;
    slot.copy_to_destination = has_destination && !plan.destination_pinned;
    return target;
  }

  void count_output_path(const Slot& slot) {
    if (!slot.copy_to_destination) {
      // Staged outputs delivered through a pageable destination are counted in finish().
      (slot.output == slot.staging_out.data() ? outputs_staged_ : outputs_direct_)
          .fetch_add(1, ::std::memory_order_relaxed);
    }
  }

  bool point_h2d(Slot& slot, const void* source, ::std::size_t bytes) noexcept {
    if (slot.graph_source == source) {
      return true;
    }
    if (!succeeded(::cudaGraphExecMemcpyNodeSetParams1D(slot.slot_graph->get(), slot.h2d_node, slot.device_in.data(),
                                                        source, bytes, ::cudaMemcpyHostToDevice))) {
      return false;
    }
    slot.graph_source = source;
    return true;
  }
  bool point_d2h(Slot& slot, void* target, ::std::size_t bytes) noexcept {
    if (slot.graph_target == target) {
      return true;
    }
    if (!succeeded(::cudaGraphExecMemcpyNodeSetParams1D(slot.slot_graph->get(), slot.d2h_node, target,
                                                        slot.device_out.data(), bytes, ::cudaMemcpyDeviceToHost))) {
      return false;
    }
    slot.graph_target = target;
    return true;
  }

  // After start() failed part-way: order whatever the item issued before
  // copied_out, so that finish/settle wait for it and the slot is reused only
  // when its buffers are idle. Never throws.
  void fence(Slot& slot) noexcept {
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
  HostCopyPool copiers_;  // helpers for large staged copies (started on first use)
  ::std::size_t fixed_output_count_ = 0;  // graph modes
  int device_ = 0;
  // Streams first: destroyed after the slots' buffers, events and graphs.
  ::std::optional<Stream> h2d_;
  ::std::optional<Stream> compute_stream_;
  ::std::optional<Stream> d2h_;
  ::std::vector<Slot> slots_;
  ::std::atomic<::std::uint64_t> inputs_in_place_{0};
  ::std::atomic<::std::uint64_t> inputs_staged_{0};
  ::std::atomic<::std::uint64_t> outputs_direct_{0};
  ::std::atomic<::std::uint64_t> outputs_staged_{0};
};

}  // namespace replay::detail
