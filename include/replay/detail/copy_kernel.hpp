#pragma once
#include <replay/detail/require_cxx20.hpp>
// A byte-copy kernel for graph kernel nodes, loaded once per process from
// PTX text so that the headers need no CUDA compiler: it copies between
// device memory and pinned host memory the device can address (zero-copy).
// StreamPipeline's launch groups use it instead of memcpy nodes, which cost
// a couple of microseconds of host time each per launch where a kernel node
// costs tens of nanoseconds. The PTX targets sm_75, while CUDA 12 supports
// older GPUs too (and a process may forbid PTX JIT): copy_kernel_on() says
// whether it runs on a device, and why not, so that the launch groups fall
// back to memcpy nodes there.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <map>
#include <mutex>
#include <source_location>
#include <string>
#include <utility>

#include "replay/detail/device_scope.hpp"
#include "replay/detail/message.hpp"
#include "replay/error.hpp"

namespace replay::detail {

// The PTX of (nvcc -ptx -arch=compute_75, ISA version set to 7.0, the
// oldest that any supported driver reads):
//
//   extern "C" __global__ void replay_copy_bytes(const unsigned char* src, unsigned char* dst,
//                                                unsigned long long bytes) {
//     const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
//     unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
//     const unsigned long long both = (unsigned long long)src | (unsigned long long)dst | bytes;
//     if ((both & 15) == 0) {          // 16 bytes at a time when both ends and the size allow
//       const uint4* s = (const uint4*)src; uint4* d = (uint4*)dst;
//       for (unsigned long long n = bytes / 16; i < n; i += stride) d[i] = s[i];
//     } else if ((both & 3) == 0) {    // else 4
//       const unsigned* s = (const unsigned*)src; unsigned* d = (unsigned*)dst;
//       for (unsigned long long n = bytes / 4; i < n; i += stride) d[i] = s[i];
//     } else {                         // else 1
//       for (; i < bytes; i += stride) dst[i] = src[i];
//     }
//   }
//
// (Plain loads: the read-only cache path is not used on host memory.)
inline constexpr const char copy_kernel_ptx[] = R"PTX(
.version 7.0
.target sm_75
.address_size 64

  // .globl  replay_copy_bytes

.visible .entry replay_copy_bytes(
  .param .u64 replay_copy_bytes_param_0,
  .param .u64 replay_copy_bytes_param_1,
  .param .u64 replay_copy_bytes_param_2
)
{
  .reg .pred   %p<9>;
  .reg .b16   %rs<2>;
  .reg .b32   %r<14>;
  .reg .b64   %rd<33>;


  ld.param.u64   %rd15, [replay_copy_bytes_param_0];
  ld.param.u64   %rd16, [replay_copy_bytes_param_1];
  ld.param.u64   %rd14, [replay_copy_bytes_param_2];
  cvta.to.global.u64   %rd1, %rd16;
  cvta.to.global.u64   %rd2, %rd15;
  mov.u32   %r1, %nctaid.x;
  mov.u32   %r2, %ntid.x;
  mul.wide.u32   %rd3, %r1, %r2;
  mov.u32   %r3, %ctaid.x;
  mul.wide.u32   %rd17, %r3, %r2;
  mov.u32   %r4, %tid.x;
  cvt.u64.u32   %rd18, %r4;
  add.s64   %rd30, %rd17, %rd18;
  or.b64    %rd19, %rd16, %rd15;
  or.b64    %rd5, %rd19, %rd14;
  and.b64    %rd20, %rd5, 15;
  setp.eq.s64   %p1, %rd20, 0;
  @%p1 bra   $L__BB0_6;

  and.b64    %rd21, %rd5, 3;
  setp.eq.s64   %p2, %rd21, 0;
  @%p2 bra   $L__BB0_4;

  setp.ge.u64   %p3, %rd30, %rd14;
  @%p3 bra   $L__BB0_8;

$L__BB0_3:
  add.s64   %rd22, %rd2, %rd30;
  ld.global.u8   %rs1, [%rd22];
  add.s64   %rd23, %rd1, %rd30;
  st.global.u8   [%rd23], %rs1;
  add.s64   %rd30, %rd30, %rd3;
  setp.lt.u64   %p4, %rd30, %rd14;
  @%p4 bra   $L__BB0_3;
  bra.uni   $L__BB0_8;

$L__BB0_6:
  shr.u64   %rd11, %rd14, 4;
  setp.ge.u64   %p7, %rd30, %rd11;
  @%p7 bra   $L__BB0_8;

$L__BB0_7:
  shl.b64   %rd27, %rd30, 4;
  add.s64   %rd28, %rd1, %rd27;
  add.s64   %rd29, %rd2, %rd27;
  ld.global.v4.u32   {%r6, %r7, %r8, %r9}, [%rd29];
  st.global.v4.u32   [%rd28], {%r6, %r7, %r8, %r9};
  add.s64   %rd30, %rd30, %rd3;
  setp.lt.u64   %p8, %rd30, %rd11;
  @%p8 bra   $L__BB0_7;
  bra.uni   $L__BB0_8;

$L__BB0_4:
  shr.u64   %rd8, %rd14, 2;
  setp.ge.u64   %p5, %rd30, %rd8;
  @%p5 bra   $L__BB0_8;

$L__BB0_5:
  shl.b64   %rd24, %rd30, 2;
  add.s64   %rd25, %rd2, %rd24;
  ld.global.u32   %r5, [%rd25];
  add.s64   %rd26, %rd1, %rd24;
  st.global.u32   [%rd26], %r5;
  add.s64   %rd30, %rd30, %rd3;
  setp.lt.u64   %p6, %rd30, %rd8;
  @%p6 bra   $L__BB0_5;

$L__BB0_8:
  ret;

}
)PTX";

