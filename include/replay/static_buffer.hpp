#pragma once
// StaticBuffer<T, Space>: a typed, move-only allocation whose address never
// changes for its whole life (moves hand the same pointer over), which is what
// a captured graph needs: kernels in it hold raw pointers. Device memory by
// default; MemorySpace::pinned_host gives page-locked host memory (PinnedBuffer)
// for full-speed, truly asynchronous copies.
//
// BufferView<T, Space> is the non-owning window (pointer + count) through which
// copies and fills run; every copy checks that both sides have the same size.
#include <replay/detail/require_cxx20.hpp>

#include <cuda_runtime_api.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <source_location>
#include <span>
#include <string>
#include <type_traits>
#include <utility>

#include "replay/detail/capture_state.hpp"
#include "replay/detail/deferred_free.hpp"
#include "replay/detail/driver_memset.hpp"
#include "replay/detail/message.hpp"
#include "replay/error.hpp"
#include "replay/stream_ref.hpp"

namespace replay {

enum class MemorySpace {
  device,       // cudaMalloc
  pinned_host,  // cudaMallocHost: page-locked, device-accessible through UVA
};

constexpr const char* to_string(MemorySpace space) noexcept {
  return space == MemorySpace::device ? "device" : "pinned host";
}

template <class T>
concept BufferElement = ::std::is_trivially_copyable_v<T> && !::std::is_const_v<T> && !::std::is_volatile_v<T>;

namespace detail {

inline ::std::string size_mismatch(const char* what, ::std::size_t expected, ::std::size_t got) {
  return detail::concat(what, ": size mismatch, the buffer holds ", expected, " elements but the other side holds ",
                        got);
}

// Fills `count` elements of `T` at `dst` with `value`, in stream order.
template <class T>
void fill_elements(T* dst, ::std::size_t count, const T& value, ::cudaStream_t stream,
                   const ::std::source_location& where) {
  if (count == 0) {
    return;
  }
  ::std::array<unsigned char, sizeof(T)> bytes{};
  ::std::memcpy(bytes.data(), &value, sizeof(T));
  bool uniform = true;
  for (unsigned char b : bytes) {
    uniform = uniform && b == bytes[0];
  }
  if (uniform) {  // zero and other byte-uniform patterns: one plain memset
    check(::cudaMemsetAsync(dst, bytes[0], count * sizeof(T), stream), "cudaMemsetAsync", where);
    return;
  }
  // Otherwise write each 1-, 2- or 4-byte word of the element as a strided
  // column: sizeof(T) / word memsets, each one capturable as a graph node.
  constexpr ::std::size_t word = sizeof(T) % 4 == 0 ? 4 : (sizeof(T) % 2 == 0 ? 2 : 1);
  for (::std::size_t offset = 0; offset < sizeof(T); offset += word) {
    ::std::uint32_t pattern = 0;
    if constexpr (word == 4) {
      ::std::uint32_t w = 0;
      ::std::memcpy(&w, bytes.data() + offset, 4);
      pattern = w;
    } else if constexpr (word == 2) {
      ::std::uint16_t w = 0;
      ::std::memcpy(&w, bytes.data() + offset, 2);
      pattern = w;
    } else {
      pattern = bytes[offset];
    }
    memset_strided(reinterpret_cast<unsigned char*>(dst) + offset, sizeof(T), pattern, word, count, stream,
                   where);
  }
}

}  // namespace detail

template <BufferElement T, MemorySpace Space = MemorySpace::device>
class BufferView {
 public:
  using element_type = T;
  static constexpr MemorySpace memory_space = Space;

  constexpr BufferView() noexcept = default;
  constexpr BufferView(T* data, ::std::size_t count) noexcept : data_(data), size_(count) {}

