// The capture audit's pure logic on the CPU: API names and kinds, whose
// frame is the user's, the classification of recorded calls (breaking,
// escaped, unsafe), the inventory, the report's text and JSON, addr2line's
// output, and the symbolizer on a real stack of this program.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "replay/audit.hpp"

namespace {

using replay::AuditCallKind;
using replay::AuditedCall;
using replay::AuditFrame;
using replay::AuditStreamState;
namespace audit = replay::detail::audit;

constexpr std::uint64_t kCapturing = 100;
constexpr std::uint64_t kOther = 200;

// A made-up recorded call.
AuditedCall call(std::string api, int status, std::uint64_t thread, AuditStreamState state = AuditStreamState::none,
                 std::string kernel = {}) {
  AuditedCall c;
  c.api = std::move(api);
  c.driver_api = c.api.starts_with("cu") && !c.api.starts_with("cuda");
  c.returned = true;
  c.status = status;
  c.thread = thread;
  c.capturing_thread = thread == kCapturing;
  c.kind = audit::api_kind(audit::split_api_name(c.api).base);
  c.stream_state = state;
  c.stream = state == AuditStreamState::none || state == AuditStreamState::legacy ? 0U : 0x1000U;
  c.kernel = std::move(kernel);
  return c;
}

audit::CaptureFacts facts(int end_status = 0, replay::CaptureMode mode = replay::CaptureMode::this_thread) {
  return audit::CaptureFacts{kCapturing, mode, end_status};
}

AuditFrame frame(std::string object, std::string function, std::string file = {}, unsigned line = 0) {
  return AuditFrame{0x1234, std::move(object), std::move(function), std::move(file), line};
}

// A stack as the recorder sees it under a CUDA call made from user code.
std::vector<AuditFrame> stack_under_user_call() {
  return {
      frame("/app/test", "replay::detail::audit::Recorder::enter(bool, unsigned int, CUpti_CallbackData const&, bool)",
            "/src/include/replay/audit/detail/recorder.hpp", 250),
      frame("/usr/local/cuda/lib64/libcupti.so.13", ""),
      frame("/usr/lib/x86_64-linux-gnu/libcuda.so.1", ""),
      frame("/usr/lib/x86_64-linux-gnu/libcuda.so.1", ""),
      frame("/app/test", "cudart::cudaApiStreamSynchronize(CUstream_st*)"),
      frame("/app/test", "cudaStreamSynchronize"),
      frame("/app/test", "app::model()::{lambda(replay::StreamRef)#1}::operator()(replay::StreamRef) const",
            "/src/app/model.cu", 42),
      frame("/app/test", "void std::__invoke_impl<void, app::model()::{lambda(replay::StreamRef)#1}&>(...)",
            "/usr/include/c++/12/bits/invoke.h", 61),
      frame("/app/test", "replay::AuditedCapture replay::CaptureAudit::capture<...>(...)",
            "/src/include/replay/audit/capture_audit.hpp", 80),
      frame("/app/test", "app::model()", "/src/app/model.cu", 40),
  };
}

std::string base(const std::string& api) { return std::string(audit::split_api_name(api).base); }

}  // namespace

