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

  TEST_CASE("graph_update_error names the failing node when a node's type changed") {
    // A kernel node replaced by a memset node: no driver can update that in
    // place, so the refusal and the node it names are checked every time.
    replay::Stream stream;
    replay::DeviceBuffer<float> x(kN);
    auto kernel_graph = replay::capture(stream, [&](replay::StreamRef s) { chain(s, x.data(), 1); });
    auto memset_graph = replay::capture(stream, [&](replay::StreamRef s) {
      replay::check(cudaMemsetAsync(x.data(), 0, kN * sizeof(float), s.get()), "cudaMemsetAsync");
    });
    REQUIRE(kernel_graph.nodes().size() == 1);
    REQUIRE(memset_graph.nodes().size() == 1);
    const std::string kernel_node = replay::describe_node(kernel_graph.nodes()[0]);
    const std::string memset_node = replay::describe_node(memset_graph.nodes()[0]);
    CHECK(kernel_node.find("kernel node") == 0);
    CHECK(kernel_node.find("axpb_kernel") != std::string::npos);
    CHECK(memset_node == "memset node");
    const auto names_a_node = [&](const std::string& failed) {
      return failed.rfind(memset_node, 0) == 0 || failed.rfind(kernel_node, 0) == 0;
    };
    replay::GraphExec exec(kernel_graph);
    bool refused = false;
    try {
      exec.update_in_place(memset_graph);
    } catch (const replay::graph_update_error& e) {
      refused = true;
      CHECK(e.reason() == cudaGraphExecUpdateErrorNodeTypeChanged);
      CAPTURE(e.failed_node());
      CHECK(names_a_node(e.failed_node()));
      CHECK(std::string(e.what()).find("cudaGraphExecUpdate") != std::string::npos);
      CHECK(std::string(e.what()).find(e.failed_node()) != std::string::npos);
    }
    CHECK(refused);
    const auto result = exec.update(memset_graph);
    CHECK(result.path == replay::UpdatePath::reinstantiated);
    CHECK(result.reason == cudaGraphExecUpdateErrorNodeTypeChanged);
    CAPTURE(result.failed_node);
    CHECK(names_a_node(result.failed_node));
    CHECK(result.describe().find(result.failed_node) != std::string::npos);
    const auto input = replay_test::random_floats(kN);
    x.copy_from(std::span<const float>(input), stream);
    exec.launch(stream);  // now the memset
    CHECK(read(x, stream) == std::vector<float>(kN, 0.0F));
  }

  TEST_CASE("update() with a changed kernel function ends with the new kernel running") {
    replay::Stream stream;
    replay::DeviceBuffer<float> x(kN);
    replay::DeviceBuffer<float> y(kN);
    replay::DeviceBuffer<float> out(kN);
    auto g1 = replay::capture(stream, [&](replay::StreamRef s) { chain(s, out.data(), 1); });
    auto g2 = replay::capture(stream, [&](replay::StreamRef s) {
      replay_test::add_kernel<<<blocks_for(kN), 256, 0, s.get()>>>(x.data(), y.data(), out.data(), kN);
      replay::check_last_launch();
    });
    replay::GraphExec exec(g1);
    const auto result = exec.update(g2);  // in place where the driver can swap functions, else re-instantiated
    MESSAGE("update path: " << result.describe());
    if (!result.in_place()) {
      CHECK(result.reason != cudaGraphExecUpdateSuccess);
      CHECK_FALSE(result.failed_node.empty());
    }
    const auto hx = replay_test::random_floats(kN);
    const auto hy = replay_test::random_floats(kN);
    x.copy_from(std::span<const float>(hx), stream);
    y.copy_from(std::span<const float>(hy), stream);
    exec.launch(stream);
    std::vector<float> expected(kN);
    for (int i = 0; i < kN; ++i) {
      expected[static_cast<std::size_t>(i)] = hx[static_cast<std::size_t>(i)] + hy[static_cast<std::size_t>(i)];
    }
    CHECK(read(out, stream) == expected);  // one float add: exact
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
    // Both executables run the captured chain: three launches on x against
    // the same chain run eagerly three times.
    const auto input = replay_test::random_floats(kN);
    replay::DeviceBuffer<float> ref(kN);
    x.copy_from(std::span<const float>(input), stream);
    ref.copy_from(std::span<const float>(input), stream);
    plain.upload(stream);
    plain.launch(stream);
    uploaded.launch(stream);
    CHECK_THROWS_WITH_AS(
        replay::GraphExec(graph, replay::InstantiateFlags::device_launch | replay::InstantiateFlags::auto_free_on_launch),
        doctest::Contains("device_launch"), replay::usage_error);
    replay::GraphExec moved = std::move(plain);
    CHECK_THROWS_AS(plain.launch(stream), replay::usage_error);
    CHECK_NOTHROW(moved.launch(stream));
    for (int i = 0; i < 3; ++i) {
      chain(stream, ref.data(), 3);
    }
    const auto got = read(x, stream);
    CHECK(got == read(ref, stream));
    CHECK(got != input);
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
