// Compiled by nvcc: the package must hand it replay's headers and C++20.
#include <span>

#include <replay/replay.hpp>

namespace {
__global__ void fill_kernel(int* out, int value) { out[threadIdx.x] = value; }
}  // namespace

// Captures one kernel, replays the graph, and returns what it wrote.
int capture_and_replay(int value) {
  replay::Stream stream;
  replay::DeviceBuffer<int> out(32);
  replay::Graph graph = replay::capture(stream, [&](replay::StreamRef s) {
    fill_kernel<<<1, 32, 0, s.get()>>>(out.data(), value);
    replay::check_last_launch("fill_kernel");
  });
  replay::GraphExec exec(graph);
  exec.launch(stream);
  int host[32] = {};
  out.copy_to(std::span<int>(host), stream);
  stream.synchronize();
  for (int x : host) {
    if (x != value) {
      return x;
    }
  }
  return value;
}
