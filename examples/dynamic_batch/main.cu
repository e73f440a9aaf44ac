// dynamic_batch: serves a stream of requests whose batch size varies (1..64)
// with replay::ShapeRouter. Batch sizes are rounded up to power-of-two
// buckets; each bucket's forward pass is captured once (after one eager
// warm-up) into a CUDA graph that works on static buffers sized for the
// largest bucket; a request pads its input up to the bucket, replays the
// graph, and reads back only its real rows. The same requests are then
// served eagerly; the program prints both latencies, the router's statistics
// and memory, and checks that every answer matches.
//
//   dynamic_batch [requests=2000] [layers=50]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <span>
#include <string_view>
#include <vector>

#include "replay/replay.hpp"
#include "replay/shape_router.hpp"

namespace {

constexpr int kMaxBatch = 64;
constexpr int kFeatures = 256;
constexpr std::size_t kMaxElements = static_cast<std::size_t>(kMaxBatch) * kFeatures;

// One "layer": out = max(w * in + b, 0.01 * (w * in + b)), element-wise, so every
// row depends only on itself and padded rows cannot change real ones.
__global__ void layer_kernel(const float* in, float* out, int n, float w, float b) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) {
    const float v = fmaf(w, in[i], b);
    out[i] = fmaxf(v, 0.01F * v);
  }
}

class Server {
 public:
  explicit Server(int layers)
      : layers_(layers),
        router_([this](int batch, replay::StreamRef s) { forward(batch, s); },
                {.policy = replay::RoutingPolicy::bucketed,
                 .buckets = {replay::power_of_two_buckets(kMaxBatch)},
                 .warmup_runs = 1,
                 .on_capture_failure = [](const int& batch, std::string_view why) {
                   std::fprintf(stderr, "batch %d runs eagerly: %.*s\n", batch, static_cast<int>(why.size()),
                                why.data());
                 }}) {}

  // Serves one request of `batch` rows: returns its `batch` output rows.
  std::vector<float> serve(std::span<const float> rows, int batch, bool graphed) {
    const std::size_t real = static_cast<std::size_t>(batch) * kFeatures;
    std::copy(rows.begin(), rows.end(), staging_in_.span().begin());
    if (graphed) {
      // Copy in, run, copy out as one request: the router's buffers are
      // shared by all its graphs, so the copies belong inside its lease.
      router_.run_staged(
          batch, stream_,
          [&](const int&, const int& padded, replay::StreamRef s) {
            input_.first(real).copy_from(staging_in_.first(real), s);
            const std::size_t padded_elements = static_cast<std::size_t>(padded) * kFeatures;
            input_.subview(real, padded_elements - real).zero(s);  // deterministic padding rows
          },
          [&](const replay::Route<int>&, replay::StreamRef s) {
            staging_out_.first(real).copy_from(output_.first(real), s);
          });
    } else {
      input_.first(real).copy_from(staging_in_.first(real), stream_);
      forward(batch, stream_);
      staging_out_.first(real).copy_from(output_.first(real), stream_);
    }
    stream_.synchronize();
    return {staging_out_.span().begin(), staging_out_.span().begin() + static_cast<std::ptrdiff_t>(real)};
  }

  const replay::ShapeRouter<int>& router() const { return router_; }

 private:
  // The model's forward pass over the first `batch` rows of the static buffers.
  void forward(int batch, replay::StreamRef s) const {
    const int n = batch * kFeatures;
    const unsigned blocks = static_cast<unsigned>((n + 255) / 256);
    layer_kernel<<<blocks, 256, 0, s.get()>>>(input_.data(), output_.data(), n, 1.01F, 0.001F);
    for (int l = 1; l < layers_; ++l) {
      layer_kernel<<<blocks, 256, 0, s.get()>>>(output_.data(), output_.data(), n, l % 2 == 0 ? 1.01F : 0.99F,
                                                0.001F);
    }
    replay::check_last_launch("layer_kernel");
  }

