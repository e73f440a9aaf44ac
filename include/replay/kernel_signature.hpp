#pragma once
#include <replay/detail/require_cxx20.hpp>
// kernel_signature and kernel_arguments_for: whether arguments fit a kernel's
// parameter list, checked at compile time the way a <<<>>> launch checks them
// (count, and each argument converting to its parameter's type). replay::launch
// and GraphBuilder::add_kernel refuse arguments that do not fit.

#include <concepts>
#include <type_traits>

namespace replay {

// Whether arguments can be passed to a kernel taking `Params...`: the same
// count, and each argument converts to its parameter's type, as a `<<<>>>`
// launch would check them.
template <class... Params>
struct kernel_signature {
 private:
  template <class... Args>
  static constexpr bool convertible() noexcept {
    if constexpr (sizeof...(Args) != sizeof...(Params)) {
      return false;
    } else {
      return (::std::convertible_to<Args, ::std::decay_t<Params>> && ...);
    }
  }

 public:
  // True when `Args...` can be passed to a kernel taking `Params...`.
  template <class... Args>
  static constexpr bool accepts = convertible<Args...>();
};

namespace detail {
template <class Kernel, class... Args>
struct kernel_accepts : ::std::false_type {};
template <class... Params, class... Args>
struct kernel_accepts<void (*)(Params...), Args...>
    : ::std::bool_constant<kernel_signature<Params...>::template accepts<Args...>> {};
}  // namespace detail

// A kernel pointer `Kernel` (`void(*)(Params...)`) accepts arguments `Args...`.
template <class Kernel, class... Args>
concept kernel_arguments_for = detail::kernel_accepts<::std::decay_t<Kernel>, Args...>::value;

}  // namespace replay
