// The capture audit on a TorchScript module (replay/audit.hpp with the
// libtorch adapter, replay/torch.hpp). The module is compiled here from
// TorchScript source named model.py (no Python needed); its forward
// normalizes by a peak it reads on the host, float(h.max()): a .item().
// replay::GraphedCallable captures it with the audit on; the read-back
// breaks the capture, the batch size runs eagerly from then on, and the
// failure reason names the CUDA call, the aten operator that made it and
// the line of model.py that called the operator, where CUDA alone says
// only that the capture was invalidated. The eager fallback still computes
// the right thing.
//
// Without a CUDA device it says so and exits 0. Exits non-zero if the audit
// does not name the planted line.
#include <torch/script.h>
#include <torch/torch.h>

#include <cstdio>
#include <cstdint>
#include <exception>
#include <string>
#include <string_view>

#include "replay/audit.hpp"
#include "replay/torch.hpp"
#include "script_source.hpp"

namespace {

// model.py: line 3 reads the peak back to the host.
const std::string kModelSource = R"(def forward(self, x):
    h = torch.relu(torch.matmul(x, self.weight))
    peak = float(h.abs().max())
    return h / (peak + 1.0)
)";

bool has(const std::string& text, std::string_view part) { return text.find(part) != std::string::npos; }

int failures = 0;
void expect(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "capture_audit_torchscript: FAILED: %s\n", what);
    ++failures;
  }
}

}  // namespace

int main() {
  if (!torch::cuda::is_available()) {
    std::printf("capture_audit_torchscript: no CUDA device found (torch::cuda::is_available() is false); "
                "nothing to run.\n");
    return 0;
  }
  try {
    const auto cuda = at::TensorOptions().device(at::kCUDA);
    torch::jit::Module model("Model");
    model.register_parameter("weight", torch::randn({64, 32}, cuda), /*is_buffer=*/false);
    replay_examples::define_methods(model, kModelSource, "model.py");
    const unsigned read_back_line = replay_examples::line_holding(kModelSource, "float(");

    std::puts("== a TorchScript module (model.py) whose forward reads a value on the host, graphed with the audit on");
    std::string reason;
    replay::GraphedCallable graphed(model, {torch::randn({8, 64}, cuda)},
                                    {.on_capture_failure = [&](const std::int64_t&, std::string_view why) {
                                       reason = std::string(why);
                                     },
                                     .audit = replay::AuditSwitch::on});
    (void)cudaGetLastError();  // the read-back's own error, if torch left one
    // The reason is torch's error, TorchScript's traceback among it, then
    // the audit's verdict: that is the part shown.
    const std::size_t verdict = reason.find("capture audit: ");
    std::printf("batch 8 runs eagerly: %s\n", graphed.is_eager(8) ? "yes" : "no");
    std::printf("fallback reason, the audit's verdict: %s\n",
                verdict == std::string::npos ? "(none)" : reason.substr(verdict).c_str());
    expect(graphed.is_eager(8), "the read-back breaks the capture and batch 8 runs eagerly");
    expect(verdict != std::string::npos, "the fallback reason carries the audit's verdict");
    // aten::_local_scalar_dense is the .item() (inside aten::item, inside
    // the float() of TorchScript).
    expect(has(reason, "inside aten::_local_scalar_dense") || has(reason, "inside aten::item"),
           "the verdict names the read-back's aten operator");
    expect(has(reason, "(a .item()), called from model.py:" + std::to_string(read_back_line) + " (in forward)"),
           "the verdict names the line of model.py that called it");

    const at::Tensor x = torch::randn({8, 64}, cuda);
    const auto out = graphed(x);
    const at::Tensor h = torch::relu(torch::matmul(x, model.attr("weight").toTensor()));
    const double error = (out[0] - h / (h.abs().max() + 1.0)).abs().max().item<double>();
    std::printf("the eager fallback against the same math in C++: max abs error %.1e\n", error);
    expect(out.route() == replay::RouteKind::eager_fallback, "the call ran the eager fallback");
    expect(error < 1e-5, "the eager fallback computes the model");
  } catch (const std::exception& e) {
    // Also replay::audit_unavailable_error: a profiler (Nsight Systems,
    // compute-sanitizer...) holds CUPTI.
    std::fprintf(stderr, "capture_audit_torchscript: %s\n", e.what());
    return 1;
  }
  if (failures != 0) {
    return 1;
  }
  std::puts("\ncapture_audit_torchscript: the read-back was reported with its line of model.py");
  return 0;
}
