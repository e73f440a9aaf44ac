#pragma once
// ShapeRouter's key table: a map from padded shape to entry, plus, for a
// bucketed router with few bucket shapes, an array indexed by the bucket
// shape's slot (ShapePlan), so that a hit finds its entry with one load
// instead of a hash, a division and a walk through the map's nodes. A hit
// runs between two launches, which evict much of the host's cache: every
// cache line it does not touch is a miss it does not pay.
#include <replay/detail/require_cxx20.hpp>

#include <algorithm>
#include <cstddef>
#include <memory>
#include <vector>

#include "replay/shape_router/detail/shape_plan.hpp"
#include "replay/shape_router/detail/keys.hpp"
#include "replay/shape_router/options.hpp"

namespace replay::detail {

template <class Key, class Entry>
class RouterEntryTable {
  using Plan = ShapePlan<Key>;
  using Map = key_map<Key, ::std::shared_ptr<Entry>>;

 public:
  // Above this many bucket shapes the array is not worth its memory.
  static constexpr ::std::size_t max_slots = 4096;

  using iterator = typename Map::iterator;
  using const_iterator = typename Map::const_iterator;

  // `options` outlives the table (the router's own, never changed).
  explicit RouterEntryTable(const ShapeRouterOptions<Key>& options) noexcept : options_(&options) {}
  // Sets up the array, once the options are validated and before any entry.
  void index_bucket_shapes() {
    if (const ::std::size_t count = Plan::slot_count(*options_, max_slots); count > 0 && count <= max_slots) {
      slots_.assign(count, nullptr);
    }
  }
  RouterEntryTable(const RouterEntryTable&) = delete;
  RouterEntryTable& operator=(const RouterEntryTable&) = delete;

  // The entry of a planned (padded) shape, or null.
  Entry* find(const typename Plan::Planned& planned) const {
    if (planned.slot < slots_.size()) [[likely]] {
      return slots_[planned.slot];
    }
    const auto it = map_.find(planned.shape);
    return it == map_.end() ? nullptr : it->second.get();
  }

  iterator find(const Key& shape) { return map_.find(shape); }
  const_iterator find(const Key& shape) const { return map_.find(shape); }
  iterator begin() { return map_.begin(); }
  iterator end() { return map_.end(); }
  const_iterator end() const { return map_.end(); }
  ::std::size_t size() const noexcept { return map_.size(); }

  void emplace(const Key& shape, const ::std::shared_ptr<Entry>& entry) {
    const auto [it, inserted] = map_.emplace(shape, entry);
    if (inserted) {
      if (const ::std::size_t slot = Plan::slot_of(*options_, shape); slot < slots_.size()) {
        slots_[slot] = it->second.get();
      }
    }
  }
  void erase(const Key& shape) {
    if (const ::std::size_t slot = Plan::slot_of(*options_, shape); slot < slots_.size()) {
      slots_[slot] = nullptr;
    }
    map_.erase(shape);
  }
  void clear() noexcept {
    map_.clear();
    ::std::fill(slots_.begin(), slots_.end(), nullptr);
  }

 private:
  const ShapeRouterOptions<Key>* options_;
  Map map_;
  ::std::vector<Entry*> slots_;  // the entry of each bucket shape, or null; empty: the map alone
};

}  // namespace replay::detail
