// torch_bert: a BERT-base-sized encoder (transformers.BertConfig(), random
// weights, fp16), traced to TorchScript by scripts/make_torchscript_bert.py,
// prepared by replay::load_prepared (frozen, optimized for inference) and
// graphed per (batch, sequence length) bucket: batch 1, 2, 4, 8 by sequence
// 16, 32, 64, 128, one graph each (SequenceGraphs: replay::ShapeRouter with a
// 2-D key over replay::TorchGraphBackend).
//
// First it checks the graphed outputs against the ones Python computed with
// the transformers model itself (bert_reference.pt, written by the same
// script): max-abs-error / max|ref| over last_hidden_state (real tokens only)
// and pooler_output must stay below 2e-2 in fp16; the error of the fp16 model
// against fp32 is printed too. Then it times C++ eager (the prepared module)
// and C++ replay at a few shapes, the way bench/torch_bert_bench.py times
// PyTorch eager and torch.compile, and writes the rows as JSON for it. Beside
// them it times the same model written without replay: libtorch's own
// at::cuda::CUDAGraph of it at the shape's bucket, launched with raw
// cudaGraphLaunch after the same input copies (RawBucketGraph): what replay's
// routing costs, and the fastest a graph of these kernels runs, which bounds
// what eager / replay can be at a shape where the GPU's work dominates.
//
//   torch_bert --model bert_torchscript.pt --reference bert_reference.pt
//              [--shapes 1x16,8x128,...] [--iterations N] [--json FILE]
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#include <torch/script.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cli.hpp"
#include "latency.hpp"
#include "replay/torch.hpp"
#include "sequence_graphs.hpp"

namespace {

using Shape = std::pair<std::int64_t, std::int64_t>;

std::vector<Shape> parse_shapes(std::string_view text) {
  std::vector<Shape> out;
  std::size_t start = 0;
  while (start < text.size()) {
    const std::size_t end = std::min(text.find(',', start), text.size());
    const std::string part(text.substr(start, end - start));
    const std::size_t x = part.find('x');
    if (x == std::string::npos) {
      throw std::invalid_argument("shape '" + part + "' is not BATCHxSEQ");
    }
    out.emplace_back(std::stoll(part.substr(0, x)), std::stoll(part.substr(x + 1)));
    start = end + 1;
  }
  return out;
}

struct Row {
  std::string impl;
  Shape shape;
  replay_examples::Latency latency;
};

// The model at one bucket as one CUDA graph, without replay: libtorch's
// at::cuda::CUDAGraph captured around the prepared module on static inputs of
// the bucket's shape (all ones, as SequenceGraphs captures), and a call that
// copies the caller's [b, s] inputs in as SequenceGraphs does (copy_into_bucket) and
// launches the graph's executable with raw cudaGraphLaunch. It neither zeroes
// the padding nor cuts the outputs back: a reference for timing only.
class RawBucketGraph {
 public:
  RawBucketGraph(replay::PreparedModule& model, Shape bucket) {
    const c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool(false);
    const c10::cuda::CUDAStreamGuard on_side(side);
    c10::InferenceMode inference;
    const auto options = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kLong);
    inputs_ = {torch::ones({bucket.first, bucket.second}, options), torch::ones({bucket.first, bucket.second}, options)};
    for (int i = 0; i < 3; ++i) {  // cuBLAS's handles and workspaces, the allocator's blocks
      (void)model(inputs_);
    }
    side.synchronize();
    graph_.capture_begin();
    outputs_ = model(inputs_);
    graph_.capture_end();
    side.synchronize();
  }
  RawBucketGraph(const RawBucketGraph&) = delete;
  RawBucketGraph& operator=(const RawBucketGraph&) = delete;
  ~RawBucketGraph() = default;

  // One call on the current stream; `inputs`: int64 [b, s] contiguous CUDA
  // tensors within the bucket.
  void run(const std::vector<at::Tensor>& inputs) {
    const cudaStream_t stream = c10::cuda::getCurrentCUDAStream().stream();
    for (std::size_t i = 0; i < inputs_.size(); ++i) {
      replay_examples::copy_into_bucket(inputs_[i], inputs[i], stream);
    }
    replay::check(cudaGraphLaunch(graph_.raw_cuda_graph_exec(), stream), "cudaGraphLaunch");
  }

 private:
  std::vector<at::Tensor> inputs_;
  std::vector<at::Tensor> outputs_;  // the graph's static outputs, kept with it
  at::cuda::CUDAGraph graph_;
};

