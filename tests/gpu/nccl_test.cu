// The NCCL component on the device. Suite gpu (one GPU is enough): one-rank
// communicators, each collective eager and captured in a graph against host
// references, NCCL's own argument errors, bucket agreement and the watchdog
// firing on a replay held back on purpose. The cases for two GPUs or more are
// in nccl_multi_test.cu.
#include <doctest/doctest.h>

#include <replay/nccl.hpp>
#include <replay/replay.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gpu_suite.hpp"
#include "kernels.cuh"

namespace {

using namespace std::chrono_literals;

// Before any NCCL call of the process (NCCL reads it once): multicast off.
const bool multicast_off = replay::keep_nvlink_multicast_off();

// Spins until *flag is non-zero (or `limit_ns` passed, so that a test can
// never hang the device), reading it from pinned host memory.
__global__ void wait_for_flag_kernel(const volatile int* flag, unsigned long long limit_ns) {
  unsigned long long start = 0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  for (;;) {
    if (*flag != 0) {
      return;
    }
    unsigned long long now = 0;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    if (now - start > limit_ns) {
      return;
    }
    __nanosleep(1000);
  }
}

void set_flag(const replay::PinnedBuffer<int>& flag, int value) {
  *static_cast<volatile int*>(flag.data()) = value;
}

bool near(float a, float b) { return std::fabs(a - b) <= 1e-5F * std::max(1.0F, std::fabs(b)); }

void check_all_near(const std::vector<float>& got, const std::vector<float>& want) {
  REQUIRE(got.size() == want.size());
  std::size_t bad = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    bad += near(got[i], want[i]) ? 0 : 1;
  }
  CHECK(bad == 0);
}

replay::Communicator one_rank_communicator() {
  return replay::Communicator(replay::new_unique_id(), 1, 0, replay::current_device());
}

}  // namespace

