// TorchGraphBackend with a graph wrapper: a captured torch step placed in a
// WHILE node of a graph built with GraphBuilder (torch_loop_graph.cu), so
// that one launch runs the step several times and stops on a flag the step
// computes. Checked against the step run eagerly; the wrapper's failures,
// the refusal of random numbers, recapture and the graph's memory. Part of
// test_torch (tests/torch_loop.cmake).
//
// libtorch first: c10's logging header defines a glog-style CHECK macro,
// which is dropped here so that doctest's CHECK is the one in force.
#include <torch/torch.h>

#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "replay/shape_router.hpp"
#include "replay/torch.hpp"

#undef CHECK
#include <doctest/doctest.h>

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "gpu_suite.hpp"
#include "torch_loop_graph.hpp"

namespace {

using Router = replay::ShapeRouter<std::int64_t, replay::TorchGraphBackend>;

bool contains(std::string_view text, std::string_view part) { return text.find(part) != std::string_view::npos; }

// The step a decode loop would run, shrunk: x += 1, counter += 1, and the
// flag keep_going = counter < limit, computed on the device by torch.
struct Step {
  at::Tensor x;           // float [4]
  at::Tensor counter;     // int64 [1]
  at::Tensor limit;       // int64 [1]
  at::Tensor keep_going;  // bool [1]

  Step(const at::Tensor& start, std::int64_t limit_value)
      : x(start.clone()),
        counter(torch::zeros({1}, start.options().dtype(torch::kLong))),
        limit(torch::full({1}, limit_value, start.options().dtype(torch::kLong))),
        keep_going(torch::zeros({1}, start.options().dtype(torch::kBool))) {}

  void operator()() {
    x.add_(1);
    counter.add_(1);
    at::lt_out(keep_going, counter, limit);
  }
  std::int64_t count() const { return counter.item<std::int64_t>(); }
};

// The router's work: the step on `stream`, as torch's current stream.
Router::work_type work_of(Step& step, c10::DeviceIndex device) {
  return [&step, device](const std::int64_t&, replay::StreamRef stream) {
    const c10::cuda::CUDAStreamGuard guard(c10::cuda::getStreamFromExternal(stream.get(), device));
    step();
  };
}

// The one stream a test runs on: torch's current stream for the whole case,
// so that the tensors' initialization, the router's runs and the reads are
// ordered on it.
struct OnStream {
  c10::cuda::CUDAStream stream = c10::cuda::getStreamFromPool(/*isHighPriority=*/false);
  c10::cuda::CUDAStreamGuard guard{stream};
  replay::StreamRef ref() const { return replay::StreamRef(stream.stream()); }
};

int pool_uses(const replay::TorchCaptureContext& context) {
  return c10::cuda::CUDACachingAllocator::getPoolUseCount(context.device().index(), context.pool());
}

}  // namespace

TEST_SUITE("host") {

TEST_CASE("TorchGraphBackend takes a graph wrapper; a null context is refused with or without one") {
  static_assert(std::is_constructible_v<replay::TorchGraphBackend, std::shared_ptr<replay::TorchCaptureContext>,
                                        replay::TorchGraphWrapper>);
  static_assert(std::is_convertible_v<decltype([](replay::GraphRef captured, replay::StreamRef) {
                                        return captured.clone();
                                      }),
                                      replay::TorchGraphWrapper>);
  static_assert(replay::GraphBackend<replay::TorchGraphBackend>);
  static_assert(replay::TrimsMemory<replay::TorchGraphBackend>);
  CHECK_THROWS_WITH_AS(replay::TorchGraphBackend(nullptr), doctest::Contains("no TorchCaptureContext"),
                       replay::usage_error);
  CHECK_THROWS_WITH_AS(
      replay::TorchGraphBackend(nullptr, [](replay::GraphRef captured, replay::StreamRef) { return captured.clone(); }),
      doctest::Contains("no TorchCaptureContext"), replay::usage_error);
}

}  // TEST_SUITE("host")

