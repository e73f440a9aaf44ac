// What bucket graphs cost and what they win: the device memory of 1, 8 and 32
// bucket graphs sharing the graph pool against buffers of their own, a
// dynamic-batch workload served eagerly against through the router, and the
// time capture_all takes for 32 buckets (targets:
// bench/shape_router_buckets_bench.ratios).
//
//  pool_memory/<buckets>/<shared>: device memory of 1, 8 or 32 bucket graphs whose
//                             captured work allocates scratch with cudaMallocAsync (shared
//                             graph pool, shared:1) or owns a scratch buffer each (separate,
//                             shared:0). Counters in MiB: device (cudaMemGetInfo drop),
//                             pool_reserved (graph pool high watermark), alloc_sum.
//  dynamic_batch/<mode>:      a stream of requests with random batch sizes 1..64, each a
//                             chain of 100 small kernels: eager (0), routed with exact
//                             keys (1), routed with power-of-two buckets (2), or raw CUDA
//                             graphs of the same buckets picked by hand (3: cudaStreamBeginCapture
//                             per bucket, then cudaGraphLaunch of the request's bucket). Time per
//                             burst of 32 requests, enqueued back to back, then synchronized.
//  startup/<threads>:         capture_all of 32 buckets of a 100-kernel graph with
//                             capture_threads = 1 or 4 (wall time per capture_all).
#include <benchmark/benchmark.h>

#include "shape_router_bench.hpp"

#include <algorithm>
#include <bit>
#include <chrono>
#include <cstdint>
#include <span>
#include <vector>

#include "replay/replay.hpp"
#include "replay/shape_router.hpp"

