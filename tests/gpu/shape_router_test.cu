// ShapeRouter with the CUDA backend: routed results equal eager runs for
// random shapes; padding is correct and padded rows do not leak; graphs share
// the graph memory pool (measured); eviction, re-capture through update;
// capture failure falls back to eager; 100k routed replays without memory
// growth or host allocations; one router per thread.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "gpu_suite.hpp"
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
    std::mt19937 rng{std::random_device{}()};
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
          std::mt19937 rng{std::random_device{}()};
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
}
