// The CUDA model: an MLP of the project's own kernels. Each hidden layer is
// four kernels, as an unfused eager framework launches them (linear, bias
// add, GELU, layer norm); the last layer is linear and bias. Served through
// a ShapeRouter (one CUDA graph per power-of-two batch bucket, all captured
// at start) or eagerly (the baseline), both through replay's
// StagedCudaExecutor (pinned staging, one copy each way per batch).
//
// Every output element is computed by the same code whatever the batch size,
// so a row's answer is bitwise the same alone, in any batch, graphed or eager.
#include <cmath>
#include <cstdio>
#include <memory>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>

#include "model.hpp"
#include "replay/batcher.hpp"
#include "replay/replay.hpp"

namespace inference_server {
namespace {

constexpr int kWarpsPerBlock = 4;

// y[r][c] = sum_k x[r][k] * w[c][k]: one warp per output element, a fixed
// reduction order.
__global__ void linear_kernel(const float* x, const float* w, float* y, int rows, int in, int out) {
  const long long warp = static_cast<long long>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  const int lane = static_cast<int>(threadIdx.x % 32);
  if (warp >= static_cast<long long>(rows) * out) {
    return;
  }
  const int r = static_cast<int>(warp / out);
  const int c = static_cast<int>(warp % out);
  float acc = 0.0F;
  for (int k = lane; k < in; k += 32) {
    acc = fmaf(x[static_cast<long long>(r) * in + k], w[static_cast<long long>(c) * in + k], acc);
  }
  for (int offset = 16; offset > 0; offset /= 2) {
    acc += __shfl_xor_sync(0xffffffffU, acc, offset);
  }
  if (lane == 0) {
    y[static_cast<long long>(r) * out + c] = acc;
  }
}

__global__ void bias_kernel(float* y, const float* b, int rows, int width) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < rows * width) {
    y[i] += b[i % width];
  }
}

__global__ void gelu_kernel(float* y, int n) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n) {
    const float v = y[i];
    y[i] = 0.5F * v * (1.0F + tanhf(0.7978845608F * (v + 0.044715F * v * v * v)));
  }
}

// Normalizes each row to mean 0, variance 1: one warp per row.
__global__ void layer_norm_kernel(float* y, int rows, int width) {
  const int r = static_cast<int>(blockIdx.x) * kWarpsPerBlock + static_cast<int>(threadIdx.x / 32);
  const int lane = static_cast<int>(threadIdx.x % 32);
  if (r >= rows) {
    return;
  }
  float* row = y + static_cast<long long>(r) * width;
  float sum = 0.0F;
  for (int k = lane; k < width; k += 32) {
    sum += row[k];
  }
  for (int offset = 16; offset > 0; offset /= 2) {
    sum += __shfl_xor_sync(0xffffffffU, sum, offset);
  }
  const float mean = sum / static_cast<float>(width);
  float var = 0.0F;
  for (int k = lane; k < width; k += 32) {
    const float d = row[k] - mean;
    var = fmaf(d, d, var);
  }
  for (int offset = 16; offset > 0; offset /= 2) {
    var += __shfl_xor_sync(0xffffffffU, var, offset);
  }
  const float inv = rsqrtf(var / static_cast<float>(width) + 1e-5F);
  for (int k = lane; k < width; k += 32) {
    row[k] = (row[k] - mean) * inv;
  }
}

unsigned blocks_for(long long threads, int per_block) {
  return static_cast<unsigned>((threads + per_block - 1) / per_block);
}

class GpuMlp final : public Model {
 public:
  explicit GpuMlp(const ModelConfig& config)
      : config_(config),
        sizes_(to_sizes(replay::power_of_two_buckets(config.max_batch))),
        rows_(sizes_.back()),
        input_(rows_ * static_cast<std::size_t>(config.width)),
        ping_(rows_ * static_cast<std::size_t>(config.width)),
        pong_(rows_ * static_cast<std::size_t>(config.width)),
        output_(rows_ * static_cast<std::size_t>(config.outputs)),
        weights_(weight_elements(config)),
        biases_(bias_elements(config)) {
    upload_parameters();
    auto eager_issue = [this](std::size_t rows, std::size_t, replay::StreamRef s) { forward(rows, s); };
    eager_.emplace(eager_issue, input_.view(), output_.view(), input_row_elements(), output_row_elements(), sizes_,
                   stream_.ref());
    if (config.graphs) {
      router_ = std::make_unique<replay::ShapeRouter<int>>(
          [this](const int& batch, replay::StreamRef s) { forward(static_cast<std::size_t>(batch), s); },
          replay::ShapeRouterOptions<int>::bucketed(replay::power_of_two_buckets(config.max_batch)));
      router_->capture_all(stream_);
      stream_.synchronize();
      serving_.emplace(replay::router_executor(*router_, input_.view(), output_.view(), input_row_elements(),
                                               output_row_elements(), stream_.ref()));
    }
  }

