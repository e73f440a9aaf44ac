// GraphBuilder benchmarks; one program so scripts/bench_ratios.py reports the
// ratios from one run.
//
//  jacobi_solve:   the Jacobi solve of cuda-samples jacobiCudaGraphs (512 x 512,
//                  2954 iterations to 1e-2), solved to convergence four ways,
//                  interleaved in every iteration (each result checked against
//                  the CPU reference's iteration count and error):
//                    raw_ms     the sample's method 0, raw CUDA
//                               (cudaGraphExecKernelNodeSetParams + launch + sync
//                               per iteration, the host testing convergence);
//                    replay_ms  the same through replay's typed KernelNode::set_args;
//                    while_ms   one launch: a WHILE node, the test on the GPU,
//                               its body one fused kernel (sweep_and_test);
//                    raw_while_ms
//                               the same graph built with the raw CUDA API
//                               (cudaGraphConditionalHandleCreate, a
//                               conditional node, memset and kernel nodes):
//                               what GraphBuilder's WHILE is held to;
//                    while_separate_nodes_ms
//                               one launch: a WHILE node whose body is
//                               separate nodes (memset, sweep, test; the
//                               second half-iteration in a nested IF).
//                  Wall time per solve, from the first call to the result on the host.
//  bucket_route/<mode>: a stream of requests with random batch sizes 1..64,
//                  each a chain of small kernels on its power-of-two bucket:
//                    mode 0  one launch per request: a kernel reads the batch size
//                            from device memory and a SWITCH node runs the bucket's body;
//                    mode 1  ShapeRouter's host routing (the size known on the host);
//                    mode 2  host routing when the size lives on the device (read it
//                            back, synchronize, then route): what SWITCH replaces.
//                  Time per request, bursts of 64 enqueued back to back, then synchronized.
#include <benchmark/benchmark.h>

#include "bench_device.hpp"

#include <chrono>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "../examples/device_loop/jacobi.cuh"
#include "replay/replay.hpp"

namespace {

using clock_type = std::chrono::steady_clock;

// jacobi::DeviceLoop's graph through the raw CUDA API: memsets, then a WHILE
// node whose body is one sweep_and_test kernel node.
class RawDeviceLoop {
 public:
  explicit RawDeviceLoop(jacobi::DeviceSystem& d) : d_(d) {
    replay::check(cudaGraphCreate(&graph_, 0), "cudaGraphCreate");
    try {
      build();
      replay::check(cudaGraphInstantiate(&exec_, graph_, 0), "cudaGraphInstantiate");
    } catch (...) {
      (void)cudaGraphDestroy(graph_);
      throw;
    }
  }
  RawDeviceLoop(const RawDeviceLoop&) = delete;
  RawDeviceLoop& operator=(const RawDeviceLoop&) = delete;
  ~RawDeviceLoop() {
    (void)cudaGraphExecDestroy(exec_);
    (void)cudaGraphDestroy(graph_);
  }

  int solve(replay::StreamRef stream) {
    replay::check(cudaGraphLaunch(exec_, stream.get()), "cudaGraphLaunch");
    int iterations = 0;
    replay::check(cudaMemcpyAsync(&iterations, d_.iterations.data(), sizeof(int), cudaMemcpyDeviceToHost,
                                  stream.get()),
                  "cudaMemcpyAsync");
    stream.synchronize();
    return iterations;
  }
  const double* solution() const { return d_.x.data(); }

 private:
  cudaGraphNode_t add_clear(void* dst, std::size_t bytes) {
    cudaMemsetParams params{};
    params.dst = dst;
    params.value = 0;
    params.elementSize = 1;
    params.width = bytes;
    params.height = 1;
    cudaGraphNode_t node = nullptr;
    replay::check(cudaGraphAddMemsetNode(&node, graph_, nullptr, 0, &params), "cudaGraphAddMemsetNode");
    return node;
  }

