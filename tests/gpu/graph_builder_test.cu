// GraphBuilder: every node type against host references, typed updates on an
// executable graph, enable/disable, capture mixed with building, conditional
// nodes of every kind (bodies built and captured), and the misuse errors.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "gpu_suite.hpp"
#include "kernels.cuh"
#include "replay/replay.hpp"

using replay_test::axpb_kernel;
using replay_test::blocks_for;

namespace {
constexpr int kN = 4096;

// out[i] = value
__global__ void mark_kernel(int* out, int index, int value) { out[index] = value; }

// Sets `condition` from device memory: the host never sets it.
__global__ void set_from_kernel(replay::ConditionalHandle condition, const unsigned* value) {
  condition.set(*value);
}

// One pass of a WHILE body: counts passes, counts `remaining` down, and keeps
// the loop going while something remains.
__global__ void count_down_kernel(replay::ConditionalHandle condition, int* remaining, int* passes) {
  *passes += 1;
  *remaining -= 1;
  replay::set_condition(condition, *remaining > 0 ? 1U : 0U);
}

std::vector<float> read(const replay::DeviceBuffer<float>& buf, replay::StreamRef s) {
  std::vector<float> out(buf.size(), -12345.0F);
  buf.copy_to(std::span<float>(out), s);
  s.synchronize();
  return out;
}
template <class T>
T read_one(const T* device, replay::StreamRef s) {
  T value{};
  replay::check(cudaMemcpyAsync(&value, device, sizeof(T), cudaMemcpyDeviceToHost, s.get()), "cudaMemcpyAsync");
  s.synchronize();
  return value;
}
template <class T>
void write_one(T* device, T value, replay::StreamRef s) {
  replay::check(cudaMemcpyAsync(device, &value, sizeof(T), cudaMemcpyHostToDevice, s.get()), "cudaMemcpyAsync");
  s.synchronize();
}
std::vector<float> axpb_host(std::vector<float> x, float a, float b) {
  for (float& v : x) {
    v = a * v + b;
  }
  return x;
}
// GPU kernels may contract a * x + b into one fma; compare with a tolerance.
bool near_all(const std::vector<float>& got, const std::vector<float>& want) {
  if (got.size() != want.size()) {
    return false;
  }
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (std::fabs(got[i] - want[i]) > 1e-4F * (1.0F + std::fabs(want[i]))) {
      return false;
    }
  }
  return true;
}
void host_marker(void* flag) { static_cast<std::atomic<int>*>(flag)->fetch_add(1); }

// What most cases start from: a stream and an empty graph with its builder.
struct Built {
  replay::Stream stream;
  replay::Graph graph = replay::make_graph();
  replay::GraphBuilder b{graph};
};

// x = a * x + c over kN elements, as a node of `b`.
replay::KernelNode<float*, int, float, float> add_axpb(replay::GraphBuilder& b, float* x, float a, float c,
                                                      const replay::Deps& deps) {
  return b.add_kernel(axpb_kernel, blocks_for(kN), 256, 0, deps, x, kN, a, c);
}

int random_int(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(replay_test::rng()); }
}  // namespace

