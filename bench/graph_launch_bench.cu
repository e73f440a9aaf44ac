// Eager launches vs raw cudaGraphLaunch vs replay::GraphExec::launch, for
// chains of 1, 10, 100 and 1000 tiny kernels; and instantiate vs update for
// 100- and 1000-node graphs. All variants run in one program so that
// scripts/bench_ratios.py can report ratios from one run.
//
//  host/<mode>/<kernels>: host time to enqueue one chain (eager: N launches;
//                         graph: one launch), measured around the enqueue only.
//  gpu/<mode>/<kernels>:  device time of one chain, from CUDA events.
//  instantiate/<nodes>, update/<nodes>: host time of one cudaGraphInstantiate
//                         vs one in-place replay::GraphExec::update.
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdio>
#include <vector>

#include "replay/replay.hpp"

namespace {

constexpr int kElements = 256;  // one block: launch cost, not work, dominates

__global__ void tiny_kernel(float* x, float a) {
  x[threadIdx.x] = a * x[threadIdx.x] + 1.0F;
}

void chain(replay::StreamRef s, float* x, int kernels) {
  for (int k = 0; k < kernels; ++k) {
    tiny_kernel<<<1, kElements, 0, s.get()>>>(x, 0.5F);
  }
  replay::check_last_launch();
}

enum Mode : int { eager = 0, raw_graph = 1, replay_graph = 2 };
const char* const kModeNames[] = {"eager", "raw_cudaGraphLaunch", "GraphExec_launch"};

struct Fixture {
  replay::Stream stream;
  replay::DeviceBuffer<float> x{kElements};
  replay::Graph graph;
  replay::GraphExec exec;
  int kernels;

  explicit Fixture(int n)
      : graph(replay::capture(stream, [&](replay::StreamRef s) { chain(s, x.data(), n); })),
        exec(graph, replay::InstantiateFlags::upload, stream),
        kernels(n) {
    x.fill(1.0F, stream);
    stream.synchronize();
  }

  // Enqueues one chain in the given mode.
  void enqueue(int mode) {
    switch (mode) {
      case eager: chain(stream, x.data(), kernels); break;
      case raw_graph: replay::check(cudaGraphLaunch(exec.get(), stream.get()), "cudaGraphLaunch"); break;
      default: exec.launch(stream); break;
    }
  }
};

bool skip_without_device(benchmark::State& state) {
  if (!replay::has_device()) {
    state.SkipWithError("no CUDA device");
    return true;
  }
  return false;
}

void host_enqueue(benchmark::State& state) {
  if (skip_without_device(state)) return;
  const int mode = static_cast<int>(state.range(0));
  const int kernels = static_cast<int>(state.range(1));
  Fixture f(kernels);
  // Enqueue a burst of chains per iteration (timed), then drain (untimed), so
  // the queue never fills and the timing is of the host path alone.
  const int burst = kernels >= 100 ? 4 : 32;
  for (auto _ : state) {
    const auto start = std::chrono::steady_clock::now();
    for (int b = 0; b < burst; ++b) {
      f.enqueue(mode);
    }
    const auto stop = std::chrono::steady_clock::now();
    f.stream.synchronize();
    state.SetIterationTime(std::chrono::duration<double>(stop - start).count() / burst);
  }
  state.SetLabel(kModeNames[mode]);
  state.counters["kernels"] = kernels;
}

void gpu_time(benchmark::State& state) {
  if (skip_without_device(state)) return;
  const int mode = static_cast<int>(state.range(0));
  const int kernels = static_cast<int>(state.range(1));
  Fixture f(kernels);
  auto start = replay::Event::timing();
  auto stop = replay::Event::timing();
  f.enqueue(mode);  // warm
  f.stream.synchronize();
  for (auto _ : state) {
    start.record(f.stream);
    f.enqueue(mode);
    stop.record(f.stream);
    stop.synchronize();
    state.SetIterationTime(static_cast<double>(replay::Event::elapsed_ms(start, stop)) / 1e3);
  }
  state.SetLabel(kModeNames[mode]);
  state.counters["kernels"] = kernels;
}

void instantiate_vs_update(benchmark::State& state, bool update) {
  if (skip_without_device(state)) return;
  const int nodes = static_cast<int>(state.range(0));
  replay::Stream stream;
  replay::DeviceBuffer<float> a(kElements);
  replay::DeviceBuffer<float> b(kElements);
  auto graph_a = replay::capture(stream, [&](replay::StreamRef s) { chain(s, a.data(), nodes); });
  auto graph_b = replay::capture(stream, [&](replay::StreamRef s) { chain(s, b.data(), nodes); });
  replay::GraphExec exec(graph_a);
  bool to_b = true;
  for (auto _ : state) {
    if (update) {
      const auto start = std::chrono::steady_clock::now();
      const auto result = exec.update(to_b ? graph_b : graph_a);
      const auto stop = std::chrono::steady_clock::now();
      if (!result.in_place()) {
        state.SkipWithError("update was not in place");
        break;
      }
      to_b = !to_b;
      state.SetIterationTime(std::chrono::duration<double>(stop - start).count());
    } else {
      const auto start = std::chrono::steady_clock::now();
      replay::GraphExec fresh(graph_b);
      const auto stop = std::chrono::steady_clock::now();
      state.SetIterationTime(std::chrono::duration<double>(stop - start).count());
    }
  }
  state.counters["nodes"] = nodes;
}

void instantiate(benchmark::State& state) { instantiate_vs_update(state, false); }
void update(benchmark::State& state) { instantiate_vs_update(state, true); }

void launch_args(benchmark::internal::Benchmark* b) {
  b->ArgNames({"mode", "kernels"});
  for (int kernels : {1, 10, 100, 1000}) {
    for (int mode : {eager, raw_graph, replay_graph}) {
      b->Args({mode, kernels});
    }
  }
}

}  // namespace

BENCHMARK(host_enqueue)->Apply(launch_args)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(gpu_time)->Apply(launch_args)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(instantiate)->ArgName("nodes")->Arg(100)->Arg(1000)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(update)->ArgName("nodes")->Arg(100)->Arg(1000)->UseManualTime()->Unit(benchmark::kMicrosecond);

BENCHMARK_MAIN();
