// StaticBuffer on the device: round trips, fills, fixed addresses, size checks,
// and the allocation rules during capture.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "gpu_suite.hpp"
#include "kernels.cuh"
#include "replay/replay.hpp"

using replay_test::axpb_kernel;
using replay_test::blocks_for;

namespace {
struct Triple {
  float x, y, z;
};
}  // namespace

TEST_SUITE("gpu" * replay_test::needs_device()) {
  TEST_CASE("device round trip through a kernel on fresh random data") {
    replay::Stream stream;
    for (int trial = 0; trial < 5; ++trial) {
      const int n = 1000 + static_cast<int>(replay_test::rng()() % 5000);
      const auto input = replay_test::random_floats(static_cast<std::size_t>(n));
      replay::DeviceBuffer<float> buf(static_cast<std::size_t>(n));
      buf.copy_from(std::span<const float>(input), stream);
      axpb_kernel<<<blocks_for(n), 256, 0, stream.get()>>>(buf.data(), n, 2.0F, 1.0F);
      replay::check_last_launch();
      std::vector<float> out(static_cast<std::size_t>(n), -999.0F);
      buf.copy_to(std::span<float>(out), stream);
      stream.synchronize();
      for (int i = 0; i < n; ++i) {
        REQUIRE(out[static_cast<std::size_t>(i)] == 2.0F * input[static_cast<std::size_t>(i)] + 1.0F);
      }
    }
  }

  TEST_CASE("fill writes every element for 1-, 2-, 4-, 8- and 12-byte patterns") {
    replay::Stream stream;
    const std::size_t n = 4099;  // odd on purpose
    replay::DeviceBuffer<std::uint8_t> bytes(n);
    replay::DeviceBuffer<std::uint16_t> halves(n);
    replay::DeviceBuffer<float> floats(n);
    replay::DeviceBuffer<double> doubles(n);
    replay::DeviceBuffer<Triple> triples(n);
    bytes.fill(0xA7, stream);
    halves.fill(0x1234, stream);
    floats.fill(1.5F, stream);
    doubles.fill(-3.25, stream);
    triples.fill(Triple{1.0F, -2.0F, 3.5F}, stream);
    std::vector<std::uint8_t> b(n);
    std::vector<std::uint16_t> h(n);
    std::vector<float> f(n);
    std::vector<double> d(n);
    std::vector<Triple> t(n);
    bytes.copy_to(std::span<std::uint8_t>(b), stream);
    halves.copy_to(std::span<std::uint16_t>(h), stream);
    floats.copy_to(std::span<float>(f), stream);
    doubles.copy_to(std::span<double>(d), stream);
    triples.copy_to(std::span<Triple>(t), stream);
    stream.synchronize();
    for (std::size_t i = 0; i < n; ++i) {
      REQUIRE(b[i] == 0xA7);
      REQUIRE(h[i] == 0x1234);
      REQUIRE(f[i] == 1.5F);
      REQUIRE(d[i] == -3.25);
      REQUIRE(t[i].x == 1.0F);
      REQUIRE(t[i].y == -2.0F);
      REQUIRE(t[i].z == 3.5F);
    }
    floats.zero(stream);
    floats.copy_to(std::span<float>(f), stream);
    stream.synchronize();
    for (float x : f) {
      REQUIRE(x == 0.0F);
    }
  }

  TEST_CASE("pinned buffers are host-addressable and copy both ways") {
    replay::Stream stream;
    const std::size_t n = 10000;
    replay::PinnedBuffer<float> host(n);
    replay::DeviceBuffer<float> dev(n);
    const auto input = replay_test::random_floats(n);
    for (std::size_t i = 0; i < n; ++i) {
      host[i] = input[i];
    }
    dev.copy_from(host, stream);
    host.fill(0.0F, stream);  // overwrite the pinned side, in stream order
    host.copy_from(dev, stream);
    stream.synchronize();
    for (std::size_t i = 0; i < n; ++i) {
      REQUIRE(host[i] == input[i]);
    }
    unsigned int flags = 0;
    CHECK(cudaHostGetFlags(&flags, host.data()) == cudaSuccess);  // really page-locked
  }

  TEST_CASE("size mismatches are refused with both sizes named") {
    replay::Stream stream;
    replay::DeviceBuffer<float> a(16);
    replay::DeviceBuffer<float> b(17);
    std::vector<float> host(15);
    CHECK_THROWS_WITH_AS(a.copy_from(std::span<const float>(host), stream),
                         doctest::Contains("16 elements but the other side holds 15"), replay::usage_error);
    CHECK_THROWS_AS(a.copy_to(std::span<float>(host), stream), replay::usage_error);
    CHECK_THROWS_AS(a.copy_from(b, stream), replay::usage_error);
    CHECK_NOTHROW(a.copy_from(b.first(16), stream));
    CHECK_NOTHROW(b.subview(1, 15).copy_from(std::span<const float>(host), stream));
    stream.synchronize();
  }

  TEST_CASE("addresses stay fixed across moves, and a captured graph follows the buffer") {
    replay::Stream stream;
    const int n = 2048;
    replay::DeviceBuffer<float> original(static_cast<std::size_t>(n));
    float* const address = original.data();
    auto graph = replay::capture(stream, [&](replay::StreamRef s) {
      axpb_kernel<<<blocks_for(n), 256, 0, s.get()>>>(original.data(), n, 3.0F, 0.5F);
      replay::check_last_launch();
    });
    replay::GraphExec exec(graph);
    replay::DeviceBuffer<float> moved = std::move(original);
    CHECK(moved.data() == address);
    CHECK(original.data() == nullptr);
    CHECK(original.moved_from());
    std::vector<replay::DeviceBuffer<float>> holder;
    holder.push_back(std::move(moved));
    CHECK(holder.front().data() == address);
    const auto input = replay_test::random_floats(static_cast<std::size_t>(n));
    holder.front().copy_from(std::span<const float>(input), stream);
    exec.launch(stream);
    std::vector<float> out(static_cast<std::size_t>(n));
    holder.front().copy_to(std::span<float>(out), stream);
    stream.synchronize();
    for (int i = 0; i < n; ++i) {
      // nvcc contracts a * x + b into one fused multiply-add; so does the reference.
      REQUIRE(out[static_cast<std::size_t>(i)] == std::fma(3.0F, input[static_cast<std::size_t>(i)], 0.5F));
    }
    CHECK_THROWS_AS(original.copy_from(std::span<const float>(input), stream), replay::usage_error);
  }

  TEST_CASE("allocating during capture is refused and the stream stays usable; relaxed mode allows it") {
    replay::Stream stream;
    {
      replay::CaptureScope scope(stream);
      CHECK_THROWS_WITH_AS(replay::DeviceBuffer<float>(64), doctest::Contains("invalidate the capture"),
                           replay::usage_error);
      CHECK_THROWS_AS(replay::PinnedBuffer<float>(64), replay::usage_error);
      auto graph = scope.finish();  // nothing was broken: refusing came before any CUDA call
      CHECK(graph.node_count() == 0);
    }
    {
      replay::CaptureScope scope(stream, replay::CaptureMode::relaxed);
      replay::DeviceBuffer<float> inside(64);
      CHECK(inside.data() != nullptr);
      auto graph = scope.finish();
      CHECK(graph.node_count() == 0);
    }
    CHECK_FALSE(stream.is_capturing());
    // Usable means usable: a fresh allocation, a fill and a read-back on the same stream.
    replay::DeviceBuffer<float> after(64);
    after.fill(2.0F, stream);
    std::vector<float> back(64, -1.0F);
    after.copy_to(std::span<float>(back), stream);
    stream.synchronize();
    CHECK(back == std::vector<float>(64, 2.0F));
  }

  TEST_CASE("a buffer destroyed inside a capture is freed after it, without breaking the stream") {
    // The free waits for the end of the capture (cudaFree there would
    // invalidate it); the graph, which may hold the freed address, is refused.
    replay::Stream stream;
    replay::DeviceBuffer<float> keep(256);
    auto temp = std::make_unique<replay::DeviceBuffer<float>>(256);
    void* const address = temp->data();
    cudaPointerAttributes attributes{};
    REQUIRE(cudaPointerGetAttributes(&attributes, address) == cudaSuccess);
    REQUIRE(attributes.type == cudaMemoryTypeDevice);
    const std::size_t pending_before = replay::detail::deferred_frees().size();
    {
      replay::CaptureScope scope(stream);
      keep.fill(1.0F, stream);
      temp.reset();
      CHECK(replay::detail::deferred_frees().size() == pending_before + 1);
      CHECK_THROWS_AS((void)scope.finish(), replay::usage_error);
    }
    CHECK(stream.ref().capture_status() == replay::CaptureStatus::none);
    CHECK(replay::detail::deferred_frees().size() == pending_before);
    // Freed: the runtime no longer knows the address.
    REQUIRE(cudaPointerGetAttributes(&attributes, address) == cudaSuccess);
    CHECK(attributes.type == cudaMemoryTypeUnregistered);
    // The stream captures again.
    const replay::Graph graph = replay::capture(stream, [&](replay::StreamRef s) { keep.fill(2.0F, s); });
    CHECK(graph.count(replay::NodeType::memset) == 1);
  }

}
