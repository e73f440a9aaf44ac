#pragma once
// SequenceGraphs: a token model (inputs int64 [batch, sequence], such as
// input_ids and attention_mask) with one CUDA graph per (batch, sequence)
// bucket, through replay::ShapeRouter with a 2-D key over
// replay::TorchGraphBackend. GraphedCallable buckets dimension 0 only; this
// is what the same parts do for two dimensions.
//
// A call copies the caller's [b, s] tensors into the bucket's [B, S] static
// inputs (one cudaMemcpy2DAsync each), zeroes the rest when an earlier call
// left data there (zero ids and a zero attention mask: padded positions are
// masked out), replays, and returns the outputs cut back to [b, s] (an
// output's dimension 0 when it is B, its dimension 1 when it is S). The
// outputs are views of the static outputs, valid until the next call.
#include <torch/torch.h>

#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <source_location>
#include <utility>
#include <vector>

#include "replay/torch.hpp"

namespace replay_examples {

// Copies a contiguous [b, s] tensor on the bucket's device into the top-left
// corner of `bucket_input` ([B, S], contiguous), on `stream`: one
// cudaMemcpy2DAsync. The rest of `bucket_input` is left as it was.
inline void copy_into_bucket(at::Tensor& bucket_input, const at::Tensor& src, cudaStream_t stream,
                             std::source_location where = std::source_location::current()) {
  const auto element = static_cast<std::size_t>(bucket_input.element_size());
  const auto width = static_cast<std::size_t>(src.size(1)) * element;
  replay::check(cudaMemcpy2DAsync(bucket_input.data_ptr(), static_cast<std::size_t>(bucket_input.size(1)) * element,
                                  src.data_ptr(), width, width, static_cast<std::size_t>(src.size(0)),
                                  cudaMemcpyDeviceToDevice, stream),
                "cudaMemcpy2DAsync", where);
}

class SequenceGraphs {
 public:
  using Key = std::pair<std::int64_t, std::int64_t>;  // (batch, sequence length)
  using Router = replay::ShapeRouter<Key, replay::TorchGraphBackend>;

  // `inputs`: how many int64 [batch, sequence] inputs the model takes. Captures
  // every bucket now, largest first, after `warmup_runs` eager runs each.
  SequenceGraphs(replay::TensorFunction fn, torch::Device device, std::vector<std::int64_t> batch_buckets,
                 std::vector<std::int64_t> sequence_buckets, std::size_t inputs = 2, std::uint32_t warmup_runs = 3)
      : fn_(std::move(fn)),
        device_(device.has_index() ? device : torch::Device(torch::kCUDA, c10::cuda::current_device())),
        inputs_(inputs) {
    const c10::cuda::CUDAGuard guard(device_);
    context_ = std::make_shared<replay::TorchCaptureContext>(device_);
    auto options = replay::ShapeRouterOptions<Key>::bucketed_per_dimension({batch_buckets, sequence_buckets});
    options.oversize = replay::OversizePolicy::throw_error;
    options.warmup_runs = warmup_runs;
    router_ = std::make_unique<Router>([this](const Key& shape, replay::StreamRef stream) { issue(shape, stream); },
                                       std::move(options), replay::TorchGraphBackend(context_));
    for (const Key& shape : router_->bucket_shapes()) {
      Bucket bucket;
      for (std::size_t i = 0; i < inputs_; ++i) {
        // Warm-ups and captures see a full attention mask and token ids 1.
        bucket.inputs.push_back(torch::ones({shape.first, shape.second},
                                            torch::TensorOptions().device(device_).dtype(torch::kLong)));
      }
      bucket.dirty = shape;
      buckets_.emplace(shape, std::move(bucket));
    }
    // Warm-ups on the capture stream, as GraphedCallable does; ordered after
    // the buffers' initialization and before any later call.
    torch::cuda::synchronize();
    (void)router_->capture_all(context_->capture_stream());
    torch::cuda::synchronize();
  }

  SequenceGraphs(const SequenceGraphs&) = delete;
  SequenceGraphs& operator=(const SequenceGraphs&) = delete;
  ~SequenceGraphs() {
    try {
      torch::cuda::synchronize();  // the static buffers may still be in use
    } catch (...) {
    }
  }

