// Programmatic dependent launch: replay::launch with attributes, captured into
// programmatic edges; GraphBuilder's programmatic edges; edge inspection and
// DOT; updates that keep the edges; a chain whose kernels read their
// predecessor's output only after the wait, against eager over many replays;
// and the refusals, of kernels compiled from PTX older than 9.0 too (their
// wait compiled out), with the capability queries, from many threads; and
// programmatic launches where supported, which launch such kernels plainly.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstddef>
#include <exception>
#include <string>
#include <thread>
#include <vector>

#include "gpu_suite.hpp"
#include "replay/replay.hpp"
#include "usage_message.hpp"

// Built from compute_80 PTX only (pdl_ptx80_kernels.cu): JIT-compiled on a 9.0
// device, their waits compiled out.
__global__ void fill_from_ptx80(float* out, int n, float value);
__global__ void fill_from_ptx80_first_in_capture(float* out, int n, float value);

namespace {

constexpr int kStages = 8;
constexpr int kThreads = 256;

// out[i] = in[(i + shift) % n] * weights[i] + step. The weights are no
// kernel's output, so they are read before the wait; `in` is the previous
// stage's output, read after it, from another block's part (shift).
__global__ void stage_kernel(const float* weights, const float* in, float* out, int n, int shift, float step) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  const float w = i < n ? weights[i] : 0.0F;
  replay::wait_for_prerequisite_grid();
  replay::release_dependent_grids();
  if (i < n) {
    out[i] = in[(i + shift) % n] * w + step;
  }
}

__global__ void fill_kernel(float* out, int n, float value) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n) {
    out[i] = value;
  }
}

int blocks_for(int n) { return (n + kThreads - 1) / kThreads; }

using replay_test::contains;
using replay_test::usage_message;

int current_device() {
  int device = 0;
  replay::check(cudaGetDevice(&device), "cudaGetDevice");
  return device;
}

std::vector<float> read_back(const replay::DeviceBuffer<float>& buffer, replay::StreamRef s) {
  std::vector<float> out(buffer.size(), -1.0F);
  buffer.copy_to(std::span<float>(out), s);
  s.synchronize();
  return out;
}

bool device_has_pdl() {
  int major = 0;
  replay::check(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, current_device()),
                "cudaDeviceGetAttribute");
  return major >= 9;
}

// A chain of kStages stage kernels over buffers[0] (input) .. buffers[kStages] (output).
struct Chain {
  explicit Chain(int elements) : n(elements), weights(static_cast<std::size_t>(elements)) {
    for (int b = 0; b <= kStages; ++b) {
      buffers.emplace_back(static_cast<std::size_t>(elements));
    }
  }
  int n;
  replay::DeviceBuffer<float> weights;
  std::vector<replay::DeviceBuffer<float>> buffers;

  float step(int stage, float base) const { return base + 0.25F * static_cast<float>(stage); }
  int shift(int stage) const { return (stage * 97 + 31) % n; }

  // Eager: plain <<<>>> launches, no attribute.
  void eager(replay::StreamRef s, float base) {
    for (int k = 0; k < kStages; ++k) {
      stage_kernel<<<blocks_for(n), kThreads, 0, s.get()>>>(weights.data(), buffers[k].data(), buffers[k + 1].data(),
                                                            n, shift(k), step(k, base));
    }
    replay::check_last_launch();
  }
  // Through replay::launch, with or without programmatic serialization.
  void launched(replay::StreamRef s, float base, const replay::LaunchAttributes& attributes) {
    const replay::LaunchConfig config{dim3(blocks_for(n)), dim3(kThreads), 0};
    for (int k = 0; k < kStages; ++k) {
      replay::launch(s, {config, attributes}, stage_kernel, weights.data(), buffers[k].data(), buffers[k + 1].data(),
                     n, shift(k), step(k, base));
    }
  }
  // Built: kernel nodes joined by plain edges, by programmatic edges added
  // after each node (add_programmatic_dependency), or by Deps::programmatic.
  enum class Edges { plain, programmatic, programmatic_deps };
  std::vector<replay::KernelNode<const float*, const float*, float*, int, int, float>> build(replay::Graph& graph,
                                                                                              float base,
                                                                                              Edges edges) {
    const bool programmatic = edges == Edges::programmatic;
    replay::GraphBuilder builder(graph);
    std::vector<replay::KernelNode<const float*, const float*, float*, int, int, float>> nodes;
    for (int k = 0; k < kStages; ++k) {
      const replay::Deps deps = (programmatic || k == 0)          ? replay::Deps{}
                                : edges == Edges::programmatic_deps ? replay::Deps::programmatic(nodes.back())
                                                                    : replay::Deps{nodes.back()};
      nodes.push_back(builder.add_kernel(stage_kernel, dim3(blocks_for(n)), dim3(kThreads), 0, deps,
                                         weights.data(), buffers[k].data(), buffers[k + 1].data(), n, shift(k),
                                         step(k, base)));
      if (programmatic && k > 0) {
        builder.add_programmatic_dependency(nodes[nodes.size() - 2], nodes.back());
      }
    }
    return nodes;
  }

