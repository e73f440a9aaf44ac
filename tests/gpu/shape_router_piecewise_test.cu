// ShapeRouter with keys whose work declares a break (replay::eager), on the
// device: BreakPolicy::piecewise captures them piecewise (a region in the
// middle whose value steers the second half, flipping between runs), the
// default BreakPolicy::eager runs them eagerly; capture_all over buckets
// where some keys break, some do not and one breaks undeclared; the per-key
// report; eviction; and two threads on two streams through run_staged. The
// work is not idempotent (y += x): every answer is checked against the same
// kernels applied once, so a doubled run shows.
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "gpu_suite.hpp"
#include "replay/replay.hpp"
#include "replay/shape_router.hpp"

namespace {

constexpr int kMax = 1024;

__global__ void add_into_kernel(int* y, const int* x, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) {
    y[i] += x[i];
  }
}
__global__ void affine_kernel(int* y, int n, int m, int b) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) {
    y[i] = y[i] * m + b;
  }
}
__global__ void positive_flag_kernel(const int* y, int* flag) { *flag = y[0] > 0 ? 1 : 0; }

unsigned blocks(int n) { return static_cast<unsigned>((n + 255) / 256); }

// The shared buffers of one router, and what its regions read back into.
// Declared before the router: its regions refer to it.
struct Buffers {
  replay::DeviceBuffer<int> x{kMax};
  replay::DeviceBuffer<int> y{kMax};
  replay::DeviceBuffer<int> flag{1};
  int host_flag = 0;
};

// Key n (elements): y += x, then
//   n == 512: y = 3y (no break: one graph);
//   n == 128: a stray synchronization (an undeclared break: eager), then y = 5y;
//   else: a read-back region "read back" of y[0] > 0 that steers the second
//         half: y = 2y when positive, y = y - 3 otherwise.
void work(Buffers& b, int n, replay::StreamRef s) {
  add_into_kernel<<<blocks(n), 256, 0, s.get()>>>(b.y.data(), b.x.data(), n);
  replay::check_last_launch("add_into_kernel");
  if (n == 512) {
    affine_kernel<<<blocks(n), 256, 0, s.get()>>>(b.y.data(), n, 3, 0);
    replay::check_last_launch("affine_kernel");
    return;
  }
  if (n == 128) {
    replay::check(cudaStreamSynchronize(s.get()), "cudaStreamSynchronize");
    affine_kernel<<<blocks(n), 256, 0, s.get()>>>(b.y.data(), n, 5, 0);
    replay::check_last_launch("affine_kernel");
    return;
  }
  positive_flag_kernel<<<1, 1, 0, s.get()>>>(b.y.data(), b.flag.data());
  replay::check_last_launch("positive_flag_kernel");
  // The region refers to `b` only (it outlives the router), never to this call's locals.
  const int positive = replay::eager(s, "read back", [&b](replay::StreamRef r) {
    replay::check(cudaMemcpyAsync(&b.host_flag, b.flag.data(), sizeof(int), cudaMemcpyDeviceToHost, r.get()),
                  "cudaMemcpyAsync");
    r.synchronize();
    return b.host_flag;
  });
  if (positive != 0) {
    affine_kernel<<<blocks(n), 256, 0, s.get()>>>(b.y.data(), n, 2, 0);
  } else {
    affine_kernel<<<blocks(n), 256, 0, s.get()>>>(b.y.data(), n, 1, -3);
  }
  replay::check_last_launch("affine_kernel");
}

// The same, once, on the host.
std::vector<int> reference(std::vector<int> y, const std::vector<int>& x, int n) {
  for (int i = 0; i < n; ++i) {
    y[i] += x[i];
  }
  const bool positive = y[0] > 0;
  for (int i = 0; i < n; ++i) {
    if (n == 512) {
      y[i] *= 3;
    } else if (n == 128) {
      y[i] *= 5;
    } else {
      y[i] = positive ? 2 * y[i] : y[i] - 3;
    }
  }
  return y;
}

// Random x and y0 over kMax elements (padding included), x[0] chosen so that
// y0[0] + x[0] has the sign asked for.
struct Request {
  std::vector<int> x;
  std::vector<int> y0;
};
Request request(bool positive, std::mt19937& rng) {
  std::uniform_int_distribution<int> value(-50, 50);
  Request r{std::vector<int>(kMax), std::vector<int>(kMax)};
  for (int i = 0; i < kMax; ++i) {
    r.x[i] = value(rng);
    r.y0[i] = value(rng);
  }
  r.x[0] = positive ? 100 - r.y0[0] : -100 - r.y0[0];
  return r;
}

