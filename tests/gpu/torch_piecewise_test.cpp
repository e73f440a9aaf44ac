// Breakable torch captures (GraphedOptions::breaks = TorchBreaks::piecewise).
// Host cases check what the interception rests on, on the CPU: a
// thread-local RecordFunction callback sees the eager operators before their
// kernel, with their inputs, and their outputs after it, also from
// TorchScript (float(t), int(t), bool(t), `if t:`, nonzero); and how break
// values key segments. GPU cases check every graphed result against the
// eager one bit for bit: a TorchScript branch on a read-back float that
// flips between calls, int keys, nonzero whose count changes, a custom
// operator on the user's list, the audit's list of breaks, two threads, and
// the bound on paths.
//
// libtorch first: c10's logging header defines a glog-style CHECK macro,
// which is dropped here so that doctest's CHECK is the one in force.
#include <torch/csrc/jit/api/function_impl.h>
#include <torch/csrc/jit/runtime/interpreter.h>
#include <torch/library.h>
#include <torch/script.h>
#include <torch/torch.h>

#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "replay/torch.hpp"

#undef CHECK
#include <doctest/doctest.h>

#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "gpu_suite.hpp"

namespace {

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

torch::TensorOptions cuda(torch::Dtype dtype = torch::kFloat) {
  return torch::TensorOptions().device(torch::kCUDA).dtype(dtype);
}

// A custom operator a user puts on GraphedOptions::eager_operators: how many
// elements are positive, read back to the host.
int64_t positive_count(const at::Tensor& x) { return x.gt(0).sum().item<int64_t>(); }

TORCH_LIBRARY(replay_piecewise_test, m) { m.def("positive_count(Tensor x) -> int"); }
TORCH_LIBRARY_IMPL(replay_piecewise_test, CompositeExplicitAutograd, m) { m.impl("positive_count", &positive_count); }

int64_t call_positive_count(const at::Tensor& x) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("replay_piecewise_test::positive_count", "")
                             .typed<int64_t(const at::Tensor&)>();
  return op.call(x);
}

// What a thread-local RecordFunction callback saw of the eager operators.
struct SeenOperator {
  std::string name;
  std::size_t inputs = 0;
  std::string output_kind;  // of the first output, at the end callback
};
thread_local std::vector<SeenOperator>* seen_operators = nullptr;

std::unique_ptr<at::ObserverContext> on_seen_start(const at::RecordFunction& fn) {
  const std::string name = fn.name();
  if (seen_operators != nullptr && (name == "aten::_local_scalar_dense" || name == "aten::nonzero")) {
    seen_operators->push_back({name, fn.inputs().size(), ""});
  }
  return nullptr;
}
void on_seen_end(const at::RecordFunction& fn, at::ObserverContext* /*context*/) {
  const std::string name = fn.name();
  if (seen_operators != nullptr && (name == "aten::_local_scalar_dense" || name == "aten::nonzero") &&
      !fn.outputs().empty()) {
    // The last one of this name that has no output yet.
    for (auto it = seen_operators->rbegin(); it != seen_operators->rend(); ++it) {
      if (it->name == name && it->output_kind.empty()) {
        it->output_kind = fn.outputs()[0].tagKind();
        break;
      }
    }
  }
}

// stderr of what `body` does, as text.
template <class Body>
std::string stderr_of(Body&& body) {
  std::fflush(stderr);
  char path[] = "/tmp/replay_piecewise_stderr_XXXXXX";
  const int file = mkstemp(path);
  REQUIRE(file >= 0);
  const int saved = dup(2);
  dup2(file, 2);
  try {
    body();
  } catch (...) {
    std::fflush(stderr);
    dup2(saved, 2);
    close(saved);
    close(file);
    throw;
  }
  std::fflush(stderr);
  dup2(saved, 2);
  close(saved);
  close(file);
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  std::remove(path);
  return text.str();
}

// The TorchScript model of the issue, small: a read-back halfway whose branch
// changes what follows.
torch::jit::Module branchy_module(torch::Device device) {
  torch::jit::Module m("Branchy");
  m.register_parameter("w", torch::linspace(0.5, 1.5, 64, torch::TensorOptions().device(device)), false);
  m.define(R"(
def forward(self, x):
    h = torch.tanh(x * self.w) * 4.0 + x
    if float(h.abs().max()) > 8.0:
        h = h.clamp(-2.0, 2.0)
    else:
        h = h * 0.5
    return torch.sigmoid(h) + x
)");
  return m;
}

}  // namespace

