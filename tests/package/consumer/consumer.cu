// The .cu half of the consumer: a kernel captured with replay::capture and
// replayed through a GraphExec. Compiling it proves that the package gives nvcc
// the include path and C++20 (replay's headers use concepts and
// std::source_location).
#include <cmath>
#include <random>
#include <span>
#include <vector>

#include <replay/replay.hpp>

#include "consumer.hpp"

namespace {

__global__ void axpb_kernel(float* x, int n, float a, float b) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n) {
    x[i] = a * x[i] + b;
  }
}

}  // namespace

int consumer_graph_roundtrip() {
  constexpr int n = 4096;
  constexpr int replays = 3;
  std::mt19937 engine{std::random_device{}()};
  std::uniform_real_distribution<float> dist(-1.0F, 1.0F);
  const float a = dist(engine);
  const float b = dist(engine);
  std::vector<float> input(n);
  for (float& v : input) {
    v = dist(engine);
  }

  replay::Stream stream;
  replay::DeviceBuffer<float> x(static_cast<std::size_t>(n));
  x.copy_from(std::span<const float>(input), stream);
  replay::Graph graph = replay::capture(stream, [&](replay::StreamRef s) {
    axpb_kernel<<<(n + 255) / 256, 256, 0, s.get()>>>(x.data(), n, a, b);
    replay::check_last_launch("axpb_kernel");
  });
  replay::GraphExec exec(graph);
  for (int r = 0; r < replays; ++r) {
    exec.launch(stream);
  }
  std::vector<float> output(n);
  x.copy_to(std::span<float>(output), stream);
  stream.synchronize();

  int wrong = 0;
  for (int i = 0; i < n; ++i) {
    float expected = input[static_cast<std::size_t>(i)];
    for (int r = 0; r < replays; ++r) {
      expected = a * expected + b;
    }
    // The device may fuse a * x + b into one FMA; the host does not.
    const float diff = std::fabs(output[static_cast<std::size_t>(i)] - expected);
    if (!(diff <= 1e-5F * (1.0F + std::fabs(expected)))) {
      ++wrong;
    }
  }
  return wrong;
}
