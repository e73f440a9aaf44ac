#pragma once
// Which object of a kind this thread is inside of (holding its lock), so that
// a user callback calling back into the same object is refused with a
// usage_error instead of re-locking a std::mutex (a deadlock). One slot per
// Kind tag, per thread; scopes nest.
#include <replay/detail/require_cxx20.hpp>

#include <utility>

namespace replay::detail {

template <class Kind>
class ReentryGuard {
 public:
  // True when this thread is inside `owner` right now.
  static bool inside(const void* owner) noexcept { return slot() == owner; }

  explicit ReentryGuard(const void* owner) noexcept : previous_(::std::exchange(slot(), owner)) {}
  ReentryGuard(const ReentryGuard&) = delete;
  ReentryGuard& operator=(const ReentryGuard&) = delete;
  ~ReentryGuard() { slot() = previous_; }

 private:
  static const void*& slot() noexcept {
    thread_local const void* owner = nullptr;
    return owner;
  }
  const void* previous_;
};

}  // namespace replay::detail
