// The capture audit on the device: each case plants one cause on a known
// line and checks that the report names the API, its error (or that the
// work escaped), the thread and that line. Breaking causes: a raw
// cudaStreamSynchronize, cudaMalloc, cudaFree, cudaEventQuery of a captured
// event, another thread's cudaDeviceSynchronize. Silent causes (escaped
// work): a kernel on the legacy default stream, a synchronous cudaMemcpy
// from pageable memory, a kernel on a stream never joined. Also: a clean
// capture and its inventory, an unsafe call in relaxed mode, 8 other
// threads busy on their own streams, the audit switch of replay::capture
// and ShapeRouter, a second CUPTI subscriber. Every failed check prints
// the whole report, the frames of its findings and the calls recorded.
#include <doctest/doctest.h>

#include <cupti_callbacks.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "gpu_suite.hpp"
#include "replay/audit.hpp"
#include "replay/replay.hpp"

namespace audit_test {

constexpr int kN = 1024;

__global__ void scale_kernel(float* x, int n, float a) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) {
    x[i] *= a;
  }
}

__global__ void mark_kernel(int* flag) { *flag += 1; }

namespace {

namespace audit = replay::detail::audit;

unsigned blocks() { return (kN + 255) / 256; }

std::string base(const std::string& api) { return std::string(audit::split_api_name(api).base); }

// Everything about a report, for the failure messages.
std::string explain(const replay::AuditReport& report) {
  std::string out = report.to_string();
  auto frames = [&out](const char* what, const replay::AuditFinding& f) {
    out += std::string("  frames of the ") + what + " (" + f.api + "):\n";
    for (const replay::AuditFrame& frame : f.frames) {
      out += "    " + audit::describe_frame(frame) + "  [" + frame.object + "]\n";
    }
  };
  if (report.breaking) {
    frames("breaking call", *report.breaking);
  }
  for (const auto& f : report.escaped) {
    frames("escaped work", f);
  }
  for (const auto& f : report.unsafe) {
    frames("unsafe call", f);
  }
  out += "  calls recorded:\n";
  std::size_t shown = 0;
  for (const replay::AuditedCall& c : report.calls) {
    if (++shown > 300) {
      out += "    ...\n";
      break;
    }
    out += replay::detail::concat("    #", c.sequence, " ", c.api, c.nested ? " (nested)" : "", " -> ",
                                  c.returned ? audit::status_name(c.status, c.driver_api) : std::string("(running)"),
                                  " tid ", c.thread, c.capturing_thread ? " (capturing)" : "", " ",
                                  replay::AuditReport::stream_state_name(c.stream_state), " ",
                                  audit::hex(c.stream), c.kernel.empty() ? "" : " kernel ", c.kernel,
                                  c.graph_nodes > 0 ? " nodes " : "", c.graph_nodes > 0 ? std::to_string(c.graph_nodes) : "",
                                  "\n");
  }
  return out;
}

bool ends_with(const std::string& text, std::string_view tail) { return std::string_view(text).ends_with(tail); }

// The finding's user frame is on `line` of this file.
void check_frame(const replay::AuditFinding& finding, int line) {
  REQUIRE(finding.frame.has_value());
  CHECK(ends_with(finding.frame->file, "audit_test.cu"));
  CHECK(finding.frame->line == static_cast<unsigned>(line));
}

// Clears the error a planted raw call left in this thread's slot (the
// test's own call, so the test's to clear).
void clear_planted_error() { (void)cudaGetLastError(); }

}  // namespace
}  // namespace audit_test

using audit_test::base;
using audit_test::blocks;
using audit_test::check_frame;
using audit_test::explain;
using audit_test::kN;

TEST_SUITE("host") {
  TEST_CASE("audit: a stack taken in code nvcc compiled resolves to this file and line") {
    int line = 0;
    std::vector<replay::AuditFrame> frames;
    [&]() __attribute__((noinline)) {
      line = __LINE__; frames = replay::detail::audit::current_frames();
    }();
    std::string all;
    for (const auto& f : frames) {
      all += replay::detail::audit::describe_frame(f) + "\n";
    }
    INFO("frames:\n" << all);
    const auto user = replay::detail::audit::first_user_frame(frames);
    REQUIRE(user.has_value());
    CHECK(audit_test::ends_with(frames[*user].file, "audit_test.cu"));
    CHECK(frames[*user].line == static_cast<unsigned>(line));
  }
}

