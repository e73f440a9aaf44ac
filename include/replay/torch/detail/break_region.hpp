#pragma once
// Piecewise torch captures, their parts: what a break keeps (the eager
// operator with its inputs and outputs, and how its value keys what follows),
// a segment, a path of them, the options, and this thread's recorder.
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


}  // namespace replay::detail
