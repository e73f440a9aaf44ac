// StreamPipeline with many small items and launch groups: throughput against
// a serial loop, and what submitting costs the host per item (targets:
// bench/stream_pipeline_tiny_bench.ratios).
//
//  pipeline/tiny/<mode>/<4KiB|16KiB|64KiB>: 2048 small items, balanced stages,
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
// Time is host wall time per batch (manual time); GBps and items_per_s over
// all batches. See stream_pipeline_bench.hpp for the compute stage.
#include <benchmark/benchmark.h>

#include "bench_main.hpp"
#include "stream_pipeline_bench.hpp"

#include <cstdint>
#include <exception>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace stream_pipeline_bench {
namespace {

// The host cost per item is the submitting thread's CPU time (sleeping while
// every slot is busy does not count).
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
    std::optional<SerialLoop> serial;
    std::optional<replay::StreamPipeline<float>> pipeline;
    if (mode == TinyMode::serial) {
      serial.emplace(n, iterations);
    } else {
      pipeline.emplace(replay::PipelineOptions{.input_capacity = n,
                                               .slots = slots,
                                               .flags = flags_of(mode),
                                               .items_per_launch = items_per_launch},
                       fma_stage(iterations));
    }
    double cpu = 0;
    // Item i of a batch uses buffer i, or with `recycled` the next one of the
    // ring: item k since the pipeline was made (its id) uses buffer k % slots.
    std::size_t submitted = 0;
    const auto buffer_of = [&](std::size_t i) { return recycled ? submitted++ % slots : i; };
    const auto run_batch = [&](std::size_t count) {
      const double cpu_start = thread_cpu_seconds();
      if (serial) {
        for (std::size_t i = 0; i < count; ++i) {
          const std::size_t b = buffer_of(i);
          serial->enqueue(in.data() + b * n, out.data() + b * n);
        }
        cpu += thread_cpu_seconds() - cpu_start;
        serial->synchronize();
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
      const double batch = seconds_of([&] { run_batch(items); });
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
}  // namespace stream_pipeline_bench

int main(int argc, char** argv) { return run_benchmarks(argc, argv, stream_pipeline_bench::register_all); }
