// ShapeRouter with the CUDA backend: routed results equal eager runs for
// random shapes; padding is correct and padded rows do not leak; graphs share
// the graph memory pool (measured); eviction, re-capture through update;
// capture failure falls back to eager; 100k routed replays without memory
// growth or host allocations; one router per thread; under concurrency:
// captures survive other threads' synchronize_device and allocations, an
// interrupted capture is retried, memory is measured where the graph lives
// and trimmed on eviction, error slots are left alone, and a stress test of
// 8 threads sharing two routers.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <future>
#include <limits>
#include <memory>
#include <mutex>
#include <random>
#include <span>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "gpu_suite.hpp"
#include "replay/detail/driver_memset.hpp"
#include "replay/replay.hpp"
#include "replay/shape_router.hpp"

std::size_t shape_router_test_allocations();  // tests/host/shape_router_test.cpp

namespace {

constexpr int kCols = 64;
constexpr int kMaxBatch = 64;
constexpr float kSentinel = -777.0F;

// y = a * x + b over rows * kCols elements.
__global__ void affine_kernel(const float* x, float* y, int n, float a, float b) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) {
    y[i] = a * x[i] + b;
  }
}
// y = a * y + b in place.
__global__ void scale_kernel(float* y, int n, float a, float b) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) {
    y[i] = a * y[i] + b;
  }
}
// Per row: subtract the row's maximum (row-local, like a softmax's first step).
__global__ void shift_rows_kernel(float* y, int rows) {
  const int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r < rows) {
    float m = y[r * kCols];
    for (int j = 1; j < kCols; ++j) {
      m = fmaxf(m, y[r * kCols + j]);
    }
    for (int j = 0; j < kCols; ++j) {
      y[r * kCols + j] -= m;
    }
  }
}
// Mixes a scratch buffer into y so the scratch is really used.
__global__ void scratch_kernel(float* scratch, std::size_t scratch_elems, float* y, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) {
    const std::size_t slot = (static_cast<std::size_t>(i) * 7919U) % scratch_elems;
    scratch[slot] = y[i];
    y[i] = scratch[slot] * 0.5F + 1.0F;
  }
}

unsigned blocks(int n) { return static_cast<unsigned>((n + 127) / 128); }

// A small row-independent "model" over the first `batch` rows.
void model(const float* x, float* y, int batch, int depth, replay::StreamRef s) {
  const int n = batch * kCols;
  affine_kernel<<<blocks(n), 128, 0, s.get()>>>(x, y, n, 1.5F, -0.25F);
  for (int k = 0; k < depth; ++k) {
    scale_kernel<<<blocks(n), 128, 0, s.get()>>>(y, n, 1.0F - 0.03F * static_cast<float>(k % 5), 0.1F);
  }
  shift_rows_kernel<<<blocks(batch), 128, 0, s.get()>>>(y, batch);
  replay::check_last_launch("model kernels");
}

struct Model {
  replay::DeviceBuffer<float> x{kMaxBatch * kCols};
  replay::DeviceBuffer<float> y{kMaxBatch * kCols};
  int depth = 4;
};

std::vector<float> read(const replay::BufferView<float>& view, replay::StreamRef s) {
  std::vector<float> out(view.size(), -12345.0F);
  view.copy_to(std::span<float>(out), s);
  s.synchronize();
  return out;
}

// Input for a batch padded to `padded` rows: real rows random, padded rows NaN
// (so any leak into real rows shows as NaN).
std::vector<float> padded_input(int batch, int padded, std::mt19937& rng = replay_test::rng()) {
  std::uniform_real_distribution<float> value(-1.0F, 1.0F);
  std::vector<float> data(static_cast<std::size_t>(padded) * kCols);
  for (float& v : data) {
    v = value(rng);
  }
  for (std::size_t i = static_cast<std::size_t>(batch) * kCols; i < data.size(); ++i) {
    data[i] = std::numeric_limits<float>::quiet_NaN();
  }
  return data;
}

// The eager reference: the same model on the real batch only, in its own buffers.
std::vector<float> eager_reference(Model& ref, std::span<const float> input_rows, int batch, int depth,
                                   replay::StreamRef s) {
  const std::size_t n = static_cast<std::size_t>(batch) * kCols;
  ref.x.first(n).copy_from(input_rows.first(n), s);
  model(ref.x.data(), ref.y.data(), batch, depth, s);
  return read(ref.y.first(n), s);
}

bool under_sanitizer() { return std::getenv("REPLAY_UNDER_SANITIZER") != nullptr; }

int device() { return replay::current_device(); }

std::size_t free_bytes() {
  std::size_t free_b = 0;
  std::size_t total_b = 0;
  replay::check(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo");
  return free_b;
}

constexpr std::size_t MiB = std::size_t{1} << 20;

}  // namespace