TEST_SUITE("host") {

TEST_CASE("the eager operators reach a thread-local RecordFunction callback before their kernel, with inputs and outputs") {
  std::vector<SeenOperator> seen;
  seen_operators = &seen;
  const at::CallbackHandle handle = at::addThreadLocalCallback(at::RecordFunctionCallback(&on_seen_start, &on_seen_end)
                                                                   .scopes({at::RecordScope::FUNCTION})
                                                                   .needsInputs(true)
                                                                   .needsOutputs(true));
  // TorchScript: float(t), int(t), bool(t), `if t:` and nonzero all pass the dispatcher.
  const auto unit = torch::jit::compile(R"(
def f(x):
    y = x.abs().max()
    out = x
    if float(y) > 1.0:
        out = out * 2.0
    n = int(x.gt(0).sum())
    if bool(x.min() < 0.0):
        out = out + 1.0
    if x.sum() > 0:
        out = out - 1.0
    idx = torch.nonzero(x)
    return out * n + idx.size(0)
)");
  const at::Tensor x = torch::tensor({-1.5F, 0.0F, 2.0F, 3.0F});
  (void)unit->get_function("f")({x});
  at::removeCallback(handle);
  seen_operators = nullptr;

  int scalars = 0;
  int nonzeros = 0;
  for (const SeenOperator& op : seen) {
    CAPTURE(op.name);
    CHECK(op.inputs == 1);  // the tensor, boxed before the kernel ran
    if (op.name == "aten::_local_scalar_dense") {
      ++scalars;
      // float(t) reads a double, int(t) an int, bool(t) and `if t:` a bool.
      CHECK((op.output_kind == "Double" || op.output_kind == "Int" || op.output_kind == "Bool"));
    } else {
      ++nonzeros;
      CHECK(op.output_kind == "Tensor");
    }
  }
  CHECK(scalars == 4);
  CHECK(nonzeros == 1);
}

// What a callback on aten::_local_scalar_dense finds of the running script
// node, as the piecewise capture looks it up.
thread_local std::shared_ptr<torch::jit::Graph> lookup_graph;
thread_local std::vector<std::size_t>* lookup_decisions = nullptr;
std::unique_ptr<at::ObserverContext> on_lookup_start(const at::RecordFunction& fn) {
  if (lookup_decisions != nullptr && std::string(fn.name()) == "aten::_local_scalar_dense") {
    std::size_t found = 0;  // 0: no node found; else 1 + the decisions found
    for (const torch::jit::StackEntry& entry : torch::jit::currentCallstack()) {
      if (const torch::jit::Node* node = replay::detail::find_float_read(lookup_graph->block(), entry.range)) {
        found = 1 + replay::detail::analyse_scalar_read(node->output()).decisions.size();
      }
    }
    lookup_decisions->push_back(found);
  }
  return nullptr;
}

TEST_CASE("a running module's float read-back is found in its inlined forward graph by the source range of the running node") {
  torch::jit::Module inner("Inner");
  inner.define(R"(
def forward(self, x):
    return x * 2.0
)");
  torch::jit::Module module("Outer");
  module.register_module("inner", inner);
  module.define(R"(
def forward(self, x):
    h = self.inner.forward(x)
    if float(h.abs().max()) > 8.0:
        h = h.clamp(-2.0, 2.0)
    n = int(h.gt(0).sum())
    return h * n
)");
  lookup_graph = replay::detail::inlined_forward_graph(module);
  REQUIRE(lookup_graph != nullptr);
  std::vector<std::size_t> decisions;
  lookup_decisions = &decisions;
  const at::CallbackHandle handle =
      at::addThreadLocalCallback(at::RecordFunctionCallback(&on_lookup_start).scopes({at::RecordScope::FUNCTION}));
  torch::NoGradGuard no_grad;
  for (int i = 0; i < 3; ++i) {  // the profiling executor's runs, then its optimized plan
    (void)module.forward({torch::tensor({1.0F, -5.0F, 3.0F})});
  }
  at::removeCallback(handle);
  lookup_decisions = nullptr;
  lookup_graph.reset();
  REQUIRE(decisions.size() == 6);  // float(...) and int(...), three runs
  for (std::size_t i = 0; i < decisions.size(); i += 2) {
    CHECK(decisions[i] == 2);      // the float read: found, one comparison
    CHECK(decisions[i + 1] == 0);  // int(...): not a float read (it keys exactly)
  }
}

TEST_CASE("break values key segments: scalars by kind and value, tensors by sizes; others refused") {
  using replay::detail::append_key;
  const auto key_of = [](const c10::IValue& v) {
    std::string key;
    REQUIRE(append_key(key, v));
    return key;
  };
  CHECK(key_of(c10::IValue(int64_t{3})) == key_of(c10::IValue(int64_t{3})));
  CHECK(key_of(c10::IValue(int64_t{3})) != key_of(c10::IValue(int64_t{4})));
  CHECK(key_of(c10::IValue(true)) != key_of(c10::IValue(false)));
  CHECK(key_of(c10::IValue(int64_t{1})) != key_of(c10::IValue(true)));  // the kind is part of the key
  // A float keys by its exact value: 1.5 and 1.5000001 are two paths.
  CHECK(key_of(c10::IValue(1.5)) == key_of(c10::IValue(1.5)));
  CHECK(key_of(c10::IValue(1.5)) != key_of(c10::IValue(1.5000001)));
  // A tensor by its sizes, not its data (the data is copied into the static tensor).
  CHECK(key_of(c10::IValue(torch::zeros({3, 1}))) == key_of(c10::IValue(torch::ones({3, 1}))));
  CHECK(key_of(c10::IValue(torch::zeros({3, 1}))) != key_of(c10::IValue(torch::zeros({4, 1}))));
  std::string key;
  CHECK_FALSE(append_key(key, c10::IValue(std::string("text"))));
  // Only an operator on device memory breaks a capture: int(cpu_tensor) does not.
  const std::vector<c10::IValue> host_only{c10::IValue(torch::ones({2})), c10::IValue(int64_t{1})};
  CHECK_FALSE(replay::detail::reads_device_memory(c10::ArrayRef<const c10::IValue>(host_only.data(), host_only.size())));
  CHECK_FALSE(replay::detail::reads_device_memory(c10::ArrayRef<const c10::IValue>()));
}

TEST_CASE("a captured one-element read-back builds the scalar _local_scalar_dense builds: same kind, same key, every dtype it reads") {
  replay::detail::TorchRegion region;  // no decisions: keys by kind and exact bits
  auto key_of = [&](const c10::IValue& value) {
    std::string key;
    REQUIRE(region.key_of(c10::ArrayRef<c10::IValue>(value), key));
    return key;
  };
  int read = 0;
  for (const torch::Dtype dtype : {torch::kUInt8, torch::kInt8, torch::kInt16, torch::kInt, torch::kLong, torch::kHalf,
                                   torch::kBFloat16, torch::kFloat, torch::kDouble, torch::kComplexFloat,
                                   torch::kComplexDouble, torch::kBool}) {
    const replay::detail::ScalarReader reader = replay::detail::scalar_reader(dtype);
    REQUIRE(static_cast<bool>(reader));
    for (const double value : {0.0, -0.0, 1.0, 3.14159, -7.25, 250.0, 65504.0, 1e-3, std::nan("")}) {
      CAPTURE(dtype);
      CAPTURE(value);
      const at::Tensor one = torch::tensor({value}, torch::dtype(torch::kDouble)).to(dtype);
      const c10::IValue expected(at::_local_scalar_dense(one));
      const c10::IValue got(reader(one.const_data_ptr()));
      CHECK(got.tagKind() == expected.tagKind());
      if (expected.isDouble() || expected.isInt() || expected.isBool()) {
        CHECK(key_of(got) == key_of(expected));
      } else {
        REQUIRE(expected.isComplexDouble());
        const c10::complex<double> a = got.toComplexDouble();
        const c10::complex<double> b = expected.toComplexDouble();
        CHECK(std::memcmp(&a, &b, sizeof a) == 0);  // bit for bit (NaN included)
      }
      ++read;
    }
  }
  CHECK(read == 12 * 9);
  // Dtypes without a reader: the operator is re-run through the dispatcher instead.
  CHECK_FALSE(static_cast<bool>(replay::detail::scalar_reader(torch::kFloat8_e4m3fn)));
  CHECK_FALSE(static_cast<bool>(replay::detail::scalar_reader(torch::kComplexHalf)));
}

TEST_CASE("a float read back that TorchScript only compares with constants and branches on keys by the comparisons") {
  const auto unit = torch::jit::compile(R"(
def decides(x):
    h = x * 2.0
    if float(h.abs().max()) > 8.0:
        h = h.clamp(-2.0, 2.0)
    return h

def flows(x):
    s = float(x.sum())
    if s > 1.0:
        x = x + 1.0
    return x * s

def reversed_and_twice(x):
    v = float(x.max())
    if 0.5 <= v:
        x = x + 1.0
    if v != 3:
        x = x * 2.0
    return x
)");
  const auto float_read = [&](const char* name) {
    const std::shared_ptr<torch::jit::Graph> graph = torch::jit::toGraphFunction(unit->get_function(name)).graph();
    for (const torch::jit::Node* node : graph->nodes()) {
      if (replay::detail::reads_float_back(node)) {
        // Found again by its source range, as the capture finds the running node.
        CHECK(replay::detail::find_float_read(graph->block(), node->sourceRange()) == node);
        return std::make_pair(graph, node);
      }
    }
    FAIL("no float read back in " << name);
    return std::make_pair(graph, static_cast<const torch::jit::Node*>(nullptr));
  };
  using Compare = replay::detail::ScalarDecision::Compare;
  {
    const auto [graph, node] = float_read("decides");
    const auto analysis = replay::detail::analyse_scalar_read(node->output());
    CHECK(analysis.decisions_only);
    REQUIRE(analysis.decisions.size() == 1);
    CHECK(analysis.decisions[0].compare == Compare::gt);
    CHECK(analysis.decisions[0].constant == 8.0);
    CHECK(analysis.decisions[0].evaluate(8.5));
    CHECK_FALSE(analysis.decisions[0].evaluate(8.0));
  }
  {
    const auto [graph, node] = float_read("flows");
    const auto analysis = replay::detail::analyse_scalar_read(node->output());
    CHECK_FALSE(analysis.decisions_only);
    CHECK(analysis.other_use == "aten::mul");  // x * s: only the exact value is a safe key
  }
  {
    const auto [graph, node] = float_read("reversed_and_twice");
    const auto analysis = replay::detail::analyse_scalar_read(node->output());
    CHECK(analysis.decisions_only);
    REQUIRE(analysis.decisions.size() == 2);
    CHECK(analysis.decisions[0].compare == Compare::le);
    CHECK_FALSE(analysis.decisions[0].value_first);  // 0.5 <= v
    CHECK(analysis.decisions[0].evaluate(0.5));
    CHECK_FALSE(analysis.decisions[0].evaluate(0.25));
    CHECK(analysis.decisions[1].compare == Compare::ne);
    CHECK(analysis.decisions[1].constant == 3.0);  // an int constant compared with a float
    CHECK_FALSE(analysis.decisions[1].evaluate(3.0));
  }
}

TEST_CASE("the break policy: eager by default, the default eager operators, reasons and report kinds") {
  const replay::GraphedOptions options;
  CHECK(options.breaks == replay::TorchBreaks::eager);
  CHECK(options.eager_operators.empty());
  CHECK(options.max_break_paths == 16);
  CHECK(replay::default_eager_operators.size() == 3);
  CHECK(replay::default_eager_operators[0] == "aten::_local_scalar_dense");
  CHECK(replay::default_eager_operators[1] == "aten::nonzero");
  CHECK(replay::default_eager_operators[2] == "aten::masked_select");
  CHECK(contains(std::string(replay::detail::break_reason("aten::_local_scalar_dense")), "reads a tensor's value"));
  CHECK(contains(std::string(replay::detail::break_reason("aten::nonzero")), "depends on the data"));
  CHECK(contains(std::string(replay::detail::break_reason("my_ns::my_op")), "eager_operators"));
  CHECK(replay::to_string(replay::BucketCaptureKind::piecewise) == "piecewise");
  CHECK(replay::to_string(replay::BucketCaptureKind::whole) == "whole");
  CHECK(replay::to_string(replay::BucketCaptureKind::eager) == "eager");
  CHECK(replay::to_string(replay::BucketCaptureKind::not_captured) == "not captured");
  CHECK(positive_count(torch::tensor({1.0F, -1.0F, 2.0F})) == 2);
  CHECK(call_positive_count(torch::tensor({1.0F, -1.0F, 2.0F})) == 2);
}

}  // TEST_SUITE("host")

