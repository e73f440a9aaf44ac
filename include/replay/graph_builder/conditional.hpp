#pragma once
#include <replay/detail/require_cxx20.hpp>
// ConditionalHandle: the value that steers a conditional node (IF, IF/ELSE,
// WHILE, SWITCH). It is made by a GraphBuilder (cudaGraphConditionalHandleCreate)
// with a default value applied at the start of every launch, and it is set
// only on the device, by a kernel of the same graph:
//
//   __global__ void step(replay::ConditionalHandle keep_going, ...) {
//     ...
//     if (threadIdx.x == 0 && blockIdx.x == 0) keep_going.set(residual > tol);
//   }
//
// There is no host-side setter: CUDA offers none (the value lives in the
// executable graph), so the type has none either, and calling set() from host
// code does not compile.
//
// Conditional nodes need CUDA 12.4 (IF with one body, WHILE) or 12.8 (IF/ELSE
// with two bodies, SWITCH) in the toolkit and in the driver.
#include <cuda_runtime_api.h>

#include <string_view>
#include <type_traits>

namespace replay {

enum class ConditionalKind {
  if_then,       // one body, run when the value is non-zero
  if_then_else,  // two bodies: [0] when non-zero, [1] when zero (CUDA 12.8)
  while_loop,    // one body, run again and again while the value is non-zero
  switch_case,   // n bodies: body[v] runs for value v; a value >= n runs none (CUDA 12.8)
};

constexpr ::std::string_view to_string(ConditionalKind kind) noexcept {
  switch (kind) {
    case ConditionalKind::if_then: return "IF";
    case ConditionalKind::if_then_else: return "IF/ELSE";
    case ConditionalKind::while_loop: return "WHILE";
    case ConditionalKind::switch_case: return "SWITCH";
  }
  return "unknown";
}

// The CUDA runtime version a kind needs (toolkit and driver).
constexpr int required_cuda_version(ConditionalKind kind) noexcept {
  return kind == ConditionalKind::if_then || kind == ConditionalKind::while_loop ? 12040 : 12080;
}

#if CUDART_VERSION >= 12040

class ConditionalHandle {
 public:
  ConditionalHandle() noexcept = default;
  [[nodiscard]] static ConditionalHandle from_native_handle(::cudaGraphConditionalHandle handle) noexcept {
    ConditionalHandle out;
    out.handle_ = handle;
    out.made_ = true;
    return out;
  }
  ::cudaGraphConditionalHandle get() const noexcept { return handle_; }
  // False for a default-constructed handle (not made by make_condition()).
  explicit operator bool() const noexcept { return made_; }

#ifdef __CUDACC__
  // Sets the value the conditional node reads next (cudaGraphSetConditional).
  // Device code only; from one thread, never racing another set().
  __device__ void set(unsigned int value) const { ::cudaGraphSetConditional(handle_, value); }
#endif

 private:
  ::cudaGraphConditionalHandle handle_ = 0;
  bool made_ = false;
};
static_assert(::std::is_trivially_copyable_v<ConditionalHandle>, "passed by value to kernels");

#ifdef __CUDACC__
// The same as handle.set(value), as a free function.
__device__ inline void set_condition(ConditionalHandle handle, unsigned int value) { handle.set(value); }
#endif

#endif  // CUDART_VERSION >= 12040

}  // namespace replay
