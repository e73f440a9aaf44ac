#pragma once
// RegisteredHostBuffer<T>: page-locks memory the caller already owns
// (cudaHostRegister) for as long as it lives, so that a recurring request or
// response buffer is copied by the DMA engines in place instead of through a
// pipeline's staging.
#include <replay/detail/require_cxx20.hpp>

#include <cuda_runtime_api.h>

#include <cstddef>
#include <source_location>
#include <span>
#include <utility>

#include "replay/detail/capture_state.hpp"
#include "replay/detail/message.hpp"
#include "replay/error.hpp"
#include "replay/static_buffer.hpp"

namespace replay {

// Registers `memory` with CUDA on construction and unregisters it in the
// destructor. The memory stays the caller's: it must outlive this object, and
// must not be freed or registered again (two registrations may not share a
// page) while this object lives. Registering costs about as much as copying
// the range once, so register buffers that are reused, not one-off ones.
// Move-only; a moved-from buffer throws usage_error on use.
template <BufferElement T>
class RegisteredHostBuffer {
 public:
  using element_type = T;
  using view_type = BufferView<T, MemorySpace::pinned_host>;

  RegisteredHostBuffer() noexcept = default;
  explicit RegisteredHostBuffer(::std::span<T> memory,
                                ::std::source_location where = ::std::source_location::current())
      : data_(memory.data()), size_(memory.size()) {
    if (memory.empty()) {
      return;  // nothing to register; an empty view of an empty range
    }
    if (detail::allocation_is_illegal_now()) {
      data_ = nullptr;
      size_ = 0;
      throw usage_error("RegisteredHostBuffer: cudaHostRegister while a stream capture is open on this thread "
                        "would invalidate the capture; register before capturing",
                        where);
    }
    const ::cudaError_t status = ::cudaHostRegister(memory.data(), memory.size_bytes(), cudaHostRegisterDefault);
    if (status != ::cudaSuccess) {
      data_ = nullptr;
      size_ = 0;
      detail::clear_error_slot(status);
      throw cuda_error(status, "cudaHostRegister", where,
                       detail::concat("RegisteredHostBuffer of ", memory.size_bytes(),
                                      " bytes (memory already registered, or part of a page another registration "
                                      "holds, is refused)"));
    }
    registered_ = true;
  }
  RegisteredHostBuffer(const RegisteredHostBuffer&) = delete;
  RegisteredHostBuffer& operator=(const RegisteredHostBuffer&) = delete;
  RegisteredHostBuffer(RegisteredHostBuffer&& other) noexcept
      : data_(::std::exchange(other.data_, nullptr)),
        size_(::std::exchange(other.size_, 0)),
        registered_(::std::exchange(other.registered_, false)),
        moved_from_(::std::exchange(other.moved_from_, true)) {}
  RegisteredHostBuffer& operator=(RegisteredHostBuffer&& other) noexcept {
    if (this != &other) {
      reset();
      data_ = ::std::exchange(other.data_, nullptr);
      size_ = ::std::exchange(other.size_, 0);
      registered_ = ::std::exchange(other.registered_, false);
      moved_from_ = ::std::exchange(other.moved_from_, true);
    }
    return *this;
  }
  ~RegisteredHostBuffer() { reset(); }

  T* data() const noexcept { return data_; }
  ::std::size_t size() const noexcept { return size_; }
  ::std::size_t size_bytes() const noexcept { return size_ * sizeof(T); }
  bool empty() const noexcept { return size_ == 0; }
  bool moved_from() const noexcept { return moved_from_; }

  // The registered memory as a pinned view: a StreamPipeline uses it in place
  // without asking CUDA what kind of memory it is.
  view_type view(::std::source_location where = ::std::source_location::current()) const {
    if (moved_from_) [[unlikely]] {
      throw usage_error("RegisteredHostBuffer used after move", where);
    }
    return view_type(data_, size_);
  }
  operator view_type() const { return view(); }  // NOLINT: usable wherever a pinned view is
  ::std::span<T> span(::std::source_location where = ::std::source_location::current()) const {
    return view(where).span();
  }
  view_type subview(::std::size_t offset, ::std::size_t count,
                    ::std::source_location where = ::std::source_location::current()) const {
    return view(where).subview(offset, count, where);
  }

 private:
  void reset() noexcept {
    if (registered_) {
      detail::clear_error_slot(::cudaHostUnregister(data_));
    }
    data_ = nullptr;
    size_ = 0;
    registered_ = false;
  }

  T* data_ = nullptr;
  ::std::size_t size_ = 0;
  bool registered_ = false;
  bool moved_from_ = false;
};

}  // namespace replay
