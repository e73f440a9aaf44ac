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

#include "replay/detail/copy_kernel.hpp"
#include "replay/detail/deferred_free.hpp"
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

// The scalar a read-back of one element of type T returns, as
// _local_scalar_dense builds it from the element's bytes.
template <class T>
::c10::Scalar scalar_of_element(const void* element) {
  return ::c10::Scalar(*static_cast<const T*>(element));
}
using ScalarReader = ::c10::Scalar (*)(const void*);

// The reader of one element of `type`; null for a dtype without one here
// (float8, complex half, the unsigned types beyond uint8).
inline ScalarReader scalar_reader(::c10::ScalarType type) noexcept {
  switch (type) {
    case ::c10::ScalarType::Byte: return &scalar_of_element<::std::uint8_t>;
    case ::c10::ScalarType::Char: return &scalar_of_element<::std::int8_t>;
    case ::c10::ScalarType::Short: return &scalar_of_element<::std::int16_t>;
    case ::c10::ScalarType::Int: return &scalar_of_element<::std::int32_t>;
    case ::c10::ScalarType::Long: return &scalar_of_element<::std::int64_t>;
    case ::c10::ScalarType::Half: return &scalar_of_element<::c10::Half>;
    case ::c10::ScalarType::BFloat16: return &scalar_of_element<::c10::BFloat16>;
    case ::c10::ScalarType::Float: return &scalar_of_element<float>;
    case ::c10::ScalarType::Double: return &scalar_of_element<double>;
    case ::c10::ScalarType::ComplexFloat: return &scalar_of_element<::c10::complex<float>>;
    case ::c10::ScalarType::ComplexDouble: return &scalar_of_element<::c10::complex<double>>;
    case ::c10::ScalarType::Bool: return &scalar_of_element<bool>;
    default: return nullptr;
  }
}

// A read-back of one element of a device tensor (.item(), float(t), `if t:`)
// made part of the segment before it: the segment copies the element into
// pinned host memory kept here (replay's byte-copy kernel, through the
// memory's device mapping), so a replay waits for its stream and reads the
// value, with no operator call, allocation or tensor between the two
// segments. Empty when the read-back does not qualify (more than one
// element, a dtype without a reader): the operator is then re-run.
class CapturedReadBack {
 public:
  CapturedReadBack() = default;
  CapturedReadBack(CapturedReadBack&& other) noexcept
      : host_(::std::exchange(other.host_, nullptr)), read_(::std::exchange(other.read_, nullptr)) {}
  CapturedReadBack& operator=(CapturedReadBack&& other) noexcept {
    if (this != &other) {
      free_or_defer(host_, FreeKind::pinned_host);
      host_ = ::std::exchange(other.host_, nullptr);
      read_ = ::std::exchange(other.read_, nullptr);
    }
    return *this;
  }
  ~CapturedReadBack() { free_or_defer(host_, FreeKind::pinned_host); }

  // Called while `capturing` is being captured, before the segment ends: adds
  // the copy of `inputs`' one element to the segment when it qualifies.
  static CapturedReadBack capture(const ::std::vector<::c10::IValue>& inputs, ::cudaStream_t capturing) {
    CapturedReadBack out;
    if (inputs.size() != 1 || !inputs[0].isTensor()) {
      return out;
    }
    const ::at::Tensor& tensor = inputs[0].toTensor();
    if (!tensor.defined() || !tensor.is_cuda() || tensor.numel() != 1) {
      return out;
    }
    const ScalarReader read = scalar_reader(tensor.scalar_type());
    if (read == nullptr) {
      return out;
    }
    const ::std::source_location where = ::std::source_location::current();
    void* mapped = nullptr;
    ::cudaKernel_t copy = nullptr;
    {
      // cudaMallocHost (and loading the copy kernel) is refused while this
      // thread captures in global or thread-local mode; relaxed for these
      // calls only, as torch's caching allocator does around cudaMalloc
      // during a capture.
      const RelaxedCaptureMode relaxed;
      check(::cudaMallocHost(&out.host_, sizeof(::c10::complex<double>)), "cudaMallocHost", where);
      copy = copy_kernel_on(tensor.device().index(), where).kernel;
      if (copy != nullptr) {
        mapped = device_address_of_host(out.host_);
      }
    }
    if (mapped != nullptr) {
      // A kernel node writing through the memory's device mapping: a memcpy
      // node would cost a couple of microseconds of host time at each launch.
      CopyNodeArgs args(tensor.const_data_ptr(), mapped, tensor.element_size());
      const ::cudaKernelNodeParams params = args.params(copy);
      check(::cudaLaunchKernel(params.func, params.gridDim, params.blockDim, params.kernelParams, 0, capturing),
            "cudaLaunchKernel", where);
    } else {  // the copy kernel cannot run on this device (no PTX JIT)
      check(::cudaMemcpyAsync(out.host_, tensor.const_data_ptr(), tensor.element_size(), ::cudaMemcpyDeviceToHost,
                              capturing),
            "cudaMemcpyAsync", where);
    }
    out.read_ = read;
    return out;
  }

  explicit operator bool() const noexcept { return read_ != nullptr; }

  // After the segment was launched on `stream`: waits for it (the copy is its
  // last node on the read's path) and returns the value as the operator would.
  ::c10::IValue read(::cudaStream_t stream, const ::std::source_location& where) const {
    check(::cudaStreamSynchronize(stream), "cudaStreamSynchronize", where);
    return ::c10::IValue(read_(host_));
  }

 private:
  class RelaxedCaptureMode {
   public:
    RelaxedCaptureMode() {
      check(::cudaThreadExchangeStreamCaptureMode(&mode_), "cudaThreadExchangeStreamCaptureMode");
    }
    RelaxedCaptureMode(const RelaxedCaptureMode&) = delete;
    RelaxedCaptureMode& operator=(const RelaxedCaptureMode&) = delete;
    ~RelaxedCaptureMode() { (void)::cudaThreadExchangeStreamCaptureMode(&mode_); }

   private:
    ::cudaStreamCaptureMode mode_ = ::cudaStreamCaptureModeRelaxed;
  };

  void* host_ = nullptr;
  ScalarReader read_ = nullptr;
};

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
  // A one-element read-back copied by the segment before it (else empty).
  CapturedReadBack read_back;

  // The key of `values` (this operator's outputs); false when one cannot key.
  bool key_of(::c10::ArrayRef<::c10::IValue> values, ::std::string& out) const {
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

  // After the segment before it was launched on `stream` (torch's current
  // stream): reads the value its segment copied, or runs the operator again
  // on its inputs; returns its key. When the key is this region's, a re-run's
  // outputs are copied into the static ones.
  ::std::string replay(::cudaStream_t stream, const ::std::source_location& where) const {
    if (read_back) {
      const ::c10::IValue value = read_back.read(stream, where);
      ::std::string out;
      (void)key_of(::c10::ArrayRef<::c10::IValue>(value), out);
      return out;
    }
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
