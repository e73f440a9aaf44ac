#pragma once
// Internals of GraphedCallable: what it owns at a fixed address (the router's
// work callable points here), its re-entry guard and its settle-on-throw scope.
#include <replay/detail/require_cxx20.hpp>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <source_location>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "replay/torch/detail/copy_graph.hpp"
#include "replay/detail/message.hpp"
#include "replay/detail/reentry_guard.hpp"
#include "replay/error.hpp"
#include "replay/event.hpp"
#include "replay/fork_join.hpp"
#include "replay/shape_router/router.hpp"
#include "replay/stream_ref.hpp"
#include "replay/torch/backend.hpp"
#include "replay/torch/callable.hpp"
#include "replay/torch/capture_context.hpp"
#include "replay/torch/detail/call_cache.hpp"
#include "replay/torch/detail/capture.hpp"
#include "replay/torch/options.hpp"
#include "replay/torch/outputs.hpp"

namespace replay::detail {

struct GraphedInputSpec {
  ::at::ScalarType dtype;
  ::std::vector<::std::int64_t> sizes;  // dimension 0 is the capacity (largest bucket)
  ::std::size_t row_bytes = 0;          // bytes of one batch row
  // The example's (channels-last stays channels-last): a caller's tensor in
  // it is copied in by one node of copy_in.
  ::at::MemoryFormat memory_format = ::at::MemoryFormat::Contiguous;
};

// Everything a GraphedCallable owns, at a fixed address: the router's work
// callable points here.
struct GraphedState {
  using router_type = ShapeRouter<::std::int64_t, TorchGraphBackend>;

  TensorFunction fn;
  GraphedFlags flags = GraphedFlags::none;
  ::c10::Device device{::c10::kCUDA, 0};
  ::std::vector<GraphedInputSpec> specs;
  ::std::vector<::std::int64_t> buckets;
  ::std::int64_t capacity = 0;
  ::std::vector<::at::Tensor> static_inputs;
  ::std::vector<::std::vector<::at::Tensor>> bucket_inputs;  // per bucket: the static inputs narrowed to it
  ::std::vector<::at::Tensor> oversize_inputs;               // the caller's, for a batch above the largest bucket
  CaptureFailureHandler<::std::int64_t> user_handler;
  CaptureProgress<::std::int64_t> progress;
  ::std::string unbatched_output;  // why an output does not carry the batch; empty when every output does
  ::std::string failure;  // of the capture in the current call or constructor (no_fallback)
  ::std::map<::std::int64_t, ::std::string> failures;  // per bucket: why its capture failed (capture_report)
  ::std::optional<Event> done;  // recorded after every call: orders a call on another stream after it
  ::cudaStream_t last_stream = nullptr;
  bool has_last = false;
  bool views_handed_out = false;  // a fast-mode call returned views (the constructor's own work hands out none)
  ::std::mutex mutex;
  GraphedCallCache cache;  // per batch: bucket, padding high-water mark, fast-mode views
  // The device-to-device copies of a call, each set as one graph launch
  // (torch/detail/copy_graph.hpp): the staged inputs, and safe mode's outputs.
  CopyGraph copy_in;
  CopyGraph copy_out;
  ::std::vector<ByteCopy> copies;  // the call's, reused
  ::std::shared_ptr<TorchCaptureContext> context;
  ::std::shared_ptr<::torch::jit::Graph> script_graph;  // a TorchScript module's forward, inlined
  ::std::unique_ptr<router_type> router;  // last: destroyed first, so the graphs go before the context

  GraphedState() = default;
  GraphedState(const GraphedState&) = delete;
  GraphedState& operator=(const GraphedState&) = delete;
  ~GraphedState() {
    try {
      if (has_last && done) {
        done->synchronize();  // the static buffers may still be in use on the caller's stream
      }
    } catch (...) {
    }
    cache.drop_views();  // the static outputs go with their graphs, before the pool is released
    router.reset();
  }

  const ::std::vector<::at::Tensor>& inputs_for(::std::int64_t shape) {
    if (shape > capacity) {
      return oversize_inputs;
    }
    // The router pads every batch up to one of `buckets` (it was built with them).
    const auto it = ::std::lower_bound(buckets.begin(), buckets.end(), shape);
    return bucket_inputs[static_cast<::std::size_t>(it - buckets.begin())];
  }

