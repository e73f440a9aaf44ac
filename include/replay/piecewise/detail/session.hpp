#pragma once
// The link between replay::eager and the piecewise capture open on this
// thread: a per-thread pointer to the capture taking breaks, how many regions
// this thread is running, and a region's callable with its value as bytes.
#include <replay/detail/require_cxx20.hpp>

#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <source_location>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include "replay/stream_ref.hpp"

namespace replay::detail {

// A region's (or a piecewise capture's work) callable, type-erased and
// move-only: called with the stream, it writes its return value's bytes
// into `value` (nothing for void).
class PiecewiseCallable {
 public:
  PiecewiseCallable() = default;
  template <class Fn>
  static PiecewiseCallable make(Fn&& fn) {
    PiecewiseCallable out;
    out.impl_ = ::std::make_unique<impl<::std::decay_t<Fn>>>(::std::forward<Fn>(fn));
    return out;
  }
  explicit operator bool() const noexcept { return impl_ != nullptr; }
  void operator()(StreamRef stream, ::std::string& value) const { impl_->run(stream, value); }

 private:
  struct base {
    virtual ~base() = default;
    virtual void run(StreamRef stream, ::std::string& value) = 0;
  };
  template <class Fn>
  struct impl final : base {
    template <class F>
    explicit impl(F&& f) : fn(::std::forward<F>(f)) {}
    void run(StreamRef stream, ::std::string& value) override {
      using Value = ::std::invoke_result_t<Fn&, StreamRef>;
      if constexpr (::std::is_void_v<Value>) {
        ::std::invoke(fn, stream);
        value.clear();
      } else {
        const Value result = ::std::invoke(fn, stream);
        value.assign(reinterpret_cast<const char*>(&result), sizeof(Value));
      }
    }
    Fn fn;
  };
  ::std::unique_ptr<base> impl_;
};

// What replay::eager hands a break to: the piecewise capture open on this thread.
class PiecewiseBreaks {
 public:
  // Ends the current segment, runs (or, replaying a prefix, recalls) the
  // region, writes its value's bytes into `value` and begins the next segment.
  virtual void take_break(StreamRef stream, ::std::string_view name, PiecewiseCallable&& region,
                          ::std::string& value, const ::std::source_location& where) = 0;

 protected:
  ~PiecewiseBreaks() = default;
};

struct PiecewiseThreadState {
  PiecewiseBreaks* capture = nullptr;  // the piecewise capture open on this thread, if any
  int regions_running = 0;             // regions this thread is inside of (captures and launches)
  int regions_inline = 0;              // > 0: outside any capture, replay::eager runs its region in place
};
inline PiecewiseThreadState& piecewise_thread_state() noexcept {
  thread_local PiecewiseThreadState state;
  return state;
}

// Counts a region as running on this thread while it lives.
class RegionRunning {
 public:
  RegionRunning() noexcept { ++piecewise_thread_state().regions_running; }
  RegionRunning(const RegionRunning&) = delete;
  RegionRunning& operator=(const RegionRunning&) = delete;
  ~RegionRunning() { --piecewise_thread_state().regions_running; }
};

// While it lives, replay::eager outside any capture on this thread runs its
// region in place instead of refusing: a ShapeRouter's eager runs of a work
// that declares breaks (warm-ups, keys that run eagerly).
class RegionsInline {
 public:
  RegionsInline() noexcept { ++piecewise_thread_state().regions_inline; }
  RegionsInline(const RegionsInline&) = delete;
  RegionsInline& operator=(const RegionsInline&) = delete;
  ~RegionsInline() { --piecewise_thread_state().regions_inline; }
};

// Makes `capture` the one replay::eager reaches on this thread while it lives.
class BreaksInstalled {
 public:
  explicit BreaksInstalled(PiecewiseBreaks* capture) noexcept : previous_(piecewise_thread_state().capture) {
    piecewise_thread_state().capture = capture;
  }
  BreaksInstalled(const BreaksInstalled&) = delete;
  BreaksInstalled& operator=(const BreaksInstalled&) = delete;
  ~BreaksInstalled() { piecewise_thread_state().capture = previous_; }

 private:
  PiecewiseBreaks* previous_;
};

// "stream 0x7f..": streams named in messages.
inline ::std::string describe_piecewise_stream(StreamRef stream) {
  char text[40];
  ::std::snprintf(text, sizeof text, "stream %p", static_cast<void*>(stream.get()));
  return text;
}

}  // namespace replay::detail
