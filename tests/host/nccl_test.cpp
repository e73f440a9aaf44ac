// The NCCL component's policies on the CPU, with stand-ins: error messages,
// unique-id exchange through a file and the environment, bucket agreement
// between threads (HostAgreement) and through MultiRankRouter, and the
// watchdog's overdue policy on a stand-in clock. No NCCL communicator and no
// device are needed.
#include <doctest/doctest.h>

#include <replay/nccl.hpp>

#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gpu_suite.hpp"

namespace {

using namespace std::chrono_literals;

ncclUniqueId random_id() {
  ncclUniqueId id{};
  std::uniform_int_distribution<int> byte(0, 255);
  for (char& c : id.internal) {
    c = static_cast<char>(byte(replay_test::rng()));
  }
  return id;
}

bool same(const ncclUniqueId& a, const ncclUniqueId& b) {
  return std::equal(std::begin(a.internal), std::end(a.internal), std::begin(b.internal));
}

// A fresh folder per test, removed afterwards.
struct TempDir {
  std::filesystem::path path;
  TempDir() {
    path = std::filesystem::temp_directory_path() /
           ("replay-nccl-test-" + std::to_string(::getpid()) + "-" + std::to_string(replay_test::rng()()));
    std::filesystem::create_directories(path);
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path, ignored);
  }
};

// A stand-in for ShapeRouter: bucketed padding of an int key, and a log of
// what ran. stream_type is an int (no CUDA).
struct FakeRouter {
  using stream_type = int;
  struct Options {
    std::uint32_t warmup_runs = 1;
  };
  std::vector<std::int64_t> buckets{1, 2, 4, 8, 16, 32, 64};
  Options opts{};
  std::vector<int> ran;

  const Options& options() const { return opts; }
  int padded_shape(int key, std::source_location where = std::source_location::current()) const {
    if (key <= 0) {
      throw replay::usage_error("key must be positive", where);
    }
    for (std::int64_t b : buckets) {
      if (b >= key) {
        return static_cast<int>(b);
      }
    }
    return key;  // oversize: as given
  }
  replay::Route<int> run(int key, int /*stream*/, std::source_location /*where*/ = std::source_location::current()) {
    ran.push_back(key);
    return replay::Route<int>{key, replay::RouteKind::replayed};
  }
  std::size_t capture_all(int /*stream*/, std::source_location /*where*/ = std::source_location::current()) {
    return buckets.size();
  }
};

// A stand-in watchdog: records what it was asked to watch; can be told to
// report a stuck replay.
struct FakeMonitor {
  std::vector<std::string> watched;
  bool stuck = false;
  int rank = 0;
  void watch(int r, std::string what, int /*stream*/, std::source_location /*where*/) {
    CHECK(r == rank);
    watched.push_back(std::move(what));
  }
  void check_healthy(std::source_location where) const {
    if (stuck) {
      throw replay::timeout_error(replay::StuckWork{rank, 0, "replay of bucket 8", 1500ms}, "stand-in", where);
    }
  }
};

// A stand-in clock for WatchdogCore.
struct FakeClock {
  using duration = std::chrono::milliseconds;
  using rep = duration::rep;
  using period = duration::period;
  using time_point = std::chrono::time_point<FakeClock, duration>;
  static constexpr bool is_steady = true;
};

}  // namespace

