// StreamPipeline on pageable (ordinary) host memory both ways, balanced
// stages, 16 MiB items, against the fair baseline, a serial loop on the same
// pageable buffers (targets: bench/stream_pipeline_pageable_bench.ratios).
//
//  pipeline/pageable/<mode>/16MiB:
//      serial      one stream, cudaMemcpyAsync straight from and to pageable memory
//      pipelined   StreamPipeline: chunked staging over its copy helpers
//      registered  the same buffers registered once (RegisteredHostBuffer), used in place
//      (GBps and items_per_s from the median of 7 batches of 32 items; the serial loop's of 3)
//      pipelined also times, paired with each of its batches, the same two
//      staged copies on the host alone (HostStagingCopy): ceiling_ratio is the
//      pipeline's rate over min(that, the link's duplex rate), the share of
//      what this host allowed at that moment that the pipeline reached
//
// See stream_pipeline_bench.hpp for the compute stage and the shared counters.
#include <benchmark/benchmark.h>

#include "bench_main.hpp"
#include "stream_pipeline_bench.hpp"

#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <cstring>
#include <exception>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "replay/stream_pipeline/detail/streaming_copy.hpp"  // the pipeline's own output copy, for the host-only baseline

namespace stream_pipeline_bench {
namespace {

// Pageable input and output pools (touched once, as a server's reused request
// buffers are), and a second pair that is registered with CUDA for the
// `registered` variant.
constexpr std::size_t kPageableItems = 32;  // enough that one fill and one drain are a small part
constexpr std::size_t kPageableItemBytes = 16 * kMiB;
struct PageablePools {
  std::vector<float> in = std::vector<float>(kPageableItems * kPageableItemBytes / sizeof(float), 0.5F);
  std::vector<float> out = std::vector<float>(kPageableItems * kPageableItemBytes / sizeof(float), 0.0F);
};
PageablePools& pageable_pools() {
  static PageablePools instance;
  return instance;
}
struct RegisteredPools {
  PageablePools memory;
  replay::RegisteredHostBuffer<float> in{std::span<float>(memory.in)};
  replay::RegisteredHostBuffer<float> out{std::span<float>(memory.out)};
};
RegisteredPools& registered_pools() {
  static RegisteredPools instance;
  return instance;
}

// The host's side of a pageable batch alone, no GPU: the pipeline's two
// staged copies of every item at once (pageable to pinned staging with
// memcpy, pinned staging to pageable with its streaming stores), chunk by
// chunk, over as many threads as the pipeline copies with (its helpers, the
// submitting thread and the completion thread). No staging scheme moves more
// each way on this host at this moment, so pipeline/pageable/pipelined is
// judged against it, paired batch by batch: the host's memory is shared with
// whatever else runs there, and the same batch took 25 to 52 ms on one host
// within minutes.
class HostStagingCopy {
 public:
  HostStagingCopy(std::size_t threads, std::size_t items, std::size_t item_bytes, std::size_t chunk_bytes,
                  std::size_t slots, const std::byte* pageable_in, std::byte* pageable_out, std::byte* pinned_in,
                  const std::byte* pinned_out)
      : items_(items),
        item_bytes_(item_bytes),
        chunk_bytes_(chunk_bytes),
        chunks_per_item_((item_bytes + chunk_bytes - 1) / chunk_bytes),
        slots_(slots),
        pageable_in_(pageable_in),
        pageable_out_(pageable_out),
        pinned_in_(pinned_in),
        pinned_out_(pinned_out),
        start_(static_cast<std::ptrdiff_t>(threads + 1)),
        done_(static_cast<std::ptrdiff_t>(threads + 1)) {
    for (std::size_t t = 0; t < threads; ++t) {
      workers_.emplace_back([this] { work(); });
    }
  }
  HostStagingCopy(const HostStagingCopy&) = delete;
  HostStagingCopy& operator=(const HostStagingCopy&) = delete;
  ~HostStagingCopy() {
    stop_ = true;
    start_.arrive_and_wait();
    for (auto& w : workers_) {
      w.join();
    }
  }
  // One batch of `items` items both ways; returns its wall time.
  double run() {
    next_.store(0);
    const auto start = std::chrono::steady_clock::now();
    start_.arrive_and_wait();
    done_.arrive_and_wait();
    return seconds_since(start);
  }

 private:
  void work() {
    for (;;) {
      start_.arrive_and_wait();
      if (stop_) {
        return;
      }
      const std::size_t total = items_ * chunks_per_item_ * 2;
      for (std::size_t j = next_.fetch_add(1); j < total; j = next_.fetch_add(1)) {
        const std::size_t chunk = j / 2;
        const std::size_t item = chunk / chunks_per_item_;
        const std::size_t offset = (chunk % chunks_per_item_) * chunk_bytes_;
        const std::size_t length = std::min(chunk_bytes_, item_bytes_ - offset);
        const std::size_t staging = (item % slots_) * item_bytes_ + offset;
        if (j % 2 == 0) {
          std::memcpy(pinned_in_ + staging, pageable_in_ + item * item_bytes_ + offset, length);
        } else {
          replay::detail::copy_streaming(pageable_out_ + item * item_bytes_ + offset, pinned_out_ + staging, length);
        }
      }
      done_.arrive_and_wait();
    }
  }

