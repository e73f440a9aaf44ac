// CaptureScope: exception safety, the calls that break a capture and the
// errors they give, fork/join across streams, capture modes, capture into a graph.
#include <doctest/doctest.h>

#include <cmath>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "gpu_suite.hpp"
#include "kernels.cuh"
#include "replay/replay.hpp"

using replay_test::add_kernel;
using replay_test::axpb_kernel;
using replay_test::blocks_for;

namespace {
constexpr int kN = 4096;

// Runs x = 2x + 1 eagerly and checks it: proves the stream still works.
void expect_stream_usable(replay::StreamRef stream) {
  REQUIRE_FALSE(stream.is_capturing());
  replay::DeviceBuffer<float> buf(kN);
  const auto input = replay_test::random_floats(kN);
  buf.copy_from(std::span<const float>(input), stream);
  axpb_kernel<<<blocks_for(kN), 256, 0, stream.get()>>>(buf.data(), kN, 2.0F, 1.0F);
  replay::check_last_launch();
  std::vector<float> out(kN);
  buf.copy_to(std::span<float>(out), stream);
  stream.synchronize();
  for (int i = 0; i < kN; ++i) {
    REQUIRE(out[static_cast<std::size_t>(i)] == 2.0F * input[static_cast<std::size_t>(i)] + 1.0F);
  }
  CHECK(cudaPeekAtLastError() == cudaSuccess);
}

void launch_axpb(replay::StreamRef s, float* x, float a, float b) {
  axpb_kernel<<<blocks_for(kN), 256, 0, s.get()>>>(x, kN, a, b);
  replay::check_last_launch();
}
}  // namespace

