#pragma once
// ShapeRouter's keys: the shape_traits customization point (what a key's
// dimensions are; specialize it for your own shape type), the ShapeKey,
// HashableKey and RouterKey concepts, key_hash, and describe_key (a key as
// messages print it).
#include <replay/detail/require_cxx20.hpp>

#include <array>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <ostream>
#include <sstream>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

namespace replay {

// What the dimensions of a key are. Specialize it for your own shape type to
// make it bucketable and to get padding statistics:
//   static constexpr ::std::size_t rank;                        // >= 1
//   static ::std::int64_t extent(const Key&, ::std::size_t dim);
//   static void set_extent(Key&, ::std::size_t dim, ::std::int64_t value);
//   static ::std::int64_t max_extent(::std::size_t dim);        // optional
// Provided for integers (a batch size), std::array<I, N>, std::tuple<I...>
// and std::pair<I, J> of integers.
template <class Key>
struct shape_traits {};

namespace detail {

template <class I>
concept shape_integer = ::std::integral<I> && !::std::same_as<::std::remove_cv_t<I>, bool>;

// Saturates: an unsigned value above INT64_MAX reads as INT64_MAX (too large
// for any bucket) rather than as a negative extent.
template <shape_integer I>
constexpr ::std::int64_t to_extent(I value) noexcept {
  if constexpr (::std::is_unsigned_v<I> && sizeof(I) >= sizeof(::std::int64_t)) {
    constexpr auto limit = static_cast<::std::uint64_t>(::std::numeric_limits<::std::int64_t>::max());
    return static_cast<::std::uint64_t>(value) > limit ? ::std::numeric_limits<::std::int64_t>::max()
                                                        : static_cast<::std::int64_t>(value);
  } else {
    return static_cast<::std::int64_t>(value);
  }
}

template <shape_integer I>
constexpr ::std::int64_t max_extent_of() noexcept {
  if constexpr (::std::is_unsigned_v<I> && sizeof(I) >= sizeof(::std::int64_t)) {
    return ::std::numeric_limits<::std::int64_t>::max();
  } else {
    return static_cast<::std::int64_t>(::std::numeric_limits<I>::max());
  }
}

}  // namespace detail

template <detail::shape_integer I>
struct shape_traits<I> {
  static constexpr ::std::size_t rank = 1;
  static constexpr ::std::int64_t extent(const I& key, ::std::size_t /*dim*/) noexcept {
    return detail::to_extent(key);
  }
  static constexpr void set_extent(I& key, ::std::size_t /*dim*/, ::std::int64_t value) noexcept {
    key = static_cast<I>(value);
  }
  static constexpr ::std::int64_t max_extent(::std::size_t /*dim*/) noexcept { return detail::max_extent_of<I>(); }
};

template <detail::shape_integer I, ::std::size_t N>
  requires(N > 0)
struct shape_traits<::std::array<I, N>> {
  static constexpr ::std::size_t rank = N;
  static constexpr ::std::int64_t extent(const ::std::array<I, N>& key, ::std::size_t dim) noexcept {
    return detail::to_extent(key[dim]);
  }
  static constexpr void set_extent(::std::array<I, N>& key, ::std::size_t dim, ::std::int64_t value) noexcept {
    key[dim] = static_cast<I>(value);
  }
  static constexpr ::std::int64_t max_extent(::std::size_t /*dim*/) noexcept { return detail::max_extent_of<I>(); }
};

template <detail::shape_integer... I>
  requires(sizeof...(I) > 0)
struct shape_traits<::std::tuple<I...>> {
  static constexpr ::std::size_t rank = sizeof...(I);
  static constexpr ::std::int64_t extent(const ::std::tuple<I...>& key, ::std::size_t dim) noexcept {
    ::std::int64_t out = 0;
    ::std::size_t i = 0;
    ::std::apply([&](const auto&... v) { ((out = (i++ == dim ? detail::to_extent(v) : out)), ...); }, key);
    return out;
  }
  static constexpr void set_extent(::std::tuple<I...>& key, ::std::size_t dim, ::std::int64_t value) noexcept {
    ::std::size_t i = 0;
    ::std::apply(
        [&](auto&... v) {
          ((i++ == dim ? (v = static_cast<::std::remove_reference_t<decltype(v)>>(value), 0) : 0), ...);
        },
        key);
  }
  static constexpr ::std::int64_t max_extent(::std::size_t dim) noexcept {
    constexpr ::std::array<::std::int64_t, sizeof...(I)> maxima{detail::max_extent_of<I>()...};
    return maxima[dim];
  }
};

template <detail::shape_integer A, detail::shape_integer B>
struct shape_traits<::std::pair<A, B>> {
  static constexpr ::std::size_t rank = 2;
  static constexpr ::std::int64_t extent(const ::std::pair<A, B>& key, ::std::size_t dim) noexcept {
    return dim == 0 ? detail::to_extent(key.first) : detail::to_extent(key.second);
  }
  static constexpr void set_extent(::std::pair<A, B>& key, ::std::size_t dim, ::std::int64_t value) noexcept {
    if (dim == 0) {
      key.first = static_cast<A>(value);
    } else {
      key.second = static_cast<B>(value);
    }
  }
  static constexpr ::std::int64_t max_extent(::std::size_t dim) noexcept {
    return dim == 0 ? detail::max_extent_of<A>() : detail::max_extent_of<B>();
  }
};

// A key whose dimensions shape_traits describes: bucketable, and counted in
// the padding statistics.
template <class Key>
concept ShapeKey = requires(const Key& key, Key& mutable_key, ::std::size_t dim, ::std::int64_t value) {
  { shape_traits<Key>::rank } -> ::std::convertible_to<::std::size_t>;
  { shape_traits<Key>::extent(key, dim) } -> ::std::convertible_to<::std::int64_t>;
  shape_traits<Key>::set_extent(mutable_key, dim, value);
} && (shape_traits<Key>::rank >= 1);

namespace detail {

template <class Key>
concept std_hashable = requires(const Key& key) {
  { ::std::hash<Key>{}(key) } -> ::std::convertible_to<::std::size_t>;
};

constexpr ::std::size_t hash_combine(::std::size_t seed, ::std::uint64_t value) noexcept {
  value *= 0x9E3779B97F4A7C15ULL;  // spread small integers over the word
  return seed ^ (static_cast<::std::size_t>(value) + 0x9E3779B9U + (seed << 6) + (seed >> 2));
}

}  // namespace detail

// Hashes a key: std::hash where it exists, else the extents of a shape key.
template <class Key>
struct key_hash {
  ::std::size_t operator()(const Key& key) const noexcept {
    if constexpr (detail::std_hashable<Key>) {
      return ::std::hash<Key>{}(key);
    } else {
      static_assert(ShapeKey<Key>, "replay::key_hash: the key has neither std::hash nor shape_traits");
      ::std::size_t seed = shape_traits<Key>::rank;
      for (::std::size_t d = 0; d < shape_traits<Key>::rank; ++d) {
        seed = detail::hash_combine(seed, static_cast<::std::uint64_t>(shape_traits<Key>::extent(key, d)));
      }
      return seed;
    }
  }
};

// A key the router can hash (std::hash, or a shape key hashed by extents).
template <class Key>
concept HashableKey = detail::std_hashable<Key> || ShapeKey<Key>;

// What ShapeRouter accepts as a key: a copyable value with == and either a
// hash (std::hash or shape_traits) or a total order (operator<).
template <class Key>
concept RouterKey =
    ::std::copyable<Key> && ::std::equality_comparable<Key> && (HashableKey<Key> || ::std::totally_ordered<Key>);

namespace detail {

template <class T>
concept ostreamable = requires(::std::ostream& os, const T& value) { os << value; };

}  // namespace detail

// A key as messages print it: "8", "(8, 128)" for a shape key, else what
// operator<< prints, else "<key>".
template <class Key>
::std::string describe_key(const Key& key) {
  if constexpr (ShapeKey<Key>) {
    if constexpr (shape_traits<Key>::rank == 1) {
      return ::std::to_string(shape_traits<Key>::extent(key, 0));
    } else {
      ::std::string out = "(";
      for (::std::size_t d = 0; d < shape_traits<Key>::rank; ++d) {
        if (d != 0) {
          out += ", ";
        }
        out += ::std::to_string(shape_traits<Key>::extent(key, d));
      }
      out += ')';
      return out;
    }
  } else if constexpr (detail::ostreamable<Key>) {
    ::std::ostringstream os;
    os << key;
    return os.str();
  } else {
    return "<key>";
  }
}

}  // namespace replay
