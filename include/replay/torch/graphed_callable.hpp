#pragma once
// GraphedCallable: a torch callable with one CUDA graph per batch-size bucket,
// all in one private memory pool, replayed on the caller's torch stream.
#include <replay/detail/require_cxx20.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <optional>
#include <source_location>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "replay/detail/message.hpp"
#include "replay/error.hpp"
#include "replay/shape_router/router.hpp"
#include "replay/stream_ref.hpp"
#include "replay/torch/callable.hpp"
#include "replay/torch/detail/graphed_state.hpp"
#include "replay/torch/errors.hpp"
#include "replay/torch/options.hpp"
#include "replay/torch/outputs.hpp"

namespace replay {

// A torch callable with CUDA graphs: one per batch-size bucket, all in one
// private memory pool, replayed on the caller's current torch stream.
//
// Each call copies the caller's tensors into the static inputs (rows
// 0..n-1, padding rows zeroed), replays the bucket's graph (or runs eagerly:
// a bucket whose capture failed, a batch above the largest bucket) and
// returns the outputs sliced back to n rows (an output whose dimension 0 is
// the bucket size is sliced; others are returned whole).
//
// Threading: calls are serialized by an internal mutex (the static buffers
// are shared). Device work goes on torch's current stream of the calling
// thread; in safe mode a call on another stream than the previous call waits
// for that whole call (staging, replay, clones) on the device first. Fast mode
// refuses a call on another stream (usage_error): the previous views may
// still be read there. Captures use the callable's own stream, ordered after
// the caller's stream by an event, never by a device-wide synchronization.
// See docs/torch.md, "Threads and streams".
class GraphedCallable {
 public:
  using router_type = ShapeRouter<::std::int64_t, TorchGraphBackend>;

  // `example_inputs`: one CUDA tensor per argument of the callable, all on one
  // device, dimension 0 the batch (any batch; the static inputs are sized for
  // the largest bucket and filled with the examples' rows). Captures every
  // bucket now, largest first, unless GraphedFlags::lazy_capture.
  template <class F>  // a TensorCallable; anything else is refused with the message below
  GraphedCallable(F&& fn, ::std::vector<::at::Tensor> example_inputs, GraphedOptions options = {},
                  ::std::source_location where = ::std::source_location::current())
      : state_(::std::make_unique<detail::GraphedState>()) {
    static_assert(TensorCallable<F>,
                  "replay: GraphedCallable needs a TensorCallable: a torch::nn module (holder or pointer) whose "
                  "forward takes 1 to 8 Tensors, a torch::jit::Module, or a callable taking Tensors (or a "
                  "std::vector<Tensor>) and returning a Tensor, a std::vector<Tensor>, a tuple of Tensors or a "
                  "c10::IValue");
    init(make_tensor_function(::std::forward<F>(fn), where), ::std::move(example_inputs), ::std::move(options), where);
  }

  GraphedCallable(const GraphedCallable&) = delete;
  GraphedCallable& operator=(const GraphedCallable&) = delete;
  GraphedCallable(GraphedCallable&&) noexcept = default;
  GraphedCallable& operator=(GraphedCallable&&) noexcept = default;
  ~GraphedCallable() = default;

