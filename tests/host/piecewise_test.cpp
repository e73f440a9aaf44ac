// Piecewise capture on the CPU: the segment tree's policy (keying by region
// values, bounds, least-recently-launched eviction) with a stand-in segment,
// replay::eager's marshalling of region values through a stand-in capture,
// and the misuse refused before any CUDA call.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "replay/piecewise.hpp"

namespace {

// A stand-in segment: an id, a cost, and a count of live segments, so the
// tests see which segments eviction destroyed.
struct FakeSegment {
  FakeSegment(int segment_id, std::size_t nodes, std::size_t bytes, std::shared_ptr<int> live_count)
      : id(segment_id), segment_cost{nodes, bytes}, live(std::move(live_count)) {
    ++*live;
  }
  FakeSegment(FakeSegment&& other) noexcept : id(other.id), segment_cost(other.segment_cost), live(std::move(other.live)) {}
  FakeSegment(const FakeSegment&) = delete;
  FakeSegment& operator=(const FakeSegment&) = delete;
  FakeSegment& operator=(FakeSegment&&) = delete;
  ~FakeSegment() {
    if (live) {
      --*live;
    }
  }
  replay::SegmentCost cost() const noexcept { return segment_cost; }

  int id;
  replay::SegmentCost segment_cost;
  std::shared_ptr<int> live;
};
using Tree = replay::detail::SegmentTree<FakeSegment>;
using Node = Tree::Node;
static_assert(replay::detail::PiecewiseSegmentPayload<FakeSegment>);

template <class T>
std::string key_of(const T& value) {
  return std::string(reinterpret_cast<const char*>(&value), sizeof value);
}

struct TreeFixture {
  std::shared_ptr<int> live = std::make_shared<int>(0);
  Tree tree;
  int next_id = 0;

  std::unique_ptr<Node> node(std::size_t nodes = 1, std::size_t bytes = 0) {
    return Tree::make_node(FakeSegment(next_id++, nodes, bytes, live));
  }
  // The first capture: a root segment (with a region) and the segment its
  // value `value` led to; returns that leaf.
  Node* start(int value, std::size_t root_nodes = 1, std::size_t nodes = 1, std::size_t bytes = 0) {
    auto chain = node(root_nodes);
    Tree::append(*chain, key_of(value), node(nodes, bytes));
    Node* leaf = tree.attach(nullptr, {}, std::move(chain));
    return leaf;
  }
  // A miss at `parent`: the one-segment path its region's value `value` leads to.
  Node* add_path(Node* parent, int value, std::size_t nodes = 1, std::size_t bytes = 0) {
    return tree.attach(parent, key_of(value), node(nodes, bytes));
  }
};

}  // namespace