  void load(const std::vector<float>& input, const std::vector<float>& w, replay::StreamRef s) {
    buffers[0].copy_from(std::span<const float>(input), s);
    weights.copy_from(std::span<const float>(w), s);
  }
  // Every stage's output set to a value no stage computes, so that a stage
  // reading its input before the previous stage wrote it is seen.
  void poison(replay::StreamRef s) {
    for (int b = 1; b <= kStages; ++b) {
      buffers[b].fill(-3.0e30F, s);
    }
  }
  std::vector<float> output(replay::StreamRef s) const {
    std::vector<float> out(static_cast<std::size_t>(n), -1.0F);
    buffers[kStages].copy_to(std::span<float>(out), s);
    s.synchronize();
    return out;
  }
};

// The eager chain's output for `input`.
std::vector<float> eager_output(Chain& chain, replay::StreamRef s, float base) {
  chain.eager(s, base);
  return chain.output(s);
}

}  // namespace

TEST_SUITE("gpu" * replay_test::needs_device()) {
  TEST_CASE("two programmatic launches captured make one programmatic edge") {
    if (!device_has_pdl()) {
      replay::Stream s;
      replay::DeviceBuffer<float> x(16);
      CHECK_THROWS_AS(replay::launch(s, {{dim3(1), dim3(16)}, replay::LaunchAttributes::programmatic()}, fill_kernel,
                                     x.data(), 16, 1.0F),
                      replay::usage_error);
      return;
    }
    replay::Stream s;
    replay::DeviceBuffer<float> x(64);
    replay::DeviceBuffer<float> y(64);
    const auto pdl = replay::LaunchAttributes::programmatic();
    replay::Graph graph = replay::capture(s, [&](replay::StreamRef c) {
      replay::launch(c, {dim3(1), dim3(64), 0, pdl}, fill_kernel, x.data(), 64, 2.0F);
      replay::launch(c, {dim3(1), dim3(64), 0, pdl}, fill_kernel, y.data(), 64, 3.0F);
    });
    const std::vector<replay::GraphEdge> edges = graph.edges();
    REQUIRE(edges.size() == 1);
    CHECK(edges[0].kind == replay::EdgeKind::programmatic);
    CHECK(edges[0].from != edges[0].to);
    CHECK(replay::describe_node(edges[0].from).find("fill_kernel") != std::string::npos);
    CHECK(graph.count_edges(replay::EdgeKind::programmatic) == 1);
    const std::string dot = graph.to_dot();
    CHECK(dot.find("style=dashed") != std::string::npos);
    CHECK(dot.find("programmatic") != std::string::npos);

    // Without the attribute the same capture has a plain edge.
    replay::Graph plain = replay::capture(s, [&](replay::StreamRef c) {
      replay::launch(c, {dim3(1), dim3(64)}, fill_kernel, x.data(), 64, 2.0F);
      replay::launch(c, {dim3(1), dim3(64)}, fill_kernel, y.data(), 64, 3.0F);
    });
    REQUIRE(plain.edges().size() == 1);
    CHECK(plain.edges()[0].kind == replay::EdgeKind::plain);
    CHECK(plain.to_dot().find("dashed") == std::string::npos);
  }

  TEST_CASE("programmatic chains captured and built give the eager results") {
    if (!device_has_pdl()) {
      CHECK_FALSE(device_has_pdl());  // the programmatic forms are refused there (the refusal case checks it)
      return;
    }
    const int n = 3 * kThreads + 17;
    replay::Stream s;
    Chain chain(n);
    chain.load(replay_test::random_floats(static_cast<std::size_t>(n)),
               replay_test::random_floats(static_cast<std::size_t>(n)), s);
    const std::vector<float> want = eager_output(chain, s, 1.0F);

    const auto run = [&](replay::Graph& graph) {
      chain.poison(s);
      replay::GraphExec exec(graph);
      exec.launch(s);
      return chain.output(s);
    };
    replay::Graph captured_plain =
        replay::capture(s, [&](replay::StreamRef c) { chain.launched(c, 1.0F, replay::LaunchAttributes{}); });
    replay::Graph captured_pdl = replay::capture(
        s, [&](replay::StreamRef c) { chain.launched(c, 1.0F, replay::LaunchAttributes::programmatic()); });
    replay::Graph captured_where_supported = replay::capture(s, [&](replay::StreamRef c) {
      chain.launched(c, 1.0F, replay::LaunchAttributes::programmatic_where_supported());
    });
    replay::Graph built_plain = replay::make_graph();
    (void)chain.build(built_plain, 1.0F, Chain::Edges::plain);
    replay::Graph built_pdl = replay::make_graph();
    (void)chain.build(built_pdl, 1.0F, Chain::Edges::programmatic);
    replay::Graph built_pdl_deps = replay::make_graph();
    (void)chain.build(built_pdl_deps, 1.0F, Chain::Edges::programmatic_deps);

    CHECK(captured_plain.count_edges(replay::EdgeKind::programmatic) == 0);
    CHECK(captured_pdl.count_edges(replay::EdgeKind::programmatic) == kStages - 1);
    CHECK(captured_pdl.count_edges(replay::EdgeKind::plain) == 0);
    CHECK(captured_where_supported.count_edges(replay::EdgeKind::programmatic) == kStages - 1);
    CHECK(captured_where_supported.count_edges(replay::EdgeKind::plain) == 0);
    CHECK(built_plain.count_edges(replay::EdgeKind::plain) == kStages - 1);
    CHECK(built_pdl.count_edges(replay::EdgeKind::programmatic) == kStages - 1);
    CHECK(built_pdl.edges().size() == static_cast<std::size_t>(kStages - 1));
    CHECK(built_pdl_deps.count_edges(replay::EdgeKind::programmatic) == kStages - 1);
    CHECK(built_pdl_deps.edges().size() == static_cast<std::size_t>(kStages - 1));

    CHECK(run(captured_plain) == want);
    CHECK(run(captured_pdl) == want);
    CHECK(run(captured_where_supported) == want);
    CHECK(run(built_plain) == want);
    CHECK(run(built_pdl) == want);
    CHECK(run(built_pdl_deps) == want);
  }

  TEST_CASE("a launch-completion edge is built, listed and drawn") {
    if (!device_has_pdl()) {
      CHECK_FALSE(device_has_pdl());
      return;
    }
    replay::DeviceBuffer<float> x(32);
    replay::DeviceBuffer<float> y(32);
    replay::Graph graph = replay::make_graph();
    replay::GraphBuilder builder(graph);
    auto first = builder.add_kernel(fill_kernel, dim3(1), dim3(32), 0, {}, x.data(), 32, 1.0F);
    auto second = builder.add_kernel(fill_kernel, dim3(1), dim3(32), 0, {}, y.data(), 32, 2.0F);
    builder.add_programmatic_dependency(first, second, replay::EdgeKind::launch_completion);
    const auto edges = builder.edges();
    REQUIRE(edges.size() == 1);
    CHECK(edges[0].kind == replay::EdgeKind::launch_completion);
    CHECK(edges[0].from == first.get());
    CHECK(edges[0].to == second.get());
    CHECK(builder.to_dot().find("launch completion") != std::string::npos);
    replay::Stream s;
    replay::GraphExec exec(graph);
    exec.launch(s);
    std::vector<float> out(32);
    y.copy_to(std::span<float>(out), s);
    s.synchronize();
    CHECK(out == std::vector<float>(32, 2.0F));
  }

  TEST_CASE("an exec update keeps the programmatic edges") {
    if (!device_has_pdl()) {
      CHECK_FALSE(device_has_pdl());
      return;
    }
    const int n = 2 * kThreads;
    replay::Stream s;
    Chain chain(n);
    chain.load(replay_test::random_floats(static_cast<std::size_t>(n)),
               replay_test::random_floats(static_cast<std::size_t>(n)), s);

    replay::Graph first = replay::make_graph();
    auto nodes = chain.build(first, 1.0F, Chain::Edges::programmatic);
    replay::GraphExec exec(first);

    // The same topology, programmatic edges and all, with other steps: in place.
    replay::Graph second = replay::make_graph();
    (void)chain.build(second, 5.0F, Chain::Edges::programmatic_deps);
    const replay::UpdateResult result = exec.update(second);
    CHECK(result.in_place());
    CHECK(second.count_edges(replay::EdgeKind::programmatic) == kStages - 1);
    chain.poison(s);
    exec.launch(s);
    const std::vector<float> updated = chain.output(s);
    CHECK(updated == eager_output(chain, s, 5.0F));

    // Captured programmatic chains update one another in place too.
    replay::Graph captured_a = replay::capture(
        s, [&](replay::StreamRef c) { chain.launched(c, 2.0F, replay::LaunchAttributes::programmatic()); });
    replay::Graph captured_b = replay::capture(
        s, [&](replay::StreamRef c) { chain.launched(c, 3.0F, replay::LaunchAttributes::programmatic()); });
    replay::GraphExec captured_exec(captured_a);
    CHECK(captured_exec.update(captured_b).in_place());
    chain.poison(s);
    captured_exec.launch(s);
    const std::vector<float> captured_updated = chain.output(s);
    CHECK(captured_updated == eager_output(chain, s, 3.0F));

    // A node's arguments set in place on the executable graph keep the edges working.
    for (int k = 0; k < kStages; ++k) {
      nodes[static_cast<std::size_t>(k)].set_args(exec, chain.weights.data(), chain.buffers[k].data(),
                                                  chain.buffers[k + 1].data(), n, chain.shift(k),
                                                  chain.step(k, 9.0F));
    }
    chain.poison(s);
    exec.launch(s);
    const std::vector<float> set = chain.output(s);
    CHECK(set == eager_output(chain, s, 9.0F));
  }

  TEST_CASE("kernels reading their predecessor's output after the wait match eager over many replays") {
    if (!device_has_pdl()) {
      CHECK_FALSE(device_has_pdl());
      return;
    }
    const int n = 64 * kThreads;
    const int replays = replay_test::scaled(200, 4);
    replay::Stream s;
    Chain chain(n);
    chain.load(replay_test::random_floats(static_cast<std::size_t>(n)),
               replay_test::random_floats(static_cast<std::size_t>(n)), s);
    replay::Graph captured = replay::capture(
        s, [&](replay::StreamRef c) { chain.launched(c, 0.5F, replay::LaunchAttributes::programmatic()); });
    replay::Graph built = replay::make_graph();
    (void)chain.build(built, 0.5F, Chain::Edges::programmatic);
    replay::GraphExec captured_exec(captured);
    replay::GraphExec built_exec(built);
    int mismatches = 0;
    for (int r = 0; r < replays; ++r) {
      // New input each replay, in stream order before the graph.
      const std::vector<float> input = replay_test::random_floats(static_cast<std::size_t>(n));
      chain.buffers[0].copy_from(std::span<const float>(input), s);
      const std::vector<float> want = eager_output(chain, s, 0.5F);
      chain.poison(s);
      (r % 2 == 0 ? captured_exec : built_exec).launch(s);
      mismatches += chain.output(s) == want ? 0 : 1;
    }
    CHECK(mismatches == 0);
  }

  TEST_CASE("programmatic edges and attributes are refused where they cannot work") {
    replay::Stream s;
    replay::DeviceBuffer<float> x(32);
    replay::Graph graph = replay::make_graph();
    replay::GraphBuilder builder(graph);
    auto kernel = builder.add_kernel(fill_kernel, dim3(1), dim3(32), 0, {}, x.data(), 32, 1.0F);
    auto other = builder.add_kernel(fill_kernel, dim3(1), dim3(32), 0, {}, x.data(), 32, 2.0F);
    auto memset = builder.add_fill(std::span<float>(x.data(), 32), 0.0F, {});
    auto empty = builder.add_empty();
    // Not kernel nodes: refused whatever the device.
    CHECK(contains(usage_message([&] { builder.add_programmatic_dependency(memset, kernel); }),
                   "upstream node (memset node)"));
    CHECK(contains(usage_message([&] { builder.add_programmatic_dependency(kernel, empty); }),
                   "downstream node (empty node)"));
    CHECK(contains(usage_message([&] { builder.add_programmatic_dependency(kernel, other, replay::EdgeKind::plain); }),
                   "add_dependency"));
    CHECK(contains(usage_message([&] { builder.add_programmatic_dependency(replay::Node{}, other); }),
                   "empty node handle"));
    // Deps::programmatic: only from kernel nodes, only to a kernel node.
    const std::size_t nodes_before = builder.node_count();
    CHECK(contains(usage_message([&] {
                     (void)builder.add_kernel(fill_kernel, dim3(1), dim3(32), 0, replay::Deps::programmatic(memset),
                                              x.data(), 32, 3.0F);
                   }),
                   "upstream node (memset node)"));
    CHECK(builder.node_count() == nodes_before);  // refused before the node was added
    CHECK(contains(usage_message([&] {
                     (void)builder.add_fill(std::span<float>(x.data(), 32), 1.0F, replay::Deps::programmatic(kernel));
                   }),
                   "lead only to a kernel node"));
    CHECK(contains(usage_message([&] {
                     (void)builder.capture(s, [](replay::StreamRef) {}, replay::Deps::programmatic(kernel));
                   }),
                   "lead only to a kernel node"));
    CHECK(builder.edges().empty());  // nothing was added
    // A cluster that does not divide the grid, before CUDA sees it.
    CHECK(contains(usage_message([&] {
                     replay::launch(s, {dim3(3), dim3(32), 0, replay::LaunchAttributes{}.with_cluster_dims(dim3(2))},
                                    fill_kernel, x.data(), 32, 1.0F);
                   }),
                   "whole number of clusters"));
    // The device's compute capability decides the rest.
    const auto pdl_launch = [&] {
      replay::launch(s, {dim3(1), dim3(32), 0, replay::LaunchAttributes::programmatic()}, fill_kernel, x.data(), 32,
                     1.0F);
    };
    if (device_has_pdl()) {
      CHECK_NOTHROW(pdl_launch());
      CHECK_NOTHROW(builder.add_programmatic_dependency(kernel, other));
      CHECK(builder.edges().size() == 1);
    } else {
      CHECK(contains(usage_message(pdl_launch), "compute capability 9.0"));
      CHECK(contains(usage_message([&] { builder.add_programmatic_dependency(kernel, other); }),
                     "compute capability 9.0"));
    }
    s.synchronize();
  }

  TEST_CASE("launch with a priority, with clusters and with no attributes runs the kernel") {
    replay::Stream s;
    replay::DeviceBuffer<float> x(100);
    replay::launch(s, {dim3(1), dim3(128), 0, replay::LaunchAttributes{}.with_priority(-1)}, fill_kernel, x.data(),
                   100, 4.0F);
    std::vector<float> out(100);
    x.copy_to(std::span<float>(out), s);
    s.synchronize();
    CHECK(out == std::vector<float>(100, 4.0F));
    replay::launch(s, {1, 128}, fill_kernel, x.data(), 100, 6.0F);
    x.copy_to(std::span<float>(out), s);
    s.synchronize();
    CHECK(out == std::vector<float>(100, 6.0F));
    if (device_has_pdl()) {  // clusters of 2 blocks over a grid of 4
      replay::launch(s, {dim3(4), dim3(32), 0, replay::LaunchAttributes{}.with_cluster_dims(dim3(2))}, fill_kernel,
                     x.data(), 100, 8.0F);
      x.copy_to(std::span<float>(out), s);
      s.synchronize();
      CHECK(out == std::vector<float>(100, 8.0F));
    }
  }

  TEST_CASE("a kernel compiled from PTX older than 9.0 is refused a programmatic launch and runs plainly") {
    const bool pdl = device_has_pdl();
    CHECK(replay::programmatic_launch_supported() == pdl);
    CHECK(replay::programmatic_launch_supported(current_device()) == pdl);
    CHECK(replay::programmatic_launch_supported(fill_kernel) == pdl);
    CHECK_FALSE(replay::programmatic_launch_supported(fill_from_ptx80));
    cudaFuncAttributes attributes{};
    replay::check(cudaFuncGetAttributes(&attributes, fill_from_ptx80), "cudaFuncGetAttributes");
    CHECK(attributes.ptxVersion == 80);  // what the test is about: the build gave it compute_80 PTX only

    replay::Stream s;
    replay::DeviceBuffer<float> x(40);
    const std::string refused = usage_message([&] {
      replay::launch(s, {dim3(1), dim3(64), 0, replay::LaunchAttributes::programmatic()}, fill_from_ptx80, x.data(),
                     40, 3.0F);
    });
    if (pdl) {
      CHECK(contains(refused, "launch: programmatic stream serialization needs the kernel's code compiled"));
      CHECK(contains(refused, "from PTX 8.0 (compute_80)"));
      CHECK(contains(refused, "would not wait for its predecessor"));
    } else {
      CHECK(contains(refused, "compute capability 9.0"));  // the device is refused first
    }
    CHECK(cudaPeekAtLastError() == cudaSuccess);  // the refusal left no error behind
    x.fill(0.0F, s);
    replay::launch(s, {dim3(1), dim3(64)}, fill_from_ptx80, x.data(), 40, 7.0F);
    CHECK(read_back(x, s) == std::vector<float>(40, 7.0F));
    if (pdl) {  // the sm_90 kernel is still launched programmatically
      replay::launch(s, {dim3(1), dim3(64), 0, replay::LaunchAttributes::programmatic()}, fill_kernel, x.data(), 40,
                     9.0F);
      CHECK(read_back(x, s) == std::vector<float>(40, 9.0F));
    }
  }

  TEST_CASE("programmatic where supported launches 9.0 kernels programmatically and older PTX plainly, never refused") {
    const bool pdl = device_has_pdl();
    replay::Stream s;
    replay::DeviceBuffer<float> x(64);
    replay::DeviceBuffer<float> y(64);
    const auto where_supported = replay::LaunchAttributes::programmatic_where_supported();
    // Two 9.0 kernels: a programmatic edge where the device takes it, a plain one elsewhere.
    replay::Graph both = replay::capture(s, [&](replay::StreamRef c) {
      replay::launch(c, {dim3(1), dim3(64), 0, where_supported}, fill_kernel, x.data(), 64, 2.0F);
      replay::launch(c, {dim3(1), dim3(64), 0, where_supported}, fill_kernel, y.data(), 64, 3.0F);
    });
    REQUIRE(both.edges().size() == 1);
    CHECK(both.edges()[0].kind == (pdl ? replay::EdgeKind::programmatic : replay::EdgeKind::plain));
    // Into a kernel compiled from PTX 8.0 (its wait compiled out): launched
    // plainly, so the edge into it is plain; the capture stays valid.
    replay::Graph into_old = replay::capture(s, [&](replay::StreamRef c) {
      replay::launch(c, {dim3(1), dim3(64), 0, where_supported}, fill_kernel, x.data(), 64, 4.0F);
      replay::launch(c, {dim3(1), dim3(64), 0, where_supported}, fill_from_ptx80, y.data(), 64, 5.0F);
    });
    REQUIRE(into_old.edges().size() == 1);
    CHECK(into_old.edges()[0].kind == replay::EdgeKind::plain);
    // Out of it into a 9.0 kernel: that one is launched programmatically where the device takes it.
    replay::Graph out_of_old = replay::capture(s, [&](replay::StreamRef c) {
      replay::launch(c, {dim3(1), dim3(64), 0, where_supported}, fill_from_ptx80, y.data(), 64, 1.0F);
      replay::launch(c, {dim3(1), dim3(64), 0, where_supported}, fill_kernel, x.data(), 64, 1.0F);
    });
    REQUIRE(out_of_old.edges().size() == 1);
    CHECK(out_of_old.edges()[0].kind == (pdl ? replay::EdgeKind::programmatic : replay::EdgeKind::plain));
    x.fill(0.0F, s);
    y.fill(0.0F, s);
    replay::GraphExec exec(into_old);
    exec.launch(s);
    CHECK(read_back(x, s) == std::vector<float>(64, 4.0F));
    CHECK(read_back(y, s) == std::vector<float>(64, 5.0F));
    // Eager, on any device, beside another attribute: no refusal, no error left behind, the kernels' results.
    replay::launch(s, {dim3(1), dim3(64), 0, replay::LaunchAttributes(where_supported).with_priority(-1)},
                   fill_from_ptx80, y.data(), 40, 6.0F);
    replay::launch(s, {dim3(1), dim3(64), 0, where_supported}, fill_kernel, x.data(), 64, 7.0F);
    CHECK(cudaPeekAtLastError() == cudaSuccess);
    std::vector<float> want_y(64, 5.0F);
    std::fill(want_y.begin(), want_y.begin() + 40, 6.0F);
    CHECK(read_back(y, s) == want_y);
    CHECK(read_back(x, s) == std::vector<float>(64, 7.0F));
    // The unconditional form is still refused where this one launches plainly.
    CHECK(contains(usage_message([&] {
                     replay::launch(s, {dim3(1), dim3(64), 0, replay::LaunchAttributes::programmatic()},
                                    fill_from_ptx80, y.data(), 64, 8.0F);
                   }),
                   pdl ? "from PTX 8.0" : "compute capability 9.0"));
  }

  TEST_CASE("the refusal during a global-mode capture leaves the capture valid") {
    if (!device_has_pdl()) {
      CHECK_FALSE(replay::programmatic_launch_supported());
      return;
    }
    replay::Stream s;
    replay::DeviceBuffer<float> x(48);
    x.fill(0.0F, s);
    s.synchronize();
    std::string refused;
    cudaStreamCaptureStatus during = cudaStreamCaptureStatusNone;
    // The kernel's first query (its module loaded, perhaps) happens here, during the capture.
    replay::Graph graph = replay::capture(
        s,
        [&](replay::StreamRef c) {
          refused = usage_message([&] {
            replay::launch(c, {dim3(1), dim3(64), 0, replay::LaunchAttributes::programmatic()},
                           fill_from_ptx80_first_in_capture, x.data(), 48, 5.0F);
          });
          replay::check(cudaStreamIsCapturing(c.get(), &during), "cudaStreamIsCapturing");
          replay::launch(c, {dim3(1), dim3(64)}, fill_from_ptx80_first_in_capture, x.data(), 48, 5.0F);
        },
        replay::CaptureMode::global);
    CHECK(contains(refused, "from PTX 8.0"));
    CHECK(during == cudaStreamCaptureStatusActive);
    CHECK(graph.node_count() == 1);
    CHECK(cudaPeekAtLastError() == cudaSuccess);
    replay::GraphExec exec(graph);
    exec.launch(s);
    CHECK(read_back(x, s) == std::vector<float>(48, 5.0F));
    CHECK_FALSE(replay::programmatic_launch_supported(fill_from_ptx80_first_in_capture));
  }

  TEST_CASE("a programmatic edge into a kernel compiled from PTX older than 9.0 is refused, one out of it is not") {
    if (!device_has_pdl()) {
      CHECK_FALSE(replay::programmatic_launch_supported());
      return;
    }
    replay::DeviceBuffer<float> x(32);
    replay::DeviceBuffer<float> y(32);
    replay::Graph graph = replay::make_graph();
    replay::GraphBuilder builder(graph);
    auto current = builder.add_kernel(fill_kernel, dim3(1), dim3(32), 0, {}, x.data(), 32, 1.0F);
    auto old = builder.add_kernel(fill_from_ptx80, dim3(1), dim3(32), 0, {}, y.data(), 32, 2.0F);
    const std::string into = usage_message([&] { builder.add_programmatic_dependency(current, old); });
    CHECK(contains(into, "add_programmatic_dependency: programmatic stream serialization"));
    CHECK(contains(into, "the downstream node (kernel node fill_from_ptx80"));
    CHECK(contains(into, "from PTX 8.0"));
    CHECK(contains(into, "add_dependency"));
    CHECK(contains(usage_message([&] {
                     builder.add_programmatic_dependency(current, old, replay::EdgeKind::launch_completion);
                   }),
                   "from PTX 8.0"));
    const std::size_t nodes_before = builder.node_count();
    const std::string deps = usage_message([&] {
      (void)builder.add_kernel(fill_from_ptx80, dim3(1), dim3(32), 0, replay::Deps::programmatic(current), y.data(), 32,
                               3.0F);
    });
    CHECK(contains(deps, "add_kernel: programmatic stream serialization"));
    CHECK(contains(deps, "from PTX 8.0"));
    CHECK(builder.node_count() == nodes_before);  // refused before the node was added
    CHECK(builder.edges().empty());
    CHECK(cudaPeekAtLastError() == cudaSuccess);
    // Only the downstream kernel waits: an edge out of the old kernel is fine.
    CHECK_NOTHROW(builder.add_programmatic_dependency(old, current));
    REQUIRE(builder.edges().size() == 1);
    CHECK(builder.edges()[0].kind == replay::EdgeKind::programmatic);
    replay::Stream s;
    replay::GraphExec exec(graph);
    exec.launch(s);
    CHECK(read_back(x, s) == std::vector<float>(32, 1.0F));
    CHECK(read_back(y, s) == std::vector<float>(32, 2.0F));
  }

  TEST_CASE("capability queries and programmatic launches from many threads agree with the eager results") {
    if (!device_has_pdl()) {
      CHECK_FALSE(replay::programmatic_launch_supported());
      return;
    }
    const int device = current_device();
    constexpr int threads = 8;
    const int rounds = replay_test::scaled(64, 4);
    constexpr int n = 96;
    std::vector<int> wrong(threads, 0);
    std::vector<std::vector<float>> outputs(threads);
    std::vector<std::vector<float>> filled(threads);
    std::vector<std::exception_ptr> errors(threads);
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t) {
      pool.emplace_back([&, t] {
        try {
          replay::check(cudaSetDevice(device), "cudaSetDevice");
          replay::Stream s;
          // stage_kernel with zero weights writes `step` after its wait, so
          // that each launch's writes follow its predecessor's.
          replay::DeviceBuffer<float> zeros(n);
          replay::DeviceBuffer<float> x(n);
          replay::DeviceBuffer<float> y(n);
          zeros.fill(0.0F, s);
          for (int r = 0; r < rounds; ++r) {
            wrong[t] += replay::programmatic_launch_supported(fill_from_ptx80) ? 1 : 0;
            wrong[t] += replay::programmatic_launch_supported(stage_kernel) ? 0 : 1;
            wrong[t] += contains(usage_message([&] {
                                   replay::launch(s, {dim3(1), dim3(n), 0, replay::LaunchAttributes::programmatic()},
                                                  fill_from_ptx80, x.data(), n, -1.0F);
                                 }),
                                 "from PTX 8.0")
                            ? 0
                            : 1;
            // Where supported, not refused from any thread: the PTX 8.0
            // kernel launched plainly, then the stage kernel programmatically.
            replay::launch(s, {dim3(1), dim3(n), 0, replay::LaunchAttributes::programmatic_where_supported()},
                           fill_from_ptx80, y.data(), n, static_cast<float>(t * 1000 + r));
            const auto attributes = r % 2 == 0 ? replay::LaunchAttributes::programmatic()
                                               : replay::LaunchAttributes::programmatic_where_supported();
            replay::launch(s, {dim3(1), dim3(n), 0, attributes}, stage_kernel, zeros.data(), zeros.data(), x.data(), n,
                           0, static_cast<float>(t * 1000 + r));
          }
          outputs[t] = read_back(x, s);
          filled[t] = read_back(y, s);
        } catch (...) {
          errors[t] = std::current_exception();
        }
      });
    }
    for (std::thread& thread : pool) {
      thread.join();
    }
    for (int t = 0; t < threads; ++t) {
      CHECK(errors[t] == nullptr);
      CHECK(wrong[t] == 0);
      // Eager: the last fill of the thread's own buffer.
      CHECK(outputs[t] == std::vector<float>(n, static_cast<float>(t * 1000 + rounds - 1)));
      CHECK(filled[t] == std::vector<float>(n, static_cast<float>(t * 1000 + rounds - 1)));
    }
  }
}
