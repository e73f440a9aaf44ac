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
#include "replay/torch/detail/break_region.hpp"
#include "replay/torch/detail/path_recorder.hpp"

namespace replay::detail {
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
      const ::std::string key = path->regions[i].replay(stream.get(), where);
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
