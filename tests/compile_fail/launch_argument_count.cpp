// replay::launch with fewer arguments than the kernel has parameters is
// refused with a message that says so (host compiler: any function pointer).
// expect-error: launch, add_kernel: the number of kernel arguments differs
#include <replay/launch.hpp>

void scale(float* data, int n, float factor);

void issue(replay::StreamRef stream, float* data) {
  replay::launch(stream, {1, 32}, scale, data, 4);
}
