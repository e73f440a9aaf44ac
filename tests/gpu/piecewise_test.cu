// Piecewise capture on the device: breaks in the middle, at the start, at the
// end and in a row; side streams; moving outputs; a flipping branch and the
// bounds of the segment tree; resumes after a miss; exceptions in regions;
// two threads on two streams; and every misuse refused with the stream left
// usable. Every result is checked against the same kernels run eagerly.
#include <doctest/doctest.h>

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "gpu_suite.hpp"
#include "replay/replay.hpp"

namespace {
constexpr int kN = 1024;

__global__ void add_kernel(int* x, int n, int v) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) {
    x[i] += v;
  }
}
__global__ void mul_kernel(int* x, int n, int m) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) {
    x[i] *= m;
  }
}
__global__ void scale_into_kernel(const int* x, int* out, int n, int m) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) {
    out[i] = x[i] * m;
  }
}
__global__ void positive_flag_kernel(const int* x, int* flag) { *flag = x[0] > 0 ? 1 : 0; }

constexpr unsigned kBlocks = (kN + 255) / 256;
void add(replay::StreamRef s, int* x, int v) {
  add_kernel<<<kBlocks, 256, 0, s.get()>>>(x, kN, v);
  replay::check_last_launch();
}
void mul(replay::StreamRef s, int* x, int m) {
  mul_kernel<<<kBlocks, 256, 0, s.get()>>>(x, kN, m);
  replay::check_last_launch();
}

std::vector<int> random_ints(int lo, int hi, std::size_t n = kN) {
  std::uniform_int_distribution<int> dist(lo, hi);
  std::vector<int> out(n);
  for (int& v : out) {
    v = dist(replay_test::rng());
  }
  return out;
}
std::vector<int> read(const replay::DeviceBuffer<int>& buf, replay::StreamRef s) {
  std::vector<int> out(buf.size());
  buf.copy_to(std::span<int>(out), s);
  s.synchronize();
  return out;
}
int read_one(const int* device, replay::StreamRef s) {
  int value = 0;
  replay::check(cudaMemcpyAsync(&value, device, sizeof value, cudaMemcpyDeviceToHost, s.get()), "cudaMemcpyAsync");
  s.synchronize();
  return value;
}

// Runs x = 2x + 1 eagerly and checks it: proves the stream still works.
void expect_stream_usable(replay::StreamRef s) {
  REQUIRE_FALSE(s.is_capturing());
  replay::DeviceBuffer<int> buf(kN);
  const auto in = random_ints(-100, 100);
  buf.copy_from(std::span<const int>(in), s);
  mul(s, buf.data(), 2);
  add(s, buf.data(), 1);
  const auto out = read(buf, s);
  for (std::size_t i = 0; i < in.size(); ++i) {
    REQUIRE(out[i] == 2 * in[i] + 1);
  }
  CHECK(cudaPeekAtLastError() == cudaSuccess);
}

// The flipping-branch model: x += 1, flag = x[0] > 0, read flag on the host;
// then x *= 2 when positive, else x += 100.
struct BranchModel {
  replay::DeviceBuffer<int> x{kN};
  replay::DeviceBuffer<int> flag{1};
  std::atomic<int> work_calls{0};

  void work(replay::StreamRef s) {
    ++work_calls;
    add(s, x.data(), 1);
    positive_flag_kernel<<<1, 1, 0, s.get()>>>(x.data(), flag.data());
    replay::check_last_launch();
    const bool positive = replay::eager(s, "decide", [this](replay::StreamRef r) { return read_one(flag.data(), r) != 0; });
    if (positive) {
      mul(s, x.data(), 2);
    } else {
      add(s, x.data(), 100);
    }
  }
  // The same kernels, eagerly, on a buffer of its own.
  static std::vector<int> eager(const std::vector<int>& in, replay::StreamRef s) {
    replay::DeviceBuffer<int> y(kN);
    replay::DeviceBuffer<int> f(1);
    y.copy_from(std::span<const int>(in), s);
    add(s, y.data(), 1);
    positive_flag_kernel<<<1, 1, 0, s.get()>>>(y.data(), f.data());
    replay::check_last_launch();
    if (read_one(f.data(), s) != 0) {
      mul(s, y.data(), 2);
    } else {
      add(s, y.data(), 100);
    }
    return read(y, s);
  }
};

