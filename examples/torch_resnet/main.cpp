// torch_resnet: ResNet-50 (random weights) run eagerly and as CUDA graphs
// through replay::GraphedCallable, at batch 1, 8 and 32, in fp32 and fp16.
// The model comes three ways: defined in C++ with torch::nn (resnet.hpp),
// loaded from a TorchScript file (scripts/make_torchscript_resnet.py writes
// one from torchvision), and that file prepared by replay::load_prepared
// (frozen, optimized for inference, channels-last). Prints p50/p99 latency,
// QPS and the speedup, checks that graphed outputs match eager ones, and that
// the prepared model's outputs match the unprepared module's within 1e-2 of
// max|ref| (max-abs-error / max|ref|, printed).
//
//   torch_resnet [--torchscript resnet50.pt] [--iterations N] [--batches 1,8,32] [--dtypes fp32,fp16]
//
// Run it with `bash examples/torch_resnet/run.sh` (builds it, writes the
// TorchScript file, runs both).
#include <torch/script.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "latency.hpp"
#include "replay/torch.hpp"
#include "resnet.hpp"

namespace {

struct Settings {
  std::string torchscript;
  int iterations = 0;  // 0: by batch (200 / 100 / 50)
  std::vector<std::int64_t> batches{1, 8, 32};
  std::vector<torch::Dtype> dtypes{torch::kFloat, torch::kHalf};
};

std::vector<std::int64_t> parse_list(std::string_view text) {
  std::vector<std::int64_t> out;
  std::size_t start = 0;
  while (start <= text.size()) {
    const std::size_t end = std::min(text.find(',', start), text.size());
    out.push_back(std::stoll(std::string(text.substr(start, end - start))));
    start = end + 1;
  }
  return out;
}

int iterations_for(const Settings& settings, std::int64_t batch) {
  if (settings.iterations > 0) {
    return settings.iterations;
  }
  return batch <= 1 ? 200 : batch <= 8 ? 100 : 50;
}

double relative_l2(const at::Tensor& actual, const at::Tensor& expected) {
  const at::Tensor a = actual.to(at::kDouble);
  const at::Tensor e = expected.to(at::kDouble);
  const double denom = e.norm().item<double>();
  return (a - e).norm().item<double>() / (denom > 0.0 ? denom : 1.0);
}

// One model in one dtype: eager and graphed, every batch size. Returns false
// when a graphed result disagrees with the eager one.
template <class Model>
bool run_model(const char* name, Model model, torch::Dtype dtype, replay::GraphedFlags grad_flag,
               const Settings& settings) {
  const auto options = torch::TensorOptions().device(torch::kCUDA).dtype(dtype);
  const std::int64_t largest = *std::max_element(settings.batches.begin(), settings.batches.end());

  const auto capture_start = std::chrono::steady_clock::now();
  replay::GraphedCallable graphed(model, {torch::randn({largest, 3, 224, 224}, options)},
                                  {.flags = grad_flag, .batch_buckets = settings.batches});
  const double capture_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - capture_start).count();
  std::printf("%s %s: %zu graphs captured in %.0f ms, private pool %.1f MiB\n", name,
              dtype == torch::kHalf ? "fp16" : "fp32", graphed.graph_count(), capture_ms,
              static_cast<double>(graphed.pool_reserved_bytes()) / (1024.0 * 1024.0));

  bool ok = true;
  for (const std::int64_t batch : settings.batches) {
    const at::Tensor input = torch::randn({batch, 3, 224, 224}, options);
    const int iterations = iterations_for(settings, batch);
    const int warmup = std::max(5, iterations / 10);

    const auto eager = replay_examples::measure([&] { (void)graphed.run_eager({input}); }, iterations, warmup, batch);
    const auto replayed = replay_examples::measure([&] { (void)graphed.run({input}); }, iterations, warmup, batch);

    const at::Tensor expected = graphed.run_eager({input})[0];
    const at::Tensor actual = graphed.run({input})[0];
    const double error = relative_l2(actual, expected);
    const double tolerance = dtype == torch::kHalf ? 1e-2 : 1e-4;
    ok = ok && error < tolerance && actual.sizes() == expected.sizes();
    std::printf("  %-11s %4s b=%-3lld eager p50 %7.3f ms p99 %7.3f ms %8.0f img/s | graphed p50 %7.3f ms p99 %7.3f ms "
                "%8.0f img/s | x%.2f | rel.err %.1e%s\n",
                name, dtype == torch::kHalf ? "fp16" : "fp32", static_cast<long long>(batch), eager.p50_ms,
                eager.p99_ms, eager.qps, replayed.p50_ms, replayed.p99_ms, replayed.qps, replayed.qps / eager.qps,
                error, error < tolerance ? "" : "  MISMATCH");
  }
  return ok;
}

