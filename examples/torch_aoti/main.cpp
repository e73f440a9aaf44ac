// torch_aoti: an AOTInductor package (.pt2, from
// torch._inductor.aoti_compile_and_package with a dynamic batch
// torch.export.Dim) loaded with torch::inductor::AOTIModelPackageLoader and
// graphed per batch bucket through replay::GraphedCallable: one package
// serves every bucket. The loader runs single-threaded (no locking of its
// own, as CUDA graphs need) on torch's current stream. Checks graphed outputs
// against the package run eagerly, then times both.
//
//   torch_aoti --package resnet50-dynamic.pt2 [--batches 1,8,32] [--iterations N]
//              [--input 3x224x224] [--dtype fp16|fp32]
//
// Optional (examples/torch_aoti/CMakeLists.txt): built only where the loader's
// header exists. Run it with `bash examples/torch_aoti/run.sh`.
#include <torch/csrc/inductor/aoti_package/model_package_loader.h>
#include <torch/torch.h>

#include <c10/cuda/CUDAStream.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "cli.hpp"
#include "latency.hpp"
#include "replay/torch.hpp"

int main(int argc, char** argv) {
  std::string package;
  std::vector<std::int64_t> batches{1, 8, 32};
  std::vector<std::int64_t> item{3, 224, 224};
  torch::Dtype dtype = torch::kHalf;
  int iterations = 100;
  try {
    for (int i = 1; i < argc; ++i) {
      const std::string_view arg(argv[i]);
      auto value = [&] { return replay_examples::option_value(argc, argv, i); };
      if (arg == "--package") {
        package = value();
      } else if (arg == "--batches") {
        batches = replay_examples::parse_list(value());
      } else if (arg == "--input") {
        item = replay_examples::parse_list(value(), 'x');
      } else if (arg == "--dtype") {
        dtype = value() == "fp32" ? torch::kFloat : torch::kHalf;
      } else if (arg == "--iterations") {
        iterations = std::stoi(value());
      } else {
        throw std::invalid_argument("unknown argument " + std::string(arg));
      }
    }
    if (package.empty()) {
      throw std::invalid_argument("--package is required");
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr,
                 "torch_aoti: %s\nusage: torch_aoti --package FILE.pt2 [--batches 1,8,32] [--input 3x224x224] "
                 "[--dtype fp16|fp32] [--iterations N]\n",
                 e.what());
    return 2;
  }
  if (!torch::cuda::is_available()) {
    std::printf("torch_aoti: no CUDA device found; nothing to run.\n");
    return 0;
  }
  try {
    std::printf("torch_aoti: loading %s\n", package.c_str());
    std::fflush(stdout);
    auto loader = std::make_shared<torch::inductor::AOTIModelPackageLoader>(
        package, "model", /*run_single_threaded=*/true, /*num_runners=*/1, /*device_index=*/-1);
    auto run = [loader](const std::vector<at::Tensor>& inputs) {
      return loader->run(inputs, c10::cuda::getCurrentCUDAStream().stream());
    };
    const auto options = torch::TensorOptions().device(torch::kCUDA).dtype(dtype);
    auto shape = [&](std::int64_t batch) {
      std::vector<std::int64_t> sizes{batch};
      sizes.insert(sizes.end(), item.begin(), item.end());
      return sizes;
    };
    std::sort(batches.begin(), batches.end());
    {
      const at::Tensor probe = torch::randn(shape(batches.front()), options);
      c10::InferenceMode inference;
      (void)run({probe});
      torch::cuda::synchronize();
      std::printf("torch_aoti: loaded, one eager run done\n");
      std::fflush(stdout);
    }
    replay::GraphedCallable graphed(run, {torch::randn(shape(batches.back()), options)},
                                    {.batch_buckets = batches});
    std::printf("torch_aoti: %zu graphs from one package, private pool %.1f MiB\n", graphed.graph_count(),
                static_cast<double>(graphed.pool_reserved_bytes()) / (1024.0 * 1024.0));
    bool ok = graphed.graph_count() == batches.size();
    for (const std::int64_t batch : batches) {
      const at::Tensor input = torch::randn(shape(batch), options);
      const auto eager = replay_examples::measure([&] { (void)graphed.run_eager({input}); }, iterations,
                                                  std::max(5, iterations / 10), batch);
      const auto replayed = replay_examples::measure([&] { (void)graphed.run({input}); }, iterations,
                                                     std::max(5, iterations / 10), batch);
      const replay::OutputDifference diff =
          replay::compare_outputs(graphed.run({input}).tensors(), graphed.run_eager({input}));
      const bool good = diff.relative() < 1e-2;
      ok = ok && good;
      std::printf("  b=%-3lld AOTI eager p50 %7.3f ms | graphed p50 %7.3f ms p99 %7.3f ms | x%.2f | graphed vs eager "
                  "max-abs-err/max|ref| %.1e%s\n",
                  static_cast<long long>(batch), eager.p50_ms, replayed.p50_ms, replayed.p99_ms,
                  eager.p50_ms / replayed.p50_ms, diff.relative(), good ? "" : "  MISMATCH");
    }
    std::printf("torch_aoti: %s\n", ok ? "graphed outputs match eager ones" : "MISMATCH or missing graphs");
    return ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "torch_aoti: %s\n", e.what());
    return 1;
  }
}
