#pragma once
// Errors. Every CUDA call goes through check(), which throws cuda_error naming
// the API, the status (name, number, text) and the caller's source location.
// Misuse of replay itself (bad sizes, use after move, calls that are illegal
// during capture) throws usage_error, before any CUDA call is made.
#include <replay/detail/require_cxx20.hpp>

#include <cuda_runtime_api.h>

#include <source_location>
#include <stdexcept>
#include <string>
#include <string_view>

#include "replay/detail/capture_state.hpp"
#include "replay/detail/message.hpp"

namespace replay {

// "file:line (function)", used in every message. A line in the standard
// library (the call came through std::make_unique, emplace and the like)
// says so, and how to name the caller's line instead.
inline ::std::string to_string(const ::std::source_location& where) {
  ::std::string out = where.file_name();
  out += ':';
  out += ::std::to_string(where.line());
  if (detail::is_standard_library_file(where.file_name())) {
    out += " (in the standard library, which made the call: pass std::source_location::current() as its last "
           "argument to name your line)";
    return out;
  }
  if (const char* fn = where.function_name(); fn != nullptr && *fn != '\0') {
    out += " (";
    out += fn;
    out += ')';
  }
  return out;
}

// True for the statuses that a stream capture produces when it is broken or refused.
constexpr bool is_capture_error(::cudaError_t status) noexcept {
  switch (status) {
    case ::cudaErrorStreamCaptureUnsupported:
    case ::cudaErrorStreamCaptureInvalidated:
    case ::cudaErrorStreamCaptureMerge:
    case ::cudaErrorStreamCaptureUnmatched:
    case ::cudaErrorStreamCaptureUnjoined:
    case ::cudaErrorStreamCaptureIsolation:
    case ::cudaErrorStreamCaptureImplicit:
    case ::cudaErrorCapturedEvent:
    case ::cudaErrorStreamCaptureWrongThread:
      return true;
    default:
      return false;
  }
}

// The explanation appended to capture errors: the status alone ("operation not
// permitted when stream is capturing") does not tell a user what to change.
inline constexpr ::std::string_view capture_error_hint =
    "the stream capture was invalidated; likely causes: a synchronizing call on a capturing "
    "stream (cudaStreamSynchronize, cudaDeviceSynchronize, cudaEventSynchronize, cudaStreamQuery, "
    "a synchronous cudaMemcpy), an allocation or free (cudaMalloc, cudaFree, cudaMallocHost) "
    "while the capture mode is global or thread-local, work on the legacy default stream "
    "(stream 0) while another stream captures, an event wait that crosses captures, or ending "
    "the capture on another thread or before every forked stream was joined";

namespace detail {

// A failed runtime call also leaves its status in the runtime's last-error
// slot, where a later check_last_launch() would pick it up and blame an
// innocent kernel launch. These take replay's own failure back out of the
// slot, and only when the slot holds it: an error that other code left there
// is not replay's to clear. (Sticky errors stay; CUDA keeps those.)
inline void clear_error_slot(::cudaError_t status) noexcept {
  if (status != ::cudaSuccess && ::cudaPeekAtLastError() == status) {
    (void)::cudaGetLastError();
  }
}
// For calls whose failure is handled rather than thrown: true on success, and
// a failure is taken back out of the slot.
inline bool succeeded(::cudaError_t status) noexcept {
  clear_error_slot(status);
  return status == ::cudaSuccess;
}
// The explanation appended when there is no usable GPU or driver. Without a
// driver the runtime says "CUDA driver version is insufficient for CUDA
// runtime version", which reads as if an old driver were installed.
inline ::std::string status_hint(::cudaError_t status) {
  if (status == ::cudaErrorNoDevice) {
    return "no NVIDIA GPU was found, or none is visible to this process (check nvidia-smi and "
           "CUDA_VISIBLE_DEVICES)";
  }
  if (status != ::cudaErrorInsufficientDriver) {
    return {};
  }
  int driver = 0;
  if (!succeeded(::cudaDriverGetVersion(&driver)) || driver == 0) {
    return "no NVIDIA driver (or no GPU) was found; the runtime words this as 'CUDA driver version is "
           "insufficient for CUDA runtime version'";
  }
  return concat("the NVIDIA driver supports CUDA up to ", driver / 1000, ".", driver % 1000 / 10,
                ", older than this program's CUDA runtime ", CUDART_VERSION / 1000, ".", CUDART_VERSION % 1000 / 10,
                ": update the driver (nvidia-smi shows its version)");
}

}  // namespace detail

// Whether a capture error's message ends with capture_error_hint's list of
// likely causes: `omitted` when its context already names the cause (the
// capture audit's verdict), so the message ends at the named cause.
enum class CaptureErrorHint { likely_causes, omitted };

// A failed CUDA runtime call.
class cuda_error : public ::std::runtime_error {
 public:
  // `status` returned by `api` at `where`; `context` is appended to the
  // message, and `hint` says whether a capture error's message ends with the
  // list of likely causes (left out when `context` names the cause).
  cuda_error(::cudaError_t status, ::std::string_view api,
             ::std::source_location where = ::std::source_location::current(),
             ::std::string_view context = {}, CaptureErrorHint hint = CaptureErrorHint::likely_causes)
      : ::std::runtime_error(format(status, api, where, context, hint)),
        status_(status),
        api_(api),
        where_(where) {}

