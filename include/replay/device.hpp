#pragma once
#include <replay/detail/require_cxx20.hpp>

// Device discovery. "No device" means exactly two things: no GPU
// (cudaErrorNoDevice) or no NVIDIA driver at all (cudaErrorInsufficientDriver
// while cudaDriverGetVersion reports 0, which the runtime documents as "no
// driver is installed"). Code that can run without a GPU asks has_device()
// first. Every other failure of cudaGetDeviceCount (a driver older than the
// runtime, cudaErrorSystemNotReady while a fabric manager is down, a stub
// libcuda on the library path, ...) is a broken set-up, not a missing one, and
// throws cuda_error with the real status.
#include <cuda_runtime_api.h>

#include <source_location>
#include <string_view>

#include "replay/detail/capture_state.hpp"
#include "replay/detail/capture_coordinator.hpp"
#include "replay/error.hpp"

namespace replay {

// Said when there is no GPU or no driver (not when one is broken).
inline constexpr ::std::string_view no_device_message = "no CUDA GPU or NVIDIA driver found";

namespace detail {

// True when a failed cudaGetDeviceCount means "no GPU or no driver".
// driver_version is what cudaDriverGetVersion returned (0: no driver installed).
constexpr bool means_no_device(::cudaError_t status, int driver_version) noexcept {
  return status == ::cudaErrorNoDevice ||
         (status == ::cudaErrorInsufficientDriver && driver_version == 0);
}

// The runtime calls device_count() makes, as one type so that the policy
// above is tested on the CPU with a stand-in.
struct CudaDeviceQuery {
  static ::cudaError_t get_device_count(int* count) noexcept { return ::cudaGetDeviceCount(count); }
  static int driver_version() noexcept {
    int version = 0;
    if (!succeeded(::cudaDriverGetVersion(&version))) {
      return -1;  // unknown: not "no driver"
    }
    return version;
  }
  static void clear_last_error(::cudaError_t status) noexcept { clear_error_slot(status); }
};

template <class Query>
int device_count_with(Query& query, ::std::source_location where) {
  int count = 0;
  const ::cudaError_t status = query.get_device_count(&count);
  if (status == ::cudaSuccess) {
    return count;
  }
  // The failed query is replay's own: leave no trace of it in the last-error slot.
  query.clear_last_error(status);
  if (means_no_device(status, query.driver_version())) {
    return 0;
  }
  throw cuda_error(status, "cudaGetDeviceCount", where,
                   "the CUDA driver or GPU is present but not usable; this is not the same as "
                   "having no GPU (see the status above)");
}

}  // namespace detail

// Number of visible CUDA devices: 0 when there is no GPU or no driver; throws
// cuda_error when a driver or GPU is there but broken (see the top of this file).
inline int device_count(::std::source_location where = ::std::source_location::current()) {
  detail::CudaDeviceQuery query;
  return detail::device_count_with(query, where);
}

// device_count() > 0; throws like device_count() on a broken set-up.
inline bool has_device(::std::source_location where = ::std::source_location::current()) {
  return device_count(where) > 0;
}

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
