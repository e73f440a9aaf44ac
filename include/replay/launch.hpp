#pragma once
#include <replay/detail/require_cxx20.hpp>
// replay::launch: a typed kernel launch with attributes, over
// cudaLaunchKernelExC. The arguments are checked at compile time against the
// kernel's own parameters (as GraphBuilder::add_kernel checks them) and
// converted to their types; misuse (a null kernel, a zero dimension, a grid
// that is not a whole number of clusters, an attribute the device lacks)
// throws usage_error before CUDA sees the launch, as does a programmatic
// launch of a kernel compiled from PTX older than 9.0 (programmatic_launch.hpp
// asks first). It is capturable: captured, a launch with programmatic stream
// serialization becomes a programmatic edge (EdgeKind::programmatic) from the
// kernel before it on the stream.
//
//   replay::launch(s, {blocks, threads}, scale, x, n, 2.0f);
//   replay::launch(s, {config, replay::LaunchAttributes::programmatic()}, next_layer, x, y);
//   replay::launch(s, {config, replay::LaunchAttributes::programmatic_where_supported()}, next_layer, x, y);
//
// The kernel's arguments are variadic, so a defaulted std::source_location
// cannot follow them; the caller's line rides on LaunchOptions' converting
// constructors instead (launch_config.hpp), evaluated where the call is
// written, and every error names it.
#include <cuda_runtime_api.h>

#include <source_location>
#include <utility>

#include "replay/detail/device_caps.hpp"
#include "replay/detail/kernel_args.hpp"
#include "replay/detail/kernel_ptx.hpp"
#include "replay/detail/message.hpp"
#include "replay/detail/signature_checks.hpp"
#include "replay/error.hpp"
#include "replay/launch_config.hpp"
#include "replay/programmatic_launch.hpp"
#include "replay/stream_ref.hpp"