// The smallest bucket at least `n`.
std::int64_t bucket_of(const std::vector<std::int64_t>& buckets, std::int64_t n) {
  const auto it = std::lower_bound(buckets.begin(), buckets.end(), n);
  if (it == buckets.end()) {
    throw std::invalid_argument("shape " + std::to_string(n) + " is above the largest bucket");
  }
  return *it;
}

// The first output with padded positions (mask 0) zeroed, and the second, as compared.
std::vector<at::Tensor> comparable(const std::vector<at::Tensor>& out, const at::Tensor& mask) {
  const at::Tensor keep = mask.to(out[0].device()).unsqueeze(-1).to(at::kFloat);
  return {out[0].to(at::kFloat) * keep, out[1].to(at::kFloat)};
}

}  // namespace

int main(int argc, char** argv) {
  std::string model_path;
  std::string reference_path;
  std::string json_path;
  std::vector<Shape> shapes{{1, 16}, {8, 128}, {4, 64}, {1, 128}, {8, 16}, {3, 40}};  // as bench/torch_bert_bench.py
  int iterations = 0;  // 0: by size
  try {
    for (int i = 1; i < argc; ++i) {
      const std::string_view arg(argv[i]);
      auto value = [&] { return replay_examples::option_value(argc, argv, i); };
      if (arg == "--model") {
        model_path = value();
      } else if (arg == "--reference") {
        reference_path = value();
      } else if (arg == "--shapes") {
        shapes = parse_shapes(value());
      } else if (arg == "--iterations") {
        iterations = std::stoi(value());
      } else if (arg == "--json") {
        json_path = value();
      } else {
        throw std::invalid_argument("unknown argument " + std::string(arg));
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr,
                 "torch_bert: %s\nusage: torch_bert --model FILE [--reference FILE] [--shapes 1x16,8x128] "
                 "[--iterations N] [--json FILE]\n",
                 e.what());
    return 2;
  }
  if (!torch::cuda::is_available()) {
    std::printf("torch_bert: no CUDA device found; nothing to run.\n");
    return 0;
  }
  if (model_path.empty() || !std::filesystem::exists(model_path)) {
    std::fprintf(stderr, "torch_bert: give --model (write it with scripts/make_torchscript_bert.py OUT_DIR)\n");
    return 1;
  }
  try {
    const std::vector<std::int64_t> batch_buckets{1, 2, 4, 8};
    const std::vector<std::int64_t> sequence_buckets{16, 32, 64, 128};
    auto start = std::chrono::steady_clock::now();
    replay::PreparedModule prepared = replay::load_prepared(model_path, {.flags = replay::PrepareFlags::inference});
    const double prepare_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    start = std::chrono::steady_clock::now();
    replay_examples::SequenceGraphs graphs(prepared, torch::kCUDA, batch_buckets, sequence_buckets);
    const double capture_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    std::printf("torch_bert: loaded, frozen and optimized in %.0f ms; %zu graphs (batch 1..8 x sequence 16..128) "
                "captured in %.0f ms, private pool %.1f MiB\n",
                prepare_ms, graphs.graph_count(), capture_ms,
                static_cast<double>(graphs.pool_reserved_bytes()) / (1024.0 * 1024.0));

    bool ok = graphs.graph_count() == batch_buckets.size() * sequence_buckets.size();
    if (!ok) {
      std::printf("torch_bert: MISSING graphs: some captures failed (see above)\n");
    }
    if (!reference_path.empty()) {
      // Python's outputs of the transformers model, eager, fp16 and fp32.
      replay::PreparedModule unprepared = replay::load_prepared(model_path, {.flags = replay::PrepareFlags::none});
      torch::jit::Module reference = torch::jit::load(reference_path, torch::kCUDA);
      const std::int64_t count = reference.attr("count").toTensor().item<std::int64_t>();
      const double tolerance = 2e-2;
      double worst = 0.0;
      double worst32 = 0.0;
      double worst_python = 0.0;
      auto buffer = [&](const std::string& name, std::int64_t k) {
        return reference.attr(name + "_" + std::to_string(k)).toTensor();
      };
      for (std::int64_t k = 0; k < count; ++k) {
        const at::Tensor ids = buffer("ids", k);
        const at::Tensor mask = buffer("mask", k);
        const std::vector<at::Tensor> expected = comparable({buffer("hidden", k), buffer("pooled", k)}, mask);
        const std::vector<at::Tensor> expected32 = comparable({buffer("hidden32", k), buffer("pooled32", k)}, mask);
        const std::vector<at::Tensor> graphed = comparable(graphs.run({ids, mask}), mask);
        std::vector<at::Tensor> eager;
        {
          c10::InferenceMode inference;
          eager = comparable(unprepared({ids, mask}), mask);
        }
        const double error = replay::compare_outputs(graphed, expected).relative();
        const double error32 = replay::compare_outputs(graphed, expected32).relative();
        const double eager_error = replay::compare_outputs(eager, expected).relative();
        const double python_fp16 = replay::compare_outputs(expected, expected32).relative();
        worst = std::max(worst, error);
        worst32 = std::max(worst32, error32);
        worst_python = std::max(worst_python, python_fp16);
        const bool good = error < tolerance;
        ok = ok && good;
        std::printf("  check %lldx%-4lld graphed prepared vs Python fp16: %.1e (tolerance %.0e), vs Python fp32: %.1e | "
                    "C++ unprepared eager vs Python fp16: %.1e | Python fp16 vs fp32: %.1e%s\n",
                    static_cast<long long>(ids.size(0)), static_cast<long long>(ids.size(1)), error, tolerance,
                    error32, eager_error, python_fp16, good ? "" : "  MISMATCH");
      }
      std::printf("torch_bert: checked %lld shapes against Python, max-abs-error / max|ref|: graphed prepared fp16 vs "
                  "Python fp16 at most %.1e (tolerance %.0e), vs Python fp32 %.1e; Python fp16 vs fp32 %.1e\n",
                  static_cast<long long>(count), worst, tolerance, worst32, worst_python);
    } else {
      std::printf("(no --reference file: outputs not checked against Python)\n");
    }

    std::vector<Row> rows;
    const auto options = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kLong);
    for (const Shape& shape : shapes) {
      const at::Tensor ids = torch::randint(1, 30522, {shape.first, shape.second}, options);
      const at::Tensor mask = torch::ones({shape.first, shape.second}, options);
      const std::int64_t tokens = shape.first * shape.second;
      const int n = iterations > 0 ? iterations : (tokens <= 256 ? 300 : 150);
      const int warmup = std::max(10, n / 10);
      {
        c10::InferenceMode inference;
        rows.push_back({"cpp_eager", shape,
                        replay_examples::measure([&] { (void)prepared({ids, mask}); }, n, warmup, shape.first)});
      }
      rows.push_back(
          {"cpp_replay", shape, replay_examples::measure([&] { (void)graphs.run({ids, mask}); }, n, warmup, shape.first)});
      RawBucketGraph raw(prepared, {bucket_of(batch_buckets, shape.first), bucket_of(sequence_buckets, shape.second)});
      rows.push_back({"cpp_raw_graph", shape,
                      replay_examples::measure([&] { raw.run({ids, mask}); }, n, warmup, shape.first)});
    }
    std::printf("C++ BERT-base fp16 (prepared TorchScript; replay over 2-D buckets; cpp_raw_graph: the bucket's "
                "graph without replay, torch's CUDAGraph launched with cudaGraphLaunch)\n");
    for (const Row& r : rows) {
      std::printf("  %-13s %lldx%-4lld p50 %8.3f ms  p99 %8.3f ms  mean %8.3f ms  %9.1f seq/s\n", r.impl.c_str(),
                  static_cast<long long>(r.shape.first), static_cast<long long>(r.shape.second), r.latency.p50_ms,
                  r.latency.p99_ms, r.latency.mean_ms, r.latency.qps);
    }
    const replay::RouterStats stats = graphs.stats();
    std::printf("  router: %llu runs, %llu graph hits\n", static_cast<unsigned long long>(stats.runs),
                static_cast<unsigned long long>(stats.hits));
    if (!json_path.empty()) {
      std::ofstream out(json_path);
      out << "{\"model\": \"bert-base\", \"dtype\": \"fp16\", \"rows\": [";
      for (std::size_t i = 0; i < rows.size(); ++i) {
        const Row& r = rows[i];
        out << (i == 0 ? "" : ", ") << "{\"impl\": \"" << r.impl << "\", \"batch\": " << r.shape.first
            << ", \"seq\": " << r.shape.second << ", \"p50_ms\": " << r.latency.p50_ms
            << ", \"p99_ms\": " << r.latency.p99_ms << ", \"mean_ms\": " << r.latency.mean_ms
            << ", \"qps\": " << r.latency.qps << "}";
      }
      out << "], \"checked\": " << (ok ? "true" : "false") << "}\n";
      if (!out) {
        std::fprintf(stderr, "torch_bert: could not write %s\n", json_path.c_str());
        return 1;
      }
    }
    std::printf("torch_bert: %s\n", ok ? "graphed outputs match Python's" : "MISMATCH or missing graphs");
    return ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "torch_bert: %s\n", e.what());
    return 1;
  }
}
