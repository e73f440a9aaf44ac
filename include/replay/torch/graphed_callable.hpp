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

#include <ATen/cuda/EmptyTensor.h>

#include "replay/detail/message.hpp"
#include "replay/error.hpp"
#include "replay/shape_router/router.hpp"
#include "replay/stream_ref.hpp"
#include "replay/torch/callable.hpp"
#include "replay/torch/detail/graphed_state.hpp"
#include "replay/torch/detail/piecewise.hpp"
#include "replay/torch/detail/script_decisions.hpp"
#include "replay/torch/errors.hpp"
#include "replay/torch/options.hpp"
#include "replay/torch/outputs.hpp"
#include "replay/torch/piecewise.hpp"

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
    if constexpr (::std::same_as<::std::remove_cvref_t<F>, ::torch::jit::Module>) {
      state_->script_graph = detail::inlined_forward_graph(fn);  // how its read-backs are used (breaks)
    }
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
      if (s.views_handed_out) [[unlikely]] {
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
    GraphedOutputs out = collect(s, route, batch, stream, where);
    s.done->record(StreamRef(stream), where);
    s.last_stream = stream;
    s.has_last = true;
    s.views_handed_out = s.views_handed_out || has_flag(s.flags, GraphedFlags::view_outputs);
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
  // What became of the capture of `batch`'s bucket: one graph, graph
  // segments with eager operators between them (GraphedOptions::breaks) and
  // its breaks, eager and why, or not captured (yet). Refused (usage_error)
  // from inside the callable or a capture handler, which run under the call's lock.
  BucketCaptureReport capture_report(::std::int64_t batch,
                                     ::std::source_location where = ::std::source_location::current()) const {
    detail::GraphedState& s = state(where);
    const detail::ActiveGraphedScope active(&s, "capture_report()", where);
    const ::std::lock_guard<::std::mutex> lock(s.mutex);
    const ::std::int64_t bucket = s.router->padded_shape(batch, where);
    BucketCaptureReport out;
    if (s.router->is_eager(bucket)) {
      out.kind = BucketCaptureKind::eager;
      const auto it = s.failures.find(bucket);
      out.reason = it == s.failures.end() ? ::std::string("its capture failed") : it->second;
    } else if (s.router->contains(bucket)) {
      if (const auto piecewise = s.context->piecewise_for(bucket)) {
        out = piecewise->report();
      } else {
        out.kind = BucketCaptureKind::whole;
        out.segments = 1;
        out.paths = 1;
      }
    }
    out.bucket = bucket;
    return out;
  }
  // capture_report() of every bucket, ascending.
  ::std::vector<BucketCaptureReport> capture_reports(
      ::std::source_location where = ::std::source_location::current()) const {
    ::std::vector<BucketCaptureReport> out;
    for (const ::std::int64_t bucket : state(where).buckets) {
      out.push_back(capture_report(bucket, where));
    }
    return out;
  }
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
            const ::std::source_location& where);

  // Runs the callable eagerly at two batch sizes (the largest bucket and the
  // smallest, or 1) and checks that every output carries the batch in
  // dimension 0 with the other dimensions unchanged. An output that does not
  // (a reduction over the batch, a flattened output, a fixed first
  // dimension) would come back computed over the padding rows: calls that
  // need padding then run eagerly on the caller's rows, with one message
  // naming the output.
  static void probe_batch_outputs(detail::GraphedState& s, const ::std::source_location& where);

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
  static ::std::size_t capture_buckets(detail::GraphedState& s, const ::std::source_location& where);

  // The call's outputs: fast mode, the cached views of this batch (made once
  // per batch and graph); safe mode, clones; eager runs, what they returned.
  static GraphedOutputs collect(detail::GraphedState& s, const Route<::std::int64_t>& route, ::std::int64_t batch,
                                ::cudaStream_t stream, const ::std::source_location& where) {
    GraphedOutputs out;
    out.batch_ = batch;
    out.padded_batch_ = route.shape;
    out.route_ = route.kind;
    if (!route.graph()) {
      // An eager run of a padded batch (a warm-up, a failed capture's bucket)
      // ran on the padded static inputs: its outputs are sliced back too.
      out.tensors_ = output_views(s, s.context->take_outputs(), route.shape, batch, false);
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
    s.copy_out.launch(s.copies, StreamRef(stream), where);  // what copy_out() set aside, in one launch
    return out;
  }

  // The static outputs sliced back to `batch` rows (those whose dimension 0
  // is the bucket); when asked to copy, fresh tensors whose copies are left
  // in s.copies for the caller to launch.
  static ::std::shared_ptr<::std::vector<::at::Tensor>> output_views(detail::GraphedState& s,
                                                                     const ::std::vector<::at::Tensor>& launched,
                                                                     ::std::int64_t padded, ::std::int64_t batch,
                                                                     bool copy) {
    detail::GradScope grad(s.flags);  // the static outputs are inference tensors by default
    auto out = ::std::make_shared<::std::vector<::at::Tensor>>();
    out->reserve(launched.size());
    s.copies.clear();
    for (const ::at::Tensor& t : launched) {
      const bool sliced = detail::GraphedCallCache::sliced(t, batch, padded);
      if (copy) {
        out->push_back(copy_out(s, t, sliced ? batch : -1));
      } else {
        out->push_back(sliced ? t.narrow(0, 0, batch) : t);
      }
    }
    return out;
  }

  // A safe-mode output: a fresh tensor from the caching allocator on the
  // current stream that will hold `t` (its first `rows` rows when rows >= 0).
  // A contiguous output is copied by s.copy_out, all of them in one graph
  // launch by collect() (clone() goes through the dispatcher and
  // TensorIterator, several microseconds of host time per output, and a
  // cudaMemcpyAsync costs about 4 us); others are narrowed and cloned.
  static ::at::Tensor copy_out(detail::GraphedState& s, const ::at::Tensor& t, ::std::int64_t rows) {
    if (!t.is_contiguous() || !t.is_cuda()) [[unlikely]] {
      return (rows >= 0 ? t.narrow(0, 0, rows) : t).clone();
    }
    ::c10::SmallVector<::std::int64_t, 8> sizes(t.sizes().begin(), t.sizes().end());
    if (rows >= 0) {
      sizes[0] = rows;  // the first rows of a contiguous tensor are one contiguous block
    }
    // Straight from the CUDA allocator path, without a dispatcher round trip.
    ::at::Tensor fresh(::at::detail::empty_cuda(sizes, t.scalar_type(), t.device(), ::std::nullopt));
    if (const ::std::size_t bytes = fresh.nbytes(); bytes > 0) {
      s.copies.push_back({t.const_data_ptr(), fresh.data_ptr(), bytes});
    }
    return fresh;
  }

  ::std::unique_ptr<detail::GraphedState> state_;
};

}  // namespace replay

// The out-of-line part: construction (examples, static inputs, router), the
// batch-output probe and the capture of every bucket.
#include "replay/torch/detail/graphed_setup.hpp"