TEST_SUITE("gpu" * replay_test::needs_device()) {
  TEST_CASE("audit: a raw cudaStreamSynchronize is the breaking call, on the capturing thread, at its line") {
    replay::Stream stream;
    replay::DeviceBuffer<float> x(kN);
    int planted = 0;
    auto audited = replay::audit_capture(stream, [&](replay::StreamRef s) {
      audit_test::scale_kernel<<<blocks(), 256, 0, s.get()>>>(x.data(), kN, 2.0F);
      planted = __LINE__; (void)cudaStreamSynchronize(s.get());
      audit_test::scale_kernel<<<blocks(), 256, 0, s.get()>>>(x.data(), kN, 2.0F);
    });
    audit_test::clear_planted_error();
    const replay::AuditReport& r = audited.report;
    INFO(explain(r));
    CHECK_FALSE(audited.graph);
    CHECK(r.end_status == cudaErrorStreamCaptureInvalidated);
    REQUIRE(r.breaking.has_value());
    CHECK(base(r.breaking->api) == "cudaStreamSynchronize");
    CHECK(r.breaking->status == cudaErrorStreamCaptureUnsupported);
    CHECK_FALSE(r.breaking->inferred);
    CHECK(r.breaking->capturing_thread);
    CHECK(r.breaking->thread == replay::CaptureAudit::this_thread_id());
    check_frame(*r.breaking, planted);
    CHECK(r.verdict().find("audit_test.cu:" + std::to_string(planted)) != std::string::npos);
    CHECK(r.escaped.empty());
    CHECK_FALSE(stream.is_capturing());
  }

  TEST_CASE("audit: a raw cudaMalloc inside a capture is the breaking call at its line") {
    replay::Stream stream;
    replay::DeviceBuffer<float> x(kN);
    int planted = 0;
    void* p = nullptr;
    auto audited = replay::audit_capture(stream, [&](replay::StreamRef s) {
      audit_test::scale_kernel<<<blocks(), 256, 0, s.get()>>>(x.data(), kN, 2.0F);
      planted = __LINE__; (void)cudaMalloc(&p, 4096);
    });
    audit_test::clear_planted_error();
    if (p != nullptr) {
      (void)cudaFree(p);
    }
    const replay::AuditReport& r = audited.report;
    INFO(explain(r));
    CHECK_FALSE(audited.graph);
    REQUIRE(r.breaking.has_value());
    CHECK(base(r.breaking->api) == "cudaMalloc");
    CHECK(r.breaking->status == cudaErrorStreamCaptureUnsupported);
    CHECK(r.breaking->capturing_thread);
    check_frame(*r.breaking, planted);
    CHECK(r.breaking->advice.find("allocate before the capture") != std::string::npos);
  }

  TEST_CASE("audit: a raw cudaFree inside a capture is the breaking call at its line") {
    replay::Stream stream;
    replay::DeviceBuffer<float> x(kN);
    void* p = nullptr;
    REQUIRE(cudaMalloc(&p, 4096) == cudaSuccess);
    int planted = 0;
    cudaError_t freed = cudaSuccess;
    auto audited = replay::audit_capture(stream, [&](replay::StreamRef s) {
      audit_test::scale_kernel<<<blocks(), 256, 0, s.get()>>>(x.data(), kN, 2.0F);
      planted = __LINE__; freed = cudaFree(p);
    });
    audit_test::clear_planted_error();
    if (freed != cudaSuccess) {
      (void)cudaFree(p);
    }
    const replay::AuditReport& r = audited.report;
    INFO(explain(r));
    CHECK_FALSE(audited.graph);
    REQUIRE(r.breaking.has_value());
    CHECK(base(r.breaking->api) == "cudaFree");
    CHECK(r.breaking->status == cudaErrorStreamCaptureUnsupported);
    CHECK(r.breaking->capturing_thread);
    check_frame(*r.breaking, planted);
  }

  TEST_CASE("audit: cudaEventQuery of an event recorded in the capture is the breaking call at its line") {
    replay::Stream stream;
    replay::DeviceBuffer<float> x(kN);
    replay::Event event(replay::EventFlags::disable_timing);
    int planted = 0;
    auto audited = replay::audit_capture(stream, [&](replay::StreamRef s) {
      audit_test::scale_kernel<<<blocks(), 256, 0, s.get()>>>(x.data(), kN, 2.0F);
      event.record(s);
      planted = __LINE__; (void)cudaEventQuery(event.get());
      audit_test::scale_kernel<<<blocks(), 256, 0, s.get()>>>(x.data(), kN, 2.0F);
    });
    audit_test::clear_planted_error();
    const replay::AuditReport& r = audited.report;
    INFO(explain(r));
    REQUIRE(r.breaking.has_value());
    CHECK(base(r.breaking->api) == "cudaEventQuery");
    CHECK(r.breaking->status == cudaErrorCapturedEvent);
    CHECK(r.breaking->capturing_thread);
    check_frame(*r.breaking, planted);
  }

  TEST_CASE("audit: another thread's raw cudaDeviceSynchronize is named as another thread, with its frame") {
    replay::Stream stream;
    replay::DeviceBuffer<float> x(kN);
    int planted = 0;
    std::uint64_t other = 0;
    cudaError_t other_status = cudaSuccess;
    auto audited = replay::audit_capture(stream, [&](replay::StreamRef s) {
      audit_test::scale_kernel<<<blocks(), 256, 0, s.get()>>>(x.data(), kN, 2.0F);
      std::thread([&] {
        other = replay::CaptureAudit::this_thread_id();
        planted = __LINE__; other_status = cudaDeviceSynchronize();
        (void)cudaGetLastError();  // that thread's own error
      }).join();
      audit_test::scale_kernel<<<blocks(), 256, 0, s.get()>>>(x.data(), kN, 2.0F);
    });
    audit_test::clear_planted_error();
    const replay::AuditReport& r = audited.report;
    INFO(explain(r));
    INFO("the other thread's cudaDeviceSynchronize returned " << cudaGetErrorName(other_status));
    CHECK_FALSE(audited.graph);
    REQUIRE(r.breaking.has_value());
    CHECK(base(r.breaking->api) == "cudaDeviceSynchronize");
    CHECK(r.breaking->status == cudaErrorStreamCaptureUnsupported);
    CHECK_FALSE(r.breaking->capturing_thread);
    CHECK(r.breaking->thread == other);
    CHECK(r.breaking->thread != replay::CaptureAudit::this_thread_id());
    CHECK(r.breaking->summary.find("another thread (tid " + std::to_string(other) + ")") != std::string::npos);
    check_frame(*r.breaking, planted);
  }

  TEST_CASE("audit: a kernel on the legacy default stream escaped, by its demangled name, at its line") {
    replay::Stream stream(replay::StreamFlags::non_blocking);
    replay::DeviceBuffer<float> x(kN);
    replay::DeviceBuffer<int> flag(1);
    flag.fill(0, stream);
    stream.synchronize();
    int planted = 0;
    auto audited = replay::audit_capture(
        stream,
        [&](replay::StreamRef s) {
          audit_test::scale_kernel<<<blocks(), 256, 0, s.get()>>>(x.data(), kN, 2.0F);
          planted = __LINE__; audit_test::mark_kernel<<<1, 1>>>(flag.data());
        },
        replay::CaptureMode::this_thread);
    const replay::AuditReport& r = audited.report;
    INFO(explain(r));
    CHECK(audited.graph);  // silent: the capture succeeded
    CHECK_FALSE(r.breaking.has_value());
    REQUIRE(r.escaped.size() == 1);
    const replay::AuditFinding& escaped = r.escaped.front();
    CHECK(escaped.kernel == "audit_test::mark_kernel(int*)");
    CHECK(escaped.stream_state == replay::AuditStreamState::legacy);
    CHECK(escaped.capturing_thread);
    CHECK(escaped.status == 0);
    check_frame(escaped, planted);
    CHECK(escaped.summary.find("escaped the capture") != std::string::npos);
    // The graph holds the kernel launched on the capturing stream, not the escaped one.
    CHECK(r.inventory.checked);
    CHECK(r.inventory.matches());
    CHECK(r.inventory.kernel_nodes() == 1);
    REQUIRE(r.inventory.kernels.size() == 1);
    CHECK(r.inventory.kernels[0].kernel == "audit_test::scale_kernel(float*, int, float)");
    // It ran eagerly, once.
    CHECK(cudaDeviceSynchronize() == cudaSuccess);
    int ran = 0;
    REQUIRE(cudaMemcpy(&ran, flag.data(), sizeof ran, cudaMemcpyDeviceToHost) == cudaSuccess);
    CHECK(ran == 1);
  }

  TEST_CASE("audit: a synchronous cudaMemcpy from pageable memory escaped at its line") {
    replay::Stream stream;
    replay::DeviceBuffer<float> x(kN);
    std::vector<float> host(kN, 1.0F);
    int planted = 0;
    auto audited = replay::audit_capture(stream, [&](replay::StreamRef s) {
      audit_test::scale_kernel<<<blocks(), 256, 0, s.get()>>>(x.data(), kN, 2.0F);
      planted = __LINE__; (void)cudaMemcpy(x.data(), host.data(), kN * sizeof(float), cudaMemcpyHostToDevice);
    });
    audit_test::clear_planted_error();
    const replay::AuditReport& r = audited.report;
    INFO(explain(r));
    CHECK_FALSE(r.breaking.has_value());
    REQUIRE(r.escaped.size() == 1);
    const replay::AuditFinding& escaped = r.escaped.front();
    CHECK(base(escaped.api) == "cudaMemcpy");
    CHECK(escaped.status == 0);
    CHECK(escaped.capturing_thread);
    check_frame(escaped, planted);
    CHECK(r.inventory.copy_nodes == 0);
  }

  TEST_CASE("audit: a kernel on a second stream that never joined the capture escaped at its line") {
    replay::Stream stream;
    replay::Stream side;
    replay::DeviceBuffer<float> x(kN);
    replay::DeviceBuffer<float> y(kN);
    int planted = 0;
    auto audited = replay::audit_capture(stream, [&](replay::StreamRef s) {
      audit_test::scale_kernel<<<blocks(), 256, 0, s.get()>>>(x.data(), kN, 2.0F);
      planted = __LINE__; audit_test::scale_kernel<<<blocks(), 256, 0, side.get()>>>(y.data(), kN, 3.0F);
    });
    side.synchronize();
    const replay::AuditReport& r = audited.report;
    INFO(explain(r));
    CHECK(audited.graph);
    CHECK_FALSE(r.breaking.has_value());
    REQUIRE(r.escaped.size() == 1);
    const replay::AuditFinding& escaped = r.escaped.front();
    CHECK(escaped.kernel == "audit_test::scale_kernel(float*, int, float)");
    CHECK(escaped.stream_state == replay::AuditStreamState::not_capturing);
    CHECK(escaped.stream == reinterpret_cast<std::uintptr_t>(side.get()));
    check_frame(escaped, planted);
    CHECK(r.inventory.matches());
    CHECK(r.inventory.kernel_nodes() == 1);
  }

  TEST_CASE("audit: a clean capture with a fork and join has no findings and its inventory is the graph's") {
    replay::Stream stream;
    replay::Stream branch;
    replay::DeviceBuffer<float> x(kN);
    replay::DeviceBuffer<float> y(kN);
    replay::DeviceBuffer<int> flag(1);
    auto audited = replay::audit_capture(stream, [&](replay::StreamRef s) {
      replay::fork(s, {replay::StreamRef(branch)});
      audit_test::scale_kernel<<<blocks(), 256, 0, s.get()>>>(x.data(), kN, 2.0F);
      audit_test::scale_kernel<<<blocks(), 256, 0, branch.get()>>>(y.data(), kN, 3.0F);
      audit_test::mark_kernel<<<1, 1, 0, branch.get()>>>(flag.data());
      replay::join(s, {replay::StreamRef(branch)});
      replay::check(cudaMemsetAsync(flag.data(), 0, sizeof(int), s.get()), "cudaMemsetAsync");
      replay::check(cudaMemcpyAsync(y.data(), x.data(), kN * sizeof(float), cudaMemcpyDeviceToDevice, s.get()),
                    "cudaMemcpyAsync");
      audit_test::scale_kernel<<<blocks(), 256, 0, s.get()>>>(x.data(), kN, 0.5F);
    });
    const replay::AuditReport& r = audited.report;
    INFO(explain(r));
    REQUIRE(audited.graph);
    CHECK(r.clean());
    CHECK_FALSE(r.breaking.has_value());
    CHECK(r.escaped.empty());
    CHECK(r.unsafe.empty());
    CHECK(r.end_status == cudaSuccess);
    CHECK(r.inventory.checked);
    CHECK(r.inventory.matches());
    CHECK(r.inventory.kernel_nodes() == audited.graph.count(replay::NodeType::kernel));
    CHECK(r.inventory.kernel_nodes() == 4);
    CHECK(r.inventory.copy_nodes == audited.graph.count(replay::NodeType::memcpy));
    CHECK(r.inventory.memset_nodes == audited.graph.count(replay::NodeType::memset));
    CHECK(r.inventory.copies_launched == 1);
    CHECK(r.inventory.memsets_launched == 1);
    REQUIRE(r.inventory.kernels.size() == 2);
    for (const auto& entry : r.inventory.kernels) {
      CHECK(entry.launched == entry.in_graph);
      CHECK(entry.kernel.rfind("audit_test::", 0) == 0);  // demangled
    }
    // Both streams' launches were seen as part of this capture.
    std::size_t on_branch = 0;
    for (const auto& c : r.calls) {
      if (c.kind == replay::AuditCallKind::kernel_launch && !c.nested) {
        CHECK(c.stream_state == replay::AuditStreamState::this_capture);
        on_branch += c.stream == reinterpret_cast<std::uintptr_t>(branch.get()) ? 1 : 0;
      }
    }
    CHECK(on_branch == 2);
    CHECK(r.to_string().find("clean") != std::string::npos);
    CHECK(r.to_json().find("\"clean\":true") != std::string::npos);
  }

  TEST_CASE("audit: a cudaMalloc legal in a relaxed capture is reported as unsafe at its line") {
    replay::Stream stream;
    replay::DeviceBuffer<float> x(kN);
    int planted = 0;
    void* p = nullptr;
    auto audited = replay::audit_capture(
        stream,
        [&](replay::StreamRef s) {
          audit_test::scale_kernel<<<blocks(), 256, 0, s.get()>>>(x.data(), kN, 2.0F);
          planted = __LINE__; replay::check(cudaMalloc(&p, 4096), "cudaMalloc");
        },
        replay::CaptureMode::relaxed);
    if (p != nullptr) {
      (void)cudaFree(p);
    }
    const replay::AuditReport& r = audited.report;
    INFO(explain(r));
    CHECK(audited.graph);
    CHECK_FALSE(r.breaking.has_value());
    REQUIRE(r.unsafe.size() == 1);
    CHECK(base(r.unsafe[0].api) == "cudaMalloc");
    CHECK(r.unsafe[0].summary.find("CaptureMode::this_thread or global") != std::string::npos);
    check_frame(r.unsafe[0], planted);
  }

  TEST_CASE("audit: 8 other threads busy on their own streams are attributed to themselves and never escaped") {
    constexpr int kThreads = 8;
    replay::Stream stream;
    replay::DeviceBuffer<float> x(kN);
    std::atomic<bool> stop{false};
    std::atomic<int> rounds{0};
    std::vector<std::uint64_t> tids(kThreads, 0);
    std::vector<std::thread> workers;
    std::atomic<int> ready{0};
    for (int t = 0; t < kThreads; ++t) {
      workers.emplace_back([&, t] {
        tids[static_cast<std::size_t>(t)] = replay::CaptureAudit::this_thread_id();
        replay::Stream own;
        replay::DeviceBuffer<float> mine(kN);
        ++ready;
        while (!stop.load()) {
          audit_test::scale_kernel<<<blocks(), 256, 0, own.get()>>>(mine.data(), kN, 1.0F);
          replay::check_last_launch();
          own.synchronize();
          ++rounds;
        }
      });
    }
    while (ready.load() < kThreads) {
      std::this_thread::yield();
    }
    constexpr int kKernels = 50;
    auto audited = replay::audit_capture(stream, [&](replay::StreamRef s) {
      const int before = rounds.load();
      for (int k = 0; k < kKernels; ++k) {
        audit_test::scale_kernel<<<blocks(), 256, 0, s.get()>>>(x.data(), kN, 1.0F);
      }
      // Keep the capture open until every worker went round a few times.
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      while (rounds.load() < before + 4 * kThreads && std::chrono::steady_clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::microseconds(100));
      }
    });
    stop = true;
    for (auto& w : workers) {
      w.join();
    }
    const replay::AuditReport& r = audited.report;
    INFO(explain(r));
    REQUIRE(audited.graph);
    CHECK(r.clean());
    CHECK(r.escaped.empty());
    CHECK(r.unsafe.empty());
    CHECK_FALSE(r.breaking.has_value());
    CHECK(r.inventory.matches());
    CHECK(r.inventory.kernel_nodes() == kKernels);
    std::vector<int> launches(kThreads, 0);
    std::vector<int> syncs(kThreads, 0);
    int own_launches = 0;
    for (const replay::AuditedCall& c : r.calls) {
      if (c.nested) {
        continue;
      }
      const auto t = std::find(tids.begin(), tids.end(), c.thread);
      if (t == tids.end()) {
        if (c.kind == replay::AuditCallKind::kernel_launch) {
          CHECK(c.capturing_thread);
          CHECK(c.stream == reinterpret_cast<std::uintptr_t>(stream.get()));
          CHECK(c.stream_state == replay::AuditStreamState::this_capture);
          ++own_launches;
        }
        continue;
      }
      CHECK_FALSE(c.capturing_thread);
      const auto i = static_cast<std::size_t>(t - tids.begin());
      if (c.kind == replay::AuditCallKind::kernel_launch) {
        CHECK(c.stream_state == replay::AuditStreamState::not_capturing);
        CHECK(c.stream != reinterpret_cast<std::uintptr_t>(stream.get()));
        ++launches[i];
      } else if (c.kind == replay::AuditCallKind::stream_sync) {
        CHECK(c.status == cudaSuccess);
        ++syncs[i];
      }
    }
    CHECK(own_launches == kKernels);
    int threads_seen = 0;
    for (int t = 0; t < kThreads; ++t) {
      threads_seen += launches[static_cast<std::size_t>(t)] > 0 && syncs[static_cast<std::size_t>(t)] > 0 ? 1 : 0;
    }
    CHECK(threads_seen == kThreads);
  }

  TEST_CASE("audit: replay::capture with the audit on throws a cuda_error naming the planted call and line") {
    replay::Stream stream;
    replay::DeviceBuffer<float> x(kN);
    int planted = 0;
    std::string what;
    try {
      (void)replay::capture(
          stream,
          [&](replay::StreamRef s) {
            audit_test::scale_kernel<<<blocks(), 256, 0, s.get()>>>(x.data(), kN, 2.0F);
            planted = __LINE__; (void)cudaStreamSynchronize(s.get());
          },
          replay::CaptureMode::this_thread, replay::AuditSwitch::on);
    } catch (const replay::cuda_error& e) {
      what = e.what();
      CHECK(e.status() == cudaErrorStreamCaptureInvalidated);
    }
    audit_test::clear_planted_error();
    INFO(what);
    CHECK(what.find("capture audit: cudaStreamSynchronize") != std::string::npos);
    CHECK(what.find("audit_test.cu:" + std::to_string(planted)) != std::string::npos);
    CHECK(what.find("the capturing thread") != std::string::npos);
    // The verdict ends at the named cause: no generic list of likely causes.
    CHECK(what.find("likely causes") == std::string::npos);
    CHECK_FALSE(stream.is_capturing());
  }

  TEST_CASE("audit: replay::capture with the audit on reports escaped work of a capture that succeeded") {
    replay::Stream stream;
    replay::DeviceBuffer<float> x(kN);
    replay::DeviceBuffer<int> flag(1);
    int planted = 0;
    auto graph = replay::capture(
        stream,
        [&](replay::StreamRef s) {
          audit_test::scale_kernel<<<blocks(), 256, 0, s.get()>>>(x.data(), kN, 2.0F);
          planted = __LINE__; audit_test::mark_kernel<<<1, 1>>>(flag.data());
        },
        replay::CaptureMode::this_thread, replay::AuditSwitch::on);
    CHECK(graph.count(replay::NodeType::kernel) == 1);
    const auto& last = replay::detail::audit::last_hook_report();
    REQUIRE(last.has_value());
    INFO(explain(*last));
    REQUIRE(last->escaped.size() == 1);
    check_frame(last->escaped[0], planted);
    CHECK(cudaDeviceSynchronize() == cudaSuccess);
  }

  TEST_CASE("audit: a ShapeRouter with the audit on names the planted call and line in its failure reason") {
    replay::Stream stream;
    replay::DeviceBuffer<float> x(kN);
    int planted = 0;
    std::string reason;
    replay::ShapeRouterOptions<int> options;
    options.audit = replay::AuditSwitch::on;
    options.on_capture_failure = [&](const int&, std::string_view why) { reason = std::string(why); };
    replay::ShapeRouter<int> router(
        [&](int n, replay::StreamRef s) {
          audit_test::scale_kernel<<<blocks(), 256, 0, s.get()>>>(x.data(), n, 2.0F);
          if (s.is_capturing()) {
            planted = __LINE__; (void)cudaStreamSynchronize(s.get());
          }
        },
        options);
    const auto route = router.run(kN, stream);
    audit_test::clear_planted_error();
    stream.synchronize();
    INFO(reason);
    CHECK(route.kind == replay::RouteKind::eager_fallback);
    CHECK(reason.find("capture audit: cudaStreamSynchronize") != std::string::npos);
    CHECK(reason.find("audit_test.cu:" + std::to_string(planted)) != std::string::npos);
    CHECK(reason.find("likely causes") == std::string::npos);
  }

  TEST_CASE("audit: an audit while another CUPTI subscriber holds the interface says so, or stays silent when only asked by environment") {
    CUpti_SubscriberHandle other = nullptr;
    const CUptiResult subscribed = cuptiSubscribe(
        &other, [](void*, CUpti_CallbackDomain, CUpti_CallbackId, const void*) {}, nullptr);
    REQUIRE(subscribed == CUPTI_SUCCESS);
    std::string what;
    try {
      replay::CaptureAudit audit;
    } catch (const replay::audit_unavailable_error& e) {
      what = e.what();
    }
    const auto unrequired = replay::detail::audit::make_hook_observation(false, std::source_location::current());
    CHECK(cuptiUnsubscribe(other) == CUPTI_SUCCESS);
    INFO(what);
    CHECK(what.find("one subscriber per process") != std::string::npos);
    CHECK(what.find("Nsight Systems") != std::string::npos);
    CHECK(unrequired == nullptr);
    // And once the other subscriber is gone, the audit works again.
    replay::Stream stream;
    auto audited = replay::audit_capture(stream, [](replay::StreamRef) {});
    CHECK(audited.report.clean());
  }

  TEST_CASE("audit: work that throws ends the capture, keeps the exception and the stream stays usable") {
    replay::Stream stream;
    replay::DeviceBuffer<float> x(kN);
    auto audited = replay::audit_capture(stream, [&](replay::StreamRef s) {
      audit_test::scale_kernel<<<blocks(), 256, 0, s.get()>>>(x.data(), kN, 2.0F);
      throw std::runtime_error("model failed");
    });
    INFO(explain(audited.report));
    CHECK_FALSE(audited.graph);
    CHECK(audited.work_error != nullptr);
    CHECK_THROWS_WITH_AS(audited.rethrow_work_error(), "model failed", std::runtime_error);
    CHECK(audited.report.work_error == "model failed");
    CHECK_FALSE(audited.report.clean());
    CHECK_FALSE(stream.is_capturing());
    audit_test::scale_kernel<<<blocks(), 256, 0, stream.get()>>>(x.data(), kN, 2.0F);
    CHECK(cudaStreamSynchronize(stream.get()) == cudaSuccess);
  }
}
