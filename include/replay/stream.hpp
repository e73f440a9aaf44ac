#pragma once
// Stream: an owning, move-only CUDA stream. Non-blocking by default, so that
// it never synchronizes implicitly with the legacy default stream, which
// would make it unusable for capture next to legacy-stream work.
#include <replay/detail/require_cxx20.hpp>

#include <cuda_runtime_api.h>

#include <source_location>
#include <utility>

#include "replay/error.hpp"
#include "replay/flags.hpp"
#include "replay/stream_ref.hpp"

namespace replay {

enum class StreamFlags : unsigned int {
  blocking = cudaStreamDefault,         // synchronizes with the legacy default stream
  non_blocking = cudaStreamNonBlocking,  // the default
};
template <>
inline constexpr bool enable_bitmask<StreamFlags> = true;

struct StreamPriorityRange {
  int least;     // numerically largest, lowest priority (0 on current GPUs)
  int greatest;  // numerically smallest, highest priority
};

inline StreamPriorityRange stream_priority_range(
    ::std::source_location where = ::std::source_location::current()) {
  StreamPriorityRange range{};
  check(::cudaDeviceGetStreamPriorityRange(&range.least, &range.greatest),
        "cudaDeviceGetStreamPriorityRange", where);
  return range;
}

class Stream {
 public:
  explicit Stream(StreamFlags flags = StreamFlags::non_blocking, int priority = 0,
                  ::std::source_location where = ::std::source_location::current()) {
    check(::cudaStreamCreateWithPriority(&stream_, to_underlying(flags), priority),
          "cudaStreamCreateWithPriority", where);
  }

  // Adopts a stream created elsewhere; the Stream destroys it.
  [[nodiscard]] static Stream from_native_handle(::cudaStream_t stream) noexcept {
    return Stream(stream, adopt_tag{});
  }

  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  Stream(Stream&& other) noexcept : stream_(::std::exchange(other.stream_, nullptr)) {}
  Stream& operator=(Stream&& other) noexcept {
    if (this != &other) {
      reset();
      stream_ = ::std::exchange(other.stream_, nullptr);
    }
    return *this;
  }
  ~Stream() { reset(); }

  // Gives up ownership: the caller destroys the returned handle.
  [[nodiscard]] ::cudaStream_t release() noexcept { return ::std::exchange(stream_, nullptr); }

  ::cudaStream_t get() const noexcept { return stream_; }
  explicit operator bool() const noexcept { return stream_ != nullptr; }

  // The non-owning view; throws usage_error on a moved-from Stream rather than
  // silently handing out the legacy stream (a null handle).
  StreamRef ref(::std::source_location where = ::std::source_location::current()) const {
    if (stream_ == nullptr) {
      throw usage_error("Stream used after move (or after release())", where);
    }
    return StreamRef(stream_);
  }
  operator StreamRef() const { return ref(); }  // NOLINT: a Stream is usable wherever a view is

  void synchronize(::std::source_location where = ::std::source_location::current()) const {
    ref(where).synchronize(where);
  }
  bool ready(::std::source_location where = ::std::source_location::current()) const {
    return ref(where).ready(where);
  }
  bool is_capturing(::std::source_location where = ::std::source_location::current()) const {
    return ref(where).is_capturing(where);
  }
  int priority(::std::source_location where = ::std::source_location::current()) const {
    return ref(where).priority(where);
  }

 private:
  struct adopt_tag {};
  Stream(::cudaStream_t stream, adopt_tag) noexcept : stream_(stream) {}

  void reset() noexcept {
    if (stream_ != nullptr) {
      (void)::cudaStreamDestroy(stream_);  // destructors never throw
      stream_ = nullptr;
    }
  }

  ::cudaStream_t stream_ = nullptr;
};

}  // namespace replay
