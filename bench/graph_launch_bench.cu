// Eager launches vs raw cudaGraphLaunch vs replay::GraphExec::launch, for
// chains of 1, 10, 100 and 1000 tiny kernels; and instantiate vs update for
// 100- and 1000-node graphs. All variants run in one program so that
// scripts/bench_ratios.py can report ratios from one run.
//
//  host/<mode>/<kernels>: host time to enqueue one chain (eager: N launches;
//                         graph: one launch), measured around the enqueue only.
//  gpu/<mode>/<kernels>:  device time of one chain, from CUDA events.
//  host_launch_paired/<kernels>: raw cudaGraphLaunch and GraphExec::launch (medians)
//                         timed alternately in one loop (counters).
//  capture_paired/<kernels>: raw cudaStreamBeginCapture/EndCapture and (medians)
//                         replay::capture timed alternately (counters).
//  gpu_time_paired/<kernels>: device time of raw and GraphExec replays of one
//                         executable graph, alternately (medians, and the median
//                         of the pairs' ratios).
//  reinstantiate/<nodes>, update/<nodes>: re-instantiation (destroy, instantiate,
//                         upload) vs one in-place replay::GraphExec::update.
#include <benchmark/benchmark.h>

#include "bench_device.hpp"
#include "bench_stats.hpp"

#include <algorithm>
#include <chrono>
#include <cstddef>
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

// Keeps the GPU busy for about 100 ms first, so that its clocks have ramped
// up before anything is timed (an idle H200 idles at a fraction of its clock).
void warm_clocks(Fixture& f) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(100);
  while (std::chrono::steady_clock::now() < until) {
    f.enqueue(replay_graph);
    f.stream.synchronize();
  }
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

// Raw cudaGraphLaunch and GraphExec::launch of the same executable graph,
// timed in alternation inside one loop, so that clock drift and background
// noise hit both alike; counters raw_ns and replay_ns are the median host
// nanoseconds per launch over the iterations (a burst preempted by the host
// moves a mean by several percent, not a median), overhead_ratio the median
// of the pairs' ratios.
void host_launch_paired(benchmark::State& state) {
  if (skip_without_device(state)) return;
  const int kernels = static_cast<int>(state.range(0));
  Fixture f(kernels);
  constexpr int burst = 8;
  auto burst_of = [&](int mode) {
    const auto start = std::chrono::steady_clock::now();
    for (int b = 0; b < burst; ++b) {
      f.enqueue(mode);
    }
    const auto stop = std::chrono::steady_clock::now();
    f.stream.synchronize();
    return std::chrono::duration<double>(stop - start).count();
  };
  PairedSamples bursts;  // replay against raw, timed next to each other
  for (auto _ : state) {
    (void)bursts.time([&] { return burst_of(replay_graph); }, [&] { return burst_of(raw_graph); });
    state.SetIterationTime(0.0);
  }
  state.counters["raw_ns"] = bursts.baseline_median() / burst * 1e9;
  state.counters["replay_ns"] = bursts.measured_median() / burst * 1e9;
  // The median of the pairs' ratios: the host's speed drifts over the run
  // (a 1000-kernel launch moves by a few percent), and a pair sees one speed.
  state.counters["overhead_ratio"] = bursts.ratio_median();
  state.counters["kernels"] = kernels;
}