// The TorchScript file prepared by replay::load_prepared (frozen, optimized
// for inference, channels-last, `dtype`), graphed, against the same file
// unprepared (NCHW, not frozen, same dtype). Inputs are made channels-last
// by the caller (prepare_input), outside the timed loop. Returns false when
// the prepared outputs differ from the unprepared module's by more than the
// tolerance, or graphed from eager.
bool run_prepared(const std::string& path, torch::Dtype dtype, const Settings& settings) {
  const auto options = torch::TensorOptions().device(torch::kCUDA).dtype(dtype);
  const std::int64_t largest = *std::max_element(settings.batches.begin(), settings.batches.end());
  replay::PreparedModule unprepared = replay::load_prepared(path, {.flags = replay::PrepareFlags::none, .dtype = dtype});
  const auto prepare_start = std::chrono::steady_clock::now();
  replay::PreparedModule prepared = replay::load_prepared(
      path, {.flags = replay::PrepareFlags::inference | replay::PrepareFlags::channels_last, .dtype = dtype});
  const double prepare_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - prepare_start).count();
  replay::GraphedCallable graphed(prepared, {prepared.prepare_input(torch::randn({largest, 3, 224, 224}, options))},
                                  {.flags = replay::GraphedFlags::no_grad, .batch_buckets = settings.batches});
  std::printf("TorchScript prepared %s: loaded, frozen and optimized in %.0f ms, %zu graphs, private pool %.1f MiB\n",
              dtype == torch::kHalf ? "fp16" : "fp32", prepare_ms, graphed.graph_count(),
              static_cast<double>(graphed.pool_reserved_bytes()) / (1024.0 * 1024.0));
  const double tolerance = 1e-2;  // max-abs-error / max|ref|; fp32 convolutions use TF32 by default
  bool ok = true;
  for (const std::int64_t batch : settings.batches) {
    const at::Tensor input = torch::randn({batch, 3, 224, 224}, options);
    const at::Tensor channels_last = prepared.prepare_input(input);
    const int iterations = iterations_for(settings, batch);
    const int warmup = std::max(5, iterations / 10);
    const auto eager =
        replay_examples::measure([&] { (void)graphed.run_eager({channels_last}); }, iterations, warmup, batch);
    const auto replayed =
        replay_examples::measure([&] { (void)graphed.run({channels_last}); }, iterations, warmup, batch);
    std::vector<at::Tensor> reference;
    {
      torch::NoGradGuard no_grad;
      reference = unprepared({input});
    }
    const replay::OutputDifference change = replay::compare_outputs(graphed.run({channels_last}).tensors(), reference);
    const double graph_error = relative_l2(graphed.run({channels_last})[0], graphed.run_eager({channels_last})[0]);
    const bool good = change.relative() < tolerance && graph_error < tolerance;
    ok = ok && good;
    std::printf("  %-11s %4s b=%-3lld eager p50 %7.3f ms p99 %7.3f ms %8.0f img/s | graphed p50 %7.3f ms p99 %7.3f ms "
                "%8.0f img/s | x%.2f | vs unprepared: max-abs-err/max|ref| %.1e (tolerance %.0e)%s\n",
                "prepared", dtype == torch::kHalf ? "fp16" : "fp32", static_cast<long long>(batch), eager.p50_ms,
                eager.p99_ms, eager.qps, replayed.p50_ms, replayed.p99_ms, replayed.qps, replayed.qps / eager.qps,
                change.relative(), tolerance, good ? "" : "  MISMATCH");
  }
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  Settings settings;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg(argv[i]);
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "torch_resnet: %s needs a value\n", argv[i]);
        std::exit(2);
      }
      return argv[++i];
    };
    if (arg == "--torchscript") {
      settings.torchscript = value();
    } else if (arg == "--iterations") {
      settings.iterations = std::stoi(value());
    } else if (arg == "--batches") {
      settings.batches = parse_list(value());
    } else if (arg == "--dtypes") {
      const std::string list = value();
      settings.dtypes.clear();
      if (list.find("fp32") != std::string::npos) {
        settings.dtypes.push_back(torch::kFloat);
      }
      if (list.find("fp16") != std::string::npos) {
        settings.dtypes.push_back(torch::kHalf);
      }
    } else {
      std::fprintf(stderr, "usage: torch_resnet [--torchscript FILE] [--iterations N] [--batches 1,8,32] "
                           "[--dtypes fp32,fp16]\n");
      return 2;
    }
  }
  if (!torch::cuda::is_available()) {
    std::printf("torch_resnet: no CUDA device found (torch::cuda::is_available() is false); nothing to run.\n");
    return 0;
  }
  try {
    bool ok = true;
    for (const torch::Dtype dtype : settings.dtypes) {
      // torch::nn ResNet-50: inference mode (GraphedCallable's default).
      ok = run_model("torch::nn", replay_examples::resnet50(torch::kCUDA, dtype), dtype, replay::GraphedFlags::none,
                     settings) &&
           ok;
    }
    if (!settings.torchscript.empty()) {
      if (!std::filesystem::exists(settings.torchscript)) {
        std::fprintf(stderr, "torch_resnet: %s does not exist (make it with scripts/make_torchscript_resnet.py)\n",
                     settings.torchscript.c_str());
        return 1;
      }
      for (const torch::Dtype dtype : settings.dtypes) {
        torch::jit::Module module = torch::jit::load(settings.torchscript, torch::kCUDA);
        module.eval();
        module.to(dtype);
        // TorchScript's executor runs under NoGradGuard, as torch::jit inference usually does.
        ok = run_model("TorchScript", module, dtype, replay::GraphedFlags::no_grad, settings) && ok;
        ok = run_prepared(settings.torchscript, dtype, settings) && ok;
      }
    } else {
      std::printf("(no --torchscript file given: the TorchScript model was skipped)\n");
    }
    std::printf("torch_resnet: %s\n", ok ? "graphed outputs match eager outputs, prepared outputs match unprepared ones"
                                   : "MISMATCH (graphed vs eager, or prepared vs unprepared)");
    return ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "torch_resnet: %s\n", e.what());
    return 1;
  }
}
