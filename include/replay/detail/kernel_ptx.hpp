#pragma once
#include <replay/detail/require_cxx20.hpp>
// The PTX a kernel's running code was compiled from, and the refusal of a
// programmatic launch of code compiled from PTX older than 9.0. The wait of
// programmatic dependent launch (griddepcontrol.wait, as in
// replay::wait_for_prerequisite_grid() and cudaGridDependencySynchronize())
// exists only from sm_90: code JIT-compiled on a 9.0 device from compute_80
// PTX has it compiled out and would not wait for its predecessor. Used by
// launch(), the capability queries (programmatic_launch.hpp) and
// GraphBuilder's programmatic edges.
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <source_location>
#include <unordered_map>

#include "replay/detail/device_caps.hpp"
#include "replay/detail/message.hpp"
#include "replay/error.hpp"

namespace replay::detail {

// cudaFuncAttributes::ptxVersion of code compiled for compute_90: major * 10 + minor.
inline constexpr int sm90_ptx_version = 90;

// usage_error when `subject` (the kernel launched programmatically, the
// downstream node of a programmatic edge) runs code compiled from PTX
// `ptx_version` (major * 10 + minor) below 9.0 on `device`, a device of 9.0 or
// newer (older ones are refused first, refuse_below_sm90). Pure, so that the threshold and the message are tested without
// such a kernel.
inline void refuse_ptx_below_sm90(int ptx_version, int device, const char* what, const char* subject,
                                  const char* instead, const ::std::source_location& where) {
  if (ptx_version < sm90_ptx_version) {
    throw usage_error(
        concat(what, ": programmatic stream serialization needs the kernel's code compiled for compute capability "
                     "9.0 or newer; ",
               subject, " runs code JIT-compiled on device ", device, " from PTX ", ptx_version / 10, ".",
               ptx_version % 10, " (compute_", ptx_version,
               "): its waits (replay::wait_for_prerequisite_grid(), cudaGridDependencySynchronize()) were compiled "
               "out, so it would not wait for its predecessor and would read its inputs before they are written; "
               "build it for sm_90 (CMAKE_CUDA_ARCHITECTURES=90, nvcc -arch=sm_90) or ",
               instead),
        where);
  }
}

// cudaFuncGetAttributes(kernel).ptxVersion on the current device, capture-safe:
// the thread's capture mode is relaxed around the query and restored, so a
// query the runtime deems unsafe (the kernel's module loaded on first use)
// does not invalidate this thread's capture or another thread's global-mode
// one. Returns the query's status; `ptx_version` is set on success. A failure
// is left in the error slot, for the caller to throw or clear.
inline ::cudaError_t query_ptx_version(const void* kernel, int& ptx_version, const ::std::source_location& where) {
  ::cudaStreamCaptureMode mode = ::cudaStreamCaptureModeRelaxed;
  check(::cudaThreadExchangeStreamCaptureMode(&mode), "cudaThreadExchangeStreamCaptureMode", where);
  ::cudaFuncAttributes attributes{};
  const ::cudaError_t status = ::cudaFuncGetAttributes(&attributes, kernel);
  const ::cudaError_t restored = ::cudaThreadExchangeStreamCaptureMode(&mode);  // back to the caller's mode
  if (restored != ::cudaSuccess) {
    clear_error_slot(status);
    check(restored, "cudaThreadExchangeStreamCaptureMode", where);
  }
  if (status == ::cudaSuccess) {
    ptx_version = attributes.ptxVersion;
  }
  return status;
}

struct KernelOnDevice {
  const void* kernel = nullptr;
  int device = -1;
  bool operator==(const KernelOnDevice&) const = default;
};

struct KernelOnDeviceHash {
  ::std::size_t operator()(const KernelOnDevice& key) const noexcept {
    return ::std::hash<const void*>{}(key.kernel) ^ (static_cast<::std::size_t>(key.device) * 0x9E3779B97F4A7C15ULL);
  }
};

// The process-wide answers, one query per (kernel, device). The query runs
// outside the lock: two threads may both ask once, and agree.
inline int shared_kernel_ptx_version(const KernelOnDevice& key, const ::std::source_location& where) {
  static ::std::mutex mutex;
  static ::std::unordered_map<KernelOnDevice, int, KernelOnDeviceHash> known;
  {
    const ::std::lock_guard<::std::mutex> lock(mutex);
    if (const auto found = known.find(key); found != known.end()) {
      return found->second;
    }
  }
  int ptx_version = 0;
  check(query_ptx_version(key.kernel, ptx_version, where), "cudaFuncGetAttributes", where);
  const ::std::lock_guard<::std::mutex> lock(mutex);
  return known.try_emplace(key, ptx_version).first->second;
}

// The PTX version `kernel`'s code on `device`, the current device, was
// compiled from (cudaFuncAttributes::ptxVersion), asked once per (kernel,
// device). Each thread keeps its recent answers, so that a launch from many
// threads takes no shared lock once its kernel is known.
inline int kernel_ptx_version(const void* kernel, int device, const ::std::source_location& where) {
  static constexpr ::std::size_t recent_slots = 16;
  struct Recent {
    KernelOnDevice key;
    int ptx_version = 0;
  };
  thread_local Recent recent[recent_slots]{};
  const KernelOnDevice key{kernel, device};
  const auto address = reinterpret_cast<::std::uintptr_t>(kernel);
  Recent& slot = recent[((address >> 4) ^ (address >> 10) ^ static_cast<::std::uintptr_t>(device)) % recent_slots];
  if (slot.key == key) {
    return slot.ptx_version;
  }
  const int ptx_version = shared_kernel_ptx_version(key, where);
  slot = Recent{key, ptx_version};
  return ptx_version;
}

// Whether `kernel` may be launched programmatically on `device`, the current
// device: the device is 9.0 or newer and the kernel's code there was compiled
// for it (programmatic_launch_supported(kernel), and launch()'s resolution of
// ProgrammaticSerialization::where_supported).
inline bool takes_programmatic_launch(const void* kernel, int device, const ::std::source_location& where) {
  return compute_capability_major(device, where) >= sm90_major &&
         kernel_ptx_version(kernel, device, where) >= sm90_ptx_version;
}

}  // namespace replay::detail
