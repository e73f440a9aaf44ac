#pragma once
// Preparing a TorchScript module for replay: load it, convert its floating
// parameters and buffers (dtype, channels-last), freeze it and pass it
// through optimize_for_inference. PreparedModule is the result, a
// TensorCallable that converts its floating inputs the same way; and
// compare_outputs() says how far prepared outputs are from the unprepared
// module's.
//
//   replay::PreparedModule resnet = replay::load_prepared("resnet50.pt",
//       {.flags = replay::PrepareFlags::inference | replay::PrepareFlags::channels_last, .dtype = at::kHalf});
//   replay::GraphedCallable graphed(resnet, {resnet.prepare_input(example)}, {.batch_buckets = {1, 8, 32}});
#include <replay/detail/require_cxx20.hpp>

#include <c10/cuda/CUDAFunctions.h>
#include <torch/script.h>

#include <algorithm>
#include <cstddef>
#include <optional>
#include <source_location>
#include <string>
#include <utility>
#include <vector>

#include "replay/detail/message.hpp"
#include "replay/error.hpp"
#include "replay/flags.hpp"
#include "replay/torch/callable.hpp"
#include "replay/torch/detail/capture.hpp"

namespace replay {

enum class PrepareFlags : unsigned int {
  none = 0,
  // torch::jit::freeze: parameters and attributes become constants, and the
  // frozen-graph passes run (convolution-batch-norm folding, folding of
  // add/mul into convolutions and linears, concatenation of linears that
  // share an input). Needs eval mode, which preparation sets.
  freeze = 1U << 0,
  // torch::jit::optimize_for_inference after freezing: on CUDA, convolution +
  // add + ReLU become cuDNN's fused kernel and frozen linears are transposed
  // once; on the CPU, MKLDNN layouts.
  optimize_for_inference = 1U << 1,
  // 4-D floating parameters and buffers (convolution weights) and 4-D
  // floating inputs in channels-last (NHWC) memory format, which cuDNN runs
  // faster than NCHW in fp16 on tensor cores.
  channels_last = 1U << 2,
  // What PrepareOptions does by default: freeze, then optimize_for_inference.
  inference = freeze | optimize_for_inference,
};
template <>
inline constexpr bool enable_bitmask<PrepareFlags> = true;

struct PrepareOptions {
  PrepareFlags flags = PrepareFlags::inference;
  // Floating parameters, buffers and inputs are converted to it (integer ones,
  // such as token ids or position buffers, are left alone). None: as saved.
  ::std::optional<::at::ScalarType> dtype;
  // Where load_prepared() loads the module to and prepare() moves it to.
  // None: the current CUDA device when there is one, else the CPU.
  ::std::optional<::c10::Device> device;
  // Attributes and methods kept through freezing (forward always is).
  ::std::vector<::std::string> preserved_attrs;
};

// A prepared TorchScript module, called as a TensorCallable: its floating
// inputs are converted to the preparation's dtype and (4-D ones, under
// PrepareFlags::channels_last) memory format first. That conversion is free
// when the inputs already are so (give GraphedCallable examples made with
// prepare_input(): its static inputs keep their memory format, and nothing is
// converted inside the graph).
class PreparedModule {
 public:
  PreparedModule(::torch::jit::Module module, PrepareOptions options)
      : module_(::std::move(module)), options_(::std::move(options)) {}

  ::std::vector<::at::Tensor> operator()(const ::std::vector<::at::Tensor>& inputs) {
    ::std::vector<::c10::IValue> args;
    args.reserve(inputs.size());
    for (const ::at::Tensor& t : inputs) {
      args.emplace_back(prepare_input(t));
    }
    return detail::to_tensor_list(module_.forward(::std::move(args)), ::std::source_location::current());
  }

  // `t` as the prepared module wants it: floating tensors in the dtype, 4-D
  // ones channels-last under PrepareFlags::channels_last; others unchanged.
  // Returns `t` itself when nothing changes.
  ::at::Tensor prepare_input(const ::at::Tensor& t) const {
    if (!t.defined() || !t.is_floating_point()) {
      return t;
    }
    ::at::Tensor out = options_.dtype && t.scalar_type() != *options_.dtype ? t.to(*options_.dtype) : t;
    if (has_flag(options_.flags, PrepareFlags::channels_last) && out.dim() == 4) {
      out = out.contiguous(::at::MemoryFormat::ChannelsLast);
    }
    return out;
  }

  ::torch::jit::Module& module() noexcept { return module_; }
  const ::torch::jit::Module& module() const noexcept { return module_; }
  const PrepareOptions& options() const noexcept { return options_; }

