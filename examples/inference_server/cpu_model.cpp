// The CPU stand-in model: the same architecture as the CUDA MLP (linear,
// bias, GELU, layer norm per hidden layer; a final linear layer), computed row
// by row on the host. For tests of the server without a GPU.
#include <chrono>
#include <cmath>
#include <cstdint>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>

#include "model.hpp"

namespace inference_server {
namespace {

class CpuModel final : public Model {
 public:
  explicit CpuModel(const ModelConfig& config) : config_(config) {
    std::this_thread::sleep_for(std::chrono::milliseconds(config.cpu_load_ms));
    std::mt19937 rng(1234);
    const float scale = std::sqrt(3.0F / static_cast<float>(config.width));
    std::uniform_real_distribution<float> dist(-scale, scale);
    for (int l = 0; l < config.layers; ++l) {
      const int out = l + 1 == config.layers ? config.outputs : config.width;
      std::vector<float> w(static_cast<std::size_t>(out) * config.width);
      for (float& x : w) {
        x = dist(rng);
      }
      weights_.push_back(std::move(w));
      biases_.emplace_back(static_cast<std::size_t>(out), 0.01F);
    }
    for (int b = 1; b <= config.max_batch; b *= 2) {
      sizes_.push_back(static_cast<std::size_t>(b));
    }
    if (sizes_.back() != static_cast<std::size_t>(config.max_batch)) {
      sizes_.push_back(static_cast<std::size_t>(config.max_batch));
    }
    staging_.resize(static_cast<std::size_t>(config.max_batch) * config.width);
    output_.resize(static_cast<std::size_t>(config.max_batch) * config.outputs);
  }

  std::size_t input_row_elements() const override { return static_cast<std::size_t>(config_.width); }
  std::size_t output_row_elements() const override { return static_cast<std::size_t>(config_.outputs); }
  std::vector<std::size_t> batch_sizes() const override { return sizes_; }
  std::span<float> input_staging() override { return staging_; }
  std::span<const float> run(std::size_t rows) override {
    if (config_.cpu_fail_after >= 0 && batches_run_ >= static_cast<std::uint64_t>(config_.cpu_fail_after)) {
      throw std::runtime_error("cpu stand-in: every batch after the first " + std::to_string(config_.cpu_fail_after) +
                               " fails (--cpu-fail-after)");
    }
    ++batches_run_;
    if (config_.cpu_delay_us > 0) {
      std::this_thread::sleep_for(std::chrono::microseconds(config_.cpu_delay_us));
    }
    for (std::size_t r = 0; r < rows; ++r) {
      forward_row(std::span<const float>(staging_).subspan(r * config_.width, config_.width),
                  std::span<float>(output_).subspan(r * config_.outputs, config_.outputs));
    }
    return {output_.data(), rows * config_.outputs};
  }
  std::vector<float> reference(std::span<const float> row) override {
    std::vector<float> out(static_cast<std::size_t>(config_.outputs));
    forward_row(row, out);
    return out;
  }
  std::string describe() const override {
    return "cpu stand-in MLP: " + std::to_string(config_.layers) + " layers of width " +
           std::to_string(config_.width) + ", " + std::to_string(config_.outputs) + " outputs";
  }

 private:
  void forward_row(std::span<const float> in, std::span<float> out) const {
    std::vector<float> x(in.begin(), in.end());
    std::vector<float> y(static_cast<std::size_t>(config_.width));
    for (int l = 0; l < config_.layers; ++l) {
      const bool last = l + 1 == config_.layers;
      const int n = last ? config_.outputs : config_.width;
      for (int c = 0; c < n; ++c) {
        float acc = 0.0F;
        for (int k = 0; k < config_.width; ++k) {
          acc += weights_[l][static_cast<std::size_t>(c) * config_.width + k] * x[k];
        }
        acc += biases_[l][c];
        if (last) {
          out[c] = acc;
        } else {
          y[c] = 0.5F * acc * (1.0F + std::tanh(0.7978845608F * (acc + 0.044715F * acc * acc * acc)));
        }
      }
      if (!last) {
        float mean = 0.0F;
        for (float v : y) {
          mean += v;
        }
        mean /= static_cast<float>(config_.width);
        float var = 0.0F;
        for (float v : y) {
          var += (v - mean) * (v - mean);
        }
        var /= static_cast<float>(config_.width);
        const float inv = 1.0F / std::sqrt(var + 1e-5F);
        for (int c = 0; c < config_.width; ++c) {
          x[c] = (y[c] - mean) * inv;
        }
      }
    }
  }

  ModelConfig config_;
  std::vector<std::vector<float>> weights_;  // [layer][out * width + in]
  std::vector<std::vector<float>> biases_;
  std::vector<std::size_t> sizes_;
  std::vector<float> staging_;
  std::vector<float> output_;
  std::uint64_t batches_run_ = 0;  // only the Batcher's worker runs batches
};

}  // namespace

std::unique_ptr<Model> make_cpu_model(const ModelConfig& config) { return std::make_unique<CpuModel>(config); }

}  // namespace inference_server
