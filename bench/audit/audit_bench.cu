// The capture audit's cost (replay/audit.hpp).
//
//  capture_audited/<kernels>:  audit_capture() (subscribe, record, report,
//                              unsubscribe) against replay::capture of the same
//                              chain, alternately; counter audited_over_plain
//                              (median of the pairs' ratios). Reported.
//  capture_subscribed/<kernels>: CaptureAudit::capture with the subscription
//                              held across captures (no subscribe per capture)
//                              against replay::capture. Reported.
//  launch_subscribed:          eager launches of one kernel while a
//                              CaptureAudit is alive (subscribed, nothing
//                              recording) against none. Reported.
//  capture_off_paired/<kernels>, launch_off_paired/<kernels>: replay::capture
//                              and GraphExec::launch with the audit in the
//                              program but switched off (REPLAY_AUDIT unset),
//                              against the same with the audit's hook removed,
//                              which is the program without the component: the
//                              core reads the switch and never reaches the
//                              audit. Counter linked_over_absent; target <= 1.02.
#include <benchmark/benchmark.h>

#include "bench_stats.hpp"

#include <chrono>
#include <cstddef>
#include <optional>
#include <vector>

#include "replay/audit.hpp"
#include "replay/replay.hpp"

namespace {

constexpr int kElements = 256;

__global__ void tiny_kernel(float* x, float a) { x[threadIdx.x] = a * x[threadIdx.x] + 1.0F; }

void chain(replay::StreamRef s, float* x, int kernels) {
  for (int k = 0; k < kernels; ++k) {
    tiny_kernel<<<1, kElements, 0, s.get()>>>(x, 0.5F);
  }
  replay::check_last_launch();
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

bool skip_without_device(benchmark::State& state) {
  if (!replay::has_device()) {
    state.SkipWithError("no CUDA device");
    return true;
  }
  return false;
}

// The audit's hook in the core, removed for a scope: the program as it would
// be without the component.
class WithoutAuditHook {
 public:
  WithoutAuditHook() : saved_(replay::detail::capture_observer().load()) {
    replay::detail::install_capture_observer(nullptr);
  }
  WithoutAuditHook(const WithoutAuditHook&) = delete;
  WithoutAuditHook& operator=(const WithoutAuditHook&) = delete;
  ~WithoutAuditHook() { replay::detail::install_capture_observer(saved_); }

 private:
  replay::detail::CaptureObserver saved_;
};

bool skip_when_audit_on(benchmark::State& state) {
  if (replay::detail::audit_requested_by_environment()) {
    state.SkipWithError("REPLAY_AUDIT is set: the 'off' rows need it unset");
    return true;
  }
  if (replay::detail::capture_observer().load() == nullptr) {
    state.SkipWithError("the audit's hook is not installed");
    return true;
  }
  return false;
}

// `audited()` against `plain()` (seconds each), alternately; counters
// plain_us, audited_us (medians) and audited_over_plain (median of the pairs' ratios).
template <class Audited, class Plain>
void audited_against_plain(benchmark::State& state, Audited audited, Plain plain) {
  PairedSamples pairs;
  for (auto _ : state) {
    (void)pairs.time(audited, plain);
    state.SetIterationTime(0.0);
  }
  state.counters["plain_us"] = pairs.baseline_median() * 1e6;
  state.counters["audited_us"] = pairs.measured_median() * 1e6;
  state.counters["audited_over_plain"] = pairs.ratio_median();
}

// A plain replay::capture of the chain (audit off), in seconds.
double plain_capture(replay::StreamRef stream, float* x, int kernels) {
  const auto start = std::chrono::steady_clock::now();
  replay::Graph graph = replay::capture(stream, [&](replay::StreamRef s) { chain(s, x, kernels); },
                                        replay::CaptureMode::this_thread, replay::AuditSwitch::off);
  benchmark::DoNotOptimize(graph.get());
  return seconds_since(start);
}

void capture_audited(benchmark::State& state) {
  if (skip_without_device(state)) return;
  const int kernels = static_cast<int>(state.range(0));
  replay::Stream stream;
  replay::DeviceBuffer<float> x(kElements);
  bool clean = true;
  audited_against_plain(
      state,
      [&] {
        const auto start = std::chrono::steady_clock::now();
        auto result = replay::audit_capture(stream, [&](replay::StreamRef s) { chain(s, x.data(), kernels); });
        benchmark::DoNotOptimize(result.graph.get());
        const double s = seconds_since(start);
        clean = clean && result.report.clean() &&
                result.report.inventory.kernel_nodes() == static_cast<std::size_t>(kernels);
        return s;
      },
      [&] { return plain_capture(stream, x.data(), kernels); });
  if (!clean) {
    state.SkipWithError("an audited capture of a clean chain was not reported clean");
    return;
  }
  state.counters["kernels"] = kernels;
}

void capture_subscribed(benchmark::State& state) {
  if (skip_without_device(state)) return;
  const int kernels = static_cast<int>(state.range(0));
  replay::Stream stream;
  replay::DeviceBuffer<float> x(kElements);
  replay::CaptureAudit audit;
  audited_against_plain(
      state,
      [&] {
        const auto start = std::chrono::steady_clock::now();
        auto result = audit.capture(stream, [&](replay::StreamRef s) { chain(s, x.data(), kernels); });
        benchmark::DoNotOptimize(result.graph.get());
        return seconds_since(start);
      },
      [&] { return plain_capture(stream, x.data(), kernels); });
  state.counters["kernels"] = kernels;
}

void launch_subscribed(benchmark::State& state) {
  if (skip_without_device(state)) return;
  replay::Stream stream;
  replay::DeviceBuffer<float> x(kElements);
  constexpr int burst = 64;
  std::optional<replay::CaptureAudit> audit;
  auto burst_of = [&] {
    const auto start = std::chrono::steady_clock::now();
    for (int b = 0; b < burst; ++b) {
      tiny_kernel<<<1, kElements, 0, stream.get()>>>(x.data(), 0.5F);
    }
    const double s = seconds_since(start);
    stream.synchronize();
    return s / burst;
  };
  PairedSamples pairs;
  for (auto _ : state) {
    (void)pairs.time(
        [&] {
          audit.emplace();
          const double s = burst_of();
          audit.reset();
          return s;
        },
        burst_of);
    state.SetIterationTime(0.0);
  }
  state.counters["alone_ns"] = pairs.baseline_median() * 1e9;
  state.counters["subscribed_ns"] = pairs.measured_median() * 1e9;
  state.counters["subscribed_over_alone"] = pairs.ratio_median();
}

// `run()` (seconds for `per_run` operations) with the audit linked but off,
// and with its hook removed, alternately; counters linked_ns, absent_ns
// (per operation, medians) and linked_over_absent (median of the pairs' ratios).
template <class Run>
void linked_against_absent(benchmark::State& state, int per_run, Run run) {
  PairedSamples pairs;
  for (auto _ : state) {
    (void)pairs.time(run, [&] {
      const WithoutAuditHook without;
      return run();
    });
    state.SetIterationTime(0.0);
  }
  state.counters["linked_ns"] = pairs.measured_median() / per_run * 1e9;
  state.counters["absent_ns"] = pairs.baseline_median() / per_run * 1e9;
  state.counters["linked_over_absent"] = pairs.ratio_median();
}

void capture_off_paired(benchmark::State& state) {
  if (skip_without_device(state) || skip_when_audit_on(state)) return;
  const int kernels = static_cast<int>(state.range(0));
  replay::Stream stream;
  replay::DeviceBuffer<float> x(kElements);
  const int burst = kernels == 1 ? 8 : 1;
  linked_against_absent(state, burst, [&] {
    const auto start = std::chrono::steady_clock::now();
    for (int b = 0; b < burst; ++b) {
      replay::Graph graph = replay::capture(stream, [&](replay::StreamRef s) { chain(s, x.data(), kernels); });
      benchmark::DoNotOptimize(graph.get());
    }
    return seconds_since(start);
  });
  state.counters["kernels"] = kernels;
}

void launch_off_paired(benchmark::State& state) {
  if (skip_without_device(state) || skip_when_audit_on(state)) return;
  const int kernels = static_cast<int>(state.range(0));
  replay::Stream stream;
  replay::DeviceBuffer<float> x(kElements);
  const replay::Graph graph = replay::capture(stream, [&](replay::StreamRef s) { chain(s, x.data(), kernels); });
  const replay::GraphExec exec(graph, replay::InstantiateFlags::upload, stream);
  stream.synchronize();
  constexpr int burst = 8;
  linked_against_absent(state, burst, [&] {
    const auto start = std::chrono::steady_clock::now();
    for (int b = 0; b < burst; ++b) {
      exec.launch(stream);
    }
    const double s = seconds_since(start);
    stream.synchronize();
    return s;
  });
  state.counters["kernels"] = kernels;
}

}  // namespace

BENCHMARK(capture_audited)->ArgName("kernels")->Arg(1)->UseManualTime()->Iterations(200);
BENCHMARK(capture_audited)->ArgName("kernels")->Arg(1000)->UseManualTime()->Iterations(20);
BENCHMARK(capture_subscribed)->ArgName("kernels")->Arg(1)->UseManualTime()->Iterations(400);
BENCHMARK(capture_subscribed)->ArgName("kernels")->Arg(1000)->UseManualTime()->Iterations(20);
BENCHMARK(launch_subscribed)->UseManualTime()->Iterations(100);
BENCHMARK(capture_off_paired)->ArgName("kernels")->Arg(1)->UseManualTime()->Iterations(2000);
BENCHMARK(capture_off_paired)->ArgName("kernels")->Arg(1000)->UseManualTime()->Iterations(40);
BENCHMARK(launch_off_paired)->ArgName("kernels")->Arg(1)->UseManualTime()->Iterations(4000);
BENCHMARK(launch_off_paired)->ArgName("kernels")->Arg(1000)->UseManualTime()->Iterations(150);

BENCHMARK_MAIN();
