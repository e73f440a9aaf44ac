// StreamPipeline on pinned memory: serial against pipelined execution (and
// against whole-slot graphs, PipelineFlags::graph_slot) for copy-bound,
// balanced and compute-bound stages at 64 KiB, 1 MiB and 16 MiB items, plus
// raw pinned cudaMemcpyAsync bandwidth measured in the same run, so that
// scripts/bench_ratios.py states the copy and overlap targets as ratios of
// one run (bench/stream_pipeline_pinned_bench.ratios).
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
// 7 batches a row (the serial loops 3), the median one reported (see
// stream_pipeline_bench.hpp for the counters they share). ideal_s: the bound
// "slowest stage total + one fill + one drain" = (items - 1) * slowest + sum,
// where the copy stage's time is duplex_us (ideal_solo_s: each copy at its
// one-way rate).
#include <benchmark/benchmark.h>

#include "bench_main.hpp"
#include "stream_pipeline_bench.hpp"

#include <algorithm>
#include <chrono>
#include <exception>
#include <optional>
#include <string>
#include <vector>

namespace stream_pipeline_bench {
namespace {

constexpr std::size_t kSizes[] = {64 * kKiB, kMiB, 16 * kMiB};

enum class Mode { serial, pipelined, pipelined_3slots, graph_slot };
enum class Direction { h2d, d2h, duplex };

const char* name_of(Balance b) {
  switch (b) {
    case Balance::copy_bound: return "copy_bound";
    case Balance::balanced: return "balanced";
    default: return "compute_bound";
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
// Items per batch: enough that one fill and one drain are a small part of it.
std::size_t items_for(std::size_t bytes) { return std::min<std::size_t>(kPoolBytes / bytes, 1024); }

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
    std::vector<double> batches = run_batches(state, [&] { return raw.run(items); });
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

    std::optional<SerialLoop> serial;
    std::optional<replay::StreamPipeline<float>> pipeline;
    std::size_t slots = 1;
    if (mode == Mode::serial) {
      serial.emplace(n, iterations);
    } else {
      slots = mode == Mode::pipelined_3slots ? 3 : slots_for(bytes);
      pipeline.emplace(replay::PipelineOptions{.input_capacity = n,
                                               .slots = slots,
                                               .flags = mode == Mode::graph_slot ? replay::PipelineFlags::graph_slot
                                                                                 : replay::PipelineFlags::none},
                       fma_stage(iterations));
    }
    const auto run_batch = [&](std::size_t count) {
      if (serial) {
        serial->run(p.in.data(), p.out.data(), count);
      } else {
        submit_batch(*pipeline, p.in.data(), p.out.data(), n, count);
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
    std::vector<double> duplex_ratios;
    std::vector<double> batches = run_batches(
        state, raw_duplex.has_value(), [&] { return seconds_of([&] { run_batch(items); }); },
        [&] { return raw_duplex->run(items); },
        [&](double batch, double raw_s) { duplex_ratios.push_back(raw_s / batch); });  // pipeline GB/s over raw
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
}

}  // namespace
}  // namespace stream_pipeline_bench

int main(int argc, char** argv) { return run_benchmarks(argc, argv, stream_pipeline_bench::register_all); }
