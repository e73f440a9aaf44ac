// A piecewise executable against what it replaces and what it competes with:
// 2 x 500 tiny kernels with a host region between them (a read-back of one
// value and a decision on it that picks the second half's kernels). Each
// iteration times one run end to end (enqueue to stream synchronized), paired
// with a baseline timed next to it:
//
//  piecewise_paired/baseline:0  one graph of the 1000 kernels, then the region
//                               alone: what the work would cost if the region
//                               could sit at the end (break_us: the median cost
//                               of the break, an extra launch plus the region's
//                               synchronization in the middle)
//  piecewise_paired/baseline:1  the same two halves with raw CUDA: three graphs
//                               captured and instantiated by hand, the region
//                               in plain code choosing the second one (replay's
//                               own overhead)
//  piecewise_paired/baseline:2  eager: the 1000 launches and the region
//
// Counters: piecewise_us and baseline_us (medians), ratio (the median of the
// pairs' piecewise / baseline), break_us (the median of the pairs' difference).
#include <benchmark/benchmark.h>

#include "bench_device.hpp"
#include "bench_stats.hpp"

#include <chrono>
#include <cuda_runtime.h>

#include "replay/replay.hpp"

namespace {

constexpr int kElements = 256;  // one block: launch cost, not work, dominates
constexpr int kHalf = 500;

__global__ void tiny_kernel(float* x, float a) { x[threadIdx.x] = a * x[threadIdx.x] + 1.0F; }

void half(replay::StreamRef s, float* x, float a) {
  for (int k = 0; k < kHalf; ++k) {
    tiny_kernel<<<1, kElements, 0, s.get()>>>(x, a);
  }
  replay::check_last_launch();
}

struct Bench {
  replay::Stream stream;
  replay::DeviceBuffer<float> x{kElements};
  float* host_value = nullptr;  // pinned: the region's read-back

  Bench() {
    replay::check(cudaMallocHost(&host_value, sizeof(float)), "cudaMallocHost");
    x.fill(1.0F, stream);
    stream.synchronize();
  }
  Bench(const Bench&) = delete;
  Bench& operator=(const Bench&) = delete;
  ~Bench() { (void)cudaFreeHost(host_value); }

  // The region: read one value back, decide on it. x converges to 2 under
  // x = 0.5x + 1, so the decision is the same from run to run (one path).
  int decide(replay::StreamRef s) const {
    replay::check(cudaMemcpyAsync(host_value, x.data(), sizeof(float), cudaMemcpyDeviceToHost, s.get()),
                  "cudaMemcpyAsync");
    replay::check(cudaStreamSynchronize(s.get()), "cudaStreamSynchronize");
    return *host_value > 1.5F ? 1 : 0;
  }
  static float second_half_factor(int decision) { return decision != 0 ? 0.5F : 0.25F; }

  void eager() {
    half(stream, x.data(), 0.5F);
    half(stream, x.data(), second_half_factor(decide(stream)));
  }
};

replay::Graph raw_capture(replay::StreamRef s, float* x, float a, int halves) {
  replay::check(cudaStreamBeginCapture(s.get(), cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
  for (int h = 0; h < halves; ++h) {
    half(s, x, h == 0 ? 0.5F : a);
  }
  cudaGraph_t graph = nullptr;
  replay::check(cudaStreamEndCapture(s.get(), &graph), "cudaStreamEndCapture");
  return replay::Graph::from_native_handle(graph);
}
cudaGraphExec_t raw_instantiate(const replay::Graph& graph) {
  cudaGraphExec_t exec = nullptr;
  replay::check(cudaGraphInstantiate(&exec, graph.get(), 0), "cudaGraphInstantiate");
  return exec;
}

void piecewise_paired(benchmark::State& state) {
  if (skip_without_device(state)) return;
  const int baseline = static_cast<int>(state.range(0));
  Bench b;
  auto exec = replay::capture_piecewise(b.stream, [&](replay::StreamRef s) {
    half(s, b.x.data(), 0.5F);
    const int decision = replay::eager(s, "read back and decide", [&](replay::StreamRef r) { return b.decide(r); });
    half(s, b.x.data(), Bench::second_half_factor(decision));
  });
  // One graph of all 1000 kernels (the region after it), and the raw halves.
  const replay::Graph whole = raw_capture(b.stream, b.x.data(), 0.5F, 2);
  const replay::Graph first = raw_capture(b.stream, b.x.data(), 0.5F, 1);
  replay::Graph second[2];
  for (int d = 0; d < 2; ++d) {
    replay::check(cudaStreamBeginCapture(b.stream.get(), cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
    half(b.stream, b.x.data(), Bench::second_half_factor(d));
    cudaGraph_t graph = nullptr;
    replay::check(cudaStreamEndCapture(b.stream.get(), &graph), "cudaStreamEndCapture");
    second[d] = replay::Graph::from_native_handle(graph);
  }
  const cudaGraphExec_t whole_exec = raw_instantiate(whole);
  const cudaGraphExec_t first_exec = raw_instantiate(first);
  const cudaGraphExec_t second_exec[2] = {raw_instantiate(second[0]), raw_instantiate(second[1])};
  auto timed = [&](auto&& run) {
    const auto start = std::chrono::steady_clock::now();
    run();
    b.stream.synchronize();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  auto run_piecewise = [&] { return timed([&] { exec.launch(b.stream); }); };
  auto run_baseline = [&] {
    switch (baseline) {
      case 0:
        return timed([&] {
          replay::check(cudaGraphLaunch(whole_exec, b.stream.get()), "cudaGraphLaunch");
          (void)b.decide(b.stream);
        });
      case 1:
        return timed([&] {
          replay::check(cudaGraphLaunch(first_exec, b.stream.get()), "cudaGraphLaunch");
          replay::check(cudaGraphLaunch(second_exec[b.decide(b.stream)], b.stream.get()), "cudaGraphLaunch");
        });
      default: return timed([&] { b.eager(); });
    }
  };
  // Warm the clocks (an idle GPU runs at a fraction of its clock) and both paths.
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(100);
  while (std::chrono::steady_clock::now() < until) {
    (void)run_piecewise();
    (void)run_baseline();
  }
  PairedSamples runs;
  for (auto _ : state) {
    (void)runs.time(run_piecewise, run_baseline);
    state.SetIterationTime(0.0);
  }
  state.counters["piecewise_us"] = runs.measured_median() * 1e6;
  state.counters["baseline_us"] = runs.baseline_median() * 1e6;
  state.counters["ratio"] = runs.ratio_median();
  state.counters["break_us"] = runs.difference_median() * 1e6;
  state.counters["paths"] = static_cast<double>(exec.path_count());
  for (cudaGraphExec_t e : {whole_exec, first_exec, second_exec[0], second_exec[1]}) {
    (void)cudaGraphExecDestroy(e);
  }
}

}  // namespace

BENCHMARK(piecewise_paired)->ArgName("baseline")->Arg(0)->Arg(1)->Arg(2)->UseManualTime()->Iterations(300);

BENCHMARK_MAIN();
