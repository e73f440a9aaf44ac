// ResNet-50 (random weights, fp16) through the libtorch adapter: one
// GraphedCallable with power-of-two batch buckets, served by replay's
// GraphedBatchExecutor. Requests are float32 images (3 x 224 x 224); the cast
// to fp16 and back is inside the captured graphs. Built into
// inference_server_torch only, where libtorch was found.
#include <torch/torch.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "model.hpp"
#include "replay/torch.hpp"
#include "replay/torch/batch_executor.hpp"
#include "resnet.hpp"

namespace inference_server {
namespace {

std::vector<std::int64_t> power_of_two_up_to(int max) {
  std::vector<std::int64_t> out{1};
  while (out.back() < max) {
    out.push_back(out.back() * 2);
  }
  return out;
}

class TorchResnet final : public Model {
 public:
  explicit TorchResnet(const ModelConfig& config)
      : net_(replay_examples::resnet50(torch::kCUDA, torch::kHalf)),
        graphed_(
            [net = net_](const torch::Tensor& x) mutable { return net->forward(x.to(torch::kHalf)).to(torch::kFloat); },
            {torch::zeros({power_of_two_up_to(config.max_batch).back(), 3, 224, 224},
                          torch::TensorOptions().device(torch::kCUDA).dtype(torch::kFloat))},
            {.batch_buckets = power_of_two_up_to(config.max_batch)}),
        executor_(graphed_, {3, 224, 224}) {}

  std::size_t input_row_elements() const override { return executor_.input_row_elements(); }
  std::size_t output_row_elements() const override { return executor_.output_row_elements(); }
  std::vector<std::size_t> batch_sizes() const override { return executor_.batch_sizes(); }
  std::span<float> input_staging() override { return executor_.input_staging(); }
  std::span<const float> run(std::size_t rows) override { return executor_.run(rows); }
  std::vector<float> reference(std::span<const float> row) override {
    std::vector<float> copy(row.begin(), row.end());
    const torch::Tensor x = torch::from_blob(copy.data(), {1, 3, 224, 224}, torch::kFloat).to(torch::kCUDA);
    torch::NoGradGuard no_grad;
    const torch::Tensor out = graphed_.run_eager({x})[0].to(torch::kFloat).contiguous().cpu();
    return {out.data_ptr<float>(), out.data_ptr<float>() + out.numel()};
  }
  // fp16 convolutions pick different algorithms per batch size: answers agree
  // to fp16 precision, not bitwise.
  float tolerance() const override { return 5e-2F; }
  std::string describe() const override {
    return "ResNet-50 fp16 (random weights) through a GraphedCallable, " +
           std::to_string(graphed_.graph_count()) + " batch buckets up to " +
           std::to_string(executor_.batch_sizes().back()) + "; inputs float32 3x224x224, outputs 1000 logits";
  }
  std::string router_stats_json() const override {
    const replay::RouterStats s = graphed_.stats();
    return "{\"runs\": " + std::to_string(s.runs) + ", \"hits\": " + std::to_string(s.hits) +
           ", \"misses\": " + std::to_string(s.misses) + ", \"captures\": " + std::to_string(s.captures) +
           ", \"eager_fallbacks\": " + std::to_string(s.eager_fallbacks) + "}";
  }

 private:
  replay_examples::ResNet net_;
  replay::GraphedCallable graphed_;
  replay::GraphedBatchExecutor<float> executor_;
};

}  // namespace

std::unique_ptr<Model> make_torch_resnet(const ModelConfig& config) {
  if (!torch::cuda::is_available()) {
    throw std::runtime_error("--model resnet50 needs a CUDA device (torch::cuda::is_available() is false)");
  }
  return std::make_unique<TorchResnet>(config);
}

}  // namespace inference_server
