// device_loop: the Jacobi solve of NVIDIA's cuda-samples jacobiCudaGraphs,
// three ways, each checked against the CPU reference (same iteration count,
// same error):
//   (a) the sample's method 0 in raw CUDA (cudaGraphExecKernelNodeSetParams
//       every iteration, the host testing convergence after every launch),
//   (b) the same through replay's typed node handle,
//   (c) the whole solve in one launch: a WHILE node, the test on the GPU,
//       its body one fused kernel (sweep and test);
//   (d) the same with the body built as separate nodes (a memset, the
//       sweep, a one-thread test; the second half-iteration in a nested IF).
// Exits non-zero when a result is wrong.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>

#include "jacobi.cuh"

namespace {
using clock_type = std::chrono::steady_clock;

template <class Solver>
bool run(const char* label, Solver& solver, const jacobi::DeviceSystem& d, const jacobi::Result& cpu,
         replay::StreamRef stream) {
  (void)solver.solve(stream);  // warm-up
  const auto start = clock_type::now();
  const int iterations = solver.solve(stream);
  const double ms = std::chrono::duration<double, std::milli>(clock_type::now() - start).count();
  const double error = d.error_of(solver.solution(), stream);
  const bool ok = iterations == cpu.iterations && std::fabs(error - cpu.error) <= 1e-9 + 1e-6 * cpu.error;
  std::printf("%-48s iterations %5d  error %.3e  %8.3f ms  %s\n", label, iterations, error, ms, ok ? "ok" : "WRONG");
  return ok;
}
}  // namespace

int main() {
  try {
    if (!replay::has_device()) {
      std::printf("device_loop: no CUDA device\n");
      return 1;
    }
    const jacobi::System system = jacobi::make_system();
    const auto cpu_start = clock_type::now();
    const jacobi::Result cpu = jacobi::solve_on_cpu(system);
    const double cpu_ms = std::chrono::duration<double, std::milli>(clock_type::now() - cpu_start).count();
    std::printf("%-48s iterations %5d  error %.3e  %8.3f ms\n", "CPU reference", cpu.iterations, cpu.error, cpu_ms);

    replay::Stream stream;
    jacobi::DeviceSystem d(system, stream);
    bool ok = true;
    {
      jacobi::RawNodeUpdate raw(d, stream);
      ok &= run("(a) method 0, raw cudaGraphExecKernelNodeSetParams", raw, d, cpu, stream);
    }
    {
      jacobi::ReplayNodeUpdate typed(d);
      ok &= run("(b) method 0, replay KernelNode::set_args", typed, d, cpu, stream);
    }
    {
      jacobi::DeviceLoop loop(d);
      ok &= run("(c) one launch, WHILE node, one fused kernel", loop, d, cpu, stream);
    }
    {
      jacobi::DeviceLoopOfSeparateNodes loop(d);
      ok &= run("(d) one launch, WHILE node, separate nodes", loop, d, cpu, stream);
    }
    std::printf("device_loop: %s\n", ok ? "all results match the CPU reference" : "FAILED");
    return ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "device_loop: %s\n", e.what());
    return 1;
  }
}
