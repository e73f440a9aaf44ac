// GraphBuilder::capture with work of some other signature is refused with a
// message naming the expected one.
// expect-error: capture work must be callable as work\(replay::StreamRef s\)
#include <replay/graph_builder.hpp>

void record(replay::GraphBuilder& builder, replay::StreamRef stream) {
  auto nodes = builder.capture(stream, [](int device) { (void)device; });
}
