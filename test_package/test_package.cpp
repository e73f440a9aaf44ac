// Compiled by the C++ compiler alone.
#include <cstdio>
#include <ctime>

#include <replay/replay.hpp>

int capture_and_replay(int value);

int main() {
  std::printf("replay %s from Conan\n", REPLAY_VERSION_STRING);
  if (!replay::has_device()) {
    std::printf("no CUDA device: built and linked, graph not run\n");
    return 0;
  }
  const int value = static_cast<int>(std::time(nullptr) % 1000) + 1;
  const int got = capture_and_replay(value);
  std::printf("graph replay wrote %d, expected %d\n", got, value);
  return got == value ? 0 : 1;
}
