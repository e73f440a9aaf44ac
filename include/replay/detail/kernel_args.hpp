#pragma once
#include <replay/detail/require_cxx20.hpp>
// What a typed kernel launch and a typed kernel node share: the arguments
// converted to the kernel's parameter types, with the void** CUDA copies them
// from (KernelArgPack), and the checks of a launch's kernel and dimensions. Used by
// replay::launch (launch.hpp) and by GraphBuilder's kernel nodes.
#include <cuda_runtime_api.h>

#include <cstddef>
#include <source_location>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#include "replay/error.hpp"
#include "replay/kernel_signature.hpp"

namespace replay::detail {

// The arguments converted to the kernel's parameter types, and the array of
// pointers to them that CUDA copies from. Lives for one call.
template <class... Params>
struct KernelArgPack {
  ::std::tuple<::std::decay_t<Params>...> values;
  void* pointers[sizeof...(Params) == 0 ? 1 : sizeof...(Params)];

  template <class... Args>
  explicit KernelArgPack(Args&&... args) : values(static_cast<::std::decay_t<Params>>(::std::forward<Args>(args))...) {
    fill(::std::index_sequence_for<Params...>{});
  }
  KernelArgPack(const KernelArgPack&) = delete;
  KernelArgPack& operator=(const KernelArgPack&) = delete;

  void** data() noexcept { return sizeof...(Params) == 0 ? nullptr : pointers; }

 private:
  template <::std::size_t... I>
  void fill(::std::index_sequence<I...>) noexcept {
    ((pointers[I] = static_cast<void*>(&::std::get<I>(values))), ...);
  }
};

// usage_error for a zero grid or block dimension, before CUDA sees it.
inline void validate_dimensions(const ::dim3& grid, const ::dim3& block, const char* what,
                                const ::std::source_location& where) {
  const auto zero = [](const ::dim3& d) { return d.x == 0 || d.y == 0 || d.z == 0; };
  if (zero(grid) || zero(block)) {
    throw usage_error(::std::string(what) + ": grid and block dimensions must all be at least 1", where);
  }
}

// usage_error for a null kernel pointer.
template <class Kernel>
void refuse_null_kernel(Kernel kernel, const char* what, const ::std::source_location& where) {
  if (kernel == nullptr) {
    throw usage_error(::std::string(what) + ": the kernel is a null function pointer", where);
  }
}

}  // namespace replay::detail
