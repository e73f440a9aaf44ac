// kernel_chain: the first replay example. A chain of small kernels, the
// shape of a model's many cheap layers, run eagerly and then captured once and
// replayed as one CUDA Graph. Prints both times and checks the results agree.
//
//   kernel_chain [kernels=1000] [elements=4096] [iterations=20]
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <span>
#include <vector>

#include "replay/replay.hpp"

namespace {

__global__ void step_kernel(float* x, int n, float a, float b) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) {
    x[i] = a * x[i] + b;
  }
}

void run_chain(replay::StreamRef stream, float* x, int n, int kernels) {
  const unsigned blocks = static_cast<unsigned>((n + 255) / 256);
  for (int k = 0; k < kernels; ++k) {
    step_kernel<<<blocks, 256, 0, stream.get()>>>(x, n, k % 2 == 0 ? 1.0001F : 0.9999F, 0.001F);
  }
  replay::check_last_launch("step_kernel launch");
}

double ms_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

int main(int argc, char** argv) {
  const int kernels = argc > 1 ? std::atoi(argv[1]) : 1000;
  const int n = argc > 2 ? std::atoi(argv[2]) : 4096;
  const int iterations = argc > 3 ? std::atoi(argv[3]) : 20;
  if (kernels <= 0 || n <= 0 || iterations <= 0) {
    std::fprintf(stderr, "usage: kernel_chain [kernels>0] [elements>0] [iterations>0]\n");
    return 2;
  }
  if (!replay::has_device()) {
    std::printf("kernel_chain: %s. This example needs an NVIDIA GPU and driver; it built correctly, "
                "but there is nothing to run on.\n",
                replay::no_device_message.data());
    return 0;
  }

  try {
    replay::Stream stream;
    std::vector<float> input(static_cast<std::size_t>(n));
    for (int i = 0; i < n; ++i) {
      input[static_cast<std::size_t>(i)] = std::sin(static_cast<float>(i));
    }
    replay::DeviceBuffer<float> eager_x(static_cast<std::size_t>(n));
    replay::DeviceBuffer<float> graph_x(static_cast<std::size_t>(n));

    // Eager: every kernel pays the host launch cost.
    eager_x.copy_from(std::span<const float>(input), stream);
    run_chain(stream, eager_x.data(), n, kernels);  // warm-up
    stream.synchronize();
    eager_x.copy_from(std::span<const float>(input), stream);
    stream.synchronize();
    auto start = std::chrono::steady_clock::now();
    for (int it = 0; it < iterations; ++it) {
      run_chain(stream, eager_x.data(), n, kernels);
    }
    stream.synchronize();
    const double eager_ms = ms_since(start) / iterations;

    // Graph: capture once, replay with one launch.
    auto graph = replay::capture(stream, [&](replay::StreamRef s) { run_chain(s, graph_x.data(), n, kernels); });
    replay::GraphExec exec(graph, replay::InstantiateFlags::upload, stream);
    graph_x.copy_from(std::span<const float>(input), stream);
    stream.synchronize();
    start = std::chrono::steady_clock::now();
    for (int it = 0; it < iterations; ++it) {
      exec.launch(stream);
    }
    stream.synchronize();
    const double graph_ms = ms_since(start) / iterations;

    std::vector<float> eager_out(static_cast<std::size_t>(n));
    std::vector<float> graph_out(static_cast<std::size_t>(n));
    eager_x.copy_to(std::span<float>(eager_out), stream);
    graph_x.copy_to(std::span<float>(graph_out), stream);
    stream.synchronize();
    const bool equal = eager_out == graph_out;

    std::printf("kernel_chain: %d kernels x %d elements, %d iterations\n", kernels, n, iterations);
    std::printf("  graph holds %zu kernel nodes\n", graph.count(replay::NodeType::kernel));
    std::printf("  eager : %8.3f ms per chain\n", eager_ms);
    std::printf("  replay: %8.3f ms per chain  (%.2fx faster)\n", graph_ms, eager_ms / graph_ms);
    std::printf("  results %s\n", equal ? "equal" : "DIFFER");
    return equal ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kernel_chain: %s\n", e.what());
    return 1;
  }
}
