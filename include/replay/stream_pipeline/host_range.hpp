#pragma once
// HostRange<T>: a host range handed to a pipeline (an input, or a
// destination), with what kind of host memory it is when the caller's type
// says so: a PinnedBuffer, a pinned BufferView or a RegisteredHostBuffer is
// pinned, and the pipeline then never asks CUDA (cudaPointerGetAttributes).
// A plain span or vector is of unknown kind and is asked about per item.
#include <replay/detail/require_cxx20.hpp>

#include <concepts>
#include <cstddef>
#include <span>
#include <type_traits>

#include "replay/static_buffer.hpp"
#include "replay/stream_pipeline/registered_host_buffer.hpp"

namespace replay {

enum class HostMemoryKind {
  unknown,   // asked per item (cudaPointerGetAttributes on the range's ends)
  pageable,  // ordinary memory: staged through the pipeline's pinned buffers
  pinned,    // page-locked: read or written in place by the copy engines
};

// T is the element type as the pipeline sees it: `const In` for inputs, `Out`
// for destinations. Converts implicitly from anything a std::span<T> does
// (vectors, arrays, spans) and from pinned buffers and views.
template <class T>
class HostRange {
  using element = ::std::remove_const_t<T>;

 public:
  HostRange() noexcept = default;
  template <class R>
    requires(::std::convertible_to<R&&, ::std::span<T>> &&
             !::std::same_as<::std::remove_cvref_t<R>, HostRange>)
  HostRange(R&& range) noexcept  // NOLINT: implicit, like std::span
      : span_(::std::span<T>(::std::forward<R>(range))) {}
  template <class U>
    requires ::std::convertible_to<U (*)[], T (*)[]>
  HostRange(BufferView<U, MemorySpace::pinned_host> view) noexcept  // NOLINT: implicit
      : span_(view.data(), view.size()), kind_(HostMemoryKind::pinned) {}
  template <class U>
    requires ::std::convertible_to<U (*)[], T (*)[]>
  HostRange(const StaticBuffer<U, MemorySpace::pinned_host>& buffer)  // NOLINT: implicit
      : HostRange(buffer.view()) {}
  template <class U>
    requires ::std::convertible_to<U (*)[], T (*)[]>
  HostRange(const RegisteredHostBuffer<U>& buffer)  // NOLINT: implicit
      : HostRange(buffer.view()) {}

  // The caller vouches for the kind (memory from cudaHostAlloc, say). Saying
  // "pinned" of pageable memory is safe but slow: the copies then block.
  static HostRange pinned(::std::span<T> span) noexcept { return HostRange(span, HostMemoryKind::pinned); }
  static HostRange pageable(::std::span<T> span) noexcept { return HostRange(span, HostMemoryKind::pageable); }

  ::std::span<T> span() const noexcept { return span_; }
  T* data() const noexcept { return span_.data(); }
  ::std::size_t size() const noexcept { return span_.size(); }
  ::std::size_t size_bytes() const noexcept { return span_.size_bytes(); }
  HostMemoryKind kind() const noexcept { return kind_; }

 private:
  HostRange(::std::span<T> span, HostMemoryKind kind) noexcept : span_(span), kind_(kind) {}

  ::std::span<T> span_;
  HostMemoryKind kind_ = HostMemoryKind::unknown;
};

}  // namespace replay
