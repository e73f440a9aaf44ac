#pragma once
// Piecewise torch captures: a thread-local RecordFunction callback that,
// while this thread records a path, breaks the capture at each operator on
// the eager list (its start callback runs inside the dispatcher before the
// kernel: the segment captured so far ends and is launched, the operator
// runs eagerly on real data; its end callback keys the next segment by what
// the operator returned and begins it), and TorchPiecewise, the executable
// a key keeps: paths of at::cuda::CUDAGraph segments sharing the context's
// pool, with the operators between them re-run through the dispatcher.
//
// Why paths rather than a tree with shared prefixes (as replay's
// capture_piecewise keeps): the tensors alive across a break (h in
// `h = f(x); if float(h.max()) > t: ...`) live at addresses the caching
// allocator chose while the segment before it was captured. Capturing the
// segments after a new value requires running the work again, and a
// re-capture of the prefix would allocate those tensors elsewhere, so the
// new segments would read memory the kept prefix never writes. Each path is
// therefore captured whole, from the start, live; a launch that meets a
// value its path does not have moves to a kept path with the same values so
// far and launches it from its start (the eager operators must be functions
// of their inputs, which aten's are), or captures a new path.
#include <replay/detail/require_cxx20.hpp>

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/record_function.h>
#include <c10/core/GradMode.h>
#include <c10/core/InferenceMode.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <source_location>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "replay/detail/message.hpp"
#include "replay/error.hpp"
#include "replay/event.hpp"
#include "replay/stream_ref.hpp"
#include "replay/torch/capture_context.hpp"
#include "replay/torch/detail/capture.hpp"
#include "replay/torch/detail/operator_names.hpp"
#include "replay/torch/detail/script_decisions.hpp"
#include "replay/torch/errors.hpp"
#include "replay/torch/piecewise.hpp"

namespace replay::detail {

// Why an operator on the eager list cannot be captured.
inline ::std::string_view break_reason(::std::string_view op) noexcept {
  if (op == "aten::_local_scalar_dense") {
    return "reads a tensor's value back to the host (.item(), int(t), float(t), bool(t), `if t:`), which waits for "
           "the stream";
  }
  if (op == "aten::nonzero" || op == "aten::masked_select") {
    return "the size of its output depends on the data: it reads the count back to the host";
  }
  return "listed in the eager operators (GraphedOptions::eager_operators)";
}

// "model.py:42": the innermost script line running now; empty outside TorchScript.
inline ::std::string running_script_line() {
  try {
    const ::std::vector<OperatorCaller> callers = script_callers();
    if (callers.empty()) {
      return {};
    }
    return concat(callers.front().file, ":", callers.front().line);
  } catch (...) {
    return {};
  }
}

// Appends the bytes that key the segments after an eager operator: each
// output's kind and its value (a scalar; a float by its exact bits) or its
// sizes (a tensor: its data is copied into the static tensor the next
// segments read, its shape decides which segments those are). False for an
// output that cannot key (a string, an object).
inline bool append_key(::std::string& key, const ::c10::IValue& value) {
  const auto put = [&key](auto x) { key.append(reinterpret_cast<const char*>(&x), sizeof x); };
  const auto put_tensor = [&](const ::at::Tensor& t) {
    key += 'T';
    if (!t.defined()) {
      key += 'u';
      return;
    }
    put(static_cast<::std::int64_t>(t.dim()));
    for (const ::std::int64_t size : t.sizes()) {
      put(size);
    }
  };
  if (value.isTensor()) {
    put_tensor(value.toTensor());
  } else if (value.isBool()) {
    key += 'b';
    put(static_cast<unsigned char>(value.toBool()));
  } else if (value.isInt()) {
    key += 'i';
    put(value.toInt());
  } else if (value.isDouble()) {
    key += 'd';
    put(value.toDouble());
  } else if (value.isNone()) {
    key += 'n';
  } else if (value.isTensorList()) {
    key += 'L';
    for (const ::at::Tensor& t : value.toTensorVector()) {
      put_tensor(t);
    }
  } else {
    return false;
  }
  return true;
}

// Copies a re-run's outputs into the capture's (same kinds, same sizes: the keys matched).
inline void copy_into_static(const ::c10::IValue& into, const ::c10::IValue& from) {
  if (into.isTensor()) {
    const ::at::Tensor& target = into.toTensor();
    if (target.defined() && target.data_ptr() != from.toTensor().data_ptr()) {
      ::at::Tensor(target).copy_(from.toTensor(), /*non_blocking=*/true);
    }
  } else if (into.isTensorList()) {
    const ::std::vector<::at::Tensor> targets = into.toTensorVector();
    const ::std::vector<::at::Tensor> sources = from.toTensorVector();
    for (::std::size_t i = 0; i < targets.size(); ++i) {
      ::at::Tensor(targets[i]).copy_(sources[i], /*non_blocking=*/true);
    }
  }
}

// One eager operator between two segments, kept for replay.
struct TorchRegion {
  ::std::optional<::c10::OperatorHandle> op;
  // Held: the tensors at the addresses the segment before writes.
  ::std::vector<::c10::IValue> inputs;
  // The capture's outputs, held: the tensors the segments after it read.
  ::std::vector<::c10::IValue> outputs;
  ::std::string key;
  TorchBreakInfo info;
  bool inference = false;  // c10::InferenceMode at the break
  bool grad = false;       // GradMode at the break (without inference mode)
  // A float read back that TorchScript only compares with constants and
  // branches on: the outcomes of these comparisons are its key.
  ::std::vector<ScalarDecision> decisions;

