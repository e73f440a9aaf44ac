#pragma once
#include <replay/detail/require_cxx20.hpp>
// Builds the Batcher's messages from strings and numbers.
#include <concepts>
#include <type_traits>
#include <string>
#include <string_view>

namespace replay::detail {

template <class... Parts>
::std::string batcher_message(const Parts&... parts) {
  ::std::string out;
  auto append = [&out](const auto& part) {
    using P = ::std::decay_t<decltype(part)>;
    if constexpr (::std::integral<P> || ::std::floating_point<P>) {
      out += ::std::to_string(part);
    } else {
      out += ::std::string_view(part);
    }
  };
  (append(parts), ...);
  return out;
}

}  // namespace replay::detail
