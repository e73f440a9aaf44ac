#pragma once
// main() of a benchmark program whose benchmarks are registered at run time
// (names built from parameters): `register_all` registers them, then they run.
#include <benchmark/benchmark.h>

inline int run_benchmarks(int argc, char** argv, void (*register_all)()) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) {
    return 1;
  }
  register_all();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
