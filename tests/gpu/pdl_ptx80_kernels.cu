// Kernels built from compute_80 PTX only (CUDA_ARCHITECTURES 80-virtual,
// tests/pdl.cmake): on a device of compute capability 9.0 or newer the driver
// JIT-compiles them, their cudaFuncAttributes::ptxVersion is 80, and their
// replay::wait_for_prerequisite_grid() is compiled out (__CUDA_ARCH__ 800).
// Declared where used (tests/gpu/pdl_test.cu).
#include "replay/pdl.hpp"

namespace {
__device__ void fill_after_wait(float* out, int n, float value) {
  replay::wait_for_prerequisite_grid();  // nothing at compute_80: the point of these kernels
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n) {
    out[i] = value;
  }
}
}  // namespace

__global__ void fill_from_ptx80(float* out, int n, float value) { fill_after_wait(out, n, value); }

// Used by one case only, so that its first query happens during a capture.
__global__ void fill_from_ptx80_first_in_capture(float* out, int n, float value) { fill_after_wait(out, n, value); }
