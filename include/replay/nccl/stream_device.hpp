#pragma once
#include <replay/detail/require_cxx20.hpp>
// The device a stream belongs to, and ScopedDevice, which makes a device
// current for a scope and restores the previous one. With several GPUs per
// process, kernels must be launched, buffers allocated and graphs captured on
// the stream's device, whatever device the calling thread happens to have
// current: every per-device object of replay::nccl takes its device from the
// stream it is given.
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <source_location>

#include "replay/detail/driver_memset.hpp"
#include "replay/error.hpp"
#include "replay/stream_ref.hpp"

namespace replay {

// The device of `stream`. For the special handles (cudaStreamLegacy,
// cudaStreamPerThread) that is the calling thread's current device.
//
// Read from the stream's context (cuStreamGetCtx, made current for one
// cuCtxGetDevice, then popped), which drivers accept while the stream is
// capturing. cudaStreamGetDevice is not used: whether a driver permits it
// during capture varies (CUDA 13.0 on driver 580 refuses it with
// cudaErrorStreamCaptureUnsupported, which invalidates the capture).
inline int stream_device(StreamRef stream, ::std::source_location where = ::std::source_location::current()) {
  int device = 0;
  if (stream.get() == nullptr || stream.get() == cudaStreamLegacy || stream.get() == cudaStreamPerThread) {
    check(::cudaGetDevice(&device), "cudaGetDevice", where);
    return device;
  }
  using GetCtxFn = CUresult (*)(CUstream, CUcontext*);
  using PushFn = CUresult (*)(CUcontext);
  using PopFn = CUresult (*)(CUcontext*);
  using GetDeviceFn = CUresult (*)(CUdevice*);
  static const auto get_ctx = reinterpret_cast<GetCtxFn>(detail::driver_entry_point("cuStreamGetCtx", where));
  static const auto push = reinterpret_cast<PushFn>(detail::driver_entry_point("cuCtxPushCurrent", where));
  static const auto pop = reinterpret_cast<PopFn>(detail::driver_entry_point("cuCtxPopCurrent", where));
  static const auto get_device = reinterpret_cast<GetDeviceFn>(detail::driver_entry_point("cuCtxGetDevice", where));
  CUcontext ctx = nullptr;
  detail::check_driver(get_ctx(reinterpret_cast<CUstream>(stream.get()), &ctx), "cuStreamGetCtx", where);
  detail::check_driver(push(ctx), "cuCtxPushCurrent", where);
  CUdevice dev = 0;
  const CUresult got = get_device(&dev);
  CUcontext popped = nullptr;
  (void)pop(&popped);
  detail::check_driver(got, "cuCtxGetDevice", where);
  device = static_cast<int>(dev);
  return device;
}

// Makes `device` current on this thread for the scope's life; the previous
// current device comes back when it ends (never throws then).
class ScopedDevice {
 public:
  explicit ScopedDevice(int device, ::std::source_location where = ::std::source_location::current()) {
    check(::cudaGetDevice(&previous_), "cudaGetDevice", where);
    if (previous_ != device) {
      check(::cudaSetDevice(device), "cudaSetDevice", where);
      restore_ = true;
    }
  }
  // The device of `stream`.
  explicit ScopedDevice(StreamRef stream, ::std::source_location where = ::std::source_location::current())
      : ScopedDevice(stream_device(stream, where), where) {}

  ScopedDevice(const ScopedDevice&) = delete;
  ScopedDevice& operator=(const ScopedDevice&) = delete;
  ScopedDevice(ScopedDevice&&) = delete;
  ScopedDevice& operator=(ScopedDevice&&) = delete;
  ~ScopedDevice() {
    if (restore_) {
      (void)::cudaSetDevice(previous_);
    }
  }

  int previous() const noexcept { return previous_; }

 private:
  int previous_ = 0;
  bool restore_ = false;
};

}  // namespace replay
