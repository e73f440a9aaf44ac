#pragma once
#include <replay/detail/require_cxx20.hpp>
// CompletionFrame: lets a Batcher be destroyed from one of its own
// completions. A completion (or the destruction of a request, which may hold
// the last owner) can end the Batcher while a frame of the Batcher's own code
// is still below it on the same thread: the worker's loop, or shutdown()
// answering cancelled requests. Each such frame registers here; the
// destructor marks the frames of its thread that belong to it, and each
// returns without touching the destroyed object.

namespace replay::detail {

class CompletionFrame {
 public:
  explicit CompletionFrame(const void* owner) noexcept : owner_(owner), outer_(innermost()) { innermost() = this; }
  CompletionFrame(const CompletionFrame&) = delete;
  CompletionFrame& operator=(const CompletionFrame&) = delete;
  ~CompletionFrame() { innermost() = outer_; }

  // True once the owner was destroyed on this thread (by code this frame called).
  bool owner_destroyed() const noexcept { return owner_destroyed_; }

  // Called by the owner's destructor: every frame of this thread that
  // belongs to `owner` must not touch it again. (Frames of other threads
  // cannot exist then: the destructor joined the thread that could hold one.)
  static void mark_destroyed(const void* owner) noexcept {
    for (CompletionFrame* frame = innermost(); frame != nullptr; frame = frame->outer_) {
      if (frame->owner_ == owner) {
        frame->owner_destroyed_ = true;
      }
    }
  }

 private:
  // The frames of this thread, innermost first (they nest like the calls).
  static CompletionFrame*& innermost() noexcept {
    thread_local CompletionFrame* frames = nullptr;
    return frames;
  }

  const void* owner_;
  CompletionFrame* outer_;
  bool owner_destroyed_ = false;
};

}  // namespace replay::detail
