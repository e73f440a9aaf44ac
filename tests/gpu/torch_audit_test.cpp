// The capture audit inside a GraphedCallable (replay/audit.hpp with the
// libtorch adapter): a .item() in the callable breaks the capture, and the
// failure reason names the call, the aten operator that made it and the
// callable's line. Part of test_torch where the audit was built (CUPTI).
#include <torch/torch.h>

#include <doctest/doctest.h>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "gpu_suite.hpp"
#include "replay/audit.hpp"
#include "replay/torch.hpp"

namespace {

// CUPTI refuses a subscriber under compute-sanitizer, which gpu-check runs
// test_torch under: skipped there.
auto needs_device_without_sanitizer() {
  return doctest::skip(std::getenv("REPLAY_UNDER_SANITIZER") != nullptr || replay_test::skip_gpu_cases());
}

bool has(const std::string& text, std::string_view part) { return text.find(part) != std::string::npos; }

}  // namespace

TEST_SUITE("gpu" * replay_test::needs_device()) {
  TEST_CASE("audit: a .item() inside a GraphedCallable is named with its aten operator and line" *
            needs_device_without_sanitizer()) {
    const at::Tensor w = torch::randn({16, 8}, at::TensorOptions().device(at::kCUDA));
    int planted = 0;
    auto fn = [&](const at::Tensor& x) {
      at::Tensor y = at::matmul(x, w);
      planted = __LINE__; const float peak = y.abs().max().item<float>();
      return y + (peak > 1e30F ? 1.0 : 0.0);
    };
    std::string reason;
    replay::GraphedCallable graphed(fn, {torch::randn({4, 16}, at::TensorOptions().device(at::kCUDA))},
                                    {.on_capture_failure = [&](const std::int64_t&, std::string_view why) {
                                       reason = std::string(why);
                                     },
                                     .audit = replay::AuditSwitch::on});
    (void)cudaGetLastError();  // the planted read-back's own error, if torch left one
    INFO(reason);
    CHECK(graphed.is_eager(4));
    CHECK(has(reason, "capture audit: "));
    CHECK((has(reason, "inside aten::_local_scalar_dense") || has(reason, "inside aten::item")));
    CHECK(has(reason, "torch_audit_test.cpp:" + std::to_string(planted)));
    // The eager fallback still computes the right thing.
    const at::Tensor x = torch::randn({4, 16}, at::TensorOptions().device(at::kCUDA));
    const auto out = graphed(x);
    CHECK(out.route() == replay::RouteKind::eager_fallback);
    CHECK((out[0] - at::matmul(x, w)).abs().max().item<float>() < 1e-4F);
  }
}
