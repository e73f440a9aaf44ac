#pragma once
#include <replay/detail/require_cxx20.hpp>
// CudaStageRunner's chunked copies: staging a pageable input, issuing the copy-out on
// streams, copying a staged output to the caller (finish); included by stream_pipeline/detail/cuda_stage_runner.hpp.
#include <cuda_runtime_api.h>

#include <atomic>
#include <cstddef>
#include <cstring>
#include <optional>
#include <span>

#include "replay/stream_pipeline/detail/cuda_stage_runner.hpp"
#include "replay/stream_pipeline/detail/host_copy_pool.hpp"
#include "replay/detail/message.hpp"
#include "replay/stream_pipeline/detail/streaming_copy.hpp"
#include "replay/error.hpp"
#include "replay/stream_pipeline/host_range.hpp"
#include "replay/stream_pipeline/stage_runner.hpp"
#include "replay/stream_ref.hpp"

namespace replay::detail {

template <BufferElement In, BufferElement Out>
::std::span<const Out> CudaStageRunner<In, Out>::finish(::std::size_t index, PipelineOutputSink<Out> sink) {
  Slot& slot = slots_[index];
  Out* target = nullptr;
  if (slot.copy_to_destination) {
    target = slot.destination;
  } else if (sink && slot.output == slot.staging_out.data()) {
    target = sink.allocate(sink.context, slot.count);
  }
  if (target == nullptr) {
    await(slot, slot.done, "cudaEventSynchronize");
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
    copy_streaming(to + chunks.offset(k), from + chunks.offset(k), chunks.length(k));
  };
  // The helpers join only once the first chunk has landed. Until then the
  // item may still be in its copy-in or compute, and a helper waiting on a
  // chunk event would be lost for all that time to the producers' input
  // copies; the later chunks land at link speed, far faster than a memcpy.
  await(slot, per_chunk ? slot.chunk_events[0].get() : slot.done, "cudaEventSynchronize");
  copiers_.run(chunks.count, copy_chunk);
  if (per_chunk) {
    await(slot, slot.done, "cudaEventSynchronize");
  }
  if (slot.copy_to_destination) {
    outputs_staged_.fetch_add(1, ::std::memory_order_relaxed);
  }
  return {target, slot.count};
}

template <BufferElement In, BufferElement Out>
void CudaStageRunner<In, Out>::start_on_streams(Slot& slot, ::std::size_t n, bool has_destination,
                                                const plan_type& plan, const ::std::source_location& where) {
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

template <BufferElement In, BufferElement Out>
void CudaStageRunner<In, Out>::stage_input(Slot& slot, const HostRange<const In>& input, ::cudaStream_t dma,
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

template <BufferElement In, BufferElement Out>
void CudaStageRunner<In, Out>::await(const Slot& slot, ::cudaEvent_t event, const char* api) {
  const ::cudaError_t status = ::cudaEventSynchronize(event);
  if (status != ::cudaSuccess) {
    clear_error_slot(status);
    throw cuda_error(status, api, slot.submitted_at,
                     detail::concat("StreamPipeline item ", slot.id,
                                    ": an asynchronous error in its copy-in, compute or copy-out stage (a sticky "
                                    "error, such as an illegal address, fails every later item too)"));
  }
}

template <BufferElement In, BufferElement Out>
Out* CudaStageRunner<In, Out>::output_target(Slot& slot, ::std::size_t produced, bool has_destination,
                                             const plan_type& plan, const ::std::source_location& where) {
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

}  // namespace replay::detail
