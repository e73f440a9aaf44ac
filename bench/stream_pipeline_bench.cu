// StreamPipeline throughput: serial against pipelined execution (and against
// whole-slot graphs, PipelineFlags::graph_slot) for copy-bound, balanced and
// compute-bound stages at 64 KiB, 1 MiB and 16 MiB items, plus raw pinned
// cudaMemcpyAsync bandwidth measured in the same run, so that
// scripts/bench_ratios.py can state the targets as ratios of one run.
//
//  raw_copy/<h2d|d2h|duplex>/<size>: a batch of back-to-back pinned copies
//      (duplex: H2D and D2H at once on two streams, the pipeline's pattern).
//      pipeline/copy_bound/pipelined also runs a raw duplex batch beside each
//      of its own: duplex_ratio, the median of the pairs' rate ratios.
//  pipeline/<balance>/<mode>/<size>: one batch of items through
//      serial      one stream: copy-in, compute, copy-out per item, no overlap
//      pipelined   replay::StreamPipeline (slots: the `slots` counter)
//      pipelined_3slots  the same with the default 3 slots (16 MiB, balanced)
//      graph_slot  StreamPipeline with PipelineFlags::graph_slot
//
//  pipeline/pageable/<mode>/16MiB: pageable (ordinary) host memory both ways,
//      balanced stages, against the fair baseline, a serial loop on the same
//      pageable buffers:
//      serial      one stream, cudaMemcpyAsync straight from and to pageable memory
//      pipelined   StreamPipeline: chunked staging over its copy helpers
//      registered  the same buffers registered once (RegisteredHostBuffer), used in place
//      (GBps and items_per_s from the median of 7 batches of 32 items; the serial loop's of 3)
//      pipelined also times, paired with each of its batches, the same two
//      staged copies on the host alone (HostStagingCopy): ceiling_ratio is the
//      pipeline's rate over min(that, the link's duplex rate), the share of
//      what this host allowed at that moment that the pipeline reached
//  pipeline/tiny/<mode>/<4KiB|16KiB|64KiB>: many small items, balanced stages,
//      pinned memory passed as typed views (no memory-kind queries):
//      serial against pipelined (and slot_streams, each slot's stages on its
//      own stream, and graph_slot, one graph launch per item);
//      host_us_per_item is the submitting thread's CPU time per item
//      (budget_us: the 3 us target).
//  pipeline/tiny/<serial|pipelined|graph_slot>_recycled/64KiB: the same, but
//      the host buffers are a ring of `slots` pinned input and output buffers
//      reused in submission order, as a server reuses pooled request buffers
//      (the serial loop uses the same ring). Items take the slots in turn, so
//      each slot sees one address pair and a graph_slot item is one
//      cudaGraphLaunch; graph_retargets_per_item says whether it was (0) or
//      whether the copy nodes were re-pointed (2 with new addresses per item).
//      graph_slot_recycled_16slots: the same with 16 slots and a ring of 16.
//      graph_group<K>_recycled: graph_slot with PipelineOptions::items_per_launch
//      = K (16 slots in groups of 8, or 8 in groups of 4) and one run() of the
//      whole batch: one cudaGraphLaunch per K items (grouped_per_item: the
//      share of items issued that way; host_us_per_item: run()'s CPU time).
//      slot_waits_per_item: submits that found every slot busy (a producer
//      waiting alone is woken once a quarter of the slots are free).
//      A ring of `slots` buffers is safe to reuse: submit() of item k returns
//      only once item k - slots was delivered (the host does not rewrite the
//      inputs here; a server refilling one waits for that item's ticket).
//
// Time is host wall time per batch (manual time). The copy, pipeline and
// pageable rows run 7 batches (the serial loops 3) and report the median one: batch_s, and
// GBps (bytes per second in each direction) and items_per_s from it; the
// ratios use batch_s. Other counters: the stages' times for one item run
// alone (h2d_us, compute_us, d2h_us, from events; duplex_us: one item's
// copies in and out at the same time), and ideal_s: the bound "slowest stage
// total + one fill + one drain" = (items - 1) * slowest + sum, where the copy
// stage's time is duplex_us (ideal_solo_s: each copy at its one-way rate).
//
// The compute stage is a loop of dependent FMAs per element whose iteration
// count is calibrated at run time with events: compute time ~ 0 (copy_bound:
// a plain copy kernel), ~ 1x (balanced) or ~ 4x (compute_bound) the time of
// one item's host-to-device copy.
#include <benchmark/benchmark.h>