TEST_SUITE("host") {
  TEST_CASE("nccl_error names the call, the result, NCCL's text and message, and the caller's line") {
    const auto where = std::source_location::current();
    const replay::nccl_error e(ncclInvalidArgument, "ncclCommInitRank", "Invalid rank requested : 5/1", where);
    const std::string what = e.what();
    CHECK(what.find("ncclCommInitRank failed") != std::string::npos);
    CHECK(what.find("ncclInvalidArgument (4)") != std::string::npos);
    CHECK(what.find(ncclGetErrorString(ncclInvalidArgument)) != std::string::npos);
    CHECK(what.find("Invalid rank requested : 5/1") != std::string::npos);
    CHECK(what.find("nccl_test.cpp:" + std::to_string(where.line())) != std::string::npos);
    CHECK(e.result() == ncclInvalidArgument);
    CHECK(e.api() == "ncclCommInitRank");
    CHECK(e.detail() == "Invalid rank requested : 5/1");

    CHECK(replay::nccl_result_name(ncclSuccess) == "ncclSuccess");
    CHECK(replay::nccl_result_name(static_cast<ncclResult_t>(8)) == "ncclTimeout");
    CHECK(replay::nccl_result_name(static_cast<ncclResult_t>(9)) == "ncclResult_t(unknown)");

    CHECK_NOTHROW(replay::check_nccl(ncclSuccess, "ncclGroupEnd"));
    try {
      replay::check_nccl(ncclSystemError, "ncclGroupEnd");
      FAIL("check_nccl did not throw");
    } catch (const replay::nccl_error& err) {
      CHECK(err.result() == ncclSystemError);
      CHECK(std::string(err.what()).find("ncclGroupEnd failed: ncclSystemError (2)") != std::string::npos);
      CHECK(std::string(err.what()).find("nccl_test.cpp") != std::string::npos);
    }
  }

  TEST_CASE("timeout_error says which rank, what and how long") {
    const replay::timeout_error e(replay::StuckWork{3, 1, "replay of bucket 16", 2500ms}, "abort it");
    const std::string what = e.what();
    CHECK(what.find("rank 3 (device 1): replay of bucket 16 has not finished after 2500 ms") != std::string::npos);
    CHECK(what.find("abort it") != std::string::npos);
    CHECK(e.stuck().rank == 3);
    CHECK(e.stuck().waited == 2500ms);
  }

  TEST_CASE("unique ids round-trip through hex; malformed hex is refused") {
    const ncclUniqueId id = random_id();
    const std::string hex = replay::to_hex(id);
    CHECK(hex.size() == 2 * sizeof(ncclUniqueId));
    CHECK(hex.find_first_not_of("0123456789abcdef") == std::string::npos);
    CHECK(same(replay::unique_id_from_hex(hex), id));
    CHECK(same(replay::unique_id_from_hex("  " + hex + "\n"), id));
    std::string upper = hex;
    std::transform(upper.begin(), upper.end(), upper.begin(), [](char c) { return static_cast<char>(std::toupper(c)); });
    CHECK(same(replay::unique_id_from_hex(upper), id));

    CHECK_THROWS_AS(replay::unique_id_from_hex(hex.substr(1)), replay::usage_error);
    std::string bad = hex;
    bad[17] = 'g';
    CHECK_THROWS_WITH_AS(replay::unique_id_from_hex(bad), doctest::Contains("'g'"), replay::usage_error);
  }

  TEST_CASE("unique id through a file: written atomically, read by a waiting reader, stale or missing ones refused") {
    TempDir dir;
    const auto path = dir.path / "id";
    const ncclUniqueId id = random_id();

    // The reader starts first and waits for the writer.
    ncclUniqueId got{};
    std::thread reader([&] { got = replay::read_unique_id_file(path, 3, 5000ms, 2ms); });
    std::this_thread::sleep_for(30ms);
    replay::write_unique_id_file(path, id, 3);
    reader.join();
    CHECK(same(got, id));
    // No temporary file is left behind.
    int files = 0;
    for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator(dir.path)) {
      ++files;
    }
    CHECK(files == 1);

    // Another job's file (other number of ranks) is refused, not used.
    CHECK_THROWS_WITH_AS(replay::read_unique_id_file(path, 2, 100ms), doctest::Contains("for 3 ranks"),
                         replay::usage_error);
    // A half-written file (no record yet) is waited on, then times out.
    { std::ofstream(dir.path / "partial") << "replay-nccl-unique-id v1 nr"; }
    CHECK_THROWS_AS(replay::read_unique_id_file(dir.path / "partial", 3, 40ms, 5ms), replay::bootstrap_error);

    const auto start = std::chrono::steady_clock::now();
    CHECK_THROWS_WITH_AS(replay::read_unique_id_file(dir.path / "missing", 2, 60ms, 5ms),
                         doctest::Contains("within 60 ms"), replay::bootstrap_error);
    CHECK(std::chrono::steady_clock::now() - start >= 60ms);

    CHECK_THROWS_AS(replay::write_unique_id_file(dir.path / "no-such-dir" / "id", id, 2), replay::bootstrap_error);
    CHECK_THROWS_AS(replay::write_unique_id_file(path, id, 0), replay::usage_error);
    CHECK_THROWS_AS(replay::exchange_unique_id(path, 2, 2, 10ms), replay::usage_error);
  }

  TEST_CASE("unique id through an environment variable") {
    const ncclUniqueId id = random_id();
    const char* name = "REPLAY_NCCL_TEST_UNIQUE_ID";
    REQUIRE(::setenv(name, replay::to_hex(id).c_str(), 1) == 0);
    CHECK(same(replay::unique_id_from_env(name), id));
    REQUIRE(::setenv(name, "abc", 1) == 0);
    CHECK_THROWS_AS(replay::unique_id_from_env(name), replay::usage_error);
    REQUIRE(::unsetenv(name) == 0);
    CHECK_THROWS_WITH_AS(replay::unique_id_from_env(name), doctest::Contains("REPLAY_NCCL_TEST_UNIQUE_ID is not set"),
                         replay::usage_error);
  }

  TEST_CASE("NVLink multicast is turned off unless the user set it") {
    const char* before = std::getenv("NCCL_NVLS_ENABLE");
    const std::string saved = before != nullptr ? before : "";
    REQUIRE(::unsetenv("NCCL_NVLS_ENABLE") == 0);
    CHECK(replay::keep_nvlink_multicast_off());
    REQUIRE(std::getenv("NCCL_NVLS_ENABLE") != nullptr);
    CHECK(std::string(std::getenv("NCCL_NVLS_ENABLE")) == "0");
    REQUIRE(::setenv("NCCL_NVLS_ENABLE", "1", 1) == 0);
    CHECK_FALSE(replay::keep_nvlink_multicast_off());  // an explicit setting is the user's
    CHECK(std::string(std::getenv("NCCL_NVLS_ENABLE")) == "1");
    REQUIRE(::setenv("NCCL_NVLS_ENABLE", "0", 1) == 0);
    CHECK(replay::keep_nvlink_multicast_off());
    if (before != nullptr) {
      ::setenv("NCCL_NVLS_ENABLE", saved.c_str(), 1);
    }
  }

  TEST_CASE("threads agree on one bucket every step: the maximum of their padded keys") {
    constexpr int ranks = 4;
    const int steps = 300;
    replay::HostAgreementGroup group(ranks, 5000ms);
    FakeRouter padding;
    // keys[step][rank], fresh random batch sizes.
    std::vector<std::array<int, ranks>> keys(static_cast<std::size_t>(steps));
    std::uniform_int_distribution<int> batch(1, 64);
    for (auto& row : keys) {
      for (int& k : row) {
        k = batch(replay_test::rng());
      }
    }
    std::vector<std::array<int, ranks>> agreed(static_cast<std::size_t>(steps));
    std::vector<std::thread> threads;
    for (int r = 0; r < ranks; ++r) {
      threads.emplace_back([&, r] {
        replay::HostAgreement agreement(group, r);
        for (int s = 0; s < steps; ++s) {
          const auto step = static_cast<std::size_t>(s);
          agreed[step][static_cast<std::size_t>(r)] =
              replay::agree_on_shape(padding, keys[step][static_cast<std::size_t>(r)], agreement, 0);
        }
      });
    }
    for (auto& t : threads) {
      t.join();
    }
    for (int s = 0; s < steps; ++s) {
      const auto step = static_cast<std::size_t>(s);
      int expected = 0;
      for (int k : keys[step]) {
        expected = std::max(expected, padding.padded_shape(k));
      }
      for (int r = 0; r < ranks; ++r) {
        CHECK(agreed[step][static_cast<std::size_t>(r)] == expected);
      }
      CHECK(std::find(padding.buckets.begin(), padding.buckets.end(), expected) != padding.buckets.end());
      CHECK(expected >= *std::max_element(keys[step].begin(), keys[step].end()));
    }
  }

  TEST_CASE("a rank whose key cannot be routed still takes part: every rank throws for that step, none hangs") {
    constexpr int ranks = 3;
    replay::HostAgreementGroup group(ranks, 5000ms);
    FakeRouter padding;
    std::array<std::string, ranks> errors;
    std::array<int, ranks> next{};
    std::vector<std::thread> threads;
    for (int r = 0; r < ranks; ++r) {
      threads.emplace_back([&, r] {
        replay::HostAgreement agreement(group, r);
        const auto i = static_cast<std::size_t>(r);
        try {
          (void)replay::agree_on_shape(padding, r == 1 ? 0 : 5, agreement, 0);  // rank 1: a zero key
          errors[i] = "no error";
        } catch (const replay::usage_error& e) {
          errors[i] = std::string("usage_error: ") + e.what();
        } catch (const replay::agreement_error& e) {
          errors[i] = "agreement_error " + std::to_string(e.failed_rank()) + ": " + e.what();
        }
        next[i] = replay::agree_on_shape(padding, 3 + r, agreement, 0);  // the next step works again
      });
    }
    for (auto& t : threads) {
      t.join();
    }
    CHECK(errors[1].rfind("usage_error", 0) == 0);
    CHECK(errors[0].rfind("agreement_error 1", 0) == 0);
    CHECK(errors[2].rfind("agreement_error 1", 0) == 0);
    CHECK(errors[0].find("rank 1 could not take part") != std::string::npos);
    CHECK(next == std::array<int, ranks>{8, 8, 8});
  }

  TEST_CASE("a thread that never joins the agreement: timeout_error, not a hang") {
    replay::HostAgreementGroup group(2, 50ms);
    replay::HostAgreement agreement(group, 0);
    FakeRouter padding;
    const auto start = std::chrono::steady_clock::now();
    CHECK_THROWS_WITH_AS((void)replay::agree_on_shape(padding, 3, agreement, 0),
                         doctest::Contains("rank 0 (device -1): bucket agreement between threads"),
                         replay::timeout_error);
    CHECK(std::chrono::steady_clock::now() - start >= 50ms);
    CHECK_THROWS_AS((void)replay::agree_on_shape(padding, 3, agreement, 0), replay::usage_error);  // broken now
    CHECK_THROWS_AS(replay::HostAgreement(group, 2), replay::usage_error);
  }

  TEST_CASE("MultiRankRouter: every rank runs the agreed bucket and watches it; a stuck rank stops the step everywhere") {
    constexpr int ranks = 2;
    replay::HostAgreementGroup group(ranks, 5000ms);
    std::array<FakeRouter, ranks> routers;
    std::array<FakeMonitor, ranks> monitors;
    monitors[1].rank = 1;
    std::array<std::vector<int>, ranks> agreed;
    std::array<std::string, ranks> stuck_step;
    std::vector<std::thread> threads;
    const std::array<std::array<int, 4>, ranks> keys{{{3, 9, 1, 33}, {5, 2, 17, 1}}};
    for (int r = 0; r < ranks; ++r) {
      threads.emplace_back([&, r] {
        const auto i = static_cast<std::size_t>(r);
        replay::HostAgreement agreement(group, r);
        replay::MultiRankRouter<int, FakeRouter, replay::HostAgreement, FakeMonitor> router(routers[i], agreement,
                                                                                          &monitors[i]);
        CHECK(router.rank() == r);
        CHECK(router.size() == ranks);
        CHECK(router.capture_all(0) == routers[i].buckets.size());
        for (int k : keys[i]) {
          const auto route = router.run(k, 0);
          agreed[i].push_back(route.agreed);
          CHECK(route.route.shape == route.agreed);
        }
        if (r == 1) {
          monitors[i].stuck = true;
        }
        try {
          (void)router.run(4, 0);
          stuck_step[i] = "ran";
        } catch (const replay::timeout_error&) {
          stuck_step[i] = "timeout_error";
        } catch (const replay::agreement_error& e) {
          stuck_step[i] = "agreement_error " + std::to_string(e.failed_rank());
        }
      });
    }
    for (auto& t : threads) {
      t.join();
    }
    CHECK(agreed[0] == std::vector<int>{8, 16, 32, 64});
    CHECK(agreed[1] == agreed[0]);
    for (std::size_t i = 0; i < ranks; ++i) {
      CHECK(routers[i].ran == agreed[0]);
      REQUIRE(monitors[i].watched.size() == 4);
      CHECK(monitors[i].watched[1].find("replay of bucket 16") != std::string::npos);
    }
    CHECK(stuck_step[1] == "timeout_error");
    CHECK(stuck_step[0] == "agreement_error 1");
  }

  TEST_CASE("MultiRankRouter refuses a router that captures without warming up") {
    replay::HostAgreementGroup group(1);
    replay::HostAgreement agreement(group, 0);
    FakeRouter router;
    router.opts.warmup_runs = 0;
    using R = replay::MultiRankRouter<int, FakeRouter, replay::HostAgreement, FakeMonitor>;
    CHECK_THROWS_WITH_AS(R(router, agreement), doctest::Contains("warmup_runs"), replay::usage_error);
  }

  TEST_CASE("watchdog policy: overdue work is reported once, with rank, bucket and wait; finished work is dropped") {
    using Core = replay::WatchdogCore<int, FakeClock>;
    Core core(100ms);
    const FakeClock::time_point t0{1000ms};
    std::vector<int> done_tokens;
    std::vector<int> recycled;
    auto done = [&](int token) { return std::find(done_tokens.begin(), done_tokens.end(), token) != done_tokens.end(); };
    auto recycle = [&](int token) { recycled.push_back(token); };

    core.add(1, 0, 0, "replay of bucket 8", t0);
    core.add(2, 0, 0, "replay of bucket 16", t0 + 30ms);
    CHECK(core.pending() == 2);
    CHECK(core.poll(t0 + 99ms, done, recycle).empty());
    CHECK_FALSE(core.stuck(t0 + 99ms).has_value());

    auto overdue = core.poll(t0 + 100ms, done, recycle);
    REQUIRE(overdue.size() == 1);
    CHECK(overdue[0].what == "replay of bucket 8");
    CHECK(overdue[0].rank == 0);
    CHECK(overdue[0].waited == 100ms);
    CHECK(core.poll(t0 + 120ms, done, recycle).empty());  // reported once
    REQUIRE(core.stuck(t0 + 125ms).has_value());
    CHECK(core.stuck(t0 + 125ms)->waited == 125ms);

    done_tokens.push_back(2);  // the newer one finishes before its timeout: never reported
    CHECK(core.poll(t0 + 200ms, done, recycle).empty());
    CHECK(recycled == std::vector<int>{2});
    CHECK(core.pending() == 1);

    done_tokens.push_back(1);  // the stuck one finishes late: no longer stuck
    CHECK(core.poll(t0 + 5000ms, done, recycle).empty());
    CHECK_FALSE(core.stuck(t0 + 5000ms).has_value());
    CHECK(core.pending() == 0);
    CHECK(recycled == std::vector<int>{2, 1});
  }

  TEST_CASE("the element types map to NCCL's data types") {
    static_assert(replay::nccl_data_type_v<float> == ncclFloat32);
    static_assert(replay::nccl_data_type_v<double> == ncclFloat64);
    static_assert(replay::nccl_data_type_v<std::int32_t> == ncclInt32);
    static_assert(replay::nccl_data_type_v<std::uint8_t> == ncclUint8);
    static_assert(replay::nccl_data_type_v<std::int64_t> == ncclInt64);
    static_assert(replay::nccl_data_type_v<long long> == ncclInt64);
    static_assert(replay::nccl_data_type_v<unsigned long long> == ncclUint64);
    static_assert(replay::nccl_data_type_v<__half> == ncclFloat16);
    static_assert(replay::nccl_data_type_v<__nv_bfloat16> == ncclBfloat16);
    static_assert(!replay::NcclElement<bool>);
    static_assert(!replay::NcclElement<std::array<float, 2>>);
    CHECK(static_cast<int>(replay::ReduceOp::max) == static_cast<int>(ncclMax));
  }
}