  // One call: stage the inputs, replay (or run eagerly), return the outputs.
  // usage_error for a wrong number of inputs, a dtype or a non-batch
  // dimension that differs from the examples (both shapes in the message),
  // inputs of different batch sizes, or a batch above the largest bucket under
  // OversizePolicy::throw_error.
  // (A std::vector converts to the span; a braced list takes the overload
  // below. Neither allocates.)
  GraphedOutputs run(::std::span<const ::at::Tensor> inputs,
                     ::std::source_location where = ::std::source_location::current()) {
    detail::GraphedState& s = state(where);
    const detail::ActiveGraphedScope active(&s, "run()", where);
    ::std::lock_guard<::std::mutex> lock(s.mutex);
    const ::std::int64_t batch = s.check_inputs(inputs, where);
    // The bucket from the per-batch table; the router plans oversize batches
    // (and refuses them under OversizePolicy::throw_error).
    const ::std::int64_t cached_padded = s.cache.padded(batch);
    const ::std::int64_t padded = cached_padded > 0 ? cached_padded : s.router->padded_shape(batch, where);
    ::c10::cuda::CUDAGuard device_guard(s.device);
    const ::cudaStream_t stream = ::c10::cuda::getCurrentCUDAStream(s.device.index()).stream();
    if (s.has_last && s.last_stream != stream) {
      if (has_flag(s.flags, GraphedFlags::view_outputs)) [[unlikely]] {
        // The previous call's views may still be read on its stream, after
        // the event recorded at its end: nothing orders those reads.
        throw usage_error("GraphedCallable with GraphedFlags::view_outputs called on another stream than the "
                          "previous call; its fast-mode outputs may still be read on that stream and this call would "
                          "overwrite them. Use one GraphedCallable per stream, or safe mode (no view_outputs)",
                          where);
      }
      s.done->wait_on(StreamRef(stream), where);
    }
    detail::SettleOnThrow settle(s, stream);
    if (padded > batch && !s.unbatched_output.empty()) [[unlikely]] {
      GraphedOutputs out = run_unpadded(s, inputs, batch, where);
      s.done->record(StreamRef(stream), where);
      s.last_stream = stream;
      s.has_last = true;
      settle.disarm();
      return out;
    }
    if (padded <= s.capacity) {
      s.stage_inputs(inputs, batch, padded, stream, where);
    } else {
      s.oversize_inputs.clear();
      for (const ::at::Tensor& t : inputs) {
        s.oversize_inputs.push_back(t.device() == s.device ? t : t.to(s.device, /*non_blocking=*/true));
      }
    }
    s.failure.clear();
    const Route<::std::int64_t> route = s.router->run(batch, StreamRef(stream), where);
    s.oversize_inputs.clear();
    GraphedOutputs out = collect(s, route, batch, where);
    s.done->record(StreamRef(stream), where);
    s.last_stream = stream;
    s.has_last = true;
    settle.disarm();
    if (!s.failure.empty() && has_flag(s.flags, GraphedFlags::no_fallback)) {
      // The router marked the bucket eager; under no_fallback it must try
      // (and fail loudly) again next time instead of silently running eagerly.
      (void)s.router->invalidate(batch, where);
      throw capture_failed_error(
          detail::concat("replay: GraphedCallable (GraphedFlags::no_fallback): batch ", route.shape, ": ", s.failure));
    }
    return out;
  }
  GraphedOutputs run(::std::initializer_list<::at::Tensor> inputs,
                     ::std::source_location where = ::std::source_location::current()) {
    return run(::std::span<const ::at::Tensor>(inputs.begin(), inputs.size()), where);
  }

  // run() with the tensors as separate arguments.
  template <class... T>
    requires(sizeof...(T) > 0 && (::std::same_as<::std::remove_cvref_t<T>, ::at::Tensor> && ...))
  GraphedOutputs operator()(T&&... inputs) {
    const ::std::array<::at::Tensor, sizeof...(T)> held{::std::forward<T>(inputs)...};
    return run(::std::span<const ::at::Tensor>(held));
  }

  // The callable run eagerly on `inputs` as given, under the same grad mode on
  // the current stream: the reference a graphed result is compared with.
  ::std::vector<::at::Tensor> run_eager(const ::std::vector<::at::Tensor>& inputs,
                                        ::std::source_location where = ::std::source_location::current()) {
    detail::GraphedState& s = state(where);
    const detail::ActiveGraphedScope active(&s, "run_eager()", where);
    ::std::lock_guard<::std::mutex> lock(s.mutex);
    ::c10::cuda::CUDAGuard device_guard(s.device);
    detail::GradScope grad(s.flags);
    return s.fn(inputs);
  }

  // Bucketed batch sizes, ascending; the largest is the capacity of the static inputs.
  ::std::span<const ::std::int64_t> buckets() const { return state().buckets; }
  ::std::int64_t max_batch() const { return state().capacity; }
  ::c10::Device device() const { return state().device; }
  GraphedFlags flags() const { return state().flags; }
  // True when `batch`'s bucket has a live graph / was marked eager after a failed capture.
  bool is_graphed(::std::int64_t batch) const { return state().router->contains(batch); }
  bool is_eager(::std::int64_t batch) const { return state().router->is_eager(batch); }
  ::std::size_t graph_count() const { return state().router->graph_count(); }
  RouterStats stats() const { return state().router->stats(); }
  void reset_stats() { state().router->reset_stats(); }
  // Captures the buckets that have no graph yet (lazy mode, or after evictions),
  // largest first; returns how many buckets have a graph.
  ::std::size_t capture_all(::std::source_location where = ::std::source_location::current()) {
    detail::GraphedState& s = state(where);
    const detail::ActiveGraphedScope active(&s, "capture_all()", where);
    ::std::lock_guard<::std::mutex> lock(s.mutex);
    return capture_buckets(s, where);
  }

  // The private pool of the caching allocator the graphs share, and its size.
  ::c10::MempoolId_t pool() const { return state().context->pool(); }
  ::std::size_t pool_reserved_bytes() const { return state().context->pool_reserved_bytes(); }
  const TorchCaptureContext& context() const { return *state().context; }

