#pragma once
// The symbol of the kernel a kernel node launches, for kernels the runtime
// launched and for those launched through the driver API (cuLaunchKernel of a
// module's function, as cuBLAS, NVRTC-compiled code and TorchScript's fuser
// launch theirs), for which cudaGraphKernelNodeGetParams fails with
// cudaErrorInvalidDeviceFunction. Used by GraphRef's inspection and by the
// audit's inventory. Driver functions come from the runtime's entry-point
// query, so nothing links the driver library.
#include <replay/detail/require_cxx20.hpp>

#include <cuda.h>
#include <cuda_runtime_api.h>

#include "replay/error.hpp"

namespace replay::detail {

using GraphKernelNodeParamsFn = CUresult (*)(CUgraphNode, CUDA_KERNEL_NODE_PARAMS*);
using FuncGetNameFn = CUresult (*)(const char**, CUfunction);
using KernelGetNameFn = CUresult (*)(const char**, CUkernel);

// A driver function from the runtime's entry-point query, or null (older
// driver, no driver): never throws, leaves no error behind.
inline void* find_driver_function(const char* symbol, int cuda_version) noexcept {
  void* fn = nullptr;
  ::cudaDriverEntryPointQueryResult found = ::cudaDriverEntryPointSymbolNotFound;
#if CUDART_VERSION >= 12050
  const ::cudaError_t status = ::cudaGetDriverEntryPointByVersion(symbol, &fn, static_cast<unsigned>(cuda_version),
                                                                  ::cudaEnableDefault, &found);
#else
  (void)cuda_version;
  const ::cudaError_t status = ::cudaGetDriverEntryPoint(symbol, &fn, ::cudaEnableDefault, &found);
#endif
  if (!succeeded(status) || found != ::cudaDriverEntryPointSuccess) {
    return nullptr;
  }
  return fn;
}

// The (mangled) symbol of the kernel `node` launches: from the runtime
// (cudaFuncGetName) or, failing that, the driver (cuFuncGetName, or
// cuKernelGetName for a library's kernel). Null for a node neither can name
// (not a kernel node, an old driver). Never throws; no error is left in the
// runtime's last-error slot.
inline const char* kernel_node_symbol(::cudaGraphNode_t node) noexcept {
  const char* name = nullptr;
#if CUDART_VERSION >= 12030
  ::cudaKernelNodeParams runtime_params{};
  if (succeeded(::cudaGraphKernelNodeGetParams(node, &runtime_params)) && runtime_params.func != nullptr &&
      succeeded(::cudaFuncGetName(&name, runtime_params.func)) && name != nullptr) {
    return name;
  }
#endif
  static const auto get_params =
      reinterpret_cast<GraphKernelNodeParamsFn>(find_driver_function("cuGraphKernelNodeGetParams", 12000));
  static const auto func_name = reinterpret_cast<FuncGetNameFn>(find_driver_function("cuFuncGetName", 12030));
  static const auto kernel_name = reinterpret_cast<KernelGetNameFn>(find_driver_function("cuKernelGetName", 12030));
  CUDA_KERNEL_NODE_PARAMS params{};
  if (get_params == nullptr || get_params(reinterpret_cast<CUgraphNode>(node), &params) != CUDA_SUCCESS) {
    return nullptr;
  }
  name = nullptr;
  if (params.func != nullptr && func_name != nullptr && func_name(&name, params.func) == CUDA_SUCCESS &&
      name != nullptr) {
    return name;
  }
  name = nullptr;
  if (params.kern != nullptr && kernel_name != nullptr && kernel_name(&name, params.kern) == CUDA_SUCCESS &&
      name != nullptr) {
    return name;
  }
  return nullptr;
}

}  // namespace replay::detail
