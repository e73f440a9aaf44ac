#pragma once
#include <replay/detail/require_cxx20.hpp>
// Whether programmatic dependent launch works here: on a device (compute
// capability 9.0 or newer) and for a kernel (its code on the current device
// compiled for 9.0 or newer, so that its replay::wait_for_prerequisite_grid()
// is compiled in). These are what replay::launch with
// LaunchAttributes::programmatic() and GraphBuilder's programmatic edges
// check, and refuse with a usage_error otherwise: ask first to launch plainly
// instead, or let the launch ask (LaunchAttributes::programmatic_where_supported()).
//
//   const auto attributes = replay::programmatic_launch_supported(next_layer)
//                               ? replay::LaunchAttributes::programmatic()
//                               : replay::LaunchAttributes{};
//   replay::launch(s, {config, attributes}, next_layer, x, y);
//
// Each answer is queried once (per device; per kernel and device) and kept;
// the queries may be made during a stream capture.
#include <cuda_runtime_api.h>

#include <source_location>

#include "replay/detail/device_caps.hpp"
#include "replay/detail/kernel_args.hpp"
#include "replay/detail/kernel_ptx.hpp"
#include "replay/error.hpp"

namespace replay {

// Whether `device` takes programmatic launches and edges: compute capability
// 9.0 (Hopper) or newer. Below, a kernel starts after its predecessor has
// finished, and its waits compile to nothing.
[[nodiscard]] inline bool programmatic_launch_supported(int device,
                                                        ::std::source_location where = ::std::source_location::current()) {
  return detail::compute_capability_major(device, where) >= detail::sm90_major;
}

// The same for the current device.
[[nodiscard]] inline bool programmatic_launch_supported(::std::source_location where = ::std::source_location::current()) {
  int device = 0;
  check(::cudaGetDevice(&device), "cudaGetDevice", where);
  return programmatic_launch_supported(device, where);
}

// Whether `kernel` may be launched programmatically on the current device:
// the device takes programmatic launches, and the kernel's code there was
// compiled for compute capability 9.0 or newer (cudaFuncAttributes::ptxVersion
// >= 90). False for a kernel whose only code for the device is older PTX,
// JIT-compiled when first loaded: its waits were compiled out, so it would
// not wait for its predecessor. usage_error for a null kernel.
template <class... Params>
[[nodiscard]] bool programmatic_launch_supported(void (*kernel)(Params...),
                                                 ::std::source_location where = ::std::source_location::current()) {
  detail::refuse_null_kernel(kernel, "programmatic_launch_supported", where);
  int device = 0;
  check(::cudaGetDevice(&device), "cudaGetDevice", where);
  return detail::takes_programmatic_launch(reinterpret_cast<const void*>(kernel), device, where);
}

}  // namespace replay
