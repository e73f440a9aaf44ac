// Programmatic dependent launch: chains of 100 dependent kernels replayed as
// one graph, plain against programmatic edges, at three sizes:
//   size 0: 1 block of 256 threads touching 1 KiB;
//   size 1: one block of 256 threads per SM, touching 256 KiB;
//   size 2: one block of 256 threads per SM, touching 4 MiB.
// Each kernel waits for its predecessor (replay::wait_for_prerequisite_grid),
// lets its successor start (replay::release_dependent_grids), then reads the
// predecessor's output and writes its own (two buffers, ping-pong). The same
// kernel runs in every graph; in a plain graph its wait returns at once.
//
// Graphs (mode): 0 plain, captured (replay::launch); 1 PDL, captured
// (replay::launch with LaunchAttributes::programmatic()); 2 plain, built
// (GraphBuilder); 3 PDL, built (add_programmatic_dependency); 4 plain and
// 5 PDL captured from raw cudaLaunchKernelEx.
//
//  chain/<size>/<mode>:  GPU time per kernel of one replay of a graph
//                        (CUDA events around 10 replays, / 1000 kernels).
//  paired/<size>/<pair>: two graphs replayed alternately in one loop; counters
//                        first_ns and second_ns (medians, per kernel) and
//                        ratio, the median of the pairs' first / second.
//                        Pairs: 0 plain / PDL captured, 1 plain / PDL built,
//                        2 raw plain / raw PDL, 3 raw PDL / replay PDL,
//                        4 raw plain / replay plain.
#include <benchmark/benchmark.h>

#include "bench_device.hpp"
#include "bench_stats.hpp"

#include <iterator>
#include <string>
#include <chrono>
#include <cstddef>
#include <vector>

#include "replay/replay.hpp"

namespace {

constexpr int kKernels = 100;
constexpr int kReplays = 10;  // replays per timed sample
constexpr int kThreads = 256;

__global__ void chain_kernel(const float* in, float* out, int n, float a) {
  const float b = 0.5F * a;  // the prologue: parameters only
  replay::wait_for_prerequisite_grid();
  replay::release_dependent_grids();
  const int stride = static_cast<int>(gridDim.x * blockDim.x);
  for (int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x); i < n; i += stride) {
    out[i] = in[i] * a + b;
  }
}

enum Mode : int { plain_captured, pdl_captured, plain_built, pdl_built, raw_plain, raw_pdl, modes };
const char* const kModeNames[] = {"plain, captured", "PDL, captured", "plain, built",
                                  "PDL, built",      "raw plain",     "raw PDL"};
const char* const kSizeNames[] = {"1 block, 1 KiB", "SMs x 256, 256 KiB", "SMs x 256, 4 MiB"};

int sm_count() {
  int device = 0;
  int sms = 0;
  replay::check(cudaGetDevice(&device), "cudaGetDevice");
  replay::check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), "cudaDeviceGetAttribute");
  return sms;
}

struct Shape {
  int blocks;
  int elements;
};
Shape shape_of(int size) {
  switch (size) {
    case 0: return {1, 256};
    case 1: return {sm_count(), 256 * 1024 / 4};
    default: return {sm_count(), 4 * 1024 * 1024 / 4};
  }
}

// The six graphs of one size, instantiated.
struct Fixture {
  replay::Stream stream;
  Shape shape;
  replay::DeviceBuffer<float> a;
  replay::DeviceBuffer<float> b;
  std::vector<replay::GraphExec> execs;

  explicit Fixture(int size)
      : shape(shape_of(size)), a(static_cast<std::size_t>(shape.elements)), b(static_cast<std::size_t>(shape.elements)) {
    a.fill(1.0F, stream);
    b.fill(1.0F, stream);
    for (int mode = 0; mode < modes; ++mode) {
      const replay::Graph graph = make(mode);
      execs.emplace_back(graph, replay::InstantiateFlags::upload, stream);
    }
    stream.synchronize();
  }

  float* in(int k) const { return k % 2 == 0 ? a.data() : b.data(); }
  float* out(int k) const { return k % 2 == 0 ? b.data() : a.data(); }
  static float factor(int k) { return k % 2 == 0 ? 0.5F : 2.0F; }  // keeps the values bounded

