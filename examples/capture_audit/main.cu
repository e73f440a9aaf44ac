// The capture audit (replay/audit.hpp, target replay::audit): three captures
// of a small model and what the audit says about each.
//
//   1. a clean capture: nothing broke it, nothing escaped, and the graph holds
//      every kernel that was launched into it;
//   2. a broken one: a synchronization hidden in a helper (as libraries hide
//      them) breaks the capture; the audit names the call, the thread and the
//      line, where CUDA alone says cudaErrorStreamCaptureInvalidated at the end;
//   3. a silent one: a helper launches on the default stream; the capture
//      succeeds, the graph lacks that kernel, and only the audit says so.
//
// Then the same broken capture through plain replay::capture with the audit
// switched on (what REPLAY_AUDIT=1 does for every capture in the program):
// the exception carries the audit's verdict.
//
// `capture_audit --from-environment` instead captures the broken model with
// plain replay::capture, its switch left at the default: run it with
// REPLAY_AUDIT=1 and the error names the synchronization, without it only
// the invalidated capture.
//
// torchscript.cpp (capture_audit_torchscript, built where libtorch was found
// too) does the same for a TorchScript module under replay::GraphedCallable:
// the finding names the line of the script that read a value back.
//
// Without a device it says so and exits 0. Exits non-zero if the audit does
// not report what was planted.
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <string_view>

#include "replay/audit.hpp"
#include "replay/replay.hpp"

namespace {

constexpr int kN = 1 << 16;

__global__ void scale(float* x, int n, float a) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) {
    x[i] *= a;
  }
}

__global__ void shift(float* x, int n, float b) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) {
    x[i] += b;
  }
}

constexpr unsigned kBlocks = (kN + 255) / 256;

// A "library" helper that waits for its result: fine eagerly, fatal in a capture.
void normalize(replay::StreamRef s, float* x) {
  scale<<<kBlocks, 256, 0, s.get()>>>(x, kN, 0.5F);
  (void)cudaStreamSynchronize(s.get());  // the hidden synchronization
}

// A "library" helper that launches on the default stream.
void bias(float* x) { shift<<<kBlocks, 256>>>(x, kN, 1.0F); }

void model(replay::StreamRef s, float* x) {
  scale<<<kBlocks, 256, 0, s.get()>>>(x, kN, 2.0F);
  shift<<<kBlocks, 256, 0, s.get()>>>(x, kN, 1.0F);
}

int failures = 0;
void expect(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "capture_audit: FAILED: %s\n", what);
    ++failures;
  }
}

}  // namespace

// The broken model through plain replay::capture, audited only if REPLAY_AUDIT says so.
int from_environment() {
  const char* set = std::getenv("REPLAY_AUDIT");
  const bool audited = set != nullptr && std::string_view(set) == "1";
  replay::Stream stream;
  replay::DeviceBuffer<float> x(kN);
  try {
    (void)replay::capture(stream, [&](replay::StreamRef s) {
      model(s, x.data());
      normalize(s, x.data());
    });
    std::fputs("capture_audit: FAILED: the broken capture did not throw\n", stderr);
    return 1;
  } catch (const replay::cuda_error& e) {
    (void)cudaGetLastError();
    std::printf("REPLAY_AUDIT=%s: cuda_error: %s\n", set != nullptr ? set : "(unset)", e.what());
    const bool has_verdict = std::string(e.what()).find("capture audit: cudaStreamSynchronize") != std::string::npos;
    if (has_verdict != audited) {
      std::fprintf(stderr, "capture_audit: FAILED: the error %s the audit's verdict\n",
                   has_verdict ? "carries, unasked," : "lacks");
      return 1;
    }
  }
  return 0;
}

int main(int argc, char** argv) {
  if (!replay::has_device()) {
    std::printf("capture_audit: %s. This example needs an NVIDIA GPU and driver; it built correctly, "
                "but there is nothing to run on.\n",
                replay::no_device_message.data());
    return 0;
  }
  try {
    if (argc > 1 && std::string_view(argv[1]) == "--from-environment") {
      return from_environment();
    }
    replay::Stream stream;
    replay::DeviceBuffer<float> x(kN);
    x.fill(1.0F, stream);
    stream.synchronize();

    std::puts("== 1. a clean capture");
    auto clean = replay::audit_capture(stream, [&](replay::StreamRef s) { model(s, x.data()); });
    std::fputs(clean.report.to_string().c_str(), stdout);
    expect(clean.graph && clean.report.clean(), "the clean capture is reported clean");

    std::puts("\n== 2. a capture broken by a synchronization inside a helper");
    auto broken = replay::audit_capture(stream, [&](replay::StreamRef s) {
      model(s, x.data());
      normalize(s, x.data());
    });
    (void)cudaGetLastError();  // the planted call's own error
    std::fputs(broken.report.to_string().c_str(), stdout);
    expect(!broken.graph && broken.report.breaking &&
               broken.report.breaking->api.find("cudaStreamSynchronize") != std::string::npos,
           "the broken capture names cudaStreamSynchronize");

    std::puts("\n== 3. a capture that succeeds without one of its kernels");
    auto silent = replay::audit_capture(stream, [&](replay::StreamRef s) {
      model(s, x.data());
      bias(x.data());
    });
    std::fputs(silent.report.to_string().c_str(), stdout);
    expect(silent.graph && silent.report.escaped.size() == 1, "the escaped kernel is reported");
    replay::check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");

    std::puts("\n== 4. replay::capture with the audit on (as with REPLAY_AUDIT=1)");
    try {
      (void)replay::capture(
          stream,
          [&](replay::StreamRef s) {
            model(s, x.data());
            normalize(s, x.data());
          },
          replay::CaptureMode::this_thread, replay::AuditSwitch::on);
      expect(false, "the broken capture throws");
    } catch (const replay::cuda_error& e) {
      std::printf("cuda_error: %s\n", e.what());
      expect(std::string(e.what()).find("capture audit:") != std::string::npos, "the error carries the verdict");
    }
    (void)cudaGetLastError();
  } catch (const replay::audit_unavailable_error& e) {
    // A profiler (Nsight Systems, compute-sanitizer...) holds CUPTI.
    std::fprintf(stderr, "capture_audit: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "capture_audit: %s\n", e.what());
    return 1;
  }
  if (failures == 0) {
    std::puts("\ncapture_audit: every planted cause was reported");
  }
  return failures == 0 ? 0 : 1;
}