  // The router's work: run the callable on the static inputs of `shape`
  // (padded), with `stream` as torch's current stream.
  void issue(::std::int64_t shape, StreamRef stream) {
    const ::std::source_location where = ::std::source_location::current();
    // What a piecewise graph of this bucket runs again to capture a new path.
    context->set_work(shape, [this, shape](StreamRef s) { issue(shape, s); });
    cache.drop_views();  // a capture may follow, or an eviction
    ::c10::cuda::CUDAStreamGuard stream_guard(torch_stream(stream, device.index()));
    GradScope grad(flags);
    ::std::vector<::at::Tensor> outputs = fn(inputs_for(shape));
    for (::std::size_t i = 0; i < outputs.size(); ++i) {
      const ::at::Tensor& t = outputs[i];
      if (!t.defined() || !t.is_cuda() || t.device() != device) {
        throw usage_error(
            detail::concat("GraphedCallable: output ", i, " of the callable is ",
                           (t.defined() ? detail::concat("on ", t.device().str()) : ::std::string("undefined")),
                           "; graphed outputs must be tensors on ", device.str()),
            where);
      }
    }
    context->set_outputs(::std::move(outputs));
  }

  void on_failure(const ::std::int64_t& batch, ::std::string_view reason) {
    failures[batch] = ::std::string(reason);
    if (failure.empty()) {
      failure = reason;
    }
    if (user_handler) {
      user_handler(batch, reason);
    } else {
      const ::std::string line = detail::concat("replay::GraphedCallable: capturing batch ", batch,
                                                " failed; it runs eagerly from now on. ", reason, "\n");
      ::std::fputs(line.c_str(), stderr);
    }
  }

  // Validates the caller's inputs against the specs; returns the batch. The
  // messages are built only on failure: this runs on every call.
  ::std::int64_t check_inputs(::std::span<const ::at::Tensor> inputs, const ::std::source_location& where) const {
    if (inputs.size() != specs.size()) {
      throw usage_error(detail::concat("GraphedCallable: called with ", inputs.size(),
                                       " input(s), but it was captured with ", specs.size()),
                        where);
    }
    ::std::int64_t batch = -1;
    for (::std::size_t i = 0; i < inputs.size(); ++i) {
      const ::at::Tensor& t = inputs[i];
      const GraphedInputSpec& spec = specs[i];
      bool match = t.defined() && t.scalar_type() == spec.dtype &&
                   static_cast<::std::size_t>(t.dim()) == spec.sizes.size() && t.size(0) >= 1;
      for (::std::size_t d = 1; match && d < spec.sizes.size(); ++d) {
        match = t.size(static_cast<::std::int64_t>(d)) == spec.sizes[d];
      }
      if (!match) [[unlikely]] {
        throw usage_error(detail::concat("GraphedCallable: input ", i, " ", describe_input(t),
                                         ", but the graphs were captured for shape ", describe_spec(spec)),
                          where);
      }
      if (batch < 0) {
        batch = t.size(0);
      } else if (t.size(0) != batch) [[unlikely]] {
        throw usage_error(
            detail::concat("GraphedCallable: input 0 has batch ", batch, " but input ", i, " has batch ", t.size(0),
                           " (shape ", describe_sizes(t.sizes()), "); dimension 0 of every input is the batch"),
            where);
      }
      if (!t.is_cuda() && !t.is_cpu()) [[unlikely]] {
        throw usage_error(
            detail::concat("GraphedCallable: input ", i, " is on ", t.device().str(), "; give CUDA or CPU tensors"),
            where);
      }
    }
    return batch;
  }

  static ::std::string describe_input(const ::at::Tensor& t) {
    if (!t.defined()) {
      return "is an undefined tensor";
    }
    return detail::concat("has shape ", describe_sizes(t.sizes()), " and dtype ", ::c10::toString(t.scalar_type()));
  }
  ::std::string describe_spec(const GraphedInputSpec& spec) const {
    ::std::string out = "[B";
    for (::std::size_t d = 1; d < spec.sizes.size(); ++d) {
      out += ", ";
      out += ::std::to_string(spec.sizes[d]);
    }
    return detail::concat(out, "] (B = batch, up to ", capacity, " graphed) and dtype ", ::c10::toString(spec.dtype));
  }

