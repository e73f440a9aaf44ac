#pragma once
// Graph memory queries: the device's graph memory pool (read, reset its high
// watermarks, trim) and the bytes a graph's allocation nodes request.
#include <replay/detail/require_cxx20.hpp>

#include <cuda_runtime_api.h>

#include <cstddef>
#include <source_location>

#include "replay/error.hpp"
#include "replay/graph.hpp"
#include "replay/shape_router/stats.hpp"

namespace replay {

// The device's graph memory pool counters.
inline GraphPoolMemory graph_pool_memory(int device,
                                         ::std::source_location where = ::std::source_location::current()) {
  auto read = [&](::cudaGraphMemAttributeType attr) {
    unsigned long long value = 0;  // cuuint64_t
    check(::cudaDeviceGetGraphMemAttribute(device, attr, &value), "cudaDeviceGetGraphMemAttribute", where);
    return static_cast<::std::size_t>(value);
  };
  GraphPoolMemory out;
  out.used = read(::cudaGraphMemAttrUsedMemCurrent);
  out.used_high = read(::cudaGraphMemAttrUsedMemHigh);
  out.reserved = read(::cudaGraphMemAttrReservedMemCurrent);
  out.reserved_high = read(::cudaGraphMemAttrReservedMemHigh);
  return out;
}

// Resets the used and reserved high watermarks to zero (the only value CUDA allows).
inline void reset_graph_pool_high_watermarks(int device,
                                             ::std::source_location where = ::std::source_location::current()) {
  unsigned long long zero = 0;
  check(::cudaDeviceSetGraphMemAttribute(device, ::cudaGraphMemAttrUsedMemHigh, &zero),
        "cudaDeviceSetGraphMemAttribute", where);
  zero = 0;
  check(::cudaDeviceSetGraphMemAttribute(device, ::cudaGraphMemAttrReservedMemHigh, &zero),
        "cudaDeviceSetGraphMemAttribute", where);
}

// Returns graph-pool memory that no executing or scheduled graph uses to the
// OS (cudaDeviceGraphMemTrim). Idle graphs re-map on their next launch.
inline void trim_graph_pool(int device, ::std::source_location where = ::std::source_location::current()) {
  check(::cudaDeviceGraphMemTrim(device), "cudaDeviceGraphMemTrim", where);
}

namespace detail {
// Free device memory in bytes (cudaMemGetInfo) on the current device.
inline ::std::size_t free_device_bytes(const ::std::source_location& where) {
  ::std::size_t free_bytes = 0;
  ::std::size_t total_bytes = 0;
  check(::cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo", where);
  return free_bytes;
}
}  // namespace detail

// Bytes requested by the memory-allocation nodes of `graph` (top level: stream
// capture puts them there).
inline ::std::size_t graph_alloc_bytes(const Graph& graph,
                                       ::std::source_location where = ::std::source_location::current()) {
  ::std::size_t bytes = 0;
  for (::cudaGraphNode_t node : graph.nodes(where)) {
    ::cudaGraphNodeType type{};
    check(::cudaGraphNodeGetType(node, &type), "cudaGraphNodeGetType", where);
    if (type == ::cudaGraphNodeTypeMemAlloc) {
      ::cudaMemAllocNodeParams params{};
      check(::cudaGraphMemAllocNodeGetParams(node, &params), "cudaGraphMemAllocNodeGetParams", where);
      bytes += params.bytesize;
    }
  }
  return bytes;
}

}  // namespace replay
