// GraphBuilder::add_kernel with an argument that does not convert to the
// kernel's parameter (a const pointer for a non-const one) is refused with a
// message that says so and names the argument.
// expect-error: add_kernel: a kernel argument does not convert to the kernel's parameter type
#include <replay/graph_builder.hpp>

__global__ void scale(float* data, int n, float factor) {}

void build(replay::GraphBuilder& builder, const float* data) {
  builder.add_kernel(scale, dim3(1), dim3(32), 0, {}, data, 4, 2.0f);
}