TEST_SUITE("gpu" * replay_test::needs_device()) {
  TEST_CASE("an exception thrown mid-capture ends the capture and leaves the stream usable") {
    replay::Stream stream;
    replay::DeviceBuffer<float> buf(kN);
    CHECK_THROWS_WITH_AS((void)replay::capture(stream,
                                               [&](replay::StreamRef s) {
                                                 launch_axpb(s, buf.data(), 1.0F, 1.0F);
                                                 throw std::runtime_error("model failed");
                                               }),
                         "model failed", std::runtime_error);
    expect_stream_usable(stream);
    // And the next capture works.
    auto graph = replay::capture(stream, [&](replay::StreamRef s) { launch_axpb(s, buf.data(), 1.0F, 1.0F); });
    CHECK(graph.count(replay::NodeType::kernel) == 1);
  }

  TEST_CASE("a synchronize inside capture: the error names the call and the scope says which call broke it") {
    replay::Stream stream;
    replay::DeviceBuffer<float> buf(kN);
    replay::CaptureScope scope(stream);
    launch_axpb(stream, buf.data(), 1.0F, 0.0F);
    const auto broke_line = std::source_location::current().line() + 2;
    try {
      replay::check(cudaStreamSynchronize(stream.get()), "cudaStreamSynchronize");
      FAIL("synchronize during capture did not fail");
    } catch (const replay::cuda_error& e) {
      CHECK(e.is_capture_error());
      CHECK(std::string(e.what()).find("capture was invalidated") != std::string::npos);
    }
    try {
      (void)scope.finish();
      FAIL("finish() of a broken capture did not throw");
    } catch (const replay::cuda_error& e) {
      const std::string what = e.what();
      CHECK(e.api() == "cudaStreamEndCapture");
      CHECK(e.status() == cudaErrorStreamCaptureInvalidated);
      CHECK(what.find("was broken by cudaStreamSynchronize at") != std::string::npos);
      CHECK(what.find("capture_test.cu:" + std::to_string(broke_line)) != std::string::npos);
      CHECK(what.find("likely causes") != std::string::npos);
    }
    expect_stream_usable(stream);
  }

  TEST_CASE("cudaMalloc inside a thread-local capture gives a capture error") {
    replay::Stream stream;
    void* ptr = nullptr;
    CHECK_THROWS_WITH_AS((void)replay::capture(stream,
                                               [&](replay::StreamRef) {
                                                 replay::check(cudaMalloc(&ptr, 1024), "cudaMalloc");
                                               }),
                         doctest::Contains("capture was invalidated"), replay::cuda_error);
    if (ptr != nullptr) {
      (void)cudaFree(ptr);
    }
    expect_stream_usable(stream);
  }

  TEST_CASE("legacy-stream work next to a blocking capturing stream gives a capture error") {
    replay::Stream stream(replay::StreamFlags::blocking);
    replay::DeviceBuffer<float> buf(kN);
    bool threw = false;
    try {
      (void)replay::capture(
          stream,
          [&](replay::StreamRef s) {
            launch_axpb(s, buf.data(), 1.0F, 0.0F);
            // The legacy stream synchronizes implicitly with blocking streams: illegal during capture.
            replay::check(cudaMemsetAsync(buf.data(), 0, sizeof(float), cudaStreamLegacy), "cudaMemsetAsync");
          },
          replay::CaptureMode::global);
    } catch (const replay::cuda_error& e) {
      threw = true;
      CHECK(e.is_capture_error());
      CHECK(std::string(e.what()).find("legacy default stream") != std::string::npos);
    }
    CHECK(threw);
    expect_stream_usable(stream);
  }

  TEST_CASE("replay's own calls refuse to break a capture, and the capture survives") {
    replay::Stream stream;
    replay::Event event;
    replay::DeviceBuffer<float> buf(kN);
    replay::CaptureScope scope(stream);
    launch_axpb(stream, buf.data(), 1.0F, 0.0F);
    event.record(stream);
    CHECK_THROWS_WITH_AS(stream.synchronize(), doctest::Contains("capturing"), replay::usage_error);
    CHECK_THROWS_AS((void)stream.ready(), replay::usage_error);
    CHECK_THROWS_AS(event.synchronize(), replay::usage_error);
    CHECK_THROWS_AS(replay::synchronize_device(), replay::usage_error);
    auto graph = scope.finish();  // still valid: nothing reached CUDA
    CHECK(graph.count(replay::NodeType::kernel) == 1);
    CHECK_THROWS_AS((void)scope.finish(), replay::usage_error);
  }

  TEST_CASE("capturing the legacy stream, or a stream twice, is refused") {
    CHECK_THROWS_WITH_AS(replay::CaptureScope(cudaStreamLegacy), doctest::Contains("legacy default stream"),
                         replay::usage_error);
    replay::Stream stream;
    replay::CaptureScope outer(stream);
    CHECK_THROWS_WITH_AS(replay::CaptureScope{stream}, doctest::Contains("already capturing"),
                         replay::usage_error);
  }

  TEST_CASE("fork/join capture across two streams replays correctly") {
    replay::Stream main_stream;
    replay::Stream side_stream;
    replay::DeviceBuffer<float> a(kN);
    replay::DeviceBuffer<float> b(kN);
    replay::DeviceBuffer<float> sum(kN);
    auto graph = replay::capture(main_stream, [&](replay::StreamRef s) {
      replay::ScopedFork fork(s, {side_stream.ref()});
      launch_axpb(s, a.data(), 2.0F, 0.0F);            // on the main stream
      launch_axpb(side_stream, b.data(), 3.0F, 1.0F);  // concurrently, on the side stream
      fork.join();
      add_kernel<<<blocks_for(kN), 256, 0, s.get()>>>(a.data(), b.data(), sum.data(), kN);
      replay::check_last_launch();
    });
    CHECK(graph.count(replay::NodeType::kernel) == 3);
    replay::GraphExec exec(graph);
    for (int rep = 0; rep < 10; ++rep) {
      const auto ha = replay_test::random_floats(kN);
      const auto hb = replay_test::random_floats(kN);
      a.copy_from(std::span<const float>(ha), main_stream);
      b.copy_from(std::span<const float>(hb), main_stream);
      exec.launch(main_stream);
      std::vector<float> out(kN);
      sum.copy_to(std::span<float>(out), main_stream);
      main_stream.synchronize();
      for (std::size_t i = 0; i < kN; ++i) {
        REQUIRE(out[i] == 2.0F * ha[i] + std::fma(3.0F, hb[i], 1.0F));  // device fuses a*x+b
      }
    }
  }

  TEST_CASE("an unjoined fork makes finish() fail clearly; ScopedFork joins even on exceptions") {
    replay::Stream main_stream;
    replay::Stream side_stream;
    replay::DeviceBuffer<float> buf(kN);
    {
      replay::CaptureScope scope(main_stream);
      replay::fork(main_stream, {side_stream.ref()});
      launch_axpb(side_stream, buf.data(), 1.0F, 1.0F);
      CHECK_THROWS_WITH_AS((void)scope.finish(), doctest::Contains("cudaStreamEndCapture"), replay::cuda_error);
    }
    CHECK_FALSE(side_stream.is_capturing());
    expect_stream_usable(main_stream);
    expect_stream_usable(side_stream);
    // ScopedFork's destructor joins during unwinding, so the capture ends cleanly.
    CHECK_THROWS_AS((void)replay::capture(main_stream,
                                          [&](replay::StreamRef s) {
                                            replay::ScopedFork fork(s, {side_stream.ref()});
                                            launch_axpb(side_stream, buf.data(), 1.0F, 1.0F);
                                            throw std::runtime_error("mid-fork");
                                          }),
                    std::runtime_error);
    expect_stream_usable(main_stream);
    expect_stream_usable(side_stream);
  }

  TEST_CASE("capture into an existing graph appends to it") {
    replay::Stream stream;
    replay::DeviceBuffer<float> buf(kN);
    auto graph = replay::capture(stream, [&](replay::StreamRef s) { launch_axpb(s, buf.data(), 2.0F, 0.0F); });
    REQUIRE(graph.count(replay::NodeType::kernel) == 1);
    graph = replay::capture_into(std::move(graph), stream,
                                 [&](replay::StreamRef s) { launch_axpb(s, buf.data(), 1.0F, 5.0F); });
    CHECK(graph.count(replay::NodeType::kernel) == 2);
    // Abandoned capture-into: the graph goes with the failed scope, the stream survives.
    CHECK_THROWS_AS((void)replay::capture_into(std::move(graph), stream,
                                               [&](replay::StreamRef) { throw std::runtime_error("x"); }),
                    std::runtime_error);
    expect_stream_usable(stream);
  }

  TEST_CASE("the capture mode is the one asked for: what each mode lets an unsafe call do") {
    // cudaMalloc is a "potentially unsafe" call. On the capturing thread it is
    // refused in global and thread-local mode and allowed in relaxed mode; on
    // another thread it is refused only while a global-mode capture runs.
    // Node counts alone would pass with the mode ignored.
    replay::Stream stream;
    replay::DeviceBuffer<float> buf(kN);
    using replay::CaptureMode;
    for (auto mode : {CaptureMode::global, CaptureMode::relaxed, CaptureMode::this_thread}) {
      CAPTURE(static_cast<int>(mode));
      cudaError_t own = cudaSuccess;
      void* p = nullptr;
      std::size_t kernels = 0;
      try {
        auto graph = replay::capture(
            stream,
            [&](replay::StreamRef s) {
              launch_axpb(s, buf.data(), 1.0F, 1.0F);
              own = cudaMalloc(&p, 256);
              (void)cudaGetLastError();  // the test's own call: leave nothing for replay to find
            },
            mode);
        kernels = graph.count(replay::NodeType::kernel);
      } catch (const replay::cuda_error& e) {
        MESSAGE("capture ended with: " << e.what());
      }
      if (mode == CaptureMode::relaxed) {
        CHECK(own == cudaSuccess);
        CHECK(kernels == 1);
      } else {
        CHECK(replay::is_capture_error(own));
      }
      if (p != nullptr) {
        REQUIRE(cudaFree(p) == cudaSuccess);
      }
      expect_stream_usable(stream);
    }
    for (auto mode : {CaptureMode::global, CaptureMode::this_thread}) {
      CAPTURE(static_cast<int>(mode));
      cudaError_t other = cudaSuccess;
      void* q = nullptr;
      try {
        (void)replay::capture(
            stream,
            [&](replay::StreamRef s) {
              launch_axpb(s, buf.data(), 1.0F, 1.0F);
              std::thread([&] { other = cudaMalloc(&q, 256); }).join();
            },
            mode);
      } catch (const replay::cuda_error& e) {
        MESSAGE("capture ended with: " << e.what());
      }
      if (mode == CaptureMode::global) {
        CHECK(replay::is_capture_error(other));
      } else {
        CHECK(other == cudaSuccess);
      }
      if (q != nullptr) {
        REQUIRE(cudaFree(q) == cudaSuccess);
      }
      expect_stream_usable(stream);
    }
  }

  TEST_CASE("a StaticBuffer destroyed during a capture makes the capture fail instead of returning a dangling graph") {
    // Old code: the buffer was freed when the capture ended and the graph,
    // still holding its address, was returned.
    for (const replay::CaptureMode mode : {replay::CaptureMode::this_thread, replay::CaptureMode::relaxed}) {
      replay::Stream stream;
      auto doomed = std::make_unique<replay::DeviceBuffer<float>>(kN);
      replay::CaptureScope scope(stream, mode);
      launch_axpb(stream, doomed->data(), 2.0F, 1.0F);
      doomed.reset();  // freed only once the capture has ended
      CHECK_THROWS_WITH_AS((void)scope.finish(), doctest::Contains("destroyed while this capture was open"),
                           replay::usage_error);
      CHECK(stream.ref().capture_status() == replay::CaptureStatus::none);
      // The next capture is unaffected.
      replay::DeviceBuffer<float> kept(kN);
      const replay::Graph graph =
          replay::capture(stream, [&](replay::StreamRef s) { launch_axpb(s, kept.data(), 1.0F, 1.0F); }, mode);
      CHECK(graph.count(replay::NodeType::kernel) == 1);
    }
  }
}
