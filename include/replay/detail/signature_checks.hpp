#pragma once
// Compile-time checks of the callables and arguments a user hands to replay,
// each with a message that names the expected signature. A constrained
// template that rejects a call says only "no instance of function template
// ... matches the argument list"; the entry points call these instead, first
// thing, so the compiler prints what was wrong. They are consteval, so each is
// evaluated where its entry point is instantiated, before the errors of the
// entry point's body. A passing check does nothing; a failing one reports the
// most specific mistake it recognises and otherwise the expected signature.
#include <replay/detail/require_cxx20.hpp>

#include <cuda_runtime_api.h>

#include <concepts>
#include <cstddef>
#include <type_traits>
#include <utility>

#include "replay/stream_ref.hpp"

namespace replay::detail {

// The work of replay::capture, capture_into and GraphBuilder::capture: work(StreamRef).
template <class Work>
consteval void check_capture_work() {
  if constexpr (::std::invocable<Work&, ::cudaStream_t> && !::std::invocable<Work&, StreamRef>) {
    static_assert(::std::invocable<Work&, StreamRef>,
                  "replay: the capture work takes a cudaStream_t; take replay::StreamRef instead (use s.get() for "
                  "the cudaStream_t): [&](replay::StreamRef s) { kernel<<<grid, block, 0, s.get()>>>(...); }");
  } else if constexpr (::std::invocable<Work&> && !::std::invocable<Work&, StreamRef>) {
    static_assert(::std::invocable<Work&, StreamRef>,
                  "replay: the capture work takes no parameter; it must take the replay::StreamRef to issue its "
                  "work on: [&](replay::StreamRef s) { kernel<<<grid, block, 0, s.get()>>>(...); }");
  } else {
    static_assert(::std::invocable<Work&, StreamRef>,
                  "replay: the capture work must be callable as work(replay::StreamRef s) and issue its work on s "
                  "(use s.get() for the cudaStream_t)");
  }
}

// ShapeRouter's work: work(const Key& shape, Stream stream), held in a std::function.
template <class Work, class Key, class Stream>
consteval void check_router_work() {
  using F = ::std::decay_t<Work>;
  if constexpr (::std::invocable<F&, const Key&, Stream>) {
    static_assert(::std::copy_constructible<F>,
                  "replay: ShapeRouter's work callable must be copyable (it is held in a std::function); hold "
                  "move-only state through a std::shared_ptr");
  } else if constexpr (::std::invocable<F&, const Key&, ::cudaStream_t>) {
    static_assert(::std::invocable<F&, const Key&, Stream>,
                  "replay: ShapeRouter's work callable takes a cudaStream_t; take replay::StreamRef instead (use "
                  "s.get() for the cudaStream_t): [&](const Key& shape, replay::StreamRef s) { ... }");
  } else if constexpr (::std::invocable<F&, Stream>) {
    static_assert(::std::invocable<F&, const Key&, Stream>,
                  "replay: ShapeRouter's work callable takes only the stream; it must take the (padded) shape "
                  "first: [&](const Key& shape, replay::StreamRef s) { ... }");
  } else {
    static_assert(::std::invocable<F&, const Key&, Stream>,
                  "replay: ShapeRouter's work callable must be callable as work(const Key& shape, stream_type s) "
                  "(stream_type is replay::StreamRef for the CUDA and torch backends; use s.get() for the "
                  "cudaStream_t)");
  }
}

// ShapeRouter::run_staged's two callables: stage_in(const Key& key, const
// Key& shape, Stream) and read_out(const Route& route, Stream).
template <class StageIn, class ReadOut, class Key, class Route, class Stream>
consteval void check_router_staging() {
  static_assert(::std::invocable<StageIn&, const Key&, const Key&, Stream>,
                "replay: ShapeRouter::run_staged's stage_in must be callable as stage_in(const Key& key, const Key& "
                "shape, stream_type s): copy the request's inputs for `key` into the router's buffers on s, and "
                "fill the padding up to `shape` (the padded key)");
  static_assert(::std::invocable<ReadOut&, const Route&, Stream>,
                "replay: ShapeRouter::run_staged's read_out must be callable as read_out(const replay::Route<Key>& "
                "route, stream_type s): issue the reads of the outputs on s");
}

// StreamPipeline's compute stage: compute(BufferView<In>, BufferView<Out>, StreamRef)
// returning void or the number of output elements.
template <class F, class InView, class OutView>
consteval void check_pipeline_compute() {
  if constexpr (::std::invocable<F&, InView, OutView, StreamRef>) {
    using R = ::std::invoke_result_t<F&, InView, OutView, StreamRef>;
    static_assert(::std::is_void_v<R> || ::std::convertible_to<R, ::std::size_t>,
                  "replay: StreamPipeline's compute stage must return void or the number of output elements it "
                  "wrote (a std::size_t)");
  } else if constexpr (::std::invocable<F&, InView, OutView, ::cudaStream_t>) {
    static_assert(::std::invocable<F&, InView, OutView, StreamRef>,
                  "replay: StreamPipeline's compute stage takes a cudaStream_t; take replay::StreamRef instead (use "
                  "s.get() for the cudaStream_t): [](replay::BufferView<In> in, replay::BufferView<Out> out, "
                  "replay::StreamRef s) { ... }");
  } else if constexpr (::std::invocable<F&, InView, OutView>) {
    static_assert(::std::invocable<F&, InView, OutView, StreamRef>,
                  "replay: StreamPipeline's compute stage takes no stream; it must take the replay::StreamRef to "
                  "issue its work on, last: [](replay::BufferView<In> in, replay::BufferView<Out> out, "
                  "replay::StreamRef s) { ... }");
  } else {
    static_assert(::std::invocable<F&, InView, OutView, StreamRef>,
                  "replay: StreamPipeline's compute stage must be callable as compute(replay::BufferView<In> in, "
                  "replay::BufferView<Out> out, replay::StreamRef s) (In and Out are the pipeline's element "
                  "types; use s.get() for the cudaStream_t)");
  }
}

// The kernel arguments of GraphBuilder::add_kernel and replay::launch against
// the kernel's parameters, one at a time, so that the failing one is named (Index counts from 0).
template <::std::size_t Index, class Param, class Arg>
consteval void check_kernel_argument() {
  static_assert(::std::convertible_to<Arg, ::std::decay_t<Param>>,
                "replay: launch, add_kernel: a kernel argument does not convert to the kernel's parameter type (the "
                "instantiation context names Index, Param and Arg; a pointer to const, or to another type, does "
                "not convert to a pointer parameter)");
}
template <class... Params>
struct kernel_arguments_check {
  template <class... Args>
  static consteval void check() {
    static_assert(sizeof...(Args) == sizeof...(Params),
                  "replay: launch, add_kernel: the number of kernel arguments differs from the number of the kernel's "
                  "parameters (the instantiation context names Params and Args)");
    if constexpr (sizeof...(Args) == sizeof...(Params)) {
      []<::std::size_t... I>(::std::index_sequence<I...>) {
        (check_kernel_argument<I, Params, Args>(), ...);
      }(::std::index_sequence_for<Params...>{});
    }
  }
};

}  // namespace replay::detail
