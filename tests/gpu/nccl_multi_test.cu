// The NCCL component over two GPUs or more, suite gpu_multi (skipped with
// fewer; scripts/gpu-check.d/nccl.sh runs it with every GPU visible): one
// thread per GPU over ncclCommInitAll, all-reduce and all-gather eager and
// captured against host references, and ranks with different random batch
// sizes agreeing on the same bucket every step.
#include <doctest/doctest.h>

#include <replay/nccl.hpp>
#include <replay/replay.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gpu_suite.hpp"

namespace {

using namespace std::chrono_literals;

// Before any NCCL call of the process (NCCL reads it once): multicast off.
const bool multicast_off = replay::keep_nvlink_multicast_off();

// Runs body(rank, communicator) on one thread per rank of `group`, each with
// its communicator's device current; returns what each one threw ("" if none).
template <class Body>
std::vector<std::string> on_each_rank(replay::CommunicatorGroup& group, Body body) {
  std::vector<std::string> failures(group.size());
  std::vector<std::thread> threads;
  for (std::size_t r = 0; r < group.size(); ++r) {
    threads.emplace_back([&, r] {
      try {
        replay::ScopedDevice on(group[r].device());
        body(r, group[r]);
      } catch (const std::exception& e) {
        failures[r] = e.what();
      }
    });
  }
  for (auto& t : threads) {
    t.join();
  }
  return failures;
}

}  // namespace