  // The key of `values` (this operator's outputs); false when one cannot key.
  bool key_of(const ::std::vector<::c10::IValue>& values, ::std::string& out) const {
    out.clear();
    if (!decisions.empty() && values.size() == 1 && values[0].isDouble()) {
      out += 'D';
      const double value = values[0].toDouble();
      for (const ScalarDecision& decision : decisions) {
        out += decision.evaluate(value) ? '1' : '0';
      }
      return true;
    }
    for (const ::c10::IValue& value : values) {
      if (!append_key(out, value)) {
        return false;
      }
    }
    return true;
  }

  // Runs the operator again on its inputs, on torch's current stream, and
  // returns its key; when the key is this region's, its outputs are copied
  // into the static ones.
  ::std::string replay() const {
    ::std::optional<::c10::InferenceMode> inference_mode;
    ::std::optional<::at::AutoGradMode> grad_mode;
    if (inference) {
      inference_mode.emplace();
    } else {
      grad_mode.emplace(grad);
    }
    ::std::vector<::c10::IValue> stack = inputs;
    op->callBoxed(stack);
    ::std::string out;
    (void)key_of(stack, out);
    if (out == key && stack.size() == outputs.size()) {
      for (::std::size_t i = 0; i < stack.size(); ++i) {
        copy_into_static(outputs[i], stack[i]);
      }
    }
    return out;
  }
};

// One captured segment: torch's graph (holding its pool reference) and its executable.
struct TorchSegment {
  ::std::unique_ptr<TorchCudaGraph> graph;
  ::cudaGraphExec_t exec = nullptr;
};

// One path: segments with an eager operator between each two, and the
// static outputs its last segment writes.
struct TorchPath {
  ::std::vector<TorchSegment> segments;
  ::std::vector<TorchRegion> regions;  // segments.size() - 1
  ::std::vector<::at::Tensor> outputs;
  ::std::uint64_t last_use = 0;
};

// What a piecewise capture needs from its context.
struct TorchPiecewiseConfig {
  ::c10::Device device{::c10::kCUDA, 0};
  ::c10::MempoolId_t pool{0, 0};
  CaptureMode mode = CaptureMode::this_thread;
  ::std::vector<::std::string> operators;  // the eager list: the defaults and the user's
  ::std::size_t max_paths = 16;
  bool audit = false;  // list each break on stderr
  ::std::shared_ptr<::torch::jit::Graph> script_graph;  // where float read-backs are looked up

