#pragma once
#include <replay/detail/require_cxx20.hpp>
// SlotTable: the cache slots and the sequence living in each. A sequence is
// placed into the lowest free slot and taken out when it ends; a slot holds
// one sequence at a time by construction. Used by the worker thread only.
#include <cstddef>
#include <optional>
#include <stdexcept>
#include <utility>
#include <vector>

namespace replay::detail {

template <class T>
class SlotTable {
 public:
  explicit SlotTable(::std::size_t capacity) : slots_(capacity) {}

  ::std::size_t capacity() const noexcept { return slots_.size(); }
  ::std::size_t size() const noexcept { return used_; }
  ::std::size_t free() const noexcept { return slots_.size() - used_; }
  bool occupied(::std::size_t slot) const noexcept { return slots_[slot].has_value(); }

  // Places `value` into the lowest free slot and returns the slot.
  ::std::size_t place(T&& value) {
    for (::std::size_t slot = 0; slot < slots_.size(); ++slot) {
      if (!slots_[slot]) {
        slots_[slot].emplace(::std::move(value));
        ++used_;
        return slot;
      }
    }
    throw ::std::logic_error("replay: DecodeScheduler placed a sequence with no free slot (a scheduler bug)");
  }
  T& operator[](::std::size_t slot) noexcept { return *slots_[slot]; }
  // Frees the slot; returns what it held.
  T take(::std::size_t slot) {
    T value = ::std::move(*slots_[slot]);
    slots_[slot].reset();
    --used_;
    return value;
  }

 private:
  ::std::vector<::std::optional<T>> slots_;
  ::std::size_t used_ = 0;
};

}  // namespace replay::detail
