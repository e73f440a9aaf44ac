#pragma once
// What a CUDA API call is, from the name CUPTI gives it: the name without
// its per-thread-stream and version suffixes, and its kind (launch, copy,
// synchronization, allocation...). Pure functions, tested on the CPU.
#include <replay/detail/require_cxx20.hpp>

#include <cuda_runtime_api.h>

#include <array>
#include <string>
#include <string_view>

#include "replay/audit/call.hpp"
#include "replay/error.hpp"

namespace replay::detail::audit {

// A name split into what the call is and how it was reached.
struct ApiName {
  ::std::string_view base;     // "cudaMemcpyAsync", "cuLaunchKernel", "cudaLaunchKernel" (for __cudaLaunchKernel)
  bool per_thread = false;     // a _ptsz / _ptds entry: stream 0 means the per-thread default stream
};

// The name without a trailing version suffix (_v followed by digits only).
constexpr ::std::string_view without_version(::std::string_view name) noexcept {
  const auto v = name.rfind("_v");
  if (v == ::std::string_view::npos || v + 2 >= name.size()) {
    return name;
  }
  for (::std::size_t i = v + 2; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') {
      return name;
    }
  }
  return name.substr(0, v);
}

// "cudaLaunchKernel_ptsz_v7000" -> {"cudaLaunchKernel", per_thread}; "cuMemcpyHtoD_v2" -> {"cuMemcpyHtoD"};
// "__cudaLaunchKernel" (what <<<>>> calls since CUDA 13) -> {"cudaLaunchKernel"}.
constexpr ApiName split_api_name(::std::string_view name) noexcept {
  ApiName out;
  while (name.starts_with('_')) {
    name.remove_prefix(1);
  }
  name = without_version(name);
  for (const ::std::string_view suffix : {::std::string_view("_ptsz"), ::std::string_view("_ptds")}) {
    if (name.ends_with(suffix)) {
      name.remove_suffix(suffix.size());
      out.per_thread = true;
    }
  }
  // The version may also come before the per-thread suffix (cuMemcpyHtoDAsync_v2_ptsz).
  out.base = without_version(name);
  return out;
}

constexpr bool contains(::std::string_view text, ::std::string_view part) noexcept {
  return text.find(part) != ::std::string_view::npos;
}