  // One call on torch's current stream. `inputs`: int64 [b, s] CUDA tensors,
  // b and s within the largest buckets (replay::usage_error otherwise).
  std::vector<at::Tensor> run(const std::vector<at::Tensor>& inputs,
                              std::source_location where = std::source_location::current()) {
    if (inputs.size() != inputs_) {
      throw replay::usage_error("SequenceGraphs: wrong number of inputs", where);
    }
    const Key key{inputs[0].size(0), inputs[0].size(1)};
    for (const at::Tensor& t : inputs) {
      if (t.dim() != 2 || t.size(0) != key.first || t.size(1) != key.second || t.scalar_type() != torch::kLong) {
        throw replay::usage_error("SequenceGraphs: inputs must be int64 [batch, sequence], all of one shape", where);
      }
    }
    const Key padded = router_->padded_shape(key, where);  // usage_error above the largest bucket
    Bucket& bucket = buckets_.at(padded);
    const c10::cuda::CUDAGuard guard(device_);
    const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device_.index()).stream();
    // Data may lie outside [b, s) only where an earlier call of this bucket put it.
    const bool zero = bucket.dirty.first > key.first || bucket.dirty.second > key.second;
    bucket.dirty = {std::max(bucket.dirty.first, key.first), std::max(bucket.dirty.second, key.second)};
    for (std::size_t i = 0; i < inputs_; ++i) {
      at::Tensor& dst = bucket.inputs[i];
      const auto element = static_cast<std::size_t>(dst.element_size());
      if (zero) {
        replay::check(cudaMemsetAsync(dst.data_ptr(), 0, static_cast<std::size_t>(dst.numel()) * element, stream),
                      "cudaMemsetAsync", where);
      }
      const at::Tensor& src = inputs[i];
      if (src.is_cuda() && src.device() == device_ && src.is_contiguous()) {
        copy_into_bucket(dst, src, stream, where);
      } else {
        c10::InferenceMode inference;
        dst.narrow(0, 0, key.first).narrow(1, 0, key.second).copy_(src, /*non_blocking=*/true);
      }
    }
    if (zero) {
      bucket.dirty = key;
    }
    const replay::Route<Key> route = router_->run(key, replay::StreamRef(stream), where);
    std::vector<at::Tensor> produced;
    if (route.graph()) {
      produced = *context_->launched_outputs();
    } else {
      produced = context_->take_outputs();
    }
    c10::InferenceMode inference;
    std::vector<at::Tensor> out;
    out.reserve(produced.size());
    for (at::Tensor& t : produced) {
      at::Tensor part = t;
      if (part.dim() > 0 && part.size(0) == padded.first && padded.first != key.first) {
        part = part.narrow(0, 0, key.first);
      }
      if (part.dim() > 1 && part.size(1) == padded.second && padded.second != key.second) {
        part = part.narrow(1, 0, key.second);
      }
      out.push_back(std::move(part));
    }
    return out;
  }

  std::size_t graph_count() const { return router_->graph_count(); }
  replay::RouterStats stats() const { return router_->stats(); }
  std::size_t pool_reserved_bytes() const { return context_->pool_reserved_bytes(); }

 private:
  struct Bucket {
    std::vector<at::Tensor> inputs;  // int64 [B, S] each
    Key dirty;                       // data may lie in rows < dirty.first, columns < dirty.second
  };

  // The router's work: the model on the bucket's static inputs, with `stream`
  // as torch's current stream; the outputs become the graph's static outputs.
  void issue(const Key& shape, replay::StreamRef stream) {
    const c10::cuda::CUDAStreamGuard stream_guard(c10::cuda::getStreamFromExternal(stream.get(), device_.index()));
    c10::InferenceMode inference;
    context_->set_outputs(fn_(buckets_.at(shape).inputs));
  }

  replay::TensorFunction fn_;
  torch::Device device_;
  std::size_t inputs_;
  std::map<Key, Bucket> buckets_;
  std::shared_ptr<replay::TorchCaptureContext> context_;
  std::unique_ptr<Router> router_;  // last: its graphs go before the context and the buffers
};

}  // namespace replay_examples