  // Copies the caller's rows into the static inputs on `stream` and zeroes the
  // padding rows, when an earlier call may have left data there (the cache's
  // high-water mark is above the batch).
  void stage_inputs(::std::span<const ::at::Tensor> inputs, ::std::int64_t batch, ::std::int64_t padded,
                    ::cudaStream_t stream, const ::std::source_location& where) {
    const ::std::int64_t dirty = cache.dirty_rows();
    const bool zero = padded > batch && dirty > batch && !has_flag(flags, GraphedFlags::keep_padding);
    cache.mark_written(batch);
    copies.clear();
    for (::std::size_t i = 0; i < inputs.size(); ++i) {
      const ::at::Tensor& src = inputs[i];
      ::at::Tensor& dst = static_inputs[i];
      auto* base = static_cast<unsigned char*>(dst.data_ptr());
      const ::std::size_t bytes = static_cast<::std::size_t>(batch) * specs[i].row_bytes;
      if (src.is_cuda() && src.device() == device && src.is_contiguous(specs[i].memory_format)) {
        // The hot path: a node of copy_in, no dispatcher.
        copies.push_back({src.const_data_ptr(), base, bytes});
      } else {
        // Host tensors (pinned ones asynchronously, with the host allocator's
        // event), other devices, strided tensors: through copy_.
        ::c10::InferenceMode inference;
        dst.narrow(0, 0, batch).copy_(src, /*non_blocking=*/true);
      }
      if (zero) {  // rows [batch, dirty): the padding, and whatever lies above it
        check(::cudaMemsetAsync(base + bytes, 0, static_cast<::std::size_t>(dirty - batch) * specs[i].row_bytes,
                                stream),
              "cudaMemsetAsync", where);
      }
    }
    // The device-side inputs, all in one launch (after the copy_ calls and
    // memsets above: each writes rows of its own input only).
    copy_in.launch(copies, StreamRef(stream), where);
    if (zero) {
      cache.mark_zeroed_from(batch);
    }
  }
};

// The GraphedCallable whose lock this thread holds, if any: a callable or
// failure handler calling back into the same object gets a usage_error
// instead of re-locking its mutex (a deadlock).
class ActiveGraphedScope : ReentryGuard<GraphedState> {
 public:
  ActiveGraphedScope(const GraphedState* state, const char* what, const ::std::source_location& where)
      : ReentryGuard<GraphedState>(refuse_reentry(state, what, where)) {}

 private:
  static const GraphedState* refuse_reentry(const GraphedState* state, const char* what,
                                            const ::std::source_location& where) {
    if (inside(state)) {
      throw usage_error(detail::concat("GraphedCallable::", what,
                                       " called from inside the same GraphedCallable (its callable or its "
                                       "capture-failure handler); that would deadlock"),
                        where);
    }
    return state;
  }
};

// Once work for a call may be in flight on `stream` (its inputs staged), later
// calls must be ordered after it even if this call throws: records the
// state's "done" event on `stream` and drops the caller's tensors at scope
// exit, unless disarmed by the success path (which records it itself).
class SettleOnThrow {
 public:
  SettleOnThrow(GraphedState& s, ::cudaStream_t stream) noexcept : s_(s), stream_(stream) {}
  SettleOnThrow(const SettleOnThrow&) = delete;
  SettleOnThrow& operator=(const SettleOnThrow&) = delete;
  void disarm() noexcept { armed_ = false; }
  ~SettleOnThrow() {
    if (!armed_) {
      return;
    }
    try {
      s_.oversize_inputs.clear();
      s_.done->record(StreamRef(stream_));
      s_.last_stream = stream_;
      s_.has_last = true;
    } catch (...) {  // the original exception is the one to report
    }
  }

 private:
  GraphedState& s_;
  ::cudaStream_t stream_;
  bool armed_ = true;
};

}  // namespace replay::detail
