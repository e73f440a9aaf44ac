// The C++ half of the torch benchmark: ResNet-50 (torch::nn, random weights,
// fp16 by default) run eagerly in C++ and replayed through
// replay::GraphedCallable; with --torchscript, torchvision's ResNet-50 from a
// TorchScript file prepared by replay::load_prepared (frozen, optimized for
// inference, channels-last) too. Timed exactly as bench/torch_resnet_bench.py times
// PyTorch eager, torch.cuda.CUDAGraph and torch.compile(mode="reduce-overhead")
// (one call then a device synchronize per iteration, host clock). Writes JSON
// that the Python script merges into one side-by-side table
// (scripts/gpu-check.d/torch.sh runs both in one device call).
//
//   torch_resnet_bench [--batches 1,8,32] [--iterations N] [--dtype fp16|fp32] [--json FILE]
//                      [--torchscript resnet50.pt]
//
// Not a Google Benchmark program (it reports percentiles and must match the
// Python side's method); it lives in build/.../bench/torch/ so that the
// generic benchmark loop of gpu-check.sh does not run it.
#include <torch/torch.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "latency.hpp"
#include "replay/torch.hpp"
#include "resnet.hpp"

namespace {

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

struct Row {
  std::string impl;
  std::int64_t batch;
  replay_examples::Latency latency;
};

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::int64_t> batches{1, 8, 32};
  int iterations = 0;  // 0: by batch
  std::string dtype_name = "fp16";
  std::string json_path;
  std::string torchscript;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg(argv[i]);
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "torch_resnet_bench: %s needs a value\n", argv[i]);
        std::exit(2);
      }
      return argv[++i];
    };
    if (arg == "--batches") {
      batches = parse_list(value());
    } else if (arg == "--iterations") {
      iterations = std::stoi(value());
    } else if (arg == "--dtype") {
      dtype_name = value();
    } else if (arg == "--json") {
      json_path = value();
    } else if (arg == "--torchscript") {
      torchscript = value();
    } else {
      std::fprintf(stderr,
                   "usage: torch_resnet_bench [--batches 1,8,32] [--iterations N] [--dtype fp16|fp32] [--json FILE] "
                   "[--torchscript FILE]\n");
      return 2;
    }
  }
  if (!torch::cuda::is_available()) {
    std::printf("torch_resnet_bench: no CUDA device found; nothing to measure.\n");
    return 0;
  }
  try {
    const torch::Dtype dtype = dtype_name == "fp32" ? torch::kFloat : torch::kHalf;
    const auto options = torch::TensorOptions().device(torch::kCUDA).dtype(dtype);
    torch::manual_seed(0);
    auto model = replay_examples::resnet50(torch::kCUDA, dtype);
    const std::int64_t largest = *std::max_element(batches.begin(), batches.end());
    std::vector<std::int64_t> buckets = batches;
    std::sort(buckets.begin(), buckets.end());
    replay::GraphedCallable fast(model, {torch::randn({largest, 3, 224, 224}, options)},
                                 {.flags = replay::GraphedFlags::view_outputs, .batch_buckets = buckets});
    replay::GraphedCallable safe(model, {torch::randn({largest, 3, 224, 224}, options)},
                                 {.batch_buckets = buckets});

    // torchvision's ResNet-50 as TorchScript, prepared: channels-last inputs
    // (made outside the timed loop), and NCHW inputs converted inside the graph.
    std::optional<replay::PreparedModule> prepared;
    std::optional<replay::GraphedCallable> ts_fast;
    std::optional<replay::GraphedCallable> ts_safe;
    std::optional<replay::GraphedCallable> ts_nchw;
    if (!torchscript.empty()) {
      prepared.emplace(replay::load_prepared(
          torchscript, {.flags = replay::PrepareFlags::inference | replay::PrepareFlags::channels_last, .dtype = dtype}));
      const at::Tensor example = torch::randn({largest, 3, 224, 224}, options);
      const replay::GraphedFlags no_grad = replay::GraphedFlags::no_grad;
      ts_fast.emplace(*prepared, std::vector<at::Tensor>{prepared->prepare_input(example)},
                      replay::GraphedOptions{.flags = no_grad | replay::GraphedFlags::view_outputs,
                                             .batch_buckets = buckets});
      ts_safe.emplace(*prepared, std::vector<at::Tensor>{prepared->prepare_input(example)},
                      replay::GraphedOptions{.flags = no_grad, .batch_buckets = buckets});
      ts_nchw.emplace(*prepared, std::vector<at::Tensor>{example},
                      replay::GraphedOptions{.flags = no_grad | replay::GraphedFlags::view_outputs,
                                             .batch_buckets = buckets});
    }

    std::vector<Row> rows;
    for (const std::int64_t batch : batches) {
      const at::Tensor input = torch::randn({batch, 3, 224, 224}, options);
      const int n = iterations > 0 ? iterations : (batch <= 1 ? 500 : batch <= 8 ? 200 : 100);
      const int warmup = std::max(10, n / 10);
      {
        c10::InferenceMode inference;  // as the Python side's torch.inference_mode()
        rows.push_back({"cpp_eager", batch, replay_examples::measure([&] { (void)model(input); }, n, warmup, batch)});
      }
      rows.push_back({"cpp_replay", batch, replay_examples::measure([&] { (void)fast.run({input}); }, n, warmup, batch)});
      rows.push_back(
          {"cpp_replay_clone", batch, replay_examples::measure([&] { (void)safe.run({input}); }, n, warmup, batch)});
      if (prepared) {
        const at::Tensor channels_last = prepared->prepare_input(input);
        {
          torch::NoGradGuard no_grad;  // as GraphedFlags::no_grad runs it
          rows.push_back({"cpp_ts_eager", batch,
                          replay_examples::measure([&] { (void)(*prepared)({channels_last}); }, n, warmup, batch)});
        }
        rows.push_back({"cpp_ts_replay", batch,
                        replay_examples::measure([&] { (void)ts_fast->run({channels_last}); }, n, warmup, batch)});
        rows.push_back({"cpp_ts_replay_clone", batch,
                        replay_examples::measure([&] { (void)ts_safe->run({channels_last}); }, n, warmup, batch)});
        rows.push_back({"cpp_ts_replay_nchw", batch,
                        replay_examples::measure([&] { (void)ts_nchw->run({input}); }, n, warmup, batch)});
      }
    }

    std::printf("C++ ResNet-50 %s (torch::nn%s; replay::GraphedCallable)\n", dtype_name.c_str(),
                prepared ? " and prepared TorchScript" : "");
    for (const Row& r : rows) {
      std::printf("  %-20s b=%-3lld p50 %8.3f ms  p99 %8.3f ms  mean %8.3f ms  %9.1f img/s\n", r.impl.c_str(),
                  static_cast<long long>(r.batch), r.latency.p50_ms, r.latency.p99_ms, r.latency.mean_ms, r.latency.qps);
    }
    if (!json_path.empty()) {
      std::ofstream out(json_path);
      out << "{\"dtype\": \"" << dtype_name << "\", \"rows\": [";
      for (std::size_t i = 0; i < rows.size(); ++i) {
        const Row& r = rows[i];
        out << (i == 0 ? "" : ", ") << "{\"impl\": \"" << r.impl << "\", \"batch\": " << r.batch
            << ", \"p50_ms\": " << r.latency.p50_ms << ", \"p99_ms\": " << r.latency.p99_ms
            << ", \"mean_ms\": " << r.latency.mean_ms << ", \"qps\": " << r.latency.qps << "}";
      }
      out << "]}\n";
      if (!out) {
        std::fprintf(stderr, "torch_resnet_bench: could not write %s\n", json_path.c_str());
        return 1;
      }
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "torch_resnet_bench: %s\n", e.what());
    return 1;
  }
}