TEST_SUITE("gpu" * replay_test::needs_device()) {

TEST_CASE("a TorchScript branch on a read-back float: piecewise, 2 segments, bit for bit as eager when it flips") {
  torch::jit::Module module = branchy_module(torch::kCUDA);
  const at::Tensor small = torch::linspace(-1.0, 1.0, 4 * 64, cuda()).reshape({4, 64});
  const at::Tensor big = small * 10.0;  // crosses the threshold: the other branch
  replay::GraphedCallable graphed(module, {small}, {.breaks = replay::TorchBreaks::piecewise});
  replay::BucketCaptureReport report = graphed.capture_report(4);
  CHECK(report.kind == replay::BucketCaptureKind::piecewise);
  CHECK(report.segments == 2);
  REQUIRE(report.breaks.size() == 1);
  CHECK(report.breaks[0].op == "aten::_local_scalar_dense");
  CHECK(contains(report.breaks[0].why, "reads a tensor's value back"));
  for (int round = 0; round < 6; ++round) {
    CAPTURE(round);
    const at::Tensor& x = round % 2 == 0 ? big : small;
    const auto out = graphed(x);
    CHECK(out.graphed());
    const std::vector<at::Tensor> expected = graphed.run_eager({x});
    CHECK(torch::equal(out[0], expected[0]));
  }
  report = graphed.capture_report(4);
  CHECK(report.kind == replay::BucketCaptureKind::piecewise);
  CHECK(report.paths == 2);     // one per value read back
  CHECK(report.misses == 1);    // the first big input
  CHECK(report.path_switches >= 4);
}

TEST_CASE("a TorchScript read-back keyed by its comparison: fresh random values on both sides, two paths only") {
  torch::jit::Module module = branchy_module(torch::kCUDA);
  const at::Tensor example = torch::linspace(-1.0, 1.0, 4 * 64, cuda()).reshape({4, 64});
  replay::GraphedCallable graphed(module, {example},
                                  {.breaks = replay::TorchBreaks::piecewise, .max_break_paths = 2});
  const replay::BucketCaptureReport first = graphed.capture_report(4);
  REQUIRE(first.breaks.size() == 1);
  CHECK(contains(first.breaks[0].why, "keyed by the outcome of the 1 comparison(s)"));
  torch::manual_seed(replay_test::case_seed());
  for (int i = 0; i < 20; ++i) {
    CAPTURE(i);
    // Every call reads back another float; half of them cross the threshold.
    const at::Tensor x = torch::rand({4, 64}, cuda()) * (i % 2 == 0 ? 1.0 : 10.0);
    const auto out = graphed(x);
    CHECK(torch::equal(out[0], graphed.run_eager({x})[0]));
  }
  const replay::BucketCaptureReport report = graphed.capture_report(4);
  CHECK(report.kind == replay::BucketCaptureKind::piecewise);  // not eager: 2 paths were enough
  CHECK(report.paths == 2);
}

TEST_CASE("without a break under the piecewise policy the bucket is one graph; under the eager policy a read-back makes it eager") {
  torch::jit::Module module = branchy_module(torch::kCUDA);
  const at::Tensor x = torch::randn({4, 64}, cuda());
  auto plain = [](const at::Tensor& t) { return torch::relu(t) * 2.0; };
  replay::GraphedCallable whole(plain, {x}, {.breaks = replay::TorchBreaks::piecewise});
  CHECK(whole.capture_report(4).kind == replay::BucketCaptureKind::whole);
  CHECK(torch::equal(whole(x)[0], torch::relu(x) * 2.0));

  std::string reason;
  replay::GraphedCallable eager(module, {x}, {.on_capture_failure = [&](const int64_t&, std::string_view why) {
                                                reason = std::string(why);
                                              }});
  const replay::BucketCaptureReport report = eager.capture_report(4);
  CHECK(report.kind == replay::BucketCaptureKind::eager);
  CHECK(report.reason == reason);
  CHECK_FALSE(reason.empty());
}

TEST_CASE("an int read back keys the segments after it exactly; each value gets its path") {
  const at::Tensor w = torch::linspace(-1.0, 1.0, 32, cuda());
  auto fn = [w](const at::Tensor& x) {
    const int64_t n = x.gt(0).sum().item<int64_t>();  // a C++ .item(): aten::_local_scalar_dense
    return x * w * static_cast<double>(n) + static_cast<double>(n % 3);
  };
  const at::Tensor base = torch::linspace(0.1, 1.0, 2 * 32, cuda()).reshape({2, 32});
  replay::GraphedCallable graphed(fn, {base}, {.breaks = replay::TorchBreaks::piecewise});
  CHECK(graphed.capture_report(2).kind == replay::BucketCaptureKind::piecewise);
  // 64, about 35 and 0 positive elements: three values, three paths.
  for (int round = 0; round < 9; ++round) {
    CAPTURE(round);
    const at::Tensor x = base - (round % 3 == 0 ? 0.0 : round % 3 == 1 ? 0.5 : 2.0);
    const auto out = graphed(x);
    CHECK(torch::equal(out[0], fn(x)));
  }
  CHECK(graphed.capture_report(2).paths == 3);
}

TEST_CASE("nonzero whose count changes: the next segment reads the new indices from the static output") {
  auto fn = [](const at::Tensor& x) {
    const at::Tensor flat = x.flatten();
    const at::Tensor idx = torch::nonzero(flat > 0).squeeze(1);
    const at::Tensor picked = flat.index_select(0, idx);
    return x + picked.sum();
  };
  const at::Tensor base = torch::linspace(-1.0, 1.0, 2 * 16, cuda()).reshape({2, 16});
  replay::GraphedCallable graphed(fn, {base}, {.breaks = replay::TorchBreaks::piecewise});
  const replay::BucketCaptureReport report = graphed.capture_report(2);
  CHECK(report.kind == replay::BucketCaptureKind::piecewise);
  REQUIRE_FALSE(report.breaks.empty());
  CHECK(report.breaks[0].op == "aten::nonzero");
  // Same count, other positions (same path: the indices are copied in), then other counts.
  const std::vector<at::Tensor> inputs = {base, base.flip(0), base + 0.5, base - 0.5, base.flip(0), base + 0.5};
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    CAPTURE(i);
    CHECK(torch::equal(graphed(inputs[i])[0], fn(inputs[i])));
  }
  CHECK(graphed.capture_report(2).paths == 3);
}

