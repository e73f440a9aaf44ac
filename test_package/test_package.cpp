// Compiled by the C++ compiler alone.
#include <cstdint>
#include <cstdio>
#include <ctime>

#include <replay/decode.hpp>
#include <replay/replay.hpp>

int capture_and_replay(int value);

int main() {
  std::printf("replay %s from Conan\n", REPLAY_VERSION_STRING);
  // The decode component: its policy, a pure function (no device needed).
  const std::int64_t buckets[] = {1, 4, 16};
  if (replay::smallest_bucket(buckets, 3) != 4) {
    std::printf("replay::smallest_bucket(3) of {1, 4, 16} is not 4\n");
    return 1;
  }
  if (!replay::has_device()) {
    std::printf("no CUDA device: built and linked, graph not run\n");
    return 0;
  }
  const int value = static_cast<int>(std::time(nullptr) % 1000) + 1;
  const int got = capture_and_replay(value);
  std::printf("graph replay wrote %d, expected %d\n", got, value);
  return got == value ? 0 : 1;
}
