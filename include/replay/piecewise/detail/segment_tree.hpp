#pragma once
// The segment tree of a piecewise executable, as policy without CUDA: the
// segments after a region are keyed by the bytes of the value it returned;
// a path (root to leaf) is one sequence of region values. Bounded in paths,
// nodes and allocation bytes with least-recently-launched eviction of paths.
// A template over the segment payload, so the CPU tests run it with a stand-in.
#include <replay/detail/require_cxx20.hpp>

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "replay/piecewise/options.hpp"

namespace replay::detail {

// A payload stored per segment: movable, and says what it costs.
template <class S>
concept PiecewiseSegmentPayload = ::std::move_constructible<S> && requires(const S& segment) {
  { segment.cost() } -> ::std::convertible_to<SegmentCost>;
};

template <PiecewiseSegmentPayload Segment>
class SegmentTree {
 public:
  struct Node {
    explicit Node(Segment s) : segment(::std::move(s)) {}
    Segment segment;
    // The segments after this one's region, by the bytes of the region's value.
    // Empty for the last segment of a path.
    ::std::map<::std::string, ::std::unique_ptr<Node>, ::std::less<>> children;
    Node* parent = nullptr;
    ::std::string key;  // this node's key in its parent
    ::std::uint64_t last_used = 0;
  };

  // Where bounds left a new path: kept (evicting `evicted` others), or dropped
  // because it alone exceeds a bound (`exceeded` names which).
  struct Admission {
    ::std::size_t evicted = 0;
    const char* exceeded = nullptr;
  };

  Node* root() const noexcept { return root_.get(); }
  bool empty() const noexcept { return root_ == nullptr; }
  ::std::size_t paths() const noexcept { return paths_; }
  ::std::size_t segments() const noexcept { return segments_; }
  SegmentCost cost() const noexcept { return cost_; }

  static Node* child(const Node& node, ::std::string_view key) {
    const auto it = node.children.find(key);
    return it == node.children.end() ? nullptr : it->second.get();
  }

  // A chain of new nodes, each the only child of the one before (a path's new tail).
  static ::std::unique_ptr<Node> make_node(Segment segment) { return ::std::make_unique<Node>(::std::move(segment)); }
  static Node* append(Node& tail, ::std::string key, ::std::unique_ptr<Node> next) {
    next->parent = &tail;
    next->key = key;
    Node* out = next.get();
    tail.children.emplace(::std::move(key), ::std::move(next));
    return out;
  }

  // Hangs `chain` under `parent` at `key` (or makes it the root when parent is
  // null); returns the chain's leaf. The chain's nodes are counted here.
  Node* attach(Node* parent, ::std::string key, ::std::unique_ptr<Node> chain) {
    Node* leaf = chain.get();
    for (Node* n = leaf; n != nullptr;) {
      add_cost(n->segment.cost(), +1);
      ++segments_;
      leaf = n;
      n = n->children.empty() ? nullptr : n->children.begin()->second.get();
    }
    ++paths_;
    if (parent == nullptr) {
      root_ = ::std::move(chain);
    } else {
      append(*parent, ::std::move(key), ::std::move(chain));
    }
    return leaf;
  }

  // Marks the path ending at `leaf` as the most recently launched.
  void touch(Node* leaf) noexcept {
    const ::std::uint64_t now = ++clock_;
    for (Node* n = leaf; n != nullptr; n = n->parent) {
      n->last_used = now;
    }
  }

  // Brings the tree within `bounds`, evicting least recently launched paths
  // other than the one ending at `keep`; when that is not enough (the kept
  // path alone is over a bound) the kept path is dropped too and the bound it
  // exceeds is returned.
  Admission admit(Node* keep, const PiecewiseOptions& bounds) {
    Admission out;
    while (const char* over = over_bound(bounds)) {
      Node* victim = least_recent_leaf(root_.get(), keep);
      if (victim == nullptr) {
        remove_path(keep);
        out.exceeded = over;
        return out;
      }
      remove_path(victim);
      ++out.evicted;
    }
    return out;
  }

  // Removes the path ending at `leaf`, and every node that only it used.
  void remove_path(Node* leaf) {
    --paths_;
    Node* n = leaf;
    while (n != nullptr && n->children.empty()) {
      add_cost(n->segment.cost(), -1);
      --segments_;
      Node* parent = n->parent;
      if (parent == nullptr) {
        root_.reset();
        return;
      }
      const ::std::string key = n->key;  // a copy: erasing destroys n
      parent->children.erase(key);
      n = parent;
    }
  }

  void clear() noexcept {
    root_.reset();
    paths_ = 0;
    segments_ = 0;
    cost_ = {};
  }

 private:
  const char* over_bound(const PiecewiseOptions& bounds) const noexcept {
    if (paths_ > bounds.max_paths) {
      return "max_paths";
    }
    if (cost_.nodes > bounds.max_nodes) {
      return "max_nodes";
    }
    if (cost_.alloc_bytes > bounds.max_alloc_bytes) {
      return "max_alloc_bytes";
    }
    return nullptr;
  }
  static Node* least_recent_leaf(Node* node, const Node* keep) noexcept {
    if (node == nullptr) {
      return nullptr;
    }
    if (node->children.empty()) {
      return node == keep ? nullptr : node;
    }
    Node* best = nullptr;
    for (auto& [key, child] : node->children) {
      Node* candidate = least_recent_leaf(child.get(), keep);
      if (candidate != nullptr && (best == nullptr || candidate->last_used < best->last_used)) {
        best = candidate;
      }
    }
    return best;
  }
  void add_cost(const SegmentCost& c, int sign) noexcept {
    if (sign > 0) {
      cost_.nodes += c.nodes;
      cost_.alloc_bytes += c.alloc_bytes;
    } else {
      cost_.nodes -= c.nodes;
      cost_.alloc_bytes -= c.alloc_bytes;
    }
  }

  ::std::unique_ptr<Node> root_;
  ::std::size_t paths_ = 0;
  ::std::size_t segments_ = 0;
  SegmentCost cost_;
  ::std::uint64_t clock_ = 0;
};

}  // namespace replay::detail