TEST_CASE("a custom operator on GraphedOptions::eager_operators breaks the capture and keys by its result") {
  auto fn = [](const at::Tensor& x) {
    const int64_t n = call_positive_count(x * 2.0);
    return x * static_cast<double>(n);
  };
  const at::Tensor base = torch::linspace(-1.0, 1.0, 2 * 8, cuda()).reshape({2, 8});
  replay::GraphedCallable listed(fn, {base},
                                 {.breaks = replay::TorchBreaks::piecewise,
                                  .eager_operators = {"replay_piecewise_test::positive_count"}});
  const replay::BucketCaptureReport report = listed.capture_report(2);
  CHECK(report.kind == replay::BucketCaptureKind::piecewise);
  REQUIRE(report.breaks.size() == 1);  // the .item() inside it runs inside the region
  CHECK(report.breaks[0].op == "replay_piecewise_test::positive_count");
  CHECK(contains(report.breaks[0].why, "eager_operators"));
  for (const double shift : {0.0, 0.5, -0.5, 0.0}) {
    const at::Tensor x = base + shift;
    CHECK(torch::equal(listed(x)[0], fn(x)));
  }
  CHECK_THROWS_AS(
      (void)replay::GraphedCallable(fn, {base}, {.breaks = replay::TorchBreaks::piecewise, .eager_operators = {"no_namespace"}}),
      replay::usage_error);
}