  static TorchPiecewiseConfig of(const TorchCaptureContext& context, bool audit) {
    TorchPiecewiseConfig out;
    out.device = context.device();
    out.pool = context.pool();
    out.mode = context.mode();
    out.operators = context.eager_operators();
    out.max_paths = context.max_break_paths();
    out.script_graph = context.script_graph();
    out.audit = audit;
    return out;
  }
};

// True when an operator's arguments include a CUDA tensor: an eager
// operator on host tensors alone needs no break.
inline bool reads_device_memory(::c10::ArrayRef<const ::c10::IValue> inputs) {
  for (const ::c10::IValue& value : inputs) {
    if (value.isTensor() && value.toTensor().defined() && value.toTensor().is_cuda()) {
      return true;
    }
    if (value.isTensorList()) {
      for (const ::at::Tensor& t : value.toTensorVector()) {
        if (t.defined() && t.is_cuda()) {
          return true;
        }
      }
    }
  }
  return false;
}

class TorchPathRecorder;
struct TorchBreakThread {
  TorchPathRecorder* recorder = nullptr;  // the path being recorded on this thread
  bool in_break = false;                  // inside an eager operator (its own operators run as they are)
};
inline TorchBreakThread& torch_break_thread() noexcept {
  thread_local TorchBreakThread state;
  return state;
}

// Records one path: runs the work once, live, capturing segments between
// the operators on the eager list and running those eagerly.
class TorchPathRecorder {
 public:
  TorchPathRecorder(const TorchPiecewiseConfig& config, StreamRef side) : config_(config), side_(side) {}
  TorchPathRecorder(const TorchPathRecorder&) = delete;
  TorchPathRecorder& operator=(const TorchPathRecorder&) = delete;
  ~TorchPathRecorder() { abandon(); }

  // Runs work(side) with the breaks taken and returns the path; a failure
  // undoes the open capture and throws (capture_failed_error for a break
  // that could not be taken, the work's own exception otherwise).
  ::std::unique_ptr<TorchPath> record(const ::std::function<void(StreamRef)>& work,
                                      const ::std::source_location& where) {
    TorchBreakThread& thread = torch_break_thread();
    if (thread.recorder != nullptr) {
      throw usage_error("a piecewise torch capture inside another one on this thread", where);
    }
    path_ = ::std::make_unique<TorchPath>();
    ::c10::cuda::CUDAGuard device_guard(config_.device);
    ::c10::cuda::CUDAStreamGuard stream_guard(torch_stream(side_, config_.device.index()));
    begin_segment();
    try {
      const Installed installed(this);
      work(side_);
    } catch (...) {
      if (error_.empty()) {
        throw;
      }
      // A break that could not be taken left the stream capturing or the work
      // without a segment: its own error is the consequence, this the cause.
      abandon();
      throw capture_failed_error(error_);
    }
    if (!error_.empty()) {
      abandon();
      throw capture_failed_error(error_);
    }
    end_segment();
    return ::std::move(path_);
  }

 private:
  // This recorder's callback on this thread while it lives.
  class Installed {
   public:
    explicit Installed(TorchPathRecorder* recorder) {
      torch_break_thread() = TorchBreakThread{recorder, false};
      handle_ = ::at::addThreadLocalCallback(::at::RecordFunctionCallback(&on_start, &on_end)
                                                 .scopes({::at::RecordScope::FUNCTION})
                                                 .needsInputs(true)
                                                 .needsOutputs(true));
    }
    Installed(const Installed&) = delete;
    Installed& operator=(const Installed&) = delete;
    ~Installed() {
      try {
        ::at::removeCallback(handle_);
      } catch (...) {
      }
      torch_break_thread() = TorchBreakThread{};
    }

   private:
    ::at::CallbackHandle handle_ = 0;
  };

  // Marks the eager operator's own call (its end callback finishes the break).
  struct BreakMark final : ::at::ObserverContext {};

  static ::std::unique_ptr<::at::ObserverContext> on_start(const ::at::RecordFunction& fn) {
    TorchBreakThread& thread = torch_break_thread();
    if (thread.recorder == nullptr || thread.in_break) {
      return nullptr;
    }
    const char* name = fn.name();
    const auto& ops = thread.recorder->config_.operators;
    if (name == nullptr || ::std::find(ops.begin(), ops.end(), ::std::string_view(name)) == ops.end() ||
        !reads_device_memory(fn.inputs())) {
      return nullptr;  // not on the list, or on host tensors only (int(cpu_tensor) is fine in a capture)
    }
    thread.in_break = true;
    thread.recorder->break_start(fn);
    return ::std::make_unique<BreakMark>();
  }
  static void on_end(const ::at::RecordFunction& fn, ::at::ObserverContext* context) {
    TorchBreakThread& thread = torch_break_thread();
    if (context == nullptr || thread.recorder == nullptr) {
      return;
    }
    thread.in_break = false;
    thread.recorder->break_end(fn);
  }

