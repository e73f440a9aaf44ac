#pragma once
// Small kernels shared by the GPU tests.
#include <cuda_runtime.h>

namespace replay_test {
// Internal linkage: every test file that includes this gets its own copy.
namespace {

// x[i] = a * x[i] + b
__global__ void axpb_kernel(float* x, int n, float a, float b) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) {
    x[i] = a * x[i] + b;
  }
}

// out[i] = x[i] + y[i]
__global__ void add_kernel(const float* x, const float* y, float* out, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) {
    out[i] = x[i] + y[i];
  }
}

inline unsigned blocks_for(int n, int threads = 256) { return static_cast<unsigned>((n + threads - 1) / threads); }

}  // namespace
}  // namespace replay_test
