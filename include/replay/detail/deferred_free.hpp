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

// Frees now, or after the last open capture on this thread ends.
inline void free_or_defer(void* ptr, FreeKind kind) noexcept {
  if (ptr == nullptr) {
    return;
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
