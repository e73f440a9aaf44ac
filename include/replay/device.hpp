#pragma once
// Device discovery. Any error from cudaGetDeviceCount (no driver, driver too
// old, no GPU) means "no device": code that can run without a GPU asks
// has_device() first instead of catching.
#include <replay/detail/require_cxx20.hpp>

#include <cuda_runtime_api.h>

#include <source_location>

#include "replay/detail/capture_coordinator.hpp"
#include "replay/error.hpp"

namespace replay {

// Number of visible CUDA devices; 0 on any error. The failed query is cleared
// from the runtime's last-error slot so that it cannot surface later.
inline int device_count() noexcept {
  int count = 0;
  if (const ::cudaError_t status = ::cudaGetDeviceCount(&count); status != ::cudaSuccess) {
    detail::clear_error_slot(status);
    return 0;
  }
  return count;
}

inline bool has_device() noexcept { return device_count() > 0; }

inline int current_device(::std::source_location where = ::std::source_location::current()) {
  int device = 0;
  check(::cudaGetDevice(&device), "cudaGetDevice", where);
  return device;
}

// cudaDeviceSynchronize on the current device, once no capture that replay
// made (CaptureScope, capture(), ShapeRouter, GraphedCallable) is open on it
// in any thread: a device-wide synchronization during another thread's
// capture would invalidate that capture. New replay captures on the device
// wait while it synchronizes. Refused while this thread has a capture open.
inline void synchronize_device(::std::source_location where = ::std::source_location::current()) {
  if (detail::open_capture_scopes() > 0) {
    throw usage_error("synchronize_device() called while a CaptureScope is open on this thread; "
                      "it would invalidate the capture. Synchronize after finish()",
                      where);
  }
  detail::CaptureCoordinator::instance().synchronize(where);
}

}  // namespace replay
