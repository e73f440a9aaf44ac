// ShapeRouter policy logic on the CPU, with a stand-in backend: a "stream"
// either executes operations (eager) or records them (capture), and a
// "graph" replays what was recorded. Every policy path, bad input, and
// several threads hammering one router.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <future>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <mutex>
#include <new>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "gpu_suite.hpp"
#include "replay/shape_router.hpp"
#include "replaced_allocation.hpp"

// Counts operator new calls on this thread, to prove the hit path allocates
// nothing (also used by tests/gpu/shape_router_test.cu).
namespace {
thread_local std::size_t g_allocations = 0;
}
std::size_t shape_router_test_allocations() { return g_allocations; }
void replay_test::before_each_allocation() { ++g_allocations; }

namespace {

// ---- the stand-in backend -------------------------------------------------

// Streams destroyed so far (addresses are forgotten when reused): the
// router must never touch a stream after the run on it returned.
std::mutex g_streams_mutex;
std::set<const void*> g_destroyed_streams;

struct FakeStream {
  FakeStream() {
    const std::lock_guard<std::mutex> lock(g_streams_mutex);
    g_destroyed_streams.erase(this);
  }
  FakeStream(const FakeStream&) = delete;
  FakeStream& operator=(const FakeStream&) = delete;
  ~FakeStream() {
    const std::lock_guard<std::mutex> lock(g_streams_mutex);
    g_destroyed_streams.insert(this);
  }
  static bool destroyed(const FakeStream* s) {
    const std::lock_guard<std::mutex> lock(g_streams_mutex);
    return g_destroyed_streams.count(s) != 0;
  }
  std::vector<std::string> executed;            // what "ran", in order
  std::vector<std::string>* recording = nullptr;  // set while capturing
  std::vector<std::string>* regions = nullptr;    // set while a piecewise capture or executable runs
  bool capturing_pieces = false;                  // a piecewise capture: a sync breaks its segment
  bool invalidated = false;                       // a sync happened during capture

  void issue(std::string op) {
    if (recording != nullptr) {
      recording->push_back(std::move(op));
    } else {
      executed.push_back(std::move(op));
    }
  }
  // Like cudaStreamSynchronize: fine eagerly, breaks a capture (without throwing).
  void sync() {
    if (recording != nullptr || capturing_pieces) {
      invalidated = true;
    } else {
      executed.push_back("sync");
    }
  }
};

struct FakeExec {
  std::vector<std::string> ops;
  int id = 0;
  // Set when this executable graph is destroyed (shared with launches in flight).
  std::shared_ptr<std::atomic<bool>> gone = std::make_shared<std::atomic<bool>>(false);
  FakeExec() = default;
  FakeExec(std::vector<std::string> o, int i) : ops(std::move(o)), id(i) {}
  FakeExec(FakeExec&&) noexcept = default;
  FakeExec& operator=(FakeExec&& other) noexcept {
    if (this != &other) {
      if (gone) {
        *gone = true;
      }
      ops = std::move(other.ops);
      id = other.id;
      gone = std::move(other.gone);
    }
    return *this;
  }
  ~FakeExec() {
    if (gone) {
      *gone = true;
    }
  }
};

struct FakeBackend {
  using stream_type = FakeStream*;
  using exec_type = FakeExec;

  FakeBackend() = default;
  FakeBackend(const FakeBackend& other)
      : footprint_per_op(other.footprint_per_op),
        capture_log(other.capture_log),
        next_id(other.next_id.load()),
        launches(other.launches.load()),
        refuse_updates(other.refuse_updates) {}

  std::size_t footprint_per_op = 0;      // GraphMemory::footprint_bytes = ops * this
  std::vector<std::string> capture_log;  // first op of each capture, in order
  std::mutex log_mutex;                  // captures run concurrently, outside the router's lock
  std::atomic<int> next_id{0};
  std::atomic<int> launches{0};
  std::atomic<int> orderings{0};  // wait_mark and drain calls (a run on another stream than the previous)
  std::atomic<int> marks{0};
  std::atomic<int> drains{0};
  std::atomic<int> destroyed_touched{0};  // calls on a stream already destroyed (must stay 0)
  bool refuse_updates = false;

  void touch(const FakeStream* s) {
    if (FakeStream::destroyed(s)) {
      ++destroyed_touched;
    }
  }
  // Stream ordering: the stand-in streams need no device ordering; counted.
  void mark(FakeStream* s, std::source_location) {
    touch(s);
    ++marks;
  }
  void wait_mark(FakeStream* s, std::source_location) {
    touch(s);
    ++orderings;
  }
  void drain(FakeStream* s, std::source_location) {
    touch(s);
    ++orderings;
    ++drains;
  }

  std::vector<std::string> record(FakeStream* s, auto& issue) {
    std::vector<std::string> ops;
    s->recording = &ops;
    s->invalidated = false;
    try {
      issue(s);
    } catch (...) {
      s->recording = nullptr;
      throw;
    }
    s->recording = nullptr;
    if (s->invalidated) {
      throw std::runtime_error("fake capture invalidated by sync");
    }
    const std::lock_guard<std::mutex> lock(log_mutex);
    capture_log.push_back(ops.empty() ? std::string() : ops.front());
    return ops;
  }
  replay::GraphMemory memory_of(const std::vector<std::string>& ops) const {
    return replay::GraphMemory{ops.size() * 1000, ops.size() * footprint_per_op};
  }

  template <class Issue>
  replay::CapturedGraph<FakeExec> capture(FakeStream* s, Issue&& issue, std::source_location) {
    auto ops = record(s, issue);
    const auto memory = memory_of(ops);
    return {FakeExec{std::move(ops), next_id++}, memory};
  }
  template <class Issue>
  replay::RecaptureResult recapture(FakeExec& exec, FakeStream* s, Issue&& issue, std::source_location) {
    auto ops = record(s, issue);
    replay::RecaptureResult result;
    result.memory = memory_of(ops);
    if (!refuse_updates && ops.size() == exec.ops.size()) {  // "same topology": update in place
      exec.ops = std::move(ops);
      result.path = replay::UpdatePath::in_place;
    } else {
      exec = FakeExec{std::move(ops), next_id++};
      result.path = replay::UpdatePath::reinstantiated;
    }
    return result;
  }
  void launch(const FakeExec& exec, FakeStream* s, std::source_location) {
    touch(s);
    ++launches;
    for (const auto& op : exec.ops) {
      s->executed.push_back(op);
    }
  }
};

// Reports a (fake) device pool too.
struct FakePoolBackend : FakeBackend {
  replay::GraphPoolMemory pool_memory(std::source_location) const { return {1, 2, 3, 4}; }
};

static_assert(replay::GraphBackend<FakeBackend>);
static_assert(!replay::ReportsPoolMemory<FakeBackend>);
static_assert(replay::ReportsPoolMemory<FakePoolBackend>);
static_assert(replay::GraphBackend<replay::CudaGraphBackend>);

// ---- keys -------------------------------------------------------------------

struct Hashed {  // user type with std::hash
  int a;
  bool operator==(const Hashed&) const = default;
};
struct Ordered {  // user type with ordering only
  int a;
  auto operator<=>(const Ordered&) const = default;
};
struct Opaque {  // neither
  int a;
  bool operator==(const Opaque&) const = default;
};
struct Dims {  // user shape type, made bucketable by shape_traits below
  std::int32_t rows;
  std::int32_t cols;
  bool operator==(const Dims&) const = default;
};

}  // namespace

template <>
struct std::hash<Hashed> {
  std::size_t operator()(const Hashed& h) const noexcept { return std::hash<int>{}(h.a); }
};
template <>
struct replay::shape_traits<Dims> {
  static constexpr std::size_t rank = 2;
  static std::int64_t extent(const Dims& d, std::size_t dim) { return dim == 0 ? d.rows : d.cols; }
  static void set_extent(Dims& d, std::size_t dim, std::int64_t v) {
    (dim == 0 ? d.rows : d.cols) = static_cast<std::int32_t>(v);
  }
};

static_assert(replay::RouterKey<int>);
static_assert(replay::RouterKey<std::int64_t>);
static_assert(replay::RouterKey<std::tuple<int, long>>);
static_assert(replay::RouterKey<std::array<int, 3>>);
static_assert(replay::RouterKey<std::pair<int, int>>);
static_assert(replay::RouterKey<Hashed>);
static_assert(replay::RouterKey<Ordered>);
static_assert(!replay::RouterKey<Opaque>);
static_assert(replay::RouterKey<Dims>);
static_assert(replay::ShapeKey<int> && replay::ShapeKey<std::tuple<int, short>> && replay::ShapeKey<Dims>);
static_assert(!replay::ShapeKey<Hashed> && !replay::ShapeKey<Ordered> && !replay::ShapeKey<bool>);
static_assert(replay::HashableKey<std::tuple<int, int>> && !replay::HashableKey<Ordered>);

namespace {

template <class Key>
using Router = replay::ShapeRouter<Key, FakeBackend>;
using Options = replay::ShapeRouterOptions<int>;

// `options` with StreamSharing::caller_ordered: for the tests of how the
// router orders its own work across streams, used outside leases.
Options caller_ordered(Options options = {}) {
  options.stream_sharing = replay::StreamSharing::caller_ordered;
  return options;
}

// "<prefix><n>", built by appending (GCC 12 misreports "literal" + std::string under -Wrestrict).
std::string op(const char* prefix, int n) {
  std::string out = prefix;
  out += std::to_string(n);
  return out;
}

// Work for key n: "k<n>" then n-1 more ops (so ops count = n).
void work_ops(int n, FakeStream* s) {
  s->issue(op("k", n));
  for (int i = 1; i < n; ++i) {
    s->issue(op("k", n) + op(".", i));
  }
}
std::vector<std::string> eager_ops(int n) {
  FakeStream s;
  work_ops(n, &s);
  return s.executed;
}

int round_up(int n, const std::vector<std::int64_t>& buckets) {
  for (auto b : buckets) {
    if (b >= n) {
      return static_cast<int>(b);
    }
  }
  return n;
}

}  // namespace

