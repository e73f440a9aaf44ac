#pragma once
// The stream argument of a CUDA API call, read from the parameter block
// CUPTI hands to an API callback: one struct per function, its parameters
// in order. generated_cuda_runtime_api_meta.h (through cupti.h) declares
// the runtime's; the few driver blocks needed are mirrored below, by where
// the stream sits. Only the calls that issue work, synchronize, record or
// wait on a stream are listed; the others are recorded without a stream.
#include <replay/detail/require_cxx20.hpp>

#include <cuda.h>
#include <cuda_runtime_api.h>
// Through cupti.h, whose include guard covers the parameter headers it
// includes: they have no guard of their own, so a program that includes
// cupti.h too, before or after replay, would otherwise define them twice.
#include <cupti.h>

#include <cstddef>
#include <cstdint>

namespace replay::detail::audit {

struct StreamArgument {
  bool present = false;       // the call takes a stream
  ::std::uintptr_t handle = 0;
};

// The stream member of a parameter struct: `stream`, `hStream`, or the
// stream of a launch configuration (`config->stream` / `config->hStream`).
template <class Params>
StreamArgument stream_argument(const void* block) noexcept {
  const auto* params = static_cast<const Params*>(block);
  StreamArgument out;
  out.present = true;
  if constexpr (requires { params->stream; }) {
    out.handle = reinterpret_cast<::std::uintptr_t>(params->stream);
  } else if constexpr (requires { params->hStream; }) {
    out.handle = reinterpret_cast<::std::uintptr_t>(params->hStream);
  } else if constexpr (requires { params->config->stream; }) {
    out.handle = params->config != nullptr ? reinterpret_cast<::std::uintptr_t>(params->config->stream) : 0U;
  } else {
    static_assert(requires { params->config->hStream; }, "no stream member in this parameter struct");
    out.handle = params->config != nullptr ? reinterpret_cast<::std::uintptr_t>(params->config->hStream) : 0U;
  }
  return out;
}

// What <<<>>> calls since CUDA 13 (__cudaLaunchKernel): the parameters of
// cudaLaunchKernel with a cudaKernel_t first; CUPTI's block follows the
// signature (crt/device_functions.h), as all of its parameter structs do.
struct KernelHandleLaunchParams {
  const void* kernel;
  dim3 gridDim;
  dim3 blockDim;
  void** args;
  ::std::size_t sharedMem;
  ::cudaStream_t stream;
};

// For the blocks whose layout is inferred rather than declared by CUDA: a
// value that cannot be a stream handle (not a default-stream constant, not
// an aligned pointer) is dropped rather than handed to the driver.
inline StreamArgument plausible(StreamArgument argument) noexcept {
  const ::std::uintptr_t h = argument.handle;
  if (h > 2 && (h % alignof(void*) != 0 || h < 0x10000)) {
    return {};
  }
  return argument;
}

inline StreamArgument runtime_stream_argument(CUpti_CallbackId cbid, const void* block) noexcept {
  if (block == nullptr) {
    return {};
  }
  switch (cbid) {
    case CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_v7000: return stream_argument<cudaLaunchKernel_v7000_params>(block);
    case CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_ptsz_v7000: return stream_argument<cudaLaunchKernel_ptsz_v7000_params>(block);
#if CUPTI_API_VERSION >= 130000
    case CUPTI_RUNTIME_TRACE_CBID___cudaLaunchKernel_v13000:
    case CUPTI_RUNTIME_TRACE_CBID___cudaLaunchKernel_ptsz_v13000:
      return plausible(stream_argument<KernelHandleLaunchParams>(block));
#endif
    case CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernelExC_v11060: return stream_argument<cudaLaunchKernelExC_v11060_params>(block);
    case CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernelExC_ptsz_v11060: return stream_argument<cudaLaunchKernelExC_ptsz_v11060_params>(block);
    case CUPTI_RUNTIME_TRACE_CBID_cudaLaunchCooperativeKernel_v9000: return stream_argument<cudaLaunchCooperativeKernel_v9000_params>(block);
    case CUPTI_RUNTIME_TRACE_CBID_cudaLaunchCooperativeKernel_ptsz_v9000: return stream_argument<cudaLaunchCooperativeKernel_ptsz_v9000_params>(block);
    case CUPTI_RUNTIME_TRACE_CBID_cudaLaunchHostFunc_v10000: return stream_argument<cudaLaunchHostFunc_v10000_params>(block);
    case CUPTI_RUNTIME_TRACE_CBID_cudaLaunchHostFunc_ptsz_v10000: return stream_argument<cudaLaunchHostFunc_ptsz_v10000_params>(block);
    case CUPTI_RUNTIME_TRACE_CBID_cudaStreamAddCallback_v5000: return stream_argument<cudaStreamAddCallback_v5000_params>(block);
    case CUPTI_RUNTIME_TRACE_CBID_cudaStreamAddCallback_ptsz_v7000: return stream_argument<cudaStreamAddCallback_ptsz_v7000_params>(block);
    case CUPTI_RUNTIME_TRACE_CBID_cudaGraphLaunch_v10000: return stream_argument<cudaGraphLaunch_v10000_params>(block);
    case CUPTI_RUNTIME_TRACE_CBID_cudaGraphLaunch_ptsz_v10000: return stream_argument<cudaGraphLaunch_ptsz_v10000_params>(block);
    case CUPTI_RUNTIME_TRACE_CBID_cudaMemcpyAsync_v3020: return stream_argument<cudaMemcpyAsync_v3020_params>(block);
    case CUPTI_RUNTIME_TRACE_CBID_cudaMemcpyAsync_ptsz_v7000: return stream_argument<cudaMemcpyAsync_ptsz_v7000_params>(block);
    case CUPTI_RUNTIME_TRACE_CBID_cudaMemcpy2DAsync_v3020: return stream_argument<cudaMemcpy2DAsync_v3020_params>(block);
    case CUPTI_RUNTIME_TRACE_CBID_cudaMemcpy2DAsync_ptsz_v7000: return stream_argument<cudaMemcpy2DAsync_ptsz_v7000_params>(block);
    case CUPTI_RUNTIME_TRACE_CBID_cudaMemcpy3DAsync_v3020: return stream_argument<cudaMemcpy3DAsync_v3020_params>(block);
    case CUPTI_RUNTIME_TRACE_CBID_cudaMemcpy3DAsync_ptsz_v7000: return stream_argument<cudaMemcpy3DAsync_ptsz_v7000_params>(block);
    case CUPTI_RUNTIME_TRACE_CBID_cudaMemcpyToSymbolAsync_v3020: return stream_argument<cudaMemcpyToSymbolAsync_v3020_params>(block);
    case CUPTI_RUNTIME_TRACE_CBID_cudaMemcpyToSymbolAsync_ptsz_v7000: return stream_argument<cudaMemcpyToSymbolAsync_ptsz_v7000_params>(block);
    case CUPTI_RUNTIME_TRACE_CBID_cudaMemcpyFromSymbolAsync_v3020: return stream_argument<cudaMemcpyFromSymbolAsync_v3020_params>(block);
    case CUPTI_RUNTIME_TRACE_CBID_cudaMemcpyFromSymbolAsync_ptsz_v7000: return stream_argument<cudaMemcpyFromSymbolAsync_ptsz_v7000_params>(block);
    case CUPTI_RUNTIME_TRACE_CBID_cudaMemcpyPeerAsync_v4000: return stream_argument<cudaMemcpyPeerAsync_v4000_params>(block);
    case CUPTI_RUNTIME_TRACE_CBID_cudaMemsetAsync_v3020: return stream_argument<cudaMemsetAsync_v3020_params>(block);
    case CUPTI_RUNTIME_TRACE_CBID_cudaMemsetAsync_ptsz_v7000: return stream_argument<cudaMemsetAsync_ptsz_v7000_params>(block);
    case CUPTI_RUNTIME_TRACE_CBID_cudaMemset2DAsync_v3020: return stream_argument<cudaMemset2DAsync_v3020_params>(block);
    case CUPTI_RUNTIME_TRACE_CBID_cudaMemset2DAsync_ptsz_v7000: return stream_argument<cudaMemset2DAsync_ptsz_v7000_params>(block);
    case CUPTI_RUNTIME_TRACE_CBID_cudaMemset3DAsync_v3020: return stream_argument<cudaMemset3DAsync_v3020_params>(block);
    case CUPTI_RUNTIME_TRACE_CBID_cudaMemset3DAsync_ptsz_v7000: return stream_argument<cudaMemset3DAsync_ptsz_v7000_params>(block);
    case CUPTI_RUNTIME_TRACE_CBID_cudaStreamSynchronize_v3020: return stream_argument<cudaStreamSynchronize_v3020_params>(block);
    case CUPTI_RUNTIME_TRACE_CBID_cudaStreamSynchronize_ptsz_v7000: return stream_argument<cudaStreamSynchronize_ptsz_v7000_params>(block);
    case CUPTI_RUNTIME_TRACE_CBID_cudaStreamQuery_v3020: return stream_argument<cudaStreamQuery_v3020_params>(block);
    case CUPTI_RUNTIME_TRACE_CBID_cudaStreamQuery_ptsz_v7000: return stream_argument<cudaStreamQuery_ptsz_v7000_params>(block);
    case CUPTI_RUNTIME_TRACE_CBID_cudaEventRecord_v3020: return stream_argument<cudaEventRecord_v3020_params>(block);
    case CUPTI_RUNTIME_TRACE_CBID_cudaEventRecord_ptsz_v7000: return stream_argument<cudaEventRecord_ptsz_v7000_params>(block);
    case CUPTI_RUNTIME_TRACE_CBID_cudaEventRecordWithFlags_v11010: return stream_argument<cudaEventRecordWithFlags_v11010_params>(block);
    case CUPTI_RUNTIME_TRACE_CBID_cudaEventRecordWithFlags_ptsz_v11010: return stream_argument<cudaEventRecordWithFlags_ptsz_v11010_params>(block);
    case CUPTI_RUNTIME_TRACE_CBID_cudaStreamWaitEvent_v3020: return stream_argument<cudaStreamWaitEvent_v3020_params>(block);
    case CUPTI_RUNTIME_TRACE_CBID_cudaStreamWaitEvent_ptsz_v7000: return stream_argument<cudaStreamWaitEvent_ptsz_v7000_params>(block);
    case CUPTI_RUNTIME_TRACE_CBID_cudaMallocAsync_v11020: return stream_argument<cudaMallocAsync_v11020_params>(block);
    case CUPTI_RUNTIME_TRACE_CBID_cudaMallocAsync_ptsz_v11020: return stream_argument<cudaMallocAsync_ptsz_v11020_params>(block);
    case CUPTI_RUNTIME_TRACE_CBID_cudaFreeAsync_v11020: return stream_argument<cudaFreeAsync_v11020_params>(block);
    case CUPTI_RUNTIME_TRACE_CBID_cudaFreeAsync_ptsz_v11020: return stream_argument<cudaFreeAsync_ptsz_v11020_params>(block);
    default: return {};
  }
}

// Mirrors of the driver's parameter blocks, by where the stream sits (the
// fields before it have the types of the function's parameters, so the
// offsets are those of generated_cuda_meta.h's structs).
namespace driver_params {
struct StreamFirst {  // cuStreamSynchronize, cuStreamQuery, cuStreamWaitEvent, cuLaunchHostFunc, cuStreamAddCallback
  CUstream hStream;
};
struct StreamSecond {  // cuEventRecord(WithFlags), cuGraphLaunch, cuMemcpy2DAsync, cuMemcpy3DAsync, cuMemFreeAsync
  const void* first;
  CUstream hStream;
};
struct StreamThird {  // cuMemAllocAsync(CUdeviceptr*, size_t, CUstream)
  const void* pointer;
  ::std::size_t bytes;
  CUstream hStream;
};
struct StreamFourth {  // cuMemcpyAsync, cuMemcpyHtoDAsync, cuMemcpyDtoHAsync, cuMemcpyDtoDAsync
  const void* dst;
  const void* src;
  ::std::size_t bytes;
  CUstream hStream;
};
struct MemsetAsync {  // cuMemsetD8Async, D16, D32 (the value, 1 to 4 bytes, is padded to 8 either way)
  CUdeviceptr dst;
  unsigned int value;
  ::std::size_t count;
  CUstream hStream;
};
struct Memset2DAsync {  // cuMemsetD2D8Async, D2D16, D2D32
  CUdeviceptr dst;
  ::std::size_t pitch;
  unsigned int value;
  ::std::size_t width;
  ::std::size_t height;
  CUstream hStream;
};
struct MemcpyPeerAsync {
  CUdeviceptr dst;
  CUcontext dst_context;
  CUdeviceptr src;
  CUcontext src_context;
  ::std::size_t bytes;
  CUstream hStream;
};
struct LaunchKernel {  // cuLaunchKernel, cuLaunchCooperativeKernel
  CUfunction f;
  unsigned int grid_x, grid_y, grid_z, block_x, block_y, block_z, shared_bytes;
  CUstream hStream;
};
struct LaunchKernelEx {
  const CUlaunchConfig* config;
  CUfunction f;
};
static_assert(offsetof(LaunchKernel, hStream) == 40 && offsetof(MemsetAsync, hStream) == 24 &&
              offsetof(Memset2DAsync, hStream) == 40 && offsetof(MemcpyPeerAsync, hStream) == 40);
}  // namespace driver_params

inline StreamArgument driver_stream_argument(CUpti_CallbackId cbid, const void* block) noexcept {
  if (block == nullptr) {
    return {};
  }
  switch (cbid) {
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel: return stream_argument<driver_params::LaunchKernel>(block);
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel_ptsz: return stream_argument<driver_params::LaunchKernel>(block);
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx: return stream_argument<driver_params::LaunchKernelEx>(block);
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx_ptsz: return stream_argument<driver_params::LaunchKernelEx>(block);
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel: return stream_argument<driver_params::LaunchKernel>(block);
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel_ptsz: return stream_argument<driver_params::LaunchKernel>(block);
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchHostFunc: return stream_argument<driver_params::StreamFirst>(block);
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchHostFunc_ptsz: return stream_argument<driver_params::StreamFirst>(block);
    case CUPTI_DRIVER_TRACE_CBID_cuStreamAddCallback: return stream_argument<driver_params::StreamFirst>(block);
    case CUPTI_DRIVER_TRACE_CBID_cuStreamAddCallback_ptsz: return stream_argument<driver_params::StreamFirst>(block);
    case CUPTI_DRIVER_TRACE_CBID_cuGraphLaunch: return stream_argument<driver_params::StreamSecond>(block);
    case CUPTI_DRIVER_TRACE_CBID_cuGraphLaunch_ptsz: return stream_argument<driver_params::StreamSecond>(block);
    case CUPTI_DRIVER_TRACE_CBID_cuMemcpyAsync: return stream_argument<driver_params::StreamFourth>(block);
    case CUPTI_DRIVER_TRACE_CBID_cuMemcpyAsync_ptsz: return stream_argument<driver_params::StreamFourth>(block);
    case CUPTI_DRIVER_TRACE_CBID_cuMemcpyHtoDAsync_v2: return stream_argument<driver_params::StreamFourth>(block);
    case CUPTI_DRIVER_TRACE_CBID_cuMemcpyHtoDAsync_v2_ptsz: return stream_argument<driver_params::StreamFourth>(block);
    case CUPTI_DRIVER_TRACE_CBID_cuMemcpyDtoHAsync_v2: return stream_argument<driver_params::StreamFourth>(block);
    case CUPTI_DRIVER_TRACE_CBID_cuMemcpyDtoHAsync_v2_ptsz: return stream_argument<driver_params::StreamFourth>(block);
    case CUPTI_DRIVER_TRACE_CBID_cuMemcpyDtoDAsync_v2: return stream_argument<driver_params::StreamFourth>(block);
    case CUPTI_DRIVER_TRACE_CBID_cuMemcpyDtoDAsync_v2_ptsz: return stream_argument<driver_params::StreamFourth>(block);
    case CUPTI_DRIVER_TRACE_CBID_cuMemcpy2DAsync_v2: return stream_argument<driver_params::StreamSecond>(block);
    case CUPTI_DRIVER_TRACE_CBID_cuMemcpy2DAsync_v2_ptsz: return stream_argument<driver_params::StreamSecond>(block);
    case CUPTI_DRIVER_TRACE_CBID_cuMemcpy3DAsync_v2: return stream_argument<driver_params::StreamSecond>(block);
    case CUPTI_DRIVER_TRACE_CBID_cuMemcpy3DAsync_v2_ptsz: return stream_argument<driver_params::StreamSecond>(block);
    case CUPTI_DRIVER_TRACE_CBID_cuMemcpyPeerAsync: return stream_argument<driver_params::MemcpyPeerAsync>(block);
    case CUPTI_DRIVER_TRACE_CBID_cuMemcpyPeerAsync_ptsz: return stream_argument<driver_params::MemcpyPeerAsync>(block);
    case CUPTI_DRIVER_TRACE_CBID_cuMemsetD8Async: return stream_argument<driver_params::MemsetAsync>(block);
    case CUPTI_DRIVER_TRACE_CBID_cuMemsetD8Async_ptsz: return stream_argument<driver_params::MemsetAsync>(block);
    case CUPTI_DRIVER_TRACE_CBID_cuMemsetD16Async: return stream_argument<driver_params::MemsetAsync>(block);
    case CUPTI_DRIVER_TRACE_CBID_cuMemsetD16Async_ptsz: return stream_argument<driver_params::MemsetAsync>(block);
    case CUPTI_DRIVER_TRACE_CBID_cuMemsetD32Async: return stream_argument<driver_params::MemsetAsync>(block);
    case CUPTI_DRIVER_TRACE_CBID_cuMemsetD32Async_ptsz: return stream_argument<driver_params::MemsetAsync>(block);
    case CUPTI_DRIVER_TRACE_CBID_cuMemsetD2D8Async: return stream_argument<driver_params::Memset2DAsync>(block);
    case CUPTI_DRIVER_TRACE_CBID_cuMemsetD2D8Async_ptsz: return stream_argument<driver_params::Memset2DAsync>(block);
    case CUPTI_DRIVER_TRACE_CBID_cuMemsetD2D16Async: return stream_argument<driver_params::Memset2DAsync>(block);
    case CUPTI_DRIVER_TRACE_CBID_cuMemsetD2D16Async_ptsz: return stream_argument<driver_params::Memset2DAsync>(block);
    case CUPTI_DRIVER_TRACE_CBID_cuMemsetD2D32Async: return stream_argument<driver_params::Memset2DAsync>(block);
    case CUPTI_DRIVER_TRACE_CBID_cuMemsetD2D32Async_ptsz: return stream_argument<driver_params::Memset2DAsync>(block);
    case CUPTI_DRIVER_TRACE_CBID_cuStreamSynchronize: return stream_argument<driver_params::StreamFirst>(block);
    case CUPTI_DRIVER_TRACE_CBID_cuStreamSynchronize_ptsz: return stream_argument<driver_params::StreamFirst>(block);
    case CUPTI_DRIVER_TRACE_CBID_cuStreamQuery: return stream_argument<driver_params::StreamFirst>(block);
    case CUPTI_DRIVER_TRACE_CBID_cuStreamQuery_ptsz: return stream_argument<driver_params::StreamFirst>(block);
    case CUPTI_DRIVER_TRACE_CBID_cuEventRecord: return stream_argument<driver_params::StreamSecond>(block);
    case CUPTI_DRIVER_TRACE_CBID_cuEventRecord_ptsz: return stream_argument<driver_params::StreamSecond>(block);
    case CUPTI_DRIVER_TRACE_CBID_cuEventRecordWithFlags: return stream_argument<driver_params::StreamSecond>(block);
    case CUPTI_DRIVER_TRACE_CBID_cuEventRecordWithFlags_ptsz: return stream_argument<driver_params::StreamSecond>(block);
    case CUPTI_DRIVER_TRACE_CBID_cuStreamWaitEvent: return stream_argument<driver_params::StreamFirst>(block);
    case CUPTI_DRIVER_TRACE_CBID_cuStreamWaitEvent_ptsz: return stream_argument<driver_params::StreamFirst>(block);
    case CUPTI_DRIVER_TRACE_CBID_cuMemAllocAsync: return stream_argument<driver_params::StreamThird>(block);
    case CUPTI_DRIVER_TRACE_CBID_cuMemAllocAsync_ptsz: return stream_argument<driver_params::StreamThird>(block);
    case CUPTI_DRIVER_TRACE_CBID_cuMemFreeAsync: return stream_argument<driver_params::StreamSecond>(block);
    case CUPTI_DRIVER_TRACE_CBID_cuMemFreeAsync_ptsz: return stream_argument<driver_params::StreamSecond>(block);
    default: return {};
  }
}

// The kernel a launch names, for when CUPTI gives no symbol name: a host
// function (runtime), a CUkernel (<<<>>> since CUDA 13) or a CUfunction (driver).
struct KernelHandle {
  enum class Kind : unsigned char { none, host_function, library_kernel, function } kind = Kind::none;
  const void* value = nullptr;
};

inline KernelHandle launch_kernel_handle(bool runtime, CUpti_CallbackId cbid, const void* block) noexcept {
  using Kind = KernelHandle::Kind;
  if (block == nullptr) {
    return {};
  }
  if (runtime) {
    switch (cbid) {
      case CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_v7000:
      case CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_ptsz_v7000:
        return {Kind::host_function, static_cast<const cudaLaunchKernel_v7000_params*>(block)->func};
      case CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernelExC_v11060:
      case CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernelExC_ptsz_v11060:
        return {Kind::host_function, static_cast<const cudaLaunchKernelExC_v11060_params*>(block)->func};
      case CUPTI_RUNTIME_TRACE_CBID_cudaLaunchCooperativeKernel_v9000:
      case CUPTI_RUNTIME_TRACE_CBID_cudaLaunchCooperativeKernel_ptsz_v9000:
        return {Kind::host_function, static_cast<const cudaLaunchCooperativeKernel_v9000_params*>(block)->func};
#if CUPTI_API_VERSION >= 130000
      case CUPTI_RUNTIME_TRACE_CBID___cudaLaunchKernel_v13000:
      case CUPTI_RUNTIME_TRACE_CBID___cudaLaunchKernel_ptsz_v13000:
        return {Kind::library_kernel, static_cast<const KernelHandleLaunchParams*>(block)->kernel};
#endif
      default:
        return {};
    }
  }
  switch (cbid) {
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel:
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel_ptsz:
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel:
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel_ptsz:
      return {Kind::function, static_cast<const driver_params::LaunchKernel*>(block)->f};
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx:
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx_ptsz:
      return {Kind::function, static_cast<const driver_params::LaunchKernelEx*>(block)->f};
    default:
      return {};
  }
}

}  // namespace replay::detail::audit
