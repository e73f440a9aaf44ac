// Errors and their messages; no device needed (cudaGetErrorName/String work without a driver).
#include <doctest/doctest.h>

#include <stdexcept>
#include <string>
#include <type_traits>

#include "replay/device.hpp"
#include "replay/error.hpp"

TEST_SUITE("host") {
  TEST_CASE("cuda_error carries status, API, error name and text, and the source location") {
    const auto here = std::source_location::current();
    const replay::cuda_error err(cudaErrorInvalidValue, "cudaMemcpyAsync", here);
    CHECK(err.status() == cudaErrorInvalidValue);
    CHECK(err.api() == "cudaMemcpyAsync");
    CHECK(std::string(err.error_name()) == "cudaErrorInvalidValue");
    CHECK(std::string(err.error_string()) == cudaGetErrorString(cudaErrorInvalidValue));
    CHECK(err.where().line() == here.line());
    const std::string what = err.what();
    CHECK(what.find("cudaMemcpyAsync failed") != std::string::npos);
    CHECK(what.find("cudaErrorInvalidValue (1)") != std::string::npos);
    CHECK(what.find("errors_test.cpp:" + std::to_string(here.line())) != std::string::npos);
    CHECK_FALSE(err.is_capture_error());
    CHECK(what.find("capture") == std::string::npos);
    static_assert(std::is_base_of_v<std::runtime_error, replay::cuda_error>);
  }

  TEST_CASE("check() throws only on failure and reports the caller's line") {
    CHECK_NOTHROW(replay::check(cudaSuccess, "cudaNothing"));
    const auto line = std::source_location::current().line() + 2;
    try {
      replay::check(cudaErrorMemoryAllocation, "cudaMalloc");
      FAIL("check did not throw");
    } catch (const replay::cuda_error& e) {
      CHECK(e.status() == cudaErrorMemoryAllocation);
      CHECK(e.where().line() == line);
      CHECK(std::string(e.where().file_name()).find("errors_test.cpp") != std::string::npos);
    }
  }

  TEST_CASE("capture errors explain what invalidates a capture") {
    for (cudaError_t status : {cudaErrorStreamCaptureInvalidated, cudaErrorStreamCaptureUnsupported,
                               cudaErrorStreamCaptureImplicit, cudaErrorStreamCaptureUnjoined}) {
      CAPTURE(status);
      const replay::cuda_error err(status, "cudaStreamSynchronize");
      CHECK(err.is_capture_error());
      const std::string what = err.what();
      CHECK(what.find("capture was invalidated") != std::string::npos);
      CHECK(what.find("cudaStreamSynchronize") != std::string::npos);
      CHECK(what.find("cudaMalloc") != std::string::npos);
      CHECK(what.find("legacy default stream") != std::string::npos);
    }
    CHECK_FALSE(replay::is_capture_error(cudaErrorInvalidValue));
    CHECK_FALSE(replay::is_capture_error(cudaSuccess));
  }

  TEST_CASE("cuda_error context is appended") {
    const replay::cuda_error err(cudaErrorInvalidValue, "cudaGraphInstantiate", std::source_location::current(),
                                 "at kernel node foo");
    CHECK(std::string(err.what()).find("; at kernel node foo") != std::string::npos);
  }

  TEST_CASE("usage_error is a logic_error with a location") {
    const auto here = std::source_location::current();
    const replay::usage_error err("StaticBuffer used after move", here);
    static_assert(std::is_base_of_v<std::logic_error, replay::usage_error>);
    const std::string what = err.what();
    CHECK(what.rfind("replay: StaticBuffer used after move at ", 0) == 0);
    CHECK(err.where().line() == here.line());
  }

  TEST_CASE("device_count() never throws and agrees with has_device()") {
    // Without a driver cudaGetDeviceCount fails (35, insufficient driver):
    // that must read as "no device", every time, without throwing.
    const int count = replay::device_count();
    CHECK(count >= 0);
    CHECK(replay::device_count() == count);
    CHECK(replay::has_device() == (count > 0));
    if (count > 0) {
      CHECK(cudaPeekAtLastError() == cudaSuccess);  // with a device, no error is left behind
    }
  }
}