// The kind of a call, from its base name (split_api_name(...).base).
constexpr AuditCallKind api_kind(::std::string_view base) noexcept {
  using K = AuditCallKind;
  constexpr ::std::array<::std::string_view, 8> launches = {
      "cudaLaunchKernel",      "cudaLaunchKernelExC", "cudaLaunchCooperativeKernel", "cuLaunchKernel",
      "cuLaunchKernelEx",      "cuLaunchCooperativeKernel", "cudaLaunchCooperativeKernelMultiDevice",
      "cuLaunchCooperativeKernelMultiDevice"};
  for (const ::std::string_view name : launches) {
    if (base == name) {
      return K::kernel_launch;
    }
  }
  if (base == "cudaLaunchHostFunc" || base == "cuLaunchHostFunc" || base == "cudaStreamAddCallback" ||
      base == "cuStreamAddCallback") {
    return K::host_launch;
  }
  if (base == "cudaGraphLaunch" || base == "cuGraphLaunch") {
    return K::graph_launch;
  }
  if (base == "cudaDeviceSynchronize" || base == "cudaThreadSynchronize" || base == "cuCtxSynchronize") {
    return K::device_sync;
  }
  if (base == "cudaStreamSynchronize" || base == "cuStreamSynchronize") {
    return K::stream_sync;
  }
  if (base == "cudaEventSynchronize" || base == "cuEventSynchronize") {
    return K::event_sync;
  }
  if (base == "cudaStreamQuery" || base == "cuStreamQuery") {
    return K::stream_query;
  }
  if (base == "cudaEventQuery" || base == "cuEventQuery") {
    return K::event_query;
  }
  if (base == "cudaEventRecord" || base == "cudaEventRecordWithFlags" || base == "cuEventRecord" ||
      base == "cuEventRecordWithFlags") {
    return K::event_record;
  }
  if (base == "cudaStreamWaitEvent" || base == "cuStreamWaitEvent") {
    return K::stream_wait;
  }
  if (base.starts_with("cudaStreamBeginCapture") || base.starts_with("cudaStreamEndCapture") ||
      base.starts_with("cuStreamBeginCapture") || base.starts_with("cuStreamEndCapture")) {
    return K::capture_control;
  }
  if (base == "cudaMallocAsync" || base == "cudaFreeAsync" || base == "cudaMallocFromPoolAsync" ||
      base == "cuMemAllocAsync" || base == "cuMemFreeAsync" || base == "cuMemAllocFromPoolAsync") {
    return K::stream_allocation;
  }
  const bool async = contains(base, "Async");
  if (base.starts_with("cudaMemcpy") || base.starts_with("cuMemcpy")) {
    return async ? K::copy : K::sync_copy;
  }
  if (base.starts_with("cudaMemset") || base.starts_with("cuMemsetD")) {
    return async ? K::memset : K::sync_memset;
  }
  if (base == "cudaMalloc" || base == "cudaMallocHost" || base == "cudaHostAlloc" || base == "cudaMallocManaged" ||
      base == "cudaMallocPitch" || base == "cudaMalloc3D" || base == "cudaMallocArray" ||
      base == "cudaMalloc3DArray" || base == "cudaMallocMipmappedArray" || base == "cudaHostRegister" ||
      base == "cuMemAlloc" || base == "cuMemAllocHost" || base == "cuMemHostAlloc" ||
      base == "cuMemAllocManaged" || base == "cuMemAllocPitch" || base == "cuMemHostRegister" ||
      base == "cuMemCreate" || base == "cuMemMap") {
    return K::allocation;
  }
  if (base == "cudaFree" || base == "cudaFreeHost" || base == "cudaFreeArray" ||
      base == "cudaFreeMipmappedArray" || base == "cudaHostUnregister" || base == "cuMemFree" ||
      base == "cuMemFreeHost" || base == "cuMemHostUnregister" || base == "cuMemRelease" || base == "cuMemUnmap") {
    return K::free;
  }
  return K::other;
}

// Work that runs on a stream: on a stream outside the capture it runs eagerly.
constexpr bool is_work(AuditCallKind kind) noexcept {
  switch (kind) {
    case AuditCallKind::kernel_launch:
    case AuditCallKind::host_launch:
    case AuditCallKind::graph_launch:
    case AuditCallKind::copy:
    case AuditCallKind::sync_copy:
    case AuditCallKind::memset:
    case AuditCallKind::sync_memset:
      return true;
    default:
      return false;
  }
}

// Calls that a capture refuses on the capturing thread (this_thread, global)
// or on any thread (global), or that wait for the whole device.
constexpr bool is_unsafe(AuditCallKind kind) noexcept {
  switch (kind) {
    case AuditCallKind::stream_sync:
    case AuditCallKind::event_sync:
    case AuditCallKind::device_sync:
    case AuditCallKind::allocation:
    case AuditCallKind::free:
    case AuditCallKind::sync_copy:
    case AuditCallKind::sync_memset:
      return true;
    default:
      return false;
  }
}

// Of those, the ones another thread's call breaks a CaptureMode::global
// capture with (a synchronization of that thread's own stream or event does not).
constexpr bool is_unsafe_from_any_thread(AuditCallKind kind) noexcept {
  return is_unsafe(kind) && kind != AuditCallKind::stream_sync && kind != AuditCallKind::event_sync;
}

// True for a return code that a broken or refused capture gives (runtime
// and driver share these numbers: 900-908).
constexpr bool is_capture_status(int status) noexcept {
  return replay::is_capture_error(static_cast<::cudaError_t>(status));
}

// "cudaErrorStreamCaptureUnsupported" for a runtime call's status; for a
// driver call the runtime's name of the same number where both agree
// (success and the capture errors), else "CUresult <n>".
inline ::std::string status_name(int status, bool driver_api) {
  if (!driver_api || status == 0 || is_capture_status(status)) {
    return ::cudaGetErrorName(static_cast<::cudaError_t>(status));
  }
  return "CUresult " + ::std::to_string(status);
}

}  // namespace replay::detail::audit
