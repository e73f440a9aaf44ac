// The torch component of an installed replay, consumed with libtorch: graphs
// a small tensor function and checks the replays against the function run
// eagerly. Without a GPU it says so and checks only that it linked.
#include <torch/torch.h>

#include <cstdio>

#include <replay/device.hpp>
#include <replay/torch.hpp>
#include <replay/version.hpp>

int main() {
  if (!replay::has_device() || !torch::cuda::is_available()) {
    std::printf("consumer: replay %s with its torch adapter linked; %s, so the graph round trip was not run\n",
                REPLAY_VERSION_STRING, replay::no_device_message.data());
    return 0;
  }
  const auto opts = torch::TensorOptions().device(torch::kCUDA);
  const at::Tensor w = torch::randn({64, 32}, opts);
  auto fn = [&](const at::Tensor& x) { return torch::relu(x.matmul(w)) + 1.0; };
  replay::GraphedCallable graphed(fn, {torch::randn({8, 64}, opts)}, {.batch_buckets = {2, 8}});
  int wrong = 0;
  for (const int64_t batch : {1, 2, 5, 8}) {
    const at::Tensor x = torch::randn({batch, 64}, opts);
    const replay::GraphedOutputs out = graphed(x);
    const at::Tensor expected = fn(x);
    const double err = (out[0] - expected).abs().max().item<double>() / expected.abs().max().item<double>();
    if (!out.graphed() || err > 1e-4) {
      std::printf("consumer: batch %lld: graphed=%d, max error %g\n", static_cast<long long>(batch),
                  out.graphed() ? 1 : 0, err);
      ++wrong;
    }
  }
  std::printf("consumer: replay %s with its torch adapter: %s\n", REPLAY_VERSION_STRING, wrong == 0 ? "ok" : "FAILED");
  return wrong == 0 ? 0 : 1;
}
