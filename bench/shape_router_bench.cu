// ShapeRouter benchmarks; all in one program so scripts/bench_ratios.py can
// report ratios from one run.
//
//  route_only/<policy>:       host time of run() with a backend whose launch does
//                             nothing: the routing itself (lookup, rounding, stats, lock).
//  route_cold/<routed>:       run() with a stand-in launch that walks 256 KiB of host memory
//                             (routed:1) against the walk alone (routed:0), interleaved;
//                             overhead_ns = routed - walk: the routing with the host cache
//                             disturbed between hits, as a launch does. Needs no GPU.
//  route_launch/<mode>:       host time of one launch of a 1-kernel graph, raw
//                             cudaGraphLaunch (mode 0) vs ShapeRouter::run on a hit
//                             (mode 1); the two are measured in interleaved bursts (which
//                             goes first alternates) in both
//                             entries, and each reports the medians over the bursts: raw_ns,
//                             routed_ns, overhead_ns = routed - raw of each pair (budget_ns =
//                             100), overhead_ratio = routed / raw of each pair, and
//                             overhead_mean_ns. The ratio is the target: the router's few
//                             cache misses around a launch cost what the host's speed makes
//                             them, as the launch does (+60 ns at a 1.54 us launch, +112 ns at
//                             2.19 us on one H200 host within minutes; 1.04 to 1.05 both times).
//  pool_memory/<buckets>/<shared>: device memory of 1, 8 or 32 bucket graphs whose
//                             captured work allocates scratch with cudaMallocAsync (shared
//                             graph pool, shared:1) or owns a scratch buffer each (separate,
//                             shared:0). Counters in MiB: device (cudaMemGetInfo drop),
//                             pool_reserved (graph pool high watermark), alloc_sum.
//  dynamic_batch/<mode>:      a stream of requests with random batch sizes 1..64, each a
//                             chain of 100 small kernels: eager (0), routed with exact
//                             keys (1), routed with power-of-two buckets (2). Time per
//                             burst of 32 requests, enqueued back to back, then synchronized.
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
//  startup/<threads>:         capture_all of 32 buckets of a 100-kernel graph with
//                             capture_threads = 1 or 4 (wall time per capture_all).
#include <benchmark/benchmark.h>

#include "bench_stats.hpp"

#include <bit>

#include <algorithm>
#include <atomic>
#include <memory>
#include <thread>
#include <chrono>
#include <cstdint>
#include <random>
#include <vector>

#include "replay/replay.hpp"
#include "replay/shape_router.hpp"

// A backend that captures and launches nothing (named namespace: nvcc warns
// about unreferenced members of internal-linkage types checked by a concept).
namespace shape_router_bench {
struct NullExec {};
struct NullBackend {
  using stream_type = int;
  using exec_type = NullExec;
  template <class Issue>
  replay::CapturedGraph<NullExec> capture(int, Issue&&, std::source_location) {
    return {};
  }
  template <class Issue>
  replay::RecaptureResult recapture(NullExec&, int, Issue&&, std::source_location) {
    return {};
  }
  void launch(const NullExec&, int, std::source_location) {}
};
// route_cold's: launches walk a host buffer.
struct ColdBackend : NullBackend {
  std::vector<char>* scratch = nullptr;
  void launch(const NullExec&, int, std::source_location) const { walk(*scratch); }
  static void walk(std::vector<char>& buffer) {
    for (std::size_t i = 0; i < buffer.size(); i += 64) {
      buffer[i] = static_cast<char>(buffer[i] + 1);
    }
    benchmark::ClobberMemory();
  }
};
}  // namespace shape_router_bench

namespace {

using clock_type = std::chrono::steady_clock;
constexpr double kMiB = 1024.0 * 1024.0;

bool skip_without_device(benchmark::State& state) {
  if (!replay::has_device()) {
    state.SkipWithError("no CUDA device");
    return true;
  }
  return false;
}

double seconds(clock_type::time_point a, clock_type::time_point b) { return std::chrono::duration<double>(b - a).count(); }

__global__ void tiny_kernel(float* x, int n, float a) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) {
    x[i] = a * x[i] + 1.0F;
  }
}

__global__ void scratch_kernel(float* scratch, std::size_t elems, float* y, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) {
    const std::size_t slot = (static_cast<std::size_t>(i) * 7919U) % elems;
    scratch[slot] = y[i];
    y[i] = scratch[slot] + 1.0F;
  }
}

unsigned blocks(int n) { return static_cast<unsigned>((n + 255) / 256); }

std::vector<int> random_batches(std::size_t count, int max) {
  std::mt19937 rng{std::random_device{}()};
  std::uniform_int_distribution<int> dist(1, max);
  std::vector<int> out(count);
  for (int& b : out) {
    b = dist(rng);
  }
  return out;
}

// ---- route_only: the router's own cost, no CUDA --------------------------------

using shape_router_bench::NullBackend;

