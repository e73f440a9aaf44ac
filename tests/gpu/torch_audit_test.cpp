// The capture audit inside a GraphedCallable (replay/audit.hpp with the
// libtorch adapter): a .item() in the callable breaks the capture, and the
// failure reason names the call, the aten operator that made it and the
// callable's line; inside a TorchScript module also the script's line that
// called the operator. On the CPU: the operator tracking's script lines, for
// a module defined here and for one saved and loaded. Part of test_torch
// where the audit was built (CUPTI).
#include <torch/script.h>
#include <torch/torch.h>

#include <doctest/doctest.h>

#include <ATen/record_function.h>

#include <cstdint>
#include <cstdlib>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "gpu_suite.hpp"
#include "replay/audit.hpp"
#include "replay/torch.hpp"
#include "replay/torch/detail/operator_names.hpp"
#include "script_source.hpp"

namespace {

// A module whose forward reads a value on the host in a method it calls.
const std::string kReadBackModel = R"(def read_peak(self, h):
    return float(h.abs().max())

def forward(self, x):
    h = torch.relu(x * 2.0)
    return h / (self.read_peak(h) + 1.0)
)";

torch::jit::Module read_back_module() {
  torch::jit::Module module("ReadBack");
  replay_examples::define_methods(module, kReadBackModel, "model.py");
  return module;
}

// What the operator tracking said inside aten::_local_scalar_dense (the read-back).
struct SeenOperator {
  std::string name;
  std::vector<replay::detail::OperatorCaller> callers;
  int times = 0;
};
SeenOperator& seen_operator() {
  thread_local SeenOperator seen;
  return seen;
}

std::unique_ptr<at::ObserverContext> ask_inside_read_back(const at::RecordFunction& fn) {
  if (std::string_view(fn.name()) == "aten::_local_scalar_dense") {
    const replay::detail::RunningOperatorSource source =
        replay::detail::running_operator_source().load(std::memory_order_acquire);
    if (source != nullptr) {
      const replay::detail::RunningOperator op = source();
      SeenOperator& seen = seen_operator();
      seen.name = op.name != nullptr ? op.name : "";
      seen.callers.assign(op.callers.begin(), op.callers.end());
      ++seen.times;
    }
  }
  return nullptr;
}

// Runs `module` on the CPU with the operator tracking on, and returns what
// it said inside the read-back.
SeenOperator track_read_back(torch::jit::Module& module, int runs) {
  seen_operator() = SeenOperator{};
  const replay::detail::OperatorTracking tracking;
  // Registered after the tracking's own callback: asked with the operator on its stack.
  const at::CallbackHandle asking = at::addThreadLocalCallback(
      at::RecordFunctionCallback(&ask_inside_read_back).scopes({at::RecordScope::FUNCTION}));
  for (int i = 0; i < runs; ++i) {  // the profiling executor's runs, then its optimized plan
    (void)module.forward({torch::ones({4, 8})});
  }
  at::removeCallback(asking);
  return seen_operator();
}

// CUPTI refuses a subscriber under compute-sanitizer, which gpu-check runs
// test_torch under: skipped there.
auto needs_device_without_sanitizer() {
  return doctest::skip(std::getenv("REPLAY_UNDER_SANITIZER") != nullptr || replay_test::skip_gpu_cases());
}

bool has(const std::string& text, std::string_view part) { return text.find(part) != std::string::npos; }

}  // namespace

TEST_SUITE("host") {
  TEST_CASE("audit: inside TorchScript the running operator comes with the script lines that called it") {
    torch::jit::Module module = read_back_module();
    const SeenOperator seen = track_read_back(module, 4);
    CHECK(seen.times == 4);
    // The callbacks run in the order they were added; the tracking's came first.
    CHECK(seen.name == "aten::_local_scalar_dense");
    REQUIRE(seen.callers.size() == 2);
    CHECK(seen.callers[0].function == "read_peak");
    CHECK(seen.callers[0].file == "model.py");
    CHECK(seen.callers[0].line == replay_examples::line_holding(kReadBackModel, "float("));
    CHECK(seen.callers[1].function == "forward");
    CHECK(seen.callers[1].file == "model.py");
    CHECK(seen.callers[1].line == replay_examples::line_holding(kReadBackModel, "self.read_peak(h)"));
    // Outside the interpreter: the operator without lines.
    seen_operator() = SeenOperator{};
    {
      const replay::detail::OperatorTracking tracking;
      const at::CallbackHandle asking = at::addThreadLocalCallback(
          at::RecordFunctionCallback(&ask_inside_read_back).scopes({at::RecordScope::FUNCTION}));
      (void)torch::ones({3}).sum().item<float>();
      at::removeCallback(asking);
    }
    CHECK(seen_operator().times == 1);
    CHECK(seen_operator().name == "aten::_local_scalar_dense");
    CHECK(seen_operator().callers.empty());
  }

  TEST_CASE("audit: a saved and loaded TorchScript module names the lines it was scripted from") {
    torch::jit::Module original = read_back_module();
    std::stringstream file;
    original.save(file);
    torch::jit::Module loaded = torch::jit::load(file);
    const SeenOperator seen = track_read_back(loaded, 2);
    CHECK(seen.times == 2);
    REQUIRE_FALSE(seen.callers.empty());
    // The serialized code's own lines map back to model.py's (the module's debug information).
    CHECK(seen.callers[0].file == "model.py");
    CHECK(seen.callers[0].line == replay_examples::line_holding(kReadBackModel, "float("));
  }
}

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
    CHECK_FALSE(has(reason, "likely causes"));  // the verdict ends at the named cause
    // The eager fallback still computes the right thing.
    const at::Tensor x = torch::randn({4, 16}, at::TensorOptions().device(at::kCUDA));
    const auto out = graphed(x);
    CHECK(out.route() == replay::RouteKind::eager_fallback);
    CHECK((out[0] - at::matmul(x, w)).abs().max().item<float>() < 1e-4F);
  }

  TEST_CASE("audit: a read-back inside a TorchScript module is named with the script's line that made it" *
            needs_device_without_sanitizer()) {
    torch::jit::Module module = read_back_module();
    std::string reason;
    replay::GraphedCallable graphed(module, {torch::randn({4, 8}, at::TensorOptions().device(at::kCUDA))},
                                    {.on_capture_failure = [&](const std::int64_t&, std::string_view why) {
                                       reason = std::string(why);
                                     },
                                     .audit = replay::AuditSwitch::on});
    (void)cudaGetLastError();
    INFO(reason);
    CHECK(graphed.is_eager(4));
    const std::string read_back_line = std::to_string(replay_examples::line_holding(kReadBackModel, "float("));
    const std::string call_line = std::to_string(replay_examples::line_holding(kReadBackModel, "self.read_peak(h)"));
    CHECK((has(reason, "inside aten::_local_scalar_dense") || has(reason, "inside aten::item")));
    CHECK(has(reason, "(a .item()), called from model.py:" + read_back_line + " (in read_peak) via model.py:" +
                          call_line + " (in forward),"));
    CHECK(has(reason, "reads a tensor's value on the host"));
    const at::Tensor x = torch::randn({4, 8}, at::TensorOptions().device(at::kCUDA));
    const at::Tensor h = torch::relu(x * 2.0);
    const auto out = graphed(x);
    CHECK(out.route() == replay::RouteKind::eager_fallback);
    CHECK((out[0] - h / (h.abs().max() + 1.0)).abs().max().item<float>() < 1e-5F);
  }
}
