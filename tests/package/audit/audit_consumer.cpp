// Compiles the capture audit against the installed package and links CUPTI.
// With a GPU, audits a capture of one memset and checks the report is clean;
// without one, says the round trip was not run.
#include <cstdio>
#include <exception>

#include <replay/audit.hpp>
#include <replay/replay.hpp>
#include <replay/version.hpp>

int main() {
  try {
    if (!replay::has_device()) {
      std::printf("consumer: replay %s audit component: linked; no CUDA device, so the graph round trip was not run (%s)\n",
                  REPLAY_VERSION_STRING, replay::no_device_message.data());
      return 0;
    }
    replay::Stream stream;
    replay::DeviceBuffer<float> x(256);
    auto audited = replay::audit_capture(stream, [&](replay::StreamRef s) { x.zero(s); });
    if (audited.graph.get() == nullptr || !audited.report.clean()) {
      std::printf("consumer: replay audit component: the capture of one memset was not clean:\n%s\n",
                  audited.report.to_string().c_str());
      return 1;
    }
    std::printf("consumer: replay %s audit component: ok\n", REPLAY_VERSION_STRING);
    return 0;
  } catch (const std::exception& e) {
    std::printf("consumer: replay audit component: %s\n", e.what());
    return 1;
  }
}
