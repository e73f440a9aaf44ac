#pragma once
#include <replay/detail/require_cxx20.hpp>
// A device's compute capability, queried once per device and kept, and the
// refusal of a feature the device lacks: programmatic dependent launch and
// thread block clusters need compute capability 9.0 (Hopper) or newer. Used
// by replay::launch and by GraphBuilder's programmatic edges.
#include <cuda_runtime_api.h>

#include <atomic>
#include <source_location>

#include "replay/detail/message.hpp"
#include "replay/error.hpp"

namespace replay::detail {

inline constexpr int sm90_major = 9;

// The major compute capability of `device` (cudaDevAttrComputeCapabilityMajor),
// cached: the query runs once per device ordinal (below 64; beyond, each call).
inline int compute_capability_major(int device, const ::std::source_location& where) {
  static constexpr int cached_devices = 64;
  static ::std::atomic<int> cache[cached_devices]{};  // 0: not queried yet
  const bool cacheable = device >= 0 && device < cached_devices;
  if (cacheable) {
    if (const int known = cache[device].load(::std::memory_order_relaxed); known != 0) {
      return known;
    }
  }
  int major = 0;
  check(::cudaDeviceGetAttribute(&major, ::cudaDevAttrComputeCapabilityMajor, device), "cudaDeviceGetAttribute",
        where);
  if (cacheable) {
    cache[device].store(major, ::std::memory_order_relaxed);
  }
  return major;
}

// usage_error when `feature` needs compute capability 9.0 and `device` has
// `major`. Pure, so that the refusal is tested without such a device.
inline void refuse_below_sm90(int major, int device, const char* what, const char* feature, const char* instead,
                              const ::std::source_location& where) {
  if (major < sm90_major) {
    throw usage_error(concat(what, ": ", feature, " needs a device of compute capability 9.0 or newer; device ",
                             device, " has ", major, ".x: ", instead),
                      where);
  }
}

}  // namespace replay::detail
