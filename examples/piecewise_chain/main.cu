// piecewise_chain: a kernel chain with one break in the middle. The first
// half runs, a region reads one value back to the host, and that value picks
// one of two second halves, a decision a single CUDA Graph cannot hold. Run
// three ways: eagerly, as a replay::capture_piecewise executable (two graph
// segments around the region, the second kept per value), and through a
// ShapeRouter with BreakPolicy::piecewise (one such executable per shape).
// The input's sign flips between iterations, so both second halves run;
// every result is checked against eager, and the time of each way printed.
//
//   piecewise_chain [kernels per half=500] [elements=4096] [iterations=20]
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <span>
#include <string>
#include <vector>

#include "replay/replay.hpp"

namespace {

__global__ void step_kernel(float* x, int n, float a, float b) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) {
    x[i] = a * x[i] + b;
  }
}
__global__ void sign_kernel(const float* x, int* flag) { *flag = x[0] > 0.0F ? 1 : 0; }

void half(replay::StreamRef s, float* x, int n, int kernels, float a, float b) {
  const unsigned blocks = static_cast<unsigned>((n + 255) / 256);
  for (int k = 0; k < kernels; ++k) {
    step_kernel<<<blocks, 256, 0, s.get()>>>(x, n, k % 2 == 0 ? a : 1.0F / a, b);
  }
  replay::check_last_launch("step_kernel launch");
}

// What the chain needs, at addresses that never move (the segments read them).
struct Chain {
  int n;
  int kernels;
  replay::DeviceBuffer<float> x;
  replay::DeviceBuffer<int> flag{1};
  replay::PinnedBuffer<int> host_flag{1};

  Chain(int elements, int per_half) : n(elements), kernels(per_half), x(static_cast<std::size_t>(elements)) {}

  // The work: first half, the read-back region, then the second half it picks.
  void operator()(replay::StreamRef s) {
    half(s, x.data(), n, kernels, 1.0001F, 0.001F);
    sign_kernel<<<1, 1, 0, s.get()>>>(x.data(), flag.data());
    replay::check_last_launch("sign_kernel launch");
    const int positive = replay::eager(s, "read sign", [this](replay::StreamRef r) {
      host_flag.view().copy_from(flag.view(), r);
      r.synchronize();  // the one synchronization: the host decides what follows
      return host_flag.data()[0];
    });
    if (positive != 0) {
      half(s, x.data(), n, kernels, 0.9999F, -0.002F);
    } else {
      half(s, x.data(), n, kernels, 1.0002F, 0.003F);
    }
  }
};

double ms_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
}

std::vector<float> input(int n, int iteration) {
  std::vector<float> data(static_cast<std::size_t>(n));
  const float sign = iteration % 2 == 0 ? 1.0F : -1.0F;  // flips the branch
  for (int i = 0; i < n; ++i) {
    data[static_cast<std::size_t>(i)] = sign * (1.0F + 0.5F * std::sin(static_cast<float>(i + iteration)));
  }
  return data;
}

