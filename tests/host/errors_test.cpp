// Errors and their messages; no device needed (cudaGetErrorName/String work without a driver).
#include <doctest/doctest.h>

#include <memory>
#include <optional>
#include <source_location>
#include <stdexcept>
#include <string>
#include <utility>
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

  TEST_CASE("a capture error whose context names the cause ends there, without the list of likely causes") {
    const replay::cuda_error named(cudaErrorStreamCaptureInvalidated, "cudaStreamEndCapture",
                                   std::source_location::current(), "capture audit: cudaStreamSynchronize at x.cu:7",
                                   replay::CaptureErrorHint::omitted);
    const std::string what = named.what();
    CHECK(named.is_capture_error());
    CHECK(what.find("capture audit: cudaStreamSynchronize at x.cu:7") != std::string::npos);
    CHECK(what.find("likely causes") == std::string::npos);
    CHECK(what.ends_with("x.cu:7"));
    const replay::cuda_error generic(cudaErrorStreamCaptureInvalidated, "cudaStreamEndCapture",
                                     std::source_location::current(), "no cause known");
    CHECK(std::string(generic.what()).find("likely causes") != std::string::npos);
  }

  TEST_CASE("no driver and no GPU are worded plainly; other statuses get no such hint") {
    const replay::cuda_error no_driver(cudaErrorInsufficientDriver, "cudaGetDeviceCount");
    const std::string driver_what = no_driver.what();
    CHECK(driver_what.find("cudaErrorInsufficientDriver (35)") != std::string::npos);
    CHECK(driver_what.find(cudaGetErrorString(cudaErrorInsufficientDriver)) != std::string::npos);
    int driver = 0;
    REQUIRE(cudaDriverGetVersion(&driver) == cudaSuccess);
    MESSAGE("driver version " << driver << ": " << driver_what);
    if (driver == 0) {  // no driver installed: say so, and how the runtime words it
      CHECK(driver_what.find("; no NVIDIA driver (or no GPU) was found; the runtime words this as") !=
            std::string::npos);
    } else {  // a driver: this status means it is older than the runtime
      CHECK(driver_what.find("; the NVIDIA driver supports CUDA up to " + std::to_string(driver / 1000) + ".") !=
            std::string::npos);
      CHECK(driver_what.find("older than this program's CUDA runtime " + std::to_string(CUDART_VERSION / 1000)) !=
            std::string::npos);
    }

    const replay::cuda_error no_device(cudaErrorNoDevice, "cudaSetDevice");
    const std::string device_what = no_device.what();
    CHECK(device_what.find("cudaErrorNoDevice (100)") != std::string::npos);
    CHECK(device_what.find("; no NVIDIA GPU was found, or none is visible to this process") != std::string::npos);
    CHECK(device_what.find("CUDA_VISIBLE_DEVICES") != std::string::npos);
    CHECK(device_what.find("NVIDIA driver") == std::string::npos);

    for (cudaError_t status : {cudaErrorInvalidValue, cudaErrorMemoryAllocation, cudaErrorInvalidDevice,
                               cudaErrorStreamCaptureInvalidated}) {
      CAPTURE(status);
      const std::string what = replay::cuda_error(status, "cudaMalloc").what();
      CHECK(what.find("NVIDIA") == std::string::npos);
      CHECK(what.find("nvidia-smi") == std::string::npos);
    }
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

  TEST_CASE("a location inside the standard library (make_unique, optional::emplace) says how to name the caller's line") {
    // What a replay constructor with a defaulted location gets when the
    // standard library calls it.
    struct Located {
      explicit Located(std::source_location at = std::source_location::current()) : where(at) {}
      std::source_location where;
    };
    const std::string direct = replay::to_string(Located().where);
    CHECK(direct.find("errors_test.cpp:") != std::string::npos);
    CHECK(direct.find("in the standard library") == std::string::npos);
    std::optional<Located> emplaced;
    emplaced.emplace();
    const std::unique_ptr<Located> made = std::make_unique<Located>();
    for (const std::source_location& where : {emplaced->where, made->where}) {
      const std::string text = replay::to_string(where);
      INFO(text);
      CHECK(text.find("(in the standard library, which made the call: pass std::source_location::current() as its "
                      "last argument to name your line)") != std::string::npos);
      CHECK(text.find(where.file_name()) == 0);
    }
    // The usage_error of such a call carries the hint too.
    const std::string what = replay::usage_error("refused", made->where).what();
    CHECK(what.find("in the standard library") != std::string::npos);
    // The paths taken as the standard library's: libstdc++'s, its target
    // headers, libc++'s; not a user's folder that happens to be named bits.
    using replay::detail::is_standard_library_file;
    CHECK(is_standard_library_file("/usr/include/c++/12/bits/stl_construct.h"));
    CHECK(is_standard_library_file("/usr/include/x86_64-linux-gnu/c++/12/bits/c++config.h"));
    CHECK(is_standard_library_file("/usr/lib/llvm-17/include/c++/v1/__memory/construct_at.h"));
    CHECK(is_standard_library_file("/opt/gcc/x86_64-pc-linux-gnu/c++/13.2.0/bits/c++config.h"));
    CHECK_FALSE(is_standard_library_file("/home/me/app/bits/helper.cpp"));
    CHECK_FALSE(is_standard_library_file("/home/me/c++/app/bits/helper.cpp"));
    CHECK_FALSE(is_standard_library_file("/home/me/c++/12/src/bits/helper.cpp"));
    CHECK_FALSE(is_standard_library_file("/home/me/c++//bits/helper.cpp"));
    CHECK_FALSE(is_standard_library_file("/home/me/app/main.cpp"));
  }

  TEST_CASE("device_count() skips only 'no GPU' and 'no driver', anything else throws its real status") {
    // A stand-in for the runtime: what cudaGetDeviceCount and cudaDriverGetVersion return.
    struct FakeQuery {
      cudaError_t status;
      int count;
      int driver;
      int cleared = 0;
      cudaError_t get_device_count(int* n) const {
        *n = count;
        return status;
      }
      int driver_version() const { return driver; }
      void clear_last_error(cudaError_t failed) {
        CHECK(failed == status);
        ++cleared;
      }
    };
    const auto here = std::source_location::current();
    FakeQuery ok{cudaSuccess, 3, 13000};
    CHECK(replay::detail::device_count_with(ok, here) == 3);
    CHECK(ok.cleared == 0);
    FakeQuery no_gpu{cudaErrorNoDevice, 0, 13000};
    CHECK(replay::detail::device_count_with(no_gpu, here) == 0);
    CHECK(no_gpu.cleared == 1);
    FakeQuery no_driver{cudaErrorInsufficientDriver, 0, 0};  // cudaDriverGetVersion: 0 = no driver
    CHECK(replay::detail::device_count_with(no_driver, here) == 0);
    // A driver that is there but older than the runtime, a fabric manager that
    // is down, a stub libcuda: real errors, with their real names.
    const std::pair<cudaError_t, int> broken[] = {{cudaErrorInsufficientDriver, 12020},
                                                  {cudaErrorInsufficientDriver, -1},
                                                  {cudaErrorSystemNotReady, 13000},
                                                  {cudaErrorStubLibrary, 0},
                                                  {cudaErrorUnknown, 13000}};
    for (const auto& [status, driver] : broken) {
      CAPTURE(cudaGetErrorName(status));
      CAPTURE(driver);
      FakeQuery q{status, 0, driver};
      try {
        (void)replay::detail::device_count_with(q, here);
        FAIL_CHECK("no exception");
      } catch (const replay::cuda_error& e) {
        CHECK(e.status() == status);
        CHECK(e.api() == "cudaGetDeviceCount");
        CHECK(e.where().line() == here.line());
        const std::string what = e.what();
        CHECK(what.find(cudaGetErrorName(status)) != std::string::npos);
        CHECK(what.find("not the same as having no GPU") != std::string::npos);
      }
      CHECK(q.cleared == 1);
    }
  }

  TEST_CASE("device_count() on this machine: stable, agrees with has_device(), leaves no error behind") {
    // Here (CI: no driver) this is 0 without throwing; on a GPU machine, the count.
    const int count = replay::device_count();
    CHECK(count >= 0);
    CHECK(replay::device_count() == count);
    CHECK(replay::has_device() == (count > 0));
    if (count > 0) {
      // With a device the runtime initialized, and nothing may be left in the
      // last-error slot. (Without a driver every runtime call, this one too,
      // reports the failed initialization.)
      CHECK(cudaPeekAtLastError() == cudaSuccess);
    }
    int driver = -1;
    CHECK(cudaDriverGetVersion(&driver) == cudaSuccess);
    CHECK((count == 0 || driver > 0));  // a device implies a driver
    if (count == 0) {
      MESSAGE(replay::no_device_message << " (driver version " << driver << ")");
    }
  }
}