TEST_SUITE("gpu" * replay_test::needs_device()) {
  TEST_CASE("a one-rank communicator: ncclCommInitRank with a unique id, and ncclCommInitAll") {
    CHECK(multicast_off);
    CHECK(replay::nccl_runtime_version() >= NCCL_VERSION(2, 18, 0));
    replay::Communicator comm = one_rank_communicator();
    CHECK(comm.rank() == 0);
    CHECK(comm.size() == 1);
    CHECK(comm.device() == replay::current_device());
    CHECK(comm.async_error() == ncclSuccess);
    CHECK_FALSE(comm.failed());

    replay::Communicator moved = std::move(comm);
    CHECK(static_cast<bool>(moved));
    CHECK_THROWS_AS((void)comm.handle(), replay::usage_error);  // NOLINT: use after move, on purpose

    replay::CommunicatorGroup group({replay::current_device()});
    REQUIRE(group.size() == 1);
    CHECK(group[0].rank() == 0);
    CHECK(group[0].size() == 1);
    CHECK_THROWS_AS(group.at(1), replay::usage_error);
    CHECK_THROWS_AS(replay::CommunicatorGroup({0, 0}), replay::usage_error);
  }

  TEST_CASE("NCCL's argument errors come back as nccl_error naming the call") {
    // A rank outside [0, nranks).
    try {
      replay::Communicator bad(replay::new_unique_id(), 1, 5, replay::current_device());
      FAIL("ncclCommInitRank accepted rank 5 of 1");
    } catch (const replay::nccl_error& e) {
      CHECK(e.api() == "ncclCommInitRank");
      CHECK(e.result() == ncclInvalidArgument);
      CHECK(std::string(e.what()).find("ncclCommInitRank failed: ncclInvalidArgument") != std::string::npos);
      CHECK(std::string(e.what()).find("nccl_test.cu") != std::string::npos);
    }

    replay::Communicator comm = one_rank_communicator();
    replay::Stream stream;
    replay::DeviceBuffer<float> a(64);
    replay::DeviceBuffer<float> b(64);
    // A root outside the communicator.
    try {
      replay::broadcast(comm, a.view(), b.view(), 3, stream);
      FAIL("ncclBroadcast accepted root 3 of 1 rank");
    } catch (const replay::nccl_error& e) {
      CHECK(e.api() == "ncclBroadcast");
      CHECK((e.result() == ncclInvalidArgument || e.result() == ncclInvalidUsage));
    }
    CHECK(comm.failed());  // its destructor aborts it
    // Sizes are checked before NCCL is called.
    replay::Communicator comm3 = one_rank_communicator();
    CHECK_THROWS_WITH_AS(replay::all_gather(comm3, a.view(), b.first(32), stream), doctest::Contains("all_gather"),
                         replay::usage_error);
    CHECK_THROWS_AS(replay::all_reduce(comm3, a.view(), b.first(8), replay::ReduceOp::sum, stream),
                    replay::usage_error);
    CHECK_FALSE(comm3.failed());
    stream.synchronize();
  }

  TEST_CASE("each collective, eager and captured in a graph between two kernels, matches the host reference") {
    replay::Communicator comm = one_rank_communicator();
    replay::Stream stream;
    constexpr int n = 4096;
    replay::DeviceBuffer<float> x(n);
    replay::DeviceBuffer<float> y(n);
    const unsigned blocks = replay_test::blocks_for(n);

    // x = 2x + 1; collective x -> y; y = 3y - 1. One rank: sum, max, gather,
    // scatter and broadcast all hand x over, so y = 3(2x + 1) - 1.
    enum class Kind { all_reduce_sum, all_reduce_max_in_place, all_gather, reduce_scatter, broadcast };
    auto issue = [&](Kind kind, replay::StreamRef s) {
      replay_test::axpb_kernel<<<blocks, 256, 0, s.get()>>>(x.data(), n, 2.0F, 1.0F);
      replay::check_last_launch("axpb_kernel");
      switch (kind) {
        case Kind::all_reduce_sum: replay::all_reduce(comm, x.view(), y.view(), replay::ReduceOp::sum, s); break;
        case Kind::all_reduce_max_in_place:
          replay::all_reduce(comm, x.view(), replay::ReduceOp::max, s);
          y.copy_from(x, s);
          break;
        case Kind::all_gather: replay::all_gather(comm, x.view(), y.view(), s); break;
        case Kind::reduce_scatter: replay::reduce_scatter(comm, x.view(), y.view(), replay::ReduceOp::sum, s); break;
        case Kind::broadcast: replay::broadcast(comm, x.view(), y.view(), 0, s); break;
      }
      replay_test::axpb_kernel<<<blocks, 256, 0, s.get()>>>(y.data(), n, 3.0F, -1.0F);
      replay::check_last_launch("axpb_kernel");
    };
    auto reference = [](const std::vector<float>& in) {
      std::vector<float> out(in.size());
      for (std::size_t i = 0; i < in.size(); ++i) {
        out[i] = 3.0F * (2.0F * in[i] + 1.0F) - 1.0F;
      }
      return out;
    };
    for (Kind kind : {Kind::all_reduce_sum, Kind::all_reduce_max_in_place, Kind::all_gather, Kind::reduce_scatter,
                      Kind::broadcast}) {
      CAPTURE(static_cast<int>(kind));
      // Eager first: the warm-up NCCL needs before a capture.
      std::vector<float> in = replay_test::random_floats(n);
      std::vector<float> out(n);
      x.copy_from(in, stream);
      issue(kind, stream);
      y.copy_to(out, stream);
      stream.synchronize();
      check_all_near(out, reference(in));

      replay::Graph graph = replay::capture(stream, [&](replay::StreamRef s) { issue(kind, s); });
      CHECK(graph.count(replay::NodeType::kernel) >= 2);
      replay::GraphExec exec(graph);
      for (int rep = 0; rep < 3; ++rep) {
        in = replay_test::random_floats(n);
        x.copy_from(in, stream);
        exec.launch(stream);
        y.copy_to(out, stream);
        stream.synchronize();
        check_all_near(out, reference(in));
      }
    }
    CHECK_FALSE(comm.failed());
  }

  TEST_CASE("NcclGroup: collectives issued inside a group run when it ends") {
    replay::Communicator comm = one_rank_communicator();
    replay::Stream stream;
    constexpr std::size_t n = 1000;
    replay::DeviceBuffer<float> x(n);
    replay::DeviceBuffer<float> y(n);
    replay::DeviceBuffer<float> z(n);
    const std::vector<float> in = replay_test::random_floats(n);
    x.copy_from(in, stream);
    {
      replay::NcclGroup group;
      replay::all_reduce(comm, x.view(), y.view(), replay::ReduceOp::sum, stream);
      replay::all_gather(comm, x.view(), z.view(), stream);
      group.end();
      CHECK_THROWS_AS(group.end(), replay::usage_error);
    }
    std::vector<float> out_y(n);
    std::vector<float> out_z(n);
    y.copy_to(out_y, stream);
    z.copy_to(out_z, stream);
    stream.synchronize();
    check_all_near(out_y, in);
    CHECK(out_z == in);
  }

  TEST_CASE("MultiRankRouter on one rank: NCCL agreement, captured buckets with a collective, the stream's device") {
    replay::Communicator comm = one_rank_communicator();
    replay::Stream stream;
    constexpr int max_batch = 64;
    constexpr int width = 256;
    replay::DeviceBuffer<float> x(max_batch * width);
    replay::DeviceBuffer<float> y(max_batch * width);
    std::atomic<int> eager_or_captured{0};
    replay::ShapeRouter<int> router(
        [&](int batch, replay::StreamRef s) {
          ++eager_or_captured;
          const int count = batch * width;
          replay_test::axpb_kernel<<<replay_test::blocks_for(count), 256, 0, s.get()>>>(x.data(), count, 2.0F, 0.5F);
          replay::check_last_launch("axpb_kernel");
          replay::all_reduce(comm, x.first(static_cast<std::size_t>(count)), y.first(static_cast<std::size_t>(count)),
                             replay::ReduceOp::sum, s);
        },
        [] {
          auto o = replay::ShapeRouterOptions<int>::bucketed({8, 16, 32, 64});
          o.warmup_runs = 1;
          return o;
        }());
    replay::NcclAgreement agreement(comm, 10s);
    replay::ReplayWatchdog watchdog({.timeout = 30s, .poll_interval = 5ms, .on_stuck = {}});
    replay::MultiRankRouter<int> ranks(router, agreement, &watchdog);
    CHECK(ranks.capture_all(stream) == 4);
    CHECK(router.graph_count() == 4);

    std::uniform_int_distribution<int> batch_dist(1, max_batch);
    for (int step = 0; step < replay_test::scaled(40, 4); ++step) {
      const int batch = batch_dist(replay_test::rng());
      const int agreed = ranks.agree(batch, stream);
      CHECK(agreed == router.padded_shape(batch));
      std::vector<float> in = replay_test::random_floats(static_cast<std::size_t>(agreed) * width);
      x.first(in.size()).copy_from(in, stream);
      const replay::Route<int> route = ranks.run_agreed(agreed, stream);
      CHECK(route.kind == replay::RouteKind::replayed);
      std::vector<float> out(in.size());
      y.first(out.size()).copy_to(out, stream);
      stream.synchronize();
      for (float& v : in) {
        v = 2.0F * v + 0.5F;
      }
      check_all_near(out, in);
    }
    CHECK(router.stats().captures == 4);
    CHECK(router.stats().hits == static_cast<std::uint64_t>(replay_test::scaled(40, 4)));
    // Keys it cannot route are refused on the rank (and would be on every rank).
    CHECK_THROWS_AS((void)ranks.run(0, stream), replay::usage_error);
    CHECK_THROWS_AS(agreement.reduce_max({}, stream), replay::usage_error);
    stream.synchronize();
    // The work ran on the stream's device even with another one current:
    // with one GPU there is no other, so check that the device is unchanged.
    CHECK(replay::current_device() == comm.device());
  }

  TEST_CASE("the watchdog reports a replay held back on purpose (rank, bucket, how long), then clears") {
    replay::Communicator comm = one_rank_communicator();
    replay::Stream stream;
    replay::PinnedBuffer<int> flag(1);
    set_flag(flag, 1);
    replay::DeviceBuffer<float> x(1024);
    replay::ShapeRouter<int> router(
        [&](int batch, replay::StreamRef s) {
          wait_for_flag_kernel<<<1, 1, 0, s.get()>>>(flag.data(), 20'000'000'000ULL);  // 20 s at most
          replay::check_last_launch("wait_for_flag_kernel");
          replay::all_reduce(comm, x.first(static_cast<std::size_t>(batch)), replay::ReduceOp::sum, s);
        },
        [] {
          auto o = replay::ShapeRouterOptions<int>::bucketed({8, 16});
          o.warmup_runs = 1;
          return o;
        }());
    std::mutex mutex;
    std::condition_variable reported;
    std::vector<replay::StuckWork> reports;
    const auto timeout = replay_test::under_sanitizer() ? 2000ms : 200ms;
    replay::ReplayWatchdog watchdog({.timeout = timeout,
                                     .poll_interval = 2ms,
                                     .on_stuck = [&](const replay::StuckWork& s) {
                                       std::lock_guard<std::mutex> lock(mutex);
                                       reports.push_back(s);
                                       reported.notify_all();
                                     }});
    replay::NcclAgreement agreement(comm, 30s);
    replay::MultiRankRouter<int> ranks(router, agreement, &watchdog);
    ranks.capture_all(stream);
    (void)ranks.run(5, stream);
    stream.synchronize();
    const auto settle = std::chrono::steady_clock::now() + 10s;
    while (watchdog.pending() != 0 && std::chrono::steady_clock::now() < settle) {
      std::this_thread::sleep_for(2ms);  // the watchdog sees the finished replays
    }
    CHECK(watchdog.pending() == 0);
    std::size_t before = 0;
    {
      std::lock_guard<std::mutex> lock(mutex);
      before = reports.size();  // slow first runs may have been reported; they finished
    }
    CHECK_NOTHROW(watchdog.check_healthy());

    // The next replay waits until the flag is set again. A second thread sets
    // it after a while whatever happens, so nothing can hang: under
    // compute-sanitizer a launch may block until its kernel ends, and then
    // only that thread can release it (and the report may not come at all).
    set_flag(flag, 0);
    std::atomic<bool> released{false};
    std::thread safety([&] {
      const auto give_up = std::chrono::steady_clock::now() + (replay_test::under_sanitizer() ? 5s : 12s);
      while (!released && std::chrono::steady_clock::now() < give_up) {
        std::this_thread::sleep_for(5ms);
      }
      if (!released.exchange(true)) {
        set_flag(flag, 1);
      }
    });
    const auto launched = std::chrono::steady_clock::now();
    const auto route = ranks.run(3, stream);
    CHECK(route.agreed == 8);
    CHECK(route.route.kind == replay::RouteKind::replayed);
    bool fired = false;
    {
      std::unique_lock<std::mutex> lock(mutex);
      fired = reported.wait_for(lock, 10s, [&] { return reports.size() > before; });
    }
    const auto waited = std::chrono::steady_clock::now() - launched;
    if (!replay_test::under_sanitizer()) {
      CHECK(fired);
    }
    if (fired) {
      std::lock_guard<std::mutex> lock(mutex);
      const replay::StuckWork& s = reports.back();
      CHECK(s.rank == 0);
      CHECK(s.device == comm.device());
      CHECK(s.what.find("replay of bucket 8") != std::string::npos);
      CHECK(s.waited >= timeout);
      CHECK(waited >= timeout);
    }
    if (fired && !released.exchange(true)) {  // still held back: it is reported as stuck
      CHECK(watchdog.stuck().has_value());
      CHECK_THROWS_WITH_AS(watchdog.check_healthy(), doctest::Contains("replay of bucket 8"), replay::timeout_error);
    }
    released = true;
    safety.join();
    set_flag(flag, 1);  // release it (if the safety thread did not): nothing stays stuck
    stream.synchronize();
    const auto deadline = std::chrono::steady_clock::now() + 10s;
    while (watchdog.stuck().has_value() && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(2ms);
    }
    CHECK_FALSE(watchdog.stuck().has_value());
    CHECK_NOTHROW(watchdog.check_healthy());
    CHECK(ranks.run(12, stream).agreed == 16);
    stream.synchronize();
    CHECK_FALSE(comm.failed());
  }
}