TEST_CASE("with the audit on, each break is listed: operator, why, between which segments") {
  torch::jit::Module module = branchy_module(torch::kCUDA);
  const at::Tensor x = torch::linspace(-1.0, 1.0, 4 * 64, cuda()).reshape({4, 64});
  const std::string text = stderr_of([&] {
    replay::GraphedCallable graphed(module, {x},
                                    {.audit = replay::AuditSwitch::on, .breaks = replay::TorchBreaks::piecewise});
    CHECK(graphed.capture_report(4).kind == replay::BucketCaptureKind::piecewise);
  });
  CAPTURE(text);
  CHECK(contains(text, "piecewise torch capture breaks at aten::_local_scalar_dense"));
  CHECK(contains(text, "reads a tensor's value back to the host"));
  CHECK(contains(text, "between graph segments 1 and 2"));
}

TEST_CASE("a float read back into a tensor op keys by its exact value, bounded: beyond max_break_paths the bucket runs eagerly, and says why") {
  auto fn = [](const at::Tensor& x) {
    const double peak = x.abs().max().item<double>();
    return x / peak;  // the value flows into a tensor op: only its exact value is a safe key
  };
  const at::Tensor base = torch::linspace(-1.0, 1.0, 2 * 8, cuda()).reshape({2, 8});
  replay::GraphedCallable graphed(fn, {base}, {.breaks = replay::TorchBreaks::piecewise, .max_break_paths = 3});
  for (int i = 0; i < 6; ++i) {
    CAPTURE(i);
    const at::Tensor x = base * (1.0 + i);
    CHECK(torch::equal(graphed(x)[0], fn(x)));  // right every call, graphed or not
  }
  const replay::BucketCaptureReport report = graphed.capture_report(2);
  CHECK(report.kind == replay::BucketCaptureKind::eager);
  CHECK(contains(report.reason, "max_break_paths"));
  CHECK(contains(report.reason, "aten::_local_scalar_dense"));
}

