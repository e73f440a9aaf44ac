// Ownership rules, checked at compile time: owning types are move-only with
// noexcept moves; views are cheap copies; StreamRef refuses 0 and nullptr.
#include <doctest/doctest.h>

#include <type_traits>

#include "replay/replay.hpp"

namespace {
template <class T>
constexpr bool move_only_v = !std::is_copy_constructible_v<T> && !std::is_copy_assignable_v<T> &&
                             std::is_nothrow_move_constructible_v<T> && std::is_nothrow_move_assignable_v<T> &&
                             std::is_nothrow_destructible_v<T>;
struct NotTrivial {
  NotTrivial(const NotTrivial&) {}
};
template <class T>
concept CanMakeBuffer = requires { typename replay::DeviceBuffer<T>; };
template <class Owner>
concept AdoptsNull = requires { Owner::from_native_handle(nullptr); };
template <class Owner>
concept AdoptsZero = requires { Owner::from_native_handle(0); };

// A moved-from owner, made without a device: adopt a handle that is never
// used, move it on, and release it from there.
template <class Owner>
Owner moved_from_owner() {
  static int never_used = 0;
  Owner adopted = Owner::from_native_handle(reinterpret_cast<typename Owner::handle_type>(&never_used));
  Owner taker = std::move(adopted);
  (void)taker.release();
  return adopted;
}
}  // namespace

// Owning types are move-only with noexcept moves (compile-time: a broken claim breaks the build).
static_assert(move_only_v<replay::Stream>);
static_assert(move_only_v<replay::Event>);
static_assert(move_only_v<replay::Graph>);
static_assert(move_only_v<replay::GraphExec>);
static_assert(move_only_v<replay::DeviceBuffer<float>>);
static_assert(move_only_v<replay::PinnedBuffer<int>>);
static_assert(!std::is_copy_constructible_v<replay::CaptureScope>);
static_assert(!std::is_move_constructible_v<replay::CaptureScope>);  // pinned to its capture
static_assert(!std::is_copy_constructible_v<replay::ScopedFork>);

// Buffers take trivially copyable element types only (compile-time: a broken claim breaks the build).
static_assert(replay::BufferElement<float>);
static_assert(replay::BufferElement<double>);
static_assert(!replay::BufferElement<NotTrivial>);
static_assert(!replay::BufferElement<const float>);
static_assert(std::is_trivially_copyable_v<replay::BufferView<float>>);
static_assert(replay::DeviceBuffer<float>::memory_space == replay::MemorySpace::device);
static_assert(replay::PinnedBuffer<float>::memory_space == replay::MemorySpace::pinned_host);

