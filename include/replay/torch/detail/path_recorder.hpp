#pragma once
// Piecewise torch captures: recording one path live. A thread-local
// RecordFunction callback, while this thread records a path, breaks the
// capture at each operator on the eager list: its start callback runs inside
// the dispatcher before the kernel (the segment captured so far ends and is
// launched, the operator runs eagerly on real data); its end callback keys
// the next segment by what the operator returned and begins it.
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
#include "replay/torch/detail/break_region.hpp"

namespace replay::detail {
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
        if (region.info.op == "aten::_local_scalar_dense") {
          region.read_back = CapturedReadBack::capture(region.inputs, side_.get());
        }
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


}  // namespace replay::detail