  replay::Graph make(int mode) {
    const bool pdl = mode == pdl_captured || mode == pdl_built || mode == raw_pdl;
    const replay::LaunchConfig config{dim3(static_cast<unsigned>(shape.blocks)), dim3(kThreads), 0};
    if (mode == plain_captured || mode == pdl_captured) {
      const replay::LaunchAttributes attributes = pdl ? replay::LaunchAttributes::programmatic() : replay::LaunchAttributes{};
      return replay::capture(stream, [&](replay::StreamRef s) {
        for (int k = 0; k < kKernels; ++k) {
          replay::launch(s, {config, attributes}, chain_kernel, in(k), out(k), shape.elements, factor(k));
        }
      });
    }
    if (mode == plain_built || mode == pdl_built) {
      replay::Graph graph = replay::make_graph();
      replay::GraphBuilder builder(graph);
      replay::Node previous;
      for (int k = 0; k < kKernels; ++k) {
        const replay::Deps deps = (pdl || !previous) ? replay::Deps{} : replay::Deps{previous};
        replay::Node node = builder.add_kernel(chain_kernel, config, deps, in(k), out(k), shape.elements, factor(k));
        if (pdl && previous) {
          builder.add_programmatic_dependency(previous, node);
        }
        previous = node;
      }
      return graph;
    }
    // Raw CUDA: cudaLaunchKernelEx straight into a capture.
    replay::check(cudaStreamBeginCapture(stream.get(), cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
    cudaLaunchAttribute attribute{};
    attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attribute.val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t raw{};
    raw.gridDim = config.grid;
    raw.blockDim = config.block;
    raw.stream = stream.get();
    raw.attrs = pdl ? &attribute : nullptr;
    raw.numAttrs = pdl ? 1 : 0;
    for (int k = 0; k < kKernels; ++k) {
      replay::check(cudaLaunchKernelEx(&raw, chain_kernel, static_cast<const float*>(in(k)), out(k), shape.elements,
                                       factor(k)),
                    "cudaLaunchKernelEx");
    }
    cudaGraph_t graph = nullptr;
    replay::check(cudaStreamEndCapture(stream.get(), &graph), "cudaStreamEndCapture");
    return replay::Graph::from_native_handle(graph);
  }

  // Seconds per kernel of kReplays replays of `mode`, from CUDA events.
  double per_kernel(int mode, replay::Event& start, replay::Event& stop) {
    start.record(stream);
    for (int r = 0; r < kReplays; ++r) {
      execs[static_cast<std::size_t>(mode)].launch(stream);
    }
    stop.record(stream);
    stop.synchronize();
    return static_cast<double>(replay::Event::elapsed_ms(start, stop)) * 1e-3 / (kReplays * kKernels);
  }

  // About 100 ms of replays first, so that the clocks have ramped up.
  void warm_clocks() {
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(100);
    while (std::chrono::steady_clock::now() < until) {
      execs[0].launch(stream);
      stream.synchronize();
    }
  }
};

void chain(benchmark::State& state) {
  if (skip_without_device(state)) return;
  const int size = static_cast<int>(state.range(0));
  const int mode = static_cast<int>(state.range(1));
  Fixture f(size);
  auto start = replay::Event::timing();
  auto stop = replay::Event::timing();
  f.warm_clocks();
  for (auto _ : state) {
    state.SetIterationTime(f.per_kernel(mode, start, stop));
  }
  state.SetLabel(std::string(kModeNames[mode]) + "; " + kSizeNames[size] + "; time per kernel");
}

constexpr int kPairs[][2] = {{plain_captured, pdl_captured},
                             {plain_built, pdl_built},
                             {raw_plain, raw_pdl},
                             {raw_pdl, pdl_captured},
                             {raw_plain, plain_captured}};

void paired(benchmark::State& state) {
  if (skip_without_device(state)) return;
  const int size = static_cast<int>(state.range(0));
  const int pair = static_cast<int>(state.range(1));
  Fixture f(size);
  auto start = replay::Event::timing();
  auto stop = replay::Event::timing();
  f.warm_clocks();
  PairedSamples samples;  // the first graph against the second
  for (auto _ : state) {
    (void)samples.time([&] { return f.per_kernel(kPairs[pair][0], start, stop); },
                       [&] { return f.per_kernel(kPairs[pair][1], start, stop); });
    state.SetIterationTime(0.0);
  }
  state.counters["first_ns"] = samples.measured_median() * 1e9;
  state.counters["second_ns"] = samples.baseline_median() * 1e9;
  state.counters["ratio"] = samples.ratio_median();
  state.SetLabel(std::string(kModeNames[kPairs[pair][0]]) + " / " + kModeNames[kPairs[pair][1]] + "; " +
                 kSizeNames[size]);
}

void chain_args(benchmark::internal::Benchmark* b) {
  b->ArgNames({"size", "mode"});
  for (int size = 0; size < 3; ++size) {
    for (int mode = 0; mode < modes; ++mode) {
      b->Args({size, mode});
    }
  }
}
void pair_args(benchmark::internal::Benchmark* b) {
  b->ArgNames({"size", "pair"});
  for (int size = 0; size < 3; ++size) {
    for (int pair = 0; pair < static_cast<int>(std::size(kPairs)); ++pair) {
      b->Args({size, pair});
    }
  }
}

}  // namespace

BENCHMARK(chain)->Apply(chain_args)->UseManualTime()->Unit(benchmark::kMicrosecond)->Iterations(30);
BENCHMARK(paired)->Apply(pair_args)->UseManualTime()->Iterations(60);

BENCHMARK_MAIN();
