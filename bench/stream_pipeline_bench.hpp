#pragma once
// What the StreamPipeline benchmark programs share (stream_pipeline_pinned_bench,
// stream_pipeline_pageable_bench, stream_pipeline_tiny_bench): the compute
// stage, the pinned pools, the stage timings and the counters.
//
// Time is host wall time per batch (manual time). The pinned and pageable rows
// run 7 batches (the serial loops 3) and report the median one: batch_s, and
// GBps (bytes per second in each direction) and items_per_s from it; the
// ratios use batch_s. Other counters: the stages' times for one item run
// alone (h2d_us, compute_us, d2h_us, from events; duplex_us: one item's
// copies in and out at the same time).
//
// The compute stage is a loop of dependent FMAs per element whose iteration
// count is calibrated at run time with events: compute time ~ 0 (copy_bound:
// a plain copy kernel), ~ 1x (balanced) or ~ 4x (compute_bound) the time of
// one item's host-to-device copy.
#include <benchmark/benchmark.h>

#include "bench_device.hpp"
#include "bench_stats.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "replay/replay.hpp"
#include "replay/stream_pipeline.hpp"

namespace stream_pipeline_bench {
// Internal linkage: each program that includes this gets its own copy.
namespace {

constexpr std::size_t kKiB = 1024;
constexpr std::size_t kMiB = 1024 * kKiB;
constexpr int kBatchesPerRow = 7;  // the pinned and pageable rows report their median batch
constexpr std::size_t kPoolBytes = 1024 * kMiB;  // one batch of the largest size

enum class Balance { copy_bound, balanced, compute_bound };

inline double compute_factor(Balance b) {
  switch (b) {
    case Balance::copy_bound: return 0.0;
    case Balance::balanced: return 1.0;
    default: return 4.0;
  }
}
inline std::string size_label(std::size_t bytes) {
  return bytes >= kMiB ? std::to_string(bytes / kMiB) + "MiB" : std::to_string(bytes / kKiB) + "KiB";
}
// More slots for smaller items: the completion latency (microseconds) is then
// a larger part of one item's time, and more items in flight hide it.
inline std::size_t slots_for(std::size_t bytes) { return bytes >= 16 * kMiB ? 4 : (bytes >= kMiB ? 6 : 8); }

__global__ void fma_kernel(const float* __restrict__ in, float* __restrict__ out, std::size_t n, int iterations) {
  const std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (i < n) {
    float x = in[i];
    for (int k = 0; k < iterations; ++k) {
      x = fmaf(x, 0.9999F, 0.0001F);
    }
    out[i] = x;
  }
}

inline void launch_fma(const float* in, float* out, std::size_t n, int iterations, replay::StreamRef s) {
  if (n == 0) {
    return;
  }
  fma_kernel<<<static_cast<unsigned>((n + 255) / 256), 256, 0, s.get()>>>(in, out, n, iterations);
  replay::check_last_launch("fma_kernel");
}

// The pipeline's compute stage: the FMA loop over the item.
inline auto fma_stage(int iterations) {
  return [iterations](replay::BufferView<float> in, replay::BufferView<float> out, replay::StreamRef s) {
    launch_fma(in.data(), out.data(), in.size(), iterations, s);
  };
}

// Pinned input and output pools holding one batch of the largest size.
struct Pools {
  replay::PinnedBuffer<float> in{kPoolBytes / sizeof(float)};
  replay::PinnedBuffer<float> out{kPoolBytes / sizeof(float)};
  Pools() {
    std::memset(in.data(), 0, kPoolBytes);
    std::memset(out.data(), 0, kPoolBytes);
  }
};
inline Pools& pools() {
  static Pools instance;
  return instance;
}

// The baseline of every group: one stream, each item's copy in, compute and
// copy out in turn, no overlap.
class SerialLoop {
 public:
  SerialLoop(std::size_t n, int iterations) : n_(n), iterations_(iterations), d_in_(n), d_out_(n) {}
  // Enqueues one item of n elements from `in` to `out`.
  void enqueue(const float* in, float* out) {
    const std::size_t bytes = n_ * sizeof(float);
    replay::check(cudaMemcpyAsync(d_in_.data(), in, bytes, cudaMemcpyHostToDevice, stream_.get()),
                  "cudaMemcpyAsync");
    launch_fma(d_in_.data(), d_out_.data(), n_, iterations_, stream_);
    replay::check(cudaMemcpyAsync(out, d_out_.data(), bytes, cudaMemcpyDeviceToHost, stream_.get()),
                  "cudaMemcpyAsync");
  }
  void synchronize() { stream_.synchronize(); }
  // `count` items from and to contiguous host memory, item i at in + i * n and
  // out + i * n; returns once they are done.
  void run(const float* in, float* out, std::size_t count) {
    for (std::size_t i = 0; i < count; ++i) {
      enqueue(in + i * n_, out + i * n_);
    }
    synchronize();
  }