  void build() {
    const cudaGraphNode_t cleared[] = {
        add_clear(d_.x.data(), jacobi::kRows * sizeof(double)), add_clear(d_.x_new.data(), jacobi::kRows * sizeof(double)),
        add_clear(d_.residual.data(), sizeof(double)), add_clear(d_.iterations.data(), sizeof(int)),
        add_clear(d_.arrived.data(), sizeof(unsigned))};
    cudaGraphConditionalHandle handle = 0;
    replay::check(cudaGraphConditionalHandleCreate(&handle, graph_, 1, cudaGraphCondAssignDefault),
                  "cudaGraphConditionalHandleCreate");
    cudaGraphNodeParams loop{};
    loop.type = cudaGraphNodeTypeConditional;
    loop.conditional.handle = handle;
    loop.conditional.type = cudaGraphCondTypeWhile;
    loop.conditional.size = 1;
    cudaGraphNode_t loop_node = nullptr;
#if CUDART_VERSION >= 13000  // edge data joined the signature
    replay::check(cudaGraphAddNode(&loop_node, graph_, cleared, nullptr, std::size(cleared), &loop), "cudaGraphAddNode");
#else
    replay::check(cudaGraphAddNode(&loop_node, graph_, cleared, std::size(cleared), &loop), "cudaGraphAddNode");
#endif
    cudaGraph_t body = loop.conditional.phGraph_out[0];

    replay::ConditionalHandle keep_going = replay::ConditionalHandle::from_native_handle(handle);
    const float* a = d_.a.data();
    const double* b = d_.b.data();
    double* x = d_.x.data();
    double* x_new = d_.x_new.data();
    double* residual = d_.residual.data();
    unsigned* arrived = d_.arrived.data();
    int* iterations = d_.iterations.data();
    float threshold = jacobi::kThreshold;
    int max_iterations = jacobi::kMaxIterations;
    void* args[] = {&keep_going, &a, &b, &x, &x_new, &residual, &arrived, &iterations, &threshold, &max_iterations};
    cudaKernelNodeParams kernel{};
    kernel.func = reinterpret_cast<void*>(&jacobi::sweep_and_test);
    kernel.gridDim = dim3(jacobi::kSweepBlocks);
    kernel.blockDim = dim3(jacobi::kSweepThreads);
    kernel.sharedMemBytes = 0;
    kernel.kernelParams = args;
    cudaGraphNode_t sweep_node = nullptr;
    replay::check(cudaGraphAddKernelNode(&sweep_node, body, nullptr, 0, &kernel), "cudaGraphAddKernelNode");
  }

  jacobi::DeviceSystem& d_;
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
};

double ms_since(clock_type::time_point start) {
  return std::chrono::duration<double, std::milli>(clock_type::now() - start).count();
}

// ---- jacobi_solve -------------------------------------------------------------------

void jacobi_solve(benchmark::State& state) {
  if (skip_without_device(state)) return;
  const jacobi::System system = jacobi::make_system();
  const jacobi::Result cpu = jacobi::solve_on_cpu(system);
  replay::Stream stream;
  jacobi::DeviceSystem d(system, stream);
  jacobi::RawNodeUpdate raw(d, stream);
  jacobi::ReplayNodeUpdate typed(d);
  jacobi::DeviceLoop loop(d);
  RawDeviceLoop raw_loop(d);
  jacobi::DeviceLoopOfSeparateNodes separate_loop(d);

  bool wrong = false;
  auto timed = [&](auto& solver) {
    const auto start = clock_type::now();
    const int iterations = solver.solve(stream);
    const double ms = ms_since(start);
    const double error = d.error_of(solver.solution(), stream);
    wrong |= iterations != cpu.iterations || std::fabs(error - cpu.error) > 1e-9 + 1e-6 * cpu.error;
    return ms;
  };
  (void)timed(raw);  // warm-up
  (void)timed(typed);
  (void)timed(loop);
  (void)timed(raw_loop);
  (void)timed(separate_loop);

  double raw_ms = 0.0;
  double replay_ms = 0.0;
  double while_ms = 0.0;
  double raw_while_ms = 0.0;
  double while_separate_ms = 0.0;
  std::int64_t n = 0;
  for (auto _ : state) {
    // Alternate the order so that neither method 0 variant always runs first.
    if ((n & 1) == 0) {
      raw_ms += timed(raw);
      replay_ms += timed(typed);
    } else {
      replay_ms += timed(typed);
      raw_ms += timed(raw);
    }
    // The two WHILE graphs alternate too.
    double w = 0.0;
    if ((n & 1) == 0) {
      w = timed(loop);
      raw_while_ms += timed(raw_loop);
    } else {
      raw_while_ms += timed(raw_loop);
      w = timed(loop);
    }
    while_ms += w;
    while_separate_ms += timed(separate_loop);
    state.SetIterationTime(w / 1e3);
    ++n;
  }
  if (wrong) {
    state.SkipWithError("a solve disagreed with the CPU reference");
    return;
  }
  const auto per = static_cast<double>(n);
  state.counters["raw_ms"] = raw_ms / per;
  state.counters["replay_ms"] = replay_ms / per;
  state.counters["while_ms"] = while_ms / per;
  state.counters["raw_while_ms"] = raw_while_ms / per;
  state.counters["while_separate_nodes_ms"] = while_separate_ms / per;
  state.counters["iterations"] = cpu.iterations;
}

// ---- bucket_route --------------------------------------------------------------------

constexpr int kMaxBatch = 64;
constexpr int kFeatures = 256;
constexpr int kBuckets = 7;  // 1, 2, 4, ..., 64
constexpr int kKernels = 8;  // per bucket body
constexpr int kBurst = 64;

__global__ void scale_rows(float* x, int n, float a) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n) {
    x[i] = a * x[i] + 1.0F;
  }
}

