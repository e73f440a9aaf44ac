#pragma once
// What the benchmark programs that need a GPU share.
#include <benchmark/benchmark.h>

#include "replay/device.hpp"

// Without a CUDA device the benchmark is reported as skipped ("no CUDA
// device") rather than failing the program; returns whether it was.
inline bool skip_without_device(benchmark::State& state) {
  if (!replay::has_device()) {
    state.SkipWithError("no CUDA device");
    return true;
  }
  return false;
}