// Raw cudaStreamBeginCapture / cudaStreamEndCapture (plus cudaGraphDestroy)
// and replay::capture (which returns an owning Graph that destroys it) of a
// chain of N kernels, timed alternately inside one loop; counters raw_ns and
// replay_ns are the median host nanoseconds per capture over the iterations,
// overhead_ratio their ratio.
void capture_paired(benchmark::State& state) {
  if (skip_without_device(state)) return;
  const int kernels = static_cast<int>(state.range(0));
  replay::Stream stream;
  replay::DeviceBuffer<float> x(kElements);
  const int burst = kernels == 1 ? 8 : 1;
  std::size_t nodes = 0;
  auto raw_burst = [&] {
    const auto start = std::chrono::steady_clock::now();
    for (int b = 0; b < burst; ++b) {
      replay::check(cudaStreamBeginCapture(stream.get(), cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
      chain(stream, x.data(), kernels);
      cudaGraph_t graph = nullptr;
      replay::check(cudaStreamEndCapture(stream.get(), &graph), "cudaStreamEndCapture");
      replay::check(cudaGraphDestroy(graph), "cudaGraphDestroy");
    }
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  auto replay_burst = [&] {
    const auto start = std::chrono::steady_clock::now();
    for (int b = 0; b < burst; ++b) {
      replay::Graph graph = replay::capture(stream, [&](replay::StreamRef s) { chain(s, x.data(), kernels); });
      benchmark::DoNotOptimize(graph.get());
    }
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  PairedSamples bursts;  // replay against raw
  for (auto _ : state) {
    (void)bursts.time(replay_burst, raw_burst);
    state.SetIterationTime(0.0);
  }
  {  // the captured graph holds what was issued (checked once, outside the timing)
    const replay::Graph graph = replay::capture(stream, [&](replay::StreamRef s) { chain(s, x.data(), kernels); });
    nodes = graph.node_count();
  }
  if (nodes != static_cast<std::size_t>(kernels)) {
    state.SkipWithError("replay::capture recorded a different number of nodes");
    return;
  }
  const double raw = bursts.baseline_median() / burst;
  const double replay = bursts.measured_median() / burst;
  state.counters["raw_ns"] = raw * 1e9;
  state.counters["replay_ns"] = replay * 1e9;
  state.counters["overhead_ratio"] = raw > 0.0 ? replay / raw : 0.0;
  state.counters["kernels"] = kernels;
}

void gpu_time(benchmark::State& state) {
  if (skip_without_device(state)) return;
  const int mode = static_cast<int>(state.range(0));
  const int kernels = static_cast<int>(state.range(1));
  Fixture f(kernels);
  auto start = replay::Event::timing();
  auto stop = replay::Event::timing();
  warm_clocks(f);
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

// Raw cudaGraphLaunch and GraphExec::launch, device time, timed alternately
// in one loop on one executable graph so that clock changes hit both alike;
// counters raw_us and replay_us (medians) and replay_over_raw, the median of
// the pairs' ratios. A mean of 100 one-kernel replays moved the ratio from
// 0.95 to 1.04 between runs on H200 hosts: a few replays that wait on the
// device's clock or a preempted host move a mean, not a median.
void gpu_time_paired(benchmark::State& state) {
  if (skip_without_device(state)) return;
  const int kernels = static_cast<int>(state.range(0));
  Fixture f(kernels);
  auto start = replay::Event::timing();
  auto stop = replay::Event::timing();
  warm_clocks(f);
  auto device_ms_of = [&](int mode) {
    start.record(f.stream);
    f.enqueue(mode);
    stop.record(f.stream);
    stop.synchronize();
    return static_cast<double>(replay::Event::elapsed_ms(start, stop));
  };
  PairedSamples replays;  // replay against raw, in ms
  for (auto _ : state) {
    (void)replays.time([&] { return device_ms_of(replay_graph); }, [&] { return device_ms_of(raw_graph); });
    state.SetIterationTime(0.0);
  }
  state.counters["raw_us"] = replays.baseline_median() * 1e3;
  state.counters["replay_us"] = replays.measured_median() * 1e3;
  state.counters["replay_over_raw"] = replays.ratio_median();
  state.counters["kernels"] = kernels;
}

// update: one in-place GraphExec::update (pointers changed, same topology).
// reinstantiate: what update() does when it must fall back, and what a user
// without update pays: destroy the old executable graph, instantiate the new
// one and upload it (the first launch needs it uploaded). Both are timed up to
// the point where the graph is ready to launch (stream synchronized).
void instantiate_vs_update(benchmark::State& state, bool update) {
  if (skip_without_device(state)) return;
  const int nodes = static_cast<int>(state.range(0));
  replay::Stream stream;
  replay::DeviceBuffer<float> a(kElements);
  replay::DeviceBuffer<float> b(kElements);
  auto graph_a = replay::capture(stream, [&](replay::StreamRef s) { chain(s, a.data(), nodes); });
  auto graph_b = replay::capture(stream, [&](replay::StreamRef s) { chain(s, b.data(), nodes); });
  replay::GraphExec exec(graph_a, replay::InstantiateFlags::upload, stream);
  stream.synchronize();
  bool to_b = true;
  for (auto _ : state) {
    const replay::Graph& next = to_b ? graph_b : graph_a;
    const auto start = std::chrono::steady_clock::now();
    if (update) {
      const auto result = exec.update(next);
      if (!result.in_place()) {
        state.SkipWithError("update was not in place");
        break;
      }
    } else {
      { const replay::GraphExec old = std::move(exec); }  // destroy the old one first, as a fallback does
      exec = replay::GraphExec(next, replay::InstantiateFlags::upload, stream);
    }
    stream.synchronize();
    const auto stop = std::chrono::steady_clock::now();
    to_b = !to_b;
    state.SetIterationTime(std::chrono::duration<double>(stop - start).count());
  }
  state.counters["nodes"] = nodes;
}

void reinstantiate(benchmark::State& state) { instantiate_vs_update(state, false); }
void update(benchmark::State& state) { instantiate_vs_update(state, true); }

// Bare cudaGraphInstantiate of a 'nodes'-node graph, for reference.
void instantiate_only(benchmark::State& state) {
  if (skip_without_device(state)) return;
  const int nodes = static_cast<int>(state.range(0));
  replay::Stream stream;
  replay::DeviceBuffer<float> a(kElements);
  auto graph = replay::capture(stream, [&](replay::StreamRef s) { chain(s, a.data(), nodes); });
  for (auto _ : state) {
    const auto start = std::chrono::steady_clock::now();
    replay::GraphExec fresh(graph);
    const auto stop = std::chrono::steady_clock::now();
    state.SetIterationTime(std::chrono::duration<double>(stop - start).count());
  }
  state.counters["nodes"] = nodes;
}

// Iteration counts are fixed where the GPU work per iteration dwarfs the
// timed host work; otherwise --benchmark_min_time (in manual time) would run
// thousands of long iterations.
void launch_args(benchmark::internal::Benchmark* b) {
  b->ArgNames({"mode", "kernels"});
  for (int kernels : {1, 10, 100, 1000}) {
    for (int mode : {eager, raw_graph, replay_graph}) {
      b->Args({mode, kernels});
    }
  }
}

}  // namespace

BENCHMARK(host_enqueue)->Apply(launch_args)->UseManualTime()->Unit(benchmark::kMicrosecond)->Iterations(200);
BENCHMARK(host_launch_paired)->ArgName("kernels")->Arg(1)->UseManualTime()->Iterations(4000);
BENCHMARK(host_launch_paired)->ArgName("kernels")->Arg(1000)->UseManualTime()->Iterations(150);
BENCHMARK(capture_paired)->ArgName("kernels")->Arg(1)->UseManualTime()->Iterations(2000);
BENCHMARK(capture_paired)->ArgName("kernels")->Arg(1000)->UseManualTime()->Iterations(40);
BENCHMARK(gpu_time)->Apply(launch_args)->UseManualTime()->Unit(benchmark::kMicrosecond)->Iterations(50);
BENCHMARK(gpu_time_paired)->ArgName("kernels")->Arg(1)->Arg(1000)->UseManualTime()->Iterations(400);
BENCHMARK(instantiate_only)->ArgName("nodes")->Arg(100)->Arg(1000)->UseManualTime()->Unit(benchmark::kMicrosecond)->Iterations(50);
BENCHMARK(reinstantiate)->ArgName("nodes")->Arg(100)->Arg(1000)->UseManualTime()->Unit(benchmark::kMicrosecond)->Iterations(50);
BENCHMARK(update)->ArgName("nodes")->Arg(100)->Arg(1000)->UseManualTime()->Unit(benchmark::kMicrosecond)->Iterations(50);

BENCHMARK_MAIN();