TEST_SUITE("host") {
  TEST_CASE_FIXTURE(TreeFixture, "segment tree: the segments after a region are keyed by the bytes of its value") {
    Node* first = start(1, 3, 2);
    CHECK(tree.paths() == 1);
    CHECK(tree.segments() == 2);
    Node* second = add_path(tree.root(), 2, 5);
    CHECK(tree.paths() == 2);
    CHECK(Tree::child(*tree.root(), key_of(1)) == first);
    CHECK(Tree::child(*tree.root(), key_of(2)) == second);
    CHECK(Tree::child(*tree.root(), key_of(3)) == nullptr);
    CHECK(Tree::child(*tree.root(), key_of(std::int64_t{1})) == nullptr);  // other bytes, other key
    CHECK(second->parent == tree.root());
    CHECK(second->key == key_of(2));
    CHECK(tree.segments() == 3);
    CHECK(tree.cost().nodes == 10);
    CHECK(*live == 3);
  }

  TEST_CASE_FIXTURE(TreeFixture, "segment tree: a chain attached at a miss counts every segment and one path") {
    start(0);
    auto chain = node(2);
    Node* tail = Tree::append(*chain, key_of(true), node(3));
    Tree::append(*tail, {}, node(4));
    Node* leaf = tree.attach(tree.root(), key_of(7), std::move(chain));
    CHECK(leaf->children.empty());
    CHECK(leaf->segment.id == 4);
    CHECK(tree.paths() == 2);
    CHECK(tree.segments() == 5);
    CHECK(tree.cost().nodes == 11);
    int depth = 0;
    for (Node* n = leaf; n != nullptr; n = n->parent) {
      ++depth;
    }
    CHECK(depth == 4);
  }

  TEST_CASE_FIXTURE(TreeFixture, "segment tree: beyond max_paths the least recently launched path is evicted") {
    Node* zero = start(0);
    tree.touch(zero);
    Node* one = add_path(tree.root(), 1);
    tree.touch(one);
    Node* two = add_path(tree.root(), 2);
    tree.touch(two);
    tree.touch(zero);  // 0 is now more recent than 1 and 2
    Node* three = add_path(tree.root(), 3);
    replay::PiecewiseOptions bounds;
    bounds.max_paths = 3;
    const auto admission = tree.admit(three, bounds);
    CHECK(admission.exceeded == nullptr);
    CHECK(admission.evicted == 1);
    CHECK(Tree::child(*tree.root(), key_of(1)) == nullptr);  // the least recent
    CHECK(Tree::child(*tree.root(), key_of(0)) == zero);
    CHECK(Tree::child(*tree.root(), key_of(2)) == two);
    CHECK(Tree::child(*tree.root(), key_of(3)) == three);
    CHECK(tree.paths() == 3);
    CHECK(*live == 4);  // root, 0, 2, 3: segment 1 was destroyed
  }

  TEST_CASE_FIXTURE(TreeFixture, "segment tree: an evicted path takes the interior segments only it used") {
    // root -> {1: mid -> {1: a, 2: b}, 2: c}
    Node* c = start(2);
    auto mid_chain = node(10);
    Tree::append(*mid_chain, key_of(1), node(1));
    Node* a = tree.attach(tree.root(), key_of(1), std::move(mid_chain));
    Node* mid = a->parent;
    Node* b = tree.attach(mid, key_of(2), node(1));
    CHECK(tree.paths() == 3);
    tree.remove_path(a);
    CHECK(tree.paths() == 2);
    CHECK(Tree::child(*mid, key_of(1)) == nullptr);
    CHECK(Tree::child(*tree.root(), key_of(1)) == mid);  // still used by b
    tree.remove_path(b);
    CHECK(Tree::child(*tree.root(), key_of(1)) == nullptr);  // mid went with its last path
    CHECK(tree.paths() == 1);
    CHECK(tree.cost().nodes == 2);  // root and c
    CHECK(*live == 2);
    CHECK(Tree::child(*tree.root(), key_of(2)) == c);
  }

  TEST_CASE_FIXTURE(TreeFixture, "segment tree: max_nodes and max_alloc_bytes evict, and a path alone over a bound is "
                                 "dropped and named") {
    Node* first = start(1, 1, 4, 100);
    tree.touch(first);
    Node* other = add_path(tree.root(), 2, 4, 100);
    tree.touch(other);
    replay::PiecewiseOptions bounds;
    bounds.max_nodes = 6;  // root 1 + 4 + 4 = 9: one of the two leaves must go
    auto admission = tree.admit(other, bounds);
    CHECK(admission.exceeded == nullptr);
    CHECK(admission.evicted == 1);
    CHECK(Tree::child(*tree.root(), key_of(1)) == nullptr);
    CHECK(tree.cost().nodes == 5);

    bounds = {};
    bounds.max_alloc_bytes = 150;
    Node* heavy = add_path(tree.root(), 3, 1, 200);  // alone (with the root) over the byte bound
    admission = tree.admit(heavy, bounds);
    CHECK(admission.exceeded == std::string("max_alloc_bytes"));
    CHECK(admission.evicted == 1);  // path 2 went first, in the attempt to fit
    CHECK(tree.empty());            // path 3 was dropped, never kept, and the root with it: nothing used it
    CHECK(tree.paths() == 0);
    CHECK(tree.cost().alloc_bytes == 0);
    CHECK(*live == 0);
  }

  TEST_CASE_FIXTURE(TreeFixture, "segment tree: the path just launched survives eviction, whatever its age") {
    std::vector<Node*> leaves{start(0)};
    tree.touch(leaves.back());
    for (int v = 1; v < 5; ++v) {
      leaves.push_back(add_path(tree.root(), v));
      tree.touch(leaves.back());
    }
    tree.touch(leaves[0]);  // the oldest becomes the newest
    replay::PiecewiseOptions bounds;
    bounds.max_paths = 2;
    const auto admission = tree.admit(leaves[0], bounds);
    CHECK(admission.exceeded == nullptr);
    CHECK(admission.evicted == 3);
    CHECK(tree.paths() == 2);
    CHECK(Tree::child(*tree.root(), key_of(0)) == leaves[0]);
    CHECK(Tree::child(*tree.root(), key_of(4)) == leaves[4]);
    tree.clear();
    CHECK(tree.empty());
    CHECK(*live == 0);
  }

  TEST_CASE("DOT: segments as boxes with their node counts, regions as hexagons, edges labelled with the values") {
    using replay::detail::PiecewiseSegment;
    using replay::detail::PiecewiseTree;
    PiecewiseSegment root;
    root.node_counts = {{replay::NodeType::kernel, 2}};
    root.segment_cost.nodes = 2;
    root.has_region = true;
    root.region_name = "read \"flag\"";
    PiecewiseSegment taken;
    taken.node_counts = {{replay::NodeType::kernel, 1}, {replay::NodeType::memcpy, 1}};
    taken.segment_cost.nodes = 2;
    auto chain = PiecewiseTree::make_node(std::move(root));
    PiecewiseTree::append(*chain, key_of(true), PiecewiseTree::make_node(std::move(taken)));
    PiecewiseTree tree;
    tree.attach(nullptr, {}, std::move(chain));
    tree.attach(tree.root(), key_of(false), PiecewiseTree::make_node(PiecewiseSegment{}));  // an empty segment
    const std::string dot = replay::detail::piecewise_dot(tree);
    CHECK(dot.rfind("digraph piecewise {", 0) == 0);
    CHECK(dot.find("s0 [shape=box, label=\"segment 0\\n2 nodes: 2 kernel\"];") != std::string::npos);
    CHECK(dot.find("r0 [shape=hexagon") != std::string::npos);
    CHECK(dot.find("label=\"region read \\\"flag\\\"\\n(eager, host)\"") != std::string::npos);
    // Children in key order: false (0) first, then true (1).
    CHECK(dot.find("s1 [shape=box, label=\"segment 1\\n0 nodes\"];") != std::string::npos);
    CHECK(dot.find("s2 [shape=box, label=\"segment 2\\n2 nodes: 1 kernel, 1 memcpy\"];") != std::string::npos);
    CHECK(dot.find("r0 -> s1 [label=\"0\"];") != std::string::npos);
    CHECK(dot.find("r0 -> s2 [label=\"1\"];") != std::string::npos);
    CHECK(dot.find("r1") == std::string::npos);  // no region after a path's last segment
  }

  TEST_CASE("region values: a region's return value travels as its bytes; void as none") {
    std::string value = "stale";
    auto void_region = replay::detail::PiecewiseCallable::make([](replay::StreamRef) {});
    void_region(replay::StreamRef(cudaStreamPerThread), value);
    CHECK(value.empty());
    struct Shape {
      std::int32_t rows;
      std::int32_t cols;
    };
    auto shape_region = replay::detail::PiecewiseCallable::make([](replay::StreamRef) { return Shape{3, 7}; });
    shape_region(replay::StreamRef(cudaStreamPerThread), value);
    REQUIRE(value.size() == sizeof(Shape));
    Shape back{};
    std::memcpy(&back, value.data(), sizeof back);
    CHECK(back.rows == 3);
    CHECK(back.cols == 7);
    CHECK(replay::detail::region_value_text(key_of(std::int32_t{258})) == "258");
    CHECK(replay::detail::region_value_text(key_of(true)) == "1");
    CHECK(replay::detail::region_value_text(std::string(9, '\x01')) == "0x010101010101010101");
    CHECK(replay::detail::dot_escaped("a \"b\"") == "a \\\"b\\\"");
  }

  TEST_CASE("replay::eager hands its region to the piecewise capture open on this thread and returns its value") {
    // A stand-in capture: runs the region and records the break.
    struct StandIn final : replay::detail::PiecewiseBreaks {
      std::vector<std::string> names;
      std::string forced;  // when set, the bytes handed back instead of the region's
      void take_break(replay::StreamRef stream, std::string_view name, replay::detail::PiecewiseCallable&& region,
                      std::string& value, const std::source_location&) override {
        names.emplace_back(name);
        region(stream, value);
        if (!forced.empty()) {
          value = forced;
        }
      }
    } capture;
    const replay::StreamRef stream(cudaStreamPerThread);
    {
      replay::detail::BreaksInstalled installed(&capture);
      int ran = 0;
      replay::eager(stream, "count", [&](replay::StreamRef) { ++ran; });
      CHECK(ran == 1);
      CHECK(replay::eager(stream, "decide", [](replay::StreamRef) { return std::int64_t{42}; }) == 42);
      CHECK(replay::eager(stream, [](replay::StreamRef) { return true; }));
      capture.forced = std::string(2, '\0');  // bytes of another size than the region's value
      CHECK_THROWS_WITH_AS(replay::eager(stream, "size", [](replay::StreamRef) { return 1; }),
                           doctest::Contains("not the same given the same region values"), replay::usage_error);
    }
    CHECK(capture.names == std::vector<std::string>{"count", "decide", "eager", "size"});
    CHECK(replay::detail::piecewise_thread_state().capture == nullptr);  // uninstalled
  }

  TEST_CASE("misuse is refused before any CUDA call: a break outside any capture, in a one-graph capture, in a "
            "region") {
    const replay::StreamRef stream(cudaStreamPerThread);
    int ran = 0;
    auto region = [&](replay::StreamRef) { ++ran; };
    CHECK_THROWS_WITH_AS(replay::eager(stream, "outside", region), doctest::Contains("outside any capture"),
                         replay::usage_error);
    {
      // As inside replay::capture / CaptureScope (the per-thread count they keep).
      ++replay::detail::open_capture_scopes();
      CHECK_THROWS_WITH_AS(replay::eager(stream, "one graph", region), doctest::Contains("replay::capture_piecewise"),
                           replay::usage_error);
      // Its own type, a usage_error: what a ShapeRouter with BreakPolicy::piecewise tells apart.
      CHECK_THROWS_AS(replay::eager(stream, "one graph", region), replay::region_in_capture_error);
      {
        const replay::detail::RegionsInline in_place;  // never inside a capture
        CHECK_THROWS_AS(replay::eager(stream, "one graph", region), replay::region_in_capture_error);
      }
      CHECK_THROWS_WITH_AS((void)replay::capture_piecewise(stream, [](replay::StreamRef) {}),
                           doctest::Contains("inside a stream capture"), replay::usage_error);
      --replay::detail::open_capture_scopes();
    }
    {
      replay::detail::RegionRunning in_region;
      CHECK_THROWS_WITH_AS(replay::eager(stream, "nested", region), doctest::Contains("inside a region"),
                           replay::usage_error);
      CHECK_THROWS_WITH_AS((void)replay::capture_piecewise(stream, [](replay::StreamRef) {}),
                           doctest::Contains("inside a region"), replay::usage_error);
    }
    CHECK(ran == 0);
    CHECK(replay::detail::piecewise_thread_state().regions_running == 0);
    {
      // A ShapeRouter's eager run of its work: the region runs in place, its value returned.
      const replay::detail::RegionsInline in_place;
      replay::eager(stream, "in place", region);
      CHECK(ran == 1);
      CHECK(replay::eager(stream, "value", [](replay::StreamRef) { return 7; }) == 7);
      {
        replay::detail::RegionRunning in_region;  // still refused inside a region
        CHECK_THROWS_WITH_AS(replay::eager(stream, "nested", region), doctest::Contains("inside a region"),
                             replay::usage_error);
      }
    }
    CHECK(replay::detail::piecewise_thread_state().regions_inline == 0);
    CHECK(replay::detail::piecewise_thread_state().regions_running == 0);
    // run_eagerly: the same work, without a capture, its regions in place; the message of a stray break names it.
    CHECK(replay::run_eagerly(stream, [&](replay::StreamRef s) {
            replay::eager(s, "in place", region);
            return replay::eager(s, "value", [](replay::StreamRef) { return 9; });
          }) == 9);
    CHECK(ran == 2);
    CHECK(replay::detail::piecewise_thread_state().regions_inline == 0);
    CHECK_THROWS_WITH_AS(replay::eager(stream, "stray", region), doctest::Contains("replay::run_eagerly"),
                         replay::usage_error);
    CHECK(ran == 2);
    replay::PiecewiseOptions no_paths;
    no_paths.max_paths = 0;
    CHECK_THROWS_WITH_AS((void)replay::capture_piecewise(stream, [](replay::StreamRef) {}, no_paths),
                         doctest::Contains("max_paths"), replay::usage_error);
    CHECK_THROWS_WITH_AS((void)replay::capture_piecewise(replay::StreamRef(cudaStreamLegacy), [](replay::StreamRef) {}),
                         doctest::Contains("legacy default stream"), replay::usage_error);
  }
}
