#pragma once
#include <replay/detail/require_cxx20.hpp>
// GraphedCallable's setup: the examples checked, static inputs and router made, batch outputs probed, buckets captured.
#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <source_location>
#include <string>
#include <utility>
#include <vector>

#include "replay/torch/graphed_callable.hpp"
#include "replay/detail/message.hpp"
#include "replay/error.hpp"
#include "replay/event.hpp"
#include "replay/flags.hpp"
#include "replay/fork_join.hpp"
#include "replay/shape_router/options.hpp"
#include "replay/stream_ref.hpp"
#include "replay/torch/backend.hpp"
#include "replay/torch/callable.hpp"
#include "replay/torch/capture_context.hpp"
#include "replay/torch/detail/capture.hpp"
#include "replay/torch/detail/graphed_state.hpp"
#include "replay/torch/errors.hpp"
#include "replay/torch/options.hpp"

namespace replay {

inline void GraphedCallable::init(TensorFunction fn, ::std::vector<::at::Tensor> examples, GraphedOptions options,
                                   const ::std::source_location& where) {
  detail::GraphedState& s = *state_;
  if (examples.empty()) {
    throw usage_error("GraphedCallable: no example inputs; give one CUDA tensor per argument of the callable",
                      where);
  }
  ::std::int64_t example_batch = -1;
  for (::std::size_t i = 0; i < examples.size(); ++i) {
    const ::at::Tensor& t = examples[i];
    if (!t.defined() || !t.is_cuda()) {
      throw usage_error(
          detail::concat("GraphedCallable: example input ", i, " is ",
                         (t.defined() ? detail::concat("on ", t.device().str()) : ::std::string("undefined")),
                         "; example inputs must be CUDA tensors (they fix the device, dtypes and shapes)"),
          where);
    }
    if (t.dim() < 1 || t.size(0) < 1) {
      throw usage_error(
          detail::concat("GraphedCallable: example input ", i, " has shape ", detail::describe_sizes(t.sizes()),
                         "; dimension 0 must be a batch of at least 1"),
          where);
    }
    if (t.device() != examples[0].device()) {
      throw usage_error(detail::concat("GraphedCallable: example inputs on ", examples[0].device().str(), " and ",
                                       t.device().str(), "; they must all be on one device"),
                        where);
    }
    if (example_batch < 0) {
      example_batch = t.size(0);
    } else if (t.size(0) != example_batch) {
      throw usage_error(
          detail::concat("GraphedCallable: example input 0 has batch ", example_batch, " but example input ", i,
                         " has batch ", t.size(0), "; dimension 0 of every input is the batch"),
          where);
    }
  }
  s.fn = ::std::move(fn);
  s.flags = options.flags;
  s.device = examples[0].device();
  s.user_handler = ::std::move(options.on_capture_failure);
  s.buckets = options.batch_buckets.empty() ? ::std::vector<::std::int64_t>{example_batch} : options.batch_buckets;

  ::c10::cuda::CUDAGuard device_guard(s.device);
  s.done.emplace(EventFlags::disable_timing, where);
  s.context = ::std::make_shared<TorchCaptureContext>(s.device, options.capture_mode, ::std::move(options.generators),
                                                      where,
                                                      has_flag(s.flags, GraphedFlags::capture_default_generator));
  s.context->set_breaks(options.breaks, options.eager_operators, options.max_break_paths, where);
  s.context->set_script_graph(s.script_graph);
  s.progress = ::std::move(options.on_capture_progress);
  ShapeRouterOptions<::std::int64_t> router_options = ShapeRouterOptions<::std::int64_t>::bucketed(s.buckets);
  router_options.max_entries = s.buckets.size();
  router_options.oversize = options.oversize;
  router_options.warmup_runs = options.warmup_runs;
  router_options.max_graphs = options.max_graphs;
  // Calls on any stream: run() orders whole calls itself (its mutex, and the
  // `done` event a call on a new stream waits for), copies included.
  router_options.stream_sharing = StreamSharing::caller_ordered;
  router_options.audit = options.audit;
  detail::GraphedState* self = &s;
  router_options.on_capture_failure = [self](const ::std::int64_t& batch, ::std::string_view reason) {
    self->on_failure(batch, reason);
  };
  // Validates the buckets (sorted, distinct, positive): usage_error otherwise.
  s.router = ::std::make_unique<router_type>(
      [self](const ::std::int64_t& shape, StreamRef stream) { self->issue(shape, stream); },
      ::std::move(router_options), TorchGraphBackend(s.context), where);
  s.capacity = s.buckets.back();

  // Static inputs: contiguous, sized for the largest bucket, normal tensors
  // even when constructed under InferenceMode, filled with the examples'
  // rows (repeated) so that warm-ups and captures see realistic values.
  {
    ::c10::InferenceMode normal_tensors(false);
    const ::at::Tensor rows = ::at::arange(s.capacity, examples[0].options().dtype(::at::kLong)).remainder(example_batch);
    for (const ::at::Tensor& t : examples) {
      ::std::vector<::std::int64_t> sizes(t.sizes().begin(), t.sizes().end());
      sizes[0] = s.capacity;
      // In the example's memory format: a channels-last example gives a
      // channels-last static input (rows stay contiguous blocks either way).
      const ::at::MemoryFormat format = t.suggest_memory_format();
      ::at::Tensor buffer = ::at::empty(sizes, t.options().memory_format(format));
      buffer.copy_(t.index_select(0, rows));
      detail::GraphedInputSpec spec{t.scalar_type(), sizes, 0, format};
      spec.row_bytes = static_cast<::std::size_t>(buffer.numel() / s.capacity) * buffer.element_size();
      s.specs.push_back(::std::move(spec));
      s.static_inputs.push_back(::std::move(buffer));
    }
    for (const ::std::int64_t b : s.buckets) {
      ::std::vector<::at::Tensor> views;
      for (const ::at::Tensor& buffer : s.static_inputs) {
        views.push_back(buffer.narrow(0, 0, b));
      }
      s.bucket_inputs.push_back(::std::move(views));
    }
  }
  s.cache.reset(s.buckets);
  probe_batch_outputs(s, where);
  if (!has_flag(s.flags, GraphedFlags::lazy_capture)) {
    (void)capture_buckets(s, where);
  }
}

inline void GraphedCallable::probe_batch_outputs(detail::GraphedState& s, const ::std::source_location& where) {
  const ::std::int64_t large = s.capacity;
  const ::std::int64_t small = s.buckets.size() > 1 ? s.buckets.front() : 1;
  if (large == small) {
    return;  // a single bucket of 1: no call is ever padded
  }
  ::std::vector<::at::Tensor> at_large;
  ::std::vector<::at::Tensor> at_small;
  {
    detail::GradScope grad(s.flags);
    ::std::vector<::at::Tensor> small_inputs;
    for (const ::at::Tensor& buffer : s.static_inputs) {
      small_inputs.push_back(buffer.narrow(0, 0, small));
    }
    at_large = s.fn(s.static_inputs);
    at_small = s.fn(small_inputs);
  }
  auto describe = [](const ::std::vector<::at::Tensor>& outs, ::std::size_t i) {
    return i < outs.size() && outs[i].defined() ? detail::describe_sizes(outs[i].sizes()) : ::std::string("missing");
  };
  for (::std::size_t i = 0; i < ::std::max(at_large.size(), at_small.size()); ++i) {
    bool carries = i < at_large.size() && i < at_small.size() && at_large[i].defined() && at_small[i].defined() &&
                   at_large[i].dim() > 0 && at_large[i].dim() == at_small[i].dim() && at_large[i].size(0) == large &&
                   at_small[i].size(0) == small;
    for (::std::int64_t d = 1; carries && d < at_large[i].dim(); ++d) {
      carries = at_large[i].size(d) == at_small[i].size(d);
    }
    if (!carries) {
      s.unbatched_output = detail::concat(
          "output ", i, " has shape ", describe(at_large, i), " at batch ", large, " and ", describe(at_small, i),
          " at batch ", small, ": its dimension 0 is not the batch, so padded rows would leak into it");
      const ::std::string line =
          detail::concat("replay::GraphedCallable: ", s.unbatched_output,
                         ". Calls whose batch is not a bucket size run eagerly (no padding); calls at a bucket size "
                         "replay graphs. Return per-row outputs to graph every call (at ",
                         replay::to_string(where), ")\n");
      ::std::fputs(line.c_str(), stderr);
      return;
    }
  }
}

inline ::std::size_t GraphedCallable::capture_buckets(detail::GraphedState& s, const ::std::source_location& where) {
  ::c10::cuda::CUDAGuard device_guard(s.device);
  const StreamRef current(::c10::cuda::getCurrentCUDAStream(s.device.index()).stream());
  const StreamRef side = s.context->capture_stream();
  Event ordered;
  ordered.record(current, where);  // the static inputs' contents
  ordered.wait_on(side, where);
  if (s.has_last) {
    s.done->wait_on(side, where);
  }
  s.failure.clear();
  // If capturing throws (say, a warm-up runs out of memory), the side
  // stream's work must still be ordered before later calls.
  struct JoinSide {
    StreamRef side, current;
    detail::GraphedState& s;
    bool armed = true;
    ~JoinSide() {
      if (armed) {
        try {
          stream_wait(current, side);
          s.done->record(current);
          s.last_stream = current.get();
          s.has_last = true;
        } catch (...) {
        }
      }
    }
  } join_side{side, current, s};
  const ::std::size_t with_graph = s.router->capture_all(side, s.progress, where);
  join_side.armed = false;
  Event warmed;
  warmed.record(side, where);
  warmed.wait_on(current, where);
  s.done->record(current, where);
  s.last_stream = current.get();
  s.has_last = true;
  if (!s.failure.empty() && has_flag(s.flags, GraphedFlags::no_fallback)) {
    for (const ::std::int64_t bucket : s.buckets) {  // try again (and fail loudly) next time
      if (s.router->is_eager(bucket)) {
        (void)s.router->invalidate(bucket, where);
      }
    }
    throw capture_failed_error(detail::concat("replay: GraphedCallable (GraphedFlags::no_fallback): ", s.failure));
  }
  return with_graph;
}

}  // namespace replay