TEST_SUITE("host") {
  TEST_CASE("shape_traits read and write every built-in key kind") {
    std::tuple<int, short, long> t{3, 4, 5};
    CHECK(replay::shape_traits<decltype(t)>::extent(t, 1) == 4);
    replay::shape_traits<decltype(t)>::set_extent(t, 2, 99);
    CHECK(std::get<2>(t) == 99);
    CHECK(replay::shape_traits<decltype(t)>::max_extent(1) == 32767);
    std::array<unsigned, 2> a{7, 8};
    replay::shape_traits<decltype(a)>::set_extent(a, 0, 1);
    CHECK(a[0] == 1);
    std::pair<int, int> p{2, 9};
    CHECK(replay::shape_traits<decltype(p)>::extent(p, 1) == 9);
    const std::uint64_t huge = ~0ULL;
    CHECK(replay::shape_traits<std::uint64_t>::extent(huge, 0) == INT64_MAX);  // saturates, never negative
    CHECK(replay::key_hash<std::tuple<int, int>>{}({1, 2}) != replay::key_hash<std::tuple<int, int>>{}({2, 1}));
  }

  TEST_CASE("bucket list helpers") {
    CHECK(replay::power_of_two_buckets(64) == std::vector<std::int64_t>{1, 2, 4, 8, 16, 32, 64});
    CHECK(replay::power_of_two_buckets(5) == std::vector<std::int64_t>{1, 2, 4, 8});
    CHECK(replay::stepped_buckets(8, 20) == std::vector<std::int64_t>{8, 16, 24});
    CHECK_THROWS_AS((void)replay::power_of_two_buckets(0), replay::usage_error);
    CHECK_THROWS_AS((void)replay::stepped_buckets(0, 8), replay::usage_error);
  }

  TEST_CASE("exact: one graph per distinct key, replays equal eager runs") {
    Router<int> router(work_ops);
    FakeStream s;
    std::vector<std::string> expected;
    std::set<int> seen;
    std::uniform_int_distribution<int> dist(1, 9);
    std::mt19937 rng{replay_test::case_seed_for(0)};
    for (int i = 0; i < 300; ++i) {
      const int n = dist(rng);
      const auto route = router.run(n, &s);
      CHECK(route.shape == n);
      CHECK(route.graph());
      CHECK(route.kind == (seen.insert(n).second ? replay::RouteKind::captured : replay::RouteKind::replayed));
      const auto ops = eager_ops(n);
      expected.insert(expected.end(), ops.begin(), ops.end());
    }
    CHECK(s.executed == expected);
    const auto stats = router.stats();
    CHECK(stats.runs == 300);
    CHECK(stats.captures == seen.size());
    CHECK(stats.misses == seen.size());
    CHECK(stats.hits == 300 - seen.size());
    CHECK(stats.padding_waste() == 0.0);
    CHECK(router.graph_count() == seen.size());
    CHECK(router.backend().launches == 300);
    CHECK_FALSE(router.memory().pool.has_value());
  }

  TEST_CASE("exact policy works with hashed and ordered user keys") {
    FakeStream s;
    replay::ShapeRouter<Hashed, FakeBackend> hashed([](const Hashed& h, FakeStream* st) { st->issue(std::to_string(h.a)); });
    replay::ShapeRouter<Ordered, FakeBackend> ordered([](const Ordered& o, FakeStream* st) { st->issue(std::to_string(o.a)); });
    for (int i = 0; i < 10; ++i) {
      (void)hashed.run(Hashed{i % 3}, &s);
      (void)ordered.run(Ordered{i % 4}, &s);
    }
    CHECK(hashed.graph_count() == 3);
    CHECK(ordered.graph_count() == 4);
    CHECK(hashed.stats().hits == 7);
    CHECK(ordered.stats().hits == 6);
    CHECK(s.executed.size() == 20);
    // Non-shape keys: no extents to check, no padding.
    CHECK(hashed.padded_shape(Hashed{-5}) == Hashed{-5});
  }

  TEST_CASE("bucketed: keys round up, the router tells the padded shape, padding waste is counted") {
    const std::vector<std::int64_t> buckets{1, 2, 4, 8, 16, 32, 64};
    Router<int> router(work_ops, Options::bucketed(buckets));
    CHECK(router.policy() == replay::RoutingPolicy::bucketed);
    CHECK(router.padded_shape(1) == 1);
    CHECK(router.padded_shape(3) == 4);
    CHECK(router.padded_shape(33) == 64);
    CHECK(router.padded_shape(64) == 64);
    FakeStream s;
    std::vector<std::string> expected;
    std::uint64_t real = 0;
    std::uint64_t padded = 0;
    std::set<int> buckets_seen;
    std::mt19937 rng{replay_test::case_seed_for(0)};
    std::uniform_int_distribution<int> dist(1, 64);
    for (int i = 0; i < 500; ++i) {
      const int n = dist(rng);
      const int p = round_up(n, buckets);
      CHECK(router.padded_shape(n) == p);
      const auto route = router.run(n, &s);
      REQUIRE(route.shape == p);
      buckets_seen.insert(p);
      real += static_cast<std::uint64_t>(n);
      padded += static_cast<std::uint64_t>(p);
      const auto ops = eager_ops(p);
      expected.insert(expected.end(), ops.begin(), ops.end());
    }
    CHECK(s.executed == expected);
    const auto stats = router.stats();
    CHECK(stats.real_elements == real);
    CHECK(stats.padded_elements == padded);
    CHECK(stats.padding_waste() == doctest::Approx(static_cast<double>(padded - real) / static_cast<double>(real)));
    CHECK(stats.padding_waste() > 0.0);
    CHECK(router.graph_count() == buckets_seen.size());
    CHECK(stats.captures == buckets_seen.size());
  }

  TEST_CASE("bucketed tuples: one list per dimension, or one list for all") {
    using Key = std::tuple<int, int>;
    std::vector<Key> shapes_run;
    auto work = [&](const Key& k, FakeStream* s) {
      shapes_run.push_back(k);
      s->issue("x");
    };
    Router<Key> per_dim(work, replay::ShapeRouterOptions<Key>::bucketed_per_dimension({{1, 8, 64}, {128, 256}}));
    CHECK(per_dim.padded_shape({5, 100}) == Key{8, 128});
    CHECK(per_dim.padded_shape({64, 129}) == Key{64, 256});
    CHECK(per_dim.padded_shape({1, 1}) == Key{1, 128});
    Router<Key> shared(work, replay::ShapeRouterOptions<Key>::bucketed({4, 16}));
    CHECK(shared.padded_shape({3, 5}) == Key{4, 16});
    // A user shape type is bucketable through shape_traits; element counts are products.
    Router<Dims> dims([](const Dims&, FakeStream* s) { s->issue("d"); },
                      replay::ShapeRouterOptions<Dims>::bucketed_per_dimension({{2, 4}, {10}}));
    FakeStream s;
    CHECK(dims.run(Dims{3, 7}, &s).shape == Dims{4, 10});
    CHECK(dims.stats().real_elements == 21);
    CHECK(dims.stats().padded_elements == 40);
    // The work sees padded shapes only.
    (void)per_dim.run({5, 100}, &s);
    REQUIRE(shapes_run.size() == 1);
    CHECK(shapes_run[0] == Key{8, 128});
  }

  TEST_CASE("keys above the largest bucket run eagerly or throw, as configured") {
    FakeStream s;
    auto options = Options::bucketed({1, 2, 4});
    Router<int> eager(work_ops, options);
    CHECK(eager.is_oversize(5));
    CHECK_FALSE(eager.is_oversize(4));
    CHECK(eager.padded_shape(5) == 5);
    const auto route = eager.run(5, &s);
    CHECK(route.kind == replay::RouteKind::eager_oversize);
    CHECK_FALSE(route.graph());
    CHECK(route.shape == 5);
    CHECK(s.executed == eager_ops(5));  // the work ran with the real key
    CHECK(eager.graph_count() == 0);
    CHECK(eager.stats().oversize == 1);
    CHECK(eager.stats().misses == 1);
    CHECK(eager.capture({5, 3}, &s) == 1);  // oversize keys are skipped, 3 -> 4 captured
    CHECK(eager.contains(3));

    options.oversize = replay::OversizePolicy::throw_error;
    Router<int> strict(work_ops, options);
    CHECK_THROWS_WITH_AS((void)strict.run(5, &s), doctest::Contains("above the largest bucket (4)"),
                         replay::usage_error);
    CHECK_THROWS_AS((void)strict.padded_shape(1000), replay::usage_error);
    CHECK(strict.stats().runs == 0);

    using Key = std::tuple<int, int>;
    Router<Key> tuple_strict([](const Key&, FakeStream*) {},
                             {.policy = replay::RoutingPolicy::bucketed,
                              .buckets = {{1, 2}, {8}},
                              .oversize = replay::OversizePolicy::throw_error});
    CHECK_THROWS_WITH_AS((void)tuple_strict.run({2, 9}, &s), doctest::Contains("dimension 1"), replay::usage_error);
  }

  TEST_CASE("bad input gives a clear usage_error") {
    auto noop = [](int, FakeStream*) {};
    auto make = [&](Options o) { Router<int> r(noop, std::move(o)); };
    CHECK_THROWS_WITH_AS(make(Options::bucketed({})), doctest::Contains("is empty"), replay::usage_error);
    CHECK_THROWS_WITH_AS(make(Options::bucketed({4, 2, 8})), doctest::Contains("not sorted"), replay::usage_error);
    CHECK_THROWS_WITH_AS(make(Options::bucketed({1, 2, 2, 4})), doctest::Contains("twice"), replay::usage_error);
    CHECK_THROWS_WITH_AS(make(Options::bucketed({0, 2})), doctest::Contains("positive"), replay::usage_error);
    CHECK_THROWS_WITH_AS(make(Options::bucketed({-4, 2})), doctest::Contains("positive"), replay::usage_error);
    CHECK_THROWS_WITH_AS(make({.policy = replay::RoutingPolicy::bucketed}), doctest::Contains("no bucket list"),
                         replay::usage_error);
    CHECK_THROWS_WITH_AS(make({.buckets = {{1, 2}}}), doctest::Contains("policy is RoutingPolicy::exact"),
                         replay::usage_error);
    CHECK_THROWS_WITH_AS(make({.max_graphs = 0}), doctest::Contains("max_graphs is 0"), replay::usage_error);
    CHECK_THROWS_WITH_AS(make({.max_bytes = 0}), doctest::Contains("max_bytes is 0"), replay::usage_error);
    CHECK_THROWS_WITH_AS((Router<int>(nullptr)), doctest::Contains("work callable is empty"), replay::usage_error);

    using Key = std::tuple<int, int>;
    auto tnoop = [](const Key&, FakeStream*) {};
    CHECK_THROWS_WITH_AS((Router<Key>(tnoop, replay::ShapeRouterOptions<Key>::bucketed_per_dimension({{1}, {1}, {1}}))),
                         doctest::Contains("3 bucket lists for a key of rank 2"), replay::usage_error);
    CHECK_THROWS_WITH_AS((Router<Key>(tnoop, replay::ShapeRouterOptions<Key>::bucketed_per_dimension({{1, 2}, {}}))),
                         doctest::Contains("dimension 1 is empty"), replay::usage_error);
    CHECK_THROWS_WITH_AS((Router<std::int8_t>([](std::int8_t, FakeStream*) {},
                                              replay::ShapeRouterOptions<std::int8_t>::bucketed({64, 300}))),
                         doctest::Contains("does not fit"), replay::usage_error);
    CHECK_THROWS_WITH_AS((Router<Hashed>([](const Hashed&, FakeStream*) {},
                                         {.policy = replay::RoutingPolicy::bucketed, .buckets = {{1}}})),
                         doctest::Contains("needs a shape key"), replay::usage_error);

    Router<int> exact(noop);
    Router<int> bucketed(noop, Options::bucketed({1, 2}));
    FakeStream s;
    for (Router<int>* r : {&exact, &bucketed}) {
      CHECK_THROWS_WITH_AS((void)r->run(0, &s), doctest::Contains("zero dimension"), replay::usage_error);
      CHECK_THROWS_WITH_AS((void)r->run(-3, &s), doctest::Contains("negative dimension"), replay::usage_error);
      CHECK_THROWS_AS((void)r->padded_shape(0), replay::usage_error);
      CHECK(r->stats().runs == 0);
    }
    Router<Key> tuples(tnoop);
    CHECK_THROWS_WITH_AS((void)tuples.run({4, 0}, &s), doctest::Contains("(4, 0)"), replay::usage_error);
    CHECK_THROWS_WITH_AS((void)exact.capture_all(&s), doctest::Contains("RoutingPolicy::bucketed"), replay::usage_error);
  }

  TEST_CASE("lazy capture after N eager warm-ups") {
    Router<int> router(work_ops, {.warmup_runs = 2});
    FakeStream s;
    CHECK(router.run(3, &s).kind == replay::RouteKind::warmup);
    CHECK(router.run(3, &s).kind == replay::RouteKind::warmup);
    CHECK_FALSE(router.contains(3));
    CHECK(router.run(3, &s).kind == replay::RouteKind::captured);
    CHECK(router.contains(3));
    CHECK(router.run(3, &s).kind == replay::RouteKind::replayed);
    std::vector<std::string> expected;
    for (int i = 0; i < 4; ++i) {
      const auto ops = eager_ops(3);
      expected.insert(expected.end(), ops.begin(), ops.end());
    }
    CHECK(s.executed == expected);
    const auto stats = router.stats();
    CHECK(stats.warmups == 2);
    CHECK(stats.misses == 3);
    CHECK(stats.hits == 1);
    CHECK(stats.captures == 1);
  }

  TEST_CASE("capture_all: largest first, then every in-range key is a hit") {
    using Key = std::tuple<int, int>;
    int eager_runs = 0;
    FakeStream s;
    Router<Key> router(
        [&](const Key& k, FakeStream* st) {
          if (st->recording == nullptr) {
            ++eager_runs;
          }
          st->issue(op("", std::get<0>(k)) + op("x", std::get<1>(k)));
        },
        {.policy = replay::RoutingPolicy::bucketed, .buckets = {{1, 2, 4}, {8, 16}}, .warmup_runs = 1});
    const auto shapes = router.bucket_shapes();
    REQUIRE(shapes.size() == 6);
    CHECK(shapes.front() == Key{4, 16});
    CHECK(shapes.back() == Key{1, 8});
    CHECK(router.capture_all(&s) == 6);
    CHECK(eager_runs == 6);  // one warm-up each
    const std::vector<std::string> order{"4x16", "4x8", "2x16", "2x8", "1x16", "1x8"};
    CHECK(router.backend().capture_log == order);  // 4x8 and 2x16 tie on elements: larger first dimension first
    CHECK(router.capture_all(&s) == 6);  // idempotent
    CHECK(router.stats().captures == 6);
    std::mt19937 rng{replay_test::case_seed_for(0)};
    for (int i = 0; i < 100; ++i) {
      const Key k{std::uniform_int_distribution<int>(1, 4)(rng), std::uniform_int_distribution<int>(1, 16)(rng)};
      CHECK(router.run(k, &s).kind == replay::RouteKind::replayed);
    }
    CHECK(router.stats().hits == 100);

    // With a graph limit, capture_all keeps the largest shapes.
    Router<int> limited(work_ops, {.policy = replay::RoutingPolicy::bucketed, .buckets = {{1, 2, 3, 4, 5}}, .max_graphs = 2});
    CHECK(limited.capture_all(&s) == 2);
    CHECK(limited.contains(5));
    CHECK(limited.contains(4));
    CHECK_FALSE(limited.contains(3));
    CHECK(limited.stats().evictions == 0);
  }

  TEST_CASE("LRU eviction by graph count; evicted keys re-capture without warm-up") {
    Router<int> router(work_ops, {.warmup_runs = 1, .max_graphs = 2});
    FakeStream s;
    for (int k : {1, 2, 3}) {
      (void)router.run(k, &s);  // warm-up
      (void)router.run(k, &s);  // capture
    }
    // 1 was least recently used when 3 arrived.
    CHECK(router.graph_count() == 2);
    CHECK_FALSE(router.contains(1));
    CHECK(router.contains(2));
    CHECK(router.contains(3));
    CHECK(router.stats().evictions == 1);
    CHECK(router.run(2, &s).kind == replay::RouteKind::replayed);  // 2 is now most recent
    CHECK(router.run(1, &s).kind == replay::RouteKind::captured);  // no second warm-up
    CHECK_FALSE(router.contains(3));                               // 3 was the LRU
    CHECK(router.stats().evictions == 2);
    const auto graphs = router.graphs();
    REQUIRE(graphs.size() == 2);
    CHECK(graphs[0].shape == 1);  // most recent first
    CHECK(graphs[1].shape == 2);
    CHECK(graphs[0].replays == 1);
    CHECK(router.evict(1));
    CHECK_FALSE(router.evict(1));
    CHECK(router.graph_count() == 1);
    CHECK(router.stats().evictions == 3);
  }

  TEST_CASE("LRU eviction by bytes; memory() sums the live graphs") {
    FakeBackend backend;
    backend.footprint_per_op = 100;  // key n costs 100 * n bytes
    Router<int> router(work_ops, {.max_bytes = 1000}, backend);
    FakeStream s;
    for (int k : {4, 3, 2}) {
      (void)router.run(k, &s);
    }
    auto memory = router.memory();
    CHECK(memory.graphs == 3);
    CHECK(memory.footprint_bytes == 900);
    CHECK(memory.alloc_bytes_sum == 9000);
    CHECK(memory.alloc_bytes_max == 4000);
    (void)router.run(5, &s);  // 1400 > 1000: evict 4 (LRU) -> 1000
    CHECK_FALSE(router.contains(4));
    CHECK(router.memory().footprint_bytes == 1000);
    (void)router.run(3, &s);  // touch 3
    (void)router.run(6, &s);  // 1600: evict 2 (LRU), then 5 -> 900
    CHECK_FALSE(router.contains(2));
    CHECK_FALSE(router.contains(5));
    CHECK(router.contains(3));
    CHECK(router.contains(6));
    CHECK(router.memory().footprint_bytes == 900);
    CHECK(router.stats().evictions == 3);
    (void)router.run(11, &s);  // alone above the limit: kept, everything else goes
    CHECK(router.graph_count() == 1);
    CHECK(router.contains(11));
    // A backend that reports the device pool.
    replay::ShapeRouter<int, FakePoolBackend> pooled(work_ops);
    (void)pooled.run(2, &s);
    REQUIRE(pooled.memory().pool.has_value());
    CHECK(pooled.memory().pool->reserved_high == 4);
  }

  TEST_CASE("a failed capture marks the key eager, logs once, never throws, and the output is right") {
    std::vector<std::pair<int, std::string>> logged;
    auto work = [](int n, FakeStream* s) {
      s->issue(op("k", n));
      if (n == 13) {
        s->sync();  // breaks a capture, fine eagerly
      }
    };
    Router<int> router(work, {.on_capture_failure = [&](const int& k, std::string_view why) {
                                logged.emplace_back(k, std::string(why));
                              }});
    FakeStream s;
    for (int i = 0; i < 5; ++i) {
      const auto route = router.run(13, &s);
      CHECK(route.kind == replay::RouteKind::eager_fallback);
      CHECK_FALSE(route.graph());
      CHECK(router.run(7, &s).graph());
    }
    REQUIRE(logged.size() == 1);
    CHECK(logged[0].first == 13);
    CHECK(logged[0].second.find("invalidated by sync") != std::string::npos);
    CHECK(router.is_eager(13));
    CHECK_FALSE(router.contains(13));
    std::vector<std::string> expected;
    for (int i = 0; i < 5; ++i) {
      for (const char* op : {"k13", "sync", "k7"}) {
        expected.emplace_back(op);
      }
    }
    CHECK(s.executed == expected);
    auto stats = router.stats();
    CHECK(stats.capture_failures == 1);
    CHECK(stats.eager_fallbacks == 5);
    CHECK(stats.misses == 6);  // 5 eager runs of 13, the capture of 7
    CHECK(stats.hits == 4);

    // invalidate() gives an eager key another chance (and it fails, and logs, again).
    CHECK(router.invalidate(13));
    CHECK(router.run(13, &s).kind == replay::RouteKind::eager_fallback);
    CHECK(logged.size() == 2);
  }

  TEST_CASE("capture failures from a throwing work or a throwing handler never escape") {
    bool throw_in_capture = true;
    auto work = [&](int n, FakeStream* s) {
      if (s->recording != nullptr && throw_in_capture) {
        throw std::runtime_error("cannot capture this");
      }
      s->issue(op("k", n));
    };
    Router<int> router(work, {.on_capture_failure = [](const int&, std::string_view) {
                                throw std::logic_error("logger broke");
                              }});
    FakeStream s;
    const auto route = router.run(4, &s);
    CHECK(route.kind == replay::RouteKind::eager_fallback);
    CHECK(s.executed == std::vector<std::string>{"k4"});
    CHECK(router.stats().capture_failures == 1);
    // The default handler (stderr) is used when none is set.
    Router<int> quiet(work);
    CHECK_NOTHROW((void)quiet.run(2, &s));
    CHECK(quiet.is_eager(2));
    // An error of the work itself when run eagerly does propagate.
    Router<int> broken([](int, FakeStream*) { throw std::domain_error("bad model"); });
    CHECK_THROWS_AS((void)broken.run(1, &s), std::domain_error);
    CHECK(broken.is_eager(1));
  }

  TEST_CASE("invalidated graphs re-capture through update in place, or re-instantiate") {
    int version = 0;
    int length = 2;
    auto work = [&](int n, FakeStream* s) {
      for (int i = 0; i < length; ++i) {
        s->issue(op("v", version) + op("k", n));
      }
    };
    Router<int> router(work);
    FakeStream s;
    (void)router.run(1, &s);
    (void)router.run(2, &s);
    const int id_before = router.backend().next_id;
    version = 1;  // "pointers changed"
    router.invalidate_all();
    CHECK(router.graphs()[0].stale);
    s.executed.clear();
    CHECK(router.run(1, &s).kind == replay::RouteKind::recaptured);
    CHECK(s.executed == std::vector<std::string>{"v1k1", "v1k1"});
    CHECK(router.run(1, &s).kind == replay::RouteKind::replayed);
    CHECK(router.backend().next_id == id_before);  // in place: no new executable
    CHECK(router.stats().updates == 1);
    length = 3;  // "topology changed"
    CHECK(router.invalidate(2));
    CHECK(router.run(2, &s).kind == replay::RouteKind::recaptured);
    CHECK(router.stats().reinstantiations == 1);
    CHECK(router.backend().next_id == id_before + 1);
    CHECK_FALSE(router.invalidate(99));  // unknown key: nothing to do
    // capture() also refreshes stale graphs.
    version = 2;
    router.invalidate_all();
    CHECK(router.capture({1, 2}, &s) == 2);
    // 1 had 2 ops and now has 3: re-instantiated; 2 had 3 and keeps 3: in place.
    CHECK(router.stats().updates == 2);
    CHECK(router.stats().reinstantiations == 2);
  }

  TEST_CASE("the hit path allocates nothing") {
    Router<int> router(work_ops, Options::bucketed({1, 2, 4, 8}));
    FakeStream s;
    s.executed.reserve(1 << 16);
    CHECK(router.capture_all(&s) == 4);
    const std::size_t before = shape_router_test_allocations();
    for (int i = 0; i < 1000; ++i) {
      (void)router.run(1 + i % 8, &s);
    }
    CHECK(shape_router_test_allocations() == before);
    CHECK(router.stats().hits == 1000);
  }

  TEST_CASE("calling the router from its own work is refused, not a deadlock") {
    Router<int>* self = nullptr;
    FakeStream s;
    Router<int> router(
        [&](int n, FakeStream* st) {
          if (n == 2) {
            (void)self->run(1, st);
          }
          st->issue("x");
        },
        {.warmup_runs = 1});
    self = &router;
    CHECK_THROWS_WITH_AS((void)router.run(2, &s), doctest::Contains("would deadlock"), replay::usage_error);
    CHECK(router.run(1, &s).kind == replay::RouteKind::warmup);  // still usable
  }

  TEST_CASE("threads: many threads hammering one router keep it consistent") {
    constexpr int kThreads = 8;
    constexpr int kRuns = 4000;
    for (std::size_t max_graphs : {replay::ShapeRouterOptions<int>::unlimited, std::size_t{3}}) {
      CAPTURE(max_graphs);
      Router<int> router(work_ops, {.policy = replay::RoutingPolicy::bucketed,
                                    .buckets = {{1, 2, 4, 8, 16}},
                                    .warmup_runs = 1,
                                    .max_graphs = max_graphs,
                                    .stream_sharing = replay::StreamSharing::caller_ordered});
      std::vector<FakeStream> streams(kThreads);
      std::vector<std::vector<std::string>> expected(kThreads);
      std::atomic<int> errors{0};
      std::vector<std::thread> threads;
      for (int t = 0; t < kThreads; ++t) {
        threads.emplace_back([&, t] {
          std::mt19937 rng{replay_test::case_seed_for(static_cast<std::uint64_t>(t) + 1)};
          std::uniform_int_distribution<int> dist(1, 16);
          for (int i = 0; i < kRuns; ++i) {
            const int n = dist(rng);
            const auto route = router.run(n, &streams[t]);
            const int p = round_up(n, {1, 2, 4, 8, 16});
            if (route.shape != p) {
              ++errors;
            }
            const auto ops = eager_ops(p);
            expected[t].insert(expected[t].end(), ops.begin(), ops.end());
            if (i % 500 == 0) {
              (void)router.stats();
              (void)router.graphs();
            }
          }
        });
      }
      for (auto& th : threads) {
        th.join();
      }
      CHECK(errors == 0);
      for (int t = 0; t < kThreads; ++t) {
        CHECK(streams[t].executed == expected[t]);  // every run issued exactly its padded shape's work
      }
      const auto stats = router.stats();
      CHECK(stats.runs == kThreads * kRuns);
      CHECK(stats.hits + stats.misses == stats.runs);
      CHECK(stats.warmups == 5);
      CHECK(stats.captures - stats.evictions == router.graph_count());
      CHECK(router.graph_count() == std::min<std::size_t>(5, max_graphs));
      CHECK(router.backend().launches == static_cast<int>(stats.hits + stats.captures));
      if (max_graphs == 3) {
        CHECK(stats.evictions > 0);
      } else {
        CHECK(stats.evictions == 0);
      }
    }
  }
}

