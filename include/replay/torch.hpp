#pragma once
// replay/torch.hpp: the libtorch adapter. Turns a torch::nn module, a
// torch::jit::Module or any callable from tensors to tensors into a graphed
// callable: one CUDA graph per batch-size bucket (a ShapeRouter over
// TorchGraphBackend), static input tensors the caller's data is copied into,
// static output tensors each replay overwrites, one private memory pool of
// PyTorch's caching allocator shared by all the graphs, and eager fallback for
// a bucket whose capture fails.
//
//   replay::GraphedCallable resnet(model, {torch::randn({32, 3, 224, 224}, cuda_half)},
//                                  {.batch_buckets = {1, 2, 4, 8, 16, 32}});
//   at::Tensor logits = resnet(images)[0];   // images: [n, 3, 224, 224], n <= 32
//
// TorchScript files are loaded and prepared (frozen, optimized for inference,
// fp16, channels-last) by replay::load_prepared (replay/torch/prepare.hpp).
//
// Never included by replay/replay.hpp: it needs libtorch (target replay::torch).
// See docs/torch.md.
#include <replay/detail/require_cxx20.hpp>

// IWYU pragma: begin_exports
#include "replay/torch/errors.hpp"
#include "replay/torch/options.hpp"
#include "replay/torch/piecewise.hpp"
#include "replay/torch/callable.hpp"
#include "replay/torch/capture_context.hpp"
#include "replay/torch/backend.hpp"
#include "replay/torch/outputs.hpp"
#include "replay/torch/graphed_callable.hpp"
#include "replay/torch/prepare.hpp"
// IWYU pragma: end_exports
