#pragma once
// Callables from tensors to tensors: the TensorCallable concept (torch::nn
// module holders, TorchScript modules, functions of tensors) and TensorFunction,
// the type-erased form GraphedCallable stores.
#include <replay/detail/require_cxx20.hpp>

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>

#include <concepts>
#include <cstddef>
#include <functional>
#include <memory>
#include <source_location>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "replay/detail/message.hpp"
#include "replay/error.hpp"

namespace replay {

// The type-erased form every graphed callable is stored as.
using TensorFunction = ::std::function<::std::vector<::at::Tensor>(const ::std::vector<::at::Tensor>&)>;

namespace detail {

template <::std::size_t>
using tensor_arg = const ::at::Tensor&;

inline constexpr ::std::size_t max_tensor_arity = 8;

// torch::jit::Module and anything else with IValue forward(std::vector<IValue>).
template <class F>
concept jit_module_like = requires(F& f, ::std::vector<::c10::IValue> args) {
  { f.forward(::std::move(args)) } -> ::std::convertible_to<::c10::IValue>;
};

// torch::nn::ModuleHolder (torch::nn::Linear, TORCH_MODULE(MyNet), ...). Its
// operator() is not SFINAE-friendly (asking whether it takes two tensors is a
// hard error when forward takes one), so a holder is always called through
// holder->forward(tensors...), and never with the std::vector.
template <class F>
concept module_holder = requires { typename F::ContainedType; };

template <class F>
concept tensor_vector_callable = !module_holder<F> && ::std::invocable<F&, const ::std::vector<::at::Tensor>&>;

// Module holders, std::shared_ptr<MyModuleImpl> and other pointers to a module
// with forward(Tensor...).
template <class F, class... A>
concept forward_through_pointer = requires(F& f, A... a) { f->forward(a...); };

template <class F, class... A>
constexpr bool direct_call_with() {
  if constexpr (module_holder<F>) {
    return false;
  } else {
    return ::std::is_invocable_v<F&, A...>;
  }
}

template <class F, ::std::size_t Arity>
constexpr bool callable_with_tensors() {
  return []<::std::size_t... I>(::std::index_sequence<I...>) {
    if constexpr (direct_call_with<F, tensor_arg<I>...>()) {
      return true;
    } else {
      return forward_through_pointer<F, tensor_arg<I>...>;
    }
  }(::std::make_index_sequence<Arity>{});
}

template <class F>
constexpr bool callable_with_some_arity() {
  return []<::std::size_t... A>(::std::index_sequence<A...>) {
    return (callable_with_tensors<F, A + 1>() || ...);
  }(::std::make_index_sequence<max_tensor_arity>{});
}

template <class T>
inline constexpr bool dependent_false = false;

template <class T>
concept tuple_like = requires { ::std::tuple_size<T>::value; };

inline void append_ivalue(::std::vector<::at::Tensor>& out, const ::c10::IValue& value,
                          const ::std::source_location& where) {
  if (value.isTensor()) {
    out.push_back(value.toTensor());
  } else if (value.isTuple()) {
    for (const ::c10::IValue& element : value.toTupleRef().elements()) {
      append_ivalue(out, element, where);
    }
  } else if (value.isTensorList()) {
    for (const ::at::Tensor& t : value.toTensorVector()) {
      out.push_back(t);
    }
  } else if (value.isList()) {
    for (const ::c10::IValue& element : value.toListRef()) {
      append_ivalue(out, element, where);
    }
  } else {
    throw usage_error(detail::concat("the graphed callable returned a ", value.tagKind(),
                                     "; it must return tensors (a Tensor, or a tuple or list of Tensors)"),
                      where);
  }
}

// What a callable returned, as a list of tensors: a Tensor, a std::vector of
// them, a tuple or pair of them, or an IValue holding a Tensor, a tuple or a list.
template <class R>
::std::vector<::at::Tensor> to_tensor_list(R&& result, const ::std::source_location& where) {
  using T = ::std::remove_cvref_t<R>;
  if constexpr (::std::same_as<T, ::c10::IValue>) {
    ::std::vector<::at::Tensor> out;
    append_ivalue(out, result, where);
    return out;
  } else if constexpr (::std::same_as<T, ::at::Tensor>) {
    return {::std::forward<R>(result)};
  } else if constexpr (::std::same_as<T, ::std::vector<::at::Tensor>>) {
    return ::std::forward<R>(result);
  } else if constexpr (tuple_like<T>) {
    return ::std::apply(
        [](auto&&... element) {
          static_assert((::std::convertible_to<decltype(element), ::at::Tensor> && ...),
                        "replay: a graphed callable that returns a tuple must return a tuple of Tensors");
          return ::std::vector<::at::Tensor>{::at::Tensor(::std::forward<decltype(element)>(element))...};
        },
        ::std::forward<R>(result));
  } else if constexpr (::std::convertible_to<T, ::at::Tensor>) {
    return {::at::Tensor(::std::forward<R>(result))};
  } else {
    static_assert(dependent_false<T>,
                  "replay: a graphed callable must return a Tensor, a std::vector<Tensor>, a tuple of "
                  "Tensors or a c10::IValue");
    return {};
  }
}

template <::std::size_t Arity, class F>
bool try_call_with_arity(F& f, const ::std::vector<::at::Tensor>& in, ::std::optional<::std::vector<::at::Tensor>>& out,
                         const ::std::source_location& where) {
  if constexpr (callable_with_tensors<F, Arity>()) {
    if (in.size() == Arity) {
      out = [&]<::std::size_t... I>(::std::index_sequence<I...>) {
        if constexpr (direct_call_with<F, tensor_arg<I>...>()) {
          return to_tensor_list(::std::invoke(f, in[I]...), where);
        } else {
          return to_tensor_list(f->forward(in[I]...), where);
        }
      }(::std::make_index_sequence<Arity>{});
      return true;
    }
  }
  return false;
}

// Calls `f` with `in`: a JIT module through forward(std::vector<IValue>), a
// callable taking std::vector<Tensor> with the vector, anything else with the
// tensors as separate arguments (1 to max_tensor_arity of them).
template <class F>
::std::vector<::at::Tensor> call_with_tensors(F& f, const ::std::vector<::at::Tensor>& in,
                                              const ::std::source_location& where) {
  if constexpr (jit_module_like<F>) {
    ::std::vector<::c10::IValue> args;
    args.reserve(in.size());
    for (const ::at::Tensor& t : in) {
      args.emplace_back(t);
    }
    return to_tensor_list(f.forward(::std::move(args)), where);
  } else if constexpr (tensor_vector_callable<F>) {
    return to_tensor_list(::std::invoke(f, in), where);
  } else {
    ::std::optional<::std::vector<::at::Tensor>> out;
    const bool called = [&]<::std::size_t... A>(::std::index_sequence<A...>) {
      return (try_call_with_arity<A + 1>(f, in, out, where) || ...);
    }(::std::make_index_sequence<max_tensor_arity>{});
    if (!called) {
      throw usage_error(detail::concat("the graphed callable cannot be called with ", in.size(),
                                       " tensor argument(s); give as many example inputs as its forward takes"),
                        where);
    }
    return ::std::move(*out);
  }
}

}  // namespace detail

// What GraphedCallable accepts: a torch::nn module holder (or a pointer to a
// module) whose forward takes 1 to 8 Tensors, a torch::jit::Module, or any
// callable taking Tensors (or a std::vector<Tensor>) and returning a Tensor,
// a std::vector<Tensor>, a tuple of Tensors or a c10::IValue.
template <class F>
concept TensorCallable = ::std::move_constructible<::std::remove_cvref_t<F>> &&
                         (detail::jit_module_like<::std::remove_cvref_t<F>> ||
                          detail::tensor_vector_callable<::std::remove_cvref_t<F>> ||
                          detail::callable_with_some_arity<::std::remove_cvref_t<F>>());

// Wraps any TensorCallable as a TensorFunction (held by shared_ptr, so that
// move-only callables work too; module handles are shared anyway).
template <TensorCallable F>
TensorFunction make_tensor_function(F&& fn, ::std::source_location where = ::std::source_location::current()) {
  auto held = ::std::make_shared<::std::remove_cvref_t<F>>(::std::forward<F>(fn));
  return [held, where](const ::std::vector<::at::Tensor>& in) { return detail::call_with_tensors(*held, in, where); };
}

}  // namespace replay
