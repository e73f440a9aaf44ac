// Graph inspection: node counts by type, kernel inventory, DOT output, clone().
#include <cuda.h>
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
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

// A kernel loaded and launched through the driver API (cuModuleLoadData,
// cuLaunchKernel), as cuBLAS, NVRTC-compiled code and TorchScript's fuser
// launch theirs: the runtime cannot give such a node's parameters
// (cudaGraphKernelNodeGetParams fails with cudaErrorInvalidDeviceFunction).
constexpr char kDriverFillPtx[] = R"(
.version 7.0
.target sm_75
.address_size 64
.visible .entry replay_test_driver_fill(.param .u64 out, .param .u32 value)
{
  .reg .b32 %r<3>;
  .reg .b64 %rd<4>;
  ld.param.u64 %rd1, [out];
  ld.param.u32 %r1, [value];
  cvta.to.global.u64 %rd2, %rd1;
  mov.u32 %r2, %tid.x;
  mul.wide.u32 %rd3, %r2, 4;
  add.s64 %rd2, %rd2, %rd3;
  st.global.u32 [%rd2], %r1;
  ret;
}
)";

template <class Fn>
Fn driver_function(const char* symbol) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  replay::check(cudaGetDriverEntryPointByVersion(symbol, &fn, 12000, cudaEnableDefault, &found),
                "cudaGetDriverEntryPointByVersion");
  REQUIRE(found == cudaDriverEntryPointSuccess);
  return reinterpret_cast<Fn>(fn);
}

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

  TEST_CASE("the kernel inventory names a kernel launched through the driver API, and leaves no error behind") {
    using ModuleLoadData = CUresult (*)(CUmodule*, const void*);
    using ModuleGetFunction = CUresult (*)(CUfunction*, CUmodule, const char*);
    using ModuleUnload = CUresult (*)(CUmodule);
    using LaunchKernel = CUresult (*)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                                      CUstream, void**, void**);
    replay::Stream stream;  // the runtime's context is current from here on
    CUmodule module = nullptr;
    REQUIRE(driver_function<ModuleLoadData>("cuModuleLoadData")(&module, kDriverFillPtx) == CUDA_SUCCESS);
    CUfunction fill = nullptr;
    REQUIRE(driver_function<ModuleGetFunction>("cuModuleGetFunction")(&fill, module, "replay_test_driver_fill") ==
            CUDA_SUCCESS);
    const auto launch = driver_function<LaunchKernel>("cuLaunchKernel");
    {
      replay::DeviceBuffer<std::uint32_t> out(32);
      replay::DeviceBuffer<float> x(kN);
      CUresult launched = CUDA_ERROR_UNKNOWN;
      auto graph = replay::capture(stream, [&](replay::StreamRef s) {
        auto target = reinterpret_cast<CUdeviceptr>(out.data());
        std::uint32_t value = 7;
        void* args[] = {&target, &value};
        launched = launch(fill, 1, 1, 1, 32, 1, 1, 0, reinterpret_cast<CUstream>(s.get()), args, nullptr);
        axpb_kernel<<<blocks_for(kN), 256, 0, s.get()>>>(x.data(), kN, 2.0F, 1.0F);  // one the runtime launched
        replay::check_last_launch();
      });
      REQUIRE(launched == CUDA_SUCCESS);
      const auto names = graph.kernel_names();
      REQUIRE(names.size() == 2);
      INFO("kernel names: " << names[0] << " | " << names[1]);
      CHECK(graph.count_kernels("replay_test_driver_fill") == 1);
      CHECK(graph.count_kernels("axpb_kernel") == 1);
      const auto path = std::filesystem::temp_directory_path() / "replay_graph_driver_kernel.dot";
      graph.write_dot(path);
      std::ifstream in(path);
      std::stringstream text;
      text << in.rdbuf();
      CHECK(text.str().find("replay_test_driver_fill") != std::string::npos);
      std::filesystem::remove(path);
      // The runtime's failed query of the driver-launched node was replay's to clear.
      CHECK(cudaPeekAtLastError() == cudaSuccess);
      // A node of another type is refused by name, not misread.
      replay::Graph memset_only = replay::capture(stream, [&](replay::StreamRef s) { x.fill(0.0F, s); });
      CHECK_THROWS_AS((void)replay::kernel_node_name(memset_only.nodes().front()), replay::usage_error);
      // And the captured driver launch runs.
      replay::GraphExec exec(graph);
      exec.launch(stream);
      stream.synchronize();
      std::vector<std::uint32_t> host(32);
      replay::check(cudaMemcpy(host.data(), out.data(), sizeof(std::uint32_t) * host.size(), cudaMemcpyDeviceToHost),
                    "cudaMemcpy");
      CHECK(std::all_of(host.begin(), host.end(), [](std::uint32_t v) { return v == 7U; }));
    }
    CHECK(driver_function<ModuleUnload>("cuModuleUnload")(module) == CUDA_SUCCESS);
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
