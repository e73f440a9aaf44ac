// StreamPipeline's own bookkeeping per item, on the CPU alone: the scheduling
// core (BasicStreamPipeline) driven by a stand-in stage runner that makes no
// CUDA call, so what is measured is the pipeline's locks, wake-ups, ticket
// records and delivery, not the CUDA calls of a real item. No GPU is needed.
//
//  pipeline/bookkeeping/<delivery>/unpaced: the stand-in completes every item
//      at once; the producer runs flat out (the completion thread keeps up or
//      the producer waits for a slot).
//  pipeline/bookkeeping/<delivery>/paced_<us>us: the stand-in models a device
//      that runs items one after another, each taking <us> microseconds once
//      issued, as a GPU-bound stream of small items does; the producer is
//      ahead of it and waits for slots, so this shows what a wait costs the
//      submitting thread.
//  <delivery>: count (submit into a destination, ticket dropped) or callback.
//
// Counters: host_ns_per_item (the submitting thread's CPU time per item; a
// sleep costs only its system calls and context switches), sleeps_per_item
// (the submitting thread's voluntary context switches per item: each is one
// wait that went to the kernel) and slot_waits_per_item (submits that found
// every slot busy). 8 slots, as the GPU benchmark's tiny items use.
#include <benchmark/benchmark.h>

#include "bench_main.hpp"
#include "bench_stats.hpp"

#include <sys/resource.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <source_location>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "replay/stream_pipeline/basic_pipeline.hpp"

namespace {

using Clock = std::chrono::steady_clock;

long thread_voluntary_switches() {
  rusage usage{};
  getrusage(RUSAGE_THREAD, &usage);
  return usage.ru_nvcsw;
}

// A stage runner without CUDA. With a period, items "run" one after another
// on a modelled device, each `period` after the later of its start and the
// previous item's end; finish() spins (yielding) until then, as
// cudaEventSynchronize does by default.
class StandInRunner {
 public:
  using input_type = float;
  using output_type = float;
  struct plan_type {};

  StandInRunner(std::size_t slots, std::size_t capacity, std::chrono::nanoseconds period)
      : capacity_(capacity), period_(period), done_at_(slots), counts_(slots, 0) {}

  std::size_t slot_count() const noexcept { return done_at_.size(); }
  std::size_t input_capacity() const noexcept { return capacity_; }
  std::size_t output_capacity() const noexcept { return capacity_; }
  std::optional<std::size_t> required_input_count() const noexcept { return std::nullopt; }
  std::optional<std::size_t> planned_output_count(std::size_t n) const { return n; }
  plan_type plan(const replay::HostRange<const float>&, const std::optional<replay::HostRange<float>>&,
                 const std::source_location&) const {
    return {};
  }
  void prepare(std::size_t, std::uint64_t, const replay::HostRange<const float>&, const plan_type&,
               const std::source_location&) {}
  void start(std::size_t slot, std::uint64_t, const replay::HostRange<const float>& input,
             const std::optional<replay::HostRange<float>>&, const plan_type&, const std::source_location&) {
    counts_[slot] = input.size();
    if (period_.count() != 0) {
      const Clock::time_point now = Clock::now();
      device_free_at_ = (now > device_free_at_ ? now : device_free_at_) + period_;
      done_at_[slot] = device_free_at_;  // start() calls are serialized: no lock needed
    }
  }
  std::span<const float> finish(std::size_t slot, replay::PipelineOutputSink<float>) {
    if (period_.count() != 0) {
      while (Clock::now() < done_at_[slot]) {
        std::this_thread::yield();  // as CUDA's default wait does when cores are scarce
      }
    }
    return {output_.data(), counts_[slot]};
  }
  void settle(std::size_t) noexcept {}
  void bind_completion_thread() noexcept {}
  void add_stats(replay::PipelineStats&) const noexcept {}

 private:
  std::size_t capacity_;
  std::chrono::nanoseconds period_;
  Clock::time_point device_free_at_{};
  std::vector<Clock::time_point> done_at_;
  std::vector<std::size_t> counts_;
  std::vector<float> output_ = std::vector<float>(capacity_);
};
static_assert(replay::PipelineStageRunner<StandInRunner>);

enum class Delivery { count, callback };

constexpr std::size_t kSlots = 8;
constexpr std::size_t kElements = 16;
constexpr std::size_t kItems = 20000;

void bookkeeping(benchmark::State& state, Delivery delivery, std::chrono::nanoseconds period) {
  replay::BasicStreamPipeline<StandInRunner> pipeline(std::in_place, kSlots, kElements, period);
  std::vector<float> input(kElements, 1.0f);
  std::vector<float> destination(kElements);
  std::atomic<std::size_t> delivered{0};
  const auto run_batch = [&](std::size_t count) {
    for (std::size_t i = 0; i < count; ++i) {
      if (delivery == Delivery::count) {
        (void)pipeline.submit(std::span<const float>(input), std::span<float>(destination));
      } else {
        (void)pipeline.submit(std::span<const float>(input),
                              [&delivered](const replay::PipelineCompletion<float>& done) {
                                delivered.fetch_add(done.output.size(), std::memory_order_relaxed);
                              });
      }
    }
  };
  run_batch(1000);  // warm: ticket records, the completion thread
  pipeline.drain();
  const std::uint64_t waits_before = pipeline.stats().slot_waits;
  double cpu = 0;
  long sleeps = 0;
  for (auto _ : state) {
    const long switches_start = thread_voluntary_switches();
    const double cpu_start = thread_cpu_seconds();
    run_batch(kItems);
    cpu += thread_cpu_seconds() - cpu_start;
    sleeps += thread_voluntary_switches() - switches_start;
    pipeline.drain();
  }
  const double items = static_cast<double>(kItems) * static_cast<double>(state.iterations());
  state.counters["host_ns_per_item"] = cpu * 1e9 / items;
  state.counters["sleeps_per_item"] = static_cast<double>(sleeps) / items;
  state.counters["slot_waits_per_item"] = static_cast<double>(pipeline.stats().slot_waits - waits_before) / items;
  state.counters["items_per_s"] = benchmark::Counter(items, benchmark::Counter::kIsRate);
  if (pipeline.stats().failed != 0) {
    state.SkipWithError("items failed");
  }
}

void register_all() {
  for (Delivery d : {Delivery::count, Delivery::callback}) {
    const std::string delivery = d == Delivery::count ? "count" : "callback";
    for (int period_us : {0, 5}) {
      const std::string name = "pipeline/bookkeeping/" + delivery + "/" +
                               (period_us == 0 ? std::string("unpaced") : "paced_" + std::to_string(period_us) + "us");
      benchmark::RegisterBenchmark(name.c_str(),
                                   [d, period_us](benchmark::State& s) {
                                     bookkeeping(s, d, std::chrono::microseconds(period_us));
                                   })
          ->UseRealTime()
          ->Unit(benchmark::kMillisecond);
    }
  }
}

}  // namespace

int main(int argc, char** argv) { return run_benchmarks(argc, argv, register_all); }