  std::size_t items_, item_bytes_, chunk_bytes_, chunks_per_item_, slots_;
  const std::byte* pageable_in_;
  std::byte* pageable_out_;
  std::byte* pinned_in_;
  const std::byte* pinned_out_;
  std::atomic<std::size_t> next_{0};
  bool stop_ = false;  // written before start_'s phase completes, read after it
  std::barrier<> start_;
  std::barrier<> done_;
  std::vector<std::thread> workers_;
};

enum class PageableMode { serial, pipelined, registered };
const char* name_of(PageableMode m) {
  switch (m) {
    case PageableMode::serial: return "serial";
    case PageableMode::pipelined: return "pipelined";
    default: return "registered";
  }
}

void pageable_batch(benchmark::State& state, PageableMode mode) {
  if (skip_without_device(state)) {
    return;
  }
  try {
    const std::size_t bytes = kPageableItemBytes;
    const std::size_t n = bytes / sizeof(float);
    const std::size_t items = kPageableItems;
    const Calibration& cal = calibration(bytes, Balance::balanced);
    const int iterations = cal.iterations;
    PageablePools& pageable = pageable_pools();
    RegisteredPools* registered = mode == PageableMode::registered ? &registered_pools() : nullptr;
    std::optional<SerialLoop> serial;
    std::optional<replay::StreamPipeline<float>> pipeline;
    if (mode == PageableMode::serial) {
      serial.emplace(n, iterations);
    } else {
      pipeline.emplace(replay::PipelineOptions{.input_capacity = n, .slots = slots_for(bytes)}, fma_stage(iterations));
    }
    const auto run_batch = [&](std::size_t count) {
      if (serial) {
        serial->run(pageable.in.data(), pageable.out.data(), count);
      } else if (registered != nullptr) {
        for (std::size_t i = 0; i < count; ++i) {
          (void)pipeline->submit(registered->in.subview(i * n, n), registered->out.subview(i * n, n));
        }
        pipeline->drain();
      } else {
        submit_batch(*pipeline, pageable.in.data(), pageable.out.data(), n, count);
      }
    };
    // The staged pipeline's ceiling, measured beside it (see HostStagingCopy).
    std::optional<HostStagingCopy> host_only;
    if (mode == PageableMode::pipelined) {
      const replay::PipelineOptions defaults{};
      Pools& pinned = pools();
      // Its helpers, the submitting thread and the completion thread.
      host_only.emplace(defaults.host_copy_threads + 2, items, bytes, defaults.staging_chunk_bytes, slots_for(bytes),
                        reinterpret_cast<const std::byte*>(pageable.in.data()),
                        reinterpret_cast<std::byte*>(pageable.out.data()),
                        reinterpret_cast<std::byte*>(pinned.in.data()),
                        reinterpret_cast<const std::byte*>(pinned.out.data()));
      (void)host_only->run();  // warm: the threads, the pinned pages
    }
    const double moved = static_cast<double>(items * bytes);
    const double link_GBps = static_cast<double>(bytes) / cal.duplex_s / 1e9;
    run_batch(4);  // warm: first launches, the copy helpers
    std::vector<double> host_only_batches;
    std::vector<double> ceiling_ratios;
    std::vector<double> batches = run_batches(
        state, host_only.has_value(), [&] { return seconds_of([&] { run_batch(items); }); },
        [&] { return host_only->run(); },
        [&](double batch, double host_s) {
          host_only_batches.push_back(host_s);
          const double ceiling_GBps = std::min(moved / host_s / 1e9, link_GBps);
          ceiling_ratios.push_back(moved / batch / 1e9 / ceiling_GBps);
        });
    if (pipeline && pipeline->stats().failed != 0) {
      state.SkipWithError("pipeline items failed");
      return;
    }
    // Rates from the median batch: the host copies run on the host's cores
    // and memory, so a batch that another process slows moves a mean.
    set_median_batch_counters(state, items, bytes, batches);
    state.counters["goal_GBps"] = 20.0;
    state.counters["compute_us"] = cal.compute_s * 1e6;
    state.counters["h2d_pinned_us"] = cal.h2d_s * 1e6;
    if (host_only) {
      // host_only_GBps: the median host-only batch; ceiling_ratio: the median
      // of each pair's pipeline GB/s over min(that pair's host-only rate, the
      // link's duplex rate, link_GBps).
      state.counters["host_only_GBps"] = moved / median(host_only_batches) / 1e9;
      state.counters["link_GBps"] = link_GBps;
      state.counters["ceiling_ratio"] = median(ceiling_ratios);
    }
    if (pipeline) {
      const auto stats = pipeline->stats();
      state.counters["staged_inputs"] = static_cast<double>(stats.inputs_staged);
      state.counters["in_place_inputs"] = static_cast<double>(stats.inputs_in_place);
    }
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
  }
}

void register_all() {
  for (PageableMode m : {PageableMode::serial, PageableMode::pipelined, PageableMode::registered}) {
    const std::string name = std::string("pipeline/pageable/") + name_of(m) + "/" + size_label(kPageableItemBytes);
    benchmark::RegisterBenchmark(name.c_str(), [m](benchmark::State& s) { pageable_batch(s, m); })
        ->UseManualTime()
        ->Iterations(m == PageableMode::serial ? 3 : kBatchesPerRow)  // the serial loop: 3 batches, 0.4 s
        ->Unit(benchmark::kMillisecond);
  }
}

}  // namespace
}  // namespace stream_pipeline_bench

int main(int argc, char** argv) { return run_benchmarks(argc, argv, stream_pipeline_bench::register_all); }