using Router = replay::ShapeRouter<int>;

replay::ShapeRouterOptions<int> options(replay::BreakPolicy breaks, std::vector<std::string>* reasons) {
  auto o = replay::ShapeRouterOptions<int>::bucketed({128, 256, 512, 1024});
  o.breaks = breaks;
  o.on_capture_failure = [reasons](const int&, std::string_view why) { reasons->emplace_back(why); };
  return o;
}

// One request through run_staged: x and y0 in, the run, y out; whether y
// equals the reference on the padded shape (no doctest check: called from threads).
struct Checked {
  replay::Route<int> route;
  bool right = false;
};
Checked run_staged(Router& router, Buffers& b, int key, const Request& r, replay::StreamRef s) {
  std::vector<int> out(kMax, -1);
  const auto route = router.run_staged(
      key, s,
      [&](const int&, const int&, replay::StreamRef st) {
        b.x.view().copy_from(std::span<const int>(r.x), st);
        b.y.view().copy_from(std::span<const int>(r.y0), st);
      },
      [&](const replay::Route<int>&, replay::StreamRef st) {
        b.y.view().copy_to(std::span<int>(out), st);
        st.synchronize();
      });
  const std::vector<int> expected = reference(r.y0, r.x, route.shape);
  return {route, std::equal(out.begin(), out.begin() + route.shape, expected.begin())};
}
replay::Route<int> run_checked(Router& router, Buffers& b, int key, const Request& r, replay::StreamRef s) {
  const Checked checked = run_staged(router, b, key, r, s);
  CHECK(checked.right);
  return checked.route;
}

}  // namespace

