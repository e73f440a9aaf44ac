#pragma once
// EventRef: a view of a CUDA event. Event: an owning, move-only CUDA event. Non-timing by default (cheaper to
// record and wait on; what fork/join and pipelines need); Event::timing() for
// measurements.
#include <replay/detail/require_cxx20.hpp>

#include <cuda_runtime_api.h>

#include <cstddef>
#include <source_location>
#include <utility>

#include "replay/detail/capture_state.hpp"
#include "replay/detail/message.hpp"
#include "replay/detail/unique_handle.hpp"
#include "replay/error.hpp"
#include "replay/flags.hpp"
#include "replay/stream_ref.hpp"

namespace replay {

enum class EventFlags : unsigned int {
  timing = cudaEventDefault,
  blocking_sync = cudaEventBlockingSync,
  disable_timing = cudaEventDisableTiming,
  interprocess = cudaEventInterprocess,
};
template <>
inline constexpr bool enable_bitmask<EventFlags> = true;

// A non-owning view of a cudaEvent_t: record, wait, query. An Event is one.
class EventRef {
 public:
  explicit constexpr EventRef(::cudaEvent_t event) noexcept : event_(event) {}
  EventRef(int) = delete;
  EventRef(::std::nullptr_t) = delete;

  constexpr ::cudaEvent_t get() const noexcept { return event_; }

  // The handle; usage_error on a moved-from Event.
  ::cudaEvent_t handle(::std::source_location where = ::std::source_location::current()) const {
    if (event_ == nullptr) [[unlikely]] {
      throw_used_after_move(where);
    }
    return event_;
  }

  void record(StreamRef stream, ::std::source_location where = ::std::source_location::current()) const {
    check(::cudaEventRecord(handle(where), stream.handle(where)), "cudaEventRecord", where);
  }

  // Makes `waiter` wait, on the device, for the work recorded in this event.
  void wait_on(StreamRef waiter, ::std::source_location where = ::std::source_location::current()) const {
    check(::cudaStreamWaitEvent(waiter.handle(where), handle(where), 0), "cudaStreamWaitEvent", where);
  }

  // True when the recorded work is done. Refused while a capture is open on
  // this thread: querying a captured event invalidates the capture.
  bool ready(::std::source_location where = ::std::source_location::current()) const {
    refuse_during_capture("ready()", where);
    const ::cudaError_t status = ::cudaEventQuery(handle(where));
    if (status == ::cudaErrorNotReady) {
      return false;  // an answer, not an error: the last-error slot is left alone
    }
    check(status, "cudaEventQuery", where);
    return true;
  }

  void synchronize(::std::source_location where = ::std::source_location::current()) const {
    refuse_during_capture("synchronize()", where);
    check(::cudaEventSynchronize(handle(where)), "cudaEventSynchronize", where);
  }

  friend constexpr bool operator==(EventRef a, EventRef b) noexcept { return a.event_ == b.event_; }

 private:
  [[noreturn, gnu::cold, gnu::noinline]] static void throw_used_after_move(const ::std::source_location& where) {
    throw usage_error("Event used after move (or after release())", where);
  }
  static void refuse_during_capture(const char* what, const ::std::source_location& where) {
    if (detail::open_capture_scopes() > 0) {
      throw usage_error(detail::concat("Event::", what,
                                       " called while a CaptureScope is open on this thread; it would invalidate "
                                       "the capture"),
                        where);
    }
  }

  ::cudaEvent_t event_;
};

namespace detail {
struct event_traits {
  using handle_type = ::cudaEvent_t;
  static constexpr ::cudaEvent_t empty() noexcept { return nullptr; }
  static void destroy(::cudaEvent_t event) noexcept { (void)::cudaEventDestroy(event); }
};
}  // namespace detail

// An owning, move-only cudaEvent_t, and an EventRef.
class Event : public detail::unique_handle<EventRef, detail::event_traits> {
  using base = detail::unique_handle<EventRef, detail::event_traits>;

 public:
  explicit Event(EventFlags flags = EventFlags::disable_timing,
                 ::std::source_location where = ::std::source_location::current())
      : base(create(flags, where)), flags_(flags) {}
  [[nodiscard]] static Event timing(::std::source_location where = ::std::source_location::current()) {
    return Event(EventFlags::timing, where);
  }
  // Adopts an event created elsewhere; `flags` must describe how it was made.
  [[nodiscard]] static Event from_native_handle(::cudaEvent_t event,
                                                EventFlags flags = EventFlags::disable_timing) noexcept {
    return Event(event, flags, adopt_tag{});
  }
  static Event from_native_handle(int, EventFlags = EventFlags::disable_timing) = delete;
  static Event from_native_handle(::std::nullptr_t, EventFlags = EventFlags::disable_timing) = delete;

  Event(Event&&) noexcept = default;
  Event& operator=(Event&&) noexcept = default;
  ~Event() = default;

  EventFlags flags() const noexcept { return flags_; }
  bool is_timing() const noexcept { return !has_flag(flags_, EventFlags::disable_timing); }

  // Milliseconds between two recorded timing events.
  [[nodiscard]] static float elapsed_ms(const Event& start, const Event& stop,
                                        ::std::source_location where = ::std::source_location::current()) {
    if (!start.is_timing() || !stop.is_timing()) {
      throw usage_error("Event::elapsed_ms needs two timing events (Event::timing())", where);
    }
    float ms = 0.0F;
    check(::cudaEventElapsedTime(&ms, start.handle(where), stop.handle(where)), "cudaEventElapsedTime", where);
    return ms;
  }

 private:
  struct adopt_tag {};
  Event(::cudaEvent_t event, EventFlags flags, adopt_tag) noexcept : base(event), flags_(flags) {}

  static ::cudaEvent_t create(EventFlags flags, const ::std::source_location& where) {
    ::cudaEvent_t event = nullptr;
    check(::cudaEventCreateWithFlags(&event, to_underlying(flags)), "cudaEventCreateWithFlags", where);
    return event;
  }

  EventFlags flags_ = EventFlags::disable_timing;
};

}  // namespace replay