  // The start callback (no exception leaves it: RecordFunction would only
  // log it): ends the segment and launches it, so that the operator, about
  // to run, sees real data.
  void break_start(const ::at::RecordFunction& fn) noexcept {
    try {
      pending_.emplace();
      TorchRegion& region = *pending_;
      region.info.op = fn.name();
      region.info.why = ::std::string(break_reason(region.info.op));
      region.info.script_line = running_script_line();
      if (const auto name = fn.operator_name()) {
        region.op = ::c10::Dispatcher::singleton().findOp(*name);
      }
      if (!region.op) {
        fail(concat("the eager operator ", region.info.op, " has no dispatcher entry to re-run it at replay"));
        return;
      }
      const auto inputs = fn.inputs();
      region.inputs.assign(inputs.begin(), inputs.end());
      if (region.info.op == "aten::_local_scalar_dense") {
        look_up_decisions(region);
      }
      region.inference = ::c10::InferenceMode::is_enabled();
      region.grad = ::c10::GradMode::is_enabled();
      if (error_.empty()) {
        end_segment();
      }
      if (config_.audit) {
        const ::std::string line =
            concat("replay audit: piecewise torch capture breaks at ", region.info.op,
                   region.info.script_line.empty() ? ::std::string() : concat(" (", region.info.script_line, ")"), ": ",
                   region.info.why, "; it runs eagerly between graph segments ", path_->segments.size(), " and ",
                   path_->segments.size() + 1, "\n");
        ::std::fputs(line.c_str(), stderr);
      }
    } catch (...) {
      fail(concat("ending the graph segment before ", fn.name(), " failed: ", describe_torch_exception()));
    }
  }

  // The end callback: keeps the operator's outputs as the static ones, keys
  // the next segment by them and begins it.
  void break_end(const ::at::RecordFunction& fn) noexcept {
    if (!error_.empty() || !pending_) {
      return;  // the rest of the work runs eagerly; record() reports the error
    }
    try {
      TorchRegion region = ::std::move(*pending_);
      pending_.reset();
      region.outputs = fn.outputs();
      if (!region.key_of(region.outputs, region.key)) {
        fail(concat(region.info.op,
                    " returned a value that cannot key the segments after it (a scalar, a tensor or a list of "
                    "tensors can)"));
        return;
      }
      path_->regions.push_back(::std::move(region));
      begin_segment();
    } catch (...) {
      fail(concat("beginning the graph segment after ", fn.name(), " failed: ", describe_torch_exception()));
    }
  }

  // Inside TorchScript, a float read back at a node that the script only
  // compares with constants and branches on keys by those comparisons.
  void look_up_decisions(TorchRegion& region) const noexcept {
    if (config_.script_graph == nullptr) {
      return;
    }
    try {
      for (const ::torch::jit::StackEntry& entry : ::torch::jit::currentCallstack()) {
        const ::torch::jit::Node* node = find_float_read(config_.script_graph->block(), entry.range);
        if (node == nullptr) {
          continue;
        }
        ScalarReadAnalysis analysis = analyse_scalar_read(node->output());
        if (analysis.decisions_only) {
          region.info.why += concat("; keyed by the outcome of the ", analysis.decisions.size(),
                                    " comparison(s) the script branches on, not by the value");
          region.decisions = ::std::move(analysis.decisions);
        } else {
          region.info.why += concat("; keyed by its exact value (it flows into ", analysis.other_use, ")");
        }
        return;
      }
    } catch (...) {
      region.decisions.clear();  // no script frames, or no analysis: the value keys exactly
    }
  }

  void fail(::std::string message) noexcept {
    if (error_.empty()) {
      error_ = ::std::move(message);
    }
    abandon();
  }

  void begin_segment() {
    open_ = ::std::make_unique<TorchCudaGraph>();
    uses_before_ = TorchCudaGraph::pool_use_count(config_.device.index(), config_.pool);
    // capture_begin puts the default generator into capture mode; it is
    // taken out again before another thread's eager random numbers (which
    // lock this mutex) can see it (piecewise captures register no generator).
    ::at::Generator generator = ::at::cuda::detail::getDefaultCUDAGenerator(config_.device.index());
    const ::std::lock_guard<::std::mutex> lock(generator.mutex());
    capturing_ = true;
    open_->capture_begin(config_.pool, static_cast<::cudaStreamCaptureMode>(config_.mode));
    open_->leave_capture_mode_except({});
  }