TEST_SUITE("gpu" * replay_test::needs_device()) {

TEST_CASE("a graph wrapper puts the captured step in a WHILE node: several steps per launch, stopped by a flag") {
  torch::manual_seed(replay_test::case_seed());
  const c10::Device device(c10::kCUDA, c10::cuda::current_device());
  const OnStream on;
  const at::Tensor start = torch::randn({4}, torch::TensorOptions().device(device));
  Step step(start, 100);
  constexpr unsigned int kMaxPasses = 5;

  auto context = std::make_shared<replay::TorchCaptureContext>(device);
  int wrapper_calls = 0;
  std::size_t section_kernels = 0;
  replay::TorchGraphWrapper wrapper = [&](replay::GraphRef captured, replay::StreamRef) {
    ++wrapper_calls;
    section_kernels = captured.count(replay::NodeType::kernel);
    return replay_test::make_step_loop(captured, step.keep_going.data_ptr<bool>(), kMaxPasses);
  };
  Router router(work_of(step, device.index()), Router::options_type::exact(),
                replay::TorchGraphBackend(context, wrapper));
  CHECK(router.backend().wraps_graphs());
  CHECK_FALSE(replay::TorchGraphBackend(context).wraps_graphs());

  // One launch: the step kMaxPasses times (the flag stays true below 100).
  CHECK(router.run(1, on.ref()).kind == replay::RouteKind::captured);
  CHECK(wrapper_calls == 1);
  CHECK(section_kernels >= 3);  // add_, add_, lt: the section the wrapper was given
  CHECK(step.count() == kMaxPasses);
  CHECK(router.run(1, on.ref()).kind == replay::RouteKind::replayed);
  CHECK(step.count() == 2 * kMaxPasses);

  // The flag stops the loop early: 2 steps reach the limit of 12.
  step.limit.fill_(12);
  CHECK(router.run(1, on.ref()).kind == replay::RouteKind::replayed);
  CHECK(step.count() == 12);
  // This loop runs its first pass before it tests the flag.
  CHECK(router.run(1, on.ref()).graph());
  CHECK(step.count() == 13);
  step.limit.fill_(1000);
  CHECK(router.run(1, on.ref()).graph());
  CHECK(step.count() == 18);

  // The same as the step run eagerly as often.
  Step eager(start, 1000);
  for (int i = 0; i < 18; ++i) {
    eager();
  }
  CHECK(torch::equal(step.x, eager.x));
  CHECK(torch::equal(step.keep_going, eager.keep_going));

  // The wrapper's graph memory is the router's: one allocation node of the pass counter.
  const auto graphs = router.graphs();
  REQUIRE(graphs.size() == 1);
  CHECK(graphs[0].memory.alloc_bytes == sizeof(unsigned int));
  CHECK(router.memory().alloc_bytes_sum == sizeof(unsigned int));

  // Recaptured: the wrapper builds the loop again around the new section.
  CHECK(router.invalidate(1));
  CHECK(router.run(1, on.ref()).kind == replay::RouteKind::recaptured);
  CHECK(wrapper_calls == 2);
  CHECK(step.count() == 18 + kMaxPasses);
  CHECK(router.stats().reinstantiations == 1);
  CHECK(router.graphs().at(0).memory.alloc_bytes == sizeof(unsigned int));
  // Evicted (the backend trims the device's graph pool), then captured anew.
  CHECK(router.evict(1));
  CHECK(router.run(1, on.ref()).kind == replay::RouteKind::captured);
  CHECK(wrapper_calls == 3);
  CHECK(step.count() == 18 + 2 * kMaxPasses);
  CHECK(router.stats().capture_failures == 0);
  // The live graph and the context each hold the pool.
  CHECK(pool_uses(*context) == 2);
  on.stream.synchronize();
}

TEST_CASE("a graph wrapper that throws or returns nothing: the key runs eagerly, the failure names the wrapper") {
  const c10::Device device(c10::kCUDA, c10::cuda::current_device());
  const OnStream on;
  Step step(torch::zeros({4}, torch::TensorOptions().device(device)), 100);
  auto context = std::make_shared<replay::TorchCaptureContext>(device);
  const int uses_before = pool_uses(*context);
  std::vector<std::string> failures;
  auto options = Router::options_type::exact();
  options.on_capture_failure = [&](const std::int64_t&, std::string_view reason) {
    failures.emplace_back(reason);
  };

  {
    Router throwing(work_of(step, device.index()), options,
                    replay::TorchGraphBackend(context, [](replay::GraphRef, replay::StreamRef) -> replay::Graph {
                      throw std::runtime_error("no loop today");
                    }));
    CHECK(throwing.run(1, on.ref()).kind == replay::RouteKind::eager_fallback);
    CHECK(step.count() == 1);  // the work, once, as issued
    REQUIRE(failures.size() == 1);
    CHECK(contains(failures[0], "graph wrapper failed"));
    CHECK(contains(failures[0], "no loop today"));
    CHECK(throwing.is_eager(1));
    CHECK(throwing.stats().capture_failures == 1);
    CHECK(throwing.graph_count() == 0);
    // The capture gave its pool reference back.
    CHECK(pool_uses(*context) == uses_before);
  }
  {
    auto nothing = [](replay::GraphRef, replay::StreamRef) { return replay::Graph(); };
    Router empty(work_of(step, device.index()), options, replay::TorchGraphBackend(context, nothing));
    CHECK(empty.run(1, on.ref()).kind == replay::RouteKind::eager_fallback);
    REQUIRE(failures.size() == 2);
    CHECK(contains(failures[1], "empty Graph"));
    CHECK(pool_uses(*context) == uses_before);
  }
  // The context stays fit for captures: the simplest wrapper, a copy of the section.
  Router copy(work_of(step, device.index()), options,
              replay::TorchGraphBackend(context,
                                        [](replay::GraphRef captured, replay::StreamRef) { return captured.clone(); }));
  CHECK(copy.run(1, on.ref()).kind == replay::RouteKind::captured);
  CHECK(copy.run(1, on.ref()).kind == replay::RouteKind::replayed);
  CHECK(step.count() == 4);
  CHECK(copy.graphs().at(0).memory.alloc_bytes == 0);
  CHECK(failures.size() == 2);
  on.stream.synchronize();
}

TEST_CASE("a graph wrapper refuses a step that draws random numbers: each pass would draw the same ones") {
  const c10::Device device(c10::kCUDA, c10::cuda::current_device());
  const OnStream on;
  const at::Generator generator = at::cuda::detail::createCUDAGenerator(device.index());
  auto context = std::make_shared<replay::TorchCaptureContext>(device, replay::CaptureMode::this_thread,
                                                               std::vector<at::Generator>{generator});
  const int uses_before = pool_uses(*context);
  at::Tensor x = torch::zeros({256}, torch::TensorOptions().device(device));
  std::string failure;
  auto options = Router::options_type::exact();
  options.on_capture_failure = [&](const std::int64_t&, std::string_view reason) { failure = reason; };
  int wrapper_calls = 0;
  Router router(
      [&](const std::int64_t&, replay::StreamRef stream) {
        const c10::cuda::CUDAStreamGuard guard(c10::cuda::getStreamFromExternal(stream.get(), device.index()));
        x.add_(at::rand({256}, generator, x.options()));
      },
      options,
      replay::TorchGraphBackend(context, [&](replay::GraphRef captured, replay::StreamRef) {
        ++wrapper_calls;
        return captured.clone();
      }));
  CHECK(router.run(1, on.ref()).kind == replay::RouteKind::eager_fallback);
  CHECK(wrapper_calls == 0);
  CHECK(contains(failure, "random numbers"));
  CHECK(contains(failure, "graph wrapper"));
  CHECK(pool_uses(*context) == uses_before);
  // Run eagerly, it still draws: x holds numbers in [0, 1), not all equal.
  CHECK(x.min().item<float>() >= 0.0F);
  CHECK(x.max().item<float>() < 1.0F);
  CHECK(x.max().item<float>() > x.min().item<float>());
  on.stream.synchronize();
}

}  // TEST_SUITE("gpu")
