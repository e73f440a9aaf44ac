// The libtorch adapter (replay/torch.hpp). Host cases use CPU tensors only:
// callable adaptation, result conversion, input validation and messages, the
// refusals made before any CUDA call. GPU cases check graphed outputs against
// eager ones on fresh random inputs, stale-output detection, pool sharing by
// the caching allocator's own accounting, the eager fallback, RNG, streams
// and 10k replays without memory growth.
//
// libtorch first: c10's logging header defines a glog-style CHECK macro,
// which is dropped here so that doctest's CHECK is the one in force.
#include <torch/script.h>
#include <torch/torch.h>

#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "replay/torch.hpp"
#include "resnet.hpp"

#undef CHECK
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <future>
#include <memory>
#include <mutex>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "gpu_suite.hpp"

namespace {

bool under_sanitizer() { return std::getenv("REPLAY_UNDER_SANITIZER") != nullptr; }

// ResNet-50 is too slow under compute-sanitizer; those cases are skipped
// there. (A test case's own skip decorator replaces the suite's, so it also
// says "no device".)
auto needs_full_speed() { return doctest::skip(under_sanitizer() || replay_test::skip_gpu_cases()); }

// torch's generator seeded from the test case's seed (printed by the test
// main; REPLAY_TEST_SEED re-runs a case with the same data).
void fresh_seed() {
  const std::uint64_t seed = replay_test::case_seed();
  torch::manual_seed(seed);
  MESSAGE("torch seed " << seed);
}

// max |actual - expected| / max |expected|. One element far off shows; an L2
// norm over thousands of outputs hides it.
double max_error(const at::Tensor& actual, const at::Tensor& expected) {
  const at::Tensor a = actual.to(at::kDouble);
  const at::Tensor e = expected.to(at::kDouble);
  REQUIRE(a.sizes() == e.sizes());
  const double scale = e.abs().max().item<double>();
  return (a - e).abs().max().item<double>() / (scale > 0.0 ? scale : 1.0);
}

// The same kernels on the same device agree almost exactly (fp32 without TF32;
// fp16 within a couple of units in the last place of the largest output).
constexpr double kFp32Tolerance = 1e-5;
constexpr double kFp16Tolerance = 2e-3;
double tolerance_for(torch::Dtype dtype) { return dtype == torch::kHalf ? kFp16Tolerance : kFp32Tolerance; }

template <class Module>
at::Tensor forward_of(Module& module, const at::Tensor& x) {
  return module->forward(x);
}
at::Tensor forward_of(torch::jit::Module& module, const at::Tensor& x) { return module.forward({x}).toTensor(); }

// The module itself (not the adapter's run_eager) on `x` padded with zeros to
// the bucket the graphed call ran at, sliced back: the same shapes, so the same
// kernels, as the replay. Rows are independent in these models (eval mode).
template <class Module>
at::Tensor reference(const replay::GraphedCallable& graphed, Module& module, const at::Tensor& x) {
  const std::int64_t batch = x.size(0);
  std::int64_t padded = batch;
  for (const std::int64_t bucket : graphed.buckets()) {
    if (bucket >= batch) {
      padded = bucket;
      break;
    }
  }
  c10::InferenceMode inference;
  at::Tensor input = x;
  if (padded > batch) {
    std::vector<std::int64_t> pad_shape(x.sizes().begin(), x.sizes().end());
    pad_shape[0] = padded - batch;
    input = at::cat({x, at::zeros(pad_shape, x.options())});
  }
  return forward_of(module, input).narrow(0, 0, batch).clone();
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// Linear-ReLU-Linear: small and fast, with cuBLAS GEMMs and elementwise kernels.
torch::nn::Sequential small_mlp(torch::Device device, torch::Dtype dtype) {
  torch::nn::Sequential net(torch::nn::Linear(64, 256), torch::nn::ReLU(), torch::nn::Linear(256, 32));
  net->eval();
  net->to(device, dtype);
  return net;
}

torch::TensorOptions cuda(torch::Dtype dtype = torch::kFloat) { return torch::TensorOptions().device(torch::kCUDA).dtype(dtype); }

void no_tf32() {
  at::globalContext().setAllowTF32CuBLAS(false);
  at::globalContext().setAllowTF32CuDNN(false);
}

std::size_t pool_bytes(c10::MempoolId_t pool) {
  std::size_t bytes = 0;
  for (const auto& segment : c10::cuda::CUDACachingAllocator::snapshot(pool).segments) {
    if (segment.owner_private_pool_id == pool) {
      bytes += segment.total_size;
    }
  }
  return bytes;
}

struct ForwardOnly : torch::nn::Module {
  at::Tensor forward(const at::Tensor& x) { return x * 3; }
};

// Convolution, batch norm (non-trivial statistics), ReLU, a residual add and
// a linear head, written in TorchScript: what freezing folds and
// optimize_for_inference fuses (conv + add + ReLU on CUDA).
torch::jit::Module conv_bn_module(torch::Device device) {
  torch::jit::Module m("ConvBn");
  m.register_parameter("w1", torch::randn({16, 3, 3, 3}, device) * 0.2, false);
  m.register_parameter("w2", torch::randn({16, 16, 3, 3}, device) * 0.1, false);
  m.register_buffer("mean", torch::randn({16}, device) * 0.1);
  m.register_buffer("var", torch::rand({16}, device) + 0.5);
  m.register_parameter("gamma", torch::rand({16}, device) + 0.5, false);
  m.register_parameter("beta", torch::randn({16}, device) * 0.1, false);
  m.register_parameter("fc", torch::randn({10, 16}, device) * 0.1, false);
  m.register_buffer("steps", torch::zeros({1}, torch::TensorOptions().device(device).dtype(torch::kLong)));
  m.define(R"(
def forward(self, x):
    y = torch.conv2d(x, self.w1, None, [1, 1], [1, 1])
    y = torch.batch_norm(y, self.gamma, self.beta, self.mean, self.var, False, 0.1, 1e-5, True)
    y = torch.relu(y)
    z = torch.conv2d(y, self.w2, None, [1, 1], [1, 1])
    z = torch.relu(z + y)
    return torch.linear(z.mean([2, 3]), self.fc)
)");
  m.eval();
  return m;
}

}  // namespace

// ---------------------------------------------------------------------------
// host: no GPU needed
// ---------------------------------------------------------------------------

TEST_SUITE("host") {

TEST_CASE("GraphedFlags is a bitmask and the error types are what they claim") {
  using replay::GraphedFlags;
  constexpr auto flags = GraphedFlags::view_outputs | GraphedFlags::lazy_capture;
  static_assert(replay::has_flag(flags, GraphedFlags::view_outputs));
  static_assert(!replay::has_flag(flags, GraphedFlags::no_grad));
  CHECK(replay::to_underlying(flags) == 5U);
  static_assert(std::is_base_of_v<replay::usage_error, replay::stale_output_error>);
  static_assert(std::is_base_of_v<std::runtime_error, replay::capture_failed_error>);
  static_assert(!std::is_copy_constructible_v<replay::GraphedCallable>);
  static_assert(std::is_nothrow_move_constructible_v<replay::GraphedCallable>);
  static_assert(std::is_nothrow_move_assignable_v<replay::GraphedCallable>);
  static_assert(replay::GraphBackend<replay::TorchGraphBackend>);
}

// TensorCallable accepts modules, JIT modules and tensor callables, and nothing
// else (compile-time claims: a broken one breaks the build).
static_assert(replay::TensorCallable<torch::nn::Linear>);
static_assert(replay::TensorCallable<torch::nn::Sequential>);
static_assert(replay::TensorCallable<std::shared_ptr<ForwardOnly>>);
static_assert(replay::TensorCallable<torch::jit::Module>);
static_assert(replay::TensorCallable<decltype([](const at::Tensor& x) { return x; })>);
static_assert(replay::TensorCallable<decltype([](at::Tensor a, at::Tensor b) { return std::make_tuple(a, b); })>);
static_assert(replay::TensorCallable<decltype([](const std::vector<at::Tensor>& v) { return v; })>);
static_assert(!replay::TensorCallable<decltype([](int x) { return x; })>);
static_assert(!replay::TensorCallable<int>);

TEST_CASE("callables are called with as many tensors as they take, and their results become tensor lists") {
  const std::source_location here = std::source_location::current();
  const at::Tensor a = torch::randn({2, 3});
  const at::Tensor b = torch::randn({2, 3});

  auto one = [](const at::Tensor& x) { return x * 2; };
  auto out = replay::detail::call_with_tensors(one, {a}, here);
  REQUIRE(out.size() == 1);
  CHECK(torch::allclose(out[0], a * 2));

  auto two = [](at::Tensor x, at::Tensor y) { return std::make_tuple(x + y, x - y, x * y); };
  out = replay::detail::call_with_tensors(two, {a, b}, here);
  REQUIRE(out.size() == 3);
  CHECK(torch::allclose(out[1], a - b));

  auto pair = [](at::Tensor x, at::Tensor y) { return std::make_pair(x, y); };
  CHECK(replay::detail::call_with_tensors(pair, {a, b}, here).size() == 2);

  auto vec = [](const std::vector<at::Tensor>& v) { return std::vector<at::Tensor>{v[1], v[0]}; };
  out = replay::detail::call_with_tensors(vec, {a, b}, here);
  CHECK(out[0].equal(b));

  auto three = [](const at::Tensor& x, const at::Tensor& y, const at::Tensor& z) { return x * y + z; };
  CHECK(torch::allclose(replay::detail::call_with_tensors(three, {a, b, a}, here)[0], a * b + a));

  // A generic callable that also accepts the vector gets the vector (documented precedence).
  auto generic = [](const auto& all) { return all; };
  CHECK(replay::detail::call_with_tensors(generic, {a, b}, here).size() == 2);

  torch::nn::Linear linear(3, 4);
  CHECK(replay::detail::call_with_tensors(linear, {a}, here)[0].sizes() == at::IntArrayRef({2, 4}));

  auto module = std::make_shared<ForwardOnly>();
  CHECK(replay::detail::call_with_tensors(module, {a}, here)[0].equal(a * 3));

  // Wrong arity: a clear usage_error, not a crash.
  try {
    (void)replay::detail::call_with_tensors(one, {a, b}, here);
    FAIL("expected usage_error");
  } catch (const replay::usage_error& e) {
    CHECK(contains(e.what(), "cannot be called with 2 tensor argument(s)"));
  }

  // Move-only callables are held by shared_ptr.
  auto owned = std::make_unique<float>(5.0F);
  replay::TensorFunction fn = replay::make_tensor_function(
      [p = std::move(owned)](const at::Tensor& x) { return x * static_cast<double>(*p); });
  CHECK(fn({a})[0].equal(a * 5.0));
}

TEST_CASE("IValue results: tensors, tuples and lists become tensor lists; anything else is refused") {
  const std::source_location here = std::source_location::current();
  const at::Tensor a = torch::randn({3});
  const at::Tensor b = torch::randn({3});
  CHECK(replay::detail::to_tensor_list(c10::IValue(a), here).size() == 1);
  CHECK(replay::detail::to_tensor_list(c10::IValue(c10::ivalue::Tuple::create({a, b})), here).size() == 2);
  CHECK(replay::detail::to_tensor_list(c10::IValue(c10::List<at::Tensor>({a, b, a})), here).size() == 3);
  try {
    (void)replay::detail::to_tensor_list(c10::IValue(int64_t{3}), here);
    FAIL("expected usage_error");
  } catch (const replay::usage_error& e) {
    CHECK(contains(e.what(), "returned a Int"));
    CHECK(contains(e.what(), "must return tensors"));
  }
}

TEST_CASE("a TorchScript module is called through forward(std::vector<IValue>)") {
  torch::jit::Module module("Scaled");
  module.define(R"(
def forward(self, x, y):
    return x * 2.0 + y, y
)");
  const at::Tensor x = torch::randn({4, 5});
  const at::Tensor y = torch::randn({4, 5});
  const auto out = replay::detail::call_with_tensors(module, {x, y}, std::source_location::current());
  REQUIRE(out.size() == 2);
  CHECK(torch::allclose(out[0], x * 2.0 + y));
  CHECK(out[1].equal(y));
}

TEST_CASE("inputs are checked against the captured shapes, with both shapes in the message") {
  replay::detail::GraphedState state;
  state.capacity = 32;
  state.specs.push_back({at::kHalf, {32, 3, 224, 224}, 0});
  state.specs.push_back({at::kLong, {32, 7}, 0});
  const auto here = std::source_location::current();
  auto half = [](std::vector<int64_t> sizes) { return torch::zeros(sizes, torch::kHalf); };
  auto longs = [](std::vector<int64_t> sizes) { return torch::zeros(sizes, torch::kLong); };

  CHECK(state.check_inputs(std::vector<at::Tensor>{half({5, 3, 224, 224}), longs({5, 7})}, here) == 5);
  CHECK(state.check_inputs(std::vector<at::Tensor>{half({40, 3, 224, 224}), longs({40, 7})}, here) == 40);  // oversize is the router's call

  auto message = [&](const std::vector<at::Tensor>& inputs) {
    try {
      (void)state.check_inputs(inputs, here);
    } catch (const replay::usage_error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  std::string m = message({half({4, 3, 200, 200}), longs({4, 7})});
  CHECK(contains(m, "input 0 has shape [4, 3, 200, 200] and dtype Half"));
  CHECK(contains(m, "captured for shape [B, 3, 224, 224]"));
  m = message({torch::zeros({4, 3, 224, 224}), longs({4, 7})});
  CHECK(contains(m, "dtype Float"));
  CHECK(contains(m, "dtype Half"));
  m = message({half({4, 3, 224, 224}), longs({6, 7})});
  CHECK(contains(m, "input 0 has batch 4 but input 1 has batch 6"));
  m = message({half({4, 3, 224, 224})});
  CHECK(contains(m, "called with 1 input(s)"));
  m = message({half({3, 224, 224}), longs({4, 7})});
  CHECK(contains(m, "[3, 224, 224]"));
  m = message({at::Tensor(), longs({4, 7})});
  CHECK(contains(m, "undefined"));
}

TEST_CASE("GraphedCallable refuses bad examples before touching CUDA") {
  auto identity = [](const at::Tensor& x) { return x; };
  try {
    replay::GraphedCallable g(identity, {torch::randn({4, 8})});
    FAIL("expected usage_error");
  } catch (const replay::usage_error& e) {
    CHECK(contains(e.what(), "must be CUDA tensors"));
  }
  CHECK_THROWS_AS(replay::GraphedCallable(identity, {}), replay::usage_error);
}

TEST_CASE("default GraphedOutputs are empty, owned and never stale") {
  replay::GraphedOutputs out;
  CHECK(out.empty());
  CHECK_FALSE(out.stale());
  CHECK_FALSE(out.is_view());
  CHECK_THROWS_AS((void)out.at(0), replay::usage_error);
}

TEST_CASE("the call cache: buckets by batch, and padding zeroed only when the high-water mark is above the batch") {
  replay::detail::GraphedCallCache cache;
  const std::vector<std::int64_t> buckets{2, 4, 8};
  cache.reset(buckets);
  CHECK(cache.padded(1) == 2);
  CHECK(cache.padded(2) == 2);
  CHECK(cache.padded(3) == 4);
  CHECK(cache.padded(5) == 8);
  CHECK(cache.padded(8) == 8);
  CHECK(cache.padded(9) == 0);
  CHECK(cache.dirty_rows() == 8);  // the examples fill every row at first
  cache.mark_written(3);
  CHECK(cache.dirty_rows() == 8);
  cache.mark_zeroed_from(3);
  CHECK(cache.dirty_rows() == 3);
  cache.mark_written(2);
  CHECK(cache.dirty_rows() == 3);
  cache.mark_written(6);
  CHECK(cache.dirty_rows() == 6);
}

TEST_CASE("fast-mode view cache: a view is recognised only while it is still the batch's rows of its output") {
  const at::Tensor base = torch::randn({8, 4});
  const at::Tensor view = base.narrow(0, 0, 3);
  using Cache = replay::detail::GraphedCallCache;
  CHECK(Cache::sliced(base, 3, 8));
  CHECK_FALSE(Cache::sliced(base, 8, 8));
  CHECK_FALSE(Cache::sliced(torch::randn({5}), 3, 8));
  CHECK(Cache::is_output_view(view, base, 3, 8));
  CHECK_FALSE(Cache::is_output_view(view, base, 2, 8));
  CHECK_FALSE(Cache::is_output_view(view.clone(), base, 3, 8));
  CHECK(Cache::is_output_view(base, base, 8, 8));
  CHECK_FALSE(Cache::is_output_view(base.clone(), base, 8, 8));
  at::Tensor changed = base.narrow(0, 0, 3);
  changed.unsqueeze_(2);  // metadata changed in place by a caller: not reused
  CHECK_FALSE(Cache::is_output_view(changed, base, 3, 8));

  Cache cache;
  const std::vector<std::int64_t> buckets{8};
  cache.reset(buckets);
  const std::vector<at::Tensor> launched{base};
  CHECK(cache.find_views(3, 8, launched) == nullptr);
  (void)cache.store_views(3, launched, std::make_shared<std::vector<at::Tensor>>(std::vector<at::Tensor>{view}));
  cache.note_views_stored();
  REQUIRE(cache.find_views(3, 8, launched) != nullptr);
  CHECK((*cache.find_views(3, 8, launched))->at(0).is_same(view));
  const std::vector<at::Tensor> other{base};
  CHECK(cache.find_views(3, 8, other) == nullptr);  // other static outputs
  cache.drop_views();
  CHECK(cache.find_views(3, 8, launched) == nullptr);
}

TEST_CASE("prepare: frozen and optimized TorchScript computes what the unprepared module does (CPU, fp32)") {
  const std::uint64_t seed = std::random_device{}();
  MESSAGE("torch seed " << seed);
  // Every module below is made from the same seed: the same weights.
  auto make = [seed] {
    torch::manual_seed(seed);
    return conv_bn_module(torch::kCPU);
  };
  torch::jit::Module module = make();
  const at::Tensor x = torch::randn({2, 3, 12, 12});
  const std::vector<at::Tensor> reference = replay::make_tensor_function(module)({x});
  for (const replay::PrepareFlags flags :
       {replay::PrepareFlags::freeze, replay::PrepareFlags::inference,
        replay::PrepareFlags::inference | replay::PrepareFlags::channels_last}) {
    CAPTURE(replay::to_underlying(flags));
    replay::PreparedModule prepared =
        replay::prepare(make(), {.flags = flags, .device = torch::Device(torch::kCPU)});
    // Freezing inlines the parameters: the prepared module has no attributes left to read.
    CHECK_FALSE(prepared.module().hasattr("w1"));
    const replay::OutputDifference diff = replay::compare_outputs(prepared({x}), reference);
    MESSAGE("max-abs-error / max|ref| " << diff.relative());
    CHECK(diff.outputs == 1);
    CHECK(diff.relative() < 1e-4);
  }
  // Integer buffers keep their dtype under a dtype conversion.
  replay::PreparedModule as_double = replay::prepare(
      make(),
      {.flags = replay::PrepareFlags::none, .dtype = at::kDouble, .device = torch::Device(torch::kCPU)});
  CHECK((as_double.module().attr("steps").toTensor().scalar_type() == at::kLong));
  CHECK((as_double.module().attr("w1").toTensor().scalar_type() == at::kDouble));
  CHECK((as_double.prepare_input(x).scalar_type() == at::kDouble));
  CHECK((as_double.prepare_input(torch::ones({2}, at::kLong)).scalar_type() == at::kLong));
  CHECK(replay::compare_outputs(as_double({x}), reference).relative() < 1e-5);
}

TEST_CASE("prepare and compare_outputs refuse what they cannot do, with clear messages") {
  torch::jit::Module no_forward("NoForward");
  CHECK_THROWS_AS((void)replay::prepare(no_forward, {.device = torch::Device(torch::kCPU)}), replay::usage_error);
  try {
    (void)replay::load_prepared("/nonexistent/model.pt", {.device = torch::Device(torch::kCPU)});
    FAIL("expected usage_error");
  } catch (const replay::usage_error& e) {
    CHECK(contains(e.what(), "/nonexistent/model.pt"));
  }
  CHECK_THROWS_AS((void)replay::compare_outputs({torch::ones({2})}, {}), replay::usage_error);
  CHECK_THROWS_AS((void)replay::compare_outputs({torch::ones({2})}, {torch::ones({3})}), replay::usage_error);
  const replay::OutputDifference d = replay::compare_outputs({torch::full({2}, 1.5)}, {torch::full({2}, 2.0)});
  CHECK(d.max_abs_error == doctest::Approx(0.5));
  CHECK(d.relative() == doctest::Approx(0.25));
}

}  // TEST_SUITE("host")

// ---------------------------------------------------------------------------
// gpu
// ---------------------------------------------------------------------------

TEST_SUITE("gpu" * replay_test::needs_device()) {

TEST_CASE("graphed MLP outputs equal eager outputs for random batches (fp32 without TF32, fp16)") {
  no_tf32();
  fresh_seed();
  for (const torch::Dtype dtype : {torch::kFloat, torch::kHalf}) {
    CAPTURE(dtype);
    const double tolerance = tolerance_for(dtype);
    auto net = small_mlp(torch::kCUDA, dtype);
    replay::GraphedCallable graphed(net, {torch::randn({32, 64}, cuda(dtype))},
                                    {.batch_buckets = {1, 2, 4, 8, 16, 32}});
    CHECK(graphed.graph_count() == 6);
    for (const int64_t batch : {1, 2, 3, 7, 8, 13, 16, 31, 32}) {
      CAPTURE(batch);
      const at::Tensor x = torch::randn({batch, 64}, cuda(dtype));
      const replay::GraphedOutputs out = graphed(x);
      CHECK(out.graphed());
      CHECK(out.route() == replay::RouteKind::replayed);
      CHECK(out.batch() == batch);
      REQUIRE(out.size() == 1);
      REQUIRE(out[0].sizes() == at::IntArrayRef({batch, 32}));
      CHECK(max_error(out[0], reference(graphed, net, x)) < tolerance);
    }
    CHECK(graphed.stats().hits == 9);
  }
}

TEST_CASE("graphed ResNet-50 equals eager (fp32 without TF32, fp16)" * needs_full_speed()) {
  no_tf32();
  fresh_seed();
  for (const torch::Dtype dtype : {torch::kFloat, torch::kHalf}) {
    CAPTURE(dtype);
    const double tolerance = tolerance_for(dtype);
    auto model = replay_examples::resnet50(torch::kCUDA, dtype);
    replay::GraphedCallable graphed(model, {torch::randn({8, 3, 224, 224}, cuda(dtype))},
                                    {.batch_buckets = {1, 4, 8}});
    for (const int64_t batch : {1, 3, 8}) {
      CAPTURE(batch);
      const at::Tensor x = torch::randn({batch, 3, 224, 224}, cuda(dtype));
      const auto out = graphed(x);
      CHECK(out.graphed());
      const at::Tensor expected = reference(graphed, model, x);
      REQUIRE(out[0].sizes() == expected.sizes());
      CHECK(torch::isfinite(expected).all().item<bool>());
      CHECK(max_error(out[0], expected) < tolerance);
    }
  }
}

TEST_CASE("several inputs and outputs; mismatched inputs are refused with both shapes") {
  fresh_seed();
  auto fn = [](const at::Tensor& a, const at::Tensor& b) {
    return std::make_tuple(a * b, a.sum(1), b.mean());  // the last has no batch dimension
  };
  replay::GraphedCallable graphed(fn, {torch::randn({8, 16}, cuda()), torch::randn({8, 16}, cuda())},
                                  {.batch_buckets = {4, 8}});
  const at::Tensor a = torch::randn({3, 16}, cuda());
  const at::Tensor b = torch::randn({3, 16}, cuda());
  const auto out = graphed(a, b);
  REQUIRE(out.size() == 3);
  // The last output does not carry the batch: a call that would need padding
  // runs eagerly on the caller's rows (a graph would average over the padding).
  CHECK(out.padded_batch() == 3);
  CHECK(out.route() == replay::RouteKind::eager_fallback);
  CHECK(out[0].sizes() == at::IntArrayRef({3, 16}));
  CHECK(torch::allclose(out[0], a * b));
  CHECK(torch::allclose(out[1], a.sum(1)));
  CHECK(out[2].dim() == 0);
  CHECK(torch::allclose(out[2], b.mean()));
  // At a bucket size there is no padding: graphed.
  const at::Tensor a4 = torch::randn({4, 16}, cuda());
  const at::Tensor b4 = torch::randn({4, 16}, cuda());
  const auto full = graphed(a4, b4);
  CHECK(full.graphed());
  CHECK(torch::allclose(full[2], b4.mean()));

  try {
    (void)graphed(torch::randn({3, 15}, cuda()), b);
    FAIL("expected usage_error");
  } catch (const replay::usage_error& e) {
    CHECK(contains(e.what(), "[3, 15]"));
    CHECK(contains(e.what(), "[B, 16]"));
  }
  CHECK_THROWS_AS((void)graphed(a.to(torch::kDouble), b), replay::usage_error);
  CHECK_THROWS_AS((void)graphed(a, torch::randn({2, 16}, cuda())), replay::usage_error);
  // Host inputs are copied in.
  const auto from_host = graphed(a.cpu(), b.cpu());
  CHECK(torch::allclose(from_host[0], a * b));
}

TEST_CASE("fast-mode outputs are views that the next replay overwrites, and reading them after is caught") {
  fresh_seed();
  auto net = small_mlp(torch::kCUDA, torch::kFloat);
  replay::GraphedCallable graphed(net, {torch::randn({8, 64}, cuda())},
                                  {.flags = replay::GraphedFlags::view_outputs, .batch_buckets = {4, 8}});
  const at::Tensor x1 = torch::randn({8, 64}, cuda());
  const at::Tensor x2 = torch::randn({8, 64}, cuda());
  replay::GraphedOutputs first = graphed(x1);
  CHECK(first.is_view());
  CHECK_FALSE(first.stale());
  const at::Tensor kept = first.clone()[0];
  const at::Tensor raw_first = first.tensors()[0];  // unchecked from here on: the hazard itself
  replay::GraphedOutputs second = graphed(x2);
  CHECK(first.stale());
  CHECK_THROWS_AS((void)first[0], replay::stale_output_error);
  CHECK_THROWS_AS((void)first.tensors(), replay::stale_output_error);
  CHECK_THROWS_AS((void)first.clone(), replay::stale_output_error);
  CHECK_FALSE(second.stale());
  // The hazard is real: the view now holds the second call's result.
  CHECK(raw_first.equal(second[0]));
  CHECK_FALSE(raw_first.equal(kept));
  CHECK(max_error(kept, reference(graphed, net, x1)) < kFp32Tolerance);
  // A replay of another bucket (same pool) makes views stale too.
  const replay::GraphedOutputs third = graphed(torch::randn({3, 64}, cuda()));
  CHECK(third.padded_batch() == 4);
  CHECK(second.stale());
  // release() checks once and hands the tensors over.
  std::vector<at::Tensor> taken = graphed(x1).release();
  CHECK(taken.size() == 1);
}

TEST_CASE("safe-mode outputs are copies that later replays leave alone") {
  fresh_seed();
  auto net = small_mlp(torch::kCUDA, torch::kFloat);
  replay::GraphedCallable graphed(net, {torch::randn({8, 64}, cuda())});
  const auto first = graphed(torch::randn({8, 64}, cuda()));
  const at::Tensor copy = first[0].clone();
  for (int i = 0; i < 3; ++i) {
    (void)graphed(torch::randn({8, 64}, cuda()));
  }
  CHECK_FALSE(first.is_view());
  CHECK_FALSE(first.stale());
  CHECK(first[0].equal(copy));
  CHECK(first[0].is_inference());
}

TEST_CASE("graphs of all buckets share one pool: {1..32} cost at most 1.3x batch 32 alone" * needs_full_speed()) {
  fresh_seed();
  auto model = replay_examples::resnet50(torch::kCUDA, torch::kHalf);
  const at::Tensor example = torch::randn({32, 3, 224, 224}, cuda(torch::kHalf));
  const c10::DeviceIndex device = example.device().index();

  std::size_t alone = 0;
  c10::MempoolId_t alone_pool{};
  {
    replay::GraphedCallable one(model, {example}, {.batch_buckets = {32}});
    alone = one.pool_reserved_bytes();
    alone_pool = one.pool();
    CHECK(alone == pool_bytes(one.pool()));
    // One pool reference per live graph, plus the one the GraphedCallable holds.
    CHECK(c10::cuda::CUDACachingAllocator::getPoolUseCount(device, one.pool()) == 2);
  }
  // The pool is handed back when the graphs go away.
  CHECK(pool_bytes(alone_pool) == 0);

  replay::GraphedCallable all(model, {example}, {.batch_buckets = {1, 2, 4, 8, 16, 32}});
  REQUIRE(all.graph_count() == 6);
  CHECK(c10::cuda::CUDACachingAllocator::getPoolUseCount(device, all.pool()) == 7);
  const std::size_t shared = all.pool_reserved_bytes();
  MESSAGE("pool bytes: batch 32 alone " << alone << ", buckets {1..32} shared " << shared << " (ratio "
                                        << static_cast<double>(shared) / static_cast<double>(alone) << ")");
  REQUIRE(alone > 0);
  CHECK(static_cast<double>(shared) <= 1.3 * static_cast<double>(alone));
  CHECK(shared >= alone / 2);
}

TEST_CASE("a bucket whose capture fails runs eagerly, is reported once, and the rest keeps serving") {
  fresh_seed();
  const at::Tensor w = torch::randn({16, 8}, cuda());
  auto fn = [w](const at::Tensor& x) {
    at::Tensor y = at::matmul(x, w);
    if (x.size(0) == 4) {
      // A data-dependent decision: .item() synchronizes, which no capture allows.
      const float peak = y.abs().max().item<float>();
      y = y + (peak > 1e30F ? 1.0 : 0.0);
    }
    return y;
  };
  std::vector<std::pair<int64_t, std::string>> failures;
  replay::GraphedCallable graphed(fn, {torch::randn({8, 16}, cuda())},
                                  {.batch_buckets = {1, 2, 4, 8},
                                   .on_capture_failure = [&](const int64_t& batch, std::string_view reason) {
                                     failures.emplace_back(batch, std::string(reason));
                                   }});
  REQUIRE(failures.size() == 1);
  CHECK(failures[0].first == 4);
  CHECK(contains(failures[0].second, "captur"));
  CHECK(graphed.graph_count() == 3);
  CHECK(graphed.is_eager(3));
  CHECK(graphed.is_graphed(8));
  CHECK(graphed.stats().capture_failures == 1);
  // One pool reference per live graph plus the GraphedCallable's own: the
  // failed capture gave its reference back.
  CHECK(c10::cuda::CUDACachingAllocator::getPoolUseCount(w.device().index(), graphed.pool()) == 4);

  for (int round = 0; round < 3; ++round) {
    for (const int64_t batch : {1, 2, 3, 4, 5, 8}) {
      CAPTURE(batch);
      const at::Tensor x = torch::randn({batch, 16}, cuda());
      const auto out = graphed(x);
      CHECK(out.route() == (batch == 3 || batch == 4 ? replay::RouteKind::eager_fallback : replay::RouteKind::replayed));
      CHECK(max_error(out[0], at::matmul(x, w)) < 1e-4);
    }
  }
  CHECK(failures.size() == 1);  // reported once

  // Under no_fallback the same failure is an exception from the constructor,
  // and the allocator is left fit for the next capture.
  auto strict = [&] {
    return replay::GraphedCallable(fn, {torch::randn({4, 16}, cuda())}, {.flags = replay::GraphedFlags::no_fallback});
  };
  CHECK_THROWS_AS((void)strict(), replay::capture_failed_error);
  replay::GraphedCallable after(fn, {torch::randn({8, 16}, cuda())}, {.batch_buckets = {2, 8}});
  CHECK(after.graph_count() == 2);
  const at::Tensor x = torch::randn({8, 16}, cuda());
  CHECK(max_error(after(x)[0], at::matmul(x, w)) < 1e-4);
}

TEST_CASE("graphs evicted down to none: the pool stays usable and later captures succeed") {
  fresh_seed();
  auto net = small_mlp(torch::kCUDA, torch::kFloat);
  replay::GraphedCallable graphed(net, {torch::randn({8, 64}, cuda())},
                                  {.batch_buckets = {2, 8}, .warmup_runs = 1, .max_graphs = 1});
  CHECK(graphed.graph_count() == 1);
  std::vector<std::string> kinds;
  for (const int64_t batch : {2, 2, 8, 2, 8, 8}) {
    const at::Tensor x = torch::randn({batch, 64}, cuda());
    const auto out = graphed(x);
    kinds.emplace_back(replay::to_string(out.route()));
    CHECK(max_error(out[0], reference(graphed, net, x)) < kFp32Tolerance);
  }
  const std::vector<std::string> expected{"warmup", "captured", "captured", "captured", "captured", "replayed"};
  CHECK(kinds == expected);
  CHECK(graphed.stats().capture_failures == 0);
  CHECK(graphed.stats().evictions == 4);
  CHECK(graphed.graph_count() == 1);
  CHECK(c10::cuda::CUDACachingAllocator::getPoolUseCount(graphed.device().index(), graphed.pool()) == 2);
}

TEST_CASE("random numbers drawn inside the graph from the callable's own generator are fresh on every replay") {
  fresh_seed();
  const at::Generator gen = at::cuda::detail::createCUDAGenerator(0);
  auto fn = [gen](const at::Tensor& x) { return x + at::rand(x.sizes(), gen, x.options()); };
  replay::GraphedCallable graphed(fn, {torch::zeros({4, 1024}, cuda())}, {.generators = {gen}});
  const at::Tensor x = torch::zeros({4, 1024}, cuda());
  const auto a = graphed(x);
  const auto b = graphed(x);
  CHECK(a.graphed());
  CHECK(b.graphed());
  CHECK_FALSE(a[0].equal(b[0]));
  CHECK(a[0].min().item<float>() >= 0.0F);
  CHECK(a[0].max().item<float>() < 1.0F);
  CHECK(std::abs(b[0].mean().item<double>() - 0.5) < 0.05);
}

TEST_CASE("the default generator stays out of capture mode unless asked: a clear message, eager, still random") {
  fresh_seed();
  auto fn = [](const at::Tensor& x) { return x + at::rand_like(x); };
  std::string reason;
  replay::GraphedCallable plain(fn, {torch::zeros({4, 256}, cuda())},
                                {.on_capture_failure = [&](const int64_t&, std::string_view why) { reason = why; }});
  CHECK(contains(reason, "default CUDA generator"));
  CHECK(contains(reason, "GraphedOptions::generators"));
  const at::Tensor x = torch::zeros({4, 256}, cuda());
  const auto a = plain(x);
  const auto b = plain(x);
  CHECK_FALSE(a.graphed());
  CHECK_FALSE(a[0].equal(b[0]));
  // Asked for: graphed, as torch.cuda.graph does.
  replay::GraphedCallable opted(fn, {torch::zeros({4, 256}, cuda())},
                                {.flags = replay::GraphedFlags::capture_default_generator});
  const auto c = opted(x);
  const auto d = opted(x);
  CHECK(c.graphed());
  CHECK_FALSE(c[0].equal(d[0]));
}

TEST_CASE("lazy capture: warm-ups, then a capture on first sight, then replays") {
  fresh_seed();
  auto net = small_mlp(torch::kCUDA, torch::kFloat);
  replay::GraphedCallable graphed(net, {torch::randn({8, 64}, cuda())},
                                  {.flags = replay::GraphedFlags::lazy_capture, .batch_buckets = {2, 8},
                                   .warmup_runs = 2});
  CHECK(graphed.graph_count() == 0);
  std::vector<std::string> kinds;
  for (int i = 0; i < 4; ++i) {
    const at::Tensor x = torch::randn({5, 64}, cuda());
    const auto out = graphed(x);
    kinds.emplace_back(replay::to_string(out.route()));
    CHECK(max_error(out[0], reference(graphed, net, x)) < kFp32Tolerance);
  }
  const std::vector<std::string> expected_kinds{"warmup", "warmup", "captured", "replayed"};
  CHECK(kinds == expected_kinds);
  CHECK(graphed.graph_count() == 1);
  CHECK(graphed.capture_all() == 2);
}

TEST_CASE("lazy capture under no_fallback fails loudly every time, not just the first") {
  fresh_seed();
  const at::Tensor w = torch::randn({16, 8}, cuda());
  auto fn = [w](const at::Tensor& x) {
    at::Tensor y = at::matmul(x, w);
    if (x.size(0) == 4) {
      const float peak = y.abs().max().item<float>();  // synchronizes: not capturable
      y = y + (peak > 1e30F ? 1.0 : 0.0);
    }
    return y;
  };
  replay::GraphedCallable graphed(fn, {torch::randn({8, 16}, cuda())},
                                  {.flags = replay::GraphedFlags::lazy_capture | replay::GraphedFlags::no_fallback,
                                   .batch_buckets = {4, 8}, .warmup_runs = 1});
  const at::Tensor x = torch::randn({3, 16}, cuda());
  CHECK(graphed(x).route() == replay::RouteKind::warmup);
  CHECK_THROWS_AS((void)graphed(x), replay::capture_failed_error);
  CHECK_THROWS_AS((void)graphed(x), replay::capture_failed_error);  // still refused, not silently eager
  const at::Tensor y = torch::randn({8, 16}, cuda());
  CHECK(graphed(y).route() == replay::RouteKind::warmup);
  const auto out = graphed(y);
  CHECK(out.route() == replay::RouteKind::captured);
  CHECK(max_error(out[0], at::matmul(y, w)) < 1e-4);
}

TEST_CASE("a callable that calls back into its own GraphedCallable is refused, not deadlocked") {
  fresh_seed();
  const at::Tensor w = torch::randn({16, 8}, cuda());
  replay::GraphedCallable* self = nullptr;
  bool reenter = false;
  auto fn = [w, &self, &reenter](const at::Tensor& x) {
    if (reenter && self != nullptr) {
      (void)self->run({x});
    }
    return at::matmul(x, w);
  };
  replay::GraphedCallable graphed(fn, {torch::randn({8, 16}, cuda())},
                                  {.flags = replay::GraphedFlags::lazy_capture, .batch_buckets = {8}, .warmup_runs = 1});
  self = &graphed;
  reenter = true;
  const at::Tensor x = torch::randn({8, 16}, cuda());
  CHECK_THROWS_WITH_AS((void)graphed(x), doctest::Contains("inside the same GraphedCallable"), replay::usage_error);
  reenter = false;
  const auto out = graphed(x);  // the object is still usable
  CHECK(max_error(out[0], at::matmul(x, w)) < 1e-4);
}

TEST_CASE("a batch above the largest bucket runs eagerly, or is refused when asked") {
  fresh_seed();
  auto net = small_mlp(torch::kCUDA, torch::kFloat);
  replay::GraphedCallable eager(net, {torch::randn({8, 64}, cuda())});
  const at::Tensor x = torch::randn({20, 64}, cuda());
  const auto out = eager(x);
  CHECK(out.route() == replay::RouteKind::eager_oversize);
  CHECK(out[0].sizes() == at::IntArrayRef({20, 32}));
  CHECK(max_error(out[0], reference(eager, net, x)) < kFp32Tolerance);

  replay::GraphedCallable strict(net, {torch::randn({8, 64}, cuda())}, {.oversize = replay::OversizePolicy::throw_error});
  CHECK_THROWS_AS((void)strict(x), replay::usage_error);
}

TEST_CASE("inference mode by default; normal tensors under no_grad") {
  auto net = small_mlp(torch::kCUDA, torch::kFloat);
  replay::GraphedCallable inference(net, {torch::randn({4, 64}, cuda())});
  CHECK(inference(torch::randn({4, 64}, cuda()))[0].is_inference());
  replay::GraphedCallable no_grad(net, {torch::randn({4, 64}, cuda())}, {.flags = replay::GraphedFlags::no_grad});
  const at::Tensor y = no_grad(torch::randn({4, 64}, cuda()))[0];
  CHECK_FALSE(y.is_inference());
  CHECK_FALSE(y.requires_grad());
  // Constructed inside InferenceMode, used outside: still fine.
  std::unique_ptr<replay::GraphedCallable> made_inside;
  {
    c10::InferenceMode guard;
    made_inside = std::make_unique<replay::GraphedCallable>(net, std::vector<at::Tensor>{torch::randn({4, 64}, cuda())});
  }
  const at::Tensor x = torch::randn({4, 64}, cuda());
  CHECK(max_error((*made_inside)(x)[0], reference(*made_inside, net, x)) < kFp32Tolerance);
}

TEST_CASE("calls alternating between two streams are ordered on the device") {
  fresh_seed();
  auto net = small_mlp(torch::kCUDA, torch::kFloat);
  replay::GraphedCallable graphed(net, {torch::randn({16, 64}, cuda())}, {.batch_buckets = {16}});
  const c10::cuda::CUDAStream s1 = c10::cuda::getStreamFromPool();
  const c10::cuda::CUDAStream s2 = c10::cuda::getStreamFromPool();
  std::vector<at::Tensor> inputs;
  std::vector<at::Tensor> results;
  for (int i = 0; i < 20; ++i) {
    const c10::cuda::CUDAStream& s = i % 2 == 0 ? s1 : s2;
    c10::cuda::CUDAStreamGuard guard(s);
    inputs.push_back(torch::randn({16, 64}, cuda()));
    results.push_back(graphed(inputs.back())[0]);
  }
  torch::cuda::synchronize();
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    CAPTURE(i);
    CHECK(max_error(results[i], reference(graphed, net, inputs[i])) < kFp32Tolerance);
  }
}

TEST_CASE("a TorchScript module is graphed like any other callable") {
  fresh_seed();
  torch::jit::Module module("Affine");
  module.register_parameter("w", torch::randn({64, 48}, cuda()), false);
  module.define(R"(
def forward(self, x):
    return torch.relu(x @ self.w) * 0.5
)");
  // Under InferenceMode (the default) and under NoGradGuard (TorchScript's classic setting).
  for (const replay::GraphedFlags flags : {replay::GraphedFlags::none, replay::GraphedFlags::no_grad}) {
    CAPTURE(replay::to_underlying(flags));
    replay::GraphedCallable graphed(module, {torch::randn({8, 64}, cuda())},
                                    {.flags = flags, .batch_buckets = {2, 8}});
    CHECK(graphed.graph_count() == 2);
    for (const int64_t batch : {1, 2, 6, 8}) {
      const at::Tensor x = torch::randn({batch, 64}, cuda());
      const auto out = graphed(x);
      CHECK(out.graphed());
      CHECK(max_error(out[0], reference(graphed, module, x)) < kFp32Tolerance);
    }
  }
}

TEST_CASE("prepared TorchScript (fp16, channels-last, frozen, optimized) graphed equals the unprepared module") {
  const std::uint64_t seed = std::random_device{}();
  MESSAGE("torch seed " << seed);
  const std::vector<std::int64_t> buckets{2, 8};
  const at::Tensor example = torch::randn({8, 3, 16, 16}, cuda());
  for (const bool channels_last : {false, true}) {
    CAPTURE(channels_last);
    replay::PrepareFlags flags = replay::PrepareFlags::inference;
    if (channels_last) {
      flags = flags | replay::PrepareFlags::channels_last;
    }
    torch::manual_seed(seed);
    torch::jit::Module original = conv_bn_module(torch::kCUDA);
    torch::manual_seed(seed);  // the same weights, in a module of its own
    replay::PreparedModule prepared = replay::prepare(conv_bn_module(torch::kCUDA), {.flags = flags, .dtype = at::kHalf});
    const at::Tensor static_example = prepared.prepare_input(example);
    CHECK((static_example.scalar_type() == at::kHalf));
    CHECK(static_example.is_contiguous(at::MemoryFormat::ChannelsLast) == channels_last);
    replay::GraphedCallable graphed(prepared, {static_example},
                                    {.flags = replay::GraphedFlags::no_grad, .batch_buckets = buckets});
    CHECK(graphed.graph_count() == 2);
    auto unprepared = replay::make_tensor_function(original);
    for (const std::int64_t batch : {1, 2, 5, 8}) {
      const at::Tensor x = torch::randn({batch, 3, 16, 16}, cuda());
      torch::NoGradGuard no_grad;
      const std::vector<at::Tensor> reference = unprepared({x});  // fp32, NCHW, not frozen
      const auto out = graphed(prepared.prepare_input(x));
      CHECK(out.graphed());
      const replay::OutputDifference diff = replay::compare_outputs({out[0].to(at::kFloat)}, reference);
      MESSAGE("batch " << batch << ": max-abs-error / max|ref| " << diff.relative());
      CHECK(diff.relative() < 1e-2);
      // The same graph, eager: within fp16 rounding of the graphed result.
      CHECK(replay::compare_outputs({out[0]}, graphed.run_eager({prepared.prepare_input(x)})).relative() < 1e-2);
    }
    // A caller's NCHW fp32 tensor is converted inside the prepared module when run eagerly.
    CHECK(replay::compare_outputs({prepared({example})[0].to(at::kFloat)}, unprepared({example})).relative() < 1e-2);
  }
}

TEST_CASE("padding is zeroed whenever an earlier call left data in the padding rows, and only then") {
  fresh_seed();
  // A whole-batch reduction sees the padding rows: it equals the caller's sum
  // only while they are zero.
  auto total = [](const at::Tensor& x) { return x.sum(0, /*keepdim=*/true).expand({x.size(0), x.size(1)}); };
  replay::GraphedCallable graphed(total, {torch::randn({8, 16}, cuda())}, {.batch_buckets = {4, 8}});
  for (const std::int64_t batch : {3, 3, 8, 1, 1, 4, 2, 7, 5, 8, 3}) {
    CAPTURE(batch);
    const at::Tensor x = torch::randn({batch, 16}, cuda());
    const auto out = graphed(x);
    REQUIRE(out.graphed());
    CHECK(torch::allclose(out[0][0], x.sum(0), 1e-4, 1e-4));
  }
  // Under keep_padding the rows are left alone: an earlier batch's rows show through.
  replay::GraphedCallable kept(total, {torch::randn({8, 16}, cuda())},
                               {.flags = replay::GraphedFlags::keep_padding, .batch_buckets = {8}});
  const at::Tensor big = torch::randn({8, 16}, cuda());
  (void)kept(big);
  const at::Tensor small = torch::randn({2, 16}, cuda());
  CHECK(torch::allclose(kept(small)[0][0], small.sum(0) + big.narrow(0, 2, 6).sum(0), 1e-4, 1e-4));
}

TEST_CASE("fast-mode views are made once per batch and stay right across buckets, evictions and re-captures") {
  fresh_seed();
  auto net = small_mlp(torch::kCUDA, torch::kFloat);
  replay::GraphedCallable graphed(net, {torch::randn({8, 64}, cuda())},
                                  {.flags = replay::GraphedFlags::view_outputs, .batch_buckets = {4, 8}});
  const at::Tensor x3 = torch::randn({3, 64}, cuda());
  const at::Tensor x8 = torch::randn({8, 64}, cuda());
  const at::Tensor first = graphed(x3).tensors()[0];
  const at::Tensor again = graphed(x3).tensors()[0];
  CHECK(first.is_same(again));  // the cached view, not a new one
  CHECK(again.sizes() == at::IntArrayRef({3, 32}));
  CHECK(max_error(graphed(x3)[0], graphed.run_eager({x3})[0]) < kFp32Tolerance);
  CHECK(max_error(graphed(x8)[0], graphed.run_eager({x8})[0]) < kFp32Tolerance);
  // A caller that reshapes a view in place does not get the changed view back.
  at::Tensor reshaped = graphed(x3).tensors()[0];
  {
    c10::InferenceMode inference;  // the views are inference tensors
    reshaped.unsqueeze_(0);
  }
  const auto fresh = graphed(x3);
  CHECK(fresh[0].sizes() == at::IntArrayRef({3, 32}));
  CHECK(max_error(fresh[0], graphed.run_eager({x3})[0]) < kFp32Tolerance);

  // One graph at a time: every switch of bucket evicts and re-captures.
  replay::GraphedCallable one(net, {torch::randn({8, 64}, cuda())},
                              {.flags = replay::GraphedFlags::view_outputs, .batch_buckets = {4, 8},
                               .warmup_runs = 1, .max_graphs = 1});
  for (const std::int64_t batch : {3, 8, 3, 3, 8, 2, 8}) {
    CAPTURE(batch);
    const at::Tensor x = torch::randn({batch, 64}, cuda());
    const auto out = one(x);
    CHECK(out[0].size(0) == batch);
    CHECK(max_error(out[0], one.run_eager({x})[0]) < kFp32Tolerance);
  }
}

TEST_CASE("a channels-last example gives a channels-last static input, copied into with one memcpy") {
  fresh_seed();
  auto layouts = std::make_shared<std::vector<bool>>();  // what the callable saw, warm-ups and captures
  auto fn = [layouts](const at::Tensor& x) {
    layouts->push_back(x.is_contiguous(at::MemoryFormat::ChannelsLast));
    return x * 2;
  };
  const at::Tensor example = torch::randn({4, 3, 8, 8}, cuda()).contiguous(at::MemoryFormat::ChannelsLast);
  replay::GraphedCallable graphed(fn, {example}, {.batch_buckets = {2, 4}});
  REQUIRE_FALSE(layouts->empty());
  CHECK(std::all_of(layouts->begin(), layouts->end(), [](bool channels_last) { return channels_last; }));
  for (const std::int64_t batch : {1, 2, 3, 4}) {
    const at::Tensor nhwc = torch::randn({batch, 3, 8, 8}, cuda()).contiguous(at::MemoryFormat::ChannelsLast);
    const auto out = graphed(nhwc);
    CHECK(out.graphed());
    CHECK(torch::equal(out[0], nhwc * 2));
    const at::Tensor nchw = torch::randn({batch, 3, 8, 8}, cuda());  // converted by copy_
    CHECK(torch::equal(graphed(nchw)[0], nchw * 2));
  }
}

TEST_CASE("10k replays: no growth in allocated or reserved memory, results stay right") {
  fresh_seed();
  const int replays = under_sanitizer() ? 200 : 10000;
  auto net = small_mlp(torch::kCUDA, torch::kFloat);
  replay::GraphedCallable graphed(net, {torch::randn({32, 64}, cuda())}, {.batch_buckets = {8, 16, 32}});
  std::vector<at::Tensor> inputs;
  std::vector<at::Tensor> expected;
  for (const int64_t batch : {5, 8, 16, 29, 32}) {
    inputs.push_back(torch::randn({batch, 64}, cuda()));
    expected.push_back(reference(graphed, net, inputs.back()));
  }
  for (int i = 0; i < 50; ++i) {  // steady state
    (void)graphed(inputs[static_cast<std::size_t>(i) % inputs.size()]);
  }
  torch::cuda::synchronize();
  const c10::DeviceIndex device = inputs[0].device().index();
  const auto before = c10::cuda::CUDACachingAllocator::getDeviceStats(device);
  std::size_t free_before = 0;
  std::size_t total = 0;
  REQUIRE(cudaMemGetInfo(&free_before, &total) == cudaSuccess);
  int wrong = 0;
  for (int i = 0; i < replays; ++i) {
    const std::size_t k = static_cast<std::size_t>(i) % inputs.size();
    const auto out = graphed(inputs[k]);
    if (i % 997 == 0 && max_error(out[0], expected[k]) >= kFp32Tolerance) {
      ++wrong;
    }
  }
  torch::cuda::synchronize();
  const auto after = c10::cuda::CUDACachingAllocator::getDeviceStats(device);
  std::size_t free_after = 0;
  REQUIRE(cudaMemGetInfo(&free_after, &total) == cudaSuccess);
  constexpr auto aggregate = static_cast<std::size_t>(c10::CachingAllocator::StatType::AGGREGATE);
  CHECK(wrong == 0);
  CHECK(after.allocated_bytes[aggregate].current == before.allocated_bytes[aggregate].current);
  CHECK(after.reserved_bytes[aggregate].current == before.reserved_bytes[aggregate].current);
  CHECK(free_after == free_before);
  CHECK(graphed.stats().hits >= static_cast<std::uint64_t>(replays));
}

TEST_CASE("a moved-from GraphedCallable refuses to run") {
  auto net = small_mlp(torch::kCUDA, torch::kFloat);
  replay::GraphedCallable a(net, {torch::randn({4, 64}, cuda())});
  replay::GraphedCallable b = std::move(a);
  const at::Tensor x = torch::randn({4, 64}, cuda());
  CHECK(max_error(b(x)[0], reference(b, net, x)) < kFp32Tolerance);
  CHECK_THROWS_AS((void)a(x), replay::usage_error);  // NOLINT(bugprone-use-after-move): the point of the test
}

// ---- threads and streams ----------------------------------------------------

TEST_CASE("outputs that do not carry the batch in dimension 0 are detected: padded calls run eagerly") {
  // Old code: (x + 1).sum(0) at batch 5 in bucket 8 came back 3 too high per
  // column; a flattened output held the padded rows; a fixed first dimension
  // equal to the bucket was cut.
  fresh_seed();
  const at::Tensor fixed = torch::randn({8, 4}, cuda());
  auto fn = [fixed](const at::Tensor& x) { return std::make_tuple((x + 1).sum(0), x.reshape({-1}), fixed * 2); };
  replay::GraphedCallable graphed(fn, {torch::randn({8, 4}, cuda())}, {.batch_buckets = {4, 8}});
  const at::Tensor x = torch::randn({5, 4}, cuda());
  const auto out = graphed(x);
  CHECK(out.route() == replay::RouteKind::eager_fallback);
  CHECK(torch::allclose(out[0], (x + 1).sum(0)));
  CHECK(out[1].numel() == 20);
  CHECK(torch::allclose(out[1], x.reshape({-1})));
  CHECK(out[2].sizes() == at::IntArrayRef({8, 4}));
  CHECK(torch::allclose(out[2], fixed * 2));
  const at::Tensor x8 = torch::randn({8, 4}, cuda());
  const auto at_bucket = graphed(x8);
  CHECK(at_bucket.graphed());
  CHECK(torch::allclose(at_bucket[0], (x8 + 1).sum(0)));
}

TEST_CASE("fast mode refuses a call on a second stream instead of overwriting views still read on the first") {
  // Old code: the call on S2 waited only for the replay, not for S1's reads.
  auto net = small_mlp(torch::kCUDA, torch::kFloat);
  replay::GraphedCallable graphed(net, {torch::randn({8, 64}, cuda())},
                                  {.flags = replay::GraphedFlags::view_outputs, .batch_buckets = {8}});
  const c10::cuda::CUDAStream s1 = c10::cuda::getStreamFromPool();
  const c10::cuda::CUDAStream s2 = c10::cuda::getStreamFromPool();
  {
    c10::cuda::CUDAStreamGuard guard(s1);
    (void)graphed(torch::randn({8, 64}, cuda()));
  }
  c10::cuda::CUDAStreamGuard guard(s2);
  CHECK_THROWS_WITH_AS((void)graphed(torch::randn({8, 64}, cuda())), doctest::Contains("another stream"),
                       replay::usage_error);
}

TEST_CASE("eager random numbers in another thread keep working while a GraphedCallable captures") {
  // Old code: the default generator was in capture mode for the whole
  // capture; torch::rand in another thread threw "Offset increment outside
  // graph capture encountered unexpectedly".
  no_tf32();
  auto net = small_mlp(torch::kCUDA, torch::kFloat);
  std::atomic<bool> stop{false};
  std::atomic<int> thrown{0};
  std::atomic<int> drawn{0};
  std::thread other([&] {
    const c10::cuda::CUDAStream own = c10::cuda::getStreamFromPool();
    c10::cuda::CUDAStreamGuard guard(own);
    while (!stop.load()) {
      try {
        (void)torch::rand({1024}, cuda()).sum().item<float>();
        ++drawn;
      } catch (...) {
        ++thrown;
      }
    }
  });
  const int rounds = under_sanitizer() ? 1 : 4;
  for (int r = 0; r < rounds; ++r) {
    replay::GraphedCallable graphed(net, {torch::randn({16, 64}, cuda())}, {.batch_buckets = {1, 2, 4, 8, 16}});
    CHECK(graphed.graph_count() == 5);
  }
  stop = true;
  other.join();
  MESSAGE(drawn.load() << " eager draws in the other thread");
  CHECK(thrown == 0);
}

TEST_CASE("stress: 8 threads on their own streams share two GraphedCallables under lazy capture and interference") {
  // Old code: the adapter's cudaDeviceSynchronize before each capture broke
  // the other callable's captures (0 of 4 buckets graphed), eager rand in the
  // background thread threw, and the broken buckets stayed eager for good.
  no_tf32();
  fresh_seed();
  constexpr int kThreads = 8;
  const int iterations = under_sanitizer() ? 3 : 60;
  const std::vector<int64_t> buckets{4, 8, 16, 32};
  auto net_a = small_mlp(torch::kCUDA, torch::kFloat);
  auto net_b = small_mlp(torch::kCUDA, torch::kFloat);
  std::vector<std::string> failures;
  std::mutex failures_mutex;
  auto options = [&] {
    return replay::GraphedOptions{.flags = replay::GraphedFlags::lazy_capture,
                                  .batch_buckets = buckets,
                                  .warmup_runs = 1,
                                  .on_capture_failure = [&](const int64_t& b, std::string_view why) {
                                    const std::lock_guard<std::mutex> lock(failures_mutex);
                                    failures.push_back(std::to_string(b) + ": " + std::string(why));
                                  }};
  };
  replay::GraphedCallable a(net_a, {torch::randn({32, 64}, cuda())}, options());
  replay::GraphedCallable b(net_b, {torch::randn({32, 64}, cuda())}, options());
  std::atomic<bool> stop{false};
  std::atomic<int> background_errors{0};
  std::thread background([&] {
    const c10::cuda::CUDAStream own = c10::cuda::getStreamFromPool();
    c10::cuda::CUDAStreamGuard guard(own);
    while (!stop.load()) {
      try {
        replay::synchronize_device();
        (void)torch::rand({4096}, cuda()).sum().item<float>();
        const at::Tensor scratch = torch::empty({1 << 18}, cuda());
        (void)scratch.fill_(1.0F);
      } catch (...) {
        ++background_errors;
      }
    }
    torch::cuda::synchronize();
  });
  std::vector<int> wrong(kThreads, 0);
  std::vector<int> errors(kThreads, 0);
  std::vector<std::future<void>> workers;
  for (int t = 0; t < kThreads; ++t) {
    workers.push_back(std::async(std::launch::async, [&, t] {
      try {
        const c10::cuda::CUDAStream stream = c10::cuda::getStreamFromPool();
        c10::cuda::CUDAStreamGuard guard(stream);
        c10::InferenceMode inference;
        std::mt19937 rng{replay_test::case_seed_for(static_cast<std::uint64_t>(t) + 1)};
        std::uniform_int_distribution<int64_t> size(1, 32);
        for (int it = 0; it < iterations; ++it) {
          const bool use_a = (rng() & 1U) != 0U;
          const at::Tensor x = torch::randn({size(rng), 64}, cuda());
          const at::Tensor got = (use_a ? a : b)(x)[0];
          const at::Tensor want = (use_a ? net_a : net_b)->forward(x);
          if (max_error(got, want) >= 1e-4) {
            ++wrong[static_cast<std::size_t>(t)];
          }
        }
      } catch (...) {
        ++errors[static_cast<std::size_t>(t)];
      }
    }));
  }
  bool finished = true;
  for (auto& w : workers) {
    finished = finished && w.wait_for(std::chrono::seconds(300)) == std::future_status::ready;
  }
  stop = true;
  background.join();
  REQUIRE(finished);  // nothing hung
  CHECK(background_errors == 0);
  for (int t = 0; t < kThreads; ++t) {
    CHECK(wrong[static_cast<std::size_t>(t)] == 0);
    CHECK(errors[static_cast<std::size_t>(t)] == 0);
  }
  for (const std::string& f : failures) {
    MESSAGE("capture failure: " << f);
  }
  CHECK(failures.empty());
  // Every bucket ends graphed: whatever was interrupted was captured later.
  for (replay::GraphedCallable* g : {&a, &b}) {
    (void)g->capture_all();
    for (const int64_t bucket : buckets) {
      CHECK(g->is_graphed(bucket));
      CHECK_FALSE(g->is_eager(bucket));
    }
  }
}

TEST_CASE("construction reports capture progress: done, total and the bucket, largest first") {
  auto net = small_mlp(torch::kCUDA, torch::kFloat);
  std::vector<std::tuple<std::size_t, std::size_t, int64_t>> seen;
  replay::GraphedCallable graphed(net, {torch::randn({8, 64}, cuda())},
                                  {.batch_buckets = {2, 4, 8},
                                   .on_capture_progress = [&](std::size_t done, std::size_t total, const int64_t& b) {
                                     seen.emplace_back(done, total, b);
                                   }});
  const bool in_order = seen == std::vector<std::tuple<std::size_t, std::size_t, int64_t>>{{1, 3, 8}, {2, 3, 4}, {3, 3, 2}};
  CHECK(in_order);
  CHECK(graphed.graph_count() == 3);
}

TEST_CASE("two GraphedCallables constructed and called from two threads at once end with every bucket graphed") {
  // Old code: each capture synchronized the device first, breaking the other
  // thread's capture; one callable ended with 0 of 4 buckets graphed.
  no_tf32();
  const std::vector<int64_t> buckets{4, 8, 16, 32};
  std::vector<std::size_t> graphs(2, 0);
  std::vector<int> wrong(2, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 2; ++t) {
    threads.emplace_back([&, t] {
      const c10::cuda::CUDAStream stream = c10::cuda::getStreamFromPool();
      c10::cuda::CUDAStreamGuard guard(stream);
      auto net = small_mlp(torch::kCUDA, torch::kFloat);
      replay::GraphedCallable graphed(net, {torch::randn({32, 64}, cuda())}, {.batch_buckets = buckets});
      for (int i = 0; i < 20; ++i) {
        const at::Tensor x = torch::randn({1 + (i * 7) % 32, 64}, cuda());
        if (max_error(graphed(x)[0], net->forward(x)) >= 1e-4) {
          ++wrong[static_cast<std::size_t>(t)];
        }
      }
      graphs[static_cast<std::size_t>(t)] = graphed.graph_count();
    });
  }
  for (auto& th : threads) {
    th.join();
  }
  for (int t = 0; t < 2; ++t) {
    CHECK(graphs[static_cast<std::size_t>(t)] == buckets.size());
    CHECK(wrong[static_cast<std::size_t>(t)] == 0);
  }
}

}  // TEST_SUITE("gpu")
