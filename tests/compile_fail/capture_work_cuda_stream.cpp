// Capture work that takes a cudaStream_t rather than replay::StreamRef is
// refused with a message that says to take replay::StreamRef (and s.get()).
// expect-error: capture work takes a cudaStream_t; take replay::StreamRef instead \(use s\.get\(\)
#include <replay/capture_scope.hpp>

void record(replay::StreamRef stream, int* p) {
  replay::Graph graph =
      replay::capture(stream, [&](cudaStream_t s) { (void)cudaMemsetAsync(p, 0, sizeof(int), s); });
}