 private:
  std::size_t n_;
  int iterations_;
  replay::Stream stream_;
  replay::DeviceBuffer<float> d_in_;
  replay::DeviceBuffer<float> d_out_;
};

// The same batch through the pipeline: each item submitted as host spans of
// n elements, then drained.
inline void submit_batch(replay::StreamPipeline<float>& pipeline, const float* in, float* out, std::size_t n,
                         std::size_t count) {
  for (std::size_t i = 0; i < count; ++i) {
    (void)pipeline.submit(std::span<const float>(in + i * n, n), std::span<float>(out + i * n, n));
  }
  pipeline.drain();
}

// Average device time of `work` over `reps` runs, from events.
template <class Work>
double device_seconds(replay::StreamRef stream, int reps, Work&& work) {
  work();  // warm
  auto start = replay::Event::timing();
  auto stop = replay::Event::timing();
  start.record(stream);
  for (int r = 0; r < reps; ++r) {
    work();
  }
  stop.record(stream);
  stop.synchronize();
  return static_cast<double>(replay::Event::elapsed_ms(start, stop)) / 1e3 / reps;
}

struct Calibration {
  int iterations = 0;
  double h2d_s = 0;
  double compute_s = 0;
  double d2h_s = 0;
  double duplex_s = 0;  // one item's H2D and D2H at the same time, on two streams
};

// Stage times of one item alone, and the FMA count that makes the compute
// stage take compute_factor(balance) times one item's H2D copy.
inline const Calibration& calibration(std::size_t bytes, Balance balance) {
  static std::map<std::pair<std::size_t, Balance>, Calibration> cache;
  const auto key = std::make_pair(bytes, balance);
  if (const auto it = cache.find(key); it != cache.end()) {
    return it->second;
  }
  const std::size_t n = bytes / sizeof(float);
  Pools& p = pools();
  replay::Stream stream;
  replay::DeviceBuffer<float> d_in(n);
  replay::DeviceBuffer<float> d_out(n);
  d_in.zero(stream);
  Calibration c;
  c.h2d_s = device_seconds(stream, 10, [&] {
    replay::check(cudaMemcpyAsync(d_in.data(), p.in.data(), bytes, cudaMemcpyHostToDevice, stream.get()),
                  "cudaMemcpyAsync");
  });
  c.d2h_s = device_seconds(stream, 10, [&] {
    replay::check(cudaMemcpyAsync(p.out.data(), d_out.data(), bytes, cudaMemcpyDeviceToHost, stream.get()),
                  "cudaMemcpyAsync");
  });
  // Both directions at once, as a pipeline runs them: on links that are not
  // fully duplex this is more than either copy alone.
  replay::Stream other;
  replay::Event fork(replay::EventFlags::disable_timing);
  replay::Event join(replay::EventFlags::disable_timing);
  c.duplex_s = device_seconds(stream, 10, [&] {
    fork.record(stream);
    fork.wait_on(other);
    replay::check(cudaMemcpyAsync(d_in.data(), p.in.data(), bytes, cudaMemcpyHostToDevice, stream.get()),
                  "cudaMemcpyAsync");
    replay::check(cudaMemcpyAsync(p.out.data(), d_out.data(), bytes, cudaMemcpyDeviceToHost, other.get()),
                  "cudaMemcpyAsync");
    join.record(other);
    join.wait_on(stream);
  });
  const auto kernel_seconds = [&](int iterations) {
    return device_seconds(stream, 5, [&] { launch_fma(d_in.data(), d_out.data(), n, iterations, stream); });
  };
  const double target = compute_factor(balance) * c.h2d_s;
  if (target > 0) {
    c.iterations = 16;
    for (int round = 0; round < 5; ++round) {
      const double t = kernel_seconds(c.iterations);
      const double scaled = std::round(c.iterations * target / std::max(t, 1e-9));
      c.iterations = static_cast<int>(std::clamp(scaled, 1.0, 1e7));
    }
  }
  c.compute_s = kernel_seconds(c.iterations);
  return cache.emplace(key, c).first->second;
}

inline void set_rate_counters(benchmark::State& state, std::size_t items, std::size_t bytes, double total_s,
                       std::int64_t batches) {
  const double moved = static_cast<double>(items * bytes) * static_cast<double>(batches);
  state.counters["GBps"] = total_s > 0 ? moved / total_s / 1e9 : 0.0;
  state.counters["items_per_s"] =
      total_s > 0 ? static_cast<double>(items) * static_cast<double>(batches) / total_s : 0.0;
  state.counters["items"] = static_cast<double>(items);
}

// Runs the row's batches, `batch()` returning one batch's seconds, each beside
// a `baseline()` batch when `paired` (which goes first alternating; see
// AlternatingPair), `on_pair(batch_s, baseline_s)` told of each pair. Returns
// the batches' seconds.
template <class Batch, class Baseline, class OnPair>
std::vector<double> run_batches(benchmark::State& state, bool paired, Batch&& batch, Baseline&& baseline,
                                OnPair&& on_pair) {
  std::vector<double> batches;
  AlternatingPair pair;
  for (auto _ : state) {
    const auto [batch_s, baseline_s] = pair(paired, batch, baseline);
    batches.push_back(batch_s);
    if (paired) {
      on_pair(batch_s, baseline_s);
    }
    state.SetIterationTime(batch_s);
  }
  return batches;
}
// The same, unpaired.
template <class Batch>
std::vector<double> run_batches(benchmark::State& state, Batch&& batch) {
  return run_batches(state, false, batch, [] { return 0.0; }, [](double, double) {});
}

// Rates and batch_s from the median batch. Two-way copies share the host's
// memory and the link with whatever else runs: on an H200 host the same
// pipelined batch of 64 x 16 MiB took 22.7, 24.3 and 25.3 ms within a minute
// (the serial loop 59.5 to 59.8 ms), so a mean of three batches moved a
// ratio by 10%; the median of seven moves less.
inline void set_median_batch_counters(benchmark::State& state, std::size_t items, std::size_t bytes,
                               std::vector<double>& batches) {
  const double batch_s = median(batches);
  set_rate_counters(state, items, bytes, batch_s, 1);
  state.counters["batch_s"] = batch_s;
}

}  // namespace
}  // namespace stream_pipeline_bench
