#pragma once
// Per-thread bookkeeping shared by CaptureScope and the allocating types:
// how many captures this thread has open and in which modes, and frees that
// must wait until they close (cudaFree inside a global or thread-local mode
// capture would invalidate it).
#include <replay/detail/require_cxx20.hpp>

#include <cuda_runtime_api.h>

#include <vector>

#include "replay/error.hpp"

namespace replay::detail {

// Captures open on this thread whose mode is relaxed (allocation is legal there).
inline int& open_relaxed_capture_scopes() noexcept {
  thread_local int depth = 0;
  return depth;
}

// True while this thread has a capture open in which cudaMalloc/cudaFree are illegal.
inline bool allocation_is_illegal_now() noexcept {
  return open_capture_scopes() > open_relaxed_capture_scopes();
}

enum class FreeKind { device, pinned_host };
struct DeferredFree {
  void* ptr;
  FreeKind kind;
};
inline ::std::vector<DeferredFree>& deferred_frees() noexcept {
  thread_local ::std::vector<DeferredFree> pending;
  return pending;
}

inline void free_now(void* ptr, FreeKind kind) noexcept {
  if (kind == FreeKind::device) {
    (void)::cudaFree(ptr);
  } else {
    (void)::cudaFreeHost(ptr);
  }
}

// A running count of buffers freed on this thread while a capture was open.
// The graph being captured may hold their addresses, so
// CaptureScope::finish() refuses a graph during whose capture it grew.
inline int& frees_during_capture() noexcept {
  thread_local int count = 0;
  return count;
}

// Frees now, or after the last open capture on this thread ends (and then
// the capture fails: its graph may use the freed memory).
inline void free_or_defer(void* ptr, FreeKind kind) noexcept {
  if (ptr == nullptr) {
    return;
  }
  if (open_capture_scopes() > 0) {
    ++frees_during_capture();
    try {
      deferred_frees().push_back({ptr, kind});
      return;
    } catch (...) {
      // Out of host memory: leaking is better than invalidating the capture.
      return;
    }
  }
  free_now(ptr, kind);
}

inline void flush_deferred_frees() noexcept {
  if (open_capture_scopes() > 0) {
    return;
  }
  auto& pending = deferred_frees();
  for (const DeferredFree& f : pending) {
    free_now(f.ptr, f.kind);
  }
  pending.clear();
}

}  // namespace replay::detail
