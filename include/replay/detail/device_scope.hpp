#pragma once
#include <replay/detail/require_cxx20.hpp>
// DeviceScope: makes a device current for a scope and restores the previous one.
#include <cuda_runtime_api.h>

#include <source_location>

#include "replay/error.hpp"

namespace replay::detail {

// Makes `device` current for a scope and restores the previous one.
class DeviceScope {
 public:
  DeviceScope(int device, const ::std::source_location& where) {
    int current = 0;
    check(::cudaGetDevice(&current), "cudaGetDevice", where);
    if (current != device) {
      check(::cudaSetDevice(device), "cudaSetDevice", where);
      previous_ = current;
    }
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;
  ~DeviceScope() {
    if (previous_ >= 0) {
      (void)::cudaSetDevice(previous_);
    }
  }

 private:
  int previous_ = -1;
};

}  // namespace replay::detail
