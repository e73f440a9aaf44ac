#pragma once
// Type-safe bitmask enums: opt in with `enable_bitmask<E>`, then |, &, ^, ~ and
// has_flag() work on E and nothing else mixes with it by accident.
#include <replay/detail/require_cxx20.hpp>

#include <type_traits>

namespace replay {

template <class E>
inline constexpr bool enable_bitmask = false;

template <class E>
concept BitmaskEnum = ::std::is_enum_v<E> && enable_bitmask<E>;

template <BitmaskEnum E>
constexpr auto to_underlying(E e) noexcept {
  return static_cast<::std::underlying_type_t<E>>(e);
}
template <BitmaskEnum E>
constexpr E operator|(E a, E b) noexcept {
  return static_cast<E>(to_underlying(a) | to_underlying(b));
}
template <BitmaskEnum E>
constexpr E operator&(E a, E b) noexcept {
  return static_cast<E>(to_underlying(a) & to_underlying(b));
}
template <BitmaskEnum E>
constexpr E operator^(E a, E b) noexcept {
  return static_cast<E>(to_underlying(a) ^ to_underlying(b));
}
template <BitmaskEnum E>
constexpr E operator~(E a) noexcept {
  return static_cast<E>(~to_underlying(a));
}
template <BitmaskEnum E>
constexpr E& operator|=(E& a, E b) noexcept {
  return a = a | b;
}
template <BitmaskEnum E>
constexpr E& operator&=(E& a, E b) noexcept {
  return a = a & b;
}
// True when every bit of `flag` is set in `value`.
template <BitmaskEnum E>
constexpr bool has_flag(E value, E flag) noexcept {
  return (to_underlying(value) & to_underlying(flag)) == to_underlying(flag);
}

}  // namespace replay