  // Ends the open segment's capture (torch instantiates it) and launches it.
  void end_segment() {
    open_->capture_end();
    capturing_ = false;
    TorchSegment segment;
    segment.exec = open_->raw_cuda_graph_exec();
    segment.graph = ::std::move(open_);
    check(::cudaGraphLaunch(segment.exec, side_.get()), "cudaGraphLaunch");
    path_->segments.push_back(::std::move(segment));
  }

  void abandon() noexcept {
    if (capturing_ && open_ != nullptr) {
      open_->abandon_capture(config_.device.index(), config_.pool, uses_before_, side_.get());
    }
    capturing_ = false;
    open_.reset();
  }

  TorchPiecewiseConfig config_;
  StreamRef side_;
  ::std::unique_ptr<TorchPath> path_;
  ::std::unique_ptr<TorchCudaGraph> open_;
  bool capturing_ = false;
  int uses_before_ = 0;
  ::std::optional<TorchRegion> pending_;
  ::std::string error_;
};

// A key's piecewise executable: the paths kept, the one launched last, and
// the work (kept to record a path for a value never seen).
class TorchPiecewise {
 public:
  TorchPiecewise(TorchPiecewiseConfig config, ::std::function<void(StreamRef)> work,
                 ::std::shared_ptr<TorchCaptureContext> context)
      : config_(::std::move(config)), work_(::std::move(work)), context_(::std::move(context)) {}
  TorchPiecewise(const TorchPiecewise&) = delete;
  TorchPiecewise& operator=(const TorchPiecewise&) = delete;

  void add(::std::unique_ptr<TorchPath> path) {
    const ::std::lock_guard<::std::mutex> lock(mutex_);
    path->last_use = ++clock_;
    current_ = path.get();
    paths_.push_back(::std::move(path));
  }
  const ::std::vector<::at::Tensor>& current_outputs() const noexcept { return current_->outputs; }

  // Launches the path of the values this launch meets, on `stream`: each
  // segment, then its eager operator, whose key picks what follows. A key the
  // current path does not have moves to a kept path with the same keys so far
  // (launched from its start), or records a new path (the work runs again,
  // live, on the context's capture stream), or, beyond max_paths, makes this
  // key eager. The launched path's outputs are noted on the context.
  void launch(StreamRef stream, const ::std::source_location& where) {
    const ::std::lock_guard<::std::mutex> lock(mutex_);
    ::c10::cuda::CUDAGuard device_guard(config_.device);
    if (eager_) {
      run_eager(stream);
      return;
    }
    ::c10::cuda::CUDAStreamGuard stream_guard(torch_stream(stream, config_.device.index()));
    TorchPath* path = current_;
    ::std::size_t switches = 0;
    for (::std::size_t i = 0;;) {
      check(::cudaGraphLaunch(path->segments[i].exec, stream.get()), "cudaGraphLaunch", where);
      if (i == path->regions.size()) {
        break;
      }
      const ::std::string key = path->regions[i].replay();
      if (key == path->regions[i].key) {
        ++i;
        continue;
      }
      TorchPath* other = find_path(*path, i, key);
      if (other != nullptr && switches < paths_.size()) {
        ++switches;
        ++path_switches_;
        path = other;
        i = 0;
        continue;
      }
      path = record_after_miss(*path, i, stream, where);
      if (path == nullptr) {
        return;  // ran eagerly
      }
      break;
    }
    path->last_use = ++clock_;
    current_ = path;
    context_->note_launch(&path->outputs);
  }

  BucketCaptureReport report() const {
    const ::std::lock_guard<::std::mutex> lock(mutex_);
    BucketCaptureReport out;
    out.kind = eager_ ? BucketCaptureKind::eager : BucketCaptureKind::piecewise;
    out.reason = reason_;
    out.paths = paths_.size();
    out.misses = misses_;
    out.path_switches = path_switches_;
    if (current_ != nullptr) {
      out.segments = current_->segments.size();
      for (const TorchRegion& region : current_->regions) {
        out.breaks.push_back(region.info);
      }
    }
    return out;
  }