TEST_CASE("an eager operator on host tensors only does not break the capture: one whole graph") {
  const at::Tensor scale = torch::tensor({3.0F});  // a CPU tensor the callable reads
  auto fn = [scale](const at::Tensor& x) { return x * scale.item<double>(); };
  const at::Tensor x = torch::randn({2, 8}, cuda());
  replay::GraphedCallable graphed(fn, {x}, {.breaks = replay::TorchBreaks::piecewise});
  CHECK(graphed.capture_report(2).kind == replay::BucketCaptureKind::whole);
  CHECK(torch::equal(graphed(x)[0], fn(x)));
}

TEST_CASE("a capture broken by a call that is not on the eager list still makes the bucket eager, with its reason") {
  auto fn = [](const at::Tensor& x) {
    const at::Tensor y = x * 2.0;
    c10::cuda::getCurrentCUDAStream().synchronize();  // an ordinary C++ call: not an operator, no break
    return y + 1.0;
  };
  const at::Tensor x = torch::randn({2, 8}, cuda());
  std::string reason;
  replay::GraphedCallable graphed(fn, {x},
                                  {.on_capture_failure = [&](const int64_t&, std::string_view why) { reason = why; },
                                   .breaks = replay::TorchBreaks::piecewise});
  const replay::BucketCaptureReport report = graphed.capture_report(2);
  CHECK(report.kind == replay::BucketCaptureKind::eager);
  CHECK(report.reason == reason);
  CHECK(contains(reason, "captur"));
  CHECK(torch::equal(graphed(x)[0], fn(x)));
}