  constexpr T* data() const noexcept { return data_; }
  constexpr ::std::size_t size() const noexcept { return size_; }
  constexpr ::std::size_t size_bytes() const noexcept { return size_ * sizeof(T); }
  constexpr bool empty() const noexcept { return size_ == 0; }
  // The elements as a span. For device memory the span is for passing to
  // kernels, not for reading on the host.
  constexpr ::std::span<T> span() const noexcept { return {data_, size_}; }

  // Elements [offset, offset + count). Out of range throws.
  BufferView subview(::std::size_t offset, ::std::size_t count,
                     ::std::source_location where = ::std::source_location::current()) const {
    if (offset > size_ || count > size_ - offset) {
      throw usage_error(detail::concat("subview(", offset, ", ", count, ") is out of range for ", size_, " elements"),
                        where);
    }
    return BufferView(data_ + offset, count);
  }
  BufferView first(::std::size_t count, ::std::source_location where = ::std::source_location::current()) const {
    return subview(0, count, where);
  }

  // Host element access, for pinned host memory only.
  T& operator[](::std::size_t i) const noexcept
    requires(Space == MemorySpace::pinned_host)
  {
    return data_[i];
  }

  // Asynchronous copy from host memory (pageable or pinned) into this view.
  void copy_from(::std::span<const T> host, StreamRef stream,
                 ::std::source_location where = ::std::source_location::current()) const {
    if (host.size() != size_) {
      throw usage_error(detail::size_mismatch("copy_from", size_, host.size()), where);
    }
    copy_bytes(data_, host.data(), size_bytes(), stream, where);
  }
  // Asynchronous copy from this view into host memory.
  void copy_to(::std::span<T> host, StreamRef stream,
               ::std::source_location where = ::std::source_location::current()) const {
    if (host.size() != size_) {
      throw usage_error(detail::size_mismatch("copy_to", size_, host.size()), where);
    }
    copy_bytes(host.data(), data_, size_bytes(), stream, where);
  }
  // Asynchronous copy from another buffer view, in any memory space.
  template <MemorySpace OtherSpace>
  void copy_from(BufferView<T, OtherSpace> other, StreamRef stream,
                 ::std::source_location where = ::std::source_location::current()) const {
    if (other.size() != size_) {
      throw usage_error(detail::size_mismatch("copy_from", size_, other.size()), where);
    }
    copy_bytes(data_, other.data(), size_bytes(), stream, where);
  }

  // Sets every element to `value`, in stream order (capturable).
  void fill(const T& value, StreamRef stream,
            ::std::source_location where = ::std::source_location::current()) const {
    detail::fill_elements(data_, size_, value, stream.get(), where);
  }
  // Sets every byte to zero, in stream order (capturable).
  void zero(StreamRef stream, ::std::source_location where = ::std::source_location::current()) const {
    if (size_ != 0) {
      check(::cudaMemsetAsync(data_, 0, size_bytes(), stream.get()), "cudaMemsetAsync", where);
    }
  }

 private:
  static void copy_bytes(void* dst, const void* src, ::std::size_t bytes, StreamRef stream,
                         const ::std::source_location& where) {
    if (bytes != 0) {
      // cudaMemcpyDefault: UVA tells the direction, so one path serves every space.
      check(::cudaMemcpyAsync(dst, src, bytes, ::cudaMemcpyDefault, stream.get()), "cudaMemcpyAsync", where);
    }
  }

  T* data_ = nullptr;
  ::std::size_t size_ = 0;
};

// Owns the memory of its view: a StaticBuffer is a BufferView (every query,
// slice and copy of the view, and usable wherever one is expected) that frees
// its memory. Moved from, it is an empty view that refuses copies and fills.
template <BufferElement T, MemorySpace Space = MemorySpace::device>
class StaticBuffer : public BufferView<T, Space> {
  using base = BufferView<T, Space>;

 public:
  using view_type = base;

  // An empty buffer: size 0, no allocation. Copies of empty spans into it are no-ops.
  StaticBuffer() noexcept = default;

