#pragma once
// The Jacobi solve of NVIDIA's cuda-samples jacobiCudaGraphs (a 512 x 512
// system with N+1 on the diagonal and 1 elsewhere, b = 2N, so x = 1; start
// from x = 0; stop when the sum of |dx| over one sweep is at most 1e-2),
// re-implemented three ways:
//   RawNodeUpdate    the sample's method 0 in raw CUDA: a captured graph
//                    (memset, sweep, copy the residual back), the sweep's
//                    arguments swapped each iteration with
//                    cudaGraphExecKernelNodeSetParams, the host testing the
//                    residual after every launch;
//   ReplayNodeUpdate the same graph built with replay::GraphBuilder, the
//                    arguments swapped through the typed node handle;
//   DeviceLoop       the whole solve in one launch: a WHILE node whose body,
//                    one kernel, sweeps and tests convergence on the GPU;
//   DeviceLoopOfSeparateNodes
//                    the whole solve in one launch, the WHILE body built as
//                    separate nodes, as a user would first write it: a
//                    memset, method 0's sweep and a one-thread test kernel,
//                    with the second half-iteration (x_new back into x) in a
//                    nested IF. Six nodes and an IF a pass instead of one
//                    kernel: what the fused body saves.
// Shared by examples/device_loop and bench/graph_builder_bench.cu.
#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>
#include <span>
#include <utility>
#include <vector>

#include "replay/replay.hpp"

namespace jacobi {

constexpr int kRows = 512;
constexpr float kThreshold = 1.0e-2F;
constexpr int kMaxIterations = 4 * kRows * kRows;  // the sample's bound: in effect, until converged
constexpr int kRowsPerBlock = 8;                   // one warp per row
constexpr int kSweepThreads = 32 * kRowsPerBlock;
constexpr int kSweepBlocks = kRows / kRowsPerBlock;

struct System {
  std::vector<float> a;   // row-major kRows x kRows
  std::vector<double> b;  // kRows
};

inline System make_system() {
  System s{std::vector<float>(static_cast<std::size_t>(kRows) * kRows, 1.0F),
           std::vector<double>(kRows, 2.0 * kRows)};
  for (int i = 0; i < kRows; ++i) {
    s.a[static_cast<std::size_t>(i) * kRows + i] = static_cast<float>(kRows + 1);
  }
  return s;
}

struct Result {
  int iterations = 0;
  double error = 0.0;  // sum over i of |x_i - 1|
};

inline double error_of(std::span<const double> x) {
  double sum = 0.0;
  for (double v : x) {
    sum += std::fabs(v - 1.0);
  }
  return sum;
}

// The CPU reference: the same sweeps in double precision.
inline Result solve_on_cpu(const System& s) {
  std::vector<double> x(kRows, 0.0);
  std::vector<double> next(kRows, 0.0);
  int k = 0;
  for (; k < kMaxIterations; ++k) {
    double residual = 0.0;
    for (int i = 0; i < kRows; ++i) {
      const float* row = &s.a[static_cast<std::size_t>(i) * kRows];
      double dot = 0.0;
      for (int j = 0; j < kRows; ++j) {
        dot += static_cast<double>(row[j]) * x[static_cast<std::size_t>(j)];
      }
      const double dx = (s.b[static_cast<std::size_t>(i)] - dot) / row[i];
      next[static_cast<std::size_t>(i)] = x[static_cast<std::size_t>(i)] + dx;
      residual += std::fabs(dx);
    }
    x.swap(next);
    if (residual <= kThreshold) {
      break;
    }
  }
  return Result{k + 1, error_of(x)};
}

// One sweep over this block's rows: x_new = x + (b - A x) / diag(A), and the
// block's sum of |dx| added to *residual. One warp per row.
__device__ inline void sweep_rows(const float* a, const double* b, const double* x, double* x_new, double* residual) {
  __shared__ double partial[kRowsPerBlock];
  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int row = static_cast<int>(blockIdx.x) * kRowsPerBlock + warp;
  const float* a_row = a + static_cast<std::size_t>(row) * kRows;
  double dot = 0.0;
  for (int j = lane; j < kRows; j += 32) {
    dot += static_cast<double>(a_row[j]) * x[j];
  }
  for (int offset = 16; offset > 0; offset /= 2) {
    dot += __shfl_down_sync(0xffffffffU, dot, offset);
  }
  if (lane == 0) {
    const double dx = (b[row] - dot) / a_row[row];
    x_new[row] = x[row] + dx;
    partial[warp] = fabs(dx);
  }
  __threadfence();  // x_new visible device-wide before this block reports (see sweep_and_test)
  __syncthreads();
  if (threadIdx.x == 0) {
    double sum = 0.0;
    for (int w = 0; w < kRowsPerBlock; ++w) {
      sum += partial[w];
    }
    atomicAdd(residual, sum);
  }
}

// The sweep as the sample's method 0 launches it.
__global__ void sweep(const float* a, const double* b, const double* x, double* x_new, double* residual) {
  sweep_rows(a, b, x, x_new, residual);
}

// The device loop's body: one sweep, then the convergence test on the GPU in
// the block that finishes last (every other block has read x by then): x =
// x_new, count the iteration, clear the residual, and keep looping while it
// is above the threshold.
__global__ void sweep_and_test(replay::ConditionalHandle keep_going, const float* a, const double* b, double* x,
                               double* x_new, double* residual, unsigned* arrived, int* iterations, float threshold,
                               int max_iterations) {
  sweep_rows(a, b, x, x_new, residual);
  __shared__ bool last;
  if (threadIdx.x == 0) {
    __threadfence();
    last = atomicAdd(arrived, 1U) == gridDim.x - 1;
  }
  __syncthreads();
  if (!last) {
    return;
  }
  __threadfence();
  for (int i = static_cast<int>(threadIdx.x); i < kRows; i += static_cast<int>(blockDim.x)) {
    x[i] = __ldcg(&x_new[i]);
  }
  if (threadIdx.x == 0) {
    *arrived = 0;
    const int done = *iterations + 1;
    *iterations = done;
    const double r = __ldcg(residual);
    *residual = 0.0;
    keep_going.set(r > threshold && done < max_iterations ? 1U : 0U);
  }
}

// The tests of DeviceLoopOfSeparateNodes, one thread each: count the
// half-iteration; keep going while the residual is above the threshold.
__device__ inline unsigned count_and_test(const double* residual, int* iterations, float threshold,
                                          int max_iterations) {
  const int done = *iterations + 1;
  *iterations = done;
  return *residual > threshold && done < max_iterations ? 1U : 0U;
}
// After the first half: also decides whether the second half (the nested IF) runs.
__global__ void test_first_half(replay::ConditionalHandle keep_going, replay::ConditionalHandle second_half,
                                const double* residual, int* iterations, float threshold, int max_iterations) {
  const unsigned go = count_and_test(residual, iterations, threshold, max_iterations);
  keep_going.set(go);
  second_half.set(go);
}
__global__ void test_second_half(replay::ConditionalHandle keep_going, const double* residual, int* iterations,
                                 float threshold, int max_iterations) {
  keep_going.set(count_and_test(residual, iterations, threshold, max_iterations));
}

// Device data shared by every method.
struct DeviceSystem {
  replay::DeviceBuffer<float> a{static_cast<std::size_t>(kRows) * kRows};
  replay::DeviceBuffer<double> b{kRows};
  replay::DeviceBuffer<double> x{kRows};
  replay::DeviceBuffer<double> x_new{kRows};
  replay::DeviceBuffer<double> residual{1};
  replay::DeviceBuffer<int> iterations{1};
  replay::DeviceBuffer<unsigned> arrived{1};
  replay::PinnedBuffer<double> residual_host{1};

