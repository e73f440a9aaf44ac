// A TorchScript model with one read-back halfway, graphed piecewise
// (replay/torch.hpp, GraphedOptions::breaks = TorchBreaks::piecewise). The
// model, compiled here from TorchScript source (no Python needed), runs a
// stack of blocks, reads the peak of its activations back to the host and,
// above a threshold, clamps them: `if float(h.abs().max()) > 1000.0:`. Captured
// whole, the read-back breaks the capture and the model runs eagerly; with
// the piecewise policy the capture breaks there instead: one graph segment
// before the read-back, the read-back itself, and the segment kept for the
// branch it took. The script only compares the value with a constant, so the
// comparison's outcome keys the segments after it: two paths, whatever the
// values. The example prints the capture report, checks every output against
// eager bit for bit on inputs on both sides of the threshold, and times
// eager and piecewise calls.
//
// Without a CUDA device it says so and exits 0. Exits non-zero on a wrong output.
#include <torch/script.h>
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <cstdint>
#include <string>
#include <vector>

#include "replay/torch.hpp"

namespace {

const std::string kModelSource = R"(def forward(self, x):
    h = x
    for i in range(4):
        h = torch.relu(torch.matmul(h, self.weight)) + h
    if float(h.abs().max()) > 1000.0:
        h = h.clamp(-1000.0, 1000.0)
    for i in range(4):
        h = torch.tanh(torch.matmul(h, self.weight)) + h
    return h
)";

template <class Call>
double microseconds_per_call(Call&& call, int iterations) {
  call();
  torch::cuda::synchronize();
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < iterations; ++i) {
    call();
  }
  torch::cuda::synchronize();
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count() / iterations;
}

}  // namespace

int main() {
  if (!torch::cuda::is_available()) {
    std::puts("torch_piecewise: no CUDA device; nothing to run");
    return 0;
  }
  const auto options = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kHalf);
  torch::manual_seed(0);
  torch::jit::Module module("Model");
  module.register_parameter("weight", torch::randn({256, 256}, options) * 0.05, false);
  module.define(kModelSource);

  const torch::Tensor example = torch::randn({8, 256}, options);
  replay::GraphedCallable graphed(module, {example}, {.breaks = replay::TorchBreaks::piecewise});
  for (const replay::BucketCaptureReport& report : graphed.capture_reports()) {
    std::printf("batch %lld: %s, %zu segments\n", static_cast<long long>(report.bucket),
                std::string(replay::to_string(report.kind)).c_str(), report.segments);
    for (const replay::TorchBreakInfo& info : report.breaks) {
      std::printf("  break at %s%s%s: %s\n", info.op.c_str(), info.script_line.empty() ? "" : " ",
                  info.script_line.c_str(), info.why.c_str());
    }
  }

  int wrong = 0;
  for (int i = 0; i < 8; ++i) {
    // Odd calls cross the threshold: the clamp branch.
    const torch::Tensor x = torch::randn({8, 256}, options) * (i % 2 == 0 ? 1.0 : 1e3);
    const auto out = graphed(x);
    if (!torch::equal(out[0], graphed.run_eager({x})[0])) {
      std::printf("call %d: the graphed output differs from eager\n", i);
      ++wrong;
    }
  }
  const replay::BucketCaptureReport report = graphed.capture_report(8);
  std::printf("paths kept: %zu (misses %llu, switches %llu)\n", report.paths,
              static_cast<unsigned long long>(report.misses), static_cast<unsigned long long>(report.path_switches));

  const torch::Tensor x = torch::randn({8, 256}, options);
  torch::NoGradGuard no_grad;
  const double eager_us = microseconds_per_call([&] { (void)module.forward({x}); }, 200);
  const double graphed_us = microseconds_per_call([&] { (void)graphed(x); }, 200);
  std::printf("eager %.1f us/call, piecewise graphed %.1f us/call (%.2fx)\n", eager_us, graphed_us,
              eager_us / graphed_us);
  std::printf("%s\n", wrong == 0 ? "outputs equal eager bit for bit" : "WRONG OUTPUTS");
  return wrong == 0 ? 0 : 1;
}