// Reads the next request's batch size and selects its bucket: the smallest
// power of two at least as large (a size above the last bucket selects none).
__global__ void select_bucket(replay::ConditionalHandle bucket, const int* sizes, int* cursor) {
  const int n = sizes[*cursor];
  *cursor += 1;
  unsigned index = 0;
  while ((1 << index) < n) {
    ++index;
  }
  bucket.set(index);
}

void issue_bucket(float* x, int batch, replay::StreamRef s) {
  const int n = batch * kFeatures;
  for (int k = 0; k < kKernels; ++k) {
    scale_rows<<<(n + 255) / 256, 256, 0, s.get()>>>(x, n, 0.999F);
  }
  replay::check_last_launch("scale_rows");
}

std::vector<int> random_batches(std::size_t count) {
  std::mt19937 engine{12345};
  std::uniform_int_distribution<int> dist(1, kMaxBatch);
  std::vector<int> out(count);
  for (int& v : out) {
    v = dist(engine);
  }
  return out;
}

void bucket_route(benchmark::State& state) {
  if (skip_without_device(state)) return;
  const int mode = static_cast<int>(state.range(0));
  replay::Stream stream;
  replay::DeviceBuffer<float> x(static_cast<std::size_t>(kMaxBatch) * kFeatures);
  x.zero(stream);
  constexpr std::size_t kRequests = 4096;
  const auto sizes = random_batches(kRequests);
  replay::DeviceBuffer<int> sizes_device(kRequests);
  sizes_device.copy_from(std::span<const int>(sizes), stream);
  replay::DeviceBuffer<int> cursor(1);
  replay::PinnedBuffer<int> size_host(1);

  // mode 0: one graph, SWITCH over the bucket bodies.
  replay::Graph graph = replay::make_graph();
  {
    replay::GraphBuilder g(graph);
    auto bucket = g.make_condition(0);
    auto select = g.add_kernel(select_bucket, 1, 1, 0, {}, bucket, static_cast<const int*>(sizes_device.data()),
                               cursor.data());
    auto route = g.add_switch(bucket, kBuckets, {select});
    for (unsigned c = 0; c < kBuckets; ++c) {
      (void)route.body(c).capture(stream, [&](replay::StreamRef s) { issue_bucket(x.data(), 1 << c, s); });
    }
  }
  replay::GraphExec device_routed(graph);

  // modes 1 and 2: ShapeRouter over the same buckets.
  replay::ShapeRouter<int> router([&](int batch, replay::StreamRef s) { issue_bucket(x.data(), batch, s); },
                                  replay::ShapeRouterOptions<int>::bucketed(replay::power_of_two_buckets(kMaxBatch)));
  router.capture_all(stream);
  stream.synchronize();

  std::size_t next = 0;
  for (auto _ : state) {
    if (next + kBurst > kRequests) {
      next = 0;
    }
    const int start_index = static_cast<int>(next);
    replay::check(cudaMemcpyAsync(cursor.data(), &start_index, sizeof(int), cudaMemcpyHostToDevice, stream.get()),
                  "cudaMemcpyAsync");
    stream.synchronize();
    const auto start = clock_type::now();
    for (int r = 0; r < kBurst; ++r, ++next) {
      if (mode == 0) {
        device_routed.launch(stream);
      } else if (mode == 1) {
        (void)router.run(sizes[next], stream);
      } else {
        replay::check(cudaMemcpyAsync(size_host.data(), sizes_device.data() + next, sizeof(int),
                                      cudaMemcpyDeviceToHost, stream.get()),
                      "cudaMemcpyAsync");
        stream.synchronize();
        (void)router.run(*size_host.data(), stream);
      }
    }
    stream.synchronize();
    state.SetIterationTime(ms_since(start) / 1e3 / kBurst);
  }
  static const char* const labels[] = {"device SWITCH", "ShapeRouter host routing",
                                       "host routing, size read back from the device"};
  state.SetLabel(labels[mode]);
}

}  // namespace

BENCHMARK(jacobi_solve)->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(6);
BENCHMARK(bucket_route)->ArgName("mode")->Arg(0)->Arg(1)->Arg(2)->UseManualTime()->Unit(benchmark::kMicrosecond)
    ->Iterations(40);

BENCHMARK_MAIN();