  DeviceSystem(const System& s, replay::StreamRef stream) {
    a.copy_from(std::span<const float>(s.a), stream);
    b.copy_from(std::span<const double>(s.b), stream);
    stream.synchronize();
  }
  void reset(replay::StreamRef stream) const {
    x.zero(stream);
    x_new.zero(stream);
  }
  double error_of(const double* solution, replay::StreamRef stream) const {
    std::vector<double> host(kRows);
    replay::check(cudaMemcpyAsync(host.data(), solution, kRows * sizeof(double), cudaMemcpyDeviceToHost, stream.get()),
                  "cudaMemcpyAsync");
    stream.synchronize();
    return jacobi::error_of(host);
  }
};

// Method 0 in raw CUDA, as the sample writes it.
class RawNodeUpdate {
 public:
  RawNodeUpdate(DeviceSystem& d, replay::StreamRef stream) : d_(d) {
    // The capture is raw too; a failure here throws before anything is owned.
    replay::check(cudaStreamBeginCapture(stream.get(), cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
    replay::check(cudaMemsetAsync(d.residual.data(), 0, sizeof(double), stream.get()), "cudaMemsetAsync");
    sweep<<<kSweepBlocks, kSweepThreads, 0, stream.get()>>>(d.a.data(), d.b.data(), d.x.data(), d.x_new.data(),
                                                            d.residual.data());
    replay::check_last_launch("sweep");
    replay::check(cudaMemcpyAsync(d.residual_host.data(), d.residual.data(), sizeof(double), cudaMemcpyDeviceToHost,
                                  stream.get()),
                  "cudaMemcpyAsync");
    replay::check(cudaStreamEndCapture(stream.get(), &graph_), "cudaStreamEndCapture");
    std::size_t count = 0;
    replay::check(cudaGraphGetNodes(graph_, nullptr, &count), "cudaGraphGetNodes");
    std::vector<cudaGraphNode_t> nodes(count);
    replay::check(cudaGraphGetNodes(graph_, nodes.data(), &count), "cudaGraphGetNodes");
    for (cudaGraphNode_t node : nodes) {
      cudaGraphNodeType type{};
      replay::check(cudaGraphNodeGetType(node, &type), "cudaGraphNodeGetType");
      if (type == cudaGraphNodeTypeKernel) {
        sweep_node_ = node;
      }
    }
    replay::check(cudaGraphKernelNodeGetParams(sweep_node_, &even_), "cudaGraphKernelNodeGetParams");
    odd_ = even_;
    even_args_[0] = &a_;
    even_args_[1] = &b_;
    even_args_[2] = &x_;
    even_args_[3] = &x_new_;
    even_args_[4] = &residual_;
    odd_args_[0] = &a_;
    odd_args_[1] = &b_;
    odd_args_[2] = &x_new_;
    odd_args_[3] = &x_;
    odd_args_[4] = &residual_;
    even_.kernelParams = even_args_;
    odd_.kernelParams = odd_args_;
    replay::check(cudaGraphInstantiate(&exec_, graph_, 0), "cudaGraphInstantiate");
  }
  RawNodeUpdate(const RawNodeUpdate&) = delete;
  RawNodeUpdate& operator=(const RawNodeUpdate&) = delete;
  ~RawNodeUpdate() {
    (void)cudaGraphExecDestroy(exec_);
    (void)cudaGraphDestroy(graph_);
  }

  // Solves from x = 0; the solution is left in solution().
  int solve(replay::StreamRef stream) {
    d_.reset(stream);
    int k = 0;
    for (; k < kMaxIterations; ++k) {
      replay::check(cudaGraphExecKernelNodeSetParams(exec_, sweep_node_, (k & 1) == 0 ? &even_ : &odd_),
                    "cudaGraphExecKernelNodeSetParams");
      replay::check(cudaGraphLaunch(exec_, stream.get()), "cudaGraphLaunch");
      replay::check(cudaStreamSynchronize(stream.get()), "cudaStreamSynchronize");
      if (*d_.residual_host.data() <= kThreshold) {
        break;
      }
    }
    last_ = k;
    return k + 1;
  }
  const double* solution() const { return (last_ & 1) == 0 ? d_.x_new.data() : d_.x.data(); }

 private:
  DeviceSystem& d_;
  const float* a_ = d_.a.data();
  const double* b_ = d_.b.data();
  double* x_ = d_.x.data();
  double* x_new_ = d_.x_new.data();
  double* residual_ = d_.residual.data();
  void* even_args_[5]{};
  void* odd_args_[5]{};
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
  cudaGraphNode_t sweep_node_ = nullptr;
  cudaKernelNodeParams even_{};
  cudaKernelNodeParams odd_{};
  int last_ = 0;
};

// Method 0 through replay: the graph built node by node, the arguments
// swapped through the typed node handle.
class ReplayNodeUpdate {
 public:
  explicit ReplayNodeUpdate(DeviceSystem& d) : d_(d), graph_(build(d, step_)), exec_(graph_) {}

  int solve(replay::StreamRef stream) {
    d_.reset(stream);
    int k = 0;
    for (; k < kMaxIterations; ++k) {
      const bool even = (k & 1) == 0;
      step_.set_args(exec_, d_.a.data(), d_.b.data(), even ? d_.x.data() : d_.x_new.data(),
                     even ? d_.x_new.data() : d_.x.data(), d_.residual.data());
      exec_.launch(stream);
      stream.synchronize();
      if (*d_.residual_host.data() <= kThreshold) {
        break;
      }
    }
    last_ = k;
    return k + 1;
  }
  const double* solution() const { return (last_ & 1) == 0 ? d_.x_new.data() : d_.x.data(); }
  const replay::Graph& graph() const { return graph_; }

 private:
  using SweepNode = replay::KernelNode<const float*, const double*, const double*, double*, double*>;

  static replay::Graph build(DeviceSystem& d, SweepNode& step) {
    replay::Graph graph = replay::make_graph();
    replay::GraphBuilder g(graph);
    auto clear = g.add_memset(d.residual.data(), 0, sizeof(double));
    step = g.add_kernel(sweep, kSweepBlocks, kSweepThreads, 0, {clear}, d.a.data(), d.b.data(), d.x.data(),
                        d.x_new.data(), d.residual.data());
    (void)g.add_memcpy(d.residual_host.data(), d.residual.data(), sizeof(double), {step});
    return graph;
  }

  DeviceSystem& d_;
  SweepNode step_;
  replay::Graph graph_;
  replay::GraphExec exec_;
  int last_ = 0;
};

// The whole solve in one graph launch: clear, then WHILE (sweep and test on the GPU).
class DeviceLoop {
 public:
  explicit DeviceLoop(DeviceSystem& d) : d_(d), graph_(build(d)), exec_(graph_) {}

  int solve(replay::StreamRef stream) {
    exec_.launch(stream);
    int iterations = 0;
    replay::check(cudaMemcpyAsync(&iterations, d_.iterations.data(), sizeof(int), cudaMemcpyDeviceToHost,
                                  stream.get()),
                  "cudaMemcpyAsync");
    stream.synchronize();
    return iterations;
  }
  const double* solution() const { return d_.x.data(); }
  const replay::Graph& graph() const { return graph_; }

 private:
  static replay::Graph build(DeviceSystem& d) {
    replay::Graph graph = replay::make_graph();
    replay::GraphBuilder g(graph);
    auto keep_going = g.make_condition(1);  // enter the loop; the test decides after every sweep
    const replay::Deps cleared{g.add_memset(d.x.data(), 0, kRows * sizeof(double)),
                               g.add_memset(d.x_new.data(), 0, kRows * sizeof(double)),
                               g.add_memset(d.residual.data(), 0, sizeof(double)),
                               g.add_fill(d.iterations.span(), 0), g.add_fill(d.arrived.span(), 0U)};
    auto loop = g.add_while(keep_going, cleared);
    (void)loop.body().add_kernel(sweep_and_test, kSweepBlocks, kSweepThreads, 0, {}, keep_going, d.a.data(),
                                 d.b.data(), d.x.data(), d.x_new.data(), d.residual.data(), d.arrived.data(),
                                 d.iterations.data(), kThreshold, kMaxIterations);
    return graph;
  }

  DeviceSystem& d_;
  replay::Graph graph_;
  replay::GraphExec exec_;
};

// The whole solve in one graph launch, the WHILE body built as separate nodes: [memset, sweep x -> x_new, test] then IF [memset, sweep x_new
// -> x, test]. The same iterations and error as the others; the cost of six
// nodes a pass instead of one is what the README's Jacobi rows compare.
class DeviceLoopOfSeparateNodes {
 public:
  explicit DeviceLoopOfSeparateNodes(DeviceSystem& d) : d_(d), graph_(build(d)), exec_(graph_) {}

  int solve(replay::StreamRef stream) {
    exec_.launch(stream);
    replay::check(cudaMemcpyAsync(&iterations_, d_.iterations.data(), sizeof(int), cudaMemcpyDeviceToHost,
                                  stream.get()),
                  "cudaMemcpyAsync");
    stream.synchronize();
    return iterations_;
  }
  // An odd count ended on the first half (x -> x_new).
  const double* solution() const { return (iterations_ & 1) != 0 ? d_.x_new.data() : d_.x.data(); }
  const replay::Graph& graph() const { return graph_; }

 private:
  // One half-iteration's clear and sweep (from -> to) into `body`; the test follows it.
  static replay::Node add_sweep(replay::GraphBuilder& body, DeviceSystem& d, const double* from, double* to) {
    auto clear = body.add_memset(d.residual.data(), 0, sizeof(double));
    return body.add_kernel(sweep, kSweepBlocks, kSweepThreads, 0, {clear}, d.a.data(), d.b.data(), from, to,
                           d.residual.data());
  }

  static replay::Graph build(DeviceSystem& d) {
    replay::Graph graph = replay::make_graph();
    replay::GraphBuilder g(graph);
    auto keep_going = g.make_condition(1);
    const replay::Deps cleared{g.add_memset(d.x.data(), 0, kRows * sizeof(double)),
                               g.add_memset(d.x_new.data(), 0, kRows * sizeof(double)),
                               g.add_fill(d.iterations.span(), 0)};
    auto loop = g.add_while(keep_going, cleared);
    replay::GraphBuilder body = loop.body();
    auto second_half = body.make_condition(0);
    const replay::Node first = body.add_kernel(test_first_half, 1, 1, 0, {add_sweep(body, d, d.x.data(), d.x_new.data())},
                                               keep_going, second_half, d.residual.data(), d.iterations.data(),
                                               kThreshold, kMaxIterations);
    replay::GraphBuilder inner = body.add_if(second_half, {first}).body();
    (void)inner.add_kernel(test_second_half, 1, 1, 0, {add_sweep(inner, d, d.x_new.data(), d.x.data())}, keep_going,
                           d.residual.data(), d.iterations.data(), kThreshold, kMaxIterations);
    return graph;
  }

  DeviceSystem& d_;
  replay::Graph graph_;
  replay::GraphExec exec_;
  int iterations_ = 0;
};

}  // namespace jacobi
