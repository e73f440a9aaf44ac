// Host cost of one replay::GraphedCallable call over a raw replay of the same
// graph (Google Benchmark; one input, one output).
//
//  call_overhead/mode:M/batch:B  M = 0 fast mode (GraphedFlags::view_outputs),
//                                M = 1 safe mode (outputs cloned); B = 8 (the
//                                bucket) or 5 (padded to 8: sliced outputs).
//
// The callable is one small elementwise op on a [B, 256] fp32 tensor, so the
// device is never the bottleneck. The raw replay is what hand-written code
// does: one cudaMemcpyAsync of the caller's tensor into the static input and
// one cudaGraphLaunch of an at::cuda::CUDAGraph captured from the same
// callable. Both are timed on the host in bursts of 32 calls, interleaved,
// the stream synchronized between bursts. Counters, medians over the bursts:
// raw_ns and graphed_ns per call, overhead_ns (each pair's graphed - raw;
// overhead_mean_ns: the mean), budget_ns (4000 fast, 8000 safe);
// bench/torch/call_overhead.ratios states the targets.
#include <benchmark/benchmark.h>
#include <torch/torch.h>

#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdint>
#include <vector>

#include "bench_stats.hpp"
#include "replay/torch.hpp"

namespace {

using clock_type = std::chrono::steady_clock;
constexpr int kBurst = 32;
constexpr std::int64_t kBucket = 8;
constexpr std::int64_t kWidth = 256;

double seconds(clock_type::time_point a, clock_type::time_point b) { return std::chrono::duration<double>(b - a).count(); }

void call_overhead(benchmark::State& state) {
  if (!torch::cuda::is_available()) {
    state.SkipWithError("no CUDA device");
    return;
  }
  const bool safe = state.range(0) != 0;
  const std::int64_t batch = state.range(1);
  const auto options = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kFloat);
  auto fn = [](const at::Tensor& x) { return x * 2.0 + 1.0; };

  replay::GraphedCallable graphed(fn, {torch::randn({kBucket, kWidth}, options)},
                                  {.flags = safe ? replay::GraphedFlags::none : replay::GraphedFlags::view_outputs,
                                   .batch_buckets = {kBucket}});
  const at::Tensor input = torch::randn({batch, kWidth}, options);

  // The raw replay: a static input, a CUDAGraph of the same callable, captured
  // the way torch.cuda.graph does (warm-up on a side stream, then capture).
  const at::Tensor static_input = torch::randn({kBucket, kWidth}, options);
  const c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool();
  at::Tensor static_output;
  at::cuda::CUDAGraph raw_graph;
  {
    const c10::cuda::CUDAStreamGuard guard(side);
    c10::InferenceMode inference;
    for (int i = 0; i < 3; ++i) {
      (void)fn(static_input);
    }
    raw_graph.capture_begin();
    static_output = fn(static_input);
    raw_graph.capture_end();
  }
  torch::cuda::synchronize();
  const cudaGraphExec_t raw_exec = raw_graph.raw_cuda_graph_exec();
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream().stream();
  const std::size_t bytes = static_cast<std::size_t>(input.numel()) * sizeof(float);
  auto raw_call = [&] {
    replay::check(cudaMemcpyAsync(static_input.data_ptr(), input.data_ptr(), bytes, cudaMemcpyDeviceToDevice, stream),
                  "cudaMemcpyAsync");
    replay::check(cudaGraphLaunch(raw_exec, stream), "cudaGraphLaunch");
  };
  auto graphed_call = [&] {
    replay::GraphedOutputs out = graphed(input);
    benchmark::DoNotOptimize(out[0].data_ptr());
  };
  for (int i = 0; i < 64; ++i) {  // warm both paths (the fast-mode view cache too)
    raw_call();
    graphed_call();
  }
  torch::cuda::synchronize();
  // Checked once: the graphed result is the callable's.
  if (!torch::allclose(graphed(input).clone()[0], fn(input))) {
    state.SkipWithError("graphed result differs from the callable's");
    return;
  }

  double raw_total = 0.0;
  double graphed_total = 0.0;
  std::int64_t calls = 0;
  std::vector<double> raw_s;
  std::vector<double> graphed_per_call;
  std::vector<double> overhead_s;
  for (auto _ : state) {
    auto start = clock_type::now();
    for (int b = 0; b < kBurst; ++b) {
      raw_call();
    }
    auto stop = clock_type::now();
    const double raw = seconds(start, stop);
    torch::cuda::synchronize();
    start = clock_type::now();
    for (int b = 0; b < kBurst; ++b) {
      graphed_call();
    }
    stop = clock_type::now();
    const double graphed_s = seconds(start, stop);
    torch::cuda::synchronize();
    raw_total += raw;
    graphed_total += graphed_s;
    calls += kBurst;
    raw_s.push_back(raw / kBurst);
    graphed_per_call.push_back(graphed_s / kBurst);
    overhead_s.push_back((graphed_s - raw) / kBurst);
    state.SetIterationTime(graphed_s / kBurst);
  }
  if (graphed.stats().misses != 0) {
    state.SkipWithError("a call missed its graph");
    return;
  }
  // Medians of the paired bursts (the overhead: of each pair's difference), as
  // in the launch and router benchmarks: an allocator or scheduler stall in
  // one burst moves a mean, not a median. The means are reported too.
  state.counters["raw_ns"] = median(raw_s) * 1e9;
  state.counters["graphed_ns"] = median(graphed_per_call) * 1e9;
  state.counters["overhead_ns"] = median(overhead_s) * 1e9;
  state.counters["overhead_mean_ns"] = (graphed_total - raw_total) / static_cast<double>(calls) * 1e9;
  state.counters["budget_ns"] = safe ? 8000.0 : 4000.0;
  state.SetLabel(safe ? "safe mode" : "fast mode");
}

BENCHMARK(call_overhead)
    ->ArgNames({"mode", "batch"})
    ->ArgsProduct({{0, 1}, {kBucket, 5}})
    ->UseManualTime()
    // The manual time is per call, so 0.05 s of it is thousands of bursts of 32
    // calls (hundreds of thousands of calls) per entry, each burst with its two
    // synchronizations: a few seconds of wall time per entry.
    ->MinTime(0.05)
    ->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