 private:
  ::torch::jit::Module module_;
  PrepareOptions options_;
};

namespace detail {

inline ::c10::Device prepare_device(const PrepareOptions& options) {
  if (options.device) {
    return *options.device;
  }
  // c10's count is 0 without a driver, and it leaves no CUDA error behind.
  if (::c10::cuda::device_count() > 0) {
    return ::c10::Device(::c10::kCUDA, ::c10::cuda::current_device());
  }
  return ::c10::Device(::c10::kCPU);
}

// Moves the module's parameters and buffers to `device`, floating ones to the
// dtype and 4-D floating ones to channels-last. (torch::jit::Module::to(dtype)
// would convert integer buffers too.)
inline void convert_module_state(::torch::jit::Module& module, const PrepareOptions& options,
                                 ::c10::Device device) {
  const bool channels_last = has_flag(options.flags, PrepareFlags::channels_last);
  auto convert = [&](const ::at::Tensor& t) {
    ::at::Tensor data = t.to(device);
    if (data.is_floating_point()) {
      if (options.dtype) {
        data = data.to(*options.dtype);
      }
      if (channels_last && data.dim() == 4) {
        data = data.contiguous(::at::MemoryFormat::ChannelsLast);
      }
    }
    if (!data.is_same(t)) {
      t.set_data(data);
    }
  };
  for (const ::at::Tensor& p : module.parameters(/*recurse=*/true)) {
    convert(p);
  }
  for (const ::at::Tensor& b : module.buffers(/*recurse=*/true)) {
    convert(b);
  }
}

}  // namespace detail

// Prepares `module` as `options` say: eval mode, its state moved and
// converted (in place: the tensors are shared with `module`'s other
// handles), then frozen and optimized for inference (into a new module).
// usage_error when freezing is asked of a module with no forward method;
// torch's own errors (c10::Error) from the passes propagate.
inline PreparedModule prepare(::torch::jit::Module module, PrepareOptions options = {},
                              ::std::source_location where = ::std::source_location::current()) {
  if (!module.find_method("forward")) {
    throw usage_error("replay::prepare: the module has no forward method", where);
  }
  const ::c10::Device device = detail::prepare_device(options);
  options.device = device;
  ::at::NoGradGuard no_grad;
  module.eval();
  detail::convert_module_state(module, options, device);
  const bool freeze = has_flag(options.flags, PrepareFlags::freeze) ||
                      has_flag(options.flags, PrepareFlags::optimize_for_inference);
  if (freeze) {
    module = ::torch::jit::freeze(module, options.preserved_attrs, /*optimize_numerics=*/true);
  }
  if (has_flag(options.flags, PrepareFlags::optimize_for_inference)) {
    module = ::torch::jit::optimize_for_inference(module);
  }
  return PreparedModule(::std::move(module), ::std::move(options));
}

// torch::jit::load(path) to the options' device, then prepare().
inline PreparedModule load_prepared(const ::std::string& path, PrepareOptions options = {},
                                    ::std::source_location where = ::std::source_location::current()) {
  const ::c10::Device device = detail::prepare_device(options);
  options.device = device;
  ::torch::jit::Module module;
  try {
    module = ::torch::jit::load(path, device);
  } catch (const ::c10::Error& e) {
    throw usage_error(detail::concat("replay::load_prepared: cannot load TorchScript file '", path,
                                     "': ", e.what_without_backtrace()),
                      where);
  }
  return prepare(::std::move(module), ::std::move(options), where);
}

// How far `actual` is from `reference`, output by output: the largest
// absolute difference and the largest |reference| over all elements (in
// double). relative() = max_abs_error / max_abs_reference is the figure
// replay's checks state their tolerances in.
struct OutputDifference {
  double max_abs_error = 0.0;
  double max_abs_reference = 0.0;
  ::std::size_t outputs = 0;
  double relative() const noexcept {
    return max_abs_reference > 0.0 ? max_abs_error / max_abs_reference : max_abs_error;
  }
};

// usage_error when the lists differ in length or an output differs in shape.
inline OutputDifference compare_outputs(const ::std::vector<::at::Tensor>& actual,
                                        const ::std::vector<::at::Tensor>& reference,
                                        ::std::source_location where = ::std::source_location::current()) {
  if (actual.size() != reference.size()) {
    throw usage_error(detail::concat("replay::compare_outputs: ", actual.size(), " output(s) against ",
                                     reference.size(), " reference output(s)"),
                      where);
  }
  ::at::NoGradGuard no_grad;
  OutputDifference out;
  out.outputs = actual.size();
  for (::std::size_t i = 0; i < actual.size(); ++i) {
    if (actual[i].sizes() != reference[i].sizes()) {
      throw usage_error(detail::concat("replay::compare_outputs: output ", i, " has shape ",
                                       detail::describe_sizes(actual[i].sizes()), " but the reference has ",
                                       detail::describe_sizes(reference[i].sizes())),
                        where);
    }
    if (actual[i].numel() == 0) {
      continue;
    }
    const ::at::Tensor ref = reference[i].to(actual[i].device(), ::at::kDouble);
    const ::at::Tensor act = actual[i].to(::at::kDouble);
    out.max_abs_error = ::std::max(out.max_abs_error, (act - ref).abs().max().item<double>());
    out.max_abs_reference = ::std::max(out.max_abs_reference, ref.abs().max().item<double>());
  }
  return out;
}

}  // namespace replay