// ---- concurrency, failure classes, bounded state ----------------------------

namespace {

// A backend whose captures can be interrupted from outside (the hook throws
// capture_interrupted_error) or fail on their own work (it throws anything else).
struct HookedBackend : FakeBackend {
  std::function<void(int attempt)> before_capture;
  std::atomic<int> attempts{0};

  HookedBackend() = default;
  HookedBackend(const HookedBackend& other) : FakeBackend(other), before_capture(other.before_capture) {}

  template <class Issue>
  replay::CapturedGraph<FakeExec> capture(FakeStream* s, Issue&& issue, std::source_location where) {
    const int attempt = attempts++;
    if (before_capture) {
      before_capture(attempt);
    }
    return FakeBackend::capture(s, issue, where);
  }
};

// A backend whose re-captures replace the executable graph through the
// policies CudaGraphBackend and GraphExec use (detail::update_or_reinstantiate,
// detail::instantiate_diagnosed_once), with steps that refuse every update and
// count instantiations; the first `failing` of them fail (as
// cudaGraphInstantiate would).
struct InstantiatingBackend : FakeBackend {
  int instantiations = 0;
  int failing = 0;
  struct Steps {
    InstantiatingBackend& backend;
    bool update_in_place(FakeExec&, const std::vector<std::string>&) { return false; }  // refused
    std::optional<FakeExec> instantiate(const std::vector<std::string>& ops) {
      if (++backend.instantiations <= backend.failing) {
        return std::nullopt;
      }
      return FakeExec{ops, backend.next_id++};
    }
    FakeExec instantiate_diagnosed(const std::vector<std::string>& ops) {
      if (auto exec = instantiate(ops)) {
        return std::move(*exec);
      }
      throw std::runtime_error("fake instantiation failed");
    }
    FakeExec instantiate_new(const std::vector<std::string>& ops) {
      return replay::detail::instantiate_diagnosed_once<FakeExec>(ops, *this);
    }
  };
  InstantiatingBackend() = default;
  InstantiatingBackend(const InstantiatingBackend& other)
      : FakeBackend(other), instantiations(other.instantiations), failing(other.failing) {}
  template <class Issue>
  replay::RecaptureResult recapture(FakeExec& exec, FakeStream* s, Issue&& issue, std::source_location) {
    const auto ops = record(s, issue);
    Steps steps{*this};
    replay::RecaptureResult result;
    result.path = replay::detail::update_or_reinstantiate(exec, ops, steps);
    result.memory = memory_of(ops);
    return result;
  }
};

// A backend whose launches take a while and check that the executable graph
// they launch is not destroyed under them.
struct SlowLaunchBackend : FakeBackend {
  std::atomic<int> launched_destroyed{0};
  std::atomic<int> slow_launches{0};
  std::atomic<bool> slow{false};
  SlowLaunchBackend() = default;
  SlowLaunchBackend(const SlowLaunchBackend& other) : FakeBackend(other) {}
  void launch(const FakeExec& exec, FakeStream* s, std::source_location where) {
    if (slow.load()) {
      ++slow_launches;
      const auto gone = exec.gone;
      std::this_thread::sleep_for(std::chrono::milliseconds(30));
      if (gone->load()) {
        ++launched_destroyed;
      }
      if (gone->load()) {
        return;  // do not read the freed graph
      }
    }
    FakeBackend::launch(exec, s, where);
  }
};

// The stand-in without stream ordering: it cannot order two streams.
struct UnorderedBackend {
  using stream_type = FakeStream*;
  using exec_type = FakeExec;
  FakeBackend inner;
  template <class Issue>
  replay::CapturedGraph<FakeExec> capture(FakeStream* s, Issue&& issue, std::source_location where) {
    return inner.capture(s, issue, where);
  }
  template <class Issue>
  replay::RecaptureResult recapture(FakeExec& exec, FakeStream* s, Issue&& issue, std::source_location where) {
    return inner.recapture(exec, s, issue, where);
  }
  void launch(const FakeExec& exec, FakeStream* s, std::source_location where) { inner.launch(exec, s, where); }
};

// A backend that captures on a stream of its own, as the CUDA backend does.
struct OwnStreamBackend : FakeBackend {
  template <class Issue>
  replay::CapturedGraph<FakeExec> capture(FakeStream*, Issue&& issue, std::source_location where) {
    FakeStream own;
    return FakeBackend::capture(&own, issue, where);
  }
};

static_assert(replay::OrdersStreams<FakeBackend>);
static_assert(!replay::OrdersStreams<UnorderedBackend>);
static_assert(replay::OrdersStreams<replay::CudaGraphBackend> && replay::TrimsMemory<replay::CudaGraphBackend>);

}  // namespace