// An input whose first element makes the branch go `positive` (after the +1).
std::vector<int> input_for(bool positive) {
  auto in = random_ints(-1000, 1000);
  in[0] = positive ? 5 + (in[0] & 63) : -5 - (in[0] & 63);
  return in;
}

}  // namespace

TEST_SUITE("gpu" * replay_test::needs_device()) {
  TEST_CASE("a break in the middle: the capture computes once, each launch replays segment, region, segment") {
    replay::Stream stream;
    replay::DeviceBuffer<int> x(kN);
    int seen = 0;  // what the region read back
    const replay::PiecewiseExec* self = nullptr;
    std::uint64_t launches_seen = 99;  // what the region saw of its own executable's stats
    auto in = random_ints(-1000, 1000);
    x.copy_from(std::span<const int>(in), stream);
    auto exec = replay::capture_piecewise(stream, [&](replay::StreamRef s) {
      add(s, x.data(), 3);
      replay::eager(s, "read back", [&](replay::StreamRef r) {
        seen = read_one(x.data(), r);
        if (self != nullptr) {
          launches_seen = self->stats().launches;  // inspection from inside a launch: no deadlock
        }
      });
      mul(s, x.data(), 2);
    });
    self = &exec;
    // Unlike replay::capture, the capture ran the work, and the region saw the real data.
    CHECK(seen == in[0] + 3);
    auto out = read(x, stream);
    for (std::size_t i = 0; i < in.size(); ++i) {
      REQUIRE(out[i] == (in[i] + 3) * 2);
    }
    const auto path = exec.last_path();
    REQUIRE(path.size() == 2);
    CHECK(path[0].nodes == 1);
    CHECK(path[0].node_counts.at(replay::NodeType::kernel) == 1);
    CHECK(path[0].region == "read back");
    CHECK(path[1].nodes == 1);
    CHECK(path[1].region.empty());
    CHECK(exec.segment_count() == 2);
    CHECK(exec.path_count() == 1);
    for (int rep = 0; rep < 3; ++rep) {
      in = random_ints(-1000, 1000);
      x.copy_from(std::span<const int>(in), stream);
      exec.launch(stream);
      out = read(x, stream);
      CHECK(seen == in[0] + 3);
      CHECK(launches_seen == static_cast<std::uint64_t>(rep));  // counted when the launch completes
      for (std::size_t i = 0; i < in.size(); ++i) {
        REQUIRE(out[i] == (in[i] + 3) * 2);
      }
    }
    const auto stats = exec.stats();
    CHECK(stats.launches == 3);
    CHECK(stats.segment_launches == 2 + 3 * 2);
    CHECK(stats.region_runs == 1 + 3);
    CHECK(stats.misses == 0);
    CHECK(stats.captures == 1);
    const std::string dot = exec.to_dot();
    CHECK(dot.find("region read back") != std::string::npos);
    CHECK(dot.find("hexagon") != std::string::npos);
    const auto file = std::filesystem::temp_directory_path() / "replay_piecewise_test.dot";
    exec.write_dot(file);
    std::ifstream written(file);
    std::stringstream text;
    text << written.rdbuf();
    CHECK(text.str() == dot);
    std::filesystem::remove(file);
  }

  TEST_CASE("breaks at the start, at the end and two in a row: empty segments are kept, not launched") {
    replay::Stream stream;
    replay::DeviceBuffer<int> x(kN);
    std::vector<int> in;
    std::vector<int> out(kN);
    int middle_runs = 0;
    auto check_round = [&] {
      for (std::size_t i = 0; i < in.size(); ++i) {
        REQUIRE(out[i] == (in[i] + 1) * 3);
      }
    };
    in = random_ints(-1000, 1000);
    auto exec2 = replay::capture_piecewise(stream, [&](replay::StreamRef s) {
      replay::eager(s, "stage", [&](replay::StreamRef r) { x.copy_from(std::span<const int>(in), r); });
      add(s, x.data(), 1);
      replay::eager(s, "first", [&](replay::StreamRef) { ++middle_runs; });
      replay::eager(s, "second", [&](replay::StreamRef) { ++middle_runs; });
      mul(s, x.data(), 3);
      replay::eager(s, "read out", [&](replay::StreamRef r) {
        x.copy_to(std::span<int>(out), r);
        r.synchronize();
      });
    });
    check_round();
    const auto path = exec2.last_path();
    REQUIRE(path.size() == 5);
    const std::vector<std::size_t> nodes{path[0].nodes, path[1].nodes, path[2].nodes, path[3].nodes, path[4].nodes};
    CHECK(nodes == std::vector<std::size_t>{0, 1, 0, 1, 0});
    CHECK(path[0].region == "stage");
    CHECK(path[1].region == "first");
    CHECK(path[2].region == "second");
    CHECK(path[3].region == "read out");
    CHECK(path[4].region.empty());
    const int runs_before = middle_runs;
    for (int rep = 0; rep < 3; ++rep) {
      in = random_ints(-1000, 1000);
      exec2.launch(stream);  // the last region synchronized: `out` is ready when launch returns
      check_round();
    }
    CHECK(middle_runs == runs_before + 3 * 2);
    CHECK(exec2.stats().segment_launches == 2 + 3 * 2);  // the three empty segments never launch
  }

  TEST_CASE("side streams: a fork joined before a break stays in its segment; an unjoined one is refused") {
    replay::Stream stream;
    replay::Stream side;
    replay::DeviceBuffer<int> x(kN);
    replay::DeviceBuffer<int> y(kN);
    int seen = 0;
    auto work = [&](replay::StreamRef s) {
      {
        replay::ScopedFork fork(s, {side.ref()});
        add(side, y.data(), 7);
        add(s, x.data(), 1);
        fork.join();
      }
      replay::eager(s, "read", [&](replay::StreamRef r) { seen = read_one(y.data(), r); });
      mul(s, x.data(), 5);
    };
    auto in_x = random_ints(-1000, 1000);
    auto in_y = random_ints(-1000, 1000);
    x.copy_from(std::span<const int>(in_x), stream);
    y.copy_from(std::span<const int>(in_y), stream);
    auto exec = replay::capture_piecewise(stream, work);
    CHECK(seen == in_y[0] + 7);
    for (int rep = 0; rep < 2; ++rep) {
      in_x = random_ints(-1000, 1000);
      in_y = random_ints(-1000, 1000);
      x.copy_from(std::span<const int>(in_x), stream);
      y.copy_from(std::span<const int>(in_y), stream);
      exec.launch(stream);
      const auto out_x = read(x, stream);
      const auto out_y = read(y, stream);
      CHECK(seen == in_y[0] + 7);
      for (std::size_t i = 0; i < in_x.size(); ++i) {
        REQUIRE(out_x[i] == (in_x[i] + 1) * 5);
        REQUIRE(out_y[i] == in_y[i] + 7);
      }
    }
    // Unjoined at a break, and at the end of the work.
    CHECK_THROWS_WITH_AS((void)replay::capture_piecewise(stream,
                                                         [&](replay::StreamRef s) {
                                                           replay::fork(s, {side.ref()});
                                                           add(side, y.data(), 1);
                                                           replay::eager(s, "too early", [](replay::StreamRef) {});
                                                         }),
                         doctest::Contains("replay::eager(\"too early\")"), replay::usage_error);
    CHECK_FALSE(side.is_capturing());
    expect_stream_usable(stream);
    expect_stream_usable(side);
    CHECK_THROWS_WITH_AS((void)replay::capture_piecewise(stream,
                                                         [&](replay::StreamRef s) {
                                                           replay::eager(s, "fine", [](replay::StreamRef) {});
                                                           replay::fork(s, {side.ref()});
                                                           add(side, y.data(), 1);
                                                         }),
                         doctest::Contains("not joined back"), replay::usage_error);
    expect_stream_usable(stream);
    expect_stream_usable(side);
  }

  TEST_CASE("misuse inside a piecewise capture is refused and leaves the stream usable") {
    replay::Stream stream;
    replay::Stream other;
    replay::DeviceBuffer<int> x(kN);
    auto noop = [](replay::StreamRef) {};
    // A break on another stream than the capturing one.
    CHECK_THROWS_WITH_AS((void)replay::capture_piecewise(stream,
                                                         [&](replay::StreamRef s) {
                                                           add(s, x.data(), 1);
                                                           replay::eager(other, "elsewhere", noop);
                                                         }),
                         doctest::Contains("but the piecewise capture is on"), replay::usage_error);
    expect_stream_usable(stream);
    // A break inside a capture nested in the piecewise one.
    CHECK_THROWS_WITH_AS((void)replay::capture_piecewise(stream,
                                                         [&](replay::StreamRef s) {
                                                           replay::CaptureScope inner(other);
                                                           add(other, x.data(), 1);
                                                           replay::eager(s, "nested", noop);
                                                         }),
                         doctest::Contains("inside a capture nested"), replay::usage_error);
    expect_stream_usable(stream);
    expect_stream_usable(other);
#if CUDART_VERSION >= 12040
    // ... and inside a GraphBuilder conditional body.
    CHECK_THROWS_WITH_AS((void)replay::capture_piecewise(stream,
                                                         [&](replay::StreamRef s) {
                                                           replay::Graph graph = replay::make_graph();
                                                           replay::GraphBuilder b{graph};
                                                           auto cond = b.make_condition(1);
                                                           auto node = b.add_if(cond, {});
                                                           (void)node.body().capture(other, [&](replay::StreamRef) {
                                                             replay::eager(s, "in a body", noop);
                                                           });
                                                         }),
                         doctest::Contains("inside a capture nested"), replay::usage_error);
    expect_stream_usable(stream);
    expect_stream_usable(other);
#endif
    // A region inside a region, and a piecewise capture inside a region or a work.
    CHECK_THROWS_WITH_AS(
        (void)replay::capture_piecewise(stream,
                                        [&](replay::StreamRef s) {
                                          replay::eager(s, "outer",
                                                        [&](replay::StreamRef r) { replay::eager(r, "inner", noop); });
                                        }),
        doctest::Contains("inside a region"), replay::usage_error);
    expect_stream_usable(stream);
    CHECK_THROWS_WITH_AS((void)replay::capture_piecewise(stream,
                                                         [&](replay::StreamRef s) {
                                                           replay::eager(s, "outer", [&](replay::StreamRef r) {
                                                             (void)replay::capture_piecewise(r, noop);
                                                           });
                                                         }),
                         doctest::Contains("inside a region"), replay::usage_error);
    expect_stream_usable(stream);
    CHECK_THROWS_WITH_AS(
        (void)replay::capture_piecewise(stream, [&](replay::StreamRef s) { (void)replay::capture_piecewise(s, noop); }),
        doctest::Contains("do not nest"), replay::usage_error);
    expect_stream_usable(stream);
    // A region that begins a capture and leaves it open.
    CHECK_THROWS_WITH_AS((void)replay::capture_piecewise(stream,
                                                         [&](replay::StreamRef s) {
                                                           replay::eager(s, "opens", [](replay::StreamRef r) {
                                                             replay::check(cudaStreamBeginCapture(
                                                                               r.get(), cudaStreamCaptureModeRelaxed),
                                                                           "cudaStreamBeginCapture");
                                                           });
                                                         }),
                         doctest::Contains("left it open"), replay::usage_error);
    expect_stream_usable(stream);
    // A break inside a capture that makes one graph names the piecewise entry point.
    CHECK_THROWS_WITH_AS((void)replay::capture(stream, [&](replay::StreamRef s) { replay::eager(s, "one graph", noop); }),
                         doctest::Contains("replay::capture_piecewise"), replay::usage_error);
    expect_stream_usable(stream);
    // A break after the capture ended, and a launch inside a capture.
    replay::StreamRef kept = stream;
    auto exec = replay::capture_piecewise(stream, [&](replay::StreamRef s) {
      kept = s;
      add(s, x.data(), 1);
    });
    CHECK_THROWS_WITH_AS(replay::eager(kept, "late", noop), doctest::Contains("outside any capture"),
                         replay::usage_error);
    CHECK_THROWS_WITH_AS((void)replay::capture(other, [&](replay::StreamRef s) { exec.launch(s); }),
                         doctest::Contains("inside a stream capture"), replay::usage_error);
    // ... and a launch on a stream in a capture replay does not know of (raw CUDA, another library).
    replay::check(cudaStreamBeginCapture(other.get(), cudaStreamCaptureModeRelaxed), "cudaStreamBeginCapture");
    CHECK_THROWS_WITH_AS(exec.launch(other), doctest::Contains("which is capturing"), replay::usage_error);
    cudaGraph_t raw = nullptr;
    replay::check(cudaStreamEndCapture(other.get(), &raw), "cudaStreamEndCapture");
    CHECK(raw != nullptr);
    replay::check(cudaGraphDestroy(raw), "cudaGraphDestroy");
    expect_stream_usable(stream);
    expect_stream_usable(other);
  }

  TEST_CASE("a region whose output moves: eager_into copies it into the static buffer the next segment reads") {
    replay::Stream stream;
    replay::DeviceBuffer<int> x(kN);
    replay::DeviceBuffer<int> staged(kN);
    std::vector<replay::DeviceBuffer<int>> pool;
    for (int i = 0; i < 3; ++i) {
      pool.emplace_back(kN);
    }
    int calls = 0;
    std::set<const int*> addresses;
    auto work = [&](replay::StreamRef s) {
      add(s, x.data(), 1);
      replay::eager_into(s, "moving output", staged.view(), [&](replay::StreamRef r) {
        replay::DeviceBuffer<int>& out = pool[static_cast<std::size_t>(calls++ % 3)];  // a new address each call
        scale_into_kernel<<<kBlocks, 256, 0, r.get()>>>(x.data(), out.data(), kN, 10);
        replay::check_last_launch();
        addresses.insert(out.data());
        return std::span<const int>(out.data(), out.size());
      });
      add(s, staged.data(), 5);
    };
    auto in = random_ints(-1000, 1000);
    x.copy_from(std::span<const int>(in), stream);
    auto exec = replay::capture_piecewise(stream, work);
    auto check_out = [&] {
      const auto out = read(staged, stream);
      for (std::size_t i = 0; i < in.size(); ++i) {
        REQUIRE(out[i] == (in[i] + 1) * 10 + 5);
      }
    };
    check_out();
    for (int rep = 0; rep < 4; ++rep) {
      in = random_ints(-1000, 1000);
      x.copy_from(std::span<const int>(in), stream);
      exec.launch(stream);
      check_out();
    }
    CHECK(addresses.size() == 3);  // the output really moved
    CHECK_THROWS_WITH_AS((void)replay::capture_piecewise(stream,
                                                         [&](replay::StreamRef s) {
                                                           replay::eager_into(s, "short", staged.view(),
                                                                              [&](replay::StreamRef) {
                                                                                return std::span<const int>(
                                                                                    pool[0].data(), kN / 2);
                                                                              });
                                                         }),
                         doctest::Contains("elements for a buffer of"), replay::usage_error);
    expect_stream_usable(stream);
  }

  TEST_CASE("a flipping branch: each value a region returns keys its own segments; none is replayed stale") {
    replay::Stream stream;
    BranchModel model;
    auto in = input_for(true);
    model.x.copy_from(std::span<const int>(in), stream);
    auto exec = replay::capture_piecewise(stream, [&](replay::StreamRef s) { model.work(s); });
    CHECK(read(model.x, stream) == BranchModel::eager(in, stream));
    for (const bool positive : {false, true, false, false, true, false}) {
      in = input_for(positive);
      model.x.copy_from(std::span<const int>(in), stream);
      exec.launch(stream);
      REQUIRE(read(model.x, stream) == BranchModel::eager(in, stream));
      const auto path = exec.last_path();
      REQUIRE(path.size() == 2);
      CHECK(path[0].region == "decide");
    }
    const auto stats = exec.stats();
    CHECK(stats.captures == 2);
    CHECK(stats.misses == 1);
    CHECK(stats.paths == 2);
    CHECK(stats.segments == 3);
    CHECK(model.work_calls.load() == 2);  // the capture, and the one resume after the miss
    const std::string dot = exec.to_dot();
    CHECK(dot.find("label=\"0\"") != std::string::npos);
    CHECK(dot.find("label=\"1\"") != std::string::npos);
  }

  TEST_CASE("bounds on the device: beyond max_paths the least recent path goes; a path over max_nodes is refused") {
    replay::Stream stream;
    replay::DeviceBuffer<int> x(kN);
    int count = 0;  // the host value that decides how many kernels follow
    auto work = [&](replay::StreamRef s) {
      add(s, x.data(), 1);
      const int n = replay::eager(s, "count", [&](replay::StreamRef) { return count; });
      for (int i = 0; i <= n; ++i) {
        add(s, x.data(), 2);
      }
    };
    replay::PiecewiseOptions options;
    options.max_paths = 2;
    auto in = random_ints(-1000, 1000);
    x.copy_from(std::span<const int>(in), stream);
    auto exec = replay::capture_piecewise(stream, work, options);
    for (const int c : {1, 2, 0, 1, 2, 2, 0}) {
      count = c;
      in = random_ints(-1000, 1000);
      x.copy_from(std::span<const int>(in), stream);
      exec.launch(stream);
      const auto out = read(x, stream);
      for (std::size_t i = 0; i < in.size(); ++i) {
        REQUIRE(out[i] == in[i] + 1 + 2 * (c + 1));
      }
      CHECK(exec.path_count() <= 2);
      REQUIRE(exec.last_path().size() == 2);
      CHECK(exec.last_path()[1].nodes == static_cast<std::size_t>(c + 1));
    }
    CHECK(exec.stats().evictions >= 3);
    options = {};
    options.max_nodes = 2;  // the path holds 1 + 2 kernel nodes
    count = 1;
    CHECK_THROWS_WITH_AS((void)replay::capture_piecewise(stream, work, options), doctest::Contains("max_nodes"),
                         replay::usage_error);
    expect_stream_usable(stream);
  }

  TEST_CASE("a resume after a miss runs no region twice, and a work that changed is refused, not replayed") {
    replay::Stream stream;
    replay::DeviceBuffer<int> x(kN);
    int counted = 0;
    bool choice = true;
    bool extra = false;
    auto work = [&](replay::StreamRef s) {
      replay::eager(s, "count", [&](replay::StreamRef) { ++counted; });
      add(s, x.data(), 1);
      if (extra) {
        add(s, x.data(), 1);  // the work changed: another path for the same region values
      }
      if (replay::eager(s, "choose", [&](replay::StreamRef) { return choice; })) {
        mul(s, x.data(), 3);
      } else {
        add(s, x.data(), -4);
      }
    };
    auto in = random_ints(-1000, 1000);
    x.copy_from(std::span<const int>(in), stream);
    auto exec = replay::capture_piecewise(stream, work);
    CHECK(counted == 1);
    choice = false;  // a miss: resumes after "choose"
    in = random_ints(-1000, 1000);
    x.copy_from(std::span<const int>(in), stream);
    exec.launch(stream);
    CHECK(counted == 2);  // "count" ran once in this launch, not again in the resume
    auto out = read(x, stream);
    for (std::size_t i = 0; i < in.size(); ++i) {
      REQUIRE(out[i] == in[i] + 1 - 4);
    }
    // Evict nothing, but change the work and meet a new value: the prefix differs.
    replay::PiecewiseOptions options;
    auto exec2 = replay::capture_piecewise(stream, work, options);
    extra = true;
    choice = !choice;
    CHECK_THROWS_WITH_AS(exec2.launch(stream), doctest::Contains("took another path"), replay::usage_error);
    expect_stream_usable(stream);
    extra = false;
    in = random_ints(-1000, 1000);
    x.copy_from(std::span<const int>(in), stream);
    exec2.launch(stream);  // the same miss, now with the work as it was: captured and right
    out = read(x, stream);
    for (std::size_t i = 0; i < in.size(); ++i) {
      REQUIRE(out[i] == (choice ? (in[i] + 1) * 3 : in[i] + 1 - 4));
    }
  }

  TEST_CASE("an exception in a region reaches the caller, at capture and at launch; stream and executable stay usable") {
    replay::Stream stream;
    replay::DeviceBuffer<int> x(kN);
    bool fail = true;
    auto work = [&](replay::StreamRef s) {
      add(s, x.data(), 1);
      replay::eager(s, "may throw", [&](replay::StreamRef) {
        if (fail) {
          throw std::runtime_error("region failed");
        }
      });
      mul(s, x.data(), 2);
    };
    CHECK_THROWS_WITH_AS((void)replay::capture_piecewise(stream, work), "region failed", std::runtime_error);
    expect_stream_usable(stream);
    fail = false;
    auto in = random_ints(-1000, 1000);
    x.copy_from(std::span<const int>(in), stream);
    auto exec = replay::capture_piecewise(stream, work);
    fail = true;
    CHECK_THROWS_WITH_AS(exec.launch(stream), "region failed", std::runtime_error);
    expect_stream_usable(stream);
    fail = false;
    in = random_ints(-1000, 1000);
    x.copy_from(std::span<const int>(in), stream);
    exec.launch(stream);
    const auto out = read(x, stream);
    for (std::size_t i = 0; i < in.size(); ++i) {
      REQUIRE(out[i] == (in[i] + 1) * 2);
    }
    // The work itself throwing after a break: the open segment is abandoned.
    CHECK_THROWS_WITH_AS((void)replay::capture_piecewise(stream,
                                                         [&](replay::StreamRef s) {
                                                           replay::eager(s, "fine", [](replay::StreamRef) {});
                                                           add(s, x.data(), 1);
                                                           throw std::runtime_error("work failed");
                                                         }),
                         "work failed", std::runtime_error);
    expect_stream_usable(stream);
  }

  TEST_CASE("two threads on two streams share one executable: leases serialize them, results match eager") {
    replay::Stream capture_stream;
    BranchModel model;
    auto first = input_for(true);
    model.x.copy_from(std::span<const int>(first), capture_stream);
    auto exec = replay::capture_piecewise(capture_stream, [&](replay::StreamRef s) { model.work(s); });
    capture_stream.synchronize();
    const int rounds = replay_test::scaled(40);
    std::vector<std::vector<std::vector<int>>> inputs(2);
    for (auto& per_thread : inputs) {
      for (int r = 0; r < rounds; ++r) {
        per_thread.push_back(input_for(r % 3 == 0));
      }
    }
    std::vector<std::vector<std::vector<int>>> outputs(2, std::vector<std::vector<int>>(rounds));
    std::vector<std::thread> threads;
    for (int t = 0; t < 2; ++t) {
      threads.emplace_back([&, t] {
        replay::Stream stream;
        for (int r = 0; r < rounds; ++r) {
          auto lease = exec.lease(stream);
          model.x.copy_from(std::span<const int>(inputs[t][r]), stream);
          exec.launch(stream);
          outputs[t][r] = read(model.x, stream);
        }
      });
    }
    for (auto& thread : threads) {
      thread.join();
    }
    for (int t = 0; t < 2; ++t) {
      for (int r = 0; r < rounds; ++r) {
        REQUIRE(outputs[t][r] == BranchModel::eager(inputs[t][r], capture_stream));
      }
    }
    CHECK(exec.stats().launches == static_cast<std::uint64_t>(2 * rounds));
    CHECK(exec.stats().paths == 2);
  }

  TEST_CASE("launch() alone from two threads on two streams: serialized and ordered, no update is lost") {
    replay::Stream capture_stream;
    replay::DeviceBuffer<int> x(kN);
    std::atomic<int> reads{0};
    const auto in = random_ints(-1000, 1000);
    x.copy_from(std::span<const int>(in), capture_stream);
    auto exec = replay::capture_piecewise(capture_stream, [&](replay::StreamRef s) {
      add(s, x.data(), 1);
      replay::eager(s, "read", [&](replay::StreamRef r) { (void)read_one(x.data(), r); ++reads; });
      add(s, x.data(), 2);
    });
    const int rounds = replay_test::scaled(100);
    std::vector<std::thread> threads;
    for (int t = 0; t < 2; ++t) {
      threads.emplace_back([&] {
        replay::Stream stream;
        for (int r = 0; r < rounds; ++r) {
          exec.launch(stream);
        }
        stream.synchronize();
      });
    }
    for (auto& thread : threads) {
      thread.join();
    }
    // Eagerly, 2 * rounds + 1 rounds of x += 3, in some order: each read-modify-write saw the one before.
    const auto out = read(x, capture_stream);
    for (std::size_t i = 0; i < in.size(); ++i) {
      REQUIRE(out[i] == in[i] + 3 * (2 * rounds + 1));
    }
    CHECK(reads.load() == 2 * rounds + 1);
  }
}
