#pragma once
#include <replay/detail/require_cxx20.hpp>
// NCCL errors. Every NCCL call goes through check_nccl(), which throws
// nccl_error naming the call, the result (name, number, ncclGetErrorString),
// NCCL's own last message for the communicator (ncclGetLastError) and the
// caller's source location, like replay::check does for CUDA.
#include <nccl.h>

#include <chrono>
#include <source_location>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

#include "replay/error.hpp"

namespace replay {

// The enumerator's name: "ncclInvalidArgument". By value, so that results
// newer than the NCCL at hand (ncclTimeout is 8) are named too.
constexpr ::std::string_view nccl_result_name(::ncclResult_t result) noexcept {
  switch (static_cast<int>(result)) {
    case 0: return "ncclSuccess";
    case 1: return "ncclUnhandledCudaError";
    case 2: return "ncclSystemError";
    case 3: return "ncclInternalError";
    case 4: return "ncclInvalidArgument";
    case 5: return "ncclInvalidUsage";
    case 6: return "ncclRemoteError";
    case 7: return "ncclInProgress";
    case 8: return "ncclTimeout";
    default: return "ncclResult_t(unknown)";
  }
}

// A failed NCCL call.
class nccl_error : public ::std::runtime_error {
 public:
  // `detail`: NCCL's last message for the communicator, or context; may be empty.
  nccl_error(::ncclResult_t result, ::std::string_view api, ::std::string_view detail = {},
             ::std::source_location where = ::std::source_location::current())
      : ::std::runtime_error(format(result, api, detail, where)),
        result_(result),
        api_(api),
        detail_(detail),
        where_(where) {}

  ::ncclResult_t result() const noexcept { return result_; }
  const ::std::string& api() const noexcept { return api_; }
  // NCCL's last message (ncclGetLastError), or other context; may be empty.
  const ::std::string& detail() const noexcept { return detail_; }
  const char* error_string() const noexcept { return ::ncclGetErrorString(result_); }
  const ::std::source_location& where() const noexcept { return where_; }

  // The message, built the same way for the CPU tests.
  static ::std::string format(::ncclResult_t result, ::std::string_view api, ::std::string_view detail,
                              const ::std::source_location& where) {
    ::std::string msg = "replay: ";
    msg += api.empty() ? ::std::string_view("NCCL call") : api;
    msg += " failed: ";
    msg += nccl_result_name(result);
    msg += " (";
    msg += ::std::to_string(static_cast<int>(result));
    msg += "): ";
    const char* text = ::ncclGetErrorString(result);
    msg += text != nullptr ? text : "unknown NCCL result";
    if (!detail.empty()) {
      msg += " (NCCL: ";
      msg += detail;
      msg += ')';
    }
    msg += " at ";
    msg += replay::to_string(where);
    return msg;
  }

 private:
  ::ncclResult_t result_;
  ::std::string api_;
  ::std::string detail_;
  ::std::source_location where_;
};

// Work of one rank that did not finish in time: a replay the watchdog saw
// overdue, or a bucket agreement some rank never joined.
struct StuckWork {
  int rank = 0;
  int device = 0;
  ::std::string what;    // "replay of bucket 8", "bucket agreement for key 5"
  ::std::chrono::milliseconds waited{0};

  ::std::string describe() const {
    return "rank " + ::std::to_string(rank) + " (device " + ::std::to_string(device) + "): " + what +
           " has not finished after " + ::std::to_string(waited.count()) + " ms";
  }
};

// Thrown instead of hanging: see StuckWork. The communicator involved is
// marked failed (its destructor aborts it).
class timeout_error : public ::std::runtime_error {
 public:
  timeout_error(StuckWork stuck, ::std::string_view hint,
                ::std::source_location where = ::std::source_location::current())
      : ::std::runtime_error("replay: " + stuck.describe() + (hint.empty() ? "" : "; ") + ::std::string(hint) +
                             " at " + replay::to_string(where)),
        stuck_(::std::move(stuck)),
        where_(where) {}
  const StuckWork& stuck() const noexcept { return stuck_; }
  const ::std::source_location& where() const noexcept { return where_; }

 private:
  StuckWork stuck_;
  ::std::source_location where_;
};

namespace detail {

// NCCL's last message for `comm` (or for the process with a null comm); empty if none.
inline ::std::string nccl_last_error(::ncclComm_t comm) noexcept {
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 13, 0)
  try {
    const char* text = ::ncclGetLastError(comm);
    return text != nullptr ? ::std::string(text) : ::std::string();
  } catch (...) {
    return {};
  }
#else
  (void)comm;
  return {};
#endif
}

[[noreturn, gnu::cold, gnu::noinline]] inline void throw_nccl_error(::ncclResult_t result, ::std::string_view api,
                                                                   ::ncclComm_t comm,
                                                                   ::std::source_location where) {
  throw nccl_error(result, api, nccl_last_error(comm), where);
}

}  // namespace detail

// Throws nccl_error unless `result` is ncclSuccess. `comm` (may be null) only
// selects which last-error message NCCL reports. The fast path is one compare.
inline void check_nccl(::ncclResult_t result, ::std::string_view api, ::ncclComm_t comm = nullptr,
                       ::std::source_location where = ::std::source_location::current()) {
  if (result != ::ncclSuccess) [[unlikely]] {
    detail::throw_nccl_error(result, api, comm, where);
  }
}

}  // namespace replay