TEST_SUITE("host") {
  TEST_CASE("an interrupted capture is retried with back-off and never marks the key eager") {
    // Old code: any capture exception marked the key eager for good.
    HookedBackend backend;
    int interrupt_first = 2;
    backend.before_capture = [&](int attempt) {
      if (attempt < interrupt_first) {
        throw replay::capture_interrupted_error("invalidated by another thread");
      }
    };
    std::vector<int> failed;
    replay::ShapeRouter<int, HookedBackend> router(
        work_ops,
        {.on_capture_failure = [&](const int& k, std::string_view) { failed.push_back(k); },
         .capture_attempts = 3,
         .retry_backoff = std::chrono::microseconds(0)},
        backend);
    FakeStream s;
    CHECK(router.run(3, &s).kind == replay::RouteKind::captured);  // attempts 0, 1 interrupted, 2 captured
    auto stats = router.stats();
    CHECK(stats.interrupted_captures == 2);
    CHECK(stats.capture_retries == 2);
    CHECK(stats.capture_failures == 0);
    CHECK(failed.empty());
    CHECK(router.contains(3));

    // A whole round interrupted: this run is eager, the key is not marked,
    // and the next run (no cool-down left) captures it.
    router.backend().attempts = 0;
    interrupt_first = 3;
    CHECK(router.run(5, &s).kind == replay::RouteKind::eager_busy);
    CHECK_FALSE(router.is_eager(5));
    CHECK(router.run(5, &s).kind == replay::RouteKind::captured);
    stats = router.stats();
    CHECK(stats.interrupted_captures == 5);
    CHECK(stats.capture_retries == 4);
    CHECK(stats.eager_busy == 1);
    CHECK(failed.empty());

    // Interrupted round after round: marked eager in the end, once, saying why.
    std::string reason;
    router.set_capture_failure_handler([&](const int& k, std::string_view why) {
      failed.push_back(k);
      reason = why;
    });
    interrupt_first = 1 << 30;
    int runs = 0;
    while (!router.is_eager(7) && runs < 100) {
      (void)router.run(7, &s);
      ++runs;
    }
    CHECK(router.is_eager(7));
    CHECK(runs == 8);
    REQUIRE(failed == std::vector<int>{7});
    CHECK(reason.find("every capture attempt was interrupted") != std::string::npos);
    CHECK(reason.find("invalidated by another thread") != std::string::npos);
  }

  TEST_CASE("a capture that fails on its own work marks the key eager at once, and evicts nothing") {
    // Old code: max_graphs evicted the LRU graph before capturing, so a failed
    // capture cost a good graph too.
    HookedBackend backend;
    backend.before_capture = [](int attempt) {
      if (attempt >= 1) {
        throw std::runtime_error("the work synchronizes");
      }
    };
    replay::ShapeRouter<int, HookedBackend> router(
        work_ops, {.max_graphs = 1, .on_capture_failure = [](const int&, std::string_view) {}}, backend);
    FakeStream s;
    CHECK(router.run(2, &s).kind == replay::RouteKind::captured);
    CHECK(router.run(4, &s).kind == replay::RouteKind::eager_fallback);
    CHECK(router.backend().attempts == 2);  // no retry of an own failure
    CHECK(router.is_eager(4));
    CHECK(router.contains(2));  // still there
    CHECK(router.run(2, &s).kind == replay::RouteKind::replayed);
    CHECK(router.stats().evictions == 0);
    CHECK(router.stats().capture_failures == 1);
  }

  TEST_CASE("a failing re-capture instantiates at most twice, and a retry that succeeds is kept and used") {
    // Old code: the backend called GraphExec::update(), which re-instantiated
    // (with its own diagnostic retry) when the update was refused, and when
    // that threw it instantiated again: four instantiations per failing
    // re-capture, and a diagnostic retry that succeeded was destroyed and
    // reported as a failure ("instantiate result 0"). Here that is 4 counted
    // and the key marked eager instead of recaptured.
    int version = 0;
    auto work = [&](int n, FakeStream* s) { s->issue(op("v", version) + op("k", n)); };
    std::vector<std::string> failures;
    replay::ShapeRouter<int, InstantiatingBackend> router(
        work, {.on_capture_failure = [&](const int&, std::string_view why) { failures.emplace_back(why); }});
    FakeStream s;
    CHECK(router.run(3, &s).kind == replay::RouteKind::captured);  // capture(): not counted here

    // The first instantiation fails, the diagnostic retry succeeds: kept.
    router.backend().failing = 1;
    version = 1;
    REQUIRE(router.invalidate(3));
    CHECK(router.run(3, &s).kind == replay::RouteKind::recaptured);
    CHECK(router.backend().instantiations == 2);
    CHECK(router.stats().reinstantiations == 1);
    CHECK(failures.empty());
    CHECK_FALSE(router.is_eager(3));
    s.executed.clear();
    CHECK(router.run(3, &s).kind == replay::RouteKind::replayed);  // the retry's graph serves the hits
    CHECK(s.executed == std::vector<std::string>{"v1k3"});

    // Both fail: two instantiations, no more (and no retry of an own failure); eager.
    router.backend().instantiations = 0;
    router.backend().failing = 2;
    version = 2;
    REQUIRE(router.invalidate(3));
    s.executed.clear();
    CHECK(router.run(3, &s).kind == replay::RouteKind::eager_fallback);
    CHECK(router.backend().instantiations == 2);
    CHECK(s.executed == std::vector<std::string>{"v2k3"});
    REQUIRE(failures.size() == 1);
    CHECK(failures[0].find("fake instantiation failed") != std::string::npos);
    CHECK(router.is_eager(3));
  }

  TEST_CASE("the entry table is bounded: keys from an open domain are forgotten least recently used first") {
    // Old code: one entry per key ever seen, scanned on every capture.
    Router<int> router(work_ops, {.warmup_runs = 1, .max_graphs = 8, .max_entries = 16});
    FakeStream s;
    for (int k = 1; k <= 2000; ++k) {
      (void)router.run(1 + (k % 7), &s);  // a hot set that stays
      (void)router.run(100 + k, &s);      // an open domain (warm-up only: each key seen once)
      CHECK(router.entry_count() <= 16);
    }
    const auto stats = router.stats();
    CHECK(stats.entry_evictions >= 2000 - 16);
    for (int k = 1; k <= 7; ++k) {
      CHECK(router.contains(k));  // the hot keys kept their graphs
    }
    CHECK(router.graph_count() == 7);
    CHECK(router.run(3, &s).kind == replay::RouteKind::replayed);
    CHECK_THROWS_WITH_AS(Router<int>(work_ops, {.max_entries = 0}), doctest::Contains("max_entries"),
                         replay::usage_error);
    CHECK_THROWS_WITH_AS(Router<int>(work_ops, {.capture_attempts = 0}), doctest::Contains("capture_attempts"),
                         replay::usage_error);
  }

  TEST_CASE("a bucketed router finds each bucket shape's entry by its slot, also after entries are forgotten") {
    // The hit path indexes bucket shapes (row-major over the lists) instead of
    // hashing; a stale index would replay another shape's graph.
    using Key2 = std::pair<int, int>;
    const auto name = [](const Key2& k) { return std::to_string(k.first) + "x" + std::to_string(k.second); };
    Router<Key2> router([&](const Key2& k, FakeStream* s) { s->issue(name(k)); },
                        {.policy = replay::RoutingPolicy::bucketed,
                         .buckets = {{1, 2, 4}, {8, 16}},
                         .warmup_runs = 0,
                         .max_graphs = 6,
                         .max_entries = 2});
    FakeStream s;
    std::mt19937 rng{static_cast<std::mt19937::result_type>(replay_test::case_seed())};
    std::uniform_int_distribution<int> batch(1, 4);
    std::uniform_int_distribution<int> length(1, 16);
    for (int i = 0; i < 400; ++i) {
      const Key2 key{batch(rng), length(rng)};
      const Key2 padded = router.padded_shape(key);
      s.executed.clear();
      const auto route = router.run(key, &s);
      CHECK(route.shape == padded);
      CHECK(router.entry_count() <= 2);
      if (route.kind == replay::RouteKind::replayed) {
        // The fake graph replays what was recorded for its own shape.
        REQUIRE(s.executed.size() == 1);
        CHECK(s.executed[0] == name(padded));
      }
    }
    CHECK(router.stats().entry_evictions > 0);
    CHECK(router.stats().hits > 0);
    router.clear();
    CHECK(router.entry_count() == 0);
    CHECK(router.run(Key2{3, 9}, &s).kind == replay::RouteKind::captured);  // nothing left indexed after clear()
    CHECK(router.run(Key2{4, 16}, &s).kind == replay::RouteKind::replayed);
  }

  TEST_CASE("hits reorder no list, yet the entry table forgets the least recently used key") {
    // A hit only flags its entry; forgetting gives a flagged entry a second
    // chance. (Without it, key 1 would be forgotten here: it was made first.)
    Router<int> router(work_ops, {.max_entries = 3});
    FakeStream s;
    for (int k : {1, 2, 3}) {
      CHECK(router.run(k, &s).kind == replay::RouteKind::captured);
    }
    CHECK(router.run(1, &s).kind == replay::RouteKind::replayed);
    CHECK(router.run(4, &s).kind == replay::RouteKind::captured);
    CHECK(router.contains(1));
    CHECK_FALSE(router.contains(2));  // the least recently used
    CHECK(router.contains(3));
    CHECK(router.run(5, &s).kind == replay::RouteKind::captured);
    CHECK_FALSE(router.contains(3));  // 1's second chance is spent; 3 is older than 1
    CHECK(router.contains(1));
    CHECK(router.stats().entry_evictions == 2);
    const auto graphs = router.graphs();  // by recency, most recent first
    REQUIRE(graphs.size() == 3);
    CHECK(graphs[0].shape == 5);
    CHECK(graphs[1].shape == 4);
    CHECK(graphs[2].shape == 1);
  }

  TEST_CASE("a hit completes while another key's capture is blocked (real threads)") {
    // Old code: the router's mutex was held across the capture, so the hit
    // waited for it (here: forever, the capture waits for the hit).
    std::promise<void> capture_started;
    std::promise<void> release_capture;
    std::shared_future<void> released = release_capture.get_future().share();
    auto work = [&](int n, FakeStream* s) {
      if (n == 8 && s->recording != nullptr) {
        capture_started.set_value();
        released.wait();
      }
      work_ops(n, s);
    };
    Router<int> router(work, caller_ordered(Options::bucketed({1, 2, 4, 8})));
    FakeStream main_stream;
    FakeStream other_stream;
    CHECK(router.capture({1, 2}, &main_stream) == 2);
    std::thread capturer([&] { (void)router.run(8, &other_stream); });
    capture_started.get_future().wait();
    auto hits = std::async(std::launch::async, [&] {
      std::vector<replay::RouteKind> kinds;
      kinds.push_back(router.run(2, &main_stream).kind);
      kinds.push_back(router.run(1, &main_stream).kind);
      kinds.push_back(router.run(7, &main_stream).kind);  // the key being captured: eager meanwhile
      return kinds;
    });
    const bool completed = hits.wait_for(std::chrono::seconds(20)) == std::future_status::ready;
    release_capture.set_value();
    capturer.join();
    REQUIRE(completed);
    CHECK(hits.get() == std::vector<replay::RouteKind>{replay::RouteKind::replayed, replay::RouteKind::replayed,
                                                       replay::RouteKind::eager_busy});
    CHECK(router.contains(8));
    CHECK(router.run(8, &main_stream).kind == replay::RouteKind::replayed);
    CHECK(main_stream.executed.size() == 2 + 1 + 8 + 8);
  }

  TEST_CASE("a run on a second stream is ordered after the first, or refused by a backend that cannot order") {
    // Old code: neither; two streams raced on the shared buffers silently.
    Router<int> router(work_ops, caller_ordered());
    FakeStream a;
    FakeStream b;
    (void)router.run(2, &a);
    (void)router.run(2, &a);
    CHECK(router.backend().orderings == 0);
    CHECK(router.run(2, &b).kind == replay::RouteKind::replayed);
    CHECK(router.backend().orderings == 1);
    (void)router.run(3, &b);
    CHECK(router.backend().orderings == 1);
    (void)router.run(3, &a);
    CHECK(router.backend().orderings == 2);
    CHECK(router.stats().stream_switches == 2);

    replay::ShapeRouter<int, UnorderedBackend> unordered(work_ops, caller_ordered());
    (void)unordered.run(2, &a);
    CHECK_THROWS_WITH_AS((void)unordered.run(2, &b), doctest::Contains("cannot order streams"), replay::usage_error);
    CHECK(unordered.run(2, &a).kind == replay::RouteKind::replayed);
  }

  TEST_CASE("capture_all reports progress: done, total and the shape, largest first") {
    Router<int> router(work_ops, Options::bucketed({1, 2, 4, 8}));
    FakeStream s;
    std::vector<std::tuple<std::size_t, std::size_t, int>> seen;
    CHECK(router.capture_all(&s, [&](std::size_t done, std::size_t total, const int& shape) {
      seen.emplace_back(done, total, shape);
    }) == 4);
    CHECK(seen == std::vector<std::tuple<std::size_t, std::size_t, int>>{{1, 4, 8}, {2, 4, 4}, {3, 4, 2}, {4, 4, 1}});
    // The progress callback may not call back into the router.
    CHECK_THROWS_WITH_AS(
        (void)router.capture_all(&s, [&](std::size_t, std::size_t, const int&) { (void)router.stats(); }),
        doctest::Contains("would deadlock"), replay::usage_error);
  }

  TEST_CASE("a lease gives one thread the shared buffers: other streams wait until it is released") {
    Router<int> router(work_ops, caller_ordered());
    FakeStream a;
    FakeStream b;
    (void)router.run(2, &a);
    std::future<replay::RouteKind> other;
    {
      const auto lease = router.lease(&a);
      CHECK(router.run(2, &a).kind == replay::RouteKind::replayed);  // the holder runs freely on its stream
      CHECK_THROWS_WITH_AS((void)router.run(2, &b), doctest::Contains("lease"), replay::usage_error);
      CHECK_THROWS_WITH_AS((void)router.lease(&a), doctest::Contains("already holds"), replay::usage_error);
      other = std::async(std::launch::async, [&] { return router.run(2, &b).kind; });
      CHECK(other.wait_for(std::chrono::milliseconds(100)) == std::future_status::timeout);
    }
    REQUIRE(other.wait_for(std::chrono::seconds(20)) == std::future_status::ready);
    CHECK(other.get() == replay::RouteKind::replayed);
    CHECK(router.backend().orderings == 1);  // b was ordered after a
  }

  TEST_CASE("capture_all on several threads captures every shape once and reports progress in order") {
    std::vector<std::int64_t> buckets;
    for (int b = 1; b <= 16; ++b) {
      buckets.push_back(b);
    }
    auto options = replay::ShapeRouterOptions<int>::bucketed(buckets);
    options.capture_threads = 4;
    replay::ShapeRouter<int, OwnStreamBackend> router(work_ops, options);
    FakeStream s;
    std::vector<std::size_t> done_seen;
    std::set<int> shapes_seen;
    CHECK(router.capture_all(&s, [&](std::size_t done, std::size_t total, const int& shape) {
      CHECK(total == 16);
      done_seen.push_back(done);
      shapes_seen.insert(shape);
    }) == 16);
    CHECK(router.graph_count() == 16);
    CHECK(router.stats().captures == 16);
    CHECK(shapes_seen.size() == 16);
    for (std::size_t i = 0; i < done_seen.size(); ++i) {
      CHECK(done_seen[i] == i + 1);
    }
    for (int k = 1; k <= 16; ++k) {
      CHECK(router.run(k, &s).kind == replay::RouteKind::replayed);
    }
    CHECK(s.executed.size() == 16 * 17 / 2);
  }

  TEST_CASE("clear() or invalidate() while a capture is in flight: the capture serves its run and state stays sane") {
    for (const bool recapture : {false, true}) {
      CAPTURE(recapture);
      std::promise<void> started;
      std::promise<void> release;
      std::shared_future<void> released = release.get_future().share();
      std::atomic<bool> block{!recapture};
      auto work = [&](int n, FakeStream* s) {
        if (s->recording != nullptr && block.exchange(false)) {
          started.set_value();
          released.wait();
        }
        work_ops(n, s);
      };
      Router<int> router(work, {.on_capture_failure = [](const int&, std::string_view) {},
                                .stream_sharing = replay::StreamSharing::caller_ordered});
      FakeStream main_stream;
      FakeStream other_stream;
      if (recapture) {
        (void)router.run(6, &other_stream);
        CHECK(router.invalidate(6));
        block = true;
      }
      std::thread capturer([&] {
        const auto route = router.run(6, &other_stream);
        CHECK(route.graph());
      });
      started.get_future().wait();
      CHECK(router.invalidate(6));  // in flight: stale as soon as it is in
      router.clear();
      CHECK(router.graph_count() == 0);
      release.set_value();
      capturer.join();
      CHECK(router.graph_count() == 0);  // forgotten: not installed
      CHECK(router.entry_count() == 0);
      CHECK(router.memory().footprint_bytes == 0);
      CHECK(router.run(6, &main_stream).kind == replay::RouteKind::captured);
      CHECK(router.graph_count() == 1);
    }
  }

  TEST_CASE("a stream destroyed after its last run is never touched: the next stream's first run drains once") {
    // Old code: the switch recorded the order event on the previous stream
    // (order_after(previous, next)), which its owner had destroyed: a
    // use-after-free of a stream (on the GPU: SIGSEGV, or cudaEventRecord
    // failing with cudaErrorContextIsDestroyed).
    Router<int> router(work_ops, caller_ordered());
    {
      FakeStream first;
      (void)router.run(2, &first);
      (void)router.run(2, &first);
      CHECK(router.backend().marks == 0);  // one stream so far: hits record nothing
    }
    FakeStream second;
    FakeStream fourth;  // made now: not at the address of `third`
    CHECK(router.run(2, &second).kind == replay::RouteKind::replayed);
    CHECK(router.backend().drains == 1);  // nothing was marked: ordered after the whole device, once
    CHECK(router.backend().marks == 1);   // from now on every run marks its own stream
    {
      FakeStream third;
      CHECK(router.run(2, &third).kind == replay::RouteKind::replayed);
      (void)router.run(3, &third);  // a miss (eager warm-up) marks too
    }
    CHECK(router.run(2, &fourth).kind == replay::RouteKind::replayed);
    CHECK(router.backend().drains == 1);      // later switches wait for the last mark
    CHECK(router.backend().orderings == 3);   // drain, then two waits
    CHECK(router.backend().marks == 4);
    CHECK(router.stats().stream_switches == 3);
    CHECK(router.backend().destroyed_touched == 0);
  }

  TEST_CASE("a lease marks its stream when it ends, so the next stream waits for that mark") {
    Router<int> router(work_ops);
    FakeStream b;
    {
      FakeStream a;
      {
        const auto lease = router.lease(&a);
        (void)router.run(2, &a);
      }
      CHECK(router.backend().marks == 1);
    }
    CHECK(router.run(2, &b).kind == replay::RouteKind::replayed);
    CHECK(router.backend().drains == 0);
    CHECK(router.backend().orderings == 1);
    CHECK(router.backend().destroyed_touched == 0);
  }

  TEST_CASE("threads on their own short-lived streams share a router: no stream is touched after it is gone") {
    Router<int> router(work_ops, caller_ordered(Options::bucketed({2, 4, 8})));
    std::vector<std::thread> threads;
    std::atomic<int> errors{0};
    for (int t = 0; t < 6; ++t) {
      threads.emplace_back([&, t] {
        try {
          for (int round = 0; round < 20; ++round) {
            FakeStream own;  // destroyed after every few runs
            for (int i = 0; i < 3; ++i) {
              const int key = 1 + (t + round + i) % 8;
              if (round % 2 == 0) {
                const auto lease = router.lease(&own);
                (void)router.run(key, &own);
              } else {
                (void)router.run(key, &own);
              }
            }
          }
        } catch (...) {
          ++errors;
        }
      });
    }
    for (auto& thread : threads) {
      thread.join();
    }
    CHECK(errors == 0);
    CHECK(router.backend().destroyed_touched == 0);
    CHECK(router.backend().drains <= 1);
  }

  TEST_CASE("evicting or clearing a graph while another thread launches it waits for that launch") {
    // The hit path holds no reference to the graph it launches, only its
    // lock: the eviction must wait for the launch, never free the graph under it.
    replay::ShapeRouter<int, SlowLaunchBackend> router(work_ops, Options::exact());
    FakeStream s;
    CHECK(router.run(2, &s).kind == replay::RouteKind::captured);
    CHECK(router.run(3, &s).kind == replay::RouteKind::captured);
    router.backend().slow = true;
    auto hit = std::async(std::launch::async, [&] { return router.run(2, &s).kind; });
    while (router.backend().slow_launches.load() == 0) {
      std::this_thread::yield();
    }
    CHECK(router.evict(2));
    auto other = std::async(std::launch::async, [&] { return router.run(3, &s).kind; });
    while (router.backend().slow_launches.load() < 2) {
      std::this_thread::yield();
    }
    router.clear();
    CHECK(hit.get() == replay::RouteKind::replayed);
    CHECK(other.get() == replay::RouteKind::replayed);
    CHECK(router.backend().launched_destroyed == 0);
    CHECK(router.graph_count() == 0);
  }
}

