// doctest main shared by every test program.
//  - GPU cases (suite "gpu", see gpu_suite.hpp) are skipped only where there is
//    no GPU or no driver at all; a run that then executed no case exits 77,
//    which ctest reports as "Skipped", never as passed.
//  - A run that executed no test case at all (a filter that matches nothing)
//    fails, and so does a case that made no assertion.
//  - Suite "gpu_multi" (cases that need two GPUs or more, in programs named
//    test_<area>_multi) is skipped the same way on a machine with fewer GPUs.
//  - REPLAY_REQUIRE_GPU=1: no GPU is a failure.
//  - The run's seed is printed; each case reseeds from it and its name, and a
//    failing case says how to re-run it with the same data.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "gpu_suite.hpp"

namespace {

struct RunRecord {
  int ran = 0;
  int skipped_gpu = 0;
  int skipped_multi_gpu = 0;
  std::vector<std::string> without_assertions;
  std::string current;
};
RunRecord& record() {
  static RunRecord r;
  return r;
}

struct ReplayListener : doctest::IReporter {
  explicit ReplayListener(const doctest::ContextOptions& /*options*/) {}
  void report_query(const doctest::QueryData& /*data*/) override {}
  void test_run_start() override {
    const replay_test::DeviceProbe& probe = replay_test::device_probe();
    std::printf("[replay_test] seed %llu (re-run with REPLAY_TEST_SEED=%llu)\n",
                static_cast<unsigned long long>(replay_test::run_seed()),
                static_cast<unsigned long long>(replay_test::run_seed()));
    if (!probe.error.empty()) {
      std::printf("[replay_test] the GPU or driver is present but broken, so the gpu cases run and "
                  "fail; the probe said: %s\n",
                  probe.error.c_str());
    } else if (probe.count == 0) {
      std::printf("[replay_test] %s%s\n", replay::no_device_message.data(),
                  replay_test::gpu_required() ? "; REPLAY_REQUIRE_GPU is set, so this run fails"
                                              : ": gpu cases are skipped");
    }
  }
  void test_run_end(const doctest::TestRunStats& /*stats*/) override {}
  void test_case_start(const doctest::TestCaseData& tc) override {
    ++record().ran;
    record().current = tc.m_name;
    replay_test::reseed_for_case(tc.m_name);
  }
  void test_case_reenter(const doctest::TestCaseData& /*tc*/) override {}
  void test_case_end(const doctest::CurrentTestCaseStats& stats) override {
    if (stats.numAssertsCurrentTest == 0 && stats.testCaseSuccess) {
      record().without_assertions.push_back(record().current);
    }
    if (!stats.testCaseSuccess) {
      std::printf("[replay_test] to re-run this case with the same data: REPLAY_TEST_SEED=%llu "
                  "<program> --test-case='%s'\n",
                  static_cast<unsigned long long>(replay_test::run_seed()), record().current.c_str());
    }
  }
  void test_case_exception(const doctest::TestCaseException& /*e*/) override {}
  void subcase_start(const doctest::SubcaseSignature& /*s*/) override {}
  void subcase_end() override {}
  void log_assert(const doctest::AssertData& /*a*/) override {}
  void log_message(const doctest::MessageData& /*m*/) override {}
  void test_case_skipped(const doctest::TestCaseData& tc) override {
    if (tc.m_skip && std::string(tc.m_test_suite) == "gpu") {
      ++record().skipped_gpu;
    }
    if (tc.m_skip && std::string(tc.m_test_suite) == "gpu_multi") {
      ++record().skipped_multi_gpu;
    }
  }
};

}  // namespace

REGISTER_LISTENER("replay", 1, ReplayListener);

int main(int argc, char** argv) {
  doctest::Context context(argc, argv);
  const int status = context.run();
  if (context.shouldExit()) {
    return status;  // --list-test-cases, --count, --help, ...
  }
  const RunRecord& r = record();
  int result = status;
  for (const std::string& name : r.without_assertions) {
    std::printf("[replay_test] FAILED: test case '%s' made no assertion; every case must check something\n",
                name.c_str());
    result = 1;
  }
  if (replay_test::gpu_required() && replay_test::device_probe().count == 0) {
    std::printf("[replay_test] FAILED: REPLAY_REQUIRE_GPU is set but %s%s%s\n",
                replay::no_device_message.data(),
                replay_test::device_probe().error.empty() ? "" : ": ",
                replay_test::device_probe().error.c_str());
    return 1;
  }
  if (result != 0) {
    return result;
  }
  if (r.ran == 0) {
    if (replay_test::skip_gpu_cases() && r.skipped_gpu > 0) {
      std::printf("[replay_test] %s, so the gpu cases were skipped (not passed)\n",
                  replay::no_device_message.data());
      return 77;
    }
    if (r.skipped_multi_gpu > 0 && replay_test::device_probe().error.empty() &&
        replay_test::device_probe().count < 2) {
      std::printf("[replay_test] fewer than two CUDA devices here, so the gpu_multi cases were "
                  "skipped (not passed)\n");
      return 77;
    }
    std::printf("[replay_test] FAILED: no test case ran (does the filter match a test name?)\n");
    return 1;
  }
  return 0;
}
