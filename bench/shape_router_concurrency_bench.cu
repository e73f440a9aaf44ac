// ShapeRouter hits from many threads, and a hit's latency while another
// thread captures: the router's against the driver's own stall of a launch
// during another thread's capture (targets:
// bench/shape_router_concurrency_bench.ratios).
//
//  hit_rate/<shared>/threads:N: aggregate hits per second (runs_per_s) of 1-kernel graphs
//                             from N threads, each on its own stream, with one router per
//                             thread (shared:0) or one router shared by all (shared:1:
//                             every run switches streams and is ordered after the previous).
//  hit_latency/<capturing>:   p50/p99 host latency of hits on one key while another
//                             thread keeps capturing a 100-kernel graph of other keys in
//                             the same router (capturing:1), or not (capturing:0).
//  hit_latency_raw/<capturing>: the same with raw CUDA and no router: p50/p99 of
//                             cudaGraphLaunch of a 1-kernel graph while another thread
//                             loops over raw stream capture of a 100-kernel graph,
//                             cudaGraphInstantiate, cudaGraphUpload, one launch and
//                             cudaGraphExecDestroy (what the router's capture path does),
//                             or not. The driver's own stall of a launch during another
//                             thread's capture and instantiation, measured in the same run.
#include <benchmark/benchmark.h>

#include "shape_router_bench.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#include "replay/replay.hpp"
#include "replay/shape_router.hpp"

