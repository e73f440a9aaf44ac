#pragma once
// Frees that must wait until this thread's captures close: cudaFree inside a
// global or thread-local mode capture would invalidate it.
#include <replay/detail/require_cxx20.hpp>

#include <cuda_runtime_api.h>

#include <vector>

#include "replay/detail/capture_state.hpp"

namespace replay::detail {

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
  }
  if (allocation_is_illegal_now()) {
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
  if (allocation_is_illegal_now()) {
    return;
  }
  auto& pending = deferred_frees();
  for (const DeferredFree& f : pending) {
    free_now(f.ptr, f.kind);
  }
  pending.clear();
}

}  // namespace replay::detail