 private:
  // A kept path whose first `index` keys are `path`'s and whose next one is `key`.
  TorchPath* find_path(const TorchPath& path, ::std::size_t index, const ::std::string& key) const {
    for (const auto& candidate : paths_) {
      if (candidate->regions.size() <= index || candidate->regions[index].key != key) {
        continue;
      }
      bool same = true;
      for (::std::size_t j = 0; j < index && same; ++j) {
        same = candidate->regions[j].key == path.regions[j].key;
      }
      if (same) {
        return candidate.get();
      }
    }
    return nullptr;
  }

  TorchPath* record_after_miss(const TorchPath& path, ::std::size_t index, StreamRef stream,
                               const ::std::source_location& where) {
    ++misses_;
    const TorchBreakInfo& info = path.regions[index].info;
    const ::std::string at =
        concat(info.op, info.script_line.empty() ? ::std::string() : concat(" (", info.script_line, ")"));
    if (!work_) {
      become_eager(concat("the break at ", at,
                          " returned a value never seen, and the context has no work to capture it with "
                          "(TorchCaptureContext::set_work)"));
      run_eager(stream);
      return nullptr;
    }
    if (paths_.size() >= config_.max_paths) {
      become_eager(concat("the break at ", at, " met more than ", config_.max_paths,
                          " paths of distinct values (GraphedOptions::max_break_paths); a float read back keys the "
                          "segments after it by its exact value: compare it on the device (torch.where) or read "
                          "back the decision (a bool) instead"));
      run_eager(stream);
      return nullptr;
    }
    const StreamRef side = context_->capture_stream();
    const ::std::lock_guard<::std::mutex> one_capture(context_->capture_mutex());
    Event ordered(EventFlags::disable_timing, where);
    ordered.record(stream, where);
    ordered.wait_on(side, where);
    ::std::unique_ptr<TorchPath> fresh;
    try {
      TorchPathRecorder recorder(config_, side);
      (void)context_->take_outputs();
      fresh = recorder.record(work_, where);
      fresh->outputs = context_->take_outputs();
    } catch (...) {
      (void)context_->take_outputs();
      const ::std::string why = describe_torch_exception();
      Event failed(EventFlags::disable_timing, where);
      failed.record(side, where);
      failed.wait_on(stream, where);
      become_eager(concat("capturing the path after a new value at ", at, " failed: ", why));
      run_eager(stream);
      return nullptr;
    }
    Event recorded(EventFlags::disable_timing, where);
    recorded.record(side, where);
    recorded.wait_on(stream, where);
    fresh->last_use = ++clock_;
    paths_.push_back(::std::move(fresh));
    return paths_.back().get();
  }

  void become_eager(::std::string reason) {
    eager_ = true;
    reason_ = ::std::move(reason);
    if (config_.audit) {
      const ::std::string line = concat("replay audit: a piecewise torch graph runs eagerly from now on: ", reason_, "\n");
      ::std::fputs(line.c_str(), stderr);
    }
  }

  // Runs the work eagerly on `stream` (its paths stay alive: graphs launched
  // before may still be running).
  void run_eager(StreamRef stream) {
    if (!work_) {
      throw usage_error(concat("a piecewise torch graph runs eagerly (", reason_,
                               ") but has no work to run (TorchCaptureContext::set_work)"));
    }
    ::c10::cuda::CUDAStreamGuard stream_guard(torch_stream(stream, config_.device.index()));
    (void)context_->take_outputs();
    work_(stream);
    eager_outputs_ = context_->take_outputs();
    context_->note_launch(&eager_outputs_);
  }

  TorchPiecewiseConfig config_;
  ::std::function<void(StreamRef)> work_;
  ::std::shared_ptr<TorchCaptureContext> context_;
  mutable ::std::mutex mutex_;
  ::std::vector<::std::unique_ptr<TorchPath>> paths_;
  TorchPath* current_ = nullptr;
  ::std::uint64_t clock_ = 0;
  ::std::uint64_t misses_ = 0;
  ::std::uint64_t path_switches_ = 0;
  bool eager_ = false;
  ::std::string reason_;
  ::std::vector<::at::Tensor> eager_outputs_;
};

}  // namespace replay::detail
