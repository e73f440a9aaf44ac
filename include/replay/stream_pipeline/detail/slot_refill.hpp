#pragma once
#include <replay/detail/require_cxx20.hpp>
// When a producer waiting for a free slot is woken: a lone producer sleeps
// once per several small items instead of once per item.
#include <algorithm>
#include <chrono>
#include <cstddef>

namespace replay::detail {

// Waking a sleeping producer costs it a system call and two context switches
// (a couple of microseconds of its CPU time, and a futex call on the
// completion thread), as much as a small item's whole host budget. So when
// items are delivered every few microseconds, a producer that waits alone is
// woken only once several slots are free (`batch`: a quarter of them, 2 of 8),
// and then submits that many without sleeping: one wake-up for several items,
// while the slots still in flight (at least `keep_in_flight`) keep copy-in,
// compute, copy-out and the host round trip busy.
//
// The batch turns back into a wait for one free slot (wake_at_first_free())
// as soon as anything could make it wait long or wait on itself: a delivery
// that came slowly (delivered()), a second waiting producer (begin_wait()), a
// producer that takes a slot without waiting, and the completion thread going
// to sleep for want of an issued item (the pipeline calls it). It is never
// used while a callback item is in flight, since a callback is user code that
// may wait for this very producer. What is left to wait for is the device
// finishing work already issued, which depends on no producer. No timed wait
// is used: a futex wait with a timeout arms a kernel timer per wait, which
// costs more than the wake-ups saved. Everything here is guarded by the
// pipeline's mutex.
class SlotRefill {
 public:
  using clock = ::std::chrono::steady_clock;
  static constexpr ::std::size_t keep_in_flight = 4;  // slots never held back for a batch
  static constexpr ::std::size_t max_batch = 8;
  static constexpr ::std::chrono::nanoseconds fast_delivery{::std::chrono::microseconds(20)};

  // The completion thread delivered an item at `now`: a running average of
  // the time between deliveries (a gap counts at most 1 ms, so that the
  // average recovers within a dozen items after an idle spell). A slow gap
  // ends a batch at once.
  void delivered(clock::time_point now) noexcept {
    const auto gap = ::std::chrono::duration_cast<::std::chrono::nanoseconds>(
        ::std::min<clock::duration>(now - last_delivery_, ::std::chrono::milliseconds(1)));
    interval_ = (3 * interval_ + gap) / 4;
    last_delivery_ = now;
    if (gap >= fast_delivery) {
      wake_at_ = 1;
    }
  }
  ::std::chrono::nanoseconds interval() const noexcept { return interval_; }

  // How many free slots a lone waiter waits for, in a pipeline of `slots`.
  ::std::size_t batch(::std::size_t slots) const noexcept {
    if (slots <= keep_in_flight || interval_ >= fast_delivery) {
      return 1;
    }
    // A quarter of the slots: the other three quarters stay in flight while
    // the woken producer gets back onto a core (tens of microseconds from a
    // deep idle state), so the device does not run dry meanwhile.
    return ::std::max<::std::size_t>(1, ::std::min({slots - keep_in_flight, slots / 4, max_batch}));
  }

  // A producer begins to wait (`may_batch`: no callback item is in flight).
  void begin_wait(::std::size_t slots, bool may_batch) noexcept {
    ++waiters_;
    wake_at_ = waiters_ == 1 && may_batch ? batch(slots) : 1;
  }
  void end_wait() noexcept {
    if (--waiters_ == 0) {
      wake_at_ = 1;
    }
  }
  void wake_at_first_free() noexcept { wake_at_ = 1; }

  ::std::size_t waiters() const noexcept { return waiters_; }
  bool batching() const noexcept { return wake_at_ > 1; }
  // What a waiting producer waits for.
  bool refilled(::std::size_t free_slots) const noexcept { return free_slots >= wake_at_; }
  // Whether `free_slots` free slots must wake a waiter.
  bool should_wake(::std::size_t free_slots) const noexcept { return waiters_ != 0 && free_slots >= wake_at_; }

 private:
  clock::time_point last_delivery_{};
  ::std::chrono::nanoseconds interval_ = fast_delivery;  // not batched until deliveries are seen to be fast
  ::std::size_t waiters_ = 0;
  ::std::size_t wake_at_ = 1;
};

}  // namespace replay::detail
