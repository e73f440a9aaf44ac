// GraphBuilder's compile-time checks, on the CPU: kernel arguments are checked
// against the kernel's own parameter list, memset elements are 1, 2 or 4
// bytes, and a conditional handle cannot be set from host code.
#include <doctest/doctest.h>

#include <cstdint>
#include <string>

#include "replay/graph_builder.hpp"

namespace {
void scale(float*, int, float) {}
void no_args() {}
struct Pod {
  int a;
  float b;
};
void takes_pod(Pod, const double*) {}

template <class H>
concept host_can_set = requires(const H& h) { h.set(1U); };
}  // namespace

// Count and convertibility, as a <<<>>> launch would check them.
static_assert(replay::kernel_arguments_for<decltype(&scale), float*, int, float>);
static_assert(replay::kernel_arguments_for<decltype(&scale), float*, long, double>);  // converts, like <<<>>>
static_assert(!replay::kernel_arguments_for<decltype(&scale), float*, int>);          // too few
static_assert(!replay::kernel_arguments_for<decltype(&scale), float*, int, float, int>);  // too many
static_assert(!replay::kernel_arguments_for<decltype(&scale), int*, int, float>);     // wrong pointer
static_assert(!replay::kernel_arguments_for<decltype(&scale), const float*, int, float>);  // drops const
static_assert(replay::kernel_arguments_for<decltype(&no_args)>);
static_assert(!replay::kernel_arguments_for<decltype(&no_args), int>);
static_assert(replay::kernel_arguments_for<decltype(&takes_pod), Pod, double*>);
static_assert(!replay::kernel_arguments_for<decltype(&takes_pod), int, double*>);
static_assert(!replay::kernel_arguments_for<int, int>);  // not a kernel pointer

static_assert(replay::memset_element<std::uint8_t>);
static_assert(replay::memset_element<short>);
static_assert(replay::memset_element<float>);
static_assert(!replay::memset_element<double>);
static_assert(!replay::memset_element<Pod>);

#if CUDART_VERSION >= 12040
static_assert(!host_can_set<replay::ConditionalHandle>, "the condition is set on the device only");
static_assert(std::is_trivially_copyable_v<replay::ConditionalHandle>);
#endif

TEST_SUITE("host") {
  TEST_CASE("conditional kinds name themselves and the CUDA version they need") {
    CHECK(replay::to_string(replay::ConditionalKind::while_loop) == "WHILE");
    CHECK(replay::to_string(replay::ConditionalKind::switch_case) == "SWITCH");
    CHECK(replay::required_cuda_version(replay::ConditionalKind::if_then) == 12040);
    CHECK(replay::required_cuda_version(replay::ConditionalKind::if_then_else) == 12080);
    CHECK(replay::required_cuda_version(replay::ConditionalKind::switch_case) == 12080);
  }

  TEST_CASE("an empty node handle is refused before any CUDA call") {
    const replay::Node empty;
    CHECK_FALSE(static_cast<bool>(empty));
    CHECK_THROWS_AS((void)empty.handle(), replay::usage_error);
    const replay::Deps deps{empty};
    CHECK(deps.size() == 1);
    CHECK_THROWS_WITH_AS(deps.validate("add_kernel", std::source_location::current()),
                         doctest::Contains("empty node handle"), replay::usage_error);
    const replay::Deps none;
    CHECK(none.empty());
    CHECK(none.data() == nullptr);
  }

  TEST_CASE("a builder over no graph is a usage error, not a crash") {
    auto builder = replay::GraphBuilder::from_native_handle(nullptr);
    CHECK_THROWS_AS(builder.add_empty(), replay::usage_error);
    CHECK_THROWS_AS(builder.node_count(), replay::usage_error);
  }
}