// Statuses that say the code cannot run here (an architecture the PTX does
// not target, a driver that cannot compile it, PTX JIT disabled), as opposed
// to a broken device or context.
constexpr bool is_code_load_error(::cudaError_t status) noexcept {
  switch (status) {
    case ::cudaErrorInvalidPtx:
    case ::cudaErrorUnsupportedPtxVersion:
    case ::cudaErrorNoKernelImageForDevice:
    case ::cudaErrorInvalidKernelImage:
    case ::cudaErrorJitCompilerNotFound:
    case ::cudaErrorJitCompilationDisabled:
    case ::cudaErrorInvalidSource:
      return true;
    default:
      return false;
  }
}

// The copy kernel where it could be loaded, else the load's status and a
// sentence saying why not (empty when it loaded).
struct CopyKernelLoad {
  ::cudaKernel_t kernel = nullptr;
  ::cudaError_t status = ::cudaSuccess;
  const char* api = "cudaLibraryLoadData";  // the call that refused it
  ::std::string unavailable;
};

inline ::std::string describe_copy_kernel_failure(const char* api, ::cudaError_t status, int device) {
  return detail::concat("replay's copy kernel (PTX for sm_75) cannot be loaded", device >= 0 ? " on device " : "",
                        device >= 0 ? ::std::to_string(device) : ::std::string(), ": ", api, " returned ",
                        ::cudaGetErrorName(status), " (", ::cudaGetErrorString(status), ")");
}

// The library, loaded once per process (cudaLibraryLoadData; it stays loaded
// for the process, as modules linked into a program do). A load that fails
// because the code cannot run here is remembered; other failures throw (and
// the next call tries again).
inline const CopyKernelLoad& copy_kernel_library(const ::std::source_location& where) {
  static const CopyKernelLoad library = [&] {
    CopyKernelLoad load;
    ::cudaLibrary_t handle = nullptr;
    load.status = ::cudaLibraryLoadData(&handle, copy_kernel_ptx, nullptr, nullptr, 0, nullptr, nullptr, 0);
    if (is_code_load_error(load.status)) {
      clear_error_slot(load.status);
      load.unavailable = describe_copy_kernel_failure("cudaLibraryLoadData", load.status, -1);
      return load;
    }
    check(load.status, "cudaLibraryLoadData", where);
    check(::cudaLibraryGetKernel(&load.kernel, handle, "replay_copy_bytes"), "cudaLibraryGetKernel", where);
    return load;
  }();
  return library;
}

// The kernel (cuda_error where it cannot be loaded).
inline ::cudaKernel_t copy_kernel(const ::std::source_location& where) {
  const CopyKernelLoad& library = copy_kernel_library(where);
  if (library.kernel == nullptr) {
    throw cuda_error(library.status, "cudaLibraryLoadData", where, library.unavailable);
  }
  return library.kernel;
}

