// replay::launch with an argument that does not convert to the kernel's
// parameter (a const pointer for a non-const one) is refused with a message
// that says so, as add_kernel's is.
// expect-error: launch, add_kernel: a kernel argument does not convert to the kernel's parameter type
#include <replay/launch.hpp>

__global__ void scale(float* data, int n, float factor) {}

void issue(replay::StreamRef stream, const float* data) {
  replay::launch(stream, {1, 32}, scale, data, 4, 2.0f);
}