// ---- streams outside leases; capture verdicts ---------------------------------

namespace {

// What describe_stream prints for a stand-in stream.
std::string named(const FakeStream* s) {
  std::ostringstream os;
  os << "stream " << static_cast<const void*>(s);
  return os.str();
}

// A backend whose captures of one shape (`broken_ops` ops: work_ops(n) issues
// n) break in the way that looks external, as a raw cudaStreamSynchronize
// inside the work can: the first `breaks` attempts (all of them by default).
struct BreaksOneShapeBackend : FakeBackend {
  std::size_t broken_ops = 4;
  std::atomic<int> breaks{1 << 30};
  std::atomic<int> broken_attempts{0};
  BreaksOneShapeBackend() = default;
  BreaksOneShapeBackend(const BreaksOneShapeBackend& other)
      : FakeBackend(other), broken_ops(other.broken_ops), breaks(other.breaks.load()) {}
  template <class Issue>
  replay::CapturedGraph<FakeExec> capture(FakeStream* s, Issue&& issue, std::source_location where) {
    auto captured = FakeBackend::capture(s, issue, where);
    if (captured.exec.ops.size() == broken_ops && broken_attempts.fetch_add(1) < breaks.load()) {
      throw replay::capture_interrupted_error("the capture was invalidated (cudaErrorStreamCaptureInvalidated)");
    }
    return captured;
  }
};

}  // namespace

