// A region whose value cannot key the segments after it by its bytes (a
// float: +0 and -0 compare equal, NaN never does) is refused at compile time
// with a message that says what a region may return.
// expect-error: a region's value keys the segments after it by its bytes
#include <replay/piecewise.hpp>

float decide(replay::StreamRef stream) {
  return replay::eager(stream, "decide", [](replay::StreamRef) { return 0.5F; });
}
