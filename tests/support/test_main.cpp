// doctest main shared by every test program. GPU test cases live in the
// doctest suite "gpu" (see gpu_suite.hpp), which doctest reports as skipped on a
// machine without a device. When the run was asked for that suite alone
// (--test-suite=gpu) and no device exists, the program exits 77, which ctest
// reports as "Skipped", never as passed. The same for the suite "gpu_multi"
// (cases that need two GPUs or more) on a machine with fewer.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>
#include <string_view>

#include "replay/device.hpp"

int main(int argc, char** argv) {
  doctest::Context context(argc, argv);
  const int status = context.run();
  if (context.shouldExit()) {
    return status;
  }
  bool gpu_suite_only = false;
  bool multi_gpu_suite_only = false;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg(argv[i]);
    gpu_suite_only = gpu_suite_only || arg == "--test-suite=gpu" || arg == "-ts=gpu";
    multi_gpu_suite_only = multi_gpu_suite_only || arg == "--test-suite=gpu_multi" || arg == "-ts=gpu_multi";
  }
  if (status == 0 && gpu_suite_only && !replay::has_device()) {
    std::puts("replay: no CUDA device here, so the gpu suite was skipped (not passed)");
    return 77;
  }
  // The gpu_multi suite needs two devices or more (see gpu_suite.hpp).
  if (status == 0 && multi_gpu_suite_only && replay::device_count() < 2) {
    std::puts("replay: fewer than two CUDA devices here, so the gpu_multi suite was skipped (not passed)");
    return 77;
  }
  return status;
}