  std::size_t input_row_elements() const override { return static_cast<std::size_t>(config_.width); }
  std::size_t output_row_elements() const override { return static_cast<std::size_t>(config_.outputs); }
  std::vector<std::size_t> batch_sizes() const override { return sizes_; }
  std::span<float> input_staging() override { return serving().input_staging(); }
  std::span<const float> run(std::size_t rows) override { return serving().run(rows); }
  std::vector<float> reference(std::span<const float> row) override {
    std::copy(row.begin(), row.end(), eager_->input_staging().begin());
    const auto out = eager_->run(1);
    return {out.begin(), out.end()};
  }
  std::string describe() const override {
    return std::string("CUDA MLP (") + (config_.graphs ? "CUDA graphs through a ShapeRouter" : "eager") + "): " +
           std::to_string(config_.layers) + " layers of width " + std::to_string(config_.width) + ", " +
           std::to_string(config_.outputs) + " outputs, " + std::to_string(kernels_per_forward()) +
           " kernels per batch, batch buckets up to " + std::to_string(rows_);
  }
  std::string router_stats_json() const override {
    if (!router_) {
      return "null";
    }
    const replay::RouterStats s = router_->stats();
    char buffer[512];
    std::snprintf(buffer, sizeof buffer,
                  "{\"runs\": %llu, \"hits\": %llu, \"misses\": %llu, \"captures\": %llu, \"eager_fallbacks\": %llu, "
                  "\"oversize\": %llu, \"hit_rate\": %.6f, \"padding_waste\": %.6f}",
                  static_cast<unsigned long long>(s.runs), static_cast<unsigned long long>(s.hits),
                  static_cast<unsigned long long>(s.misses), static_cast<unsigned long long>(s.captures),
                  static_cast<unsigned long long>(s.eager_fallbacks), static_cast<unsigned long long>(s.oversize),
                  s.hit_rate(), s.padding_waste());
    return buffer;
  }

 private:
  static std::vector<std::size_t> to_sizes(const std::vector<std::int64_t>& buckets) {
    return {buckets.begin(), buckets.end()};
  }
  static std::size_t weight_elements(const ModelConfig& c) {
    return static_cast<std::size_t>(c.layers - 1) * c.width * c.width + static_cast<std::size_t>(c.outputs) * c.width;
  }
  static std::size_t bias_elements(const ModelConfig& c) {
    return static_cast<std::size_t>(c.layers - 1) * c.width + static_cast<std::size_t>(c.outputs);
  }
  int kernels_per_forward() const { return (config_.layers - 1) * 4 + 2; }

  replay::StagedCudaExecutor<float>& serving() { return serving_ ? *serving_ : *eager_; }

  void upload_parameters() {
    std::mt19937 rng(1234);
    const float scale = std::sqrt(3.0F / static_cast<float>(config_.width));
    std::uniform_real_distribution<float> dist(-scale, scale);
    std::vector<float> w(weights_.size());
    for (float& x : w) {
      x = dist(rng);
    }
    const std::vector<float> b(biases_.size(), 0.01F);
    weights_.copy_from(std::span<const float>(w), stream_);
    biases_.copy_from(std::span<const float>(b), stream_);
    stream_.synchronize();
  }

  // The forward pass over the first `rows` rows of input_, into output_.
  void forward(std::size_t rows, replay::StreamRef s) const {
    const int n = static_cast<int>(rows);
    const int width = config_.width;
    const float* x = input_.data();
    float* buffers[2] = {ping_.data(), pong_.data()};
    const float* w = weights_.data();
    const float* b = biases_.data();
    constexpr int kThreads = 256;
    for (int l = 0; l + 1 < config_.layers; ++l) {
      float* y = buffers[l % 2];
      linear_kernel<<<blocks_for(static_cast<long long>(n) * width, kWarpsPerBlock), kWarpsPerBlock * 32, 0,
                      s.get()>>>(x, w, y, n, width, width);
      bias_kernel<<<blocks_for(static_cast<long long>(n) * width, kThreads), kThreads, 0, s.get()>>>(y, b, n, width);
      gelu_kernel<<<blocks_for(static_cast<long long>(n) * width, kThreads), kThreads, 0, s.get()>>>(y, n * width);
      layer_norm_kernel<<<blocks_for(n, kWarpsPerBlock), kWarpsPerBlock * 32, 0, s.get()>>>(y, n, width);
      x = y;
      w += static_cast<std::size_t>(width) * width;
      b += width;
    }
    linear_kernel<<<blocks_for(static_cast<long long>(n) * config_.outputs, kWarpsPerBlock), kWarpsPerBlock * 32, 0,
                    s.get()>>>(x, w, output_.data(), n, width, config_.outputs);
    bias_kernel<<<blocks_for(static_cast<long long>(n) * config_.outputs, kThreads), kThreads, 0, s.get()>>>(
        output_.data(), b, n, config_.outputs);
    replay::check_last_launch("inference_server MLP kernels");
  }

  ModelConfig config_;
  std::vector<std::size_t> sizes_;
  std::size_t rows_;
  replay::Stream stream_;
  replay::DeviceBuffer<float> input_;
  replay::DeviceBuffer<float> ping_;
  replay::DeviceBuffer<float> pong_;
  replay::DeviceBuffer<float> output_;
  replay::DeviceBuffer<float> weights_;
  replay::DeviceBuffer<float> biases_;
  std::optional<replay::StagedCudaExecutor<float>> eager_;    // reference, and the eager baseline
  std::unique_ptr<replay::ShapeRouter<int>> router_;          // graphs only
  std::optional<replay::StagedCudaExecutor<float>> serving_;  // graphs only: through router_
};

}  // namespace

std::unique_ptr<Model> make_gpu_mlp(const ModelConfig& config) {
  if (!replay::has_device()) {
    throw std::runtime_error("--model mlp needs a CUDA device and driver (cudaGetDeviceCount failed or returned 0); "
                             "use --model cpu for the CPU stand-in");
  }
  if (config.layers < 2 || config.width < 32 || config.width % 32 != 0 || config.outputs < 1 || config.max_batch < 1) {
    throw std::runtime_error("--model mlp needs --layers >= 2, --width a multiple of 32, --max-batch >= 1");
  }
  return std::make_unique<GpuMlp>(config);
}

}  // namespace inference_server
