// pipeline_throughput: streams batches through a small elementwise model
// (a sigmoid layer) with replay::StreamPipeline and prints the throughput
// against doing the same work serially on one stream, for each kind of host
// memory against the serial loop on that same memory: pinned (used in place
// by the copy engines), pageable (staged through the slots' pinned buffers in
// chunks, by a few host threads), and pageable buffers registered once with
// replay::RegisteredHostBuffer (used in place again). Every output is checked
// against the serial run, bit for bit.
//
//   pipeline_throughput [items=32] [item_mib=8] [slots=4]
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>
#include <vector>

#include "replay/replay.hpp"
#include "replay/stream_pipeline.hpp"

namespace {

// The "model": y = sigmoid(w x + b), with a few extra FMAs so that compute
// is not free next to the copies.
__global__ void sigmoid_layer(const float* in, float* out, std::size_t n, float w, float b) {
  const std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (i < n) {
    float z = w * in[i] + b;
    for (int k = 0; k < 64; ++k) {
      z = fmaf(z, 0.999F, 0.001F);
    }
    out[i] = 1.0F / (1.0F + __expf(-z));
  }
}

void model(const float* in, float* out, std::size_t n, replay::StreamRef s) {
  if (n != 0) {
    sigmoid_layer<<<static_cast<unsigned>((n + 255) / 256), 256, 0, s.get()>>>(in, out, n, 1.5F, -0.25F);
    replay::check_last_launch("sigmoid_layer");
  }
}

double ms_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
}

void report(const char* what, double ms, std::size_t items, std::size_t bytes, double serial_ms,
            const char* baseline = "serial") {
  const double gbps = static_cast<double>(items * bytes) / (ms / 1e3) / 1e9;
  std::printf("  %-34s %9.2f ms  %7.2f GB/s each way  %9.1f items/s", what, ms, gbps,
              static_cast<double>(items) / (ms / 1e3));
  if (serial_ms > 0) {
    std::printf("  %.2fx vs %s", serial_ms / ms, baseline);
  }
  std::printf("\n");
}

}  // namespace