 private:
  detail::GraphedState& state(::std::source_location where = ::std::source_location::current()) const {
    if (!state_) [[unlikely]] {
      throw usage_error("GraphedCallable used after move", where);
    }
    return *state_;
  }

  void init(TensorFunction fn, ::std::vector<::at::Tensor> examples, GraphedOptions options,
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
    s.progress = ::std::move(options.on_capture_progress);
    ShapeRouterOptions<::std::int64_t> router_options = ShapeRouterOptions<::std::int64_t>::bucketed(s.buckets);
    router_options.max_entries = s.buckets.size();
    router_options.oversize = options.oversize;
    router_options.warmup_runs = options.warmup_runs;
    router_options.max_graphs = options.max_graphs;
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

  // Runs the callable eagerly at two batch sizes (the largest bucket and the
  // smallest, or 1) and checks that every output carries the batch in
  // dimension 0 with the other dimensions unchanged. An output that does not
  // (a reduction over the batch, a flattened output, a fixed first
  // dimension) would come back computed over the padding rows: calls that
  // need padding then run eagerly on the caller's rows, with one message
  // naming the output.
  static void probe_batch_outputs(detail::GraphedState& s, const ::std::source_location& where) {
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

  // A call that would need padding when an output does not carry the batch:
  // the callable on the caller's own rows, eagerly, on the current stream.
  static GraphedOutputs run_unpadded(detail::GraphedState& s, ::std::span<const ::at::Tensor> inputs,
                                     ::std::int64_t batch, const ::std::source_location& where) {
    (void)where;
    ::std::vector<::at::Tensor> on_device;
    on_device.reserve(inputs.size());
    for (const ::at::Tensor& t : inputs) {
      on_device.push_back(t.device() == s.device ? t : t.to(s.device, /*non_blocking=*/true));
    }
    GraphedOutputs out;
    out.batch_ = batch;
    out.padded_batch_ = batch;
    out.route_ = RouteKind::eager_fallback;
    detail::GradScope grad(s.flags);
    out.tensors_ = ::std::make_shared<::std::vector<::at::Tensor>>(s.fn(on_device));
    return out;
  }

  // Warm-ups on a side stream (the capture stream: cuDNN, cuBLAS and the
  // caching allocator then set up per-stream state for the very stream the
  // capture records), then every bucket captured, largest first.
  static ::std::size_t capture_buckets(detail::GraphedState& s, const ::std::source_location& where) {
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

  // The call's outputs: fast mode, the cached views of this batch (made once
  // per batch and graph); safe mode, clones; eager runs, what they returned.
  static GraphedOutputs collect(detail::GraphedState& s, const Route<::std::int64_t>& route, ::std::int64_t batch,
                                const ::std::source_location& where) {
    GraphedOutputs out;
    out.batch_ = batch;
    out.padded_batch_ = route.shape;
    out.route_ = route.kind;
    if (!route.graph()) {
      out.tensors_ = ::std::make_shared<::std::vector<::at::Tensor>>(s.context->take_outputs());
      return out;
    }
    const ::std::vector<::at::Tensor>* launched = s.context->launched_outputs();
    if (launched == nullptr) {
      throw usage_error("GraphedCallable: internal error: a graph ran but no static outputs are known", where);
    }
    if (has_flag(s.flags, GraphedFlags::view_outputs)) {
      out.generation_ = s.context->generation_counter();
      out.valid_generation_ = s.context->generation();
      if (const auto* cached = s.cache.find_views(batch, route.shape, *launched)) [[likely]] {
        out.tensors_ = *cached;
        return out;
      }
      out.tensors_ = s.cache.store_views(batch, *launched, output_views(s, *launched, route.shape, batch, false));
      s.cache.note_views_stored();
      return out;
    }
    out.tensors_ = output_views(s, *launched, route.shape, batch, true);
    return out;
  }

  // The static outputs sliced back to `batch` rows (those whose dimension 0
  // is the bucket), cloned when asked.
  static ::std::shared_ptr<::std::vector<::at::Tensor>> output_views(detail::GraphedState& s,
                                                                     const ::std::vector<::at::Tensor>& launched,
                                                                     ::std::int64_t padded, ::std::int64_t batch,
                                                                     bool clone) {
    detail::GradScope grad(s.flags);  // the static outputs are inference tensors by default
    auto out = ::std::make_shared<::std::vector<::at::Tensor>>();
    out->reserve(launched.size());
    for (const ::at::Tensor& t : launched) {
      ::at::Tensor part = detail::GraphedCallCache::sliced(t, batch, padded) ? t.narrow(0, 0, batch) : t;
      out->push_back(clone ? part.clone() : ::std::move(part));
    }
    return out;
  }

  ::std::unique_ptr<detail::GraphedState> state_;
};

}  // namespace replay