void route_only(benchmark::State& state) {
  const bool bucketed = state.range(0) != 0;
  auto options = bucketed ? replay::ShapeRouterOptions<int>::bucketed(replay::power_of_two_buckets(64))
                          : replay::ShapeRouterOptions<int>::exact();
  replay::ShapeRouter<int, NullBackend> router([](int, int) {}, options);
  const auto keys = random_batches(4096, 64);
  for (int k : keys) {
    (void)router.run(k, 0);  // capture everything first: then every run is a hit
  }
  std::size_t i = 0;
  for (auto _ : state) {
    benchmark::DoNotOptimize(router.run(keys[i++ & 4095], 0));
  }
  state.SetLabel(bucketed ? "bucketed" : "exact");
}

// ---- route_cold: the routing with the host cache disturbed between hits ----------
//
// A launch runs microseconds of driver code that evicts much of what the
// router read from the host's caches, so a hit pays for every cache line it
// touches. The stand-in launch here walks a buffer (256 KiB, one write per
// cache line) instead: routed:1 is run() with that launch, routed:0 the walk
// alone; the difference is the router's cost with cold caches, on any machine.

void route_cold(benchmark::State& state) {
  const bool report_routed = state.range(0) != 0;
  constexpr int kBurst = 32;
  std::vector<char> scratch(256 << 10);
  shape_router_bench::ColdBackend backend;
  backend.scratch = &scratch;
  replay::ShapeRouter<int, shape_router_bench::ColdBackend> router(
      [](int, int) {}, replay::ShapeRouterOptions<int>::bucketed(replay::power_of_two_buckets(64)), backend);
  const auto keys = random_batches(4096, 64);
  for (int k : keys) {
    (void)router.run(k, 0);
  }
  // Interleaved bursts, as in route_launch, so that drift cancels.
  std::size_t i = 0;
  double walk_total = 0.0;
  double routed_total = 0.0;
  std::int64_t runs = 0;
  for (auto _ : state) {
    auto start = clock_type::now();
    for (int b = 0; b < kBurst; ++b) {
      benchmark::DoNotOptimize(keys[i++ & 4095]);
      shape_router_bench::ColdBackend::walk(scratch);
    }
    const double walk = seconds(start, clock_type::now());
    start = clock_type::now();
    for (int b = 0; b < kBurst; ++b) {
      benchmark::DoNotOptimize(router.run(keys[i++ & 4095], 0));
    }
    const double routed = seconds(start, clock_type::now());
    walk_total += walk;
    routed_total += routed;
    runs += kBurst;
    state.SetIterationTime((report_routed ? routed : walk) / kBurst);
  }
  const double n = static_cast<double>(std::max<std::int64_t>(runs, 1));
  state.counters["overhead_ns"] = (routed_total - walk_total) / n * 1e9;
  state.SetLabel(report_routed ? "ShapeRouter::run (hit), stand-in launch walks 256 KiB" : "the walk alone");
}

// ---- route_launch: router hit vs raw cudaGraphLaunch -----------------------------

