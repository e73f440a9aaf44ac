// Bitmask enums: the operators exist only for opted-in enums, and the flag
// values match CUDA's.
#include <doctest/doctest.h>

#include "replay/capture_scope.hpp"
#include "replay/event.hpp"
#include "replay/graph_exec.hpp"
#include "replay/stream.hpp"

namespace {
enum class NotAMask { a = 1, b = 2 };
template <class E>
concept HasOr = requires(E a, E b) { a | b; };
}  // namespace

using replay::has_flag;
using replay::InstantiateFlags;

// Only opted-in enums get bitmask operators. A compile-time claim: breaking it
// breaks the build of this test program.
static_assert(HasOr<InstantiateFlags>);
static_assert(HasOr<replay::EventFlags>);
static_assert(HasOr<replay::StreamFlags>);
static_assert(HasOr<replay::DotFlags>);
static_assert(!HasOr<NotAMask>);
static_assert(!HasOr<replay::CaptureMode>);  // modes are exclusive, not a mask

TEST_SUITE("host") {
  TEST_CASE("InstantiateFlags combine as a bitmask with CUDA's values") {
    constexpr auto flags = InstantiateFlags::auto_free_on_launch | InstantiateFlags::upload;
    static_assert(replay::to_underlying(flags) ==
                  (cudaGraphInstantiateFlagAutoFreeOnLaunch | cudaGraphInstantiateFlagUpload));
    static_assert(has_flag(flags, InstantiateFlags::upload));
    static_assert(!has_flag(flags, InstantiateFlags::device_launch));
    static_assert(replay::to_underlying(InstantiateFlags::use_node_priority) == cudaGraphInstantiateFlagUseNodePriority);
    static_assert(replay::to_underlying(InstantiateFlags::device_launch) == cudaGraphInstantiateFlagDeviceLaunch);
    auto f = InstantiateFlags::none;
    f |= InstantiateFlags::use_node_priority;
    CHECK(has_flag(f, InstantiateFlags::use_node_priority));
    f &= ~InstantiateFlags::use_node_priority;
    CHECK(f == InstantiateFlags::none);
    CHECK((InstantiateFlags::upload ^ InstantiateFlags::upload) == InstantiateFlags::none);
  }

  TEST_CASE("invalid flag combinations are named before instantiation") {
    CHECK(replay::invalid_flags_reason(InstantiateFlags::none) == nullptr);
    CHECK(replay::invalid_flags_reason(InstantiateFlags::upload | InstantiateFlags::use_node_priority) == nullptr);
    const char* reason =
        replay::invalid_flags_reason(InstantiateFlags::device_launch | InstantiateFlags::auto_free_on_launch);
    REQUIRE(reason != nullptr);
    CHECK(std::string(reason).find("device_launch") != std::string::npos);
    CHECK(replay::invalid_flags_reason(static_cast<InstantiateFlags>(1ULL << 40)) != nullptr);
  }

  TEST_CASE("capture modes and event flags map onto CUDA's") {
    CHECK(static_cast<int>(replay::CaptureMode::this_thread) == cudaStreamCaptureModeThreadLocal);
    CHECK(static_cast<int>(replay::CaptureMode::global) == cudaStreamCaptureModeGlobal);
    CHECK(static_cast<int>(replay::CaptureMode::relaxed) == cudaStreamCaptureModeRelaxed);
    CHECK(replay::to_underlying(replay::EventFlags::disable_timing) == cudaEventDisableTiming);
    CHECK(replay::to_underlying(replay::StreamFlags::non_blocking) == cudaStreamNonBlocking);
    CHECK(replay::to_string(replay::UpdatePath::in_place) == "in_place");
    CHECK(replay::to_string(cudaGraphExecUpdateErrorTopologyChanged) == "topology changed");
  }

  TEST_CASE("UpdateResult describes the path it took") {
    replay::UpdateResult in_place;
    CHECK(in_place.in_place());
    CHECK(in_place.describe() == "updated in place");
    replay::UpdateResult re{replay::UpdatePath::reinstantiated, cudaGraphExecUpdateErrorTopologyChanged,
                            "kernel node k(float*)"};
    CHECK_FALSE(re.in_place());
    CHECK(re.describe().find("topology changed") != std::string::npos);
    CHECK(re.describe().find("kernel node k(float*)") != std::string::npos);
  }
}
