#pragma once
// What the ShapeRouter benchmark programs share (shape_router_hit_bench,
// shape_router_concurrency_bench, shape_router_buckets_bench): the small
// kernels their graphs are made of, and the random request sizes.
#include <benchmark/benchmark.h>

#include "bench_device.hpp"
#include "bench_stats.hpp"

#include <cstddef>
#include <random>
#include <vector>

namespace shape_router_bench {
// Internal linkage: each program that includes this gets its own copy.
namespace {

__global__ void tiny_kernel(float* x, int n, float a) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) {
    x[i] = a * x[i] + 1.0F;
  }
}

inline unsigned blocks(int n) { return static_cast<unsigned>((n + 255) / 256); }

// `count` request sizes drawn uniformly from 1..max, seeded afresh each run.
inline std::vector<int> random_batches(std::size_t count, int max) {
  std::mt19937 rng{std::random_device{}()};
  std::uniform_int_distribution<int> dist(1, max);
  std::vector<int> out(count);
  for (int& b : out) {
    b = dist(rng);
  }
  return out;
}

}  // namespace
}  // namespace shape_router_bench
