#pragma once
// Latency measurement shared by the torch_resnet example and the C++ side of
// the torch benchmark, done the way bench/torch_resnet_bench.py does it in
// Python: each iteration is one call followed by a device synchronize, timed
// on the host clock; p50/p99 over the iterations, QPS = items per second of
// the serial loop.
#include <torch/cuda.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace replay_examples {

struct Latency {
  double p50_ms = 0.0;
  double p99_ms = 0.0;
  double mean_ms = 0.0;
  double qps = 0.0;  // items (batch rows) per second
};

inline double percentile(std::vector<double> sorted_ms, double q) {
  if (sorted_ms.empty()) {
    return 0.0;
  }
  std::sort(sorted_ms.begin(), sorted_ms.end());
  const double rank = q * static_cast<double>(sorted_ms.size() - 1);
  const auto lo = static_cast<std::size_t>(rank);
  const std::size_t hi = std::min(lo + 1, sorted_ms.size() - 1);
  const double frac = rank - static_cast<double>(lo);
  return sorted_ms[lo] * (1.0 - frac) + sorted_ms[hi] * frac;
}

// Times `call` (which issues one inference) `iterations` times after `warmup` untimed calls.
template <class Call>
Latency measure(Call&& call, int iterations, int warmup, std::int64_t batch) {
  for (int i = 0; i < warmup; ++i) {
    call();
  }
  torch::cuda::synchronize();
  std::vector<double> ms;
  ms.reserve(static_cast<std::size_t>(iterations));
  for (int i = 0; i < iterations; ++i) {
    const auto start = std::chrono::steady_clock::now();
    call();
    torch::cuda::synchronize();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
  }
  Latency out;
  double total = 0.0;
  for (const double v : ms) {
    total += v;
  }
  out.mean_ms = total / static_cast<double>(ms.size());
  out.p50_ms = percentile(ms, 0.50);
  out.p99_ms = percentile(ms, 0.99);
  out.qps = static_cast<double>(batch) * static_cast<double>(ms.size()) / (total / 1000.0);
  return out;
}

}  // namespace replay_examples