int main(int argc, char** argv) {
  const long items_arg = argc > 1 ? std::atol(argv[1]) : 32;
  const long mib_arg = argc > 2 ? std::atol(argv[2]) : 8;
  const long slots_arg = argc > 3 ? std::atol(argv[3]) : 4;
  if (items_arg <= 0 || mib_arg <= 0 || slots_arg <= 0) {
    std::fprintf(stderr, "usage: pipeline_throughput [items>0] [item_mib>0] [slots>0]\n");
    return 2;
  }
  if (!replay::has_device()) {
    std::printf("pipeline_throughput: %s. This example needs an NVIDIA GPU and driver; it built correctly, "
                "but there is nothing to run on.\n",
                replay::no_device_message.data());
    return 0;
  }
  const auto items = static_cast<std::size_t>(items_arg);
  const std::size_t n = static_cast<std::size_t>(mib_arg) * 1024 * 1024 / sizeof(float);
  const std::size_t bytes = n * sizeof(float);

  try {
    // Inputs: pinned and pageable copies of the same random-ish data.
    replay::PinnedBuffer<float> pinned_in(items * n);
    replay::PinnedBuffer<float> pinned_out(items * n);
    std::vector<float> pageable_in(items * n);
    std::vector<float> pageable_out(items * n);
    std::vector<float> serial_out(items * n);
    for (std::size_t i = 0; i < items * n; ++i) {
      pageable_in[i] = std::sin(static_cast<float>(i % 100003)) * 4.0F;
    }
    std::memcpy(pinned_in.data(), pageable_in.data(), items * bytes);

    std::printf("pipeline_throughput: %zu items of %zu MiB (float), %ld slots\n", items, bytes >> 20, slots_arg);

    // Serial: copy in, compute, copy out, one item after another on one stream.
    replay::Stream stream;
    replay::DeviceBuffer<float> d_in(n);
    replay::DeviceBuffer<float> d_out(n);
    const auto run_serial = [&] {
      for (std::size_t i = 0; i < items; ++i) {
        d_in.copy_from(std::span<const float>(pinned_in.data() + i * n, n), stream);
        model(d_in.data(), d_out.data(), n, stream);
        d_out.copy_to(std::span<float>(pinned_out.data() + i * n, n), stream);
      }
      stream.synchronize();
    };
    run_serial();  // warm-up
    auto start = std::chrono::steady_clock::now();
    run_serial();
    const double serial_ms = ms_since(start);
    std::memcpy(serial_out.data(), pinned_out.data(), items * bytes);
    report("serial, one stream, pinned", serial_ms, items, bytes, 0);

    // Pipelined: the same work through StreamPipeline.
    replay::StreamPipeline<float> pipeline(
        {.input_capacity = n, .slots = static_cast<std::size_t>(slots_arg)},
        [](replay::BufferView<float> in, replay::BufferView<float> out, replay::StreamRef s) {
          model(in.data(), out.data(), in.size(), s);
        });
    const auto run_pinned = [&] {
      for (std::size_t i = 0; i < items; ++i) {
        // Typed pinned views: known pinned, used in place, no memory-kind query.
        (void)pipeline.submit(pinned_in.subview(i * n, n), pinned_out.subview(i * n, n));
      }
      pipeline.drain();
    };
    std::memset(pinned_out.data(), 0, items * bytes);
    run_pinned();  // warm-up
    std::memset(pinned_out.data(), 0, items * bytes);
    start = std::chrono::steady_clock::now();
    run_pinned();
    report("pipelined, pinned in/out", ms_since(start), items, bytes, serial_ms, "serial pinned");
    const bool pinned_ok = std::memcmp(pinned_out.data(), serial_out.data(), items * bytes) == 0;

    // Pageable memory. The fair baseline is the same serial loop on the same
    // pageable buffers (CUDA then stages every copy itself, synchronously).
    const auto run_serial_pageable = [&] {
      for (std::size_t i = 0; i < items; ++i) {
        d_in.copy_from(std::span<const float>(pageable_in.data() + i * n, n), stream);
        model(d_in.data(), d_out.data(), n, stream);
        d_out.copy_to(std::span<float>(pageable_out.data() + i * n, n), stream);
      }
      stream.synchronize();
    };
    run_serial_pageable();  // warm-up (and first touch of pageable_out)
    start = std::chrono::steady_clock::now();
    run_serial_pageable();
    const double serial_pageable_ms = ms_since(start);
    report("serial, one stream, pageable", serial_pageable_ms, items, bytes, 0);
    const bool serial_pageable_ok = std::memcmp(pageable_out.data(), serial_out.data(), items * bytes) == 0;

    // Pipelined pageable: chunked staging, the host copies spread over helper threads.
    std::vector<std::span<const float>> inputs;
    std::vector<std::span<float>> outputs;
    for (std::size_t i = 0; i < items; ++i) {
      inputs.emplace_back(pageable_in.data() + i * n, n);
      outputs.emplace_back(pageable_out.data() + i * n, n);
    }
    std::memset(pageable_out.data(), 0, items * bytes);
    start = std::chrono::steady_clock::now();
    (void)pipeline.run(inputs, outputs);
    report("pipelined, pageable in/out", ms_since(start), items, bytes, serial_pageable_ms, "serial pageable");
    const bool pageable_ok = std::memcmp(pageable_out.data(), serial_out.data(), items * bytes) == 0;

    // The same buffers registered once: used in place, like pinned memory.
    bool registered_ok = false;
    {
      replay::RegisteredHostBuffer<float> registered_in{std::span<float>(pageable_in)};
      replay::RegisteredHostBuffer<float> registered_out{std::span<float>(pageable_out)};
      std::memset(pageable_out.data(), 0, items * bytes);
      start = std::chrono::steady_clock::now();
      for (std::size_t i = 0; i < items; ++i) {
        (void)pipeline.submit(registered_in.subview(i * n, n), registered_out.subview(i * n, n));
      }
      pipeline.drain();
      report("pipelined, registered in/out", ms_since(start), items, bytes, serial_pageable_ms, "serial pageable");
      registered_ok = std::memcmp(pageable_out.data(), serial_out.data(), items * bytes) == 0;
    }

    const auto stats = pipeline.stats();
    std::printf("  stats: %llu items, %llu inputs used in place, %llu staged; %llu outputs direct, %llu staged\n",
                static_cast<unsigned long long>(stats.completed),
                static_cast<unsigned long long>(stats.inputs_in_place),
                static_cast<unsigned long long>(stats.inputs_staged),
                static_cast<unsigned long long>(stats.outputs_direct),
                static_cast<unsigned long long>(stats.outputs_staged));
    const float probe = serial_out[n / 2];
    const float x = pageable_in[n / 2];
    float z = 1.5F * x - 0.25F;
    for (int k = 0; k < 64; ++k) {
      z = std::fma(z, 0.999F, 0.001F);
    }
    const bool model_ok = std::fabs(probe - 1.0F / (1.0F + std::exp(-z))) < 1e-4F;
    if (!pinned_ok || !serial_pageable_ok || !pageable_ok || !registered_ok || !model_ok || stats.failed != 0) {
      std::printf("pipeline_throughput: outputs DIFFER (pinned %s, serial pageable %s, pageable %s, registered %s, "
                  "model %s)\n",
                  pinned_ok ? "ok" : "wrong", serial_pageable_ok ? "ok" : "wrong", pageable_ok ? "ok" : "wrong",
                  registered_ok ? "ok" : "wrong", model_ok ? "ok" : "wrong");
      return 1;
    }
    std::printf("  outputs: pipelined == serial, bit for bit\n");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "pipeline_throughput: %s\n", e.what());
    return 1;
  }
  return 0;
}
