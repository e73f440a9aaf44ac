#pragma once
// Per-thread capture bookkeeping: how many captures this thread has open and
// in which modes, and the first call that broke one (recorded by check(), so
// that the scope can name it).
#include <replay/detail/require_cxx20.hpp>

#include <cuda_runtime_api.h>

#include <source_location>
#include <string>

namespace replay::detail {

// The first capture-breaking call seen by check() on this thread while a
// CaptureScope is open, so that the scope can say which call broke it.
struct CaptureBreak {
  bool seen = false;
  ::cudaError_t status = ::cudaSuccess;
  ::std::string api;
  ::std::source_location where;
};
inline CaptureBreak& capture_break() noexcept {
  thread_local CaptureBreak record;
  return record;
}
// CaptureScopes open on this thread (any mode).
inline int& open_capture_scopes() noexcept {
  thread_local int depth = 0;
  return depth;
}

// Captures open on this thread whose mode is relaxed (allocation is legal there).
inline int& open_relaxed_capture_scopes() noexcept {
  thread_local int depth = 0;
  return depth;
}

// True while this thread has a capture open in which cudaMalloc/cudaFree are illegal.
inline bool allocation_is_illegal_now() noexcept {
  return open_capture_scopes() > open_relaxed_capture_scopes();
}

}  // namespace replay::detail
