#pragma once
// StreamRef: a non-owning view of a cudaStream_t, cheap to copy and pass by
// value. Built from a cudaStream_t (including the special handles
// cudaStreamLegacy and cudaStreamPerThread); built from a literal 0 or nullptr
// it is refused at compile time, because "which stream did you mean?" is a
// common source of accidental legacy-stream work during capture. A Stream is a
// StreamRef; a moved-from Stream holds an invalid handle, which every replay
// call refuses with usage_error before it reaches CUDA.
#include <replay/detail/require_cxx20.hpp>

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <source_location>

#include "replay/error.hpp"

namespace replay {

enum class CaptureStatus {
  none = ::cudaStreamCaptureStatusNone,
  active = ::cudaStreamCaptureStatusActive,
  invalidated = ::cudaStreamCaptureStatusInvalidated,
};

namespace detail {
// What a moved-from or released Stream holds: never a stream CUDA made (and
// not the legacy stream, as a null handle would be).
inline ::cudaStream_t invalid_stream() noexcept {
  return reinterpret_cast<::cudaStream_t>(~::std::uintptr_t{0});  // NOLINT: a sentinel, never dereferenced
}
[[noreturn, gnu::cold, gnu::noinline]] inline void throw_stream_used_after_move(const ::std::source_location& where) {
  throw usage_error("Stream used after move (or after release())", where);
}
}  // namespace detail

class StreamRef {
 public:
  constexpr StreamRef(::cudaStream_t stream) noexcept : stream_(stream) {}  // NOLINT: implicit by design
  StreamRef(int) = delete;
  StreamRef(::std::nullptr_t) = delete;

  constexpr ::cudaStream_t get() const noexcept { return stream_; }
  // The handle, for a CUDA call; usage_error when it is a moved-from Stream's.
  ::cudaStream_t handle(::std::source_location where = ::std::source_location::current()) const {
    if (stream_ == detail::invalid_stream()) [[unlikely]] {
      detail::throw_stream_used_after_move(where);
    }
    return stream_;
  }

  // cudaStreamIsCapturing for this stream.
  CaptureStatus capture_status(::std::source_location where = ::std::source_location::current()) const {
    ::cudaStreamCaptureStatus status = ::cudaStreamCaptureStatusNone;
    check(::cudaStreamIsCapturing(handle(where), &status), "cudaStreamIsCapturing", where);
    return static_cast<CaptureStatus>(status);
  }
  bool is_capturing(::std::source_location where = ::std::source_location::current()) const {
    return capture_status(where) != CaptureStatus::none;
  }

  // Blocks until the stream's work is done. Refused (usage_error) while the
  // stream is capturing, where CUDA would invalidate the capture.
  void synchronize(::std::source_location where = ::std::source_location::current()) const {
    refuse_during_capture("synchronize()", where);
    check(::cudaStreamSynchronize(stream_), "cudaStreamSynchronize", where);
  }

  // True when all work on the stream is done (cudaStreamQuery). Refused during capture.
  bool ready(::std::source_location where = ::std::source_location::current()) const {
    refuse_during_capture("ready()", where);
    const ::cudaError_t status = ::cudaStreamQuery(stream_);
    if (status == ::cudaErrorNotReady) {
      // Not-ready is an answer: it never set the runtime's last-error slot, so
      // the slot is left alone (it may hold the user's own pending error).
      return false;
    }
    check(status, "cudaStreamQuery", where);
    return true;
  }

  int priority(::std::source_location where = ::std::source_location::current()) const {
    int value = 0;
    check(::cudaStreamGetPriority(handle(where), &value), "cudaStreamGetPriority", where);
    return value;
  }

  friend constexpr bool operator==(StreamRef a, StreamRef b) noexcept { return a.stream_ == b.stream_; }

 private:
  void refuse_during_capture(const char* what, const ::std::source_location& where) const {
    if (capture_status(where) != CaptureStatus::none) {
      throw usage_error(detail::concat("StreamRef::", what,
                                       " called on a stream that is capturing; it would invalidate the capture. "
                                       "Call it after CaptureScope::finish()"),
                        where);
    }
  }

  ::cudaStream_t stream_;
};

}  // namespace replay