  int layers_;
  replay::Stream stream_;
  replay::DeviceBuffer<float> input_{kMaxElements};   // sized for the largest bucket:
  replay::DeviceBuffer<float> output_{kMaxElements};  // every graph shares them
  replay::PinnedBuffer<float> staging_in_{kMaxElements};
  replay::PinnedBuffer<float> staging_out_{kMaxElements};
  replay::ShapeRouter<int> router_;
};

double ms_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

int main(int argc, char** argv) {
  const int requests = argc > 1 ? std::atoi(argv[1]) : 2000;
  const int layers = argc > 2 ? std::atoi(argv[2]) : 50;
  if (requests <= 0 || layers <= 0) {
    std::fprintf(stderr, "usage: dynamic_batch [requests>0] [layers>0]\n");
    return 2;
  }
  if (!replay::has_device()) {
    std::printf("dynamic_batch: %s. This example needs an NVIDIA GPU and driver; it built correctly, "
                "but there is nothing to run on.\n",
                replay::no_device_message.data());
    return 0;
  }

  try {
    Server server(layers);
    std::mt19937 rng{std::random_device{}()};
    std::uniform_int_distribution<int> batch_dist(1, kMaxBatch);
    std::uniform_real_distribution<float> value(-1.0F, 1.0F);
    std::vector<int> batches(static_cast<std::size_t>(requests));
    std::vector<std::vector<float>> inputs(static_cast<std::size_t>(requests));
    for (int r = 0; r < requests; ++r) {
      batches[r] = batch_dist(rng);
      inputs[r].resize(static_cast<std::size_t>(batches[r]) * kFeatures);
      for (float& v : inputs[r]) {
        v = value(rng);
      }
    }

    std::vector<std::vector<float>> routed(static_cast<std::size_t>(requests));
    auto start = std::chrono::steady_clock::now();
    for (int r = 0; r < requests; ++r) {
      routed[r] = server.serve(inputs[r], batches[r], true);
    }
    const double routed_ms = ms_since(start);

    std::vector<std::vector<float>> eager(static_cast<std::size_t>(requests));
    start = std::chrono::steady_clock::now();
    for (int r = 0; r < requests; ++r) {
      eager[r] = server.serve(inputs[r], batches[r], false);
    }
    const double eager_ms = ms_since(start);

    int mismatches = 0;
    for (int r = 0; r < requests; ++r) {
      mismatches += routed[r] == eager[r] ? 0 : 1;
    }
    const auto stats = server.router().stats();
    const auto memory = server.router().memory();
    std::printf("dynamic_batch: %d requests, batch 1..%d, %d layers of %d features\n", requests, kMaxBatch, layers,
                kFeatures);
    std::printf("  eager : %8.3f ms per request\n", eager_ms / requests);
    std::printf("  routed: %8.3f ms per request  (%.2fx faster, captures and warm-ups included)\n",
                routed_ms / requests, eager_ms / routed_ms);
    std::printf("  router: %llu hits, %llu misses (%llu warm-ups, %llu captures), %llu eager fallbacks, padding "
                "waste %.1f%%\n",
                static_cast<unsigned long long>(stats.hits), static_cast<unsigned long long>(stats.misses),
                static_cast<unsigned long long>(stats.warmups), static_cast<unsigned long long>(stats.captures),
                static_cast<unsigned long long>(stats.eager_fallbacks), 100.0 * stats.padding_waste());
    std::printf("  graphs: %zu, footprint %.1f MiB", memory.graphs,
                static_cast<double>(memory.footprint_bytes) / (1024.0 * 1024.0));
    if (memory.pool) {
      std::printf(", device graph pool reserved %.1f MiB", static_cast<double>(memory.pool->reserved) / (1024.0 * 1024.0));
    }
    std::printf("\n  results %s\n", mismatches == 0 ? "equal" : "DIFFER");
    return mismatches == 0 ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dynamic_batch: %s\n", e.what());
    return 1;
  }
}