// How many times aten::_local_scalar_dense ran on this thread while counted.
thread_local int scalar_reads = 0;
std::unique_ptr<at::ObserverContext> on_scalar_read(const at::RecordFunction& fn) {
  if (std::string_view(fn.name()) == "aten::_local_scalar_dense") {
    ++scalar_reads;
  }
  return nullptr;
}

TEST_CASE("a one-element read-back is copied by the segment before it: a replay runs no operator between the segments, and each dtype keys as the operator's value") {
  for (const torch::Dtype dtype : {torch::kHalf, torch::kBFloat16, torch::kFloat, torch::kDouble, torch::kInt,
                                   torch::kLong, torch::kBool}) {
    CAPTURE(dtype);
    // Reads back one element of `dtype` (bool: whether any is positive; else
    // the sum, rounded to the dtype) and branches on it.
    auto fn = [dtype](const at::Tensor& x) {
      const at::Tensor one = dtype == torch::kBool ? x.gt(0.5).any() : x.sum().to(dtype);
      const c10::Scalar value = one.item();  // aten::_local_scalar_dense
      const bool high = dtype == torch::kBool ? value.toBool() : value.toDouble() > 8.0;
      return high ? x * 2.0 + 1.0 : x - 3.0;
    };
    const at::Tensor low = torch::full({2, 8}, 0.25, cuda());  // sum 4, none above 0.5
    const at::Tensor high = torch::full({2, 8}, 1.0, cuda());  // sum 16, all above 0.5
    replay::GraphedCallable graphed(fn, {low}, {.breaks = replay::TorchBreaks::piecewise});
    REQUIRE(graphed.capture_report(2).kind == replay::BucketCaptureKind::piecewise);
    CHECK(torch::equal(graphed(high)[0], fn(high)));  // records the other path (the operator runs live)
    REQUIRE(graphed.capture_report(2).paths == 2);

    scalar_reads = 0;
    const at::CallbackHandle handle =
        at::addThreadLocalCallback(at::RecordFunctionCallback(&on_scalar_read).scopes({at::RecordScope::FUNCTION}));
    std::vector<at::Tensor> outs;
    for (int round = 0; round < 6; ++round) {
      outs.push_back(graphed(round % 2 == 0 ? low : high)[0].clone());
    }
    at::removeCallback(handle);
    CHECK(scalar_reads == 0);  // both paths known: the segments' copies were read, no operator re-run
    for (int round = 0; round < 6; ++round) {
      CAPTURE(round);
      CHECK(torch::equal(outs[static_cast<std::size_t>(round)], fn(round % 2 == 0 ? low : high)));
    }
    const replay::BucketCaptureReport report = graphed.capture_report(2);
    CHECK(report.kind == replay::BucketCaptureKind::piecewise);
    CHECK(report.paths == 2);
    CHECK(report.misses == 1);
  }
}

