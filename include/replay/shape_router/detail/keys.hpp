#pragma once
// ShapeRouter internals over its keys: the map type per key, extent limits,
// element counts, and stream formatting for messages.
#include <replay/detail/require_cxx20.hpp>

#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <sstream>
#include <string>
#include <type_traits>
#include <unordered_map>

#include "replay/shape_router/keys.hpp"

namespace replay::detail {

template <class Key, class Value, bool Hashed = HashableKey<Key>>
struct key_map_select {
  using type = ::std::unordered_map<Key, Value, key_hash<Key>>;
};
template <class Key, class Value>
struct key_map_select<Key, Value, false> {
  using type = ::std::map<Key, Value>;
};
// Hash map where the key hashes, ordered map otherwise.
template <class Key, class Value>
using key_map = typename key_map_select<Key, Value>::type;

template <class Key>
::std::int64_t max_extent(::std::size_t dim) noexcept {
  if constexpr (requires { shape_traits<Key>::max_extent(dim); }) {
    return static_cast<::std::int64_t>(shape_traits<Key>::max_extent(dim));
  } else {
    return ::std::numeric_limits<::std::int64_t>::max();
  }
}

// Product of the extents (saturating); 1 for a key that is not a shape.
template <class Key>
::std::uint64_t element_count(const Key& key) noexcept {
  if constexpr (ShapeKey<Key>) {
    ::std::uint64_t product = 1;
    for (::std::size_t d = 0; d < shape_traits<Key>::rank; ++d) {
      const ::std::int64_t e = shape_traits<Key>::extent(key, d);
      const auto extent = e > 0 ? static_cast<::std::uint64_t>(e) : 0U;
      if (extent != 0 && product > ::std::numeric_limits<::std::uint64_t>::max() / extent) {
        return ::std::numeric_limits<::std::uint64_t>::max();
      }
      product *= extent;
    }
    return product;
  } else {
    return 1;
  }
}
// The key text is public (replay::describe_key, shape_router/keys.hpp); the
// router's messages name it as detail::describe_key.
using ::replay::describe_key;

// "stream 0x7f3a5c001230" for a stream handle (a pointer, or a type whose
// get() returns one, as StreamRef's does), or what operator<< prints.
template <class Stream>
::std::string describe_stream(const Stream& stream) {
  ::std::ostringstream os;
  os << "stream ";
  const auto handle = [&os](const void* p) {
    if (p == nullptr) {
      os << "0 (the default stream)";
    } else {
      os << p;
    }
  };
  if constexpr (::std::is_pointer_v<Stream>) {
    handle(static_cast<const void*>(stream));
  } else if constexpr (requires { static_cast<const void*>(stream.get()); }) {
    handle(static_cast<const void*>(stream.get()));
  } else if constexpr (ostreamable<Stream>) {
    os << stream;
  } else {
    os << "<stream>";
  }
  return os.str();
}

}  // namespace replay::detail