namespace shape_router_bench {
namespace {

using clock_type = std::chrono::steady_clock;

// ---- hit_rate: hits from many threads ---------------------------------------------

std::unique_ptr<replay::ShapeRouter<int>> g_shared_router;
std::unique_ptr<replay::DeviceBuffer<float>> g_shared_buffer;

void hit_rate(benchmark::State& state) {
  if (skip_without_device(state)) {
    return;
  }
  const bool shared = state.range(0) != 0;
  constexpr int n = 256;
  // The shared router is run from every thread's stream with no copies of
  // the caller's around it: the router's own ordering is what is measured.
  auto make_router = [](float* x) {
    return std::make_unique<replay::ShapeRouter<int>>(
        [x](int, replay::StreamRef s) {
          tiny_kernel<<<1, n, 0, s.get()>>>(x, n, 1.0F);
          replay::check_last_launch("tiny_kernel");
        },
        replay::ShapeRouterOptions<int>{.stream_sharing = replay::StreamSharing::caller_ordered});
  };
  replay::Stream stream;
  replay::DeviceBuffer<float> own_buffer(n);
  std::unique_ptr<replay::ShapeRouter<int>> own;
  if (shared) {
    if (state.thread_index() == 0) {
      g_shared_buffer = std::make_unique<replay::DeviceBuffer<float>>(n);
      g_shared_router = make_router(g_shared_buffer->data());
      g_shared_router->capture({1}, stream);
      stream.synchronize();
    }
  } else {
    own = make_router(own_buffer.data());
    own->capture({1}, stream);
    stream.synchronize();
  }
  std::int64_t runs = 0;
  for (auto _ : state) {
    replay::ShapeRouter<int>& router = shared ? *g_shared_router : *own;
    for (int i = 0; i < 64; ++i) {
      (void)router.run(1, stream);
    }
    runs += 64;
    if ((runs & 1023) == 0) {
      stream.synchronize();  // keep the queue short
    }
  }
  stream.synchronize();
  state.counters["runs_per_s"] = benchmark::Counter(static_cast<double>(runs), benchmark::Counter::kIsRate);
  if (shared && state.thread_index() == 0) {
    state.counters["stream_switches"] = static_cast<double>(g_shared_router->stats().stream_switches);
  }
}

// ---- hit_latency, hit_latency_raw: a hit while another thread captures ----------------

// The captured graph's kernels, and the elements of each.
constexpr int kLatencyKernels = 100;
constexpr int kLatencyElements = 256;

// Host latency of `hit` (20000 samples per iteration, the stream drained every 256).
template <class Hit>
std::vector<double> latency_samples(benchmark::State& state, replay::Stream& stream, Hit&& hit) {
  std::vector<double> samples;
  samples.reserve(1 << 16);
  for (auto _ : state) {
    samples.clear();
    const auto begin = clock_type::now();
    for (int i = 0; i < 20000; ++i) {
      const auto start = clock_type::now();
      hit();
      samples.push_back(std::chrono::duration<double, std::nano>(clock_type::now() - start).count());
      if ((i & 255) == 255) {
        stream.synchronize();
      }
    }
    state.SetIterationTime(seconds_since(begin));
  }
  return samples;
}

void report_latency(benchmark::State& state, std::vector<double> samples, std::int64_t captures) {
  std::sort(samples.begin(), samples.end());
  state.counters["p50_ns"] = samples[samples.size() / 2];
  state.counters["p99_ns"] = samples[samples.size() * 99 / 100];
  state.counters["captures"] = static_cast<double>(captures);
}

void hit_latency(benchmark::State& state) {
  if (skip_without_device(state)) {
    return;
  }
  const bool capturing = state.range(0) != 0;
  constexpr int kKernels = kLatencyKernels;
  constexpr int n = kLatencyElements;
  replay::Stream stream;
  replay::DeviceBuffer<float> x(n);
  replay::ShapeRouter<int> router(
      [&](int key, replay::StreamRef s) {
        const int kernels = key == 1 ? 1 : kKernels;
        for (int k = 0; k < kernels; ++k) {
          tiny_kernel<<<1, n, 0, s.get()>>>(x.data(), n, 1.0F);
        }
        replay::check_last_launch("tiny_kernel");
      },
      {.max_graphs = 4});
  router.capture({1}, stream);
  stream.synchronize();
  std::atomic<bool> stop{false};
  std::atomic<std::int64_t> captures{0};
  std::thread capturer;
  if (capturing) {
    capturer = std::thread([&] {
      for (int key = 2; !stop.load(); ++key) {
        (void)router.run(key, stream);  // a miss: capture, then launch (same stream: no switch)
        ++captures;
      }
    });
    while (captures.load() == 0) {
      std::this_thread::yield();
    }
  }
  const std::vector<double> samples = latency_samples(state, stream, [&] { (void)router.run(1, stream); });
  stop = true;
  if (capturer.joinable()) {
    capturer.join();
  }
  stream.synchronize();
  report_latency(state, samples, captures.load());
}

void hit_latency_raw(benchmark::State& state) {
  if (skip_without_device(state)) {
    return;
  }
  replay::Stream capture_stream(replay::StreamFlags::non_blocking);
  replay::Stream stream;
  replay::DeviceBuffer<float> x(kLatencyElements);
  const bool capturing = state.range(0) != 0;
  constexpr int kKernels = kLatencyKernels;
  constexpr int n = kLatencyElements;
  auto issue = [&](int kernels, cudaStream_t s) {
    for (int k = 0; k < kernels; ++k) {
      tiny_kernel<<<1, n, 0, s>>>(x.data(), n, 1.0F);
    }
    replay::check_last_launch("tiny_kernel");
  };
  cudaGraph_t hit_graph = nullptr;
  replay::check(cudaStreamBeginCapture(capture_stream.get(), cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
  issue(1, capture_stream.get());
  replay::check(cudaStreamEndCapture(capture_stream.get(), &hit_graph), "cudaStreamEndCapture");
  cudaGraphExec_t hit_exec = nullptr;
  replay::check(cudaGraphInstantiate(&hit_exec, hit_graph, 0), "cudaGraphInstantiate");
  replay::check(cudaGraphUpload(hit_exec, stream.get()), "cudaGraphUpload");
  stream.synchronize();
  std::atomic<bool> stop{false};
  std::atomic<std::int64_t> captures{0};
  std::atomic<bool> failed{false};
  std::thread capturer;
  if (capturing) {
    capturer = std::thread([&] {
      try {
        while (!stop.load()) {
          cudaGraph_t graph = nullptr;
          replay::check(cudaStreamBeginCapture(capture_stream.get(), cudaStreamCaptureModeThreadLocal),
                        "cudaStreamBeginCapture");
          issue(kKernels, capture_stream.get());
          replay::check(cudaStreamEndCapture(capture_stream.get(), &graph), "cudaStreamEndCapture");
          cudaGraphExec_t exec = nullptr;
          replay::check(cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate");
          replay::check(cudaGraphDestroy(graph), "cudaGraphDestroy");
          replay::check(cudaGraphUpload(exec, stream.get()), "cudaGraphUpload");
          replay::check(cudaGraphLaunch(exec, stream.get()), "cudaGraphLaunch");
          replay::check(cudaGraphExecDestroy(exec), "cudaGraphExecDestroy");
          ++captures;
        }
      } catch (...) {
        failed = true;
        ++captures;
      }
    });
    while (captures.load() == 0) {
      std::this_thread::yield();
    }
  }
  const std::vector<double> samples = latency_samples(state, stream, [&] {
    replay::check(cudaGraphLaunch(hit_exec, stream.get()), "cudaGraphLaunch");
  });
  stop = true;
  if (capturer.joinable()) {
    capturer.join();
  }
  stream.synchronize();
  replay::check(cudaGraphExecDestroy(hit_exec), "cudaGraphExecDestroy");
  replay::check(cudaGraphDestroy(hit_graph), "cudaGraphDestroy");
  if (failed.load()) {
    state.SkipWithError("the raw capture loop failed");
    return;
  }
  report_latency(state, samples, captures.load());
}

BENCHMARK(hit_rate)->ArgName("shared")->Arg(0)->Arg(1)->ThreadRange(1, 8)->UseRealTime();
BENCHMARK(hit_latency)->ArgName("capturing")->Arg(0)->Arg(1)->Iterations(3)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(hit_latency_raw)
    ->ArgName("capturing")
    ->Arg(0)
    ->Arg(1)
    ->Iterations(3)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace shape_router_bench

BENCHMARK_MAIN();