namespace shape_router_bench {
namespace {

using clock_type = std::chrono::steady_clock;
constexpr double kMiB = 1024.0 * 1024.0;

__global__ void scratch_kernel(float* scratch, std::size_t elems, float* y, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) {
    const std::size_t slot = (static_cast<std::size_t>(i) * 7919U) % elems;
    scratch[slot] = y[i];
    y[i] = scratch[slot] + 1.0F;
  }
}

// ---- pool_memory: shared graph pool vs separate buffers --------------------------

void pool_memory(benchmark::State& state) {
  if (skip_without_device(state)) return;
  const int buckets = static_cast<int>(state.range(0));
  const bool shared = state.range(1) != 0;
  constexpr std::size_t kLargest = 64ULL << 20;  // the largest bucket's scratch
  constexpr int kCols = 64;
  const int device = replay::current_device();
  replay::Stream stream;
  replay::DeviceBuffer<float> y(static_cast<std::size_t>(buckets) * kCols);
  y.zero(stream);
  std::vector<std::int64_t> bucket_list;
  std::size_t alloc_sum = 0;
  for (int b = 1; b <= buckets; ++b) {
    bucket_list.push_back(b);
    alloc_sum += kLargest * static_cast<std::size_t>(b) / static_cast<std::size_t>(buckets);
  }
  auto scratch_bytes = [&](int batch) {
    return kLargest * static_cast<std::size_t>(batch) / static_cast<std::size_t>(buckets);
  };
  double device_mib = 0.0;
  double reserved_mib = 0.0;
  for (auto _ : state) {
    replay::synchronize_device();
    replay::trim_graph_pool(device);
    replay::reset_graph_pool_high_watermarks(device);
    std::size_t free_before = 0;
    std::size_t total = 0;
    replay::check(cudaMemGetInfo(&free_before, &total), "cudaMemGetInfo");
    const auto start = clock_type::now();
    {
      std::vector<replay::DeviceBuffer<float>> own;  // separate: one scratch buffer per bucket
      if (!shared) {
        for (int b = 1; b <= buckets; ++b) {
          own.emplace_back(scratch_bytes(b) / sizeof(float));
        }
      }
      replay::ShapeRouter<int> router(
          [&](int batch, replay::StreamRef s) {
            const std::size_t bytes = scratch_bytes(batch);
            float* scratch = nullptr;
            if (shared) {
              replay::check(cudaMallocAsync(reinterpret_cast<void**>(&scratch), bytes, s.get()), "cudaMallocAsync");
            } else {
              scratch = own[static_cast<std::size_t>(batch - 1)].data();
            }
            scratch_kernel<<<blocks(batch * kCols), 256, 0, s.get()>>>(scratch, bytes / sizeof(float), y.data(),
                                                                       batch * kCols);
            replay::check_last_launch("scratch_kernel");
            if (shared) {
              replay::check(cudaFreeAsync(scratch, s.get()), "cudaFreeAsync");
            }
          },
          replay::ShapeRouterOptions<int>::bucketed(bucket_list));
      if (router.capture_all(stream) != static_cast<std::size_t>(buckets)) {
        state.SkipWithError("capture failed");
        return;
      }
      for (int b = 1; b <= buckets; ++b) {
        (void)router.run(b, stream);
      }
      stream.synchronize();
      std::size_t free_after = 0;
      replay::check(cudaMemGetInfo(&free_after, &total), "cudaMemGetInfo");
      device_mib = static_cast<double>(free_before - std::min(free_before, free_after)) / kMiB;
      reserved_mib = static_cast<double>(replay::graph_pool_memory(device).reserved_high) / kMiB;
    }
    state.SetIterationTime(seconds_since(start));
  }
  replay::synchronize_device();
  replay::trim_graph_pool(device);
  state.counters["device_MiB"] = device_mib;
  state.counters["pool_reserved_MiB"] = reserved_mib;
  state.counters["alloc_sum_MiB"] = static_cast<double>(alloc_sum) / kMiB;
  state.counters["largest_MiB"] = static_cast<double>(kLargest) / kMiB;
  state.SetLabel(shared ? "shared graph pool" : "separate buffers");
}

// ---- dynamic_batch: eager vs exact keys vs buckets ------------------------------

// The raw CUDA baseline of the bucketed router: one graph per power-of-two
// bucket, captured and instantiated by hand, the request's bucket found by
// bit arithmetic and launched.
class RawBucketGraphs {
 public:
  RawBucketGraphs() = default;
  RawBucketGraphs(const RawBucketGraphs&) = delete;
  RawBucketGraphs& operator=(const RawBucketGraphs&) = delete;
  ~RawBucketGraphs() {
    for (auto [graph, exec] : graphs_) {
      (void)cudaGraphExecDestroy(exec);
      (void)cudaGraphDestroy(graph);
    }
  }
  template <class Work>
  void add(int bucket, replay::StreamRef stream, Work& work) {
    cudaGraph_t graph = nullptr;
    replay::check(cudaStreamBeginCapture(stream.get(), cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
    work(bucket, stream);
    replay::check(cudaStreamEndCapture(stream.get(), &graph), "cudaStreamEndCapture");
    cudaGraphExec_t exec = nullptr;
    replay::check(cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate");
    graphs_.emplace_back(graph, exec);
  }
  void launch(int batch, replay::StreamRef stream) const {
    const auto bucket = std::bit_ceil(static_cast<unsigned>(batch));
    replay::check(cudaGraphLaunch(graphs_[static_cast<std::size_t>(std::countr_zero(bucket))].second, stream.get()),
                  "cudaGraphLaunch");
  }

 private:
  std::vector<std::pair<cudaGraph_t, cudaGraphExec_t>> graphs_;  // bucket 1, 2, 4, ...
};

void dynamic_batch(benchmark::State& state) {
  if (skip_without_device(state)) return;
  const int mode = static_cast<int>(state.range(0));
  constexpr int kMaxBatch = 64;
  constexpr int kCols = 64;
  constexpr int kKernels = 100;
  constexpr int kBurst = 32;
  replay::Stream stream;
  replay::DeviceBuffer<float> x(static_cast<std::size_t>(kMaxBatch) * kCols);
  x.zero(stream);
  auto model = [&](int batch, replay::StreamRef s) {
    const int n = batch * kCols;
    for (int k = 0; k < kKernels; ++k) {
      tiny_kernel<<<blocks(n), 256, 0, s.get()>>>(x.data(), n, k % 2 == 0 ? 0.5F : 1.5F);
    }
    replay::check_last_launch("tiny_kernel chain");
  };
  replay::ShapeRouter<int> exact(model);
  replay::ShapeRouter<int> bucketed(model,
                                    replay::ShapeRouterOptions<int>::bucketed(replay::power_of_two_buckets(kMaxBatch)));
  if (mode == 1) {
    std::vector<int> all(kMaxBatch);
    for (int b = 1; b <= kMaxBatch; ++b) {
      all[static_cast<std::size_t>(b - 1)] = b;
    }
    exact.capture(std::span<const int>(all), stream);
  } else if (mode == 2) {
    bucketed.capture_all(stream);
  }
  RawBucketGraphs raw;
  if (mode == 3) {
    for (int bucket = 1; bucket <= kMaxBatch; bucket *= 2) {
      raw.add(bucket, stream, model);
    }
  }
  const auto batches = random_batches(4096, kMaxBatch);
  std::size_t next = 0;
  auto serve = [&](int batch) {
    switch (mode) {
      case 0: model(batch, stream); break;
      case 1: (void)exact.run(batch, stream); break;
      case 2: (void)bucketed.run(batch, stream); break;
      default: raw.launch(batch, stream); break;
    }
  };
  for (int i = 0; i < kBurst; ++i) {
    serve(batches[next++ & 4095]);
  }
  stream.synchronize();
  std::int64_t requests = 0;
  double total_seconds = 0.0;
  for (auto _ : state) {
    const auto start = clock_type::now();
    for (int i = 0; i < kBurst; ++i) {
      serve(batches[next++ & 4095]);
    }
    stream.synchronize();
    const double elapsed = seconds_since(start);
    state.SetIterationTime(elapsed);
    total_seconds += elapsed;
    requests += kBurst;
  }
  const auto& router = mode == 1 ? exact : bucketed;
  if ((mode == 1 || mode == 2) && router.stats().misses != 0) {
    state.SkipWithError("router missed after capture");
    return;
  }
  state.counters["requests"] = static_cast<double>(requests);
  state.counters["us_per_request"] = total_seconds / static_cast<double>(std::max<std::int64_t>(requests, 1)) * 1e6;
  if (mode == 1 || mode == 2) {
    state.counters["graphs"] = static_cast<double>(router.graph_count());
    state.counters["padding_waste"] = router.stats().padding_waste();
  }
  const char* const names[] = {"eager", "router exact keys", "router buckets", "raw bucket graphs"};
  state.SetLabel(names[mode]);
}


// ---- startup: capture_all on 1 or 4 threads ------------------------------------

void startup(benchmark::State& state) {
  if (skip_without_device(state)) {
    return;
  }
  const auto threads = static_cast<std::uint32_t>(state.range(0));
  constexpr int kKernels = 100;
  constexpr int kBuckets = 32;
  constexpr int n = 1024;
  replay::Stream stream;
  replay::DeviceBuffer<float> x(static_cast<std::size_t>(n) * kBuckets);
  std::vector<std::int64_t> buckets;
  for (int b = 1; b <= kBuckets; ++b) {
    buckets.push_back(b);
  }
  auto options = replay::ShapeRouterOptions<int>::bucketed(buckets);
  options.capture_threads = threads;
  for (auto _ : state) {
    replay::ShapeRouter<int> router(
        [&](int batch, replay::StreamRef s) {
          for (int k = 0; k < kKernels; ++k) {
            tiny_kernel<<<static_cast<unsigned>(batch), n, 0, s.get()>>>(x.data(), n * batch, 1.0F);
          }
          replay::check_last_launch("tiny_kernel");
        },
        options);
    const auto start = clock_type::now();
    const std::size_t graphed = router.capture_all(stream);
    stream.synchronize();
    state.SetIterationTime(seconds_since(start));
    if (graphed != kBuckets) {
      state.SkipWithError("not every bucket was captured");
      return;
    }
  }
  state.counters["buckets"] = kBuckets;
}

BENCHMARK(pool_memory)
    ->ArgNames({"buckets", "shared"})
    ->Args({1, 1})
    ->Args({8, 1})
    ->Args({32, 1})
    ->Args({1, 0})
    ->Args({8, 0})
    ->Args({32, 0})
    ->Iterations(1)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(dynamic_batch)->ArgName("mode")->Arg(0)->Arg(1)->Arg(2)->Arg(3)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(startup)->ArgName("threads")->Arg(1)->Arg(4)->Iterations(3)->UseManualTime()->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace shape_router_bench

BENCHMARK_MAIN();