  // Allocates `count` elements (uninitialized). Refused while this thread has
  // a non-relaxed capture open, where the allocation would invalidate it.
  explicit StaticBuffer(::std::size_t count, ::std::source_location where = ::std::source_location::current())
      : base(allocate(count, where), count) {}

  StaticBuffer(const StaticBuffer&) = delete;
  StaticBuffer& operator=(const StaticBuffer&) = delete;
  StaticBuffer(StaticBuffer&& other) noexcept
      : base(other.take()), moved_from_(::std::exchange(other.moved_from_, true)) {}
  StaticBuffer& operator=(StaticBuffer&& other) noexcept {
    if (this != &other) {
      reset();
      base::operator=(other.take());
      moved_from_ = ::std::exchange(other.moved_from_, true);
    }
    return *this;
  }
  ~StaticBuffer() { reset(); }

  // True after this buffer was moved from; every copy or fill then throws.
  bool moved_from() const noexcept { return moved_from_; }

  // The view (usage_error on a moved-from buffer); a StaticBuffer also
  // converts to it directly.
  view_type view(::std::source_location where = ::std::source_location::current()) const {
    require_live(where);
    return *this;
  }

  // The view's copies and fills, refused on a moved-from buffer.
  void copy_from(::std::span<const T> host, StreamRef stream,
                 ::std::source_location where = ::std::source_location::current()) const {
    view(where).copy_from(host, stream, where);
  }
  template <MemorySpace OtherSpace>
  void copy_from(BufferView<T, OtherSpace> other, StreamRef stream,
                 ::std::source_location where = ::std::source_location::current()) const {
    view(where).copy_from(other, stream, where);
  }
  void copy_to(::std::span<T> host, StreamRef stream,
               ::std::source_location where = ::std::source_location::current()) const {
    view(where).copy_to(host, stream, where);
  }
  void fill(const T& value, StreamRef stream,
            ::std::source_location where = ::std::source_location::current()) const {
    view(where).fill(value, stream, where);
  }
  void zero(StreamRef stream, ::std::source_location where = ::std::source_location::current()) const {
    view(where).zero(stream, where);
  }

 private:
  static T* allocate(::std::size_t count, const ::std::source_location& where) {
    if (count > ::std::numeric_limits<::std::size_t>::max() / sizeof(T)) {
      throw usage_error(
          detail::concat("StaticBuffer of ", count, " elements of ", sizeof(T), " bytes overflows size_t"), where);
    }
    if (count == 0) {
      return nullptr;
    }
    if (detail::allocation_is_illegal_now()) {
      throw usage_error(detail::concat("allocating a ", to_string(Space),
                                       " StaticBuffer while a stream capture is open on this thread would "
                                       "invalidate the capture; allocate before capture (or capture in "
                                       "CaptureMode::relaxed)"),
                        where);
    }
    void* ptr = nullptr;
    if constexpr (Space == MemorySpace::device) {
      check(::cudaMalloc(&ptr, count * sizeof(T)), "cudaMalloc", where);
    } else {
      check(::cudaMallocHost(&ptr, count * sizeof(T)), "cudaMallocHost", where);
    }
    return static_cast<T*>(ptr);
  }
  base take() noexcept {
    const base view = *this;
    base::operator=(base());
    return view;
  }
  void require_live(const ::std::source_location& where) const {
    if (moved_from_) [[unlikely]] {
      throw usage_error(detail::concat(to_string(Space), " StaticBuffer used after move"), where);
    }
  }
  void reset() noexcept {
    detail::free_or_defer(this->data(), Space == MemorySpace::device ? detail::FreeKind::device
                                                                     : detail::FreeKind::pinned_host);
    base::operator=(base());
  }

  bool moved_from_ = false;
};

template <BufferElement T>
using DeviceBuffer = StaticBuffer<T, MemorySpace::device>;
template <BufferElement T>
using PinnedBuffer = StaticBuffer<T, MemorySpace::pinned_host>;

}  // namespace replay
