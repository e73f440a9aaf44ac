#pragma once
// Stream-ordered memset of 8-, 16- and 32-bit patterns. The runtime API only
// sets bytes, so these come from the driver through the runtime's entry-point
// query; replay still links CUDA::cudart alone (no libcuda at link time).
#include <replay/detail/require_cxx20.hpp>

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <source_location>

#include "replay/error.hpp"

namespace replay::detail {

using MemsetD2D8Fn = CUresult (*)(CUdeviceptr, ::std::size_t, unsigned char, ::std::size_t, ::std::size_t,
                                  CUstream);
using MemsetD2D16Fn = CUresult (*)(CUdeviceptr, ::std::size_t, unsigned short, ::std::size_t,
                                   ::std::size_t, CUstream);
using MemsetD2D32Fn = CUresult (*)(CUdeviceptr, ::std::size_t, unsigned int, ::std::size_t,
                                   ::std::size_t, CUstream);

inline void* driver_entry_point(const char* symbol, const ::std::source_location& where) {
  void* fn = nullptr;
  ::cudaDriverEntryPointQueryResult found = ::cudaDriverEntryPointSymbolNotFound;
#if CUDART_VERSION >= 12050
  check(::cudaGetDriverEntryPointByVersion(symbol, &fn, 12000, ::cudaEnableDefault, &found),
        "cudaGetDriverEntryPointByVersion", where);
#else
  check(::cudaGetDriverEntryPoint(symbol, &fn, ::cudaEnableDefault, &found), "cudaGetDriverEntryPoint",
        where);
#endif
  if (found != ::cudaDriverEntryPointSuccess || fn == nullptr) {
    throw cuda_error(::cudaErrorSymbolNotFound, symbol, where, "driver entry point not available");
  }
  return fn;
}

inline void check_driver(CUresult result, const char* api, const ::std::source_location& where) {
  if (result != CUDA_SUCCESS) [[unlikely]] {
    // CUresult and cudaError_t share their numbering for the common codes.
    // Through throw_cuda_error, so that a capture broken here is named by
    // CaptureScope; the runtime's last-error slot was not set by this call,
    // so it is not cleared.
    throw_cuda_error(static_cast<::cudaError_t>(result), api, where, ErrorSource::driver);
  }
}

// Sets `rows` elements spaced `pitch` bytes apart, each `word` bytes wide
// (1, 2 or 4), to `value`, in stream order.
inline void memset_strided(void* dst, ::std::size_t pitch, ::std::uint32_t value, ::std::size_t word,
                           ::std::size_t rows, ::cudaStream_t stream, const ::std::source_location& where) {
  const auto ptr = reinterpret_cast<CUdeviceptr>(dst);
  const auto cu_stream = reinterpret_cast<CUstream>(stream);
  switch (word) {
    case 1: {
      static const auto fn = reinterpret_cast<MemsetD2D8Fn>(driver_entry_point("cuMemsetD2D8Async", where));
      check_driver(fn(ptr, pitch, static_cast<unsigned char>(value), 1, rows, cu_stream),
                   "cuMemsetD2D8Async", where);
      return;
    }
    case 2: {
      static const auto fn = reinterpret_cast<MemsetD2D16Fn>(driver_entry_point("cuMemsetD2D16Async", where));
      check_driver(fn(ptr, pitch, static_cast<unsigned short>(value), 1, rows, cu_stream),
                   "cuMemsetD2D16Async", where);
      return;
    }
    case 4: {
      static const auto fn = reinterpret_cast<MemsetD2D32Fn>(driver_entry_point("cuMemsetD2D32Async", where));
      check_driver(fn(ptr, pitch, value, 1, rows, cu_stream), "cuMemsetD2D32Async", where);
      return;
    }
    default:
      throw usage_error("memset_strided: word must be 1, 2 or 4 bytes", where);
  }
}

}  // namespace replay::detail