TEST_SUITE("host") {
  TEST_CASE("by default a run outside a lease on a second stream is refused, naming both streams") {
    // Old code: the second stream was ordered after the first, which orders
    // the router's own work but not the caller's copies around run(): two
    // threads on two streams silently got each other's data.
    Router<int> router(work_ops);
    FakeStream a;
    FakeStream b;
    CHECK(router.run(2, &a).kind == replay::RouteKind::captured);  // a is the router's stream now
    std::string message;
    try {
      (void)router.run(2, &b);
    } catch (const replay::usage_error& e) {
      message = e.what();
    }
    CHECK(message.find(named(&b)) != std::string::npos);
    CHECK(message.find(named(&a)) != std::string::npos);
    CHECK(message.find("router.lease(stream)") != std::string::npos);
    CHECK(message.find("one router per stream") != std::string::npos);
    CHECK(message.find("StreamSharing::caller_ordered") != std::string::npos);
    CHECK(b.executed.empty());        // nothing issued
    CHECK(router.stats().runs == 1);  // nor counted
    CHECK(router.run(2, &a).kind == replay::RouteKind::replayed);

    // A lease may be taken on any stream; runs inside it are never refused.
    {
      const auto lease = router.lease(&b);
      CHECK(router.run(2, &b).kind == replay::RouteKind::replayed);
      CHECK(router.run(4, &b).kind == replay::RouteKind::captured);
    }
    CHECK(router.backend().orderings == 1);  // the lease on b was ordered after a
    CHECK(router.run(4, &a).kind == replay::RouteKind::replayed);
    // Outside a lease the router stays on a.
    CHECK_THROWS_WITH_AS((void)router.run(2, &b), doctest::Contains(named(&a).c_str()), replay::usage_error);
    CHECK_THROWS_WITH_AS((void)router.capture({8}, &b), doctest::Contains(named(&b).c_str()), replay::usage_error);
    {
      const auto lease = router.lease(&b);
      CHECK(router.capture({8}, &b) == 1);
    }
    CHECK(router.run(8, &a).kind == replay::RouteKind::replayed);
  }

  TEST_CASE("run_staged: stage in, run, read out in order under one lease; refusals come before stage_in") {
    auto options = Options::bucketed({1, 2, 4});
    options.oversize = replay::OversizePolicy::throw_error;
    Router<int> router(work_ops, options);
    FakeStream a;
    FakeStream b;
    (void)router.run(2, &a);  // binds a: outside leases b would be refused
    std::vector<std::string> order;
    const auto stage = [&](const int& key, const int& shape, FakeStream* s) {
      order.push_back(op("in", key) + op("/", shape));
      s->issue("copy in");
    };
    const auto read = [&](const replay::Route<int>& route, FakeStream* s) {
      order.push_back(op("out", route.shape));
      s->issue("copy out");
    };
    // On another stream than the router's: the lease inside the call makes it safe, ordered after a.
    const auto route = router.run_staged(3, &b, stage, read);
    CHECK(route.shape == 4);
    CHECK(order == std::vector<std::string>{op("in", 3) + op("/", 4), op("out", 4)});
    REQUIRE(b.executed.size() >= 3);
    CHECK(b.executed.front() == "copy in");
    CHECK(b.executed.back() == "copy out");
    CHECK(router.backend().orderings == 1);
    CHECK(router.run(2, &a).kind == replay::RouteKind::replayed);  // the lease ended with the call

    // Refused before anything is staged: an oversize key, a zero key, a lease this thread holds.
    order.clear();
    const std::size_t issued = b.executed.size();
    CHECK_THROWS_AS((void)router.run_staged(5, &b, stage, read), replay::usage_error);
    CHECK_THROWS_AS((void)router.run_staged(0, &b, stage, read), replay::usage_error);
    {
      const auto lease = router.lease(&a);
      CHECK_THROWS_WITH_AS((void)router.run_staged(2, &b, stage, read), doctest::Contains("already holds"),
                           replay::usage_error);
    }
    CHECK(order.empty());
    CHECK(b.executed.size() == issued);

    // An exception from stage_in ends the lease: the next request on another stream goes through.
    CHECK_THROWS_AS((void)router.run_staged(
                        2, &b, [](const int&, const int&, FakeStream*) { throw std::runtime_error("bad input"); }, read),
                    std::runtime_error);
    CHECK(router.run_staged(2, &a, stage, read).kind == replay::RouteKind::replayed);
  }

  TEST_CASE("only run() binds the router to its stream; capture() and runs inside a lease do not") {
    Router<int> router(work_ops, Options::bucketed({1, 2, 4}));
    FakeStream setup;
    FakeStream leased;
    FakeStream serving;
    CHECK(router.capture_all(&setup) == 3);  // any stream at start, binding nothing
    {
      const auto lease = router.lease(&leased);
      CHECK(router.run(2, &leased).kind == replay::RouteKind::replayed);
    }
    CHECK(router.run(2, &serving).kind == replay::RouteKind::replayed);  // binds serving
    CHECK(router.run(3, &serving).kind == replay::RouteKind::replayed);
    CHECK_THROWS_AS((void)router.run(1, &setup), replay::usage_error);
    CHECK_THROWS_AS((void)router.run(1, &leased), replay::usage_error);
    CHECK_THROWS_AS((void)router.capture_all(&setup), replay::usage_error);
  }

  TEST_CASE("StreamSharing::caller_ordered: any stream runs the router, ordered as before") {
    Router<int> router(work_ops, caller_ordered());
    FakeStream a;
    FakeStream b;
    CHECK(router.run(2, &a).kind == replay::RouteKind::captured);
    CHECK(router.run(2, &b).kind == replay::RouteKind::replayed);
    CHECK(router.run(3, &a).kind == replay::RouteKind::captured);
    CHECK(router.stats().stream_switches == 2);
    CHECK(router.backend().orderings == 2);
  }

  TEST_CASE("threads on two streams without a lease: all but the first are refused; with leases none is") {
    constexpr int kThreads = 4;
    constexpr int kRuns = 200;
    for (const bool leased : {false, true}) {
      CAPTURE(leased);
      Router<int> router(work_ops, Options::bucketed({1, 2, 4, 8}));
      std::vector<FakeStream> streams(kThreads);
      std::atomic<int> refused{0};
      std::atomic<int> served_threads{0};
      std::atomic<int> holders{0};       // threads between staging and reading (a lease's span)
      std::atomic<int> overlapping{0};   // times two were there at once
      std::vector<std::string> messages(kThreads);
      std::atomic<int> ready{0};
      std::vector<std::thread> threads;
      for (int t = 0; t < kThreads; ++t) {
        threads.emplace_back([&, t] {
          ready.fetch_add(1);
          while (ready.load() < kThreads) {
            std::this_thread::yield();
          }
          try {
            for (int i = 0; i < kRuns; ++i) {
              const int key = 1 + (t + i) % 8;
              const auto request = [&] {  // "stage" the shared buffers, run, "read" them
                if (holders.fetch_add(1) != 0 && leased) {
                  ++overlapping;
                }
                (void)router.run(key, &streams[t]);
                holders.fetch_sub(1);
              };
              if (leased) {
                const auto lease = router.lease(&streams[t]);
                request();
              } else {
                request();
              }
            }
            ++served_threads;
          } catch (const replay::usage_error& e) {
            holders.fetch_sub(1);
            messages[t] = e.what();
            ++refused;
          }
        });
      }
      for (auto& thread : threads) {
        thread.join();
      }
      if (leased) {
        CHECK(refused == 0);
        CHECK(served_threads == kThreads);
        CHECK(overlapping == 0);
      } else {
        CHECK(refused == kThreads - 1);
        CHECK(served_threads == 1);
        for (int t = 0; t < kThreads; ++t) {
          if (!messages[t].empty()) {
            CHECK(messages[t].find(named(&streams[t])) != std::string::npos);
            CHECK(messages[t].find("lease") != std::string::npos);
          }
        }
      }
    }
  }

  TEST_CASE("capture_all gives every shape its verdict: a capture broken from outside every time is reported") {
    // Old code: capture_all tried one round, returned 3 of 4, never called the
    // handler, and left the shape to be retried (eagerly served) on live traffic.
    BreaksOneShapeBackend backend;
    std::vector<int> reported;
    std::string reason;
    replay::ShapeRouter<int, BreaksOneShapeBackend> router(
        work_ops,
        {.policy = replay::RoutingPolicy::bucketed,
         .buckets = {{1, 2, 4, 8}},
         .on_capture_failure =
             [&](const int& shape, std::string_view why) {
               reported.push_back(shape);
               reason = why;
             },
         .capture_attempts = 3,
         .retry_backoff = std::chrono::microseconds(10)},
        backend);
    FakeStream s;
    CHECK(router.capture_all(&s) == 3);
    REQUIRE(reported == std::vector<int>{4});  // once, before capture_all returned
    CHECK(reason.find("every capture attempt was interrupted") != std::string::npos);
    CHECK(reason.find("cudaErrorStreamCaptureInvalidated") != std::string::npos);
    const auto stats = router.stats();
    CHECK(stats.capture_failures == 1);
    CHECK(stats.interrupted_captures == 8 * 3);  // 8 rounds of capture_attempts, all run here
    CHECK(stats.capture_retries == 8 * 2);
    CHECK(router.is_eager(4));
    CHECK(router.graph_count() == 3);
    CHECK(router.run(3, &s).kind == replay::RouteKind::eager_fallback);
    CHECK(router.run(8, &s).kind == replay::RouteKind::replayed);
    CHECK(reported.size() == 1);

    // capture(keys) too: the verdict for each distinct padded key.
    replay::ShapeRouter<int, BreaksOneShapeBackend> exact(
        work_ops,
        {.on_capture_failure = [&](const int& shape, std::string_view) { reported.push_back(shape); },
         .retry_backoff = std::chrono::microseconds(10)},
        backend);
    CHECK(exact.capture({2, 4, 4, 6}, &s) == 2);
    CHECK(reported == std::vector<int>{4, 4});
    CHECK(exact.stats().capture_failures == 1);
  }

  TEST_CASE("capture_all retries an interrupted shape until it captures, within its bounds, before returning") {
    BreaksOneShapeBackend backend;
    backend.breaks = 4;  // a whole round and one more attempt, then the capture holds
    std::vector<int> reported;
    replay::ShapeRouter<int, BreaksOneShapeBackend> router(
        work_ops,
        {.policy = replay::RoutingPolicy::bucketed,
         .buckets = {{1, 2, 4, 8}},
         .on_capture_failure = [&](const int& shape, std::string_view) { reported.push_back(shape); },
         .capture_attempts = 3,
         .retry_backoff = std::chrono::microseconds(10)},
        backend);
    FakeStream s;
    CHECK(router.capture_all(&s) == 4);
    CHECK(reported.empty());
    CHECK(router.contains(4));
    CHECK_FALSE(router.is_eager(4));
    CHECK(router.stats().interrupted_captures == 4);
    CHECK(router.stats().capture_failures == 0);
    CHECK(router.run(3, &s).kind == replay::RouteKind::replayed);
  }
}

