// A ShapeRouter work callable that takes only the stream (no shape) is
// refused with a message naming the expected signature.
// expect-error: ShapeRouter's work callable takes only the stream; it must take the \(padded\) shape first
#include <replay/shape_router.hpp>

int main() {
  replay::ShapeRouter<int> router([](replay::StreamRef s) { (void)s; });
  return 0;
}
