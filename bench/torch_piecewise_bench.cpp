// The C++ half of the piecewise torch benchmark: a TorchScript model of 24
// residual blocks (width 1024, fp16) with a read-back halfway,
// `if float(h.abs().max()) > 1e4: h = h.clamp(...)`
// (scripts/make_torchscript_piecewise.py writes it, and the same weights
// without the read-back), at batch 1, 8 and 64: C++ eager, replay piecewise
// (GraphedOptions::breaks = TorchBreaks::piecewise: two graph segments and
// the read-back between them) and one whole graph of the model without the
// read-back. Every piecewise output is checked against eager bit for bit,
// on inputs on both sides of the threshold (the branch must follow the
// value). Timed as bench/torch_resnet_bench.py times its peers (one call,
// then a device synchronize). Prints the targets against eager and the whole
// graph, and writes JSON that bench/torch_piecewise_bench.py compares with
// torch.compile(mode="reduce-overhead") on the same model.
//
//   torch_piecewise_bench DIR [--batches 1,8,64] [--iterations N] [--json FILE]
#include <torch/script.h>
#include <torch/torch.h>

#include <cstdint>
#include <cstdio>
#include <exception>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include "cli.hpp"
#include "latency.hpp"
#include "replay/torch.hpp"

namespace {

torch::jit::Module load(const std::string& path) {
  torch::jit::Module module = torch::jit::load(path);
  module.eval();
  module.to(torch::kCUDA, torch::kHalf);
  return module;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::int64_t> batches{1, 8, 64};
  int iterations = 200;
  std::string dir;
  std::string json_path;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if ((arg == "--batches" || arg == "--iterations" || arg == "--json") && i + 1 < argc) {
      const std::string value = argv[++i];
      if (arg == "--batches") {
        batches = replay_examples::parse_list(value);
      } else if (arg == "--iterations") {
        iterations = std::stoi(value);
      } else {
        json_path = value;
      }
    } else if (dir.empty() && !arg.starts_with("--")) {
      dir = std::string(arg);
    } else {
      std::fprintf(stderr, "usage: torch_piecewise_bench DIR [--batches 1,8,64] [--iterations N] [--json FILE]\n");
      return 2;
    }
  }
  if (dir.empty()) {
    std::fprintf(stderr, "usage: torch_piecewise_bench DIR (from scripts/make_torchscript_piecewise.py DIR)\n");
    return 2;
  }
  if (!torch::cuda::is_available()) {
    std::printf("torch_piecewise_bench: no CUDA device found; nothing to measure.\n");
    return 0;
  }
  try {
    torch::jit::Module read_back = load(dir + "/readback.pt");
    torch::jit::Module whole_model = load(dir + "/whole.pt");
    const auto options = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kHalf);
    bool all_equal = true;
    bool branch_ok = true;
    std::string json = "{\"rows\": [";
    std::printf("C++ piecewise benchmark: 24 blocks x 1024, fp16, a read-back halfway (p50 of %d calls)\n", iterations);
    for (std::size_t b = 0; b < batches.size(); ++b) {
      const std::int64_t batch = batches[b];
      torch::manual_seed(static_cast<std::uint64_t>(batch));
      const torch::Tensor x = torch::randn({batch, 1024}, options);
      replay::GraphedCallable piecewise(read_back, {x}, {.breaks = replay::TorchBreaks::piecewise});
      replay::GraphedCallable whole(whole_model, {x});
      const replay::BucketCaptureReport report = piecewise.capture_report(batch);
      if (report.kind != replay::BucketCaptureKind::piecewise || report.segments != 2) {
        std::printf("  batch %lld: expected piecewise with 2 segments, got %s with %zu\n",
                    static_cast<long long>(batch), std::string(replay::to_string(report.kind)).c_str(),
                    report.segments);
        branch_ok = false;
      }
      for (const replay::TorchBreakInfo& info : report.breaks) {
        std::printf("  batch %lld: break at %s %s: %s\n", static_cast<long long>(batch), info.op.c_str(),
                    info.script_line.c_str(), info.why.c_str());
      }
      // Bit for bit against eager, on both sides of the threshold.
      for (const double scale : {1.0, 5e3, 1.0, 5e3}) {  // 5e3: past the threshold, within fp16
        const torch::Tensor input = torch::randn({batch, 1024}, options) * scale;
        const torch::Tensor expected = piecewise.run_eager({input})[0];
        const auto out = piecewise(input);
        all_equal = all_equal && torch::equal(out[0], expected);
      }
      const replay::BucketCaptureReport after = piecewise.capture_report(batch);
      branch_ok = branch_ok && after.kind == replay::BucketCaptureKind::piecewise && after.paths == 2;

      torch::NoGradGuard no_grad;
      const int warmup = 20;
      const auto eager = replay_examples::measure([&] { (void)read_back.forward({x}); }, iterations, warmup, batch);
      const auto pw = replay_examples::measure([&] { (void)piecewise(x); }, iterations, warmup, batch);
      const auto wh = replay_examples::measure([&] { (void)whole(x); }, iterations, warmup, batch);
      std::printf("  b=%-3lld eager %8.3f ms  piecewise %8.3f ms  whole graph (no read-back) %8.3f ms\n",
                  static_cast<long long>(batch), eager.p50_ms, pw.p50_ms, wh.p50_ms);
      const double vs_whole = pw.p50_ms / wh.p50_ms;
      std::printf("  target piecewise <= 1.10x a whole graph without the read-back, batch %lld: %.2fx %s\n",
                  static_cast<long long>(batch), vs_whole, vs_whole <= 1.10 ? "met" : "MISSED");
      if (batch == 1) {
        const double speedup = eager.p50_ms / pw.p50_ms;
        std::printf("  target piecewise >= 3x C++ eager, batch 1: %.2fx %s\n", speedup,
                    speedup >= 3.0 ? "met" : "MISSED");
      }
      json += (b == 0 ? "" : ", ");
      json += "{\"batch\": " + std::to_string(batch) + ", \"cpp_eager_ms\": " + std::to_string(eager.p50_ms) +
              ", \"cpp_piecewise_ms\": " + std::to_string(pw.p50_ms) +
              ", \"cpp_whole_ms\": " + std::to_string(wh.p50_ms) + "}";
    }
    json += "]}\n";
    std::printf("  target outputs equal to eager bit for bit: %s\n", all_equal ? "met" : "MISSED");
    std::printf("  target the branch follows the value (2 paths, piecewise): %s\n", branch_ok ? "met" : "MISSED");
    if (!json_path.empty()) {
      std::ofstream(json_path) << json;
    }
    return all_equal && branch_ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "torch_piecewise_bench: %s\n", e.what());
    return 1;
  }
}
