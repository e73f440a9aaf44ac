#pragma once
// Test helpers. GPU tests go in
//   TEST_SUITE("gpu" * replay_test::needs_device()) { ... }
// so that without a device doctest reports them as skipped.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <random>
#include <vector>

#include "replay/device.hpp"

namespace replay_test {


inline auto needs_device() { return doctest::skip(!replay::has_device()); }

// Cases that need two GPUs or more go in
//   TEST_SUITE("gpu_multi" * replay_test::needs_devices(2)) { ... }
// skipped on a machine with fewer, in a test program of their own named
// test_<area>_multi: scripts/gpu-check.sh, which counts any skip as a
// failure and gives each lane one GPU, leaves those programs out, and
// scripts/gpu-check.d/nccl.sh runs them with every GPU where two or more exist.
inline auto needs_devices(int count) { return doctest::skip(replay::device_count() < count); }

// True when scripts/gpu-check.sh runs the program under compute-sanitizer,
// where every kernel launch is instrumented and tens of times slower.
inline bool under_sanitizer() { return std::getenv("REPLAY_UNDER_SANITIZER") != nullptr; }

// A loop count: `n` normally, n/20 (at least `floor`) under the sanitizer, so
// that the sanitizer still sees every code path without running for minutes.
inline int scaled(int n, int floor = 2) { return under_sanitizer() ? std::max(floor, n / 20) : n; }

// Fresh random floats in [-1, 1); a new seed every call so that tests never
// rely on one lucky input.
inline std::vector<float> random_floats(std::size_t n) {
  static std::mt19937 engine{std::random_device{}()};
  std::uniform_real_distribution<float> dist(-1.0F, 1.0F);
  std::vector<float> out(n);
  for (float& x : out) {
    x = dist(engine);
  }
  return out;
}

inline std::mt19937& rng() {
  static std::mt19937 engine{std::random_device{}()};
  return engine;
}

}  // namespace replay_test