// The kernel on `device`, or why it cannot run there. The library is loaded
// into a device's context when the kernel is first used there: querying its
// attributes on `device` does that, and fails with a code-load status where
// the PTX cannot be compiled for the device. Remembered per device.
inline const CopyKernelLoad& copy_kernel_on(int device, const ::std::source_location& where) {
  static ::std::mutex mutex;
  static ::std::map<int, CopyKernelLoad> devices;  // never erased: references stay valid
  const ::std::lock_guard<::std::mutex> lock(mutex);
  if (const auto found = devices.find(device); found != devices.end()) {
    return found->second;
  }
  CopyKernelLoad load = copy_kernel_library(where);
  if (load.kernel != nullptr) {
    const DeviceScope on_device(device, where);
    ::cudaFuncAttributes attributes{};
    const ::cudaError_t status = ::cudaFuncGetAttributes(&attributes, reinterpret_cast<const void*>(load.kernel));
    if (is_code_load_error(status)) {
      clear_error_slot(status);
      load = CopyKernelLoad{nullptr, status, "cudaFuncGetAttributes",
                            describe_copy_kernel_failure("cudaFuncGetAttributes", status, device)};
    } else {
      check(status, "cudaFuncGetAttributes", where);
    }
  }
  return devices.emplace(device, ::std::move(load)).first->second;
}

// One copy node's arguments. The node copies them when it is made or set,
// so this only needs to live across that call.
struct CopyNodeArgs {
  const void* source;
  void* target;
  unsigned long long bytes;
  void* pointers[3] = {&source, &target, &bytes};

  CopyNodeArgs(const void* from, void* to, ::std::size_t count) noexcept : source(from), target(to), bytes(count) {}
  CopyNodeArgs(const CopyNodeArgs&) = delete;
  CopyNodeArgs& operator=(const CopyNodeArgs&) = delete;

  ::cudaKernelNodeParams params(::cudaKernel_t kernel) noexcept {
    ::cudaKernelNodeParams p{};
    p.func = reinterpret_cast<void*>(kernel);
    // 16 bytes a thread, 256 threads a block; a grid-stride loop past 1024 blocks.
    p.gridDim = dim3(static_cast<unsigned>(::std::clamp<unsigned long long>((bytes / 16 + 255) / 256, 1, 1024)));
    p.blockDim = dim3(256);
    p.kernelParams = pointers;
    return p;
  }
};

// Adds a node that copies `bytes` from `source` to `target` (device
// addresses: device memory, or device-mapped host memory) after `dependency`.
inline ::cudaGraphNode_t add_copy_node(::cudaGraph_t graph, ::cudaGraphNode_t dependency, const void* source,
                                       void* target, ::std::size_t bytes, const ::std::source_location& where) {
  CopyNodeArgs args(source, target, bytes);
  const ::cudaKernelNodeParams params = args.params(copy_kernel(where));
  ::cudaGraphNode_t node = nullptr;
  check(::cudaGraphAddKernelNode(&node, graph, dependency != nullptr ? &dependency : nullptr,
                                 dependency != nullptr ? 1 : 0, &params),
        "cudaGraphAddKernelNode", where);
  return node;
}

// Re-points a copy node of an executable graph: the status of
// cudaGraphExecKernelNodeSetParams, for the caller to check.
inline ::cudaError_t repoint_copy_node(::cudaGraphExec_t exec, ::cudaGraphNode_t node, const void* source,
                                       void* target, ::std::size_t bytes, const ::std::source_location& where) {
  CopyNodeArgs args(source, target, bytes);
  const ::cudaKernelNodeParams params = args.params(copy_kernel(where));
  return ::cudaGraphExecKernelNodeSetParams(exec, node, &params);
}

// The same, false when CUDA refuses (the caller then takes another path).
inline bool set_copy_node(::cudaGraphExec_t exec, ::cudaGraphNode_t node, const void* source, void* target,
                          ::std::size_t bytes, const ::std::source_location& where) {
  return succeeded(repoint_copy_node(exec, node, source, target, bytes, where));
}

// The address the device reads or writes pinned host memory `p` through, or
// nullptr when `p` is not host memory the device can address (pageable
// memory, or registered without a device mapping).
inline void* device_address_of_host(const void* p) noexcept {
  ::cudaPointerAttributes attributes{};
  if (!succeeded(::cudaPointerGetAttributes(&attributes, p)) || attributes.type != ::cudaMemoryTypeHost) {
    return nullptr;
  }
  return attributes.devicePointer;
}

}  // namespace replay::detail
