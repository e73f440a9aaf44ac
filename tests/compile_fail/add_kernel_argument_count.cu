// GraphBuilder::add_kernel with too few arguments for the kernel is refused
// with a message that says the count differs.
// expect-error: add_kernel: the number of kernel arguments differs
#include <replay/graph_builder.hpp>

__global__ void scale(float* data, int n, float factor) {}

void build(replay::GraphBuilder& builder, float* data) {
  builder.add_kernel(scale, replay::LaunchConfig{dim3(1), dim3(32), 0}, {}, data, 4);
}
