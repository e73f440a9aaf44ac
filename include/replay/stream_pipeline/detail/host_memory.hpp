#pragma once
#include <replay/detail/require_cxx20.hpp>
// Where a host range lives (pageable, pinned or device memory), as the copy
// engine sees it: asked of CUDA, or known from a HostRange's type.
#include <cuda_runtime_api.h>

#include <cstddef>

#include "replay/error.hpp"
#include "replay/stream_pipeline/host_range.hpp"

namespace replay::detail {

enum class HostMemory { pageable, pinned, device };

inline HostMemory host_memory_at(const void* address) noexcept {
  ::cudaPointerAttributes attributes{};
  if (const ::cudaError_t status = ::cudaPointerGetAttributes(&attributes, address); status != ::cudaSuccess) {
    clear_error_slot(status);
    return HostMemory::pageable;
  }
  switch (attributes.type) {
    case ::cudaMemoryTypeHost: return HostMemory::pinned;  // cudaMallocHost, cudaHostAlloc, cudaHostRegister
    case ::cudaMemoryTypeDevice: return HostMemory::device;
    default: return HostMemory::pageable;  // unregistered, or managed (host-accessible: staged)
  }
}

// Pinned only when both ends of the range are: a range that runs off a pinned
// allocation would make the copy engine fall back to a synchronous path. A
// range that starts in pageable memory is pageable (one query).
inline HostMemory host_memory_of(const void* data, ::std::size_t bytes) noexcept {
  if (bytes == 0 || data == nullptr) {
    return HostMemory::pageable;
  }
  const HostMemory first = host_memory_at(data);
  if (first == HostMemory::pageable) {
    return first;
  }
  const HostMemory last = host_memory_at(static_cast<const unsigned char*>(data) + bytes - 1);
  if (first == HostMemory::device || last == HostMemory::device) {
    return HostMemory::device;
  }
  return first == HostMemory::pinned && last == HostMemory::pinned ? HostMemory::pinned : HostMemory::pageable;
}

// The kind of a HostRange: from its type when known, else asked.
template <class T>
HostMemory host_memory_of(const HostRange<T>& range) noexcept {
  switch (range.kind()) {
    case HostMemoryKind::pinned: return HostMemory::pinned;
    case HostMemoryKind::pageable: return HostMemory::pageable;
    default: return host_memory_of(range.data(), range.size_bytes());
  }
}

}  // namespace replay::detail
