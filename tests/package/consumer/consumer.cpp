// The host half of the consumer, compiled by the C++ compiler alone: the
// headers must work without nvcc, and errors must carry what failed.
#include <cstdio>
#include <string>

#include <replay/replay.hpp>

#include "consumer.hpp"

#ifndef REPLAY_CONSUMER_EXPECTED_VERSION
#error "the consumer's CMakeLists.txt passes the version it expects"
#endif

int main() {
  int failures = 0;
  const auto expect = [&failures](bool ok, const char* what) {
    if (!ok) {
      std::fprintf(stderr, "consumer: FAILED: %s\n", what);
      ++failures;
    }
  };

  expect(std::string(REPLAY_VERSION_STRING) == REPLAY_CONSUMER_EXPECTED_VERSION,
         "REPLAY_VERSION_STRING is the version the package manager reported");
  static_assert(REPLAY_VERSION == REPLAY_VERSION_MAJOR * 10000 + REPLAY_VERSION_MINOR * 100 + REPLAY_VERSION_PATCH);

  // check() turns a failed status into cuda_error naming the API; no device needed.
  try {
    replay::check(cudaErrorInvalidValue, "cudaConsumerCall");
    expect(false, "check() throws on an error status");
  } catch (const replay::cuda_error& e) {
    expect(e.status() == cudaErrorInvalidValue, "cuda_error keeps the status");
    expect(std::string(e.what()).find("cudaConsumerCall") != std::string::npos, "cuda_error names the API");
  }

  if (!replay::has_device()) {
    std::printf("consumer: replay %s linked; no CUDA device, so the graph round trip was not run\n",
                REPLAY_VERSION_STRING);
    return failures == 0 ? 0 : 1;
  }
#ifdef REPLAY_CONSUMER_WITH_CUDA
  const int wrong = consumer_graph_roundtrip();
  expect(wrong == 0, "the replayed graph computed every element");
#endif
  std::printf("consumer: replay %s: %s\n", REPLAY_VERSION_STRING, failures == 0 ? "ok" : "FAILED");
  return failures == 0 ? 0 : 1;
}