// ---- declared breaks (BreakPolicy) -----------------------------------------

namespace {

// A stand-in whole capture as CudaGraphBackend's: a capture scope counts as
// open on this thread, so that replay::eager in the work throws
// region_in_capture_error (the real one) and runs its region in place in
// the router's eager runs. No piecewise capture.
struct FakeOneGraphBackend : FakeBackend {
  struct Open {
    Open() { ++replay::detail::open_capture_scopes(); }
    Open(const Open&) = delete;
    Open& operator=(const Open&) = delete;
    ~Open() { --replay::detail::open_capture_scopes(); }
  };
  template <class Issue>
  replay::CapturedGraph<FakeExec> capture(FakeStream* s, Issue&& issue, std::source_location where) {
    const Open open;
    return FakeBackend::capture(s, issue, where);
  }
  template <class Issue>
  replay::RecaptureResult recapture(FakeExec& exec, FakeStream* s, Issue&& issue, std::source_location where) {
    const Open open;
    return FakeBackend::recapture(exec, s, issue, where);
  }
};

// A stand-in piecewise executable: it keeps the work and runs it again at
// each launch, its regions included (what a PiecewiseExec's segments and
// regions do, in order).
struct FakePieces {
  std::function<void(FakeStream*)> work;
  std::shared_ptr<std::atomic<bool>> gone = std::make_shared<std::atomic<bool>>(false);
  FakePieces(std::function<void(FakeStream*)> w) : work(std::move(w)) {}
  FakePieces(FakePieces&&) noexcept = default;
  FakePieces& operator=(FakePieces&&) noexcept = default;
  ~FakePieces() {
    if (gone) {
      *gone = true;
    }
  }
};

// The same, and it captures piecewise: the capture runs the work on the
// stream, taking each declared break; a stray sync fails it after the work
// ran (as a piecewise capture fails after its earlier segments ran).
struct FakePiecewiseBackend : FakeOneGraphBackend {
  using piecewise_type = FakePieces;
  std::atomic<int> piece_launches{0};
  std::atomic<int> piece_captures{0};
  std::vector<std::shared_ptr<std::atomic<bool>>> pieces_gone;  // one per piecewise capture

  FakePiecewiseBackend() = default;
  FakePiecewiseBackend(const FakePiecewiseBackend& other) : FakeOneGraphBackend(other) {}

  template <class Issue>
  replay::CapturedPieces<FakePieces> capture_piecewise(FakeStream* s, Issue issue, std::source_location) {
    ++piece_captures;
    std::vector<std::string> regions;
    const std::size_t before = s->executed.size();
    s->regions = &regions;
    s->capturing_pieces = true;
    s->invalidated = false;
    try {
      issue(s);
    } catch (...) {
      s->regions = nullptr;
      s->capturing_pieces = false;
      throw;
    }
    s->regions = nullptr;
    s->capturing_pieces = false;
    if (s->invalidated) {
      throw std::runtime_error("fake piecewise segment invalidated by sync");
    }
    const std::vector<std::string> ops(s->executed.begin() + static_cast<std::ptrdiff_t>(before), s->executed.end());
    FakePieces pieces{std::function<void(FakeStream*)>(issue)};
    pieces_gone.push_back(pieces.gone);
    const std::size_t segments = regions.size() + 1;
    return {std::move(pieces), memory_of(ops), segments, std::move(regions)};
  }
  void launch_piecewise(FakePieces& pieces, FakeStream* s, std::source_location) {
    touch(s);
    ++piece_launches;
    std::vector<std::string> ignored;
    s->regions = &ignored;  // the executable runs its regions itself
    pieces.work(s);
    s->regions = nullptr;
  }
};

static_assert(!replay::CapturesPiecewise<FakeBackend>);
static_assert(!replay::CapturesPiecewise<FakeOneGraphBackend>);
static_assert(replay::CapturesPiecewise<FakePiecewiseBackend>);
static_assert(replay::CapturesPiecewise<replay::CudaGraphBackend>);

// A declared break in the stand-in work: replay::eager itself, unless the
// stand-in piecewise capture (or its executable) takes it.
void declared_break(FakeStream* s, const char* name) {
  if (s->regions != nullptr) {
    s->regions->push_back(name);
    s->executed.push_back(std::string("region ") + name);
    return;
  }
  replay::eager(replay::StreamRef(static_cast<cudaStream_t>(nullptr)), name, [&](replay::StreamRef) {
    s->executed.push_back(std::string("region ") + name);
  });
}

// Key n: "k<n>", then for an even n a declared break "read back" and
// "k<n>.tail"; n == 6 also a stray sync after the break; n == 5 a stray sync only.
void work_with_breaks(int n, FakeStream* s) {
  s->issue(op("k", n));
  if (n % 2 == 0) {
    declared_break(s, "read back");
    s->issue(op("k", n) + ".tail");
  }
  if (n == 5 || n == 6) {
    s->sync();
  }
}
std::vector<std::string> eager_with_breaks(int n) {
  FakeStream s;
  std::vector<std::string> regions;
  s.regions = &regions;
  work_with_breaks(n, &s);
  return s.executed;
}
void append(std::vector<std::string>& to, const std::vector<std::string>& ops) {
  to.insert(to.end(), ops.begin(), ops.end());
}

template <class Backend>
using BreakRouter = replay::ShapeRouter<int, Backend>;
Options piecewise_options(Options options = {}) {
  options.breaks = replay::BreakPolicy::piecewise;
  options.on_capture_failure = [](const int&, std::string_view) {};
  return options;
}

}  // namespace

