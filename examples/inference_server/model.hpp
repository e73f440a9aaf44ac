#pragma once
// The models the inference server can serve, behind one interface so that
// the server picks one at run time. Each is a replay::BatchExecutor through
// ModelExecutor (one virtual call per batch).
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace inference_server {

struct ModelConfig {
  std::string kind = "mlp";  // "mlp": CUDA kernels; "cpu": the CPU stand-in; "resnet50": libtorch
  int layers = 20;
  int width = 256;
  int outputs = 16;
  int max_batch = 64;
  bool graphs = true;        // false: eager (no CUDA graphs), the baseline
  int cpu_delay_us = 0;      // cpu only: extra time per batch (tests of back-pressure and deadlines)
  int cpu_fail_after = -1;   // cpu only: every batch after this many fails (tests of readiness); -1: never
  int cpu_load_ms = 0;       // cpu only: time the model takes to load (tests of readiness)
};

class Model {
 public:
  virtual ~Model() = default;
  virtual std::size_t input_row_elements() const = 0;
  virtual std::size_t output_row_elements() const = 0;
  virtual std::vector<std::size_t> batch_sizes() const = 0;
  virtual std::span<float> input_staging() = 0;
  virtual std::span<const float> run(std::size_t rows) = 0;
  // The output of one row computed alone, without batching or graphs. Only
  // while nothing else runs the model (before serving).
  virtual std::vector<float> reference(std::span<const float> row) = 0;
  // How far an answer may be from reference() (relative, per element); 0: bitwise.
  virtual float tolerance() const { return 0.0F; }
  // One line saying what this is.
  virtual std::string describe() const = 0;
  // The ShapeRouter's statistics as a JSON object, or "null".
  virtual std::string router_stats_json() const { return "null"; }
};

// How the model's batches have gone lately (for /readyz): failures in a row
// and the last one's message. Written by the Batcher's worker, read by any thread.
class BatchHealth {
 public:
  void succeeded() { failures_in_a_row_.store(0, std::memory_order_relaxed); }
  void failed(std::string message) {
    std::lock_guard lock(mutex_);
    last_failure_ = std::move(message);
    failures_in_a_row_.fetch_add(1, std::memory_order_relaxed);
  }
  std::uint64_t failures_in_a_row() const { return failures_in_a_row_.load(std::memory_order_relaxed); }
  std::string last_failure() const {
    std::lock_guard lock(mutex_);
    return last_failure_;
  }

 private:
  std::atomic<std::uint64_t> failures_in_a_row_{0};
  mutable std::mutex mutex_;
  std::string last_failure_;
};

// A replay::BatchExecutor over a Model the server owns; each batch's outcome
// goes to `health` (the Batcher turns the exception into its requests' 500).
struct ModelExecutor {
  using input_type = float;
  using output_type = float;
  Model* model;
  BatchHealth* health;
  std::size_t input_row_elements() const { return model->input_row_elements(); }
  std::size_t output_row_elements() const { return model->output_row_elements(); }
  std::vector<std::size_t> batch_sizes() const { return model->batch_sizes(); }
  std::span<float> input_staging() { return model->input_staging(); }
  std::span<const float> run(std::size_t rows) {
    try {
      const std::span<const float> output = model->run(rows);
      health->succeeded();
      return output;
    } catch (const std::exception& e) {
      health->failed(e.what());
      throw;
    } catch (...) {
      health->failed("an exception that is not a std::exception");
      throw;
    }
  }
};

std::unique_ptr<Model> make_cpu_model(const ModelConfig& config);
// Throws when there is no CUDA device or a CUDA call fails.
std::unique_ptr<Model> make_gpu_mlp(const ModelConfig& config);
// ResNet-50 through the libtorch adapter; only in inference_server_torch.
std::unique_ptr<Model> make_torch_resnet(const ModelConfig& config);

// The input row the load test sends for request id `id` (also used by the
// server to verify answers): deterministic, exact in float32.
inline float input_value(unsigned long long key, std::size_t j) {
  const unsigned long long v = (key * 7919ULL + j * 104729ULL + (key * j) % 1013ULL) % 10007ULL;
  return static_cast<float>(static_cast<double>(v) / 10007.0 - 0.5);
}

}  // namespace inference_server
