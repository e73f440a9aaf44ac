#pragma once
// Event: an owning, move-only CUDA event. Non-timing by default (cheaper to
// record and wait on; what fork/join and pipelines need); Event::timing() for
// measurements.
#include <replay/detail/require_cxx20.hpp>

#include <cuda_runtime_api.h>

#include <source_location>
#include <utility>

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

class Event {
 public:
  explicit Event(EventFlags flags = EventFlags::disable_timing,
                 ::std::source_location where = ::std::source_location::current())
      : flags_(flags) {
    check(::cudaEventCreateWithFlags(&event_, to_underlying(flags)), "cudaEventCreateWithFlags",
          where);
  }
  [[nodiscard]] static Event timing(::std::source_location where = ::std::source_location::current()) {
    return Event(EventFlags::timing, where);
  }
  // Adopts an event created elsewhere; `flags` must describe how it was made.
  [[nodiscard]] static Event from_native_handle(::cudaEvent_t event,
                                                EventFlags flags = EventFlags::disable_timing) noexcept {
    return Event(event, flags, adopt_tag{});
  }

  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  Event(Event&& other) noexcept
      : event_(::std::exchange(other.event_, nullptr)), flags_(other.flags_) {}
  Event& operator=(Event&& other) noexcept {
    if (this != &other) {
      reset();
      event_ = ::std::exchange(other.event_, nullptr);
      flags_ = other.flags_;
    }
    return *this;
  }
  ~Event() { reset(); }

  [[nodiscard]] ::cudaEvent_t release() noexcept { return ::std::exchange(event_, nullptr); }
  ::cudaEvent_t get() const noexcept { return event_; }
  explicit operator bool() const noexcept { return event_ != nullptr; }
  EventFlags flags() const noexcept { return flags_; }
  bool is_timing() const noexcept { return !has_flag(flags_, EventFlags::disable_timing); }

  void record(StreamRef stream, ::std::source_location where = ::std::source_location::current()) {
    check(::cudaEventRecord(handle(where), stream.get()), "cudaEventRecord", where);
  }

  // Makes `waiter` wait, on the device, for the work recorded in this event.
  void wait_on(StreamRef waiter, ::std::source_location where = ::std::source_location::current()) const {
    check(::cudaStreamWaitEvent(waiter.get(), handle(where), 0), "cudaStreamWaitEvent", where);
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

  // Milliseconds between two recorded timing events.
  [[nodiscard]] static float elapsed_ms(const Event& start, const Event& stop,
                                        ::std::source_location where = ::std::source_location::current()) {
    if (!start.is_timing() || !stop.is_timing()) {
      throw usage_error("Event::elapsed_ms needs two timing events (Event::timing())", where);
    }
    float ms = 0.0F;
    check(::cudaEventElapsedTime(&ms, start.handle(where), stop.handle(where)), "cudaEventElapsedTime",
          where);
    return ms;
  }

 private:
  struct adopt_tag {};
  Event(::cudaEvent_t event, EventFlags flags, adopt_tag) noexcept : event_(event), flags_(flags) {}

  ::cudaEvent_t handle(const ::std::source_location& where) const {
    if (event_ == nullptr) {
      throw usage_error("Event used after move (or after release())", where);
    }
    return event_;
  }
  static void refuse_during_capture(const char* what, const ::std::source_location& where) {
    if (detail::open_capture_scopes() > 0) {
      throw usage_error(::std::string("Event::") + what +
                            " called while a CaptureScope is open on this thread; it would "
                            "invalidate the capture",
                        where);
    }
  }
  void reset() noexcept {
    if (event_ != nullptr) {
      (void)::cudaEventDestroy(event_);
      event_ = nullptr;
    }
  }

  ::cudaEvent_t event_ = nullptr;
  EventFlags flags_ = EventFlags::disable_timing;
};

}  // namespace replay