TEST_SUITE("host") {
  TEST_CASE("BreakPolicy::eager: a work that declares a break runs eagerly, its regions in place, with the reason") {
    std::vector<std::string> reasons;
    BreakRouter<FakeOneGraphBackend> router(
        work_with_breaks, {.on_capture_failure = [&](const int&, std::string_view why) { reasons.emplace_back(why); }});
    FakeStream s;
    std::vector<std::string> expected;
    for (int i = 0; i < 3; ++i) {
      CHECK(router.run(2, &s).kind == replay::RouteKind::eager_fallback);
      append(expected, eager_with_breaks(2));
      CHECK(router.run(3, &s).graph());
      append(expected, eager_with_breaks(3));
    }
    CHECK(s.executed == expected);  // the region ran in place at every eager run
    REQUIRE(reasons.size() == 1);
    CHECK(reasons[0].find("replay::eager(\"read back\")") != std::string::npos);
    CHECK(reasons[0].find("BreakPolicy::piecewise") != std::string::npos);
    const auto two = router.entry_info(2);
    CHECK(two.kind == replay::RouterEntryKind::eager);
    CHECK(two.reason == reasons[0]);
    CHECK(two.regions.empty());
    CHECK(router.entry_info(3).kind == replay::RouterEntryKind::whole);
    CHECK(router.entry_info(4).kind == replay::RouterEntryKind::pending);  // never seen
    CHECK(router.stats().piecewise_captures == 0);
    CHECK(router.stats().capture_failures == 1);
    CHECK(replay::to_string(replay::RouterEntryKind::piecewise) == "piecewise");

    // BreakPolicy::piecewise needs a backend that captures piecewise.
    CHECK_THROWS_WITH_AS(BreakRouter<FakeOneGraphBackend>(work_with_breaks, piecewise_options()),
                         doctest::Contains("cannot capture piecewise"), replay::usage_error);
    CHECK_NOTHROW(BreakRouter<FakePiecewiseBackend>(work_with_breaks, piecewise_options()));
    // replay::eager outside a router's eager run, outside any capture, is still refused.
    CHECK_THROWS_WITH_AS(declared_break(&s, "stray"), doctest::Contains("outside any capture"), replay::usage_error);
  }

  TEST_CASE("BreakPolicy::piecewise: a declared break is captured piecewise; its capture is its run, never doubled") {
    BreakRouter<FakePiecewiseBackend> router(work_with_breaks, piecewise_options());
    FakeStream s;
    CHECK(router.run(2, &s).kind == replay::RouteKind::captured);
    CHECK(s.executed == eager_with_breaks(2));  // once: the capture ran it, nothing launched after
    CHECK(router.backend().piece_launches == 0);
    CHECK(router.backend().piece_captures == 1);
    std::vector<std::string> expected = eager_with_breaks(2);
    for (int i = 0; i < 3; ++i) {
      const auto route = router.run(2, &s);
      CHECK(route.kind == replay::RouteKind::replayed);
      CHECK(route.graph());
      append(expected, eager_with_breaks(2));
      CHECK(router.run(3, &s).graph());
      append(expected, eager_with_breaks(3));
    }
    CHECK(s.executed == expected);
    CHECK(router.backend().piece_launches == 3);
    const auto two = router.entry_info(2);
    CHECK(two.kind == replay::RouterEntryKind::piecewise);
    CHECK(two.segments == 2);
    CHECK(two.regions == std::vector<std::string>{"read back"});
    CHECK(two.reason.empty());
    CHECK(two.replays == 4);  // the capturing run and three launches
    CHECK(router.entry_info(3).kind == replay::RouterEntryKind::whole);
    CHECK(router.contains(2));
    CHECK(router.graph_count() == 2);
    const auto stats = router.stats();
    CHECK(stats.captures == 2);
    CHECK(stats.piecewise_captures == 1);
    CHECK(stats.capture_failures == 0);
    CHECK(stats.hits == 5);
    const auto all = router.entries();
    REQUIRE(all.size() == 2);
    CHECK(all[0].shape == 3);  // most recently used first
    CHECK(all[1].kind == replay::RouterEntryKind::piecewise);
  }

  TEST_CASE("BreakPolicy::piecewise: an undeclared break makes the key eager; a failure after part of the work ran is thrown") {
    std::vector<std::pair<int, std::string>> reported;
    auto options = piecewise_options();
    options.on_capture_failure = [&](const int& k, std::string_view why) { reported.emplace_back(k, why); };
    BreakRouter<FakePiecewiseBackend> router(work_with_breaks, options);
    FakeStream s;
    // 5: a stray sync and no declared break: eager as ever, nothing thrown.
    CHECK(router.run(5, &s).kind == replay::RouteKind::eager_fallback);
    CHECK(router.backend().piece_captures == 0);
    // 6: a declared break, then a stray sync: the piecewise capture ran the
    // first part and failed: thrown (running it again would repeat that part).
    s.executed.clear();
    CHECK_THROWS_WITH_AS((void)router.run(6, &s), doctest::Contains("invalidated by sync"), std::runtime_error);
    CHECK(s.executed == std::vector<std::string>{"k6", "region read back", "k6.tail"});
    CHECK(router.is_eager(6));
    const auto six = router.entry_info(6);
    CHECK(six.kind == replay::RouterEntryKind::eager);
    CHECK(six.reason.find("piecewise capture failed") != std::string::npos);
    REQUIRE(reported.size() == 2);
    CHECK(reported[1].first == 6);
    // Later runs are eager, whole, once each.
    s.executed.clear();
    CHECK(router.run(6, &s).kind == replay::RouteKind::eager_fallback);
    CHECK(s.executed == eager_with_breaks(6));
    CHECK(router.stats().capture_failures == 2);
    CHECK(router.stats().piecewise_captures == 0);
  }

  TEST_CASE("capture_all with BreakPolicy::piecewise: every bucket has its verdict, whole, piecewise or eager") {
    auto options = piecewise_options(Options::bucketed({1, 2, 3, 4, 5}));
    BreakRouter<FakePiecewiseBackend> router(work_with_breaks, options);
    FakeStream s;
    std::vector<int> progress;
    CHECK(router.capture_all(&s, [&](std::size_t, std::size_t, const int& shape) { progress.push_back(shape); }) == 4);
    CHECK(progress == std::vector<int>{5, 4, 3, 2, 1});
    // A piecewise capture runs its work once, on the caller's stream (as a warm-up would).
    std::vector<std::string> expected = eager_with_breaks(4);
    append(expected, eager_with_breaks(2));
    CHECK(s.executed == expected);
    std::map<int, replay::RouterEntryKind> kinds;
    for (const auto& entry : router.entries()) {
      kinds[entry.shape] = entry.kind;
    }
    using K = replay::RouterEntryKind;
    CHECK(kinds == std::map<int, K>{{1, K::whole}, {2, K::piecewise}, {3, K::whole}, {4, K::piecewise}, {5, K::eager}});
    const auto stats = router.stats();
    CHECK(stats.captures == 4);
    CHECK(stats.piecewise_captures == 2);
    CHECK(stats.capture_failures == 1);
    s.executed.clear();
    for (int k = 1; k <= 4; ++k) {
      CHECK(router.run(k, &s).kind == replay::RouteKind::replayed);
    }
    expected.clear();
    for (int k = 1; k <= 4; ++k) {
      append(expected, eager_with_breaks(k));
    }
    CHECK(s.executed == expected);
  }

  TEST_CASE("piecewise entries count against max_graphs and max_bytes, are evicted, and re-capture piecewise") {
    FakePiecewiseBackend backend;
    backend.footprint_per_op = 100;
    auto options = piecewise_options();
    options.max_graphs = 2;
    BreakRouter<FakePiecewiseBackend> router(work_with_breaks, options, backend);
    FakeStream s;
    (void)router.run(2, &s);  // piecewise, 3 ops
    (void)router.run(3, &s);  // whole, 1 op
    CHECK(router.memory().footprint_bytes == 400);
    CHECK(router.entry_info(2).memory.footprint_bytes == 300);
    (void)router.run(4, &s);  // piecewise: evicts 2, the least recently used
    CHECK(router.stats().evictions == 1);
    CHECK_FALSE(router.contains(2));
    CHECK(router.entry_info(2).kind == replay::RouterEntryKind::pending);
    REQUIRE(router.backend().pieces_gone.size() == 2);
    CHECK(router.backend().pieces_gone[0]->load());  // the evicted executable is destroyed
    CHECK_FALSE(router.backend().pieces_gone[1]->load());
    CHECK(router.memory().footprint_bytes == 400);
    // invalidate(): the next run re-captures it piecewise (no whole capture tried), once.
    CHECK(router.invalidate(4));
    CHECK(router.entry_info(4).stale);
    s.executed.clear();
    CHECK(router.run(4, &s).kind == replay::RouteKind::recaptured);
    CHECK(s.executed == eager_with_breaks(4));
    CHECK(router.entry_info(4).kind == replay::RouterEntryKind::piecewise);
    CHECK(router.backend().pieces_gone[1]->load());  // replaced
    CHECK(router.graph_count() == 2);
    CHECK(router.memory().footprint_bytes == 400);
    CHECK(router.stats().piecewise_captures == 3);
    CHECK(router.evict(4));
    CHECK(router.memory().footprint_bytes == 100);
    // max_bytes: a piecewise entry is charged what its capture reported.
    auto by_bytes = piecewise_options();
    by_bytes.max_bytes = 500;
    BreakRouter<FakePiecewiseBackend> bounded(work_with_breaks, by_bytes, backend);
    (void)bounded.run(2, &s);  // 300
    (void)bounded.run(4, &s);  // 600 > 500: evicts 2
    CHECK_FALSE(bounded.contains(2));
    CHECK(bounded.entry_info(4).kind == replay::RouterEntryKind::piecewise);
    CHECK(bounded.memory().footprint_bytes == 300);
  }

  TEST_CASE("run_staged with a piecewise key: stage in, the capture's run or a launch, read out, in order") {
    BreakRouter<FakePiecewiseBackend> router(work_with_breaks, piecewise_options());
    FakeStream a;
    FakeStream b;
    const auto stage = [](const int&, const int&, FakeStream* s) { s->issue("copy in"); };
    const auto read = [](const replay::Route<int>&, FakeStream* s) { s->issue("copy out"); };
    CHECK(router.run_staged(2, &a, stage, read).kind == replay::RouteKind::captured);
    CHECK(router.run_staged(2, &b, stage, read).kind == replay::RouteKind::replayed);
    for (FakeStream* s : {&a, &b}) {
      std::vector<std::string> expected{"copy in"};
      append(expected, eager_with_breaks(2));
      expected.emplace_back("copy out");
      CHECK(s->executed == expected);
    }
    CHECK(router.backend().orderings == 1);  // b was ordered after a
  }

  TEST_CASE("an invalidated whole graph whose work now declares a break is replaced by a piecewise one") {
    bool declare = false;
    BreakRouter<FakePiecewiseBackend> router(
        [&declare](int n, FakeStream* s) {
          s->issue(op("k", n));
          if (declare) {
            declared_break(s, "read back");
          }
        },
        piecewise_options());
    FakeStream s;
    (void)router.run(3, &s);
    CHECK(router.entry_info(3).kind == replay::RouterEntryKind::whole);
    declare = true;
    CHECK(router.invalidate(3));
    s.executed.clear();
    CHECK(router.run(3, &s).kind == replay::RouteKind::recaptured);
    CHECK(s.executed == std::vector<std::string>{"k3", "region read back"});  // once
    CHECK(router.entry_info(3).kind == replay::RouterEntryKind::piecewise);
    CHECK(router.graph_count() == 1);
    CHECK(router.stats().updates == 0);
    CHECK(router.stats().reinstantiations == 0);
    CHECK(router.run(3, &s).kind == replay::RouteKind::replayed);
    CHECK(router.backend().piece_launches == 1);
  }
}