TEST_SUITE("host") {
  TEST_CASE("StreamRef converts from cudaStream_t but not from 0 or nullptr") {
    static_assert(std::is_convertible_v<cudaStream_t, replay::StreamRef>);
    static_assert(!std::is_constructible_v<replay::StreamRef, int>);
    static_assert(!std::is_constructible_v<replay::StreamRef, std::nullptr_t>);
    static_assert(std::is_trivially_copyable_v<replay::StreamRef>);
    static_assert(std::is_convertible_v<const replay::Stream&, replay::StreamRef>);
    const replay::StreamRef per_thread = cudaStreamPerThread;
    CHECK(per_thread.get() == cudaStreamPerThread);
    CHECK(replay::StreamRef(cudaStreamLegacy) == replay::StreamRef(cudaStreamLegacy));
  }

  TEST_CASE("empty buffers and views need no device") {
    replay::DeviceBuffer<float> empty;
    CHECK(empty.size() == 0);
    CHECK(empty.data() == nullptr);
    CHECK(empty.empty());
    CHECK_FALSE(empty.moved_from());
    replay::DeviceBuffer<float> zero(0);  // a zero-size allocation allocates nothing
    CHECK(zero.data() == nullptr);
    // Copies of empty spans into empty buffers are defined no-ops (no CUDA call is made).
    std::vector<float> none;
    CHECK_NOTHROW(zero.copy_from(std::span<const float>(none), replay::StreamRef(cudaStreamPerThread)));
    // A size mismatch is refused before any CUDA call.
    std::vector<float> three(3);
    CHECK_THROWS_AS(zero.copy_from(std::span<const float>(three), replay::StreamRef(cudaStreamPerThread)),
                    replay::usage_error);
    replay::DeviceBuffer<float> moved = std::move(zero);
    CHECK(zero.moved_from());
    CHECK_FALSE(moved.moved_from());
    CHECK_THROWS_WITH_AS(zero.view(), doctest::Contains("used after move"), replay::usage_error);
    CHECK_THROWS_AS(zero.zero(replay::StreamRef(cudaStreamPerThread)), replay::usage_error);
  }

  TEST_CASE("fork() refuses a branch equal to the origin before any CUDA call") {
    // No device is needed: the refusal must come before the event is created,
    // so that a capture is never left half-forked.
    const replay::StreamRef origin = cudaStreamPerThread;
    CHECK_THROWS_WITH_AS(replay::fork(origin, {origin}), doctest::Contains("equals the origin"),
                         replay::usage_error);
    CHECK_THROWS_AS(replay::ScopedFork(origin, {replay::StreamRef(cudaStreamLegacy), origin}),
                    replay::usage_error);
  }

  TEST_CASE("views check their ranges") {
    float storage[8] = {};
    replay::BufferView<float, replay::MemorySpace::pinned_host> view(storage, 8);
    CHECK(view.subview(2, 6).data() == storage + 2);
    CHECK(view.subview(8, 0).empty());
    CHECK_THROWS_AS((void)view.subview(3, 6), replay::usage_error);
    CHECK_THROWS_AS((void)view.subview(9, 0), replay::usage_error);
    CHECK(view.first(4).size() == 4);
    view[1] = 2.0F;
    CHECK(storage[1] == 2.0F);
  }

  TEST_CASE("moved-from owning handles refuse use with a clear error") {
    replay::Graph graph;  // empty, as a moved-from Graph is
    CHECK_FALSE(graph);
    CHECK_THROWS_WITH_AS((void)graph.handle(), doctest::Contains("Graph used after move"), replay::usage_error);
    auto moved_graph = moved_from_owner<replay::Graph>();
    CHECK_THROWS_WITH_AS((void)moved_graph.node_count(), doctest::Contains("Graph used after move"),
                         replay::usage_error);
    auto exec = moved_from_owner<replay::GraphExec>();
    CHECK_THROWS_WITH_AS(exec.launch(cudaStreamPerThread), doctest::Contains("GraphExec used after move"),
                         replay::usage_error);
    auto stream = moved_from_owner<replay::Stream>();
    CHECK_FALSE(stream);
    CHECK_THROWS_WITH_AS((void)stream.ref(), doctest::Contains("Stream used after move"), replay::usage_error);
    // As a StreamRef it is refused too, before any CUDA call.
    const replay::StreamRef as_view = stream;
    CHECK_THROWS_WITH_AS((void)as_view.is_capturing(), doctest::Contains("Stream used after move"),
                         replay::usage_error);
    CHECK_THROWS_WITH_AS(exec.launch(stream), doctest::Contains("used after move"), replay::usage_error);
    auto event = moved_from_owner<replay::Event>();
    CHECK_THROWS_WITH_AS(event.record(cudaStreamPerThread), doctest::Contains("Event used after move"),
                         replay::usage_error);
  }

  TEST_CASE("owning types are their views and refuse null and integer handles") {
    static_assert(std::is_base_of_v<replay::StreamRef, replay::Stream>);
    static_assert(std::is_base_of_v<replay::EventRef, replay::Event>);
    static_assert(std::is_base_of_v<replay::GraphRef, replay::Graph>);
    static_assert(!AdoptsNull<replay::Stream> && !AdoptsZero<replay::Stream>);
    static_assert(!AdoptsNull<replay::Event> && !AdoptsZero<replay::Event>);
    static_assert(!AdoptsNull<replay::Graph> && !AdoptsZero<replay::Graph>);
    static_assert(!AdoptsNull<replay::GraphExec> && !AdoptsZero<replay::GraphExec>);
    static_assert(std::is_nothrow_default_constructible_v<replay::Graph>);  // empty, no CUDA call
    CHECK_FALSE(replay::Graph{});
  }
}
