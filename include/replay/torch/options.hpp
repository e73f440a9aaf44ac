#pragma once
// GraphedCallable's options: GraphedFlags and GraphedOptions.
#include <replay/detail/require_cxx20.hpp>

#include <ATen/ATen.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "replay/audit_switch.hpp"
#include "replay/capture_scope.hpp"
#include "replay/flags.hpp"
#include "replay/shape_router/options.hpp"
#include "replay/torch/piecewise.hpp"

namespace replay {

enum class GraphedFlags : unsigned int {
  none = 0,
  // Fast mode: outputs are views of the static output tensors, valid until the
  // next replay of the same GraphedCallable; GraphedOutputs' accessors throw
  // stale_output_error after that. Default (safe mode): outputs are clones.
  view_outputs = 1U << 0,
  // Warm up, capture and run under torch::NoGradGuard instead of
  // c10::InferenceMode: outputs are normal tensors rather than inference tensors.
  no_grad = 1U << 1,
  // Capture each bucket the first time a batch maps to it (after
  // GraphedOptions::warmup_runs eager runs) instead of all buckets, largest
  // first, in the constructor.
  lazy_capture = 1U << 2,
  // Leave the padded rows of the static inputs as they are (whatever an earlier
  // call left there) instead of zeroing them.
  keep_padding = 1U << 3,
  // A failed capture throws capture_failed_error instead of marking the bucket
  // eager (from the constructor, or from the call that captured it lazily).
  no_fallback = 1U << 4,
  // Also put the device's default CUDA generator into capture mode while
  // capturing (what torch.cuda.graph does), so the callable may draw from it.
  // While any capture is open, eager random numbers from the default
  // generator then fail in every other thread on the device ("Offset
  // increment outside graph capture"); by default it is left alone and the
  // callable draws from generators of its own (GraphedOptions::generators).
  capture_default_generator = 1U << 5,
};
template <>
inline constexpr bool enable_bitmask<GraphedFlags> = true;

struct GraphedOptions {
  GraphedFlags flags = GraphedFlags::none;
  // Batch sizes to capture, strictly ascending; a batch is padded up to the
  // next one. Empty: the example inputs' batch size only.
  ::std::vector<::std::int64_t> batch_buckets;
  // Eager runs of each bucket before its capture, as PyTorch does on a side
  // stream: cuDNN/cuBLAS pick algorithms and create handles and workspaces,
  // lazy modules load, the JIT profiles, before anything is recorded.
  ::std::uint32_t warmup_runs = 3;
  // cudaStreamCaptureModeThreadLocal by default: other threads may keep
  // allocating and synchronizing while this one captures. CaptureMode::global
  // is what torch.cuda.graph uses.
  CaptureMode capture_mode = CaptureMode::this_thread;
  // A batch above the largest bucket: run the callable eagerly on the caller's
  // tensors, or throw usage_error.
  OversizePolicy oversize = OversizePolicy::run_eager;
  // Most graphs alive at once (least recently used evicted beyond it).
  ::std::size_t max_graphs = ShapeRouterOptions<::std::int64_t>::unlimited;
  // Told once per bucket whose capture failed (it runs eagerly from then on).
  // Empty: one line on stderr.
  CaptureFailureHandler<::std::int64_t> on_capture_failure;
  // CUDA generators the callable draws random numbers from: each is in
  // capture mode only while one of this callable's graphs is captured, and
  // advanced on every replay, as torch.cuda.graph does. The device's default
  // generator is not among them unless GraphedFlags::capture_default_generator.
  ::std::vector<::at::Generator> generators;
  // Told after each bucket the constructor (or capture_all()) captured:
  // (done, total, bucket). Must not call back into the GraphedCallable.
  CaptureProgress<::std::int64_t> on_capture_progress;
  // Audits the captures (replay/audit.hpp and replay::audit in the program):
  // a failed capture's reason (on_capture_failure, the fallback message,
  // capture_failed_error) then names the call that broke it, its line, and
  // the aten operator that was running. By default it follows REPLAY_AUDIT.
  AuditSwitch audit = AuditSwitch::from_environment;
  // What an operator that cannot be captured does to a bucket's capture:
  // TorchBreaks::eager (the default), the capture fails and the bucket runs
  // eagerly; TorchBreaks::piecewise, the capture breaks there into graph
  // segments with the operator run eagerly between them, with no change to
  // the model (see docs/torch.md, "Breaks"). A capture broken by anything
  // else (a synchronization in a custom kernel, a call not on the list)
  // still makes the bucket eager. Not with `generators` or
  // capture_default_generator (the bucket is then captured whole).
  TorchBreaks breaks = TorchBreaks::eager;
  // Operators that also break a piecewise capture, named as the dispatcher
  // names them ("my_ns::my_op"), on top of default_eager_operators. Each must
  // be a function of its inputs: a replay may run it again.
  ::std::vector<::std::string> eager_operators;
  // Paths of distinct break values one bucket keeps (a path is the sequence
  // of values its breaks returned, captured once); a bucket that meets more
  // runs eagerly from then on (capture_report() says why).
  ::std::size_t max_break_paths = 16;
};

}  // namespace replay
