#pragma once
// Stream: an owning, move-only CUDA stream, and a StreamRef. Non-blocking by default, so that
// it never synchronizes implicitly with the legacy default stream, which
// would make it unusable for capture next to legacy-stream work.
#include <replay/detail/require_cxx20.hpp>

#include <cuda_runtime_api.h>

#include <cstddef>
#include <source_location>
#include <utility>

#include "replay/detail/unique_handle.hpp"
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

namespace detail {
struct stream_traits {
  using handle_type = ::cudaStream_t;
  static ::cudaStream_t empty() noexcept { return invalid_stream(); }
  static void destroy(::cudaStream_t stream) noexcept { (void)::cudaStreamDestroy(stream); }
};
}  // namespace detail

// A Stream is a StreamRef (it has every query of the view and goes wherever
// one is expected) that destroys its stream. Moved from or released, it holds
// an invalid handle that replay refuses with usage_error.
class Stream : public detail::unique_handle<StreamRef, detail::stream_traits> {
  using base = detail::unique_handle<StreamRef, detail::stream_traits>;

 public:
  explicit Stream(StreamFlags flags = StreamFlags::non_blocking, int priority = 0,
                  ::std::source_location where = ::std::source_location::current())
      : base(create(flags, priority, where)) {}

  // Adopts a stream created elsewhere; the Stream destroys it.
  [[nodiscard]] static Stream from_native_handle(::cudaStream_t stream) noexcept { return Stream(stream, adopt_tag{}); }
  // A literal 0 or nullptr is the legacy default stream, which no one may destroy.
  static Stream from_native_handle(int) = delete;
  static Stream from_native_handle(::std::nullptr_t) = delete;

  Stream(Stream&&) noexcept = default;
  Stream& operator=(Stream&&) noexcept = default;
  ~Stream() = default;

  // The non-owning view; usage_error on a moved-from Stream.
  StreamRef ref(::std::source_location where = ::std::source_location::current()) const {
    return StreamRef(handle(where));
  }

 private:
  struct adopt_tag {};
  Stream(::cudaStream_t stream, adopt_tag) noexcept : base(stream) {}

  static ::cudaStream_t create(StreamFlags flags, int priority, const ::std::source_location& where) {
    ::cudaStream_t stream = nullptr;
    check(::cudaStreamCreateWithPriority(&stream, to_underlying(flags), priority), "cudaStreamCreateWithPriority",
          where);
    return stream;
  }
};

}  // namespace replay