#include "bench_main.hpp"
#include "bench_stats.hpp"

#include <time.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "replay/replay.hpp"
#include "replay/stream_pipeline/detail/streaming_copy.hpp"  // the pipeline's own output copy, for the host-only baseline
#include "replay/stream_pipeline.hpp"

namespace {

constexpr std::size_t kKiB = 1024;
constexpr std::size_t kMiB = 1024 * kKiB;
constexpr std::size_t kSizes[] = {64 * kKiB, kMiB, 16 * kMiB};
constexpr int kBatchesPerRow = 7;  // the copy and pipeline rows report their median batch
constexpr std::size_t kPoolBytes = 1024 * kMiB;  // one batch of the largest size

enum class Balance { copy_bound, balanced, compute_bound };
enum class Mode { serial, pipelined, pipelined_3slots, graph_slot };
enum class Direction { h2d, d2h, duplex };

const char* name_of(Balance b) {
  switch (b) {
    case Balance::copy_bound: return "copy_bound";
    case Balance::balanced: return "balanced";
    default: return "compute_bound";
  }
}
double compute_factor(Balance b) {
  switch (b) {
    case Balance::copy_bound: return 0.0;
    case Balance::balanced: return 1.0;
    default: return 4.0;
  }
}
const char* name_of(Mode m) {
  switch (m) {
    case Mode::serial: return "serial";
    case Mode::pipelined: return "pipelined";
    case Mode::pipelined_3slots: return "pipelined_3slots";
    default: return "graph_slot";
  }
}
const char* name_of(Direction d) {
  switch (d) {
    case Direction::h2d: return "h2d";
    case Direction::d2h: return "d2h";
    default: return "duplex";
  }
}
std::string size_label(std::size_t bytes) {
  return bytes >= kMiB ? std::to_string(bytes / kMiB) + "MiB" : std::to_string(bytes / kKiB) + "KiB";
}
// Items per batch: enough that one fill and one drain are a small part of it.
std::size_t items_for(std::size_t bytes) { return std::min<std::size_t>(kPoolBytes / bytes, 1024); }
// More slots for smaller items: the completion latency (microseconds) is then
// a larger part of one item's time, and more items in flight hide it.
std::size_t slots_for(std::size_t bytes) { return bytes >= 16 * kMiB ? 4 : (bytes >= kMiB ? 6 : 8); }

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

void launch_fma(const float* in, float* out, std::size_t n, int iterations, replay::StreamRef s) {
  if (n == 0) {
    return;
  }
  fma_kernel<<<static_cast<unsigned>((n + 255) / 256), 256, 0, s.get()>>>(in, out, n, iterations);
  replay::check_last_launch("fma_kernel");
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
Pools& pools() {
  static Pools instance;
  return instance;
}

// Pageable input and output pools for the pageable benchmarks (touched once,
// as a server's reused request buffers are), and a second pair that is
// registered with CUDA for the `registered` variant.
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
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
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

// CPU time of the calling thread (what submitting costs the host, waits excluded).
double thread_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
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
const Calibration& calibration(std::size_t bytes, Balance balance) {
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

bool skip_without_device(benchmark::State& state) {
  if (!replay::has_device()) {
    state.SkipWithError("no CUDA device");
    return true;
  }
  return false;
}

void set_rate_counters(benchmark::State& state, std::size_t items, std::size_t bytes, double total_s,
                       std::int64_t batches) {
  const double moved = static_cast<double>(items * bytes) * static_cast<double>(batches);
  state.counters["GBps"] = total_s > 0 ? moved / total_s / 1e9 : 0.0;
  state.counters["items_per_s"] =
      total_s > 0 ? static_cast<double>(items) * static_cast<double>(batches) / total_s : 0.0;
  state.counters["items"] = static_cast<double>(items);
}

// Rates and batch_s from the median batch. Two-way copies share the host's
// memory and the link with whatever else runs: on an H200 host the same
// pipelined batch of 64 x 16 MiB took 22.7, 24.3 and 25.3 ms within a minute
// (the serial loop 59.5 to 59.8 ms), so a mean of three batches moved a
// ratio by 10%; the median of seven moves less.
void set_median_batch_counters(benchmark::State& state, std::size_t items, std::size_t bytes,
                               std::vector<double>& batches) {
  const double batch_s = median(batches);
  set_rate_counters(state, items, bytes, batch_s, 1);
  state.counters["batch_s"] = batch_s;
}

// A batch of back-to-back raw pinned copies: `items` items of `bytes` from the
// input pool up (h2d), to the output pool down (d2h), or both at once on two
// streams (duplex, the pipeline's traffic). Returns its wall time.
class RawCopyBatch {
 public:
  RawCopyBatch(Direction direction, std::size_t bytes)
      : direction_(direction), bytes_(bytes), n_(bytes / sizeof(float)), d_in_(n_), d_out_(n_) {
    d_out_.zero(down_);
    (void)run(1);  // warm
  }
  double run(std::size_t items) {
    Pools& p = pools();
    const auto start = std::chrono::steady_clock::now();
    for (std::size_t i = 0; i < items; ++i) {
      if (direction_ != Direction::d2h) {
        replay::check(
            cudaMemcpyAsync(d_in_.data(), p.in.data() + i * n_, bytes_, cudaMemcpyHostToDevice, up_.get()),
            "cudaMemcpyAsync");
      }
      if (direction_ != Direction::h2d) {
        replay::check(
            cudaMemcpyAsync(p.out.data() + i * n_, d_out_.data(), bytes_, cudaMemcpyDeviceToHost, down_.get()),
            "cudaMemcpyAsync");
      }
    }
    up_.synchronize();
    down_.synchronize();
    return seconds_since(start);
  }

 private:
  Direction direction_;
  std::size_t bytes_;
  std::size_t n_;
  replay::Stream up_;
  replay::Stream down_;
  replay::DeviceBuffer<float> d_in_;
  replay::DeviceBuffer<float> d_out_;
};

void raw_copy(benchmark::State& state, Direction direction, std::size_t bytes) {
  if (skip_without_device(state)) {
    return;
  }
  try {
    const std::size_t items = items_for(bytes);
    RawCopyBatch raw(direction, bytes);
    std::vector<double> batches;
    for (auto _ : state) {
      const double batch = raw.run(items);
      batches.push_back(batch);
      state.SetIterationTime(batch);
    }
    set_median_batch_counters(state, items, bytes, batches);
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
  }
}

void pipeline_batch(benchmark::State& state, Balance balance, Mode mode, std::size_t bytes) {
  if (skip_without_device(state)) {
    return;
  }
  try {
    Pools& p = pools();
    const Calibration& cal = calibration(bytes, balance);
    const std::size_t n = bytes / sizeof(float);
    const std::size_t items = items_for(bytes);
    const int iterations = cal.iterations;
    const auto compute = [iterations](replay::BufferView<float> in, replay::BufferView<float> out,
                                      replay::StreamRef s) {
      launch_fma(in.data(), out.data(), in.size(), iterations, s);
    };

    std::optional<replay::Stream> stream;
    std::optional<replay::DeviceBuffer<float>> d_in;
    std::optional<replay::DeviceBuffer<float>> d_out;
    std::optional<replay::StreamPipeline<float>> pipeline;
    std::size_t slots = 1;
    if (mode == Mode::serial) {
      stream.emplace();
      d_in.emplace(n);
      d_out.emplace(n);
    } else {
      slots = mode == Mode::pipelined_3slots ? 3 : slots_for(bytes);
      pipeline.emplace(replay::PipelineOptions{.input_capacity = n,
                                               .slots = slots,
                                               .flags = mode == Mode::graph_slot ? replay::PipelineFlags::graph_slot
                                                                                 : replay::PipelineFlags::none},
                       compute);
    }
    const auto run_batch = [&](std::size_t count) {
      if (mode == Mode::serial) {
        for (std::size_t i = 0; i < count; ++i) {
          replay::check(
              cudaMemcpyAsync(d_in->data(), p.in.data() + i * n, bytes, cudaMemcpyHostToDevice, stream->get()),
              "cudaMemcpyAsync");
          launch_fma(d_in->data(), d_out->data(), n, iterations, *stream);
          replay::check(
              cudaMemcpyAsync(p.out.data() + i * n, d_out->data(), bytes, cudaMemcpyDeviceToHost, stream->get()),
              "cudaMemcpyAsync");
        }
        stream->synchronize();
      } else {
        for (std::size_t i = 0; i < count; ++i) {
          (void)pipeline->submit(std::span<const float>(p.in.data() + i * n, n),
                                 std::span<float>(p.out.data() + i * n, n));
        }
        pipeline->drain();
      }
    };
    run_batch(std::min<std::size_t>(items, 2 * slots + 2));  // warm: first launches, lazy loading
    // Copy-bound, the pipeline is the link's two-way traffic: each batch is
    // paired with a batch of raw duplex copies of the same items (which goes
    // first alternating), since the two-way rate itself moves between
    // batches (21.4 to 22.6 ms for 64 x 16 MiB each way on one H200 host).
    std::optional<RawCopyBatch> raw_duplex;
    if (balance == Balance::copy_bound && mode == Mode::pipelined) {
      raw_duplex.emplace(Direction::duplex, bytes);
    }
    std::vector<double> batches;
    std::vector<double> duplex_ratios;
    AlternatingPair pair;
    for (auto _ : state) {
      const auto [batch, raw_s] = pair(
          raw_duplex.has_value(),
          [&] {
            const auto start = std::chrono::steady_clock::now();
            run_batch(items);
            return seconds_since(start);
          },
          [&] { return raw_duplex->run(items); });
      batches.push_back(batch);
      if (raw_duplex) {
        duplex_ratios.push_back(raw_s / batch);  // pipeline GB/s over raw duplex GB/s
      }
      state.SetIterationTime(batch);
    }
    if (pipeline && pipeline->stats().failed != 0) {
      state.SkipWithError("pipeline items failed");
      return;
    }
    set_median_batch_counters(state, items, bytes, batches);
    // In steady state an item's copies in and out overlap each other, so the
    // copy stage runs at the measured duplex rate; ideal_solo_s takes each
    // copy at its one-direction rate (a bound no link that shares bandwidth
    // between directions can reach).
    const double fill_drain = cal.h2d_s + cal.compute_s + cal.d2h_s;
    const double slowest = std::max({cal.duplex_s, cal.compute_s});
    const double slowest_solo = std::max({cal.h2d_s, cal.compute_s, cal.d2h_s});
    state.counters["ideal_s"] = static_cast<double>(items - 1) * slowest + fill_drain;
    state.counters["ideal_solo_s"] = static_cast<double>(items - 1) * slowest_solo + fill_drain;
    state.counters["duplex_us"] = cal.duplex_s * 1e6;
    state.counters["h2d_us"] = cal.h2d_s * 1e6;
    state.counters["compute_us"] = cal.compute_s * 1e6;
    state.counters["d2h_us"] = cal.d2h_s * 1e6;
    state.counters["fma_iterations"] = iterations;
    state.counters["slots"] = static_cast<double>(slots);
    if (raw_duplex) {
      state.counters["duplex_ratio"] = median(duplex_ratios);  // of the pairs
    }
    if (pipeline) {
      const auto stats = pipeline->stats();
      state.counters["staged_inputs"] = static_cast<double>(stats.inputs_staged);
    }
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
  }
}

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
    std::optional<replay::Stream> stream;
    std::optional<replay::DeviceBuffer<float>> d_in;
    std::optional<replay::DeviceBuffer<float>> d_out;
    std::optional<replay::StreamPipeline<float>> pipeline;
    if (mode == PageableMode::serial) {
      stream.emplace();
      d_in.emplace(n);
      d_out.emplace(n);
    } else {
      pipeline.emplace(replay::PipelineOptions{.input_capacity = n, .slots = slots_for(bytes)},
                       [iterations](replay::BufferView<float> in, replay::BufferView<float> out, replay::StreamRef s) {
                         launch_fma(in.data(), out.data(), in.size(), iterations, s);
                       });
    }
    const auto run_batch = [&](std::size_t count) {
      if (mode == PageableMode::serial) {
        for (std::size_t i = 0; i < count; ++i) {
          replay::check(cudaMemcpyAsync(d_in->data(), pageable.in.data() + i * n, bytes, cudaMemcpyHostToDevice,
                                        stream->get()),
                        "cudaMemcpyAsync");
          launch_fma(d_in->data(), d_out->data(), n, iterations, *stream);
          replay::check(cudaMemcpyAsync(pageable.out.data() + i * n, d_out->data(), bytes, cudaMemcpyDeviceToHost,
                                        stream->get()),
                        "cudaMemcpyAsync");
        }
        stream->synchronize();
      } else if (registered != nullptr) {
        for (std::size_t i = 0; i < count; ++i) {
          (void)pipeline->submit(registered->in.subview(i * n, n), registered->out.subview(i * n, n));
        }
        pipeline->drain();
      } else {
        for (std::size_t i = 0; i < count; ++i) {
          (void)pipeline->submit(std::span<const float>(pageable.in.data() + i * n, n),
                                 std::span<float>(pageable.out.data() + i * n, n));
        }
        pipeline->drain();
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
    std::vector<double> batches;
    std::vector<double> host_only_batches;
    std::vector<double> ceiling_ratios;
    AlternatingPair pair;
    for (auto _ : state) {
      const auto [batch, host_s] = pair(
          host_only.has_value(),
          [&] {
            const auto start = std::chrono::steady_clock::now();
            run_batch(items);
            return seconds_since(start);
          },
          [&] { return host_only->run(); });
      batches.push_back(batch);
      if (host_only) {
        host_only_batches.push_back(host_s);
        const double ceiling_GBps = std::min(moved / host_s / 1e9, link_GBps);
        ceiling_ratios.push_back(moved / batch / 1e9 / ceiling_GBps);
      }
      state.SetIterationTime(batch);
    }
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

// Many small items through pinned memory passed as typed views. The host
// cost per item is the submitting thread's CPU time (sleeping while every
// slot is busy does not count).
enum class TinyMode { serial, pipelined, slot_streams, graph_slot, graph_group };
const char* name_of(TinyMode m) {
  switch (m) {
    case TinyMode::serial: return "serial";
    case TinyMode::pipelined: return "pipelined";
    case TinyMode::slot_streams: return "slot_streams";
    case TinyMode::graph_group: return "graph_group";
    default: return "graph_slot";
  }
}
replay::PipelineFlags flags_of(TinyMode m) {
  switch (m) {
    case TinyMode::slot_streams: return replay::PipelineFlags::slot_streams;
    case TinyMode::graph_slot:
    case TinyMode::graph_group: return replay::PipelineFlags::graph_slot;
    default: return replay::PipelineFlags::none;
  }
}

constexpr std::size_t kTinySlots = 8;

void tiny_batch(benchmark::State& state, TinyMode mode, std::size_t bytes, bool recycled,
                std::size_t slots = kTinySlots, std::size_t items_per_launch = 1) {
  const bool pipelined = mode != TinyMode::serial;
  if (skip_without_device(state)) {
    return;
  }
  try {
    Pools& p = pools();
    const std::size_t n = bytes / sizeof(float);
    const std::size_t items = 2048;
    const Calibration& cal = calibration(bytes, Balance::balanced);
    const int iterations = cal.iterations;
    const replay::BufferView<float, replay::MemorySpace::pinned_host> in = p.in.view();
    const replay::BufferView<float, replay::MemorySpace::pinned_host> out = p.out.view();
    std::optional<replay::Stream> stream;
    std::optional<replay::DeviceBuffer<float>> d_in;
    std::optional<replay::DeviceBuffer<float>> d_out;
    std::optional<replay::StreamPipeline<float>> pipeline;
    if (!pipelined) {
      stream.emplace();
      d_in.emplace(n);
      d_out.emplace(n);
    } else {
      pipeline.emplace(replay::PipelineOptions{.input_capacity = n,
                                               .slots = slots,
                                               .flags = flags_of(mode),
                                               .items_per_launch = items_per_launch},
                       [iterations](replay::BufferView<float> i, replay::BufferView<float> o, replay::StreamRef s) {
                         launch_fma(i.data(), o.data(), i.size(), iterations, s);
                       });
    }
    double cpu = 0;
    // Item i of a batch uses buffer i, or with `recycled` the next one of the
    // ring: item k since the pipeline was made (its id) uses buffer k % slots.
    std::size_t submitted = 0;
    const auto buffer_of = [&](std::size_t i) { return recycled ? submitted++ % slots : i; };
    const auto run_batch = [&](std::size_t count) {
      const double cpu_start = thread_cpu_seconds();
      if (!pipelined) {
        for (std::size_t i = 0; i < count; ++i) {
          const std::size_t b = buffer_of(i);
          replay::check(
              cudaMemcpyAsync(d_in->data(), in.data() + b * n, bytes, cudaMemcpyHostToDevice, stream->get()),
              "cudaMemcpyAsync");
          launch_fma(d_in->data(), d_out->data(), n, iterations, *stream);
          replay::check(
              cudaMemcpyAsync(out.data() + b * n, d_out->data(), bytes, cudaMemcpyDeviceToHost, stream->get()),
              "cudaMemcpyAsync");
        }
        cpu += thread_cpu_seconds() - cpu_start;
        stream->synchronize();
      } else if (mode == TinyMode::graph_group) {
        // One run() of the whole batch: a group of slots per launch. The
        // views are made outside the timed CPU (a server has its requests').
        std::vector<replay::BufferView<float, replay::MemorySpace::pinned_host>> ins;
        std::vector<replay::BufferView<float, replay::MemorySpace::pinned_host>> outs;
        for (std::size_t i = 0; i < count; ++i) {
          const std::size_t b = buffer_of(i);
          ins.push_back(in.subview(b * n, n));
          outs.push_back(out.subview(b * n, n));
        }
        const double run_start = thread_cpu_seconds();
        (void)pipeline->run(ins, outs);  // returns once every item is delivered
        cpu += thread_cpu_seconds() - run_start;
      } else {
        for (std::size_t i = 0; i < count; ++i) {
          const std::size_t b = buffer_of(i);
          (void)pipeline->submit(in.subview(b * n, n), out.subview(b * n, n));
        }
        cpu += thread_cpu_seconds() - cpu_start;
        pipeline->drain();
      }
    };
    run_batch(64);  // warm
    cpu = 0;
    const std::uint64_t retargets_before = pipeline ? pipeline->stats().graph_retargets : 0;
    const std::uint64_t waits_before = pipeline ? pipeline->stats().slot_waits : 0;
    const std::uint64_t grouped_before = pipeline ? pipeline->stats().grouped_items : 0;
    double total = 0;
    for (auto _ : state) {
      const auto start = std::chrono::steady_clock::now();
      run_batch(items);
      const double batch = seconds_since(start);
      total += batch;
      state.SetIterationTime(batch);
    }
    if (pipeline && pipeline->stats().failed != 0) {
      state.SkipWithError("pipeline items failed");
      return;
    }
    set_rate_counters(state, items, bytes, total, state.iterations());
    state.counters["host_us_per_item"] =
        cpu * 1e6 / (static_cast<double>(items) * static_cast<double>(state.iterations()));
    state.counters["budget_us"] = 3.0;
    state.counters["compute_us"] = cal.compute_s * 1e6;
    if (pipeline) {
      const double submitted_items = static_cast<double>(items) * static_cast<double>(state.iterations());
      state.counters["graph_retargets_per_item"] =
          static_cast<double>(pipeline->stats().graph_retargets - retargets_before) / submitted_items;
      state.counters["slot_waits_per_item"] =
          static_cast<double>(pipeline->stats().slot_waits - waits_before) / submitted_items;
      state.counters["slots"] = static_cast<double>(slots);
      state.counters["grouped_per_item"] =
          static_cast<double>(pipeline->stats().grouped_items - grouped_before) / submitted_items;
      state.counters["items_per_launch"] = static_cast<double>(items_per_launch);
    }
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
  }
}

void register_all() {
  for (std::size_t bytes : kSizes) {
    for (Direction d : {Direction::h2d, Direction::d2h, Direction::duplex}) {
      const std::string name = std::string("raw_copy/") + name_of(d) + "/" + size_label(bytes);
      benchmark::RegisterBenchmark(name.c_str(), [d, bytes](benchmark::State& s) { raw_copy(s, d, bytes); })
          ->UseManualTime()
          ->Iterations(kBatchesPerRow)
          ->Unit(benchmark::kMillisecond);
    }
  }
  for (std::size_t bytes : kSizes) {
    for (Balance b : {Balance::copy_bound, Balance::balanced, Balance::compute_bound}) {
      for (Mode m : {Mode::serial, Mode::pipelined, Mode::pipelined_3slots, Mode::graph_slot}) {
        if (m == Mode::pipelined_3slots && (bytes != 16 * kMiB || b != Balance::balanced)) {
          continue;
        }
        const std::string name =
            std::string("pipeline/") + name_of(b) + "/" + name_of(m) + "/" + size_label(bytes);
        benchmark::RegisterBenchmark(name.c_str(),
                                     [b, m, bytes](benchmark::State& s) { pipeline_batch(s, b, m, bytes); })
            ->UseManualTime()
            ->Iterations(m == Mode::serial ? 3 : kBatchesPerRow)  // the serial loop varies little
            ->Unit(benchmark::kMillisecond);
      }
    }
  }
  for (PageableMode m : {PageableMode::serial, PageableMode::pipelined, PageableMode::registered}) {
    const std::string name = std::string("pipeline/pageable/") + name_of(m) + "/" + size_label(kPageableItemBytes);
    benchmark::RegisterBenchmark(name.c_str(), [m](benchmark::State& s) { pageable_batch(s, m); })
        ->UseManualTime()
        ->Iterations(m == PageableMode::serial ? 3 : 7)  // the median of 7 batches (the serial loop: 3, 0.4 s)
        ->Unit(benchmark::kMillisecond);
  }
  for (std::size_t bytes : {4 * kKiB, 16 * kKiB, 64 * kKiB}) {
    for (TinyMode m : {TinyMode::serial, TinyMode::pipelined, TinyMode::slot_streams, TinyMode::graph_slot}) {
      const std::string name = std::string("pipeline/tiny/") + name_of(m) + "/" + size_label(bytes);
      benchmark::RegisterBenchmark(name.c_str(),
                                   [m, bytes](benchmark::State& s) { tiny_batch(s, m, bytes, false); })
          ->UseManualTime()
          ->Unit(benchmark::kMillisecond);
    }
  }
  for (TinyMode m : {TinyMode::serial, TinyMode::pipelined, TinyMode::graph_slot}) {
    const std::size_t bytes = 64 * kKiB;
    const std::string name = std::string("pipeline/tiny/") + name_of(m) + "_recycled/" + size_label(bytes);
    benchmark::RegisterBenchmark(name.c_str(), [m, bytes](benchmark::State& s) { tiny_batch(s, m, bytes, true); })
        ->UseManualTime()
        ->Unit(benchmark::kMillisecond);
  }
  // Twice the slots: a producer waiting for a slot is woken for a quarter of
  // them at once (4 of 16 rather than 2 of 8), so it sleeps less often.
  benchmark::RegisterBenchmark("pipeline/tiny/graph_slot_recycled_16slots/64KiB",
                               [](benchmark::State& s) {
                                 tiny_batch(s, TinyMode::graph_slot, 64 * kKiB, true, 2 * kTinySlots);
                               })
      ->UseManualTime()
      ->Unit(benchmark::kMillisecond);
  // The small-item path: graph_slot with launch groups, run() of the batch
  // (16 slots in groups of 8: one launch per 8 items, two groups in flight;
  // and 8 slots in groups of 4).
  for (const auto& [slots, group] : {std::pair<std::size_t, std::size_t>{16, 8}, {8, 4}}) {
    const std::string name = "pipeline/tiny/graph_group" + std::to_string(group) + "_recycled/64KiB";
    benchmark::RegisterBenchmark(name.c_str(),
                                 [slots, group](benchmark::State& s) {
                                   tiny_batch(s, TinyMode::graph_group, 64 * kKiB, true, slots, group);
                                 })
        ->UseManualTime()
        ->Unit(benchmark::kMillisecond);
  }
}

}  // namespace

int main(int argc, char** argv) { return run_benchmarks(argc, argv, register_all); }