TEST_SUITE("host") {
  TEST_CASE("audit: API names lose their per-thread and version suffixes and map to their kinds") {
    CHECK(base("cudaLaunchKernel_ptsz_v7000") == "cudaLaunchKernel");
    CHECK(audit::split_api_name("cudaLaunchKernel_ptsz").per_thread);
    CHECK_FALSE(audit::split_api_name("cudaLaunchKernel").per_thread);
    CHECK(base("__cudaLaunchKernel") == "cudaLaunchKernel");
    CHECK(base("cuMemcpyHtoDAsync_v2_ptsz") == "cuMemcpyHtoDAsync");
    CHECK(audit::split_api_name("cudaMemcpy_ptds").per_thread);
    CHECK(base("cuMemAlloc_v2") == "cuMemAlloc");
    CHECK(base("cudaGetDevice") == "cudaGetDevice");

    CHECK(audit::api_kind("cudaLaunchKernel") == AuditCallKind::kernel_launch);
    CHECK(audit::api_kind("cuLaunchKernelEx") == AuditCallKind::kernel_launch);
    CHECK(audit::api_kind("cudaMemcpyAsync") == AuditCallKind::copy);
    CHECK(audit::api_kind("cudaMemcpy") == AuditCallKind::sync_copy);
    CHECK(audit::api_kind("cuMemcpyHtoD") == AuditCallKind::sync_copy);
    CHECK(audit::api_kind("cudaMemsetAsync") == AuditCallKind::memset);
    CHECK(audit::api_kind("cuMemsetD8") == AuditCallKind::sync_memset);
    CHECK(audit::api_kind("cudaStreamSynchronize") == AuditCallKind::stream_sync);
    CHECK(audit::api_kind("cuCtxSynchronize") == AuditCallKind::device_sync);
    CHECK(audit::api_kind("cudaEventQuery") == AuditCallKind::event_query);
    CHECK(audit::api_kind("cudaMalloc") == AuditCallKind::allocation);
    CHECK(audit::api_kind("cuMemFree") == AuditCallKind::free);
    CHECK(audit::api_kind("cudaMallocAsync") == AuditCallKind::stream_allocation);
    CHECK(audit::api_kind("cudaStreamBeginCapture") == AuditCallKind::capture_control);
    CHECK(audit::api_kind("cudaMemPrefetchAsync") == AuditCallKind::other);
    CHECK(audit::api_kind("cudaGetDevice") == AuditCallKind::other);
    CHECK(audit::is_work(AuditCallKind::sync_copy));
    CHECK_FALSE(audit::is_work(AuditCallKind::stream_sync));
    CHECK(audit::is_unsafe_from_any_thread(AuditCallKind::device_sync));
    CHECK_FALSE(audit::is_unsafe_from_any_thread(AuditCallKind::stream_sync));
  }

  TEST_CASE("audit: a scope counts only in the qualified name, after a return type, not in arguments") {
    CHECK(audit::in_scope("replay::capture<int>(int)", "replay::"));
    CHECK(audit::in_scope("void replay::detail::f<int>(int)", "replay::"));
    CHECK(audit::in_scope("replay::Graph replay::capture<X>(replay::StreamRef)", "replay::"));
    CHECK_FALSE(audit::in_scope("replay_test::f()::{lambda(replay::StreamRef)#1}::operator()(replay::StreamRef) const",
                                "replay::"));
    CHECK_FALSE(audit::in_scope("app::(anonymous namespace)::run(std::vector<int>)", "std::"));
    CHECK(audit::in_scope("void std::__invoke_impl<void, F&>(F&)", "std::"));
  }

  TEST_CASE("audit: the user's frame is the first one outside CUDA, CUPTI, replay and the standard library") {
    const auto frames = stack_under_user_call();
    const auto user = audit::first_user_frame(frames);
    REQUIRE(user.has_value());
    CHECK(*user == 6);
    CHECK(frames[*user].line == 42);
    CHECK(audit::frame_owner(frames[0]) == audit::FrameOwner::replay);
    CHECK(audit::frame_owner(frames[1]) == audit::FrameOwner::cuda);
    CHECK(audit::frame_owner(frames[4]) == audit::FrameOwner::cuda);  // the runtime linked statically
    CHECK(audit::frame_owner(frames[5]) == audit::FrameOwner::cuda);
    CHECK(audit::frame_owner(frames[7]) == audit::FrameOwner::standard_library);
    CHECK(audit::frame_owner(frames[8]) == audit::FrameOwner::replay);
    CHECK(audit::describe_frame(frames[*user]).starts_with("/src/app/model.cu:42 (in app::model()::{lambda"));
  }

  TEST_CASE("audit: a kernel's launch stub is CUDA's frame, the <<<>>> line is the user's") {
    const std::vector<std::string> kernels{"app::scale(float*, int)"};
    const std::vector<AuditFrame> frames{
        frame("/usr/lib/x86_64-linux-gnu/libcuda.so.1", ""),
        frame("/app/test", "__cudaLaunchKernel"),
        frame("/app/test", "__device_stub__ZN3app5scaleEPfi(float*, int)", "/tmp/tmpxft_0001.cudafe1.stub.c", 12),
        frame("/app/test", "app::scale(float*, int)", "/src/app/kernels.cu", 7),  // the kernel's definition line
        frame("/app/test", "app::run(CUstream_st*)", "/src/app/run.cu", 33),
    };
    const auto user = audit::first_user_frame(frames, kernels);
    REQUIRE(user.has_value());
    CHECK(frames[*user].line == 33);
    // Without the kernel's name, the stub with the kernel's name would be taken.
    CHECK(audit::first_user_frame(frames).value_or(0) == 3);
  }

  TEST_CASE("audit: libtorch's frames, its headers' inlined ones included, are skipped for the user's") {
    const std::vector<AuditFrame> frames{
        frame("/usr/lib/x86_64-linux-gnu/libcuda.so.1", ""),
        frame("/site-packages/torch/lib/libtorch_cuda.so", "at::native::_local_scalar_dense_cuda(at::Tensor const&)"),
        frame("/site-packages/torch/lib/libtorch_cpu.so", "at::_ops::item::call(at::Tensor const&)"),
        frame("/app/test", "at::Tensor::item() const", "/site-packages/torch/include/ATen/core/TensorBody.h", 300),
        frame("/app/test", "app::model(at::Tensor const&)", "/src/app/model.cpp", 12),
    };
    const auto user = audit::first_user_frame(frames);
    REQUIRE(user.has_value());
    CHECK(*user == 4);
    CHECK(audit::frame_owner(frames[1]) == audit::FrameOwner::framework);
    CHECK(audit::frame_owner(frames[3]) == audit::FrameOwner::framework);
  }

  TEST_CASE("audit: a user's function named like a CUDA call keeps its frame when it has line information") {
    const std::vector<AuditFrame> frames{
        frame("/usr/lib/x86_64-linux-gnu/libcuda.so.1", ""),
        frame("/app/test", "cudaMalloc"),  // no line information: the runtime's
        frame("/app/test", "cudaHelperAllocate(unsigned long)", "/src/app/alloc.cpp", 9),
    };
    const auto user = audit::first_user_frame(frames);
    REQUIRE(user.has_value());
    CHECK(*user == 2);
  }

  TEST_CASE("audit: a lambda inlined into std::thread's or replay's code is the user's frame by its file") {
    // addr2line may name a frame after the function the lambda was inlined
    // into; the file and line are the lambda's own.
    const std::vector<AuditFrame> frames{
        frame("/usr/lib/x86_64-linux-gnu/libcuda.so.1", ""),
        frame("/app/test", "cudaDeviceSynchronize"),
        frame("/app/test", "std::thread::_State_impl<std::thread::_Invoker<std::tuple<app::f()::{lambda()#1}> > >::_M_run()",
              "/src/app/worker.cu", 234),
        frame("/app/test", "_M_run", "/usr/include/c++/13/bits/std_thread.h", 244),
        frame("/app/test", "execute_native_thread_routine"),
    };
    const auto user = audit::first_user_frame(frames);
    REQUIRE(user.has_value());
    CHECK(*user == 2);
    CHECK(frames[*user].line == 234);
    CHECK(audit::frame_owner(frames[3]) == audit::FrameOwner::standard_library);
    CHECK(audit::frame_owner(frames[4]) == audit::FrameOwner::standard_library);
    const AuditFrame in_router =
        frame("/app/test", "replay::ShapeRouter<int>::capture_entry(int)", "/src/app/model.cu", 560);
    CHECK(audit::frame_owner(in_router) == audit::FrameOwner::user);
    CHECK(audit::frame_owner(frame("/app/test", "app::helper()", "/opt/include/replay/router.hpp", 10)) ==
          audit::FrameOwner::replay);
  }

  TEST_CASE("audit: a sanitizer's interceptor of backtrace() is the toolchain's frame, not the user's") {
    // The innermost frame of a stack taken under ThreadSanitizer (GCC's
    // shared runtime), with its own line information.
    const std::vector<AuditFrame> frames{
        frame("/lib/x86_64-linux-gnu/libtsan.so.2", "__interceptor_backtrace",
              "/build/gcc-12/src/libsanitizer/sanitizer_common/sanitizer_common_interceptors.inc", 4277),
        frame("/app/test", "replay::detail::audit::capture_stack(replay::detail::audit::RawStack&)",
              "/opt/include/replay/audit/detail/symbolize.hpp", 50),
        frame("/app/test", "app::model()", "/src/app/model.cu", 42),
    };
    const auto user = audit::first_user_frame(frames);
    REQUIRE(user.has_value());
    CHECK(*user == 2);
    CHECK(audit::frame_owner(frames[0]) == audit::FrameOwner::standard_library);
    // Clang's runtime, and one linked statically (known by its entry point's name).
    CHECK(audit::frame_owner(frame("/usr/lib/clang/18/lib/linux/libclang_rt.asan-x86_64.so", "backtrace")) ==
          audit::FrameOwner::standard_library);
    CHECK(audit::frame_owner(frame("/app/test", "__interceptor_backtrace", "/src/compiler-rt/lib/x.inc", 9)) ==
          audit::FrameOwner::standard_library);
    // A user's function whose name merely contains such a word stays the user's.
    CHECK(audit::frame_owner(frame("/app/test", "app::asan_friendly()", "/src/app/a.cpp", 3)) ==
          audit::FrameOwner::user);
  }

  TEST_CASE("audit: without any symbols the first unknown frame after CUDA's is the best guess") {
    const std::vector<AuditFrame> frames{
        frame("/app/test", ""),
        frame("/usr/lib/x86_64-linux-gnu/libcuda.so.1", ""),
        frame("/usr/lib/x86_64-linux-gnu/libcudart.so.13", ""),
        frame("/app/test", "", "", 0),
        frame("/usr/lib/x86_64-linux-gnu/libc.so.6", "__libc_start_main"),
    };
    const auto user = audit::first_user_frame(frames);
    REQUIRE(user.has_value());
    CHECK(*user == 3);
    CHECK_FALSE(audit::first_user_frame(std::vector<AuditFrame>{frame("/lib/libcuda.so.1", "")}).has_value());
  }

  TEST_CASE("audit: the first call that returned a capture error broke the capture, not the invalidated ones after it") {
    const std::vector<AuditedCall> calls{
        call("__cudaLaunchKernel", 0, kCapturing, AuditStreamState::this_capture, "k()"),
        call("cudaStreamSynchronize", cudaErrorStreamCaptureUnsupported, kCapturing, AuditStreamState::this_capture),
        call("__cudaLaunchKernel", cudaErrorStreamCaptureInvalidated, kCapturing,
             AuditStreamState::this_capture_invalidated, "k()"),
    };
    const auto verdict = audit::classify(calls, facts(cudaErrorStreamCaptureInvalidated));
    REQUIRE(verdict.breaking.has_value());
    CHECK(*verdict.breaking == 1);
    CHECK_FALSE(verdict.inferred);
    CHECK(verdict.invalidated);
    CHECK(verdict.escaped.empty());
    CHECK(verdict.unsafe.empty());
  }

  TEST_CASE("audit: another thread's failing call is the breaking call and is named as another thread") {
    std::vector<AuditedCall> calls{
        call("__cudaLaunchKernel", 0, kCapturing, AuditStreamState::this_capture, "k()"),
        call("cudaDeviceSynchronize", cudaErrorStreamCaptureUnsupported, kOther),
        call("__cudaLaunchKernel", cudaErrorStreamCaptureInvalidated, kCapturing,
             AuditStreamState::this_capture_invalidated, "k()"),
    };
    const auto verdict = audit::classify(calls, facts(cudaErrorStreamCaptureInvalidated));
    REQUIRE(verdict.breaking.has_value());
    CHECK(*verdict.breaking == 1);
    CHECK(audit::describe_thread(calls[1]).starts_with("another thread (tid 200)"));
    CHECK(audit::describe_thread(calls[0]).starts_with("the capturing thread (tid 100)"));
  }

  TEST_CASE("audit: nested driver calls and calls still running are never findings") {
    AuditedCall nested = call("cuStreamSynchronize", cudaErrorStreamCaptureUnsupported, kCapturing);
    nested.nested = true;
    AuditedCall running = call("cudaMalloc", 0, kCapturing);
    running.returned = false;
    const std::vector<AuditedCall> calls{nested, running};
    const auto verdict = audit::classify(calls, facts());
    CHECK_FALSE(verdict.breaking.has_value());
    CHECK(verdict.unsafe.empty());
    CHECK_FALSE(verdict.invalidated);
  }

  TEST_CASE("audit: without a first error, the last unsafe call before the capture was seen broken is inferred") {
    const std::vector<AuditedCall> calls{
        call("cuMemAlloc_v2", 0, kOther),
        call("cudaStreamSynchronize", 0, kOther, AuditStreamState::not_capturing),  // legal: not a candidate
        call("__cudaLaunchKernel", cudaErrorStreamCaptureInvalidated, kCapturing,
             AuditStreamState::this_capture_invalidated, "k()"),
    };
    const auto verdict = audit::classify(calls, facts(cudaErrorStreamCaptureInvalidated, replay::CaptureMode::global));
    REQUIRE(verdict.breaking.has_value());
    CHECK(*verdict.breaking == 0);
    CHECK(verdict.inferred);
    // The inferred breaking call is not listed again as unsafe.
    CHECK(verdict.unsafe.empty());
  }

  TEST_CASE("audit: a broken capture with no candidate call is invalidated without a breaking call") {
    const std::vector<AuditedCall> calls{call("__cudaLaunchKernel", 0, kCapturing, AuditStreamState::this_capture, "k()")};
    const auto verdict = audit::classify(calls, facts(cudaErrorStreamCaptureInvalidated));
    CHECK_FALSE(verdict.breaking.has_value());
    CHECK(verdict.invalidated);
  }

  TEST_CASE("audit: the capturing thread's work outside the capture escaped; other threads' own work did not") {
    const std::vector<AuditedCall> calls{
        call("__cudaLaunchKernel", 0, kCapturing, AuditStreamState::this_capture, "k()"),
        call("__cudaLaunchKernel", 0, kCapturing, AuditStreamState::legacy, "legacy_k()"),
        call("cudaMemcpy", 0, kCapturing, AuditStreamState::legacy),
        call("__cudaLaunchKernel", 0, kCapturing, AuditStreamState::not_capturing, "side_k()"),
        call("cudaMemcpyAsync", 0, kOther, AuditStreamState::not_capturing),
        call("__cudaLaunchKernel", 0, kOther, AuditStreamState::not_capturing, "theirs()"),
        call("cudaStreamSynchronize", 0, kOther, AuditStreamState::not_capturing),
        call("__cudaLaunchKernel", cudaErrorInvalidValue, kCapturing, AuditStreamState::legacy, "failed()"),
    };
    const auto verdict = audit::classify(calls, facts());
    CHECK(verdict.escaped == std::vector<std::size_t>{1, 2, 3});
    CHECK(verdict.unsafe.empty());  // the synchronous copy escaped: not listed twice
    CHECK_FALSE(verdict.breaking.has_value());
  }

  TEST_CASE("audit: calls that succeeded here but break other captures are unsafe") {
    const std::vector<AuditedCall> calls{
        call("cudaMalloc", 0, kCapturing),                                       // relaxed: legal here
        call("cudaStreamSynchronize", 0, kCapturing, AuditStreamState::not_capturing),
        call("cudaFree", 0, kOther),                                             // breaks a global capture
        call("cudaStreamSynchronize", 0, kOther, AuditStreamState::not_capturing),  // that thread's own: fine
        call("__cudaLaunchKernel", 0, kOther, AuditStreamState::legacy, "k()"),  // legacy stream: unsafe
        call("cudaMallocAsync", 0, kCapturing, AuditStreamState::this_capture),  // a graph memory node: fine
    };
    const auto verdict = audit::classify(calls, facts(0, replay::CaptureMode::relaxed));
    CHECK(verdict.unsafe == std::vector<std::size_t>{0, 1, 2, 4});
    CHECK(audit::summary_for(calls[0], replay::AuditFindingKind::unsafe_call, std::nullopt, false,
                             replay::CaptureMode::relaxed)
              .find("would break a capture in CaptureMode::this_thread or global") != std::string::npos);
    CHECK(audit::summary_for(calls[2], replay::AuditFindingKind::unsafe_call, std::nullopt, false,
                             replay::CaptureMode::relaxed)
              .find("another thread") != std::string::npos);
    // In a this_thread capture an allocation that succeeded was made in
    // relaxed mode (as PyTorch's allocator does); a synchronization waited
    // on a stream outside the capture.
    const std::string malloc_line = audit::summary_for(calls[0], replay::AuditFindingKind::unsafe_call, std::nullopt,
                                                       false, replay::CaptureMode::this_thread);
    CHECK(malloc_line.find("switched to CaptureMode::relaxed") != std::string::npos);
    CHECK(malloc_line.find("the stream it waits on") == std::string::npos);
    CHECK(audit::summary_for(calls[1], replay::AuditFindingKind::unsafe_call, std::nullopt, false,
                             replay::CaptureMode::this_thread)
              .find("the stream it waits on") != std::string::npos);
  }

  TEST_CASE("audit: the inventory compares launches on the capture's streams with the graph's nodes by name") {
    const std::vector<AuditedCall> calls{
        call("__cudaLaunchKernel", 0, kCapturing, AuditStreamState::this_capture, "a(float*)"),
        call("__cudaLaunchKernel", 0, kCapturing, AuditStreamState::this_capture, "a(float*)"),
        call("cuLaunchKernel", 0, kCapturing, AuditStreamState::this_capture, "b()"),
        call("__cudaLaunchKernel", 0, kCapturing, AuditStreamState::legacy, "escaped()"),
        call("cudaMemcpyAsync", 0, kCapturing, AuditStreamState::this_capture),
        call("cudaMemsetAsync", 0, kCapturing, AuditStreamState::this_capture),
        call("__cudaLaunchKernel", cudaErrorStreamCaptureInvalidated, kCapturing, AuditStreamState::this_capture,
             "failed()"),
    };
    audit::GraphContents graph;
    graph.kernels = {{"a(float*)", 2}, {"b()", 1}};
    graph.copies = 1;
    graph.memsets = 1;
    auto inventory = audit::make_inventory(calls, graph);
    CHECK(inventory.checked);
    CHECK(inventory.matches());
    CHECK(inventory.kernel_nodes() == 3);
    CHECK(inventory.kernel_launches() == 3);

    graph.kernels = {{"a(float*)", 1}, {"b()", 1}, {"c()", 1}};
    inventory = audit::make_inventory(calls, graph);
    CHECK_FALSE(inventory.matches());
    const auto a = std::find_if(inventory.kernels.begin(), inventory.kernels.end(),
                                [](const auto& e) { return e.kernel == "a(float*)"; });
    REQUIRE(a != inventory.kernels.end());
    CHECK(a->launched == 2);
    CHECK(a->in_graph == 1);

    graph.kernels = {{"", 3}};  // the driver could not name the nodes: totals are compared
    inventory = audit::make_inventory(calls, graph);
    REQUIRE(inventory.kernels.size() == 1);
    CHECK(inventory.matches());
    graph.copies = 0;
    CHECK_FALSE(audit::make_inventory(calls, graph).matches());
  }

  TEST_CASE("audit: where CUDA reports graph nodes, work of unknown stream that made none went outside") {
    std::vector<AuditedCall> calls{
        call("__cudaLaunchKernel", 0, kCapturing, AuditStreamState::unknown, "in()"),
        call("__cudaLaunchKernel", 0, kCapturing, AuditStreamState::unknown, "out()"),
        call("cudaStreamSynchronize", 0, kCapturing, AuditStreamState::unknown),
    };
    calls[0].graph_nodes = 1;
    std::vector<AuditedCall> without_reports = calls;
    without_reports[0].graph_nodes = 0;
    audit::apply_node_evidence(calls);
    CHECK(calls[0].stream_state == AuditStreamState::unknown);  // promoted by to_audited_call, not here
    CHECK(calls[1].stream_state == AuditStreamState::outside);
    CHECK(calls[2].stream_state == AuditStreamState::unknown);  // not work
    CHECK(audit::classify(calls, facts()).escaped == std::vector<std::size_t>{1});
    audit::apply_node_evidence(without_reports);  // no node was reported at all: nothing is concluded
    CHECK(without_reports[1].stream_state == AuditStreamState::unknown);

    // A launch whose stream seemed to be the legacy one but that added a node
    // to the audited graph went into it.
    std::vector<std::uintptr_t> streams{0x10};
    audit::RawCall raw;
    raw.name = "__cudaLaunchKernel";
    raw.returned = true;
    raw.thread = kCapturing;
    raw.stream = audit::StreamArgument{true, 0};
    raw.legacy_stream = true;
    raw.graph_nodes = 1;
    raw.node_graph = 0xabc;
    CHECK(audit::to_audited_call(raw, 7, kCapturing, streams, 0xabc).stream_state == AuditStreamState::this_capture);
    CHECK(audit::to_audited_call(raw, 7, kCapturing, streams, 0xdef).stream_state == AuditStreamState::legacy);
  }

  TEST_CASE("audit: JSON strings escape quotes, backslashes and control characters and keep UTF-8") {
    CHECK(audit::json_string("plain") == "\"plain\"");
    CHECK(audit::json_string("a\"b\\c") == "\"a\\\"b\\\\c\"");
    CHECK(audit::json_string("line\nnext\ttab") == "\"line\\nnext\\ttab\"");
    CHECK(audit::json_string(std::string("nul\x01", 4)) == "\"nul\\u0001\"");
    CHECK(audit::json_string("caf\xc3\xa9") == "\"caf\xc3\xa9\"");
  }

  TEST_CASE("audit: addr2line's output parses into inlined frames per address") {
    const auto groups = audit::parse_addr2line(
        "0x0000000000001234\n"
        "inner(int)\n"
        "/src/a.cpp:10\n"
        "outer()\n"
        "/src/a.cpp:20 (discriminator 2)\n"
        "0x0000000000005678\n"
        "??\n"
        "??:0\n");
    REQUIRE(groups.size() == 2);
    REQUIRE(groups[0].size() == 2);
    CHECK(groups[0][0].function == "inner(int)");
    CHECK(groups[0][0].file == "/src/a.cpp");
    CHECK(groups[0][0].line == 10);
    CHECK(groups[0][1].line == 20);
    REQUIRE(groups[1].size() == 1);
    CHECK(groups[1][0].function.empty());
    CHECK(groups[1][0].file.empty());
  }

  TEST_CASE("audit: a report names the breaking call at the user's line, one finding a line, and as JSON") {
    audit::ReportInput input;
    input.calls = {
        call("__cudaLaunchKernel", 0, kCapturing, AuditStreamState::this_capture, "k()"),
        call("cudaStreamSynchronize", cudaErrorStreamCaptureUnsupported, kCapturing, AuditStreamState::this_capture),
        call("__cudaLaunchKernel", 0, kCapturing, AuditStreamState::legacy, "escaped_k(float*)"),
    };
    input.calls[1].stack = {1, 2, 3};
    input.calls[2].stack = {4};
    input.facts = facts(cudaErrorStreamCaptureInvalidated);
    input.begun_at = "app.cu:10 (main)";
    int resolved = 0;
    const auto report = audit::build_report(input, [&](const std::vector<std::vector<std::uintptr_t>>& stacks) {
      resolved += static_cast<int>(stacks.size());
      std::vector<std::vector<AuditFrame>> out;
      for (std::size_t i = 0; i < stacks.size(); ++i) {
        out.push_back(stack_under_user_call());
      }
      return out;
    });
    CHECK(resolved == 2);  // only the findings' stacks
    REQUIRE(report.breaking.has_value());
    CHECK(report.breaking->api == "cudaStreamSynchronize");
    REQUIRE(report.breaking->frame.has_value());
    CHECK(report.breaking->frame->line == 42);
    CHECK(report.breaking->call == std::optional<std::size_t>(1));
    REQUIRE(report.escaped.size() == 1);
    CHECK(report.escaped[0].kernel == "escaped_k(float*)");
    CHECK_FALSE(report.clean());
    CHECK_FALSE(report.inventory.checked);

    const std::string text = report.to_string();
    INFO(text);
    CHECK(text.find("BROKEN BY: cudaStreamSynchronize returned cudaErrorStreamCaptureUnsupported on the capturing "
                    "thread (tid 100) at /src/app/model.cu:42") != std::string::npos);
    CHECK(text.find("ESCAPED: __cudaLaunchKernel of kernel escaped_k(float*) on the legacy default stream") !=
          std::string::npos);
    CHECK(std::count(text.begin(), text.end(), '\n') == 4);  // heading, breaking, escaped, inventory
    CHECK(report.verdict().find("model.cu:42") != std::string::npos);

    const std::string json = report.to_json();
    INFO(json);
    CHECK(std::count(json.begin(), json.end(), '{') == std::count(json.begin(), json.end(), '}'));
    CHECK(std::count(json.begin(), json.end(), '[') == std::count(json.begin(), json.end(), ']'));
    CHECK(json.find(",}") == std::string::npos);
    CHECK(json.find(",]") == std::string::npos);
    CHECK(json.find("\"api\":\"cudaStreamSynchronize\"") != std::string::npos);
    CHECK(json.find("\"line\":42") != std::string::npos);
    CHECK(json.front() == '{');
    CHECK(json.back() == '}');
  }

  TEST_CASE("audit: a call inside a TorchScript operator names the operator and the script's lines that called it") {
    audit::ReportInput input;
    input.calls = {
        call("cudaStreamSynchronize", cudaErrorStreamCaptureUnsupported, kCapturing, AuditStreamState::this_capture),
    };
    input.calls[0].op = "aten::_local_scalar_dense";
    input.calls[0].script_frames = {frame({}, "read_peak", "model.py", 2), frame({}, "forward", "model.py", 6)};
    input.calls[0].stack = {1};
    input.facts = facts(cudaErrorStreamCaptureInvalidated);
    const auto report = audit::build_report(input, [](const std::vector<std::vector<std::uintptr_t>>& stacks) {
      return std::vector<std::vector<AuditFrame>>(stacks.size(), stack_under_user_call());
    });
    REQUIRE(report.breaking.has_value());
    CHECK(report.breaking->op == "aten::_local_scalar_dense");
    REQUIRE(report.breaking->script_frames.size() == 2);
    CHECK(report.breaking->script_frames[0].line == 2);
    const std::string text = report.to_string();
    INFO(text);
    CHECK(text.find("BROKEN BY: cudaStreamSynchronize inside aten::_local_scalar_dense (a .item()), called from "
                    "model.py:2 (in read_peak) via model.py:6 (in forward), returned "
                    "cudaErrorStreamCaptureUnsupported on the capturing thread (tid 100) at /src/app/model.cu:42") !=
          std::string::npos);
    // The advice is about the read-back, not about synchronizing streams.
    CHECK(report.breaking->advice.find("reads a tensor's value on the host") != std::string::npos);
    const std::string json = report.to_json();
    INFO(json);
    CHECK(json.find("\"script_frames\":[{\"address\":4660,\"object\":\"\",\"function\":\"read_peak\","
                    "\"file\":\"model.py\",\"line\":2}") != std::string::npos);

    // Without a script: the operator alone; an operator without a gloss: its name alone.
    AuditedCall plain = input.calls[0];
    plain.script_frames.clear();
    CHECK(audit::describe_operator(plain.op, plain.script_frames) == " inside aten::_local_scalar_dense (a .item())");
    CHECK(audit::describe_operator("aten::mm", {}) == " inside aten::mm");
    CHECK(audit::describe_operator("", {}).empty());
    plain.op = "aten::mm";
    CHECK(audit::advice_for(plain, replay::AuditFindingKind::breaking_call).find("synchronizing a capturing stream") !=
          std::string::npos);
    // An ordinary call that synchronizes the capturing stream: the advice names the break API.
    const std::string sync_advice = audit::advice_for(plain, replay::AuditFindingKind::breaking_call);
    CHECK(sync_advice.find("replay::eager(stream, name, region)") != std::string::npos);
    CHECK(sync_advice.find("replay::capture_piecewise") != std::string::npos);
    // A read-back inside torch: the adapter's break policy.
    CHECK(report.breaking->advice.find("replay::TorchBreaks::piecewise") != std::string::npos);
  }

  TEST_CASE("audit: a clean report says so and its verdict counts the calls") {
    audit::ReportInput input;
    input.calls = {call("__cudaLaunchKernel", 0, kCapturing, AuditStreamState::this_capture, "k()")};
    input.facts = facts();
    input.graph = audit::GraphContents{{{"k()", 1}}, 0, 0, 0};
    const auto report = audit::build_report(input, [](const auto&) { return std::vector<std::vector<AuditFrame>>{}; });
    CHECK(report.clean());
    CHECK(report.inventory.matches());
    CHECK(report.verdict() == "capture audit: clean (1 calls, 1 kernel nodes)");
    CHECK(report.to_string().find("clean: nothing broke the capture") != std::string::npos);
  }

  TEST_CASE("audit: a recorded call's stream state follows the capture it belongs to") {
    std::vector<std::uintptr_t> streams{0x10};
    audit::RawCall raw;
    raw.name = "cudaLaunchKernel";
    raw.returned = true;
    raw.thread = kCapturing;
    raw.stream = audit::StreamArgument{true, 0x10};
    raw.capture_status = CU_STREAM_CAPTURE_STATUS_ACTIVE;
    raw.capture_id = 7;
    CHECK(audit::to_audited_call(raw, 7, kCapturing, streams).stream_state == AuditStreamState::this_capture);
    CHECK(audit::to_audited_call(raw, 8, kCapturing, streams).stream_state == AuditStreamState::other_capture);
    raw.capture_status = CU_STREAM_CAPTURE_STATUS_INVALIDATED;
    raw.capture_id = 0;  // no id for an invalidated capture: recognized by its stream
    CHECK(audit::to_audited_call(raw, 7, kCapturing, streams).stream_state ==
          AuditStreamState::this_capture_invalidated);
    raw.stream.handle = 0x20;
    CHECK(audit::to_audited_call(raw, 7, kCapturing, streams).stream_state == AuditStreamState::other_capture);
    raw.capture_status = CU_STREAM_CAPTURE_STATUS_NONE;
    CHECK(audit::to_audited_call(raw, 7, kCapturing, streams).stream_state == AuditStreamState::not_capturing);
    raw.legacy_stream = true;
    CHECK(audit::to_audited_call(raw, 7, kCapturing, streams).stream_state == AuditStreamState::legacy);
    raw.capture_status = -1;
    raw.legacy_stream = false;
    CHECK(audit::to_audited_call(raw, 7, kCapturing, streams).stream_state == AuditStreamState::unknown);

    audit::RawCall copy;
    copy.name = "cudaMemcpy";
    copy.thread = kOther;
    const AuditedCall sync = audit::to_audited_call(copy, 7, kCapturing, streams);
    CHECK(sync.stream_state == AuditStreamState::legacy);  // no stream argument: the legacy default stream
    CHECK_FALSE(sync.capturing_thread);
    copy.name = "cudaMemcpy_ptds";
    copy.per_thread = true;
    CHECK(audit::to_audited_call(copy, 7, kCapturing, streams).stream_state == AuditStreamState::not_capturing);
    audit::RawCall query;
    query.name = "cudaGetDevice";
    CHECK(audit::to_audited_call(query, 7, kCapturing, streams).stream_state == AuditStreamState::none);

    audit::RawCall kernel;
    kernel.name = "__cudaLaunchKernel";
    kernel.kernel = "_ZN3app5scaleEPfi";
    CHECK(audit::to_audited_call(kernel, 7, kCapturing, streams).kernel == "app::scale(float*, int)");
  }

  TEST_CASE("audit: the switch follows the component's request, then the environment") {
    using replay::AuditSwitch;
    CHECK(replay::detail::effective_audit_switch(AuditSwitch::off) == AuditSwitch::off);
    CHECK(replay::detail::effective_audit_switch(AuditSwitch::on) == AuditSwitch::on);
    {
      const replay::detail::AuditRequestScope router(AuditSwitch::on);
      CHECK(replay::detail::effective_audit_switch(AuditSwitch::from_environment) == AuditSwitch::on);
      CHECK(replay::detail::effective_audit_switch(AuditSwitch::off) == AuditSwitch::off);
      {
        const replay::detail::AuditRequestScope inner(AuditSwitch::from_environment);  // leaves it as it is
        CHECK(replay::detail::effective_audit_switch(AuditSwitch::from_environment) == AuditSwitch::on);
      }
    }
    const AuditSwitch from_environment = replay::detail::effective_audit_switch(AuditSwitch::from_environment);
    CHECK(from_environment ==
          (replay::detail::audit_requested_by_environment() ? AuditSwitch::from_environment : AuditSwitch::off));
    // The audit installed itself as the core's observer when this header was included.
    const bool installed = replay::detail::capture_observer().load() == &audit::make_hook_observation;
    CHECK(installed);
    CHECK(audit::hook_installed);
  }

  TEST_CASE("audit: a stack taken here resolves to this file and line") {
    int line = 0;
    std::vector<AuditFrame> frames;
    [&]() __attribute__((noinline)) {
      line = __LINE__; frames = audit::current_frames();
    }();
    std::string all;
    for (const AuditFrame& f : frames) {
      all += audit::describe_frame(f) + " [" + f.object + "]\n";
    }
    INFO("frames:\n" << all);
    REQUIRE(audit::Symbolizer::instance().has_line_information());
    const auto user = audit::first_user_frame(frames);
    REQUIRE(user.has_value());
    CHECK(frames[*user].file.ends_with("tests/host/audit_test.cpp"));
    CHECK(frames[*user].line == static_cast<unsigned>(line));
  }
}
