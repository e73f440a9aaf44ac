// GraphExec: replay against eager launches, update in place against
// re-instantiation, flags, upload.
#include <doctest/doctest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "gpu_suite.hpp"
#include "kernels.cuh"
#include "replay/replay.hpp"

using replay_test::axpb_kernel;
using replay_test::blocks_for;

namespace {
constexpr int kN = 8192;

// A chain of `length` dependent kernels with varied coefficients.
void chain(replay::StreamRef s, float* x, int length) {
  for (int k = 0; k < length; ++k) {
    const float a = 1.0F + 0.01F * static_cast<float>(k % 7);
    const float b = 0.5F - 0.1F * static_cast<float>(k % 5);
    axpb_kernel<<<blocks_for(kN), 256, 0, s.get()>>>(x, kN, a, b);
  }
  replay::check_last_launch();
}

std::vector<float> read(const replay::DeviceBuffer<float>& buf, replay::StreamRef s) {
  std::vector<float> out(buf.size(), -12345.0F);
  buf.copy_to(std::span<float>(out), s);
  s.synchronize();
  return out;
}
}  // namespace

TEST_SUITE("gpu" * replay_test::needs_device()) {
  TEST_CASE("graph replay equals eager launches on fresh random data, many replays") {
    replay::Stream stream;
    replay::DeviceBuffer<float> graphed(kN);
    replay::DeviceBuffer<float> eager(kN);
    auto graph = replay::capture(stream, [&](replay::StreamRef s) { chain(s, graphed.data(), 32); });
    CHECK(graph.count(replay::NodeType::kernel) == 32);
    replay::GraphExec exec(graph);
    for (int rep = 0; rep < replay_test::scaled(200); ++rep) {
      const auto input = replay_test::random_floats(kN);
      graphed.copy_from(std::span<const float>(input), stream);
      eager.copy_from(std::span<const float>(input), stream);
      exec.launch(stream);
      chain(stream, eager.data(), 32);
      const auto g = read(graphed, stream);
      const auto e = read(eager, stream);
      REQUIRE(g == e);  // same kernels, same order: bitwise equal
    }
  }

  TEST_CASE("update() changes pointers in place and matches a fresh instantiation") {
    replay::Stream stream;
    replay::DeviceBuffer<float> a(kN);
    replay::DeviceBuffer<float> b(kN);
    replay::DeviceBuffer<float> c(kN);
    auto graph_a = replay::capture(stream, [&](replay::StreamRef s) { chain(s, a.data(), 16); });
    auto graph_b = replay::capture(stream, [&](replay::StreamRef s) { chain(s, b.data(), 16); });
    auto graph_c = replay::capture(stream, [&](replay::StreamRef s) { chain(s, c.data(), 16); });
    replay::GraphExec updated(graph_a);
    const auto result = updated.update(graph_b);
    CHECK(result.in_place());
    CHECK(result.path == replay::UpdatePath::in_place);
    CHECK(result.reason == cudaGraphExecUpdateSuccess);
    replay::GraphExec fresh(graph_c);
    const auto input = replay_test::random_floats(kN);
    a.copy_from(std::span<const float>(input), stream);
    b.copy_from(std::span<const float>(input), stream);
    c.copy_from(std::span<const float>(input), stream);
    updated.launch(stream);  // must write b, not a
    fresh.launch(stream);
    const auto ha = read(a, stream);
    const auto hb = read(b, stream);
    const auto hc = read(c, stream);
    CHECK(ha == input);  // untouched
    CHECK(hb == hc);
    CHECK(hb != input);
  }

  TEST_CASE("update() falls back to re-instantiation when the topology changed, and says why") {
    replay::Stream stream;
    replay::DeviceBuffer<float> x(kN);
    replay::DeviceBuffer<float> ref(kN);
    auto short_graph = replay::capture(stream, [&](replay::StreamRef s) { chain(s, x.data(), 4); });
    auto long_graph = replay::capture(stream, [&](replay::StreamRef s) { chain(s, x.data(), 9); });
    replay::GraphExec exec(short_graph, replay::InstantiateFlags::use_node_priority);
    const cudaGraphExec_t before = exec.get();
    CHECK_THROWS_WITH_AS(exec.update_in_place(long_graph), doctest::Contains("topology changed"),
                         replay::graph_update_error);
    const auto result = exec.update(long_graph);
    CHECK_FALSE(result.in_place());
    CHECK(result.path == replay::UpdatePath::reinstantiated);
    CHECK(result.reason == cudaGraphExecUpdateErrorTopologyChanged);
    CHECK(result.describe().find("topology changed") != std::string::npos);
    CHECK(exec.get() != before);
    CHECK(exec.flags() == replay::InstantiateFlags::use_node_priority);  // kept across re-instantiation
    const auto input = replay_test::random_floats(kN);
    x.copy_from(std::span<const float>(input), stream);
    ref.copy_from(std::span<const float>(input), stream);
    exec.launch(stream);
    chain(stream, ref.data(), 9);
    CHECK(read(x, stream) == read(ref, stream));
  }

  TEST_CASE("graph_update_error names the failing node for a changed kernel") {
    replay::Stream stream;
    replay::DeviceBuffer<float> x(kN);
    replay::DeviceBuffer<float> y(kN);
    auto g1 = replay::capture(stream, [&](replay::StreamRef s) { chain(s, x.data(), 1); });
    auto g2 = replay::capture(stream, [&](replay::StreamRef s) {
      replay_test::add_kernel<<<blocks_for(kN), 256, 0, s.get()>>>(x.data(), y.data(), x.data(), kN);
      replay::check_last_launch();
    });
    replay::GraphExec exec(g1);
    try {
      exec.update_in_place(g2);
      // Some drivers can swap kernel functions in place; then the update is legal.
      MESSAGE("driver updated a changed kernel function in place");
    } catch (const replay::graph_update_error& e) {
      CHECK(e.reason() != cudaGraphExecUpdateSuccess);
      CHECK(e.failed_node().find("kernel node") != std::string::npos);
      CHECK(std::string(e.what()).find("cudaGraphExecUpdate") != std::string::npos);
    }
    const auto result = exec.update(g2);  // either way, update() ends with g2 running
    y.fill(1.0F, stream);
    x.fill(2.0F, stream);
    exec.launch(stream);
    const auto hx = read(x, stream);
    CHECK(hx[0] == 3.0F);
    CHECK(hx[kN - 1] == 3.0F);
    MESSAGE("update path: " << result.describe());
  }

  TEST_CASE("instantiate flags: upload, auto-free, invalid combinations") {
    replay::Stream stream;
    replay::DeviceBuffer<float> x(kN);
    auto graph = replay::capture(stream, [&](replay::StreamRef s) { chain(s, x.data(), 3); });
    const auto flags = replay::InstantiateFlags::upload | replay::InstantiateFlags::use_node_priority;
    replay::GraphExec uploaded(graph, flags, stream);
    CHECK(uploaded.flags() == flags);
    replay::GraphExec plain(graph, replay::InstantiateFlags::auto_free_on_launch);
    // CUDA reports back the flags that shape the executable graph (upload is
    // an instantiate-time action and is never reported).
    unsigned long long raw_flags = 0;
    REQUIRE(cudaGraphExecGetFlags(plain.get(), &raw_flags) == cudaSuccess);
    CHECK((raw_flags & cudaGraphInstantiateFlagAutoFreeOnLaunch) != 0);
    REQUIRE(cudaGraphExecGetFlags(uploaded.get(), &raw_flags) == cudaSuccess);
    CHECK((raw_flags & cudaGraphInstantiateFlagUpload) == 0);
    MESSAGE("cudaGraphExecGetFlags with use_node_priority: " << raw_flags);
    plain.upload(stream);
    plain.launch(stream);
    uploaded.launch(stream);
    stream.synchronize();
    CHECK_THROWS_WITH_AS(
        replay::GraphExec(graph, replay::InstantiateFlags::device_launch | replay::InstantiateFlags::auto_free_on_launch),
        doctest::Contains("device_launch"), replay::usage_error);
    replay::GraphExec moved = std::move(plain);
    CHECK_THROWS_AS(plain.launch(stream), replay::usage_error);
    CHECK_NOTHROW(moved.launch(stream));
    stream.synchronize();
  }

  TEST_CASE("launch never synchronizes: it returns while the graph is still running") {
    replay::Stream stream;
    replay::DeviceBuffer<float> x(kN);
    auto graph = replay::capture(stream, [&](replay::StreamRef s) { chain(s, x.data(), 200); });
    replay::GraphExec exec(graph);
    exec.launch(stream);  // warm
    stream.synchronize();
    for (int i = 0; i < 20; ++i) {
      exec.launch(stream);
    }
    // 4000 dependent kernels cannot have finished by the time launch returns
    // (compute-sanitizer serializes launches, so the check only holds outside it).
    if (!replay_test::under_sanitizer()) {
      CHECK_FALSE(stream.ready());
    }
    stream.synchronize();
    CHECK(stream.ready());
  }
}
