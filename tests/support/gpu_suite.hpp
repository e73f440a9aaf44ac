#pragma once
// Test helpers. GPU tests go in
//   TEST_SUITE("gpu" * replay_test::needs_device()) { ... }
// so that without a device doctest reports them as skipped.
#include <doctest/doctest.h>

#include <cstddef>
#include <random>
#include <vector>

#include "replay/device.hpp"

namespace replay_test {


inline auto needs_device() { return doctest::skip(!replay::has_device()); }

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