std::vector<float> read(const Chain& chain, replay::StreamRef s) {
  std::vector<float> out(static_cast<std::size_t>(chain.n));
  chain.x.copy_to(std::span<float>(out), s);
  s.synchronize();
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  const int kernels = argc > 1 ? std::atoi(argv[1]) : 500;
  const int n = argc > 2 ? std::atoi(argv[2]) : 4096;
  const int iterations = argc > 3 ? std::atoi(argv[3]) : 20;
  if (kernels <= 0 || n <= 0 || iterations <= 0) {
    std::fprintf(stderr, "usage: piecewise_chain [kernels per half>0] [elements>0] [iterations>0]\n");
    return 2;
  }
  if (!replay::has_device()) {
    std::printf("piecewise_chain: %s. This example needs an NVIDIA GPU and driver; it built correctly, "
                "but there is nothing to run on.\n",
                replay::no_device_message.data());
    return 0;
  }

  try {
    replay::Stream stream;
    Chain eager_chain(n, kernels);
    Chain piecewise_chain(n, kernels);
    Chain routed_chain(n, kernels);

    // The eager results, one per iteration: the reference.
    std::vector<std::vector<float>> expected;
    double eager_ms = 0;
    for (int it = 0; it < iterations; ++it) {
      eager_chain.x.copy_from(std::span<const float>(input(n, it)), stream);
      stream.synchronize();
      const auto start = std::chrono::steady_clock::now();
      replay::run_eagerly(stream, eager_chain);  // the same work, its region in place
      stream.synchronize();
      eager_ms += ms_since(start);
      expected.push_back(read(eager_chain, stream));
    }

    // Piecewise: the capture runs the work once (iteration 0), each launch
    // replays segment, region, and the segment kept for the region's value.
    int wrong = 0;
    piecewise_chain.x.copy_from(std::span<const float>(input(n, 0)), stream);
    auto exec = replay::capture_piecewise(stream, [&](replay::StreamRef s) { piecewise_chain(s); });
    wrong += read(piecewise_chain, stream) == expected[0] ? 0 : 1;
    double piecewise_ms = 0;
    for (int it = 0; it < iterations; ++it) {
      piecewise_chain.x.copy_from(std::span<const float>(input(n, it)), stream);
      stream.synchronize();
      const auto start = std::chrono::steady_clock::now();
      exec.launch(stream);
      stream.synchronize();
      piecewise_ms += ms_since(start);
      wrong += read(piecewise_chain, stream) == expected[static_cast<std::size_t>(it)] ? 0 : 1;
    }

    // A ShapeRouter whose key's work declares the break: captured piecewise
    // on its first run (which is that run), replayed after.
    replay::ShapeRouterOptions<int> options;
    options.breaks = replay::BreakPolicy::piecewise;
    replay::ShapeRouter<int> router([&](const int&, replay::StreamRef s) { routed_chain(s); }, options);
    double routed_ms = 0;
    for (int it = 0; it < iterations; ++it) {
      std::vector<float> out(static_cast<std::size_t>(n));
      const auto start = std::chrono::steady_clock::now();
      (void)router.run_staged(
          n, stream,
          [&](const int&, const int&, replay::StreamRef s) {
            routed_chain.x.copy_from(std::span<const float>(input(n, it)), s);
          },
          [&](const replay::Route<int>&, replay::StreamRef s) {
            routed_chain.x.copy_to(std::span<float>(out), s);
            s.synchronize();
          });
      if (it > 0) {
        routed_ms += ms_since(start);  // iteration 0 is the capture
      }
      wrong += out == expected[static_cast<std::size_t>(it)] ? 0 : 1;
    }
    const replay::RouterEntryInfo<int> entry = router.entry_info(n);

    const auto stats = exec.stats();
    std::printf("piecewise_chain: 2 x %d kernels x %d elements, one read-back between, %d iterations\n", kernels, n,
                iterations);
    std::printf("  piecewise executable: %zu paths, %zu segments, %llu misses\n", stats.paths, stats.segments,
                static_cast<unsigned long long>(stats.misses));
    std::printf("  router key %d: %s, %zu segments, region \"%s\"\n", n, std::string(replay::to_string(entry.kind)).c_str(),
                entry.segments, entry.regions.empty() ? "" : entry.regions.front().c_str());
    std::printf("  eager    : %8.3f ms per run\n", eager_ms / iterations);
    std::printf("  piecewise: %8.3f ms per run  (%.2fx faster)\n", piecewise_ms / iterations,
                eager_ms / piecewise_ms);
    if (iterations > 1) {
      std::printf("  router   : %8.3f ms per run, copies in and out included\n", routed_ms / (iterations - 1));
    }
    std::printf("  results %s\n", wrong == 0 ? "equal to eager" : "DIFFER");
    return wrong == 0 && entry.kind == replay::RouterEntryKind::piecewise ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "piecewise_chain: %s\n", e.what());
    return 1;
  }
}
