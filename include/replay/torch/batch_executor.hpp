#pragma once
#include <replay/detail/require_cxx20.hpp>
// GraphedBatchExecutor: a replay::BatchExecutor over a GraphedCallable (the
// libtorch adapter), so that a Batcher gathers single requests into bucketed
// replays of a torch model. Needs libtorch (target replay::torch); never
// included by replay/replay.hpp or replay/batcher.hpp.
//
//   replay::GraphedCallable resnet(model, {example}, {.batch_buckets = {1, 2, 4, 8, 16, 32}});
//   replay::Batcher batcher(replay::GraphedBatchExecutor<c10::Half>(resnet, {3, 224, 224}));
//
// The Batcher writes a batch's rows into a pinned host tensor; run(rows)
// hands its first `rows` rows to the GraphedCallable, which copies them into
// its static input in one host-to-device copy (and zeroes the padding rows);
// the replay's first output is converted to Out on the device and copied back
// in one device-to-host copy, and the stream is waited for. The model has one
// input (dimension 0 the batch) and its first output has the batch in
// dimension 0. Runs on the worker thread's current CUDA stream.
#include <ATen/ATen.h>
#include <c10/core/ScalarType.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <cstddef>
#include <cstdint>
#include <source_location>
#include <span>
#include <string>
#include <vector>

#include "replay/batcher/executor.hpp"
#include "replay/error.hpp"
#include "replay/torch.hpp"

namespace replay {

template <class In = float, class Out = float>
class GraphedBatchExecutor {
 public:
  using input_type = In;
  using output_type = Out;

  // `row_shape`: the input's shape without the batch dimension; its dtype is
  // In's (float, c10::Half, ...). The GraphedCallable is borrowed and must
  // outlive the executor; one replay of batch 1 runs here to learn the output
  // row size.
  GraphedBatchExecutor(GraphedCallable& graphed, ::std::vector<::std::int64_t> row_shape,
                       ::std::source_location where = ::std::source_location::current())
      : graphed_(&graphed), device_(graphed.device()) {
    for (const ::std::int64_t b : graphed.buckets()) {
      sizes_.push_back(static_cast<::std::size_t>(b));
    }
    ::std::vector<::std::int64_t> shape{static_cast<::std::int64_t>(sizes_.back())};
    shape.insert(shape.end(), row_shape.begin(), row_shape.end());
    in_row_ = 1;
    for (const ::std::int64_t d : row_shape) {
      if (d <= 0) {
        throw usage_error("GraphedBatchExecutor: every dimension of row_shape must be positive", where);
      }
      in_row_ *= static_cast<::std::size_t>(d);
    }
    const auto pinned = ::at::TensorOptions().dtype(in_dtype()).device(::at::kCPU).pinned_memory(true);
    staging_in_ = ::at::zeros(shape, pinned);
    const ::at::Tensor out = first_output(1, where);
    out_row_ = static_cast<::std::size_t>(out.numel());
    staging_out_ = ::at::empty({static_cast<::std::int64_t>(sizes_.back()), static_cast<::std::int64_t>(out_row_)},
                               ::at::TensorOptions().dtype(out_dtype()).device(::at::kCPU).pinned_memory(true));
  }

  ::std::size_t input_row_elements() const noexcept { return in_row_; }
  ::std::size_t output_row_elements() const noexcept { return out_row_; }
  ::std::vector<::std::size_t> batch_sizes() const { return sizes_; }
  ::std::span<In> input_staging() noexcept {
    return {static_cast<In*>(staging_in_.data_ptr()), sizes_.back() * in_row_};
  }

  ::std::span<const Out> run(::std::size_t rows, ::std::source_location where = ::std::source_location::current()) {
    if (rows == 0 || rows > sizes_.back()) {
      throw usage_error("GraphedBatchExecutor::run(): " + ::std::to_string(rows) +
                            " rows is outside 1..the largest bucket (" + ::std::to_string(sizes_.back()) + ")",
                        where);
    }
    ::c10::cuda::CUDAGuard guard(device_);
    const ::at::NoGradGuard no_grad;
    const ::c10::cuda::CUDAStream stream = ::c10::cuda::getCurrentCUDAStream(device_.index());
    try {
      const ::at::Tensor out = first_output(rows, where);
      if (static_cast<::std::size_t>(out.numel()) != rows * out_row_) {
        throw usage_error("GraphedBatchExecutor: the first output has " + ::std::to_string(out.numel()) +
                              " elements for " + ::std::to_string(rows) + " rows, expected " +
                              ::std::to_string(rows * out_row_) + " (batch in dimension 0)",
                          where);
      }
      staging_out_.narrow(0, 0, static_cast<::std::int64_t>(rows))
          .copy_(out.reshape({static_cast<::std::int64_t>(rows), -1}).to(out_dtype()), /*non_blocking=*/true);
      check(::cudaStreamSynchronize(stream.stream()), "cudaStreamSynchronize", where);
    } catch (...) {
      // The staging tensors are written again by the next batch.
      (void)::cudaStreamSynchronize(stream.stream());
      throw;
    }
    return {static_cast<const Out*>(staging_out_.data_ptr()), rows * out_row_};
  }

 private:
  static ::c10::ScalarType in_dtype() { return ::c10::CppTypeToScalarType<In>::value; }
  static ::c10::ScalarType out_dtype() { return ::c10::CppTypeToScalarType<Out>::value; }

  ::at::Tensor first_output(::std::size_t rows, const ::std::source_location& where) {
    GraphedOutputs outs = graphed_->run({staging_in_.narrow(0, 0, static_cast<::std::int64_t>(rows))}, where);
    return outs.at(0, where);
  }

  GraphedCallable* graphed_;
  ::c10::Device device_;
  ::std::vector<::std::size_t> sizes_;
  ::std::size_t in_row_ = 0;
  ::std::size_t out_row_ = 0;
  ::at::Tensor staging_in_;
  ::at::Tensor staging_out_;
};

}  // namespace replay