void route_launch(benchmark::State& state) {
  if (skip_without_device(state)) return;
  const bool report_routed = state.range(0) != 0;
  constexpr int kElements = 256;
  constexpr int kBurst = 32;
  replay::Stream stream;
  replay::DeviceBuffer<float> x(kElements);
  x.zero(stream);
  auto issue = [&](int batch, replay::StreamRef s) {
    tiny_kernel<<<1, kElements, 0, s.get()>>>(x.data(), std::min(batch, kElements), 0.5F);
    replay::check_last_launch("tiny_kernel");
  };
  replay::ShapeRouter<int> router(issue, replay::ShapeRouterOptions<int>::bucketed(replay::power_of_two_buckets(64)));
  router.capture_all(stream);
  // The raw baseline launches the same sequence of bucket graphs as the
  // router (its own executable graphs, chosen by a precomputed table), so the
  // difference is the router's lookup alone, not the driver's cost of
  // switching between graphs.
  std::vector<replay::GraphExec> raw_execs;
  for (int bucket = 1; bucket <= 64; bucket *= 2) {
    auto graph = replay::capture(stream, [&](replay::StreamRef s) { issue(bucket, s); });
    raw_execs.emplace_back(graph, replay::InstantiateFlags::upload, stream);
  }
  const auto keys = random_batches(4096, 64);
  std::vector<cudaGraphExec_t> raw_sequence(keys.size());
  for (std::size_t i = 0; i < keys.size(); ++i) {
    const int padded = router.padded_shape(keys[i]);
    raw_sequence[i] = raw_execs[static_cast<std::size_t>(std::countr_zero(static_cast<unsigned>(padded)))].get();
  }
  std::size_t k = 0;
  std::size_t r = 0;
  for (int i = 0; i < 256; ++i) {  // warm both paths
    replay::check(cudaGraphLaunch(raw_sequence[r++ & 4095], stream.get()), "cudaGraphLaunch");
    (void)router.run(keys[k++ & 4095], stream);
  }
  stream.synchronize();
  double raw_total = 0.0;
  double routed_total = 0.0;
  std::int64_t launches = 0;
  std::vector<double> raw_s;
  std::vector<double> routed_s;
  std::vector<double> overhead_s;
  std::vector<double> overhead_ratio;
  auto raw_burst = [&] {
    const auto start = clock_type::now();
    for (int b = 0; b < kBurst; ++b) {
      replay::check(cudaGraphLaunch(raw_sequence[r++ & 4095], stream.get()), "cudaGraphLaunch");
    }
    const double elapsed = seconds(start, clock_type::now());
    stream.synchronize();
    return elapsed;
  };
  auto routed_burst = [&] {
    const auto start = clock_type::now();
    for (int b = 0; b < kBurst; ++b) {
      (void)router.run(keys[k++ & 4095], stream);
    }
    const double elapsed = seconds(start, clock_type::now());
    stream.synchronize();
    return elapsed;
  };
  AlternatingPair pair;  // which burst of a pair goes first alternates
  for (auto _ : state) {
    const auto [routed, raw] = pair(routed_burst, raw_burst);
    raw_total += raw;
    routed_total += routed;
    launches += kBurst;
    raw_s.push_back(raw / kBurst);
    routed_s.push_back(routed / kBurst);
    overhead_s.push_back((routed - raw) / kBurst);
    overhead_ratio.push_back(raw > 0 ? routed / raw : 0.0);
    state.SetIterationTime((report_routed ? routed : raw) / kBurst);
  }
  if (router.stats().misses != 0) {
    state.SkipWithError("router missed: the measurement is not of hits");
    return;
  }
  const double n = static_cast<double>(std::max<std::int64_t>(launches, 1));
  // Medians of the paired bursts (the overhead: of each pair's difference),
  // as in graph_launch_bench's paired entries; the means are reported too.
  state.counters["raw_ns"] = median(raw_s) * 1e9;
  state.counters["routed_ns"] = median(routed_s) * 1e9;
  state.counters["overhead_ns"] = median(overhead_s) * 1e9;
  state.counters["overhead_ratio"] = median(overhead_ratio);
  state.counters["overhead_mean_ns"] = (routed_total - raw_total) / n * 1e9;
  state.counters["budget_ns"] = 100.0;
  state.SetLabel(report_routed ? "ShapeRouter::run (hit)" : "raw cudaGraphLaunch");
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
    state.SetIterationTime(seconds(start, clock_type::now()));
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
  const auto batches = random_batches(4096, kMaxBatch);
  std::size_t next = 0;
  auto serve = [&](int batch) {
    switch (mode) {
      case 0: model(batch, stream); break;
      case 1: (void)exact.run(batch, stream); break;
      default: (void)bucketed.run(batch, stream); break;
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
    const double elapsed = seconds(start, clock_type::now());
    state.SetIterationTime(elapsed);
    total_seconds += elapsed;
    requests += kBurst;
  }
  const auto& router = mode == 1 ? exact : bucketed;
  if (mode != 0 && router.stats().misses != 0) {
    state.SkipWithError("router missed after capture");
    return;
  }
  state.counters["requests"] = static_cast<double>(requests);
  state.counters["us_per_request"] = total_seconds / static_cast<double>(std::max<std::int64_t>(requests, 1)) * 1e6;
  if (mode != 0) {
    state.counters["graphs"] = static_cast<double>(router.graph_count());
    state.counters["padding_waste"] = router.stats().padding_waste();
  }
  const char* const names[] = {"eager", "router exact keys", "router buckets"};
  state.SetLabel(names[mode]);
}

// ---- concurrency -------------------------------------------------------------

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

// hit_latency and hit_latency_raw: the captured graph's kernels, and the elements of each.
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
    state.SetIterationTime(seconds(begin, clock_type::now()));
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
    state.SetIterationTime(seconds(start, clock_type::now()));
    if (graphed != kBuckets) {
      state.SkipWithError("not every bucket was captured");
      return;
    }
  }
  state.counters["buckets"] = kBuckets;
}

}  // namespace

BENCHMARK(route_only)->ArgName("bucketed")->Arg(0)->Arg(1);
BENCHMARK(route_cold)->ArgName("routed")->Arg(0)->Arg(1)->UseManualTime();
BENCHMARK(route_launch)->ArgName("routed")->Arg(0)->Arg(1)->UseManualTime()->Unit(benchmark::kMicrosecond);
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
BENCHMARK(dynamic_batch)->ArgName("mode")->Arg(0)->Arg(1)->Arg(2)->UseManualTime()->Unit(benchmark::kMicrosecond);

BENCHMARK(hit_rate)->ArgName("shared")->Arg(0)->Arg(1)->ThreadRange(1, 8)->UseRealTime();
BENCHMARK(hit_latency)->ArgName("capturing")->Arg(0)->Arg(1)->Iterations(3)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(hit_latency_raw)
    ->ArgName("capturing")
    ->Arg(0)
    ->Arg(1)
    ->Iterations(3)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(startup)->ArgName("threads")->Arg(1)->Arg(4)->Iterations(3)->UseManualTime()->Unit(benchmark::kMillisecond);

BENCHMARK_MAIN();
