#pragma once
// Test helpers. GPU tests go in
//   TEST_SUITE("gpu" * replay_test::needs_device()) { ... }
// so that doctest skips them only where there is no GPU or no driver at all
// (see replay::device_count()) and REPLAY_REQUIRE_GPU is not set. A broken
// driver is not skipped: the cases run and fail with the real CUDA error,
// and the test main prints it first.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "replay/device.hpp"

namespace replay_test {

// What the device probe found, once per program.
struct DeviceProbe {
  int count = 0;
  std::string error;  // non-empty: a GPU or driver is there but broken
};

inline const DeviceProbe& device_probe() {
  static const DeviceProbe probe = [] {
    DeviceProbe p;
    try {
      p.count = replay::device_count();
    } catch (const std::exception& e) {
      p.error = e.what();
    }
    return p;
  }();
  return probe;
}

// REPLAY_REQUIRE_GPU=1 (set by scripts/gpu-check.sh, or the CMake option
// REPLAY_REQUIRE_GPU for ctest): a missing GPU fails instead of skipping.
inline bool gpu_required() {
  const char* v = std::getenv("REPLAY_REQUIRE_GPU");
  return v != nullptr && std::string_view(v) != "" && std::string_view(v) != "0";
}

// Skip only when there is truly no GPU or driver, and a GPU is not required.
inline bool skip_gpu_cases() {
  const DeviceProbe& p = device_probe();
  return p.count == 0 && p.error.empty() && !gpu_required();
}

inline auto needs_device() { return doctest::skip(skip_gpu_cases()); }

// Cases that need two GPUs or more go in
//   TEST_SUITE("gpu_multi" * replay_test::needs_devices(2)) { ... }
// skipped on a machine with fewer, in a test program of their own named
// test_<area>_multi: scripts/gpu-check.sh, which counts any skip as a
// failure and gives each lane one GPU, leaves those programs out, and
// scripts/gpu-check.d/nccl.sh runs them with every GPU where two or more exist.
inline auto needs_devices(int count) {
  return doctest::skip(device_probe().error.empty() && device_probe().count < count);
}

// True when scripts/gpu-check.sh runs the program under compute-sanitizer,
// where every kernel launch is instrumented and tens of times slower.
inline bool under_sanitizer() { return std::getenv("REPLAY_UNDER_SANITIZER") != nullptr; }

// A loop count: `n` normally, n/20 (at least `floor`) under the sanitizer, so
// that the sanitizer still sees every code path without running for minutes.
inline int scaled(int n, int floor = 2) { return under_sanitizer() ? std::max(floor, n / 20) : n; }

// The run's seed: REPLAY_TEST_SEED if set, else fresh. The test main prints
// it; each test case reseeds from it and its own name (case_seed()), so
//   REPLAY_TEST_SEED=<seed> ./test_x --test-case='<name>'
// replays exactly the data a failing case saw.
inline std::uint64_t run_seed() {
  static const std::uint64_t seed = [] {
    if (const char* v = std::getenv("REPLAY_TEST_SEED"); v != nullptr && *v != '\0') {
      return static_cast<std::uint64_t>(std::strtoull(v, nullptr, 0));
    }
    return (static_cast<std::uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}();
  }();
  return seed;
}

inline std::uint64_t& current_case_seed() {
  static std::uint64_t seed = run_seed();
  return seed;
}

// The seed of the test case now running (for torch::manual_seed and the like).
inline std::uint64_t case_seed() { return current_case_seed(); }

inline std::mt19937& rng() {
  static std::mt19937 engine{static_cast<std::mt19937::result_type>(run_seed())};
  return engine;
}

// Called by the test main as each case starts: FNV-1a of the name, mixed with the run seed.
inline void reseed_for_case(std::string_view name) {
  std::uint64_t h = 1469598103934665603ULL ^ run_seed();
  for (const char c : name) {
    h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ULL;
  }
  current_case_seed() = h;
  std::seed_seq seq{static_cast<std::uint32_t>(h), static_cast<std::uint32_t>(h >> 32)};
  rng().seed(seq);
}

// A seed for the k-th engine of the case now running (one per thread, say):
// replayable with the run's seed, like the case's own engine.
inline std::mt19937::result_type case_seed_for(std::uint64_t k) {
  const std::uint64_t h = (case_seed() ^ (k * 0x9E3779B97F4A7C15ULL)) * 0xBF58476D1CE4E5B9ULL;
  return static_cast<std::mt19937::result_type>(h >> 32);
}

// Random floats in [-1, 1) from the case's engine: fresh data every run,
// replayable with the run's seed.
inline std::vector<float> random_floats(std::size_t n) {
  std::uniform_real_distribution<float> dist(-1.0F, 1.0F);
  std::vector<float> out(n);
  for (float& x : out) {
    x = dist(rng());
  }
  return out;
}

}  // namespace replay_test
