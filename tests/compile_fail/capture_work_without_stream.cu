// A capture lambda without the replay::StreamRef parameter is refused with a
// message that says what to take.
// expect-error: capture work takes no parameter
#include <replay/capture_scope.hpp>

__global__ void touch(int* p) { *p = 1; }

void record(replay::StreamRef stream, int* p) {
  replay::Graph graph = replay::capture(stream, [&] { touch<<<1, 1>>>(p); });
}