TEST_CASE("the segments of a piecewise key are captured into the callable's one pool: a reference per segment, of every path") {
  torch::jit::Module module = branchy_module(torch::kCUDA);
  const at::Tensor small = torch::linspace(-1.0, 1.0, 4 * 64, cuda()).reshape({4, 64});
  const c10::DeviceIndex device = small.device().index();
  replay::GraphedCallable graphed(module, {small}, {.breaks = replay::TorchBreaks::piecewise});
  const replay::BucketCaptureReport first = graphed.capture_report(4);
  REQUIRE(first.kind == replay::BucketCaptureKind::piecewise);
  REQUIRE(first.segments == 2);
  // The callable's own reference and one per segment: no segment has a pool of its own.
  CHECK(c10::cuda::CUDACachingAllocator::getPoolUseCount(device, graphed.pool()) == 3);
  const std::size_t one_path = graphed.pool_reserved_bytes();
  CHECK(one_path > 0);
  (void)graphed(small * 10.0);  // the other branch: a second path, into the same pool
  REQUIRE(graphed.capture_report(4).paths == 2);
  CHECK(c10::cuda::CUDACachingAllocator::getPoolUseCount(device, graphed.pool()) == 5);
  CHECK(graphed.pool_reserved_bytes() >= one_path);
}

TEST_CASE("a piecewise GraphedCallable called from two threads: every result equals eager") {
  torch::jit::Module module = branchy_module(torch::kCUDA);
  const at::Tensor small = torch::linspace(-1.0, 1.0, 4 * 64, cuda()).reshape({4, 64});
  const at::Tensor big = small * 10.0;
  replay::GraphedCallable graphed(module, {small}, {.breaks = replay::TorchBreaks::piecewise});
  const at::Tensor expected_small = graphed.run_eager({small})[0].cpu();
  const at::Tensor expected_big = graphed.run_eager({big})[0].cpu();
  std::atomic<int> wrong{0};
  std::atomic<int> done{0};
  auto worker = [&](int seed) {
    c10::cuda::CUDAGuard device_guard(small.device());
    const c10::cuda::CUDAStream stream = c10::cuda::getStreamFromPool();
    const c10::cuda::CUDAStreamGuard stream_guard(stream);
    for (int i = 0; i < replay_test::scaled(40); ++i) {
      const bool use_big = (i + seed) % 3 == 0;
      const auto out = graphed(use_big ? big : small);
      if (!torch::equal(out[0].cpu(), use_big ? expected_big : expected_small)) {
        ++wrong;
      }
      ++done;
    }
  };
  std::thread a(worker, 0);
  std::thread b(worker, 1);
  a.join();
  b.join();
  CHECK(wrong.load() == 0);
  CHECK(done.load() == 2 * replay_test::scaled(40));
  CHECK(graphed.capture_report(4).kind == replay::BucketCaptureKind::piecewise);
}

}  // TEST_SUITE("gpu")
