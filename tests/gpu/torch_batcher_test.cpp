// Batcher over a GraphedCallable (replay/torch/batch_executor.hpp): several
// threads submit requests of 1..2 rows to a small torch model; every answer
// matches the model run eagerly on that request alone. Part of test_torch
// (tests/torch_batcher.cmake).
#include <torch/torch.h>

#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "batcher_threads.hpp"
#include "gpu_suite.hpp"
#include "replay/batcher/batcher.hpp"
#include "replay/torch/batch_executor.hpp"

TEST_SUITE("gpu" * replay_test::needs_device()) {
  TEST_CASE("Batcher over a GraphedCallable: answers from several threads equal eager runs") {
    constexpr std::int64_t kIn = 32;
    const auto cuda = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kFloat);
    torch::nn::Sequential model(torch::nn::Linear(kIn, 64), torch::nn::ReLU(), torch::nn::Linear(64, 8));
    model->to(torch::kCUDA);
    model->eval();
    replay::GraphedCallable graphed(model, {torch::randn({8, kIn}, cuda)}, {.batch_buckets = {1, 2, 4, 8}});

    replay::BatcherOptions options;
    options.max_queue_delay = std::chrono::microseconds(500);
    replay::Batcher batcher(replay::GraphedBatchExecutor<float>(graphed, {kIn}), options);
    CHECK(batcher.input_row_elements() == kIn);
    CHECK(batcher.output_row_elements() == 8);
    CHECK(batcher.batch_sizes() == std::vector<std::size_t>{1, 2, 4, 8});

    constexpr int kThreads = 4;
    const int per_thread = replay_test::scaled(40, 4);
    std::vector<std::vector<float>> inputs(static_cast<std::size_t>(kThreads * per_thread));
    std::uniform_int_distribution<int> rows(1, 2);
    for (auto& in : inputs) {
      in = replay_test::random_floats(static_cast<std::size_t>(rows(replay_test::rng()) * kIn));
    }
    auto results = replay_test::submit_from_threads(batcher, inputs, kThreads);
    batcher.shutdown();
    CHECK(batcher.stats().completed == inputs.size());

    int wrong = 0;
    for (std::size_t id = 0; id < inputs.size(); ++id) {
      REQUIRE(results[id].ok());
      const auto n = static_cast<std::int64_t>(inputs[id].size()) / kIn;
      const torch::Tensor x = torch::from_blob(inputs[id].data(), {n, kIn}, torch::kFloat).to(torch::kCUDA);
      torch::Tensor expected;
      {
        torch::NoGradGuard no_grad;
        expected = graphed.run_eager({x})[0].cpu();
      }
      const torch::Tensor got = torch::from_blob(results[id].output.data(), {n, 8}, torch::kFloat);
      wrong += torch::allclose(got, expected, 1e-4, 1e-5) ? 0 : 1;
    }
    CHECK(wrong == 0);
  }
}