TEST_SUITE("gpu_multi" * replay_test::needs_devices(2)) {
  TEST_CASE("one thread per GPU: all-reduce and all-gather, eager and captured, against the host reference") {
    CHECK(multicast_off);
    const int ranks = replay::device_count();
    replay::CommunicatorGroup group = replay::CommunicatorGroup::first_devices(ranks);
    constexpr int n = 1 << 16;
    std::vector<std::vector<float>> inputs(static_cast<std::size_t>(ranks));
    for (auto& in : inputs) {
      in = replay_test::random_floats(n);
    }
    std::vector<float> sum(n, 0.0F);
    for (const auto& in : inputs) {
      for (int i = 0; i < n; ++i) {
        sum[static_cast<std::size_t>(i)] += in[static_cast<std::size_t>(i)];
      }
    }
    std::vector<std::vector<float>> eager(static_cast<std::size_t>(ranks));
    std::vector<std::vector<float>> graphed(static_cast<std::size_t>(ranks));
    std::vector<std::vector<float>> gathered(static_cast<std::size_t>(ranks));
    const std::vector<std::string> failures = on_each_rank(group, [&](std::size_t i, replay::Communicator& comm) {
      replay::Stream stream;
      replay::DeviceBuffer<float> x(n);
      replay::DeviceBuffer<float> y(n);
      replay::DeviceBuffer<float> all(static_cast<std::size_t>(n) * static_cast<std::size_t>(ranks));
      auto issue = [&](replay::StreamRef s) {
        replay::all_reduce(comm, x.view(), y.view(), replay::ReduceOp::sum, s);
        replay::all_gather(comm, x.view(), all.view(), s);
      };
      x.copy_from(inputs[i], stream);
      issue(stream);  // eager: the warm-up
      eager[i].resize(n);
      y.copy_to(eager[i], stream);
      stream.synchronize();
      replay::Graph graph = replay::capture(stream, issue);
      replay::GraphExec exec(graph);
      y.zero(stream);
      exec.launch(stream);
      graphed[i].resize(n);
      gathered[i].resize(all.size());
      y.copy_to(graphed[i], stream);
      all.copy_to(gathered[i], stream);
      stream.synchronize();
    });
    for (int r = 0; r < ranks; ++r) {
      const auto i = static_cast<std::size_t>(r);
      CAPTURE(r);
      CHECK(failures[i].empty());
      if (!failures[i].empty()) {
        MESSAGE(failures[i]);
        continue;
      }
      for (std::size_t k = 0; k < sum.size(); ++k) {
        if (std::fabs(eager[i][k] - sum[k]) > 1e-4F || std::fabs(graphed[i][k] - sum[k]) > 1e-4F) {
          FAIL("all-reduce differs at element " << k);
          break;
        }
      }
      for (int src = 0; src < ranks; ++src) {
        CHECK(std::equal(inputs[static_cast<std::size_t>(src)].begin(), inputs[static_cast<std::size_t>(src)].end(),
                         gathered[i].begin() + static_cast<std::ptrdiff_t>(src) * n));
      }
    }
  }

  TEST_CASE("one thread drives every GPU: each collective for all ranks inside one NcclGroup") {
    const int ranks = replay::device_count();
    replay::CommunicatorGroup group = replay::CommunicatorGroup::first_devices(ranks);
    constexpr std::size_t n = 4096;
    std::vector<replay::Stream> streams;
    std::vector<replay::DeviceBuffer<float>> data;
    std::vector<float> sum(n, 0.0F);
    for (int r = 0; r < ranks; ++r) {
      replay::ScopedDevice on(group[static_cast<std::size_t>(r)].device());
      streams.emplace_back();
      data.emplace_back(n);
      const std::vector<float> in = replay_test::random_floats(n);
      for (std::size_t i = 0; i < n; ++i) {
        sum[i] += in[i];
      }
      data.back().copy_from(in, streams.back());
    }
    {
      replay::NcclGroup calls;
      for (std::size_t r = 0; r < group.size(); ++r) {
        replay::all_reduce(group[r], data[r].view(), replay::ReduceOp::sum, streams[r]);
      }
      calls.end();
    }
    for (std::size_t r = 0; r < group.size(); ++r) {
      CAPTURE(r);
      std::vector<float> out(n);
      data[r].copy_to(out, streams[r]);
      streams[r].synchronize();
      std::size_t bad = 0;
      for (std::size_t i = 0; i < n; ++i) {
        bad += std::fabs(out[i] - sum[i]) <= 1e-4F ? 0 : 1;
      }
      CHECK(bad == 0);
    }
  }

  TEST_CASE("ranks with different random batch sizes agree on the same bucket every step, and no step hangs") {
    const int ranks = replay::device_count();
    replay::CommunicatorGroup group = replay::CommunicatorGroup::first_devices(ranks);
    const int steps = replay_test::scaled(300, 10);
    std::vector<std::vector<int>> agreed(static_cast<std::size_t>(ranks));
    const std::vector<std::string> failures = on_each_rank(group, [&](std::size_t i, replay::Communicator& comm) {
      replay::Stream stream;
      replay::DeviceBuffer<float> x(64 * 128);
      replay::ShapeRouter<int> router(
          [&](int batch, replay::StreamRef s) {
            replay::all_reduce(comm, x.first(static_cast<std::size_t>(batch) * 128), replay::ReduceOp::sum, s);
          },
          [] {
            auto o = replay::ShapeRouterOptions<int>::bucketed({4, 16, 64});
            o.warmup_runs = 1;
            return o;
          }());
      replay::NcclAgreement agreement(comm, 30s);
      replay::ReplayWatchdog watchdog({.timeout = 20s, .poll_interval = 5ms, .on_stuck = {}});
      replay::MultiRankRouter<int> multi(router, agreement, &watchdog);
      x.zero(stream);
      multi.capture_all(stream);
      std::mt19937 engine(replay_test::case_seed_for(static_cast<std::uint64_t>(i)));
      std::uniform_int_distribution<int> batch(1, 64);
      for (int s = 0; s < steps; ++s) {
        agreed[i].push_back(multi.run(batch(engine), stream).agreed);
      }
      stream.synchronize();
    });
    for (int r = 0; r < ranks; ++r) {
      CAPTURE(r);
      CHECK(failures[static_cast<std::size_t>(r)].empty());
      CHECK(agreed[static_cast<std::size_t>(r)] == agreed[0]);
    }
    CHECK(agreed[0].size() == static_cast<std::size_t>(steps));
  }
}