  ::cudaError_t status() const noexcept { return status_; }
  const ::std::string& api() const noexcept { return api_; }
  const char* error_name() const noexcept { return ::cudaGetErrorName(status_); }
  const char* error_string() const noexcept { return ::cudaGetErrorString(status_); }
  const ::std::source_location& where() const noexcept { return where_; }
  bool is_capture_error() const noexcept { return replay::is_capture_error(status_); }

 private:
  static ::std::string format(::cudaError_t status, ::std::string_view api,
                              const ::std::source_location& where, ::std::string_view context,
                              CaptureErrorHint capture_hint) {
    ::std::string msg = "replay: ";
    msg += api.empty() ? ::std::string_view("CUDA call") : api;
    msg += " failed: ";
    msg += ::cudaGetErrorName(status);
    msg += " (";
    msg += ::std::to_string(static_cast<int>(status));
    msg += "): ";
    msg += ::cudaGetErrorString(status);
    msg += " at ";
    msg += replay::to_string(where);
    if (!context.empty()) {
      msg += "; ";
      msg += context;
    }
    if (replay::is_capture_error(status) && capture_hint == CaptureErrorHint::likely_causes) {
      msg += "; ";
      msg += capture_error_hint;
    }
    if (const ::std::string hint = detail::status_hint(status); !hint.empty()) {
      msg += "; ";
      msg += hint;
    }
    return msg;
  }

  ::cudaError_t status_;
  ::std::string api_;
  ::std::source_location where_;
};

// Misuse of the library: wrong sizes, use after move, a call that is illegal
// during capture, an unknown key. Detected before any CUDA call is made.
class usage_error : public ::std::logic_error {
 public:
  explicit usage_error(::std::string_view what, ::std::source_location where = ::std::source_location::current())
      : ::std::logic_error(detail::concat("replay: ", what, " at ", replay::to_string(where))), where_(where) {}
  const ::std::source_location& where() const noexcept { return where_; }

 private:
  ::std::source_location where_;
};

namespace detail {

// The same for an error of a kind replay caused, e.g. is_capture_error after a
// capture replay opened broke.
template <class IsOurs>
void clear_error_slot_if(IsOurs is_ours) noexcept {
  if (const ::cudaError_t status = ::cudaPeekAtLastError(); status != ::cudaSuccess && is_ours(status)) {
    (void)::cudaGetLastError();
  }
}

// Where a failed status came from: a runtime call (which also left it in the
// runtime's last-error slot) or a driver call (which never touches that slot).
enum class ErrorSource : unsigned char { runtime, driver };

[[noreturn, gnu::cold, gnu::noinline]] inline void throw_cuda_error(::cudaError_t status,
                                                                   ::std::string_view api,
                                                                   ::std::source_location where,
                                                                   ErrorSource source = ErrorSource::runtime) {
  // The exception reports this failure; leave no copy of it behind. A driver
  // failure left nothing in the runtime's slot: whatever is there is someone
  // else's (possibly with the same code) and stays.
  if (source == ErrorSource::runtime) {
    clear_error_slot(status);
  }
  if (is_capture_error(status) && open_capture_scopes() > 0) {
    CaptureBreak& record = capture_break();
    if (!record.seen) {
      record = CaptureBreak{true, status, ::std::string(api), where};
    }
  }
  throw cuda_error(status, api, where);
}

}  // namespace detail

// Throws cuda_error unless status is cudaSuccess. The fast path is one compare.
inline void check(::cudaError_t status, ::std::string_view api,
                  ::std::source_location where = ::std::source_location::current()) {
  if (status != ::cudaSuccess) [[unlikely]] {
    detail::throw_cuda_error(status, api, where);
  }
}

// For kernel launches: picks up a launch configuration error (cudaGetLastError).
inline void check_last_launch(::std::string_view what = "kernel launch",
                              ::std::source_location where = ::std::source_location::current()) {
  check(::cudaGetLastError(), what, where);
}

}  // namespace replay
