#pragma once
#include <replay/detail/require_cxx20.hpp>
// The pipeline's fixed-capacity FIFO of slot indices.
#include <cstddef>
#include <vector>

namespace replay::detail {

// Fixed-capacity FIFO of slot indices: never allocates after construction, so
// neither submitting nor completing can fail half-way for lack of memory.
class SlotRing {
 public:
  explicit SlotRing(::std::size_t capacity) : items_(capacity) {}
  bool empty() const noexcept { return count_ == 0; }
  ::std::size_t size() const noexcept { return count_; }
  void push(::std::size_t value) noexcept {
    items_[(head_ + count_) % items_.size()] = value;
    ++count_;
  }
  ::std::size_t front() const noexcept { return items_[head_]; }
  ::std::size_t pop() noexcept {
    const ::std::size_t value = items_[head_];
    head_ = (head_ + 1) % items_.size();
    --count_;
    return value;
  }

 private:
  ::std::vector<::std::size_t> items_;
  ::std::size_t head_ = 0;
  ::std::size_t count_ = 0;
};

}  // namespace replay::detail
