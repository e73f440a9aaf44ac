// The per-device capture bookkeeping that keeps replay's device-wide
// synchronization from breaking captures in other threads, on the CPU with
// real threads and a stand-in synchronization (no CUDA call).
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <stdexcept>
#include <thread>
#include <vector>

#include "replay/detail/capture_coordinator.hpp"

namespace {

using replay::detail::CaptureCoordinator;
using replay::detail::CaptureToken;

// Device ordinals no other test in this program uses.
constexpr int kDevice = 7;
constexpr int kOtherDevice = 8;

CaptureCoordinator& coordinator() { return CaptureCoordinator::instance(); }

}  // namespace

TEST_SUITE("host") {
  TEST_CASE("a synchronization never runs while a capture is open on its device, and none begins during it") {
    // Captures from 4 threads begin and end without pause while 2 threads
    // synchronize; every capture checks that no synchronization is running.
    std::atomic<bool> stop{false};
    std::atomic<int> inside_sync{0};
    std::atomic<int> overlaps{0};
    std::atomic<long> captures{0};
    std::vector<std::future<void>> capturers;
    for (int t = 0; t < 4; ++t) {
      capturers.push_back(std::async(std::launch::async, [&] {
        while (!stop.load()) {
          const CaptureToken token(kDevice);
          if (inside_sync.load() != 0) {
            ++overlaps;
          }
          ++captures;
        }
      }));
    }
    std::atomic<int> syncs{0};
    std::vector<std::future<void>> synchronizers;
    for (int t = 0; t < 2; ++t) {
      synchronizers.push_back(std::async(std::launch::async, [&] {
        for (int i = 0; i < 2000; ++i) {
          coordinator().synchronize_with(kDevice, [&] {
            // (open_on may read 1 here for a moment: a capture stepping back.)
            ++inside_sync;
            std::this_thread::yield();
            --inside_sync;
          });
          ++syncs;
        }
      }));
    }
    bool finished = true;
    for (auto& s : synchronizers) {  // a synchronization starved by new captures would hang here
      finished = finished && s.wait_for(std::chrono::seconds(60)) == std::future_status::ready;
    }
    stop = true;
    for (auto& c : capturers) {
      c.get();
    }
    REQUIRE(finished);
    CHECK(syncs == 4000);
    CHECK(captures > 0);
    CHECK(overlaps == 0);
    CHECK(coordinator().open_on(kDevice) == 0);
  }

  TEST_CASE("a nested capture begins while a synchronization waits for the outer one, and other devices go on") {
    auto outer = std::make_unique<CaptureToken>(kDevice);
    std::atomic<bool> synced{false};
    auto sync = std::async(std::launch::async, [&] {
      coordinator().synchronize_with(kDevice, [&] { synced = true; });
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    CHECK_FALSE(synced.load());  // waits for the open capture
    {
      const CaptureToken nested(kDevice);  // would deadlock if it waited for the synchronization
      CHECK(coordinator().open_on(kDevice) == 2);
      const CaptureToken elsewhere(kOtherDevice);  // another device: not held back
      CHECK(coordinator().open_on(kOtherDevice) == 1);
    }
    CHECK_FALSE(synced.load());
    outer.reset();
    REQUIRE(sync.wait_for(std::chrono::seconds(10)) == std::future_status::ready);
    sync.get();
    CHECK(synced.load());
    CHECK(coordinator().open_on(kDevice) == 0);
    CHECK(coordinator().open_on(kOtherDevice) == 0);
  }

  TEST_CASE("a synchronization that throws lets waiting captures begin") {
    std::atomic<bool> in_sync{false};
    std::atomic<bool> release{false};
    auto sync = std::async(std::launch::async, [&] {
      coordinator().synchronize_with(kDevice, [&] {
        in_sync = true;
        while (!release.load()) {
          std::this_thread::yield();
        }
        throw std::runtime_error("device lost");
      });
    });
    while (!in_sync.load()) {
      std::this_thread::yield();
    }
    std::atomic<bool> began{false};
    auto capture = std::async(std::launch::async, [&] {
      const CaptureToken token(kDevice);
      began = true;
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    CHECK_FALSE(began.load());  // held back while the device synchronizes
    release = true;
    CHECK_THROWS_AS(sync.get(), std::runtime_error);
    REQUIRE(capture.wait_for(std::chrono::seconds(10)) == std::future_status::ready);
    CHECK(coordinator().open_on(kDevice) == 0);
  }

  TEST_CASE("synchronizing one device holds up neither another device's synchronization nor its captures") {
    // The first synchronization waits (10 s at most) for the other device's to run.
    std::atomic<bool> other_synced{false};
    std::atomic<bool> other_captured{false};
    std::atomic<bool> seen_during{false};
    auto first = std::async(std::launch::async, [&] {
      coordinator().synchronize_with(kDevice, [&] {
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
        while (!(other_synced.load() && other_captured.load()) && std::chrono::steady_clock::now() < deadline) {
          std::this_thread::yield();
        }
        seen_during = other_synced.load() && other_captured.load();
      });
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    coordinator().synchronize_with(kOtherDevice, [&] { other_synced = true; });
    {
      const CaptureToken token(kOtherDevice);
      other_captured = true;
    }
    first.get();
    CHECK(seen_during.load());  // both happened while the first device synchronized
    CHECK(coordinator().open_on(kDevice) == 0);
  }
}
