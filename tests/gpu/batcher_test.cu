// Batcher with the CUDA executor: many producer threads submit requests of
// 1..4 rows; the Batcher gathers them into bucketed ShapeRouter replays
// (one host-to-device and one device-to-host copy per batch); every answer
// equals the eager result for that request alone (bitwise: the same kernel
// computes each row the same way at any batch size) and a host reference.
// A failing issue fails exactly its batch.
#include <doctest/doctest.h>

#include <atomic>
#include <cmath>
#include <cstddef>
#include <future>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "batcher_threads.hpp"
#include "gpu_suite.hpp"
#include "replay/batcher.hpp"
#include "replay/replay.hpp"

namespace {

constexpr int kIn = 64;
constexpr int kOut = 16;
constexpr int kMaxBatch = 32;

// out[r][c] = tanh(sum_k in[r][k] * w[k][c]); one block per row.
__global__ void dense_tanh_kernel(const float* in, const float* w, float* out, int rows) {
  const int r = static_cast<int>(blockIdx.x);
  const int c = static_cast<int>(threadIdx.x);
  if (r < rows && c < kOut) {
    float acc = 0.0F;
    for (int k = 0; k < kIn; ++k) {
      acc = fmaf(in[r * kIn + k], w[k * kOut + c], acc);
    }
    out[r * kOut + c] = tanhf(acc);
  }
}

struct Model {
  replay::DeviceBuffer<float> weights{static_cast<std::size_t>(kIn) * kOut};
  replay::DeviceBuffer<float> input{static_cast<std::size_t>(kMaxBatch) * kIn};
  replay::DeviceBuffer<float> output{static_cast<std::size_t>(kMaxBatch) * kOut};
  std::vector<float> host_weights = replay_test::random_floats(static_cast<std::size_t>(kIn) * kOut);

  explicit Model(replay::StreamRef stream) {
    weights.copy_from(std::span<const float>(host_weights), stream);
    stream.synchronize();
  }
  void forward(std::size_t rows, replay::StreamRef stream) const {
    dense_tanh_kernel<<<static_cast<unsigned>(rows), 32, 0, stream.get()>>>(input.data(), weights.data(),
                                                                           output.data(), static_cast<int>(rows));
    replay::check_last_launch("dense_tanh_kernel");
  }
  std::vector<float> host_reference(std::span<const float> in) const {
    std::vector<float> out;
    for (std::size_t r = 0; r < in.size() / kIn; ++r) {
      for (int c = 0; c < kOut; ++c) {
        double acc = 0;
        for (int k = 0; k < kIn; ++k) {
          acc += static_cast<double>(in[r * kIn + k]) * host_weights[static_cast<std::size_t>(k) * kOut + c];
        }
        out.push_back(static_cast<float>(std::tanh(acc)));
      }
    }
    return out;
  }
};

std::vector<std::size_t> buckets() { return {1, 2, 4, 8, 16, 32}; }

}  // namespace

TEST_SUITE("gpu" * replay_test::needs_device()) {
  TEST_CASE("Batcher over a ShapeRouter: answers from many threads equal eager and host results") {
    replay::Stream stream;
    Model model(stream);
    replay::ShapeRouter<int> router([&](const int& batch, replay::StreamRef s) { model.forward(batch, s); },
                                    replay::ShapeRouterOptions<int>::bucketed({1, 2, 4, 8, 16, 32}));
    router.capture_all(stream);

    constexpr int kThreads = 8;
    const int per_thread = replay_test::scaled(150, 5);
    std::vector<std::vector<float>> inputs(static_cast<std::size_t>(kThreads * per_thread));
    std::uniform_int_distribution<int> rows(1, 4);
    for (auto& in : inputs) {
      in = replay_test::random_floats(static_cast<std::size_t>(rows(replay_test::rng())) * kIn);
    }
    std::vector<replay::BatchResult<float>> results;
    {
      replay::BatcherOptions options;
      options.max_queue_delay = std::chrono::microseconds(300);
      options.queue_capacity = 64;
      replay::Batcher batcher(
          replay::router_executor(router, model.input.view(), model.output.view(), kIn, kOut, stream), options);
      CHECK(batcher.batch_sizes() == buckets());
      results = replay_test::submit_from_threads(batcher, inputs, kThreads);
      const auto stats = batcher.stats();
      CHECK(stats.completed == inputs.size());
      CHECK(stats.batches < inputs.size());  // requests were gathered
      MESSAGE("batches: " << stats.batches << " for " << inputs.size() << " requests, mean rows "
                          << stats.mean_batch_rows() << ", padding waste " << stats.padding_waste());
    }
    CHECK(router.stats().hits > 0);
    CHECK(router.stats().eager_fallbacks == 0);

    // Eager: each request alone, straight through the same kernel.
    replay::StagedCudaExecutor<float> eager(
        [&](std::size_t n, std::size_t, replay::StreamRef s) { model.forward(n, s); }, model.input.view(),
        model.output.view(), kIn, kOut, buckets(), stream);
    int mismatches = 0;
    int far_from_host = 0;
    for (std::size_t id = 0; id < inputs.size(); ++id) {
      REQUIRE(results[id].ok());
      const std::size_t n = inputs[id].size() / kIn;
      std::copy(inputs[id].begin(), inputs[id].end(), eager.input_staging().begin());
      const auto out = eager.run(n);
      const std::vector<float> expected(out.begin(), out.end());
      mismatches += results[id].output == expected ? 0 : 1;
      const auto host = model.host_reference(inputs[id]);
      for (std::size_t j = 0; j < host.size(); ++j) {
        far_from_host += std::fabs(host[j] - results[id].output[j]) <= 1e-4F ? 0 : 1;
      }
    }
    CHECK(mismatches == 0);
    CHECK(far_from_host == 0);
  }

  TEST_CASE("StagedCudaExecutor: a throwing issue fails its batch only; bad sizes are refused") {
    replay::Stream stream;
    Model model(stream);
    std::atomic<bool> fail_next{false};
    replay::StagedCudaExecutor<float> executor(
        [&](std::size_t n, std::size_t, replay::StreamRef s) {
          model.forward(n, s);
          if (fail_next.exchange(false)) {
            throw std::runtime_error("injected failure");
          }
        },
        model.input.view(), model.output.view(), kIn, kOut, buckets(), stream);
    CHECK_THROWS_AS(executor.run(0), replay::usage_error);
    CHECK_THROWS_AS(executor.run(kMaxBatch + 1), replay::usage_error);
    CHECK_THROWS_AS(replay::StagedCudaExecutor<float>([](std::size_t, std::size_t, replay::StreamRef) {},
                                                      model.input.view(), model.output.view(), kIn, kOut, {1, 64},
                                                      stream),
                    replay::usage_error);  // buffers too small for 64 rows

    replay::BatcherOptions options;
    options.max_batch_requests = 1;
    replay::Batcher batcher(std::move(executor), options);
    const auto a = replay_test::random_floats(kIn);
    const auto b = replay_test::random_floats(2 * kIn);
    fail_next = true;
    auto failed = batcher.submit(a).get();
    CHECK(failed.status == replay::BatchStatus::failed);
    CHECK(failed.message.find("injected failure") != std::string::npos);
    auto good = batcher.submit(b).get();
    REQUIRE(good.ok());
    const auto host = model.host_reference(b);
    for (std::size_t j = 0; j < host.size(); ++j) {
      CHECK(std::fabs(host[j] - good.output[j]) <= 1e-4F);
    }
  }
}
