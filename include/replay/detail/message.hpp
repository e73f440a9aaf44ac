#pragma once
// Message helpers shared by replay's headers: concat() builds a message by
// appending its parts, elements() counts, describe_current_exception() says
// what was thrown.
#include <replay/detail/require_cxx20.hpp>

#include <cstddef>
#include <exception>
#include <string>
#include <string_view>
#include <type_traits>

namespace replay::detail {

// Builds a message by appending (strings, string views, C strings, integers):
// no "literal" + std::string temporaries, which GCC 12 misreports under -Wrestrict.
template <class... Parts>
::std::string concat(const Parts&... parts) {
  ::std::string out;
  auto append = [&out](const auto& part) {
    using P = ::std::decay_t<decltype(part)>;
    if constexpr (::std::is_integral_v<P>) {
      out += ::std::to_string(part);
    } else {
      out += part;
    }
  };
  (append(parts), ...);
  return out;
}

// Whether a source file is the C++ standard library's, by its path:
// libstdc++'s and libc++'s headers (.../include/c++/...), and libstdc++'s
// target headers (.../c++/<version>/bits/..., the version digits and dots).
// A std::source_location defaulted in a function that std::make_unique,
// std::optional::emplace or a container's emplace calls points there, not
// at the user's line.
constexpr bool is_standard_library_file(::std::string_view path) noexcept {
  constexpr auto npos = ::std::string_view::npos;
  if (path.find("/include/c++/") != npos) {
    return true;
  }
  constexpr ::std::string_view cxx = "/c++/";
  for (auto at = path.find(cxx); at != npos; at = path.find(cxx, at + 1)) {
    const auto version = path.substr(at + cxx.size());
    const auto end = version.find('/');
    if (end == 0 || end == npos || !version.substr(end).starts_with("/bits/")) {
      continue;
    }
    if (version.substr(0, end).find_first_not_of("0123456789.") == npos) {
      return true;
    }
  }
  return false;
}

// "1 element", "3 elements".
inline ::std::string elements(::std::size_t n) { return ::std::to_string(n) + (n == 1 ? " element" : " elements"); }

// What the exception being handled says (call inside a catch block).
inline ::std::string describe_current_exception() {
  try {
    throw;
  } catch (const ::std::exception& e) {
    return e.what();
  } catch (...) {
    return "an exception not derived from std::exception";
  }
}

}  // namespace replay::detail
