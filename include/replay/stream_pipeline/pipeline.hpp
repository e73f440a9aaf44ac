#pragma once
// StreamPipeline<In, Out>: BasicStreamPipeline over the CUDA stage runner.
#include <replay/detail/require_cxx20.hpp>

#include <cstddef>
#include <source_location>
#include <string>
#include <utility>

#include "replay/stream_pipeline/detail/cuda_stage_runner.hpp"
#include "replay/detail/message.hpp"
#include "replay/detail/signature_checks.hpp"
#include "replay/error.hpp"
#include "replay/static_buffer.hpp"
#include "replay/stream_pipeline/basic_pipeline.hpp"
#include "replay/stream_pipeline/options.hpp"
#include "replay/stream_ref.hpp"

namespace replay {

static_assert(GroupedPipelineStageRunner<detail::CudaStageRunner<float, float>>);

template <BufferElement In, BufferElement Out = In>
class StreamPipeline : public BasicStreamPipeline<detail::CudaStageRunner<In, Out>> {
  using base = BasicStreamPipeline<detail::CudaStageRunner<In, Out>>;

 public:
  // Allocates the slots on the current device, creates the streams, captures
  // the slot graphs in a graph mode, and starts the completion thread.
  template <class Compute>
    requires PipelineCompute<Compute, In, Out>
  StreamPipeline(PipelineOptions options, Compute compute,
                 ::std::source_location where = ::std::source_location::current())
      : base(::std::in_place, ::std::move(options), detail::ComputeStage<In, Out>(::std::move(compute)), where) {}
  // Any other compute stage: refused with a message that names the expected signature.
  template <class Compute>
    requires(!PipelineCompute<Compute, In, Out>)
  StreamPipeline(PipelineOptions options, Compute, ::std::source_location where = ::std::source_location::current())
      : StreamPipeline(::std::move(options), [](BufferView<In>, BufferView<Out>, StreamRef) {}, where) {
    detail::check_pipeline_compute<Compute, BufferView<In>, BufferView<Out>>();
  }

  PipelineFlags flags() const { return this->runner().flags(); }
  // Items one graph launch carries in run() (PipelineOptions::items_per_launch; 1 without groups).
  ::std::size_t items_per_launch() const { return this->runner().items_per_launch(); }
  // What the launch groups copy with, and why memcpy nodes when they do
  // (PipelineOptions::group_copies; the copy kernel cannot be loaded on every GPU).
  const GroupCopiesUsed& group_copies() const { return this->runner().group_copies(); }
  int device() const { return this->runner().device(); }
  // The slot's device buffers: fixed addresses for the pipeline's lifetime.
  BufferView<In> device_input(::std::size_t slot,
                              ::std::source_location where = ::std::source_location::current()) const {
    check_slot(slot, where);
    return this->runner(where).device_input(slot).view(where);
  }
  BufferView<Out> device_output(::std::size_t slot,
                                ::std::source_location where = ::std::source_location::current()) const {
    check_slot(slot, where);
    return this->runner(where).device_output(slot).view(where);
  }
  // The stage streams (the compute stage runs on compute_stream(), except with
  // PipelineFlags::slot_streams or graph_slot, where each slot has its own).
  StreamRef h2d_stream() const { return this->runner().h2d_stream(); }
  StreamRef compute_stream() const { return this->runner().compute_stream(); }
  StreamRef d2h_stream() const { return this->runner().d2h_stream(); }

 private:
  void check_slot(::std::size_t slot, const ::std::source_location& where) const {
    const ::std::size_t count = this->runner(where).slot_count();
    if (slot >= count) {
      throw usage_error(detail::concat("StreamPipeline: slot ", slot, " does not exist (the pipeline has ", count, ")"),
                        where);
    }
  }
};

}  // namespace replay