TEST_SUITE("gpu" * replay_test::needs_device()) {
  TEST_CASE("BreakPolicy::piecewise: a region in the middle steers the second half, flipping, equal to eager, never doubled") {
    replay::Stream stream;
    Buffers b;
    std::vector<std::string> reasons;
    Router router([&b](const int& n, replay::StreamRef s) { work(b, n, s); },
                  options(replay::BreakPolicy::piecewise, &reasons));
    std::mt19937 rng{replay_test::case_seed_for(0)};
    for (int i = 0; i < 12; ++i) {
      const auto route = run_checked(router, b, 1000, request(i % 3 != 1, rng), stream);
      CHECK(route.shape == 1024);
      CHECK(route.kind == (i == 0 ? replay::RouteKind::captured : replay::RouteKind::replayed));
    }
    CHECK(reasons.empty());
    const auto info = router.entry_info(1000);
    CHECK(info.kind == replay::RouterEntryKind::piecewise);
    CHECK(info.shape == 1024);
    CHECK(info.segments == 2);
    CHECK(info.regions == std::vector<std::string>{"read back"});
    CHECK(info.replays == 12);
    const auto stats = router.stats();
    CHECK(stats.captures == 1);
    CHECK(stats.piecewise_captures == 1);
    CHECK(stats.hits == 11);
    CHECK(stats.capture_failures == 0);
    CHECK(router.graph_count() == 1);
    // invalidate(): re-captured piecewise on the next run, once, still right.
    CHECK(router.invalidate(1000));
    CHECK(run_checked(router, b, 1000, request(false, rng), stream).kind == replay::RouteKind::recaptured);
    CHECK(run_checked(router, b, 1000, request(true, rng), stream).kind == replay::RouteKind::replayed);
    CHECK(router.entry_info(1000).kind == replay::RouterEntryKind::piecewise);
  }

  TEST_CASE("BreakPolicy::eager (the default): a key that declares a break runs eagerly, its region in place, with the reason") {
    replay::Stream stream;
    Buffers b;
    std::vector<std::string> reasons;
    Router router([&b](const int& n, replay::StreamRef s) { work(b, n, s); },
                  options(replay::BreakPolicy::eager, &reasons));
    std::mt19937 rng{replay_test::case_seed_for(1)};
    for (int i = 0; i < 6; ++i) {
      CHECK(run_checked(router, b, 256, request(i % 2 == 0, rng), stream).kind == replay::RouteKind::eager_fallback);
      CHECK(run_checked(router, b, 512, request(i % 2 == 0, rng), stream).graph());
    }
    REQUIRE(reasons.size() == 1);
    CHECK(reasons[0].find("BreakPolicy::piecewise") != std::string::npos);
    CHECK(router.entry_info(256).kind == replay::RouterEntryKind::eager);
    CHECK(router.entry_info(256).reason == reasons[0]);
    CHECK(router.entry_info(512).kind == replay::RouterEntryKind::whole);
    CHECK(router.stats().piecewise_captures == 0);
  }

  TEST_CASE("capture_all with BreakPolicy::piecewise: whole, piecewise and eager keys, reported per key, each answer equal to eager") {
    replay::Stream stream;
    Buffers b;
    std::vector<std::string> reasons;
    Router router([&b](const int& n, replay::StreamRef s) { work(b, n, s); },
                  options(replay::BreakPolicy::piecewise, &reasons));
    CHECK(router.capture_all(stream) == 3);  // 128 breaks undeclared: eager
    std::vector<std::pair<int, replay::RouterEntryKind>> kinds;
    for (const auto& entry : router.entries()) {
      kinds.emplace_back(entry.shape, entry.kind);
    }
    std::sort(kinds.begin(), kinds.end());
    using K = replay::RouterEntryKind;
    CHECK(kinds == std::vector<std::pair<int, K>>{{128, K::eager}, {256, K::piecewise}, {512, K::whole}, {1024, K::piecewise}});
    REQUIRE(reasons.size() == 1);
    CHECK(router.entry_info(100).reason == reasons[0]);
    const auto stats = router.stats();
    CHECK(stats.captures == 3);
    CHECK(stats.piecewise_captures == 2);
    CHECK(stats.capture_failures == 1);
    std::mt19937 rng{replay_test::case_seed_for(2)};
    std::uniform_int_distribution<int> key(1, kMax);
    for (int i = 0; i < 40; ++i) {
      const auto route = run_checked(router, b, key(rng), request(i % 2 == 0, rng), stream);
      CHECK(route.kind == (route.shape == 128 ? replay::RouteKind::eager_fallback : replay::RouteKind::replayed));
    }
    // Piecewise and whole graphs are evicted alike (max_graphs through a second router).
    auto bounded = options(replay::BreakPolicy::piecewise, &reasons);
    bounded.max_graphs = 1;
    Router small([&b](const int& n, replay::StreamRef s) { work(b, n, s); }, bounded);
    for (int i = 0; i < 6; ++i) {
      for (const int k : {256, 512, 1024}) {
        CHECK(run_checked(small, b, k, request(i % 2 == 0, rng), stream).kind == replay::RouteKind::captured);
      }
    }
    CHECK(small.graph_count() == 1);
    CHECK(small.stats().evictions == 17);
    CHECK(small.stats().piecewise_captures == 12);
    CHECK(small.entry_info(256).kind == replay::RouterEntryKind::pending);
  }

  TEST_CASE("two threads on two streams share a router with piecewise keys through run_staged, every answer equal to eager") {
    Buffers b;
    std::vector<std::string> reasons;
    Router router([&b](const int& n, replay::StreamRef s) { work(b, n, s); },
                  options(replay::BreakPolicy::piecewise, &reasons));
    constexpr int kThreads = 2;
    constexpr int kRequests = 60;
    std::array<int, kThreads> wrong{};
    std::array<int, kThreads> piecewise_runs{};
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        replay::Stream stream;
        std::mt19937 rng{replay_test::case_seed_for(10 + t)};
        std::uniform_int_distribution<int> key(129, kMax);  // 256, 512 or 1024
        for (int i = 0; i < kRequests; ++i) {
          const Checked checked = run_staged(router, b, key(rng), request(rng() % 2 == 0, rng), stream);
          wrong[t] += checked.right ? 0 : 1;
          piecewise_runs[t] += checked.route.shape != 512 ? 1 : 0;
        }
      });
    }
    for (auto& thread : threads) {
      thread.join();
    }
    for (int t = 0; t < kThreads; ++t) {
      CHECK(wrong[t] == 0);
      CHECK(piecewise_runs[t] > 0);
    }
    CHECK(reasons.empty());
    CHECK(router.stats().runs == kThreads * kRequests);
    CHECK(router.stats().piecewise_captures == 2);
    CHECK(router.entry_info(256).kind == replay::RouterEntryKind::piecewise);
    CHECK(router.entry_info(1024).kind == replay::RouterEntryKind::piecewise);
  }
}