TEST_SUITE("gpu" * replay_test::needs_device()) {
  TEST_CASE("routed results for random shapes equal eager runs (exact keys and bucketed tuples)") {
    replay::Stream stream;
    Model m;
    Model ref;
    replay::ShapeRouter<int> exact([&](int batch, replay::StreamRef s) { model(m.x.data(), m.y.data(), batch, m.depth, s); });
    std::mt19937& rng = replay_test::rng();
    std::uniform_int_distribution<int> dist(1, kMaxBatch);
    for (int it = 0; it < 150; ++it) {
      const int batch = dist(rng);
      const auto input = padded_input(batch, batch);
      m.x.first(input.size()).copy_from(std::span<const float>(input), stream);
      const auto route = exact.run(batch, stream);
      REQUIRE(route.graph());
      CHECK(route.shape == batch);
      const auto got = read(m.y.first(input.size()), stream);
      const auto want = eager_reference(ref, input, batch, m.depth, stream);
      REQUIRE(got == want);  // same kernels, same per-element math: bitwise equal
    }
    CHECK(exact.stats().hits > 0);
    CHECK(exact.stats().captures == exact.graph_count());

    // (rows, depth) keys, bucketed per dimension: the depth bucket changes the graph's topology.
    using Key = std::tuple<int, int>;
    replay::ShapeRouter<Key> tuples(
        [&](const Key& k, replay::StreamRef s) { model(m.x.data(), m.y.data(), std::get<0>(k), std::get<1>(k), s); },
        replay::ShapeRouterOptions<Key>::bucketed_per_dimension({{8, 16, 32, 64}, {2, 6}}));
    std::uniform_int_distribution<int> depth_dist(1, 6);
    for (int it = 0; it < 100; ++it) {
      const int batch = dist(rng);
      const int depth = depth_dist(rng);
      const Key padded = tuples.padded_shape({batch, depth});
      const int rows = std::get<0>(padded);
      const auto input = padded_input(batch, rows);
      m.x.first(input.size()).copy_from(std::span<const float>(input), stream);
      CHECK(tuples.run({batch, depth}, stream).shape == padded);
      const auto got = read(m.y.first(static_cast<std::size_t>(batch) * kCols), stream);
      const auto want = eager_reference(ref, input, batch, std::get<1>(padded), stream);
      REQUIRE(got == want);
    }
    CHECK(tuples.graph_count() <= 8);
  }

  TEST_CASE("padding: padded rows do not leak into outputs; rows past the bucket are untouched") {
    replay::Stream stream;
    Model m;
    Model ref;
    replay::ShapeRouter<int> router([&](int batch, replay::StreamRef s) { model(m.x.data(), m.y.data(), batch, m.depth, s); },
                                    replay::ShapeRouterOptions<int>::bucketed({8, 16, 32, 64}));
    CHECK(router.capture_all(stream) == 4);
    std::uniform_int_distribution<int> dist(1, kMaxBatch);
    for (int it = 0; it < 120; ++it) {
      const int batch = dist(replay_test::rng());
      const int padded = router.padded_shape(batch);
      REQUIRE(padded >= batch);
      const auto input = padded_input(batch, padded);
      m.x.first(input.size()).copy_from(std::span<const float>(input), stream);
      m.y.fill(kSentinel, stream);
      const auto route = router.run(batch, stream);
      CHECK(route.kind == replay::RouteKind::replayed);
      CHECK(route.shape == padded);
      const auto all = read(m.y.view(), stream);
      const std::size_t real_n = static_cast<std::size_t>(batch) * kCols;
      const std::size_t padded_n = static_cast<std::size_t>(padded) * kCols;
      const std::vector<float> real_rows(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(real_n));
      const auto want = eager_reference(ref, input, batch, m.depth, stream);
      REQUIRE(real_rows == want);  // no NaN from the padded rows, bitwise the eager result
      for (std::size_t i = real_n; i < padded_n; ++i) {
        REQUIRE(std::isnan(all[i]));  // the graph did process the padded rows
      }
      for (std::size_t i = padded_n; i < all.size(); ++i) {
        REQUIRE(all[i] == kSentinel);  // and nothing past its bucket
      }
    }
    const auto stats = router.stats();
    CHECK(stats.hits == 120);
    CHECK(stats.padded_elements >= stats.real_elements);
  }

  TEST_CASE("all graphs share the graph memory pool: 8 buckets cost about the largest, not the sum (measured)") {
    replay::Stream stream;
    Model m;
    constexpr std::size_t kScratchPerRow = 16 * MiB;
    constexpr int kBuckets = 8;
    std::vector<std::int64_t> bucket_list;
    std::size_t sum = 0;
    for (int b = 1; b <= kBuckets; ++b) {
      bucket_list.push_back(b);
      sum += static_cast<std::size_t>(b) * kScratchPerRow;
    }
    const std::size_t largest = kBuckets * kScratchPerRow;

    // Shared: scratch from cudaMallocAsync inside the captured work becomes
    // graph memory nodes, served from the device's graph pool.
    replay::synchronize_device();
    replay::trim_graph_pool(device());
    replay::reset_graph_pool_high_watermarks(device());
    const std::size_t free_before_shared = free_bytes();
    std::size_t shared_delta = 0;
    replay::GraphPoolMemory pool;
    {
      replay::ShapeRouter<int> router(
          [&](int batch, replay::StreamRef s) {
            const std::size_t bytes = static_cast<std::size_t>(batch) * kScratchPerRow;
            void* scratch = nullptr;
            replay::check(cudaMallocAsync(&scratch, bytes, s.get()), "cudaMallocAsync");
            model(m.x.data(), m.y.data(), batch, 1, s);
            scratch_kernel<<<blocks(batch * kCols), 128, 0, s.get()>>>(static_cast<float*>(scratch), bytes / sizeof(float),
                                                                      m.y.data(), batch * kCols);
            replay::check_last_launch("scratch_kernel");
            replay::check(cudaFreeAsync(scratch, s.get()), "cudaFreeAsync");
          },
          replay::ShapeRouterOptions<int>::bucketed(bucket_list));
      CHECK(router.capture_all(stream) == kBuckets);
      for (int b = 1; b <= kBuckets; ++b) {
        CHECK(router.run(b, stream).kind == replay::RouteKind::replayed);
      }
      stream.synchronize();
      shared_delta = free_before_shared - std::min(free_before_shared, free_bytes());
      const auto memory = router.memory();
      CHECK(memory.graphs == kBuckets);
      CHECK(memory.alloc_bytes_sum == sum);
      CHECK(memory.alloc_bytes_max == largest);
      REQUIRE(memory.pool.has_value());
      pool = *memory.pool;
      for (const auto& g : router.graphs()) {
        MESSAGE("bucket " << g.shape << ": alloc " << g.memory.alloc_bytes / MiB << " MiB, footprint "
                          << g.memory.footprint_bytes / MiB << " MiB");
      }
    }
    replay::synchronize_device();
    replay::trim_graph_pool(device());

    // Separate: each bucket's graph with its own scratch buffer.
    const std::size_t free_before_separate = free_bytes();
    std::size_t separate_delta = 0;
    {
      std::vector<replay::DeviceBuffer<float>> scratch;
      for (int b = 1; b <= kBuckets; ++b) {
        scratch.emplace_back(static_cast<std::size_t>(b) * kScratchPerRow / sizeof(float));
      }
      replay::ShapeRouter<int> router(
          [&](int batch, replay::StreamRef s) {
            auto& buf = scratch[static_cast<std::size_t>(batch - 1)];
            model(m.x.data(), m.y.data(), batch, 1, s);
            scratch_kernel<<<blocks(batch * kCols), 128, 0, s.get()>>>(buf.data(), buf.size(), m.y.data(), batch * kCols);
            replay::check_last_launch("scratch_kernel");
          },
          replay::ShapeRouterOptions<int>::bucketed(bucket_list));
      CHECK(router.capture_all(stream) == kBuckets);
      for (int b = 1; b <= kBuckets; ++b) {
        (void)router.run(b, stream);
      }
      stream.synchronize();
      separate_delta = free_before_separate - std::min(free_before_separate, free_bytes());
    }
    MESSAGE("shared pool: device memory +" << shared_delta / MiB << " MiB, graph pool reserved high "
                                           << pool.reserved_high / MiB << " MiB; separate: +" << separate_delta / MiB
                                           << " MiB; largest scratch " << largest / MiB << " MiB, sum " << sum / MiB
                                           << " MiB");
    if (!under_sanitizer()) {  // the sanitizer changes how allocations are backed
      CHECK(pool.reserved_high >= largest);
      CHECK(pool.reserved_high <= largest + largest / 4);  // <= 1.25x the largest alone
      CHECK(separate_delta >= sum);
      CHECK(shared_delta * 2 < separate_delta);  // 576 MiB of scratch shared in ~128 MiB
    }
  }

  TEST_CASE("eviction and re-capture; changed pointers re-capture through update in place") {
    replay::Stream stream;
    Model a;
    Model b;
    Model ref;
    Model* current = &a;
    replay::ShapeRouter<int> router(
        [&](int batch, replay::StreamRef s) { model(current->x.data(), current->y.data(), batch, current->depth, s); },
        {.max_graphs = 2});
    auto check_run = [&](int batch, replay::RouteKind expected) {
      const auto input = padded_input(batch, batch);
      current->x.first(input.size()).copy_from(std::span<const float>(input), stream);
      CHECK(router.run(batch, stream).kind == expected);
      const auto got = read(current->y.first(input.size()), stream);
      REQUIRE(got == eager_reference(ref, input, batch, current->depth, stream));
    };
    check_run(3, replay::RouteKind::captured);
    check_run(5, replay::RouteKind::captured);
    check_run(3, replay::RouteKind::replayed);
    check_run(7, replay::RouteKind::captured);  // evicts 5, the least recently used
    CHECK_FALSE(router.contains(5));
    CHECK(router.graph_count() == 2);
    check_run(5, replay::RouteKind::captured);  // re-captured; evicts 3
    CHECK(router.stats().evictions == 2);

    // The buffers move: invalidate, and the next runs re-capture into b's buffers.
    a.y.fill(kSentinel, stream);
    current = &b;
    router.invalidate_all();
    check_run(5, replay::RouteKind::recaptured);
    check_run(7, replay::RouteKind::recaptured);
    check_run(7, replay::RouteKind::replayed);
    CHECK(router.stats().updates == 2);  // same topology, new pointers: cudaGraphExecUpdate in place
    CHECK(router.stats().reinstantiations == 0);
    for (float v : read(a.y.view(), stream)) {
      REQUIRE(v == kSentinel);  // the old buffers are no longer written
    }

    // A changed topology (more kernels) re-instantiates.
    b.depth = 9;
    CHECK(router.invalidate(5));
    check_run(5, replay::RouteKind::recaptured);
    CHECK(router.stats().reinstantiations == 1);
    check_run(5, replay::RouteKind::replayed);
  }

  TEST_CASE("a capture broken by a synchronizing call falls back to eager, logs once, keeps serving") {
    replay::Stream stream;
    Model m;
    Model ref;
    std::vector<std::string> logged;
    replay::ShapeRouter<int> router(
        [&](int batch, replay::StreamRef s) {
          model(m.x.data(), m.y.data(), batch, m.depth, s);
          if (batch == 13) {  // a library that synchronizes, checked
            replay::check(cudaStreamSynchronize(s.get()), "cudaStreamSynchronize");
          }
          if (batch == 17) {  // one that synchronizes and ignores the status
            (void)cudaStreamSynchronize(s.get());
          }
        },
        {.on_capture_failure = [&](const int& key, std::string_view why) {
          logged.push_back(std::to_string(key) + ": " + std::string(why));
        }});
    for (int round = 0; round < 3; ++round) {
      for (int batch : {13, 17, 4}) {
        const auto input = padded_input(batch, batch);
        m.x.first(input.size()).copy_from(std::span<const float>(input), stream);
        replay::Route<int> route{0, replay::RouteKind::replayed};
        CHECK_NOTHROW(route = router.run(batch, stream));
        CHECK(route.kind == (batch == 4 ? (round == 0 ? replay::RouteKind::captured : replay::RouteKind::replayed)
                                        : replay::RouteKind::eager_fallback));
        CHECK(stream.ref().capture_status() == replay::CaptureStatus::none);
        const auto got = read(m.y.first(input.size()), stream);
        REQUIRE(got == eager_reference(ref, input, batch, m.depth, stream));
      }
    }
    REQUIRE(logged.size() == 2);  // once per failed key
    CHECK(logged[0].find("13: ") == 0);
    CHECK(logged[0].find("cudaStreamSynchronize") != std::string::npos);
    CHECK(logged[1].find("17: ") == 0);
    CHECK(logged[1].find("cudaStreamEndCapture") != std::string::npos);
    CHECK(router.is_eager(13));
    CHECK(router.is_eager(17));
    CHECK(router.stats().capture_failures == 2);
    CHECK(router.stats().eager_fallbacks == 6);
    CHECK(cudaGetLastError() == cudaSuccess);  // no capture error left behind
  }

  TEST_CASE("100k routed replays over random shapes: no device memory growth, no host allocations") {
    replay::Stream stream;
    replay::DeviceBuffer<float> x(kMaxBatch);
    replay::ShapeRouter<int> router(
        [&](int batch, replay::StreamRef s) {
          scale_kernel<<<1, 64, 0, s.get()>>>(x.data(), batch, 1.0F, 1.0F);  // x[i] += 1 for i < batch
          replay::check_last_launch("scale_kernel");
        },
        replay::ShapeRouterOptions<int>::bucketed(replay::power_of_two_buckets(kMaxBatch)));
    x.zero(stream);
    CHECK(router.capture_all(stream) == 7);
    std::uniform_int_distribution<int> dist(1, kMaxBatch);
    std::mt19937 rng{replay_test::case_seed_for(0)};
    std::vector<std::uint64_t> runs_per_size(kMaxBatch + 1, 0);  // by padded size
    for (int i = 0; i < 2000; ++i) {  // steady state first
      ++runs_per_size[static_cast<std::size_t>(router.run(dist(rng), stream).shape)];
    }
    stream.synchronize();
    const std::size_t free_before = free_bytes();
    const auto pool_before = replay::graph_pool_memory(device());
    const int total = under_sanitizer() ? 2000 : 100000;
    const std::size_t allocations_before = shape_router_test_allocations();
    for (int i = 0; i < total; ++i) {
      const auto route = router.run(dist(rng), stream);
      ++runs_per_size[static_cast<std::size_t>(route.shape)];
      if ((i & 1023) == 1023) {
        stream.synchronize();  // keep the launch queue short
      }
    }
    const std::size_t allocations = shape_router_test_allocations() - allocations_before;
    stream.synchronize();
    CHECK(allocations == 0);  // the hit path allocates nothing
    const auto stats = router.stats();
    CHECK(stats.hits == static_cast<std::uint64_t>(total) + 2000);
    CHECK(stats.misses == 0);
    CHECK(stats.captures == 7);
    CHECK(router.graph_count() == 7);
    const auto pool_after = replay::graph_pool_memory(device());
    CHECK(pool_after.reserved == pool_before.reserved);
    const std::size_t free_after = free_bytes();
    if (!under_sanitizer()) {
      CHECK(free_after + 2 * MiB >= free_before);  // at most a page of noise: no growth
    }
    // Element i was incremented once by every run whose padded size exceeds i.
    const auto values = read(x.view(), stream);
    std::uint64_t covering = 0;
    for (int i = kMaxBatch - 1; i >= 0; --i) {
      covering += runs_per_size[static_cast<std::size_t>(i + 1)];
      REQUIRE(values[static_cast<std::size_t>(i)] == static_cast<float>(covering));
    }
  }

  TEST_CASE("one router per thread and stream: threads route and capture concurrently") {
    constexpr int kThreads = 4;
    std::vector<int> failures(kThreads, 0);
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&failures, t] {
        try {
          replay::Stream stream;
          Model m;
          Model ref;
          replay::ShapeRouter<int> router(
              [&](int batch, replay::StreamRef s) { model(m.x.data(), m.y.data(), batch, m.depth, s); },
              {.policy = replay::RoutingPolicy::bucketed, .buckets = {{4, 16, 64}}, .warmup_runs = 1});
          std::mt19937 rng{replay_test::case_seed_for(static_cast<std::uint64_t>(t) + 1)};
          std::uniform_int_distribution<int> dist(1, kMaxBatch);
          // Under racecheck every launch from every thread is serialized and
          // instrumented: a few iterations still exercise concurrent capture.
          const int iterations = under_sanitizer() ? 6 : 60;
          for (int it = 0; it < iterations; ++it) {
            const int batch = dist(rng);
            const auto input = padded_input(batch, router.padded_shape(batch), rng);  // per-thread engine
            m.x.first(input.size()).copy_from(std::span<const float>(input), stream);
            (void)router.run(batch, stream);
            const auto got = read(m.y.first(static_cast<std::size_t>(batch) * kCols), stream);
            if (got != eager_reference(ref, input, batch, m.depth, stream)) {
              ++failures[static_cast<std::size_t>(t)];
            }
          }
          if (router.stats().capture_failures != 0) {
            ++failures[static_cast<std::size_t>(t)];
          }
        } catch (...) {
          failures[static_cast<std::size_t>(t)] += 1000;
        }
      });
    }
    for (auto& th : threads) {
      th.join();
    }
    for (int t = 0; t < kThreads; ++t) {
      CHECK(failures[static_cast<std::size_t>(t)] == 0);
    }
  }

  // ---- concurrency ---------------------------------------------------------

  TEST_CASE("captures in one thread survive synchronize_device, allocations and eager work in another") {
    // Old code: synchronize_device was a bare cudaDeviceSynchronize, which
    // invalidates a capture open in another thread; the key stayed eager.
    replay::Stream stream;
    Model m;
    Model ref;
    replay::ShapeRouter<int> router([&](int batch, replay::StreamRef s) { model(m.x.data(), m.y.data(), batch, 32, s); });
    std::atomic<bool> stop{false};
    std::atomic<int> background_errors{0};
    std::thread background([&] {
      try {
        replay::Stream own;
        replay::DeviceBuffer<float> scratch(1 << 16);
        while (!stop.load()) {
          replay::synchronize_device();
          // Stream-ordered allocations: cudaFree would synchronize the device
          // implicitly, which breaks other threads' captures (they would be retried).
          void* p = nullptr;
          replay::check(cudaMallocAsync(&p, 1 << 20, own.get()), "cudaMallocAsync");
          replay::check(cudaFreeAsync(p, own.get()), "cudaFreeAsync");
          scratch.zero(own);
        }
        own.synchronize();
      } catch (...) {
        ++background_errors;
      }
    });
    const int keys = under_sanitizer() ? 6 : 40;
    for (int batch = 1; batch <= keys; ++batch) {
      const auto input = padded_input(batch, batch);
      m.x.first(input.size()).copy_from(std::span<const float>(input), stream);
      CHECK(router.run(batch, stream).kind == replay::RouteKind::captured);
      REQUIRE(read(m.y.first(input.size()), stream) == eager_reference(ref, input, batch, 32, stream));
    }
    stop = true;
    background.join();
    CHECK(background_errors == 0);
    CHECK(router.stats().capture_failures == 0);
    CHECK(router.graph_count() == static_cast<std::size_t>(keys));
  }

  TEST_CASE("a capture broken by another thread's raw cudaDeviceSynchronize is retried, not marked eager") {
    // Old code: the broken capture marked the key eager for good.
    replay::Stream stream;
    Model m;
    Model ref;
    std::atomic<bool> interfere{true};
    std::future<cudaError_t> other;
    replay::ShapeRouter<int> router([&](int batch, replay::StreamRef s) {
      model(m.x.data(), m.y.data(), batch, 4, s);
      if (s.is_capturing() && interfere.exchange(false)) {
        other = std::async(std::launch::async, [] { return cudaDeviceSynchronize(); });
        (void)other.wait_for(std::chrono::seconds(2));
      }
    });
    const int batch = 9;
    const auto input = padded_input(batch, batch);
    m.x.first(input.size()).copy_from(std::span<const float>(input), stream);
    const auto route = router.run(batch, stream);
    const cudaError_t other_status = other.get();
    MESSAGE("the other thread's cudaDeviceSynchronize returned " << std::string(cudaGetErrorName(other_status))
                                                                 << "; interrupted captures: "
                                                                 << router.stats().interrupted_captures);
    CHECK(route.graph());
    CHECK(router.stats().capture_failures == 0);
    CHECK(router.stats().interrupted_captures <= 1);
    CHECK(router.stats().capture_retries == router.stats().interrupted_captures);
    CHECK_FALSE(router.is_eager(batch));
    REQUIRE(read(m.y.first(input.size()), stream) == eager_reference(ref, input, batch, 4, stream));
    CHECK(cudaPeekAtLastError() == cudaSuccess);
  }

  TEST_CASE("a graph's footprint is what it adds to its device's graph pool, not other threads' allocations") {
    // Old code: the drop in device-wide free memory during instantiation was
    // charged to the graph, here 1 GiB of another thread's cudaMalloc.
    replay::Stream stream;
    Model m;
    void* big = nullptr;
    replay::ShapeRouter<int> router([&](int batch, replay::StreamRef s) {
      model(m.x.data(), m.y.data(), batch, 2, s);
      if (s.is_capturing() && big == nullptr) {
        std::thread([&big] { replay::check(cudaMalloc(&big, std::size_t{1} << 30), "cudaMalloc"); }).join();
      }
    });
    CHECK(router.run(8, stream).kind == replay::RouteKind::captured);
    REQUIRE(big != nullptr);
    replay::check(cudaFree(big), "cudaFree");
    const auto graphs = router.graphs();
    REQUIRE(graphs.size() == 1);
    CHECK(graphs[0].memory.footprint_bytes < 64 * MiB);  // no memory nodes: only what the pool grew by
    stream.synchronize();
  }

  TEST_CASE("evicting a graph trims the graph pool, so max_bytes bounds real memory") {
    // Old code: an evicted graph's pool memory stayed reserved.
    // Under a sanitizer allocations are backed differently: only the eviction itself is checked.
    const bool measure = !under_sanitizer();
    replay::Stream stream;
    Model m;
    constexpr std::size_t kScratch = 256 * MiB;
    replay::ShapeRouter<int> router([&](int batch, replay::StreamRef s) {
      void* scratch = nullptr;
      replay::check(cudaMallocAsync(&scratch, kScratch, s.get()), "cudaMallocAsync");
      model(m.x.data(), m.y.data(), batch, 1, s);
      scratch_kernel<<<blocks(batch * kCols), 128, 0, s.get()>>>(static_cast<float*>(scratch),
                                                                 kScratch / sizeof(float), m.y.data(), batch * kCols);
      replay::check_last_launch("scratch_kernel");
      replay::check(cudaFreeAsync(scratch, s.get()), "cudaFreeAsync");
    });
    replay::synchronize_device();
    replay::trim_graph_pool(device());
    const std::size_t reserved_before = replay::graph_pool_memory(device()).reserved;
    CHECK(router.run(4, stream).kind == replay::RouteKind::captured);
    stream.synchronize();
    const std::size_t reserved_live = replay::graph_pool_memory(device()).reserved;
    if (measure) {
      CHECK(reserved_live >= reserved_before + kScratch);
      WARN(router.graphs()[0].memory.footprint_bytes >= kScratch);  // where the upload maps the pool
    }
    CHECK(router.evict(4));
    CHECK(router.graph_count() == 0);
    const std::size_t reserved_after = replay::graph_pool_memory(device()).reserved;
    MESSAGE("graph pool reserved: " << reserved_before / MiB << " MiB before, " << reserved_live / MiB
                                    << " MiB with the graph, " << reserved_after / MiB << " MiB after eviction");
    if (measure) {
      CHECK(reserved_after < reserved_before + kScratch);
    }
  }

  TEST_CASE("StreamRef::ready and Event::ready leave a pending launch error in the slot") {
    // Old code: cudaGetLastError on cudaErrorNotReady erased it.
    replay::Stream stream;
    replay::DeviceBuffer<float> y(1 << 20);
    // Long enough to be still running when queried.
    for (int i = 0; i < 200; ++i) {
      scale_kernel<<<blocks(1 << 20), 128, 0, stream.get()>>>(y.data(), 1 << 20, 1.0F, 0.0F);
    }
    replay::check_last_launch("scale_kernel");
    replay::Event done;
    done.record(stream);
    if (under_sanitizer()) {
      // racecheck loses track of a launch that fails to launch; any API error fills the same slot.
      cudaEvent_t bad = nullptr;
      REQUIRE(cudaEventCreateWithFlags(&bad, 0xFFFFU) == cudaErrorInvalidValue);
    } else {
      scale_kernel<<<1, 4096, 0, stream.get()>>>(y.data(), 1, 1.0F, 0.0F);  // 4096 threads: an invalid launch
    }
    // Which code the runtime gives an oversized block varies between releases.
    const cudaError_t pending = cudaPeekAtLastError();
    REQUIRE(pending != cudaSuccess);
    MESSAGE("the invalid launch left " << std::string(cudaGetErrorName(pending)));
    const bool stream_ready = stream.ref().ready();
    const bool event_ready = done.ready();
    MESSAGE("ready while running: stream " << stream_ready << ", event " << event_ready);
    CHECK(cudaPeekAtLastError() == pending);
    CHECK_THROWS_AS(replay::check_last_launch("scale_kernel"), replay::cuda_error);  // still reported
    stream.synchronize();
  }

  TEST_CASE("a failing driver memset does not clear the runtime's last-error slot") {
    // Old code: the driver failure cleared the runtime slot when it held the same code.
    replay::Stream stream;
    replay::DeviceBuffer<float> y(64);
    cudaEvent_t bad = nullptr;
    REQUIRE(cudaEventCreateWithFlags(&bad, 0xFFFFU) == cudaErrorInvalidValue);  // the user's own pending error
    REQUIRE(cudaPeekAtLastError() == cudaErrorInvalidValue);
    // A misaligned 32-bit memset: CUDA_ERROR_INVALID_VALUE (the same code) from the driver.
    auto* misaligned = reinterpret_cast<unsigned char*>(y.data()) + 1;
    CHECK_THROWS_AS(replay::detail::memset_strided(misaligned, 8, 0U, 4, 4, stream.get(), std::source_location::current()),
                    replay::cuda_error);
    CHECK(cudaGetLastError() == cudaErrorInvalidValue);  // the user's error is still there
  }

  TEST_CASE("stress: 8 threads on their own streams share two routers under lazy capture and interference") {
    constexpr int kThreads = 8;
    const int iterations = under_sanitizer() ? 4 : 150;
    struct Shared {
      Model m;
      int depth = 0;
      std::unique_ptr<replay::ShapeRouter<int>> router;
    };
    std::vector<std::unique_ptr<Shared>> shared;
    for (int r = 0; r < 2; ++r) {
      auto sh = std::make_unique<Shared>();
      sh->depth = 3 + 5 * r;
      Shared* self = sh.get();
      sh->router = std::make_unique<replay::ShapeRouter<int>>(
          [self](int batch, replay::StreamRef s) { model(self->m.x.data(), self->m.y.data(), batch, self->depth, s); },
          replay::ShapeRouterOptions<int>{.policy = replay::RoutingPolicy::bucketed,
                                          .buckets = {{4, 8, 16, 32, 64}},
                                          .warmup_runs = 1});
      shared.push_back(std::move(sh));
    }
    std::atomic<bool> stop{false};
    std::atomic<int> background_errors{0};
    std::thread background([&] {  // device-wide synchronizations, allocations, eager work
      try {
        replay::Stream own;
        replay::DeviceBuffer<float> scratch(1 << 18);
        while (!stop.load()) {
          replay::synchronize_device();
          void* temp = nullptr;
          replay::check(cudaMallocAsync(&temp, 1 << 18, own.get()), "cudaMallocAsync");
          replay::check(cudaMemsetAsync(temp, 0, 1 << 18, own.get()), "cudaMemsetAsync");
          replay::check(cudaFreeAsync(temp, own.get()), "cudaFreeAsync");
          scratch.fill(1.0F, own);
          std::this_thread::sleep_for(std::chrono::microseconds(200));
        }
        own.synchronize();
      } catch (...) {
        ++background_errors;
      }
    });
    std::vector<int> mismatches(kThreads, 0);
    std::vector<int> errors(kThreads, 0);
    std::vector<std::string> error_messages(kThreads);  // what each worker threw, if anything
    std::vector<std::future<void>> workers;
    for (int t = 0; t < kThreads; ++t) {
      workers.push_back(std::async(std::launch::async, [&, t] {
        try {
          replay::Stream stream;
          Model ref;
          std::mt19937 rng{replay_test::case_seed_for(static_cast<std::uint64_t>(t) + 1)};
          std::uniform_int_distribution<int> pick(0, 1);
          std::uniform_int_distribution<int> size(1, kMaxBatch);
          for (int it = 0; it < iterations; ++it) {
            Shared& sh = *shared[static_cast<std::size_t>(pick(rng))];
            const int batch = size(rng);
            const auto input = padded_input(batch, sh.router->padded_shape(batch), rng);
            std::vector<float> got;
            {
              // Stage, run and read under the router's lease: the buffers are shared.
              const auto lease = sh.router->lease(stream);
              sh.m.x.first(input.size()).copy_from(std::span<const float>(input), stream);
              (void)sh.router->run(batch, stream);
              got.resize(static_cast<std::size_t>(batch) * kCols);
              sh.m.y.first(got.size()).copy_to(std::span<float>(got), stream);
            }
            stream.synchronize();
            if (got != eager_reference(ref, input, batch, sh.depth, stream)) {
              ++mismatches[static_cast<std::size_t>(t)];
            }
          }
        } catch (const std::exception& e) {
          ++errors[static_cast<std::size_t>(t)];
          error_messages[static_cast<std::size_t>(t)] = e.what();
        } catch (...) {
          ++errors[static_cast<std::size_t>(t)];
          error_messages[static_cast<std::size_t>(t)] = "a non-standard exception";
        }
      }));
    }
    bool finished = true;
    for (auto& w : workers) {
      finished = finished && w.wait_for(std::chrono::seconds(300)) == std::future_status::ready;
    }
    stop = true;
    background.join();
    REQUIRE(finished);  // nothing hung
    CHECK(background_errors == 0);
    for (int t = 0; t < kThreads; ++t) {
      CHECK(mismatches[static_cast<std::size_t>(t)] == 0);
      CHECK(errors[static_cast<std::size_t>(t)] == 0);
      if (!error_messages[static_cast<std::size_t>(t)].empty()) {
        MESSAGE("worker " << t << " threw: " << error_messages[static_cast<std::size_t>(t)]);
      }
    }
    // Every bucket ends graphed: nothing was left eager for good.
    replay::Stream stream;
    for (auto& sh : shared) {
      for (int b : {4, 8, 16, 32, 64}) {
        for (int tries = 0; tries < 3 && !sh->router->contains(b); ++tries) {
          (void)sh->router->run(b, stream);
        }
        CHECK(sh->router->contains(b));
        CHECK_FALSE(sh->router->is_eager(b));
      }
      CHECK(sh->router->stats().capture_failures == 0);
      MESSAGE("router: " << sh->router->stats().hits << " hits, " << sh->router->stats().stream_switches
                         << " stream switches, " << sh->router->stats().eager_busy << " eager while busy, "
                         << sh->router->stats().interrupted_captures << " interrupted captures");
    }
    stream.synchronize();
  }

  TEST_CASE("StreamSharing::caller_ordered: one router on two streams, a run on the second is ordered after the first") {
    // Old code: no ordering; a slow launch on stream A could finish after a
    // later launch on stream B and leave A's data in the shared buffers.
    // (One thread orders its own copies here: the opt-in keeps the router's
    // ordering of what it issues, as before the default refused a second stream.)
    replay::Stream a;
    replay::Stream b;
    Model m;
    Model ref;
    replay::ShapeRouter<int> router(
        [&](int batch, replay::StreamRef s) { model(m.x.data(), m.y.data(), batch, batch == 64 ? 400 : 1, s); },
        {.stream_sharing = replay::StreamSharing::caller_ordered});
    const auto big = padded_input(64, 64);
    const auto small = padded_input(64, 64);
    const int rounds = under_sanitizer() ? 2 : 20;
    for (int round = 0; round < rounds + 1; ++round) {  // round 0 captures both
      m.x.first(big.size()).copy_from(std::span<const float>(big), a);
      (void)router.run(64, a);  // slow: 400 kernels
      m.x.first(small.size()).copy_from(std::span<const float>(small), b);
      (void)router.run(63, b);  // fast, on another stream
      const auto got = read(m.y.first(63 * kCols), b);
      a.synchronize();
      if (round > 0) {
        REQUIRE(got == eager_reference(ref, small, 63, 1, b));
      }
    }
    CHECK(router.stats().stream_switches >= static_cast<std::uint64_t>(2 * rounds));
  }

  TEST_CASE("one router, two threads on two streams without a lease: the second stream is refused, naming both") {
    // Old code: both ran, ordered by the router but not their copies: 397 of
    // 400 requests came back with the other thread's data, and no error.
    Model m;
    replay::ShapeRouter<int> router(
        [&](int batch, replay::StreamRef s) { model(m.x.data(), m.y.data(), batch, m.depth, s); },
        replay::ShapeRouterOptions<int>::bucketed({8, 16, 32, 64}));
    {
      replay::Stream setup;
      CHECK(router.capture_all(setup) == 4);  // at start, on any stream: binds none
      setup.synchronize();
    }
    constexpr int kThreads = 2;
    const int iterations = under_sanitizer() ? 5 : 200;
    struct Outcome {
      std::string stream_name;
      std::string refusal;
      int served = 0;
      int checked = 0;  // answers checked: those begun after the refused thread was done
      int wrong = 0;
    };
    std::vector<Outcome> outcomes(kThreads);
    std::atomic<int> ready{0};
    std::atomic<bool> refused_done{false};
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        Outcome& out = outcomes[static_cast<std::size_t>(t)];
        replay::Stream stream;
        Model ref;
        std::mt19937 rng{replay_test::case_seed_for(static_cast<std::uint64_t>(t) + 1)};
        std::uniform_int_distribution<int> size(1, kMaxBatch);
        std::ostringstream name;
        name << "stream " << static_cast<const void*>(stream.get());
        out.stream_name = name.str();
        ready.fetch_add(1);
        while (ready.load() < kThreads) {
          std::this_thread::yield();
        }
        try {
          for (int it = 0; it < iterations; ++it) {
            // The refused thread's copy-in (which the router never saw) may
            // have overwritten this thread's input: answers are checked once
            // that thread is done.
            const bool check = refused_done.load();
            const int batch = size(rng);
            const auto input = padded_input(batch, router.padded_shape(batch), rng);
            m.x.first(input.size()).copy_from(std::span<const float>(input), stream);
            (void)router.run(batch, stream);
            std::vector<float> got(static_cast<std::size_t>(batch) * kCols);
            m.y.first(got.size()).copy_to(std::span<float>(got), stream);
            stream.synchronize();
            ++out.served;
            if (check) {
              ++out.checked;
              out.wrong += got == eager_reference(ref, input, batch, m.depth, stream) ? 0 : 1;
            }
          }
        } catch (const replay::usage_error& e) {
          out.refusal = e.what();
          stream.synchronize();  // its copy-in is done before the other thread checks
          refused_done = true;
        }
      });
    }
    for (auto& thread : threads) {
      thread.join();
    }
    const auto refused = std::count_if(outcomes.begin(), outcomes.end(), [](const Outcome& o) { return !o.refusal.empty(); });
    REQUIRE(refused == 1);
    const Outcome& loser = outcomes[0].refusal.empty() ? outcomes[1] : outcomes[0];
    const Outcome& winner = outcomes[0].refusal.empty() ? outcomes[0] : outcomes[1];
    MESSAGE("refused: " << loser.refusal);
    CHECK(loser.served == 0);
    CHECK(loser.refusal.find(loser.stream_name) != std::string::npos);
    CHECK(loser.refusal.find(winner.stream_name) != std::string::npos);
    CHECK(loser.refusal.find("router.lease(stream)") != std::string::npos);
    CHECK(loser.refusal.find("one router per stream") != std::string::npos);
    CHECK(winner.served == iterations);
    CHECK(winner.wrong == 0);
    if (!under_sanitizer()) {
      CHECK(winner.checked > 0);
    }
  }

  // Copy in, run, copy out of one request on the router's shared buffers.
  struct StagedRequest {
    Model& m;
    const std::vector<float>& input;
    std::vector<float>& got;
    void operator()(const int&, const int& shape, replay::StreamRef s) const {
      CHECK(input.size() == static_cast<std::size_t>(shape) * kCols);  // padded to the bucket
      m.x.first(input.size()).copy_from(std::span<const float>(input), s);
    }
    void operator()(const replay::Route<int>&, replay::StreamRef s) const {
      m.y.first(got.size()).copy_to(std::span<float>(got), s);
    }
  };

  // Two threads on two streams share one lazily capturing router, each
  // serving `iterations` random requests through serve(router, request,
  // batch, stream); every answer is checked against an eager run.
  template <class Serve>
  void two_threads_share_a_router(Serve serve) {
    Model m;
    replay::ShapeRouter<int> router(
        [&](int batch, replay::StreamRef s) { model(m.x.data(), m.y.data(), batch, m.depth, s); },
        replay::ShapeRouterOptions<int>{.policy = replay::RoutingPolicy::bucketed,
                                        .buckets = {{8, 16, 32, 64}},
                                        .warmup_runs = 1});  // lazy capture under the leases
    constexpr int kThreads = 2;
    const int iterations = under_sanitizer() ? 5 : 300;
    std::vector<int> wrong(kThreads, 0);
    std::vector<std::string> errors(kThreads);
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        try {
          replay::Stream stream;
          Model ref;
          std::mt19937 rng{replay_test::case_seed_for(static_cast<std::uint64_t>(t) + 1)};
          std::uniform_int_distribution<int> size(1, kMaxBatch);
          for (int it = 0; it < iterations; ++it) {
            const int batch = size(rng);
            const auto input = padded_input(batch, router.padded_shape(batch), rng);
            std::vector<float> got(static_cast<std::size_t>(batch) * kCols);
            serve(router, StagedRequest{m, input, got}, batch, stream);
            stream.synchronize();
            wrong[static_cast<std::size_t>(t)] += got == eager_reference(ref, input, batch, m.depth, stream) ? 0 : 1;
          }
        } catch (const std::exception& e) {
          errors[static_cast<std::size_t>(t)] = e.what();
        }
      });
    }
    for (auto& thread : threads) {
      thread.join();
    }
    for (int t = 0; t < kThreads; ++t) {
      CHECK(errors[static_cast<std::size_t>(t)] == "");
      CHECK(wrong[static_cast<std::size_t>(t)] == 0);
    }
    CHECK(router.stats().runs == static_cast<std::uint64_t>(kThreads * iterations));
    if (!under_sanitizer()) {
      CHECK(router.stats().stream_switches > 0);  // the streams took turns
    }
  }

  TEST_CASE("one router, two threads on two streams, a lease per request: every answer equals eager") {
    two_threads_share_a_router(
        [](replay::ShapeRouter<int>& router, const StagedRequest& request, int batch, replay::StreamRef stream) {
          const auto lease = router.lease(stream);  // copy in, run, copy out: one request
          request(batch, router.padded_shape(batch), stream);
          (void)router.run(batch, stream);
          request(replay::Route<int>{}, stream);
        });
  }

  TEST_CASE("run_staged: two threads on two streams, copies and run in one call, no lease of their own: every answer equals eager") {
    two_threads_share_a_router(
        [](replay::ShapeRouter<int>& router, const StagedRequest& request, int batch, replay::StreamRef stream) {
          (void)router.run_staged(batch, stream, request, request);
        });
  }

  TEST_CASE("run_staged refuses before any copy is issued: the shared input buffer is untouched") {
    Model m;
    auto options = replay::ShapeRouterOptions<int>::bucketed({8, 16});
    options.oversize = replay::OversizePolicy::throw_error;
    replay::ShapeRouter<int> router(
        [&](int batch, replay::StreamRef s) { model(m.x.data(), m.y.data(), batch, m.depth, s); }, options);
    replay::Stream a;
    replay::Stream b;
    const std::vector<float> marked(m.x.size(), kSentinel);
    m.x.copy_from(std::span<const float>(marked), a);
    a.synchronize();
    const auto input = padded_input(8, 8);
    std::vector<float> got(8 * kCols);
    int staged = 0;
    const StagedRequest request{m, input, got};
    auto stage_in = [&](const int& key, const int& shape, replay::StreamRef s) {
      ++staged;
      request(key, shape, s);
    };
    CHECK_THROWS_WITH_AS((void)router.run_staged(17, b, stage_in, request), doctest::Contains("bucket"),
                         replay::usage_error);  // oversize under throw_error
    CHECK_THROWS_AS((void)router.run_staged(0, b, stage_in, request), replay::usage_error);
    {
      const auto lease = router.lease(a);  // this thread already holds one
      CHECK_THROWS_WITH_AS((void)router.run_staged(8, b, stage_in, request), doctest::Contains("already holds"),
                           replay::usage_error);
    }
    CHECK(staged == 0);
    CHECK(read(m.x.first(m.x.size()), b) == marked);  // nothing was copied in
    CHECK(router.stats().runs == 0);
    // And a good request goes through on either stream.
    CHECK(router.run_staged(8, b, stage_in, request).shape == 8);
    b.synchronize();
    Model ref;
    CHECK(got == eager_reference(ref, input, 8, m.depth, b));
    CHECK(staged == 1);
  }

  TEST_CASE("capture_all with one bucket whose work synchronizes its stream: 3 of 4 graphed, reported once first") {
    // Old code: capture_all returned 3 without calling the handler; the bucket
    // was left to be retried, and served eagerly, on live traffic, and
    // reported only about 100 requests later.
    replay::Stream stream;
    Model m;
    Model ref;
    std::vector<int> reported;
    std::string reason;
    replay::ShapeRouter<int> router(
        [&](int batch, replay::StreamRef s) {
          if (batch == 16) {
            (void)cudaStreamSynchronize(s.get());  // a raw call that breaks a capture, its status ignored
          }
          model(m.x.data(), m.y.data(), batch, m.depth, s);
        },
        replay::ShapeRouterOptions<int>{.policy = replay::RoutingPolicy::bucketed,
                                        .buckets = {{8, 16, 32, 64}},
                                        .on_capture_failure =
                                            [&](const int& shape, std::string_view why) {
                                              reported.push_back(shape);
                                              reason = why;
                                            },
                                        .retry_backoff = std::chrono::microseconds(50)});
    const std::size_t graphed = router.capture_all(stream);
    const std::vector<int> reported_by_then = reported;
    CHECK(graphed == 3);
    REQUIRE(reported_by_then == std::vector<int>{16});
    MESSAGE("bucket 16: " << reason);
    CHECK(router.stats().capture_failures == 1);
    CHECK(router.is_eager(16));
    CHECK(router.graph_count() == 3);
    for (const int batch : {5, 12, 16, 40, 64}) {
      const int padded = router.padded_shape(batch);
      const auto input = padded_input(batch, padded);
      m.x.first(input.size()).copy_from(std::span<const float>(input), stream);
      const auto route = router.run(batch, stream);
      CHECK(route.kind == (padded == 16 ? replay::RouteKind::eager_fallback : replay::RouteKind::replayed));
      const auto got = read(m.y.first(static_cast<std::size_t>(batch) * kCols), stream);
      REQUIRE(got == eager_reference(ref, input, batch, m.depth, stream));
    }
    CHECK(reported.size() == 1);
    CHECK(cudaGetLastError() == cudaSuccess);  // no capture error left behind
  }
}