namespace replay {

namespace detail {

// usage_error for cluster dimensions CUDA would refuse: zero, or not dividing the grid.
inline void validate_attributes(const LaunchAttributes& attributes, const LaunchConfig& config, const char* what,
                                const ::std::source_location& where) {
  if (const auto cluster = attributes.cluster_dims()) {
    if (cluster->x == 0 || cluster->y == 0 || cluster->z == 0) {
      throw usage_error(concat(what, ": cluster dimensions must all be at least 1"), where);
    }
    if (config.grid.x % cluster->x != 0 || config.grid.y % cluster->y != 0 || config.grid.z % cluster->z != 0) {
      throw usage_error(concat(what, ": the grid (", config.grid.x, ", ", config.grid.y, ", ", config.grid.z,
                               ") is not a whole number of clusters (", cluster->x, ", ", cluster->y, ", ",
                               cluster->z, "); make each grid dimension a multiple of the cluster's"),
                        where);
    }
  }
}

// usage_error for an attribute a device of compute capability `major` lacks.
inline void refuse_unsupported_attributes(const LaunchAttributes& attributes, int major, int device,
                                          const char* what, const ::std::source_location& where) {
  if (attributes.programmatic_serialization() == ProgrammaticSerialization::required) {
    refuse_below_sm90(major, device, what, "programmatic dependent launch (programmatic stream serialization)",
                      "launch without with_programmatic_serialization() there (the kernel's waits do nothing), or "
                      "ask for it where supported (LaunchAttributes::programmatic_where_supported())",
                      where);
  }
  if (attributes.cluster_dims()) {
    refuse_below_sm90(major, device, what, "thread block clusters", "launch without with_cluster_dims() there",
                      where);
  }
}

// The attributes as CUDA's list; returns how many were written (at most 3).
// Programmatic serialization is passed where required: launch() resolves
// where_supported to required or off first.
inline unsigned int fill_launch_attributes(const LaunchAttributes& attributes,
                                           ::cudaLaunchAttribute (&out)[3]) noexcept {
  unsigned int n = 0;
  if (attributes.programmatic_serialization() == ProgrammaticSerialization::required) {
    out[n] = ::cudaLaunchAttribute{};
    out[n].id = ::cudaLaunchAttributeProgrammaticStreamSerialization;
    out[n].val.programmaticStreamSerializationAllowed = 1;
    ++n;
  }
  if (const auto priority = attributes.priority()) {
    out[n] = ::cudaLaunchAttribute{};
    out[n].id = ::cudaLaunchAttributePriority;
    out[n].val.priority = *priority;
    ++n;
  }
  if (const auto cluster = attributes.cluster_dims()) {
    out[n] = ::cudaLaunchAttribute{};
    out[n].id = ::cudaLaunchAttributeClusterDimension;
    out[n].val.clusterDim.x = cluster->x;
    out[n].val.clusterDim.y = cluster->y;
    out[n].val.clusterDim.z = cluster->z;
    ++n;
  }
  return n;
}

// Everything launch() checks before any CUDA call.
template <class Kernel>
void validate_launch_options(Kernel kernel, const LaunchOptions& options, const char* what) {
  refuse_null_kernel(kernel, what, options.where());
  validate_dimensions(options.config().grid, options.config().block, what, options.where());
  validate_attributes(options.attributes(), options.config(), what, options.where());
}

}  // namespace detail

// Launches kernel<<<grid, block, shared_bytes, stream>>>(args...) with the
// attributes of `options` (cudaLaunchKernelExC). The arguments are checked
// against the kernel's parameters at compile time (count and convertibility)
// and converted to the parameter types. Attributes that need compute
// capability 9.0 (programmatic serialization, clusters) are checked against
// the current device, the one the kernel runs on (queried once per device), and refused with a
// usage_error where it is older. Programmatic serialization is also refused
// for a kernel whose code there was JIT-compiled from PTX older than 9.0 (its
// waits compiled out; queried once per kernel and device):
// programmatic_launch_supported(kernel) asks first, or ask for it where
// supported (ProgrammaticSerialization::where_supported), which launches
// plainly where it would be refused. Works under stream capture.
template <class... Params, class... Args>
void launch(StreamRef stream, const LaunchOptions& options, void (*kernel)(Params...), Args&&... args) {
  detail::kernel_arguments_check<Params...>::template check<Args...>();  // names a mismatched argument
  const ::std::source_location& where = options.where();
  detail::validate_launch_options(kernel, options, "launch");
  LaunchAttributes attributes = options.attributes();
  const bool where_supported = attributes.programmatic_serialization() == ProgrammaticSerialization::where_supported;
  if (attributes.needs_sm90() || where_supported) {
    // A kernel runs on the current device (a launch into another device's
    // stream fails), so that is the device to ask; cudaStreamGetDevice would
    // also be refused, invalidating the capture, while the stream captures.
    int device = 0;
    check(::cudaGetDevice(&device), "cudaGetDevice", where);
    const void* code = reinterpret_cast<const void*>(kernel);
    if (where_supported) {  // resolved here, so nothing below refuses it
      attributes.with_programmatic_serialization(detail::takes_programmatic_launch(code, device, where)
                                                     ? ProgrammaticSerialization::required
                                                     : ProgrammaticSerialization::off);
    }
    detail::refuse_unsupported_attributes(attributes, detail::compute_capability_major(device, where), device,
                                          "launch", where);
    if (!where_supported && attributes.programmatic_serialization() == ProgrammaticSerialization::required) {
      // the kernel's own waits must be compiled in
      detail::refuse_ptx_below_sm90(detail::kernel_ptx_version(code, device, where), device, "launch", "the kernel",
                                    "launch it without programmatic serialization, or where supported "
                                    "(LaunchAttributes::programmatic_where_supported())",
                                    where);
    }
  }
  detail::KernelArgPack<Params...> pack(::std::forward<Args>(args)...);
  ::cudaLaunchAttribute list[3];
  ::cudaLaunchConfig_t config{};
  config.gridDim = options.config().grid;
  config.blockDim = options.config().block;
  config.dynamicSmemBytes = options.config().shared_bytes;
  config.stream = stream.get();
  config.numAttrs = detail::fill_launch_attributes(attributes, list);
  config.attrs = config.numAttrs == 0 ? nullptr : list;
  check(::cudaLaunchKernelExC(&config, reinterpret_cast<const void*>(kernel), pack.data()), "cudaLaunchKernelExC",
        where);
}

}  // namespace replay
