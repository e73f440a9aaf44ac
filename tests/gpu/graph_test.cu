// Graph inspection: node counts by type, kernel inventory, DOT output, clone().
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "gpu_suite.hpp"
#include "kernels.cuh"
#include "replay/replay.hpp"

using replay_test::add_kernel;
using replay_test::axpb_kernel;
using replay_test::blocks_for;

namespace {
constexpr int kN = 1024;

struct Pipeline {
  replay::DeviceBuffer<float> x{kN}, y{kN}, out{kN};
  replay::PinnedBuffer<float> host_out{kN};

  void issue(replay::StreamRef s) {
    x.fill(1.0F, s);                                                          // memset nodes
    axpb_kernel<<<blocks_for(kN), 256, 0, s.get()>>>(x.data(), kN, 2.0F, 1.0F);  // kernel
    y.copy_from(x, s);                                                        // memcpy
    add_kernel<<<blocks_for(kN), 256, 0, s.get()>>>(x.data(), y.data(), out.data(), kN);
    replay::check_last_launch();
    host_out.copy_from(out, s);  // memcpy to pinned host
  }
};
}  // namespace

TEST_SUITE("gpu" * replay_test::needs_device()) {
  TEST_CASE("node counts and the kernel inventory show every kernel and copy that was captured") {
    replay::Stream stream;
    Pipeline p;
    auto graph = replay::capture(stream, [&](replay::StreamRef s) { p.issue(s); });
    CHECK(graph.count(replay::NodeType::kernel) == 2);
    CHECK(graph.count(replay::NodeType::memcpy) == 2);
    CHECK(graph.count(replay::NodeType::memset) >= 1);
    CHECK(graph.count(replay::NodeType::host) == 0);
    const auto counts = graph.node_counts();
    std::size_t total = 0;
    for (const auto& [type, n] : counts) {
      total += n;
    }
    CHECK(total == graph.node_count());
    const auto names = graph.kernel_names();
    REQUIRE(names.size() == 2);
    INFO("kernel names: " << names[0] << " | " << names[1]);
    CHECK(std::count_if(names.begin(), names.end(),
                        [](const std::string& n) { return n.find("axpb_kernel") != std::string::npos; }) == 1);
    CHECK(graph.count_kernels("add_kernel") == 1);
    CHECK(graph.count_kernels("no_such_kernel") == 0);
    // And it computes what was captured: (2*1+1) + (2*1+1) = 6.
    replay::GraphExec exec(graph);
    exec.launch(stream);
    stream.synchronize();
    for (int i = 0; i < kN; ++i) {
      REQUIRE(p.host_out[static_cast<std::size_t>(i)] == 6.0F);
    }
  }

  TEST_CASE("write_dot writes a Graphviz file that names the kernels") {
    replay::Stream stream;
    Pipeline p;
    auto graph = replay::capture(stream, [&](replay::StreamRef s) { p.issue(s); });
    const auto path = std::filesystem::temp_directory_path() / "replay_graph_test.dot";
    std::filesystem::remove(path);
    graph.write_dot(path);
    REQUIRE(std::filesystem::exists(path));
    std::ifstream in(path);
    std::stringstream text;
    text << in.rdbuf();
    const std::string dot = text.str();
    CHECK(dot.find("digraph") != std::string::npos);
    CHECK(dot.find("axpb_kernel") != std::string::npos);
    CHECK(dot.find("add_kernel") != std::string::npos);
    std::filesystem::remove(path);
    CHECK_THROWS_AS(graph.write_dot("/nonexistent-dir/x/y.dot"), replay::cuda_error);
    // The failure went into the exception, not into the last-error slot where
    // the next launch check would find it.
    CHECK(cudaPeekAtLastError() == cudaSuccess);
  }

  TEST_CASE("clone() is an independent deep copy") {
    replay::Stream stream;
    replay::DeviceBuffer<float> x(kN);
    replay::DeviceBuffer<float> y(kN);
    replay::DeviceBuffer<float> out(kN);
    auto graph = replay::capture(stream, [&](replay::StreamRef s) {
      axpb_kernel<<<blocks_for(kN), 256, 0, s.get()>>>(x.data(), kN, 2.0F, 1.0F);
      y.copy_from(x, s);
      add_kernel<<<blocks_for(kN), 256, 0, s.get()>>>(x.data(), y.data(), out.data(), kN);
      replay::check_last_launch();
    });
    auto copy = graph.clone();
    CHECK(copy.get() != graph.get());
    CHECK(copy.node_count() == graph.node_count());
    CHECK(copy.kernel_names() == graph.kernel_names());
    graph = replay::Graph();  // destroy the original: the copy must not depend on it
    CHECK_FALSE(graph);
    CHECK_THROWS_AS((void)graph.node_count(), replay::usage_error);
    CHECK(copy.node_count() == 3);
    replay::GraphExec exec(copy);
    for (int rep = 0; rep < 3; ++rep) {
      const auto input = replay_test::random_floats(kN);
      x.copy_from(std::span<const float>(input), stream);
      exec.launch(stream);
      std::vector<float> got(kN, -1.0F);
      out.copy_to(std::span<float>(got), stream);
      stream.synchronize();
      std::vector<float> expected(kN);
      for (std::size_t i = 0; i < expected.size(); ++i) {
        // nvcc contracts 2 * x + 1 into one fused multiply-add; so does the reference.
        const float twice_plus_one = std::fma(2.0F, input[i], 1.0F);
        expected[i] = twice_plus_one + twice_plus_one;
      }
      CHECK(got == expected);  // every element, not a sample
    }
  }

  TEST_CASE("from_native_handle and release transfer ownership") {
    cudaGraph_t raw = nullptr;
    REQUIRE(cudaGraphCreate(&raw, 0) == cudaSuccess);
    auto graph = replay::Graph::from_native_handle(raw);
    CHECK(graph.get() == raw);
    cudaGraph_t back = graph.release();
    CHECK(back == raw);
    CHECK_FALSE(graph);
    CHECK(cudaGraphDestroy(back) == cudaSuccess);
  }
}
