#pragma once
#include <replay/detail/require_cxx20.hpp>
// Host copies of large chunks into memory the CPU does not read next: the
// pipeline copies a staged output to the caller's pageable buffer with it.
// Non-temporal stores write whole cache lines without first reading them
// (the read-for-ownership of an ordinary store). Measured on an H200 host,
// 8 threads copying 1 MiB chunks: pinned to pageable 79 GB/s against
// memcpy's 37; pageable to pinned staging the other way round (35 against
// 44), so inputs are staged with memcpy.
#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__SSE2__) || defined(_M_X64)
#include <emmintrin.h>
#endif

namespace replay::detail {

// Below this, an ordinary memcpy: the target may still be read from cache,
// and the fence would cost more than the stores save.
inline constexpr ::std::size_t streaming_copy_min_bytes = ::std::size_t{256} << 10;

// Copies like memcpy (no overlap). When it returns, its stores are ordered
// before any later store of this thread (an sfence), so publishing the data
// (recording work that reads it, releasing a lock) needs nothing more.
inline void copy_streaming(void* to, const void* from, ::std::size_t bytes) noexcept {
#if defined(__SSE2__) || defined(_M_X64)
  if (bytes < streaming_copy_min_bytes) {
    ::std::memcpy(to, from, bytes);
    return;
  }
  auto* d = static_cast<unsigned char*>(to);
  const auto* s = static_cast<const unsigned char*>(from);
  const ::std::size_t head = (64 - (reinterpret_cast<::std::uintptr_t>(d) & 63)) & 63;  // to a line boundary
  ::std::memcpy(d, s, head);
  d += head;
  s += head;
  bytes -= head;
  const ::std::size_t body = bytes & ~::std::size_t{63};
  for (::std::size_t i = 0; i < body; i += 64) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 32));
    const __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 48), e);
  }
  _mm_sfence();
  ::std::memcpy(d + body, s + body, bytes - body);
#else
  ::std::memcpy(to, from, bytes);
#endif
}

}  // namespace replay::detail