TEST_SUITE("gpu" * replay_test::needs_device()) {
  TEST_CASE_FIXTURE(Built, "kernel nodes: typed arguments, explicit dependencies, in-place set_args and set_params") {
    replay::DeviceBuffer<float> x(kN);
    replay::DeviceBuffer<float> y(kN);
    auto first = add_axpb(b, x.data(), 2.0F, 1.0F, {});
    auto second = add_axpb(b, x.data(), 0.5F, -3.0F, {first});
    CHECK(graph.count(replay::NodeType::kernel) == 2);
    CHECK(first.config().block.x == 256);
    replay::GraphExec exec(graph);

    auto input = replay_test::random_floats(kN);
    x.copy_from(std::span<const float>(input), stream);
    exec.launch(stream);
    CHECK(near_all(read(x, stream), axpb_host(axpb_host(input, 2.0F, 1.0F), 0.5F, -3.0F)));

    // New arguments (and another buffer) for the second node only.
    const float a = 1.0F + static_cast<float>(random_int(1, 9)) / 8.0F;
    second.set_args(exec, y.data(), kN, a, 0.25F);
    input = replay_test::random_floats(kN);
    const auto yin = replay_test::random_floats(kN);
    x.copy_from(std::span<const float>(input), stream);
    y.copy_from(std::span<const float>(yin), stream);
    exec.launch(stream);
    CHECK(near_all(read(x, stream), axpb_host(input, 2.0F, 1.0F)));
    CHECK(near_all(read(y, stream), axpb_host(yin, a, 0.25F)));

    // New launch configuration: half the elements, with blocks of 128.
    first.set_params(exec, replay::LaunchConfig{blocks_for(kN / 2, 128), 128, 0}, x.data(), kN / 2, 3.0F, 0.0F);
    x.copy_from(std::span<const float>(input), stream);
    exec.launch(stream);
    auto expected = input;
    for (int i = 0; i < kN / 2; ++i) {
      expected[i] = 3.0F * expected[i];
    }
    CHECK(near_all(read(x, stream), expected));

    // A typed handle recovered from the graph.
    auto found = replay::KernelNode<float*, int, float, float>::from_node(second, axpb_kernel);
    CHECK(found.get() == second.get());
    CHECK_THROWS_AS((void)replay::find_kernel_node(graph, axpb_kernel), replay::usage_error);  // two nodes launch it
  }

  TEST_CASE("a failed update names the node it was for") {
    replay::DeviceBuffer<float> x(kN);
    replay::Graph graph = replay::make_graph();
    replay::Graph other = replay::make_graph();
    replay::GraphBuilder b(graph);
    replay::GraphBuilder ob(other);
    (void)add_axpb(b, x.data(), 1.0F, 0.0F, {});
    auto foreign = add_axpb(ob, x.data(), 1.0F, 0.0F, {});
    replay::GraphExec exec(graph);
    try {
      foreign.set_args(exec, x.data(), kN, 2.0F, 0.0F);
      FAIL("updating a node of another graph must fail");
    } catch (const replay::cuda_error& e) {
      const std::string what = e.what();
      CHECK(what.find("cudaGraphExecKernelNodeSetParams") != std::string::npos);
      CHECK(what.find("kernel node") != std::string::npos);
      CHECK(what.find("axpb_kernel") != std::string::npos);
    }
    CHECK(cudaGetLastError() == cudaSuccess);
    CHECK_THROWS_AS(foreign.set_params(exec, replay::LaunchConfig{0, 256, 0}, x.data(), kN, 2.0F, 0.0F),
                    replay::usage_error);
  }

  TEST_CASE_FIXTURE(Built, "memcpy and memset nodes, updated in place; typed spans are size-checked") {
    replay::DeviceBuffer<float> src(kN);
    replay::DeviceBuffer<float> dst(kN);
    replay::DeviceBuffer<float> src2(kN);
    replay::DeviceBuffer<int> flags(kN);
    const int fill_value = random_int(-1000, 1000);
    auto fill = b.add_fill(flags.span(), fill_value, {});
    auto copy = b.add_copy(dst.span(), std::span<const float>(src.span()), {fill});
    CHECK_THROWS_AS(b.add_copy(dst.span().first(kN - 1), std::span<const float>(src.span())), replay::usage_error);
    CHECK_THROWS_AS(b.add_fill(flags.span().first(0), 1), replay::usage_error);
    CHECK(graph.count(replay::NodeType::memcpy) == 1);
    CHECK(graph.count(replay::NodeType::memset) == 1);
    replay::GraphExec exec(graph);

    const auto input = replay_test::random_floats(kN);
    src.copy_from(std::span<const float>(input), stream);
    exec.launch(stream);
    CHECK(read(dst, stream) == input);
    std::vector<int> got(kN);
    flags.copy_to(std::span<int>(got), stream);
    stream.synchronize();
    CHECK(std::all_of(got.begin(), got.end(), [&](int v) { return v == fill_value; }));

    // In place: another source, half the size; another fill value and count.
    const auto input2 = replay_test::random_floats(kN);
    src2.copy_from(std::span<const float>(input2), stream);
    dst.zero(stream);
    copy.set_params(exec, dst.span().first(kN / 2), std::span<const float>(src2.span().first(kN / 2)));
    fill.set_params(exec, flags.span().first(kN / 4), fill_value + 7);
    exec.launch(stream);
    const auto out = read(dst, stream);
    CHECK(std::equal(out.begin(), out.begin() + kN / 2, input2.begin()));
    CHECK(std::all_of(out.begin() + kN / 2, out.end(), [](float v) { return v == 0.0F; }));
    flags.copy_to(std::span<int>(got), stream);
    stream.synchronize();
    CHECK(std::all_of(got.begin(), got.begin() + kN / 4, [&](int v) { return v == fill_value + 7; }));
    CHECK(std::all_of(got.begin() + kN / 4, got.end(), [&](int v) { return v == fill_value; }));
    CHECK_THROWS_AS(copy.set_params(exec, dst.span().first(2), std::span<const float>(src2.span().first(3))),
                    replay::usage_error);
  }

  TEST_CASE_FIXTURE(Built, "enable and disable a node on an executable graph") {
    replay::DeviceBuffer<float> x(kN);
    auto scale = add_axpb(b, x.data(), 2.0F, 0.0F, {});
    auto shift = add_axpb(b, x.data(), 1.0F, 5.0F, {scale});
    replay::GraphExec exec(graph);
    CHECK(scale.enabled(exec));
    scale.set_enabled(exec, false);
    CHECK_FALSE(scale.enabled(exec));
    const auto input = replay_test::random_floats(kN);
    x.copy_from(std::span<const float>(input), stream);
    exec.launch(stream);
    CHECK(near_all(read(x, stream), axpb_host(input, 1.0F, 5.0F)));
    scale.set_enabled(exec, true);
    shift.set_enabled(exec, false);
    x.copy_from(std::span<const float>(input), stream);
    exec.launch(stream);
    CHECK(near_all(read(x, stream), axpb_host(input, 2.0F, 0.0F)));
  }

  TEST_CASE("host nodes: the graph owns the callable, past the Graph's own lifetime") {
    replay::Stream stream;
    auto calls = std::make_shared<std::atomic<int>>(0);
    std::weak_ptr<std::atomic<int>> watch = calls;
    replay::DeviceBuffer<float> x(kN);
    replay::PinnedBuffer<float> seen(kN);
    std::vector<float> copied(kN);
    std::unique_ptr<replay::GraphExec> exec;
    replay::HostNode host;
    {
      replay::Graph graph = replay::make_graph();
      replay::GraphBuilder b(graph);
      auto k = add_axpb(b, x.data(), 2.0F, 1.0F, {});
      auto back = b.add_memcpy(seen.data(), x.data(), kN * sizeof(float), {k});
      host = b.add_host(
          [counter = std::move(calls), out = copied.data(), in = seen.data()] {
            std::copy(in, in + kN, out);
            counter->fetch_add(1);
          },
          {back});
      CHECK(graph.count(replay::NodeType::host) == 1);
      exec = std::make_unique<replay::GraphExec>(graph);
    }  // the Graph is gone; the exec keeps the callable alive
    CHECK_FALSE(watch.expired());
    const int launches = replay_test::scaled(5, 2);
    std::vector<float> input;
    for (int i = 0; i < launches; ++i) {
      input = replay_test::random_floats(kN);
      x.copy_from(std::span<const float>(input), stream);
      exec->launch(stream);
      stream.synchronize();
    }
    CHECK(near_all(copied, axpb_host(input, 2.0F, 1.0F)));
    if (auto counter = watch.lock()) {
      CHECK(counter->load() == launches);
    }
    host.rethrow_if_failed();  // nothing thrown
    exec.reset();
    // CUDA destroys the callable once no graph or exec references it.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!watch.expired() && std::chrono::steady_clock::now() < deadline) {
      replay::check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    CHECK(watch.expired());
  }

  TEST_CASE_FIXTURE(Built, "a host node inside a child graph outlives the child graph it was added to") {
    std::atomic<int> calls{0};
    {
      replay::Graph child = replay::make_graph();
      replay::GraphBuilder cb(child);
      (void)cb.add_host([&calls] { calls.fetch_add(1); });
      (void)b.add_child(child);
    }  // the original child is gone; the parent's copy keeps the callable
    replay::GraphExec exec(graph);
    const int launches = random_int(2, 5);
    for (int i = 0; i < launches; ++i) {
      exec.launch(stream);
    }
    stream.synchronize();
    CHECK(calls.load() == launches);
  }

  TEST_CASE_FIXTURE(Built, "a host node's exception is kept and rethrown on the host") {
    auto host = b.add_host([] { throw std::runtime_error("host node boom"); });
    replay::GraphExec exec(graph);
    exec.launch(stream);
    stream.synchronize();
    CHECK_THROWS_WITH_AS(host.rethrow_if_failed(), "host node boom", std::runtime_error);
    CHECK_NOTHROW(host.rethrow_if_failed());  // reported once
  }

  TEST_CASE_FIXTURE(Built, "child graphs: a captured section as a node") {
    replay::DeviceBuffer<float> x(kN);
    auto section = replay::capture(stream, [&](replay::StreamRef s) {
      axpb_kernel<<<blocks_for(kN), 256, 0, s.get()>>>(x.data(), kN, 3.0F, 1.0F);
      axpb_kernel<<<blocks_for(kN), 256, 0, s.get()>>>(x.data(), kN, 1.0F, -2.0F);
      replay::check_last_launch();
    });
    auto before = add_axpb(b, x.data(), 0.5F, 0.0F, {});
    auto child = b.add_child(section, {before});
    CHECK(child.child_graph() != nullptr);
    CHECK(graph.count(replay::NodeType::child_graph) == 1);
    replay::GraphExec exec(graph);
    const auto input = replay_test::random_floats(kN);
    x.copy_from(std::span<const float>(input), stream);
    exec.launch(stream);
    CHECK(near_all(read(x, stream), axpb_host(axpb_host(axpb_host(input, 0.5F, 0.0F), 3.0F, 1.0F), 1.0F, -2.0F)));
  }

  TEST_CASE_FIXTURE(Built, "capture into a graph after given nodes; the section's sinks order later nodes") {
    replay::DeviceBuffer<float> x(kN);
    replay::DeviceBuffer<float> out(kN);
    auto first = add_axpb(b, x.data(), 2.0F, 0.0F, {});
    auto sinks = b.capture(
        stream,
        [&](replay::StreamRef s) {
          axpb_kernel<<<blocks_for(kN), 256, 0, s.get()>>>(x.data(), kN, 1.0F, 1.0F);
          axpb_kernel<<<blocks_for(kN), 256, 0, s.get()>>>(x.data(), kN, -1.0F, 0.0F);
          replay::check_last_launch();
        },
        {first});
    REQUIRE(sinks.size() == 1);
    b.add_copy(out.span(), std::span<const float>(x.span()), sinks);
    CHECK(graph.count(replay::NodeType::kernel) == 3);
    CHECK_FALSE(stream.is_capturing());

    // Work that throws leaves the graph as it was and the stream usable.
    const auto count = graph.node_count();
    CHECK_THROWS_AS(b.capture(stream,
                              [&](replay::StreamRef s) {
                                axpb_kernel<<<1, 1, 0, s.get()>>>(x.data(), 1, 1.0F, 0.0F);
                                throw std::runtime_error("stop");
                              }),
                    std::runtime_error);
    CHECK(graph.node_count() == count);
    CHECK_FALSE(stream.is_capturing());

    replay::GraphExec exec(graph);
    const auto input = replay_test::random_floats(kN);
    x.copy_from(std::span<const float>(input), stream);
    exec.launch(stream);
    CHECK(near_all(read(out, stream), axpb_host(axpb_host(axpb_host(input, 2.0F, 0.0F), 1.0F, 1.0F), -1.0F, 0.0F)));
  }

  TEST_CASE_FIXTURE(Built, "event record and wait nodes") {
    replay::Stream producer;
    replay::DeviceBuffer<float> x(kN);
    replay::DeviceBuffer<float> y(kN);
    replay::Event produced;
    replay::Event done;
    auto wait = b.add_event_wait(produced);
    auto k = add_axpb(b, x.data(), 4.0F, -1.0F, {wait});
    auto copy = b.add_copy(y.span(), std::span<const float>(x.span()), {k});
    (void)b.add_event_record(done, {copy});
    CHECK(graph.count(replay::NodeType::wait_event) == 1);
    CHECK(graph.count(replay::NodeType::event_record) == 1);
    replay::GraphExec exec(graph);

    const auto input = replay_test::random_floats(kN);
    std::vector<float> ones(kN, 1.0F);
    x.copy_from(std::span<const float>(ones), stream);
    stream.synchronize();
    // The producer writes x; the graph waits for it on the device.
    x.copy_from(std::span<const float>(input), producer);
    axpb_kernel<<<blocks_for(kN), 256, 0, producer.get()>>>(x.data(), kN, 1.0F, 0.5F);
    replay::check_last_launch();
    produced.record(producer);
    exec.launch(stream);
    done.synchronize();  // the graph's record node
    std::vector<float> got(kN);
    y.copy_to(std::span<float>(got), producer);
    producer.synchronize();
    CHECK(near_all(got, axpb_host(axpb_host(input, 1.0F, 0.5F), 4.0F, -1.0F)));
    stream.synchronize();
  }

  TEST_CASE_FIXTURE(Built, "memory allocation and free nodes") {
    replay::DeviceBuffer<float> in(kN);
    replay::DeviceBuffer<float> out(kN);
    auto scratch = b.add_mem_alloc(kN * sizeof(float));
    REQUIRE(scratch.ptr() != nullptr);
    auto load = b.add_memcpy(scratch.ptr(), in.data(), kN * sizeof(float), {scratch}, cudaMemcpyDeviceToDevice);
    auto k = b.add_kernel(axpb_kernel, blocks_for(kN), 256, 0, {load}, scratch.as<float>(), kN, -2.0F, 3.0F);
    auto store = b.add_memcpy(out.data(), scratch.ptr(), kN * sizeof(float), {k}, cudaMemcpyDeviceToDevice);
    (void)b.add_mem_free(scratch, {store});
    CHECK(graph.count(replay::NodeType::mem_alloc) == 1);
    CHECK(graph.count(replay::NodeType::mem_free) == 1);
    CHECK_THROWS_AS(b.add_mem_alloc(0), replay::usage_error);
    replay::GraphExec exec(graph);
    for (int rep = 0; rep < 2; ++rep) {
      const auto input = replay_test::random_floats(kN);
      in.copy_from(std::span<const float>(input), stream);
      exec.launch(stream);
      CHECK(near_all(read(out, stream), axpb_host(input, -2.0F, 3.0F)));
    }
  }

  TEST_CASE_FIXTURE(Built, "IF: the body runs when the device-set value is non-zero") {
    replay::DeviceBuffer<unsigned> value(1);
    replay::DeviceBuffer<int> out(1);
    auto cond = b.make_condition(0);
    auto reset = b.add_fill(out.span(), -1, {});
    auto set = b.add_kernel(set_from_kernel, 1, 1, 0, {reset}, cond, static_cast<const unsigned*>(value.data()));
    auto node = b.add_if(cond, {set});
    CHECK(node.kind() == replay::ConditionalKind::if_then);
    CHECK(node.body_count() == 1);
    (void)node.body().add_kernel(mark_kernel, 1, 1, 0, {}, out.data(), 0, 7);
    CHECK(node.body().count(replay::NodeType::kernel) == 1);
    CHECK(graph.count(replay::NodeType::conditional) == 1);
    CHECK_THROWS_AS(node.else_body(), replay::usage_error);
    CHECK_THROWS_AS(node.body(1), replay::usage_error);
    replay::GraphExec exec(graph);
    for (unsigned v : {0U, 1U, 0U, static_cast<unsigned>(random_int(2, 1000))}) {
      write_one(value.data(), v, stream);
      exec.launch(stream);
      CHECK(read_one(out.data(), stream) == (v != 0 ? 7 : -1));
    }
  }

  TEST_CASE_FIXTURE(Built, "IF/ELSE: one of two bodies, the else body filled by capture") {
    replay::DeviceBuffer<unsigned> value(1);
    replay::DeviceBuffer<int> out(1);
    auto cond = b.make_condition(0);
    auto set = b.add_kernel(set_from_kernel, 1, 1, 0, {}, cond, static_cast<const unsigned*>(value.data()));
    auto node = b.add_if_else(cond, {set});
    CHECK(node.body_count() == 2);
    (void)node.then_body().add_kernel(mark_kernel, 1, 1, 0, {}, out.data(), 0, 1);
    auto sinks = node.else_body().capture(stream, [&](replay::StreamRef s) {
      mark_kernel<<<1, 1, 0, s.get()>>>(out.data(), 0, 2);
      replay::check_last_launch();
    });
    CHECK(sinks.size() == 1);
    replay::GraphExec exec(graph);
    for (unsigned v : {1U, 0U, 5U, 0U}) {
      write_one(value.data(), v, stream);
      exec.launch(stream);
      CHECK(read_one(out.data(), stream) == (v != 0 ? 1 : 2));
    }
  }

  TEST_CASE_FIXTURE(Built, "WHILE: the loop runs on the device until the body clears the value") {
    replay::DeviceBuffer<int> remaining(1);
    replay::DeviceBuffer<int> passes(1);
    auto cond = b.make_condition(1);  // enter the loop; the body decides after each pass
    auto zero = b.add_fill(passes.span(), 0, {});
    auto loop = b.add_while(cond, {zero});
    (void)loop.body().add_kernel(count_down_kernel, 1, 1, 0, {}, cond, remaining.data(), passes.data());
    replay::GraphExec exec(graph);
    for (int rep = 0; rep < 3; ++rep) {
      const int n = random_int(1, replay_test::under_sanitizer() ? 20 : 500);
      write_one(remaining.data(), n, stream);
      exec.launch(stream);
      CHECK(read_one(passes.data(), stream) == n);
      CHECK(read_one(remaining.data(), stream) == 0);
    }
  }

  TEST_CASE_FIXTURE(Built, "WHILE with a zero value runs no pass; a captured body works too") {
    replay::DeviceBuffer<int> remaining(1);
    replay::DeviceBuffer<int> passes(1);
    replay::DeviceBuffer<unsigned> start(1);
    auto cond = b.make_condition(0);
    auto zero = b.add_fill(passes.span(), 0, {});
    auto set = b.add_kernel(set_from_kernel, 1, 1, 0, {zero}, cond, static_cast<const unsigned*>(start.data()));
    auto loop = b.add_while(cond, {set});
    (void)loop.body().capture(stream, [&](replay::StreamRef s) {
      count_down_kernel<<<1, 1, 0, s.get()>>>(cond, remaining.data(), passes.data());
      replay::check_last_launch();
    });
    replay::GraphExec exec(graph);
    write_one(remaining.data(), 9, stream);
    write_one(start.data(), 0U, stream);
    exec.launch(stream);
    CHECK(read_one(passes.data(), stream) == 0);
    write_one(start.data(), 1U, stream);
    exec.launch(stream);
    CHECK(read_one(passes.data(), stream) == 9);
  }

  TEST_CASE_FIXTURE(Built, "SWITCH: the device picks one body; a value past the last case runs none") {
    constexpr unsigned kCases = 4;
    replay::DeviceBuffer<unsigned> value(1);
    replay::DeviceBuffer<int> out(1);
    auto cond = b.make_condition(0);
    auto reset = b.add_fill(out.span(), -1, {});
    auto set = b.add_kernel(set_from_kernel, 1, 1, 0, {reset}, cond, static_cast<const unsigned*>(value.data()));
    auto node = b.add_switch(cond, kCases, {set});
    CHECK(node.kind() == replay::ConditionalKind::switch_case);
    REQUIRE(node.body_count() == kCases);
    for (unsigned c = 0; c < kCases; ++c) {
      if (c % 2 == 0) {
        (void)node.body(c).add_kernel(mark_kernel, 1, 1, 0, {}, out.data(), 0, static_cast<int>(10 + c));
      } else {
        (void)node.body(c).capture(stream, [&](replay::StreamRef s) {
          mark_kernel<<<1, 1, 0, s.get()>>>(out.data(), 0, static_cast<int>(10 + c));
          replay::check_last_launch();
        });
      }
    }
    CHECK_THROWS_AS(node.body(kCases), replay::usage_error);
    replay::GraphExec exec(graph);
    for (unsigned v : {2U, 0U, 3U, 1U, kCases, kCases + static_cast<unsigned>(random_int(1, 100))}) {
      write_one(value.data(), v, stream);
      exec.launch(stream);
      CHECK(read_one(out.data(), stream) == (v < kCases ? static_cast<int>(10 + v) : -1));
    }
  }

  TEST_CASE("conditional misuse is a clear error naming what was wrong") {
    replay::Stream stream;
    replay::DeviceBuffer<int> out(1);
    replay::Graph graph = replay::make_graph();
    replay::GraphBuilder b(graph);
    auto cond = b.make_condition(0);
    CHECK_THROWS_WITH_AS(b.add_switch(cond, 0), doctest::Contains("at least one case"), replay::usage_error);
    CHECK_THROWS_WITH_AS(b.add_while(replay::ConditionalHandle{}), doctest::Contains("ConditionalHandle is empty"),
                         replay::usage_error);
    auto node = b.add_if(cond);
    auto body = node.body();
    CHECK(body.is_conditional_body());
    CHECK_THROWS_WITH_AS(body.add_host([] {}), doctest::Contains("host node"), replay::usage_error);
    replay::Event event;
    CHECK_THROWS_WITH_AS(body.add_event_record(event), doctest::Contains("event_record"), replay::usage_error);
    CHECK_THROWS_WITH_AS(body.add_mem_alloc(64), doctest::Contains("mem_alloc"), replay::usage_error);

    // A child graph with a host node is refused in a body, naming the node.
    replay::Graph with_host = replay::make_graph();
    std::atomic<int> flag{0};
    {
      replay::GraphBuilder hb(with_host);
      (void)hb.add_host([&flag] { flag.fetch_add(1); });
    }
    CHECK_THROWS_WITH_AS(body.add_child(with_host), doctest::Contains("host node"), replay::usage_error);

    // A capture into a body that records a host function is refused; the body stays empty.
    CHECK_THROWS(body.capture(stream, [&](replay::StreamRef s) {
      replay::check(cudaLaunchHostFunc(s.get(), host_marker, &flag), "cudaLaunchHostFunc");
    }));
    CHECK(body.node_count() == 0);
    CHECK_FALSE(stream.is_capturing());

    // A graph holding a conditional node cannot be a child graph.
    CHECK_THROWS_WITH_AS(replay::GraphBuilder(with_host).add_child(graph), doctest::Contains("conditional"),
                         replay::usage_error);
    CHECK(cudaGetLastError() == cudaSuccess);
  }

  TEST_CASE_FIXTURE(Built, "inspection covers the new node types; DOT output is written") {
    replay::DeviceBuffer<float> x(64);
    replay::Event event;
    auto alloc = b.add_mem_alloc(256);
    auto k = b.add_kernel(axpb_kernel, 1, 64, 0, {alloc}, x.data(), 64, 1.0F, 0.0F);
    auto free_node = b.add_mem_free(alloc, {k});
    auto rec = b.add_event_record(event, {free_node});
    auto host = b.add_host([] {}, {rec});
    auto cond = b.make_condition(0);
    auto node = b.add_if(cond, {host});
    (void)node.body().add_empty();
    const auto counts = graph.node_counts();
    CHECK(counts.at(replay::NodeType::mem_alloc) == 1);
    CHECK(counts.at(replay::NodeType::mem_free) == 1);
    CHECK(counts.at(replay::NodeType::event_record) == 1);
    CHECK(counts.at(replay::NodeType::host) == 1);
    CHECK(counts.at(replay::NodeType::conditional) == 1);
    CHECK(counts.at(replay::NodeType::kernel) == 1);
    CHECK(node.body().count(replay::NodeType::empty) == 1);
    const auto path = std::filesystem::temp_directory_path() / "replay_graph_builder_test.dot";
    graph.write_dot(path);
    std::ifstream in(path);
    const std::string dot((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    CHECK(dot.find("digraph") != std::string::npos);
    std::filesystem::remove(path);
  }
}
