// A buffer of a type that is not trivially copyable is refused at compile
// time, naming the concept.
// expect-error: BufferElement
#include <replay/static_buffer.hpp>

struct NotTrivial {
  NotTrivial(const NotTrivial&) {}
};

int main() {
  replay::DeviceBuffer<NotTrivial> buffer;
  return 0;
}
