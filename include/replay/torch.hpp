#pragma once
// replay/torch.hpp: the libtorch adapter. Turns a torch::nn module, a
// torch::jit::Module or any callable from tensors to tensors into a graphed
// callable: one CUDA graph per batch-size bucket (a ShapeRouter over
// TorchGraphBackend), static input tensors the caller's data is copied into,
// static output tensors each replay overwrites, one private memory pool of
// PyTorch's caching allocator shared by all the graphs, and eager fallback for
// a bucket whose capture fails.
//
//   replay::GraphedCallable resnet(model, {torch::randn({32, 3, 224, 224}, cuda_half)},
//                                  {.batch_buckets = {1, 2, 4, 8, 16, 32}});
//   at::Tensor logits = resnet(images)[0];   // images: [n, 3, 224, 224], n <= 32
//
// Never included by replay/replay.hpp: it needs libtorch (target replay::torch).
// See docs/torch.md.
#include <ATen/ATen.h>
#include <ATen/core/CachingHostAllocator.h>
#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/core/GradMode.h>
#include <c10/core/InferenceMode.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>
#include <cuda_runtime_api.h>
#if __has_include(<cublasLt.h>) && __has_include(<cusparse.h>) && __has_include(<cusolverDn.h>)
#include <ATen/cuda/CUDAContextLight.h>
#define REPLAY_TORCH_PREPARE_CUBLAS 1
#endif

#include <algorithm>
#include <atomic>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <source_location>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "replay/capture_scope.hpp"
#include "replay/detail/reentry_guard.hpp"
#include "replay/error.hpp"
#include "replay/event.hpp"
#include "replay/fork_join.hpp"
#include "replay/flags.hpp"
#include "replay/shape_router.hpp"
#include "replay/stream.hpp"
#include "replay/stream_ref.hpp"

namespace replay {

// ---------------------------------------------------------------------------
// Options and errors
// ---------------------------------------------------------------------------

enum class GraphedFlags : unsigned int {
  none = 0,
  // Fast mode: outputs are views of the static output tensors, valid until the
  // next replay of the same GraphedCallable; GraphedOutputs' accessors throw
  // stale_output_error after that. Default (safe mode): outputs are clones.
  view_outputs = 1U << 0,
  // Warm up, capture and run under torch::NoGradGuard instead of
  // c10::InferenceMode: outputs are normal tensors rather than inference tensors.
  no_grad = 1U << 1,
  // Capture each bucket the first time a batch maps to it (after
  // GraphedOptions::warmup_runs eager runs) instead of all buckets, largest
  // first, in the constructor.
  lazy_capture = 1U << 2,
  // Leave the padded rows of the static inputs as they are (whatever an earlier
  // call left there) instead of zeroing them.
  keep_padding = 1U << 3,
  // A failed capture throws capture_failed_error instead of marking the bucket
  // eager (from the constructor, or from the call that captured it lazily).
  no_fallback = 1U << 4,
};
template <>
inline constexpr bool enable_bitmask<GraphedFlags> = true;

// A fast-mode output read after a later replay overwrote it.
class stale_output_error : public usage_error {
 public:
  using usage_error::usage_error;
};

// A capture of a torch callable that failed (thrown by TorchGraphBackend, and
// by GraphedCallable under GraphedFlags::no_fallback).
class capture_failed_error : public ::std::runtime_error {
 public:
  using ::std::runtime_error::runtime_error;
};

struct GraphedOptions {
  GraphedFlags flags = GraphedFlags::none;
  // Batch sizes to capture, strictly ascending; a batch is padded up to the
  // next one. Empty: the example inputs' batch size only.
  ::std::vector<::std::int64_t> batch_buckets;
  // Eager runs of each bucket before its capture, as PyTorch does on a side
  // stream: cuDNN/cuBLAS pick algorithms and create handles and workspaces,
  // lazy modules load, the JIT profiles, before anything is recorded.
  ::std::uint32_t warmup_runs = 3;
  // cudaStreamCaptureModeThreadLocal by default: other threads may keep
  // allocating and synchronizing while this one captures. CaptureMode::global
  // is what torch.cuda.graph uses.
  CaptureMode capture_mode = CaptureMode::this_thread;
  // A batch above the largest bucket: run the callable eagerly on the caller's
  // tensors, or throw usage_error.
  OversizePolicy oversize = OversizePolicy::run_eager;
  // Most graphs alive at once (least recently used evicted beyond it).
  ::std::size_t max_graphs = ShapeRouterOptions<::std::int64_t>::unlimited;
  // Told once per bucket whose capture failed (it runs eagerly from then on).
  // Empty: one line on stderr.
  CaptureFailureHandler<::std::int64_t> on_capture_failure;
  // CUDA generators the callable draws random numbers from besides the
  // device's default generator (which is always registered): their state is
  // advanced on every replay, as torch.cuda.graph does.
  ::std::vector<::at::Generator> generators;
};

// ---------------------------------------------------------------------------
// Callables from tensors to tensors
// ---------------------------------------------------------------------------

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
    throw usage_error("the graphed callable returned a " + value.tagKind() +
                          "; it must return tensors (a Tensor, or a tuple or list of Tensors)",
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
      throw usage_error("the graphed callable cannot be called with " + ::std::to_string(in.size()) +
                            " tensor argument(s); give as many example inputs as its forward takes",
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

// ---------------------------------------------------------------------------
// Capture machinery
// ---------------------------------------------------------------------------

namespace detail {

// at::cuda::CUDAGraph, with what a failed capture needs to be undone cleanly
// and what the replay fast path needs to know. The base class handles the
// caching allocator's private pool, the host allocator's pool and the CUDA
// generators exactly as torch.cuda.graph does; it does not recover from a
// capture that fails half-way (capture_end throws before it ends the
// allocator's routing, so the next capture into the same pool would be
// refused), which abandon_capture() does.
class TorchCudaGraph : public ::at::cuda::CUDAGraph {
 public:
  TorchCudaGraph() : ::at::cuda::CUDAGraph(/*keep_graph=*/false) {}

  // True when a registered generator was drawn from during the capture: the
  // replay must then go through CUDAGraph::replay(), which advances it.
  bool uses_rng() const {
    for (const auto& [state, increment] : captured_generator_states_) {
      if (increment != 0) {
        return true;
      }
    }
    return false;
  }

  // Undoes a capture that threw between capture_begin and the end of
  // capture_end: ends the stream capture if it is still open, takes the
  // generators out of capture mode, stops routing allocations to the pool and
  // gives back the pool reference capture_begin took (the base class gives it
  // back only after a successful capture). `uses_before` is the pool's use
  // count before capture_begin (0 if the pool did not exist).
  void abandon_capture(::c10::DeviceIndex device, ::c10::MempoolId_t pool, int uses_before,
                       ::cudaStream_t stream) noexcept {
    ::cudaStreamCaptureStatus status = ::cudaStreamCaptureStatusNone;
    if (::cudaStreamIsCapturing(stream, &status) == ::cudaSuccess && status != ::cudaStreamCaptureStatusNone) {
      ::cudaGraph_t partial = nullptr;
      (void)::cudaStreamEndCapture(stream, &partial);
      if (partial != nullptr) {
        (void)::cudaGraphDestroy(partial);
      }
    }
    // What CUDAGeneratorState::capture_epilogue() does to leave capture mode
    // (that function is not exported from libtorch_cuda): otherwise eager
    // random numbers would from now on advance the intra-graph offset only,
    // and repeat.
    for (auto& entry : captured_generator_states_) {
      [](auto& state) {
        if constexpr (requires { state->capturing_ = false; }) {
          state->capturing_ = false;
        }
      }(entry.first);
    }
    try {
      ::c10::cuda::CUDACachingAllocator::endAllocateToPool(device, pool);
    } catch (...) {  // capture_begin failed before routing, or capture_end got that far
    }
    // Once capture_end marked the capture ended (it failed later, in
    // instantiation), the base class's reset() gives the pool references back.
    if (!capture_ended_) {
      try {
        ::at::HostAllocator* host = ::at::getHostAllocator(::at::kCUDA);
        host->end_allocate_to_pool(pool);
        host->release_pool(pool);  // only reached when the routing was still on: begin took a reference
      } catch (...) {
      }
      for (int uses = pool_use_count(device, pool); uses > uses_before; --uses) {
        try {
          ::c10::cuda::CUDACachingAllocator::releasePool(device, pool);
        } catch (...) {
          break;
        }
      }
    }
    (void)::cudaGetLastError();  // a capture error is reported by the exception, not left behind
  }

  static int pool_use_count(::c10::DeviceIndex device, ::c10::MempoolId_t pool) noexcept {
    try {
      return ::c10::cuda::CUDACachingAllocator::getPoolUseCount(device, pool);
    } catch (...) {
      return 0;  // no such pool (yet)
    }
  }
};

#ifdef REPLAY_TORCH_PREPARE_CUBLAS
// Drops the cuBLAS / cuBLASLt workspaces kept for `stream` (what newer
// libtorch calls clearCublasWorkspacesForStream): each capture stream would
// otherwise keep two workspaces alive for the life of the process.
inline void release_cublas_workspaces(::cudaStream_t stream) noexcept {
  void* const key = static_cast<void*>(stream);
  for (auto* workspaces :
       {&::at::cuda::cublas_handle_stream_to_workspace(), &::at::cuda::cublaslt_handle_stream_to_workspace()}) {
    try {
      ::std::unique_lock<::std::shared_mutex> lock(workspaces->mutex);
      ::std::erase_if(workspaces->map, [key](const auto& entry) { return ::std::get<1>(entry.first) == key; });
    } catch (...) {
    }
  }
}
#endif

inline ::std::size_t allocator_reserved_bytes(::c10::DeviceIndex device) {
  const auto stats = ::c10::cuda::CUDACachingAllocator::getDeviceStats(device);
  const auto current =
      stats.reserved_bytes[static_cast<::std::size_t>(::c10::CachingAllocator::StatType::AGGREGATE)].current;
  return current > 0 ? static_cast<::std::size_t>(current) : 0U;
}

// torch's view of a CUDA stream: the default stream for the legacy handle.
inline ::c10::cuda::CUDAStream torch_stream(StreamRef stream, ::c10::DeviceIndex device) {
  if (stream.get() == nullptr || stream.get() == cudaStreamLegacy) {
    return ::c10::cuda::getDefaultCUDAStream(device);
  }
  return ::c10::cuda::getStreamFromExternal(stream.get(), device);
}

// c10::InferenceMode, or torch::NoGradGuard under GraphedFlags::no_grad.
class GradScope {
 public:
  explicit GradScope(GraphedFlags flags) {
    if (has_flag(flags, GraphedFlags::no_grad)) {
      no_grad_.emplace();
    } else {
      inference_.emplace();
    }
  }

 private:
  ::std::optional<::c10::InferenceMode> inference_;
  ::std::optional<::at::NoGradGuard> no_grad_;
};

inline ::std::string describe_sizes(::c10::IntArrayRef sizes) {
  ::std::string out = "[";
  for (::std::size_t d = 0; d < sizes.size(); ++d) {
    out += (d == 0 ? "" : ", ") + ::std::to_string(sizes[d]);
  }
  return out + "]";
}

// The message of a failed capture, without c10's backtrace.
inline ::std::string describe_capture_failure() {
  ::std::string reason;
  try {
    throw;
  } catch (const ::c10::Error& e) {
    reason = e.what_without_backtrace();
  } catch (const ::std::exception& e) {
    reason = e.what();
  } catch (...) {
    reason = "an exception not derived from std::exception";
  }
  ::std::string out = "capturing the torch callable failed: " + reason;
  if (reason.find("captur") != ::std::string::npos && reason.find(capture_error_hint) == ::std::string::npos) {
    out += "; ";
    out += capture_error_hint;
    out += " (in torch code: .item(), .cpu(), printing a CUDA tensor, nonzero(), data-dependent shapes)";
  }
  return out;
}

}  // namespace detail

// What the graphs of one model share: the device, the private memory pool of
// the caching allocator, the stream captures run on, and the static outputs
// handed from the work callable to the backend. Created by GraphedCallable;
// create one yourself to use TorchGraphBackend with your own ShapeRouter (the
// work callable then reports what it computed with set_outputs()).
class TorchCaptureContext {
 public:
  explicit TorchCaptureContext(::c10::Device device, CaptureMode mode = CaptureMode::this_thread,
                               ::std::vector<::at::Generator> generators = {},
                               ::std::source_location where = ::std::source_location::current())
      : device_(checked_device(device, where)),
        mode_(mode),
        generators_(::std::move(generators)),
        pool_(::at::cuda::graph_pool_handle()),
        capture_stream_(make_stream(device_, where)),
        generation_(::std::make_shared<::std::atomic<::std::uint64_t>>(0)) {
    // The context holds a reference on the pool for its whole life, as
    // torch.cuda.MemPool does: a pool whose use count drops to 0 (every graph
    // evicted, or a first capture that failed) becomes "freeable", and the
    // caching allocator refuses to capture into it again.
    ::at::globalContext().lazyInitDevice(::at::kCUDA);
    ::c10::cuda::CUDAGuard guard(device_);
    try {
      ::c10::cuda::CUDACachingAllocator::createOrIncrefPool(device_.index(), pool_);
      holds_pool_ = true;
    } catch (const ::c10::Error&) {
      holds_pool_ = false;  // an allocator backend without private pools (cudaMallocAsync)
    }
    // The pinned host allocator keeps its own private pool per graph pool id,
    // with the same rule: once its use count reached 0 (the last graph
    // evicted), a new capture into that id trips an internal assertion. Hold a
    // reference there too: begin routing (which creates the pool, or takes a
    // reference) with a filter that routes nothing, and end it at once.
    try {
      ::at::HostAllocator* host = ::at::getHostAllocator(::at::kCUDA);
      host->begin_allocate_to_pool(pool_, [](::c10::Stream) { return false; });
      host->end_allocate_to_pool(pool_);
      holds_host_pool_ = true;
    } catch (const ::c10::Error&) {
      holds_host_pool_ = false;
    }
  }

  TorchCaptureContext(const TorchCaptureContext&) = delete;
  TorchCaptureContext& operator=(const TorchCaptureContext&) = delete;
  TorchCaptureContext(TorchCaptureContext&&) = delete;
  TorchCaptureContext& operator=(TorchCaptureContext&&) = delete;

  // Every graph is gone by now (the backend holding them keeps this alive),
  // and the caller has made sure no replay still runs: drop the capture
  // stream's cuBLAS workspaces (the graphs' cuBLAS kernels used them) and
  // hand the pool's cached segments back to the device. Segments still
  // holding tensors the caller kept are freed by the allocator later.
  ~TorchCaptureContext() {
#ifdef REPLAY_TORCH_PREPARE_CUBLAS
    detail::release_cublas_workspaces(capture_stream_.get());
#endif
    try {
      ::c10::cuda::CUDAGuard guard(device_);
      if (holds_pool_) {
        ::c10::cuda::CUDACachingAllocator::releasePool(device_.index(), pool_);
      }
      if (holds_host_pool_) {
        ::at::getHostAllocator(::at::kCUDA)->release_pool(pool_);
      }
      if (pool_touched_ || holds_pool_) {
        ::c10::cuda::CUDACachingAllocator::emptyCache(pool_);
      }
    } catch (...) {
    }
  }

  ::c10::Device device() const noexcept { return device_; }
  ::c10::MempoolId_t pool() const noexcept { return pool_; }
  CaptureMode mode() const noexcept { return mode_; }
  const ::std::vector<::at::Generator>& generators() const noexcept { return generators_; }
  StreamRef capture_stream() const noexcept { return StreamRef(capture_stream_.get()); }

  // The work callable reports its outputs here; during a capture they become
  // the graph's static outputs.
  void set_outputs(::std::vector<::at::Tensor> outputs) { outputs_ = ::std::move(outputs); }
  ::std::vector<::at::Tensor> take_outputs() noexcept { return ::std::exchange(outputs_, {}); }

  // The static outputs of the graph launched last, and the replay count that
  // fast-mode outputs are checked against.
  const ::std::vector<::at::Tensor>* launched_outputs() const noexcept { return launched_; }
  ::std::uint64_t generation() const noexcept { return generation_->load(::std::memory_order_acquire); }
  ::std::shared_ptr<const ::std::atomic<::std::uint64_t>> generation_counter() const noexcept { return generation_; }
  void note_launch(const ::std::vector<::at::Tensor>* outputs) noexcept {
    launched_ = outputs;
    generation_->fetch_add(1, ::std::memory_order_acq_rel);
  }
  void note_capture() noexcept { pool_touched_ = true; }
  bool pool_touched() const noexcept { return pool_touched_; }

  // Bytes of device memory in the pool's segments (the caching allocator's
  // snapshot): what the graphs' intermediate and output tensors occupy.
  ::std::size_t pool_reserved_bytes() const {
    ::std::size_t bytes = 0;
    const auto snapshot = ::c10::cuda::CUDACachingAllocator::snapshot(pool_);
    for (const auto& segment : snapshot.segments) {
      if (segment.owner_private_pool_id == pool_ && segment.device == device_.index()) {
        bytes += segment.total_size;
      }
    }
    return bytes;
  }

 private:
  static ::c10::Device checked_device(::c10::Device device, const ::std::source_location& where) {
    if (!device.is_cuda()) {
      throw usage_error("TorchCaptureContext: the device must be a CUDA device, got " + device.str(), where);
    }
    if (!device.has_index()) {
      return ::c10::Device(::c10::kCUDA, ::c10::cuda::current_device());
    }
    return device;
  }
  static Stream make_stream(::c10::Device device, const ::std::source_location& where) {
    ::c10::cuda::CUDAGuard guard(device);
    return Stream(StreamFlags::non_blocking, 0, where);
  }

  ::c10::Device device_;
  CaptureMode mode_;
  ::std::vector<::at::Generator> generators_;
  ::c10::MempoolId_t pool_;
  Stream capture_stream_;
  ::std::vector<::at::Tensor> outputs_;
  const ::std::vector<::at::Tensor>* launched_ = nullptr;
  ::std::shared_ptr<::std::atomic<::std::uint64_t>> generation_;
  bool pool_touched_ = false;
  bool holds_pool_ = false;
  bool holds_host_pool_ = false;
};

// One captured torch graph: the executable graph, and the static outputs its
// replays write (kept alive with it, dropped when the router evicts it).
struct TorchGraphExec {
  ::std::unique_ptr<detail::TorchCudaGraph> graph;
  ::cudaGraphExec_t exec = nullptr;
  ::std::vector<::at::Tensor> outputs;
  bool uses_rng = false;
};

// ShapeRouter backend for torch work, captured the way torch.cuda.graph does:
// through at::cuda::CUDAGraph on the context's capture stream, which is also
// torch's current stream during the capture, with the caching allocator
// routed to the context's private pool (every graph passes the same pool id,
// so N buckets cost about the largest one when captured largest first) and
// the CUDA generators registered. A capture that throws is undone
// (TorchCudaGraph::abandon_capture) before the exception reaches the router,
// which then marks the key eager and keeps serving.
class TorchGraphBackend {
 public:
  using stream_type = StreamRef;
  using exec_type = TorchGraphExec;

  explicit TorchGraphBackend(::std::shared_ptr<TorchCaptureContext> context) : context_(::std::move(context)) {}

  const ::std::shared_ptr<TorchCaptureContext>& context() const noexcept { return context_; }

  // Captures what issue(capture stream) issues. `stream` is not captured on:
  // the device is synchronized first (as torch.cuda.graph does), which orders
  // the capture after everything issued on it.
  template <class Issue>
    requires ::std::invocable<Issue&, StreamRef>
  CapturedGraph<TorchGraphExec> capture(StreamRef /*stream*/, Issue&& issue,
                                        ::std::source_location where = ::std::source_location::current()) const {
    TorchCaptureContext& ctx = *context_;
    const ::c10::DeviceIndex device = ctx.device().index();
    ::c10::cuda::CUDAGuard device_guard(ctx.device());
    check(::cudaDeviceSynchronize(), "cudaDeviceSynchronize", where);
    TorchGraphExec exec;
    exec.graph = ::std::make_unique<detail::TorchCudaGraph>();
    const int uses_before = detail::TorchCudaGraph::pool_use_count(device, ctx.pool());
    const ::std::size_t reserved_before = detail::allocator_reserved_bytes(device);
    ctx.note_capture();
    (void)ctx.take_outputs();
    try {
      ::c10::cuda::CUDAStreamGuard stream_guard(detail::torch_stream(ctx.capture_stream(), device));
#ifdef REPLAY_TORCH_PREPARE_CUBLAS
      // cuBLAS handles keep a workspace per stream, allocated on first use
      // through the caching allocator. Made now, outside the capture, it comes
      // from the ordinary pool; made during the capture it would sit in the
      // private pool for good and keep it from being freed.
      (void)::at::cuda::getCurrentCUDABlasHandle();
      (void)::at::cuda::getCurrentCUDABlasLtHandle();
      (void)::at::cuda::getCUDABlasLtWorkspace();
#endif
      exec.graph->register_generator_state(::at::cuda::detail::getDefaultCUDAGenerator(device));
      for (const ::at::Generator& generator : ctx.generators()) {
        exec.graph->register_generator_state(generator);
      }
      exec.graph->capture_begin(ctx.pool(), static_cast<::cudaStreamCaptureMode>(ctx.mode()));
      ::std::invoke(issue, ctx.capture_stream());
      exec.graph->capture_end();
    } catch (...) {
      exec.graph->abandon_capture(device, ctx.pool(), uses_before, ctx.capture_stream().get());
      (void)ctx.take_outputs();
      throw capture_failed_error("replay: " + detail::describe_capture_failure() + " (capture begun at " +
                                 replay::to_string(where) + ")");
    }
    exec.outputs = ctx.take_outputs();
    exec.exec = exec.graph->raw_cuda_graph_exec();
    exec.uses_rng = exec.graph->uses_rng();
    // Uploaded now, so that the first replay in the serving path pays no upload.
    check(::cudaGraphUpload(exec.exec, ctx.capture_stream().get()), "cudaGraphUpload", where);
    check(::cudaStreamSynchronize(ctx.capture_stream().get()), "cudaStreamSynchronize", where);
    const ::std::size_t reserved_after = detail::allocator_reserved_bytes(device);
    GraphMemory memory;
    memory.footprint_bytes = reserved_after > reserved_before ? reserved_after - reserved_before : 0;
    return CapturedGraph<TorchGraphExec>{::std::move(exec), memory};
  }

  // Captures anew into a new graph that replaces `exec` (torch graphs are not
  // updated in place: the new capture may have drawn new pool memory).
  template <class Issue>
    requires ::std::invocable<Issue&, StreamRef>
  RecaptureResult recapture(TorchGraphExec& exec, StreamRef stream, Issue&& issue,
                            ::std::source_location where = ::std::source_location::current()) const {
    CapturedGraph<TorchGraphExec> fresh = capture(stream, issue, where);
    exec = ::std::move(fresh.exec);
    return RecaptureResult{UpdatePath::reinstantiated, fresh.memory};
  }

  // One cudaGraphLaunch on `stream`; through CUDAGraph::replay() (which
  // advances the generators first) when the capture drew random numbers.
  void launch(const TorchGraphExec& exec, StreamRef stream,
              ::std::source_location where = ::std::source_location::current()) const {
    if (exec.uses_rng) [[unlikely]] {
      const ::c10::DeviceIndex device = context_->device().index();
      ::c10::cuda::CUDAStreamGuard guard(detail::torch_stream(stream, device));
      exec.graph->replay();
    } else {
      check(::cudaGraphLaunch(exec.exec, stream.get()), "cudaGraphLaunch", where);
    }
    context_->note_launch(&exec.outputs);
  }

 private:
  ::std::shared_ptr<TorchCaptureContext> context_;
};

static_assert(GraphBackend<TorchGraphBackend>);

// ---------------------------------------------------------------------------
// Outputs
// ---------------------------------------------------------------------------

// The outputs of one GraphedCallable call, sliced back to the caller's batch.
// Safe mode (the default), eager runs: tensors of their own. Fast mode
// (GraphedFlags::view_outputs): views of the static outputs, which the next
// replay of the same GraphedCallable overwrites; every accessor checks that
// no replay happened since and throws stale_output_error otherwise. A tensor
// taken out and kept is not checked any more: clone() it to keep it.
class GraphedOutputs {
 public:
  GraphedOutputs() = default;

  ::std::size_t size() const noexcept { return tensors_.size(); }
  bool empty() const noexcept { return tensors_.empty(); }

  // Checked access. operator[] cannot take a source location; at() does.
  const ::at::Tensor& operator[](::std::size_t index) const { return at(index); }
  const ::at::Tensor& at(::std::size_t index, ::std::source_location where = ::std::source_location::current()) const {
    check_fresh(where);
    if (index >= tensors_.size()) {
      throw usage_error("GraphedOutputs: output " + ::std::to_string(index) + " requested, but the callable returned " +
                            ::std::to_string(tensors_.size()),
                        where);
    }
    return tensors_[index];
  }
  const ::std::vector<::at::Tensor>& tensors(::std::source_location where = ::std::source_location::current()) const {
    check_fresh(where);
    return tensors_;
  }

  // True when these are fast-mode views and a later replay has overwritten them.
  bool stale() const noexcept {
    return generation_ != nullptr && generation_->load(::std::memory_order_acquire) != valid_generation_;
  }
  // True when the tensors alias the static outputs (fast mode, graph replay).
  bool is_view() const noexcept { return generation_ != nullptr; }

  // Copies of their own (checked first).
  ::std::vector<::at::Tensor> clone(::std::source_location where = ::std::source_location::current()) const {
    check_fresh(where);
    ::std::vector<::at::Tensor> out;
    out.reserve(tensors_.size());
    for (const ::at::Tensor& t : tensors_) {
      out.push_back(t.clone());
    }
    return out;
  }
  // The tensors, unchecked from here on (checked once now).
  ::std::vector<::at::Tensor> release(::std::source_location where = ::std::source_location::current()) && {
    check_fresh(where);
    generation_.reset();
    return ::std::move(tensors_);
  }

  ::std::int64_t batch() const noexcept { return batch_; }
  // The bucket the call ran as (the batch itself when it ran eagerly above the largest bucket).
  ::std::int64_t padded_batch() const noexcept { return padded_batch_; }
  RouteKind route() const noexcept { return route_; }
  // True when a graph computed these (as opposed to an eager run).
  bool graphed() const noexcept { return Route<::std::int64_t>{padded_batch_, route_}.graph(); }

 private:
  friend class GraphedCallable;

  void check_fresh(const ::std::source_location& where) const {
    if (stale()) [[unlikely]] {
      throw stale_output_error(
          "GraphedOutputs: these fast-mode outputs (GraphedFlags::view_outputs) were overwritten by a later replay "
          "of the same GraphedCallable (" +
              ::std::to_string(generation_->load(::std::memory_order_acquire) - valid_generation_) +
              " replay(s) since); clone() them before the next call, or use safe mode",
          where);
    }
  }

  ::std::vector<::at::Tensor> tensors_;
  ::std::shared_ptr<const ::std::atomic<::std::uint64_t>> generation_;  // null: owned, never stale
  ::std::uint64_t valid_generation_ = 0;
  ::std::int64_t batch_ = 0;
  ::std::int64_t padded_batch_ = 0;
  RouteKind route_ = RouteKind::eager_fallback;
};

// ---------------------------------------------------------------------------
// GraphedCallable
// ---------------------------------------------------------------------------

namespace detail {

struct GraphedInputSpec {
  ::at::ScalarType dtype;
  ::std::vector<::std::int64_t> sizes;  // dimension 0 is the capacity (largest bucket)
  ::std::size_t row_bytes = 0;          // bytes of one batch row
};

// Everything a GraphedCallable owns, at a fixed address: the router's work
// callable points here.
struct GraphedState {
  using router_type = ShapeRouter<::std::int64_t, TorchGraphBackend>;

  TensorFunction fn;
  GraphedFlags flags = GraphedFlags::none;
  ::c10::Device device{::c10::kCUDA, 0};
  ::std::vector<GraphedInputSpec> specs;
  ::std::vector<::std::int64_t> buckets;
  ::std::int64_t capacity = 0;
  ::std::vector<::at::Tensor> static_inputs;
  ::std::vector<::std::vector<::at::Tensor>> bucket_inputs;  // per bucket: the static inputs narrowed to it
  ::std::vector<::at::Tensor> oversize_inputs;               // the caller's, for a batch above the largest bucket
  CaptureFailureHandler<::std::int64_t> user_handler;
  ::std::string failure;  // of the capture in the current call or constructor (no_fallback)
  ::std::optional<Event> done;  // recorded after every call: orders a call on another stream after it
  ::cudaStream_t last_stream = nullptr;
  bool has_last = false;
  ::std::mutex mutex;
  ::std::shared_ptr<TorchCaptureContext> context;
  ::std::unique_ptr<router_type> router;  // last: destroyed first, so the graphs go before the context

  GraphedState() = default;
  GraphedState(const GraphedState&) = delete;
  GraphedState& operator=(const GraphedState&) = delete;
  ~GraphedState() {
    try {
      if (has_last && done) {
        done->synchronize();  // the static buffers may still be in use on the caller's stream
      }
    } catch (...) {
    }
    router.reset();
  }

  const ::std::vector<::at::Tensor>& inputs_for(::std::int64_t shape) {
    if (shape > capacity) {
      return oversize_inputs;
    }
    const auto it = ::std::lower_bound(buckets.begin(), buckets.end(), shape);
    if (it != buckets.end() && *it == shape) {
      return bucket_inputs[static_cast<::std::size_t>(it - buckets.begin())];
    }
    oversize_inputs.clear();  // not a bucket: only reachable through a router of one's own
    for (const ::at::Tensor& t : static_inputs) {
      oversize_inputs.push_back(t.narrow(0, 0, shape));
    }
    return oversize_inputs;
  }

  // The router's work: run the callable on the static inputs of `shape`
  // (padded), with `stream` as torch's current stream.
  void issue(::std::int64_t shape, StreamRef stream) {
    const ::std::source_location where = ::std::source_location::current();
    ::c10::cuda::CUDAStreamGuard stream_guard(torch_stream(stream, device.index()));
    GradScope grad(flags);
    ::std::vector<::at::Tensor> outputs = fn(inputs_for(shape));
    for (::std::size_t i = 0; i < outputs.size(); ++i) {
      const ::at::Tensor& t = outputs[i];
      if (!t.defined() || !t.is_cuda() || t.device() != device) {
        throw usage_error("GraphedCallable: output " + ::std::to_string(i) + " of the callable is " +
                              (t.defined() ? "on " + t.device().str() : ::std::string("undefined")) +
                              "; graphed outputs must be tensors on " + device.str(),
                          where);
      }
    }
    context->set_outputs(::std::move(outputs));
  }

  void on_failure(const ::std::int64_t& batch, ::std::string_view reason) {
    if (failure.empty()) {
      failure = reason;
    }
    if (user_handler) {
      user_handler(batch, reason);
    } else {
      const ::std::string line = "replay::GraphedCallable: capturing batch " + ::std::to_string(batch) +
                                 " failed; it runs eagerly from now on. " + ::std::string(reason) + "\n";
      ::std::fputs(line.c_str(), stderr);
    }
  }

  // Validates the caller's inputs against the specs; returns the batch. The
  // messages are built only on failure: this runs on every call.
  ::std::int64_t check_inputs(const ::std::vector<::at::Tensor>& inputs, const ::std::source_location& where) const {
    if (inputs.size() != specs.size()) {
      throw usage_error("GraphedCallable: called with " + ::std::to_string(inputs.size()) + " input(s), but it was "
                            "captured with " + ::std::to_string(specs.size()),
                        where);
    }
    ::std::int64_t batch = -1;
    for (::std::size_t i = 0; i < inputs.size(); ++i) {
      const ::at::Tensor& t = inputs[i];
      const GraphedInputSpec& spec = specs[i];
      bool match = t.defined() && t.scalar_type() == spec.dtype &&
                   static_cast<::std::size_t>(t.dim()) == spec.sizes.size() && t.size(0) >= 1;
      for (::std::size_t d = 1; match && d < spec.sizes.size(); ++d) {
        match = t.size(static_cast<::std::int64_t>(d)) == spec.sizes[d];
      }
      if (!match) [[unlikely]] {
        throw usage_error("GraphedCallable: input " + ::std::to_string(i) + " " + describe_input(t) +
                              ", but the graphs were captured for shape " + describe_spec(spec),
                          where);
      }
      if (batch < 0) {
        batch = t.size(0);
      } else if (t.size(0) != batch) [[unlikely]] {
        throw usage_error("GraphedCallable: input 0 has batch " + ::std::to_string(batch) + " but input " +
                              ::std::to_string(i) + " has batch " + ::std::to_string(t.size(0)) + " (shape " +
                              describe_sizes(t.sizes()) + "); dimension 0 of every input is the batch",
                          where);
      }
      if (!t.is_cuda() && !t.is_cpu()) [[unlikely]] {
        throw usage_error("GraphedCallable: input " + ::std::to_string(i) + " is on " + t.device().str() +
                              "; give CUDA or CPU tensors",
                          where);
      }
    }
    return batch;
  }

  static ::std::string describe_input(const ::at::Tensor& t) {
    if (!t.defined()) {
      return "is an undefined tensor";
    }
    return "has shape " + describe_sizes(t.sizes()) + " and dtype " + ::std::string(::c10::toString(t.scalar_type()));
  }
  ::std::string describe_spec(const GraphedInputSpec& spec) const {
    ::std::string out = "[B";
    for (::std::size_t d = 1; d < spec.sizes.size(); ++d) {
      out += ", " + ::std::to_string(spec.sizes[d]);
    }
    return out + "] (B = batch, up to " + ::std::to_string(capacity) + " graphed) and dtype " +
           ::std::string(::c10::toString(spec.dtype));
  }

  // Copies the caller's rows into the static inputs on `stream` and zeroes the
  // padding rows.
  void stage_inputs(const ::std::vector<::at::Tensor>& inputs, ::std::int64_t batch, ::std::int64_t padded,
                    ::cudaStream_t stream, const ::std::source_location& where) {
    for (::std::size_t i = 0; i < inputs.size(); ++i) {
      const ::at::Tensor& src = inputs[i];
      ::at::Tensor& dst = static_inputs[i];
      auto* base = static_cast<unsigned char*>(dst.data_ptr());
      const ::std::size_t bytes = static_cast<::std::size_t>(batch) * specs[i].row_bytes;
      if (src.is_cuda() && src.device() == device && src.is_contiguous()) {
        // The hot path: one cudaMemcpyAsync, no dispatcher.
        check(::cudaMemcpyAsync(base, src.data_ptr(), bytes, ::cudaMemcpyDeviceToDevice, stream), "cudaMemcpyAsync",
              where);
      } else {
        // Host tensors (pinned ones asynchronously, with the host allocator's
        // event), other devices, strided tensors: through copy_.
        ::c10::InferenceMode inference;
        dst.narrow(0, 0, batch).copy_(src, /*non_blocking=*/true);
      }
      if (padded > batch && !has_flag(flags, GraphedFlags::keep_padding)) {
        check(::cudaMemsetAsync(base + bytes, 0, static_cast<::std::size_t>(padded - batch) * specs[i].row_bytes,
                                stream),
              "cudaMemsetAsync", where);
      }
    }
  }
};

}  // namespace detail

namespace detail {

// The GraphedCallable whose lock this thread holds, if any: a callable or
// failure handler calling back into the same object gets a usage_error
// instead of re-locking its mutex (a deadlock).
class ActiveGraphedScope : ReentryGuard<GraphedState> {
 public:
  ActiveGraphedScope(const GraphedState* state, const char* what, const ::std::source_location& where)
      : ReentryGuard<GraphedState>(refuse_reentry(state, what, where)) {}

 private:
  static const GraphedState* refuse_reentry(const GraphedState* state, const char* what,
                                            const ::std::source_location& where) {
    if (inside(state)) {
      throw usage_error(::std::string("GraphedCallable::") + what +
                            " called from inside the same GraphedCallable (its callable or its capture-failure "
                            "handler); that would deadlock",
                        where);
    }
    return state;
  }
};

// Once work for a call may be in flight on `stream` (its inputs staged), later
// calls must be ordered after it even if this call throws: records the
// state's "done" event on `stream` and drops the caller's tensors at scope
// exit, unless disarmed by the success path (which records it itself).
class SettleOnThrow {
 public:
  SettleOnThrow(GraphedState& s, ::cudaStream_t stream) noexcept : s_(s), stream_(stream) {}
  SettleOnThrow(const SettleOnThrow&) = delete;
  SettleOnThrow& operator=(const SettleOnThrow&) = delete;
  void disarm() noexcept { armed_ = false; }
  ~SettleOnThrow() {
    if (!armed_) {
      return;
    }
    try {
      s_.oversize_inputs.clear();
      s_.done->record(StreamRef(stream_));
      s_.last_stream = stream_;
      s_.has_last = true;
    } catch (...) {  // the original exception is the one to report
    }
  }

 private:
  GraphedState& s_;
  ::cudaStream_t stream_;
  bool armed_ = true;
};

}  // namespace detail

// A torch callable with CUDA graphs: one per batch-size bucket, all in one
// private memory pool, replayed on the caller's current torch stream.
//
// Each call copies the caller's tensors into the static inputs (rows
// 0..n-1, padding rows zeroed), replays the bucket's graph (or runs eagerly:
// a bucket whose capture failed, a batch above the largest bucket) and
// returns the outputs sliced back to n rows (an output whose dimension 0 is
// the bucket size is sliced; others are returned whole).
//
// Threading: calls are serialized by an internal mutex. Device work goes on
// torch's current stream of the calling thread; a call on another stream than
// the previous call waits for it on the device first (the static buffers are
// shared). Capture uses its own stream.
class GraphedCallable {
 public:
  using router_type = ShapeRouter<::std::int64_t, TorchGraphBackend>;

  // `example_inputs`: one CUDA tensor per argument of the callable, all on one
  // device, dimension 0 the batch (any batch; the static inputs are sized for
  // the largest bucket and filled with the examples' rows). Captures every
  // bucket now, largest first, unless GraphedFlags::lazy_capture.
  template <TensorCallable F>
  GraphedCallable(F&& fn, ::std::vector<::at::Tensor> example_inputs, GraphedOptions options = {},
                  ::std::source_location where = ::std::source_location::current())
      : state_(::std::make_unique<detail::GraphedState>()) {
    init(make_tensor_function(::std::forward<F>(fn), where), ::std::move(example_inputs), ::std::move(options), where);
  }

  GraphedCallable(const GraphedCallable&) = delete;
  GraphedCallable& operator=(const GraphedCallable&) = delete;
  GraphedCallable(GraphedCallable&&) noexcept = default;
  GraphedCallable& operator=(GraphedCallable&&) noexcept = default;
  ~GraphedCallable() = default;

  // One call: stage the inputs, replay (or run eagerly), return the outputs.
  // usage_error for a wrong number of inputs, a dtype or a non-batch
  // dimension that differs from the examples (both shapes in the message),
  // inputs of different batch sizes, or a batch above the largest bucket under
  // OversizePolicy::throw_error.
  GraphedOutputs run(const ::std::vector<::at::Tensor>& inputs,
                     ::std::source_location where = ::std::source_location::current()) {
    detail::GraphedState& s = state(where);
    const detail::ActiveGraphedScope active(&s, "run()", where);
    ::std::lock_guard<::std::mutex> lock(s.mutex);
    const ::std::int64_t batch = s.check_inputs(inputs, where);
    const ::std::int64_t padded = s.router->padded_shape(batch, where);
    ::c10::cuda::CUDAGuard device_guard(s.device);
    const ::cudaStream_t stream = ::c10::cuda::getCurrentCUDAStream(s.device.index()).stream();
    if (s.has_last && s.last_stream != stream) {
      s.done->wait_on(StreamRef(stream), where);
    }
    detail::SettleOnThrow settle(s, stream);
    if (padded <= s.capacity) {
      s.stage_inputs(inputs, batch, padded, stream, where);
    } else {
      s.oversize_inputs.clear();
      for (const ::at::Tensor& t : inputs) {
        s.oversize_inputs.push_back(t.device() == s.device ? t : t.to(s.device, /*non_blocking=*/true));
      }
    }
    s.failure.clear();
    const Route<::std::int64_t> route = s.router->run(batch, StreamRef(stream), where);
    s.oversize_inputs.clear();
    GraphedOutputs out = collect(s, route, batch, where);
    s.done->record(StreamRef(stream), where);
    s.last_stream = stream;
    s.has_last = true;
    settle.disarm();
    if (!s.failure.empty() && has_flag(s.flags, GraphedFlags::no_fallback)) {
      // The router marked the bucket eager; under no_fallback it must try
      // (and fail loudly) again next time instead of silently running eagerly.
      (void)s.router->invalidate(batch, where);
      throw capture_failed_error("replay: GraphedCallable (GraphedFlags::no_fallback): batch " +
                                 ::std::to_string(route.shape) + ": " + s.failure);
    }
    return out;
  }

  // run() with the tensors as separate arguments.
  template <class... T>
    requires(sizeof...(T) > 0 && (::std::same_as<::std::remove_cvref_t<T>, ::at::Tensor> && ...))
  GraphedOutputs operator()(T&&... inputs) {
    return run(::std::vector<::at::Tensor>{::std::forward<T>(inputs)...});
  }

  // The callable run eagerly on `inputs` as given, under the same grad mode on
  // the current stream: the reference a graphed result is compared with.
  ::std::vector<::at::Tensor> run_eager(const ::std::vector<::at::Tensor>& inputs,
                                        ::std::source_location where = ::std::source_location::current()) {
    detail::GraphedState& s = state(where);
    const detail::ActiveGraphedScope active(&s, "run_eager()", where);
    ::std::lock_guard<::std::mutex> lock(s.mutex);
    ::c10::cuda::CUDAGuard device_guard(s.device);
    detail::GradScope grad(s.flags);
    return s.fn(inputs);
  }

  // Bucketed batch sizes, ascending; the largest is the capacity of the static inputs.
  ::std::span<const ::std::int64_t> buckets() const { return state().buckets; }
  ::std::int64_t max_batch() const { return state().capacity; }
  ::c10::Device device() const { return state().device; }
  GraphedFlags flags() const { return state().flags; }
  // True when `batch`'s bucket has a live graph / was marked eager after a failed capture.
  bool is_graphed(::std::int64_t batch) const { return state().router->contains(batch); }
  bool is_eager(::std::int64_t batch) const { return state().router->is_eager(batch); }
  ::std::size_t graph_count() const { return state().router->graph_count(); }
  RouterStats stats() const { return state().router->stats(); }
  void reset_stats() { state().router->reset_stats(); }
  // Captures the buckets that have no graph yet (lazy mode, or after evictions),
  // largest first; returns how many buckets have a graph.
  ::std::size_t capture_all(::std::source_location where = ::std::source_location::current()) {
    detail::GraphedState& s = state(where);
    const detail::ActiveGraphedScope active(&s, "capture_all()", where);
    ::std::lock_guard<::std::mutex> lock(s.mutex);
    return capture_buckets(s, where);
  }

  // The private pool of the caching allocator the graphs share, and its size.
  ::c10::MempoolId_t pool() const { return state().context->pool(); }
  ::std::size_t pool_reserved_bytes() const { return state().context->pool_reserved_bytes(); }
  const TorchCaptureContext& context() const { return *state().context; }

 private:
  detail::GraphedState& state(::std::source_location where = ::std::source_location::current()) const {
    if (!state_) [[unlikely]] {
      throw usage_error("GraphedCallable used after move", where);
    }
    return *state_;
  }

  void init(TensorFunction fn, ::std::vector<::at::Tensor> examples, GraphedOptions options,
            const ::std::source_location& where) {
    detail::GraphedState& s = *state_;
    if (examples.empty()) {
      throw usage_error("GraphedCallable: no example inputs; give one CUDA tensor per argument of the callable",
                        where);
    }
    ::std::int64_t example_batch = -1;
    for (::std::size_t i = 0; i < examples.size(); ++i) {
      const ::at::Tensor& t = examples[i];
      if (!t.defined() || !t.is_cuda()) {
        throw usage_error("GraphedCallable: example input " + ::std::to_string(i) + " is " +
                              (t.defined() ? "on " + t.device().str() : ::std::string("undefined")) +
                              "; example inputs must be CUDA tensors (they fix the device, dtypes and shapes)",
                          where);
      }
      if (t.dim() < 1 || t.size(0) < 1) {
        throw usage_error("GraphedCallable: example input " + ::std::to_string(i) + " has shape " +
                              detail::describe_sizes(t.sizes()) + "; dimension 0 must be a batch of at least 1",
                          where);
      }
      if (t.device() != examples[0].device()) {
        throw usage_error("GraphedCallable: example inputs on " + examples[0].device().str() + " and " +
                              t.device().str() + "; they must all be on one device",
                          where);
      }
      if (example_batch < 0) {
        example_batch = t.size(0);
      } else if (t.size(0) != example_batch) {
        throw usage_error("GraphedCallable: example input 0 has batch " + ::std::to_string(example_batch) +
                              " but example input " + ::std::to_string(i) + " has batch " +
                              ::std::to_string(t.size(0)) + "; dimension 0 of every input is the batch",
                          where);
      }
    }
    s.fn = ::std::move(fn);
    s.flags = options.flags;
    s.device = examples[0].device();
    s.user_handler = ::std::move(options.on_capture_failure);
    s.buckets = options.batch_buckets.empty() ? ::std::vector<::std::int64_t>{example_batch} : options.batch_buckets;

    ::c10::cuda::CUDAGuard device_guard(s.device);
    s.done.emplace(EventFlags::disable_timing, where);
    s.context = ::std::make_shared<TorchCaptureContext>(s.device, options.capture_mode, ::std::move(options.generators),
                                                        where);
    ShapeRouterOptions<::std::int64_t> router_options = ShapeRouterOptions<::std::int64_t>::bucketed(s.buckets);
    router_options.oversize = options.oversize;
    router_options.warmup_runs = options.warmup_runs;
    router_options.max_graphs = options.max_graphs;
    detail::GraphedState* self = &s;
    router_options.on_capture_failure = [self](const ::std::int64_t& batch, ::std::string_view reason) {
      self->on_failure(batch, reason);
    };
    // Validates the buckets (sorted, distinct, positive): usage_error otherwise.
    s.router = ::std::make_unique<router_type>(
        [self](const ::std::int64_t& shape, StreamRef stream) { self->issue(shape, stream); },
        ::std::move(router_options), TorchGraphBackend(s.context), where);
    s.capacity = s.buckets.back();

    // Static inputs: contiguous, sized for the largest bucket, normal tensors
    // even when constructed under InferenceMode, filled with the examples'
    // rows (repeated) so that warm-ups and captures see realistic values.
    {
      ::c10::InferenceMode normal_tensors(false);
      const ::at::Tensor rows = ::at::arange(s.capacity, examples[0].options().dtype(::at::kLong)).remainder(example_batch);
      for (const ::at::Tensor& t : examples) {
        ::std::vector<::std::int64_t> sizes(t.sizes().begin(), t.sizes().end());
        sizes[0] = s.capacity;
        ::at::Tensor buffer = ::at::empty(sizes, t.options().memory_format(::at::MemoryFormat::Contiguous));
        buffer.copy_(t.index_select(0, rows));
        detail::GraphedInputSpec spec{t.scalar_type(), sizes, 0};
        spec.row_bytes = static_cast<::std::size_t>(buffer.numel() / s.capacity) * buffer.element_size();
        s.specs.push_back(::std::move(spec));
        s.static_inputs.push_back(::std::move(buffer));
      }
      for (const ::std::int64_t b : s.buckets) {
        ::std::vector<::at::Tensor> views;
        for (const ::at::Tensor& buffer : s.static_inputs) {
          views.push_back(buffer.narrow(0, 0, b));
        }
        s.bucket_inputs.push_back(::std::move(views));
      }
    }
    if (!has_flag(s.flags, GraphedFlags::lazy_capture)) {
      (void)capture_buckets(s, where);
    }
  }

  // Warm-ups on a side stream (the capture stream: cuDNN, cuBLAS and the
  // caching allocator then set up per-stream state for the very stream the
  // capture records), then every bucket captured, largest first.
  static ::std::size_t capture_buckets(detail::GraphedState& s, const ::std::source_location& where) {
    ::c10::cuda::CUDAGuard device_guard(s.device);
    const StreamRef current(::c10::cuda::getCurrentCUDAStream(s.device.index()).stream());
    const StreamRef side = s.context->capture_stream();
    Event ordered;
    ordered.record(current, where);  // the static inputs' contents
    ordered.wait_on(side, where);
    if (s.has_last) {
      s.done->wait_on(side, where);
    }
    s.failure.clear();
    // If capturing throws (say, a warm-up runs out of memory), the side
    // stream's work must still be ordered before later calls.
    struct JoinSide {
      StreamRef side, current;
      detail::GraphedState& s;
      bool armed = true;
      ~JoinSide() {
        if (armed) {
          try {
            stream_wait(current, side);
            s.done->record(current);
            s.last_stream = current.get();
            s.has_last = true;
          } catch (...) {
          }
        }
      }
    } join_side{side, current, s};
    const ::std::size_t with_graph = s.router->capture_all(side, where);
    join_side.armed = false;
    Event warmed;
    warmed.record(side, where);
    warmed.wait_on(current, where);
    s.done->record(current, where);
    s.last_stream = current.get();
    s.has_last = true;
    if (!s.failure.empty() && has_flag(s.flags, GraphedFlags::no_fallback)) {
      for (const ::std::int64_t bucket : s.buckets) {  // try again (and fail loudly) next time
        if (s.router->is_eager(bucket)) {
          (void)s.router->invalidate(bucket, where);
        }
      }
      throw capture_failed_error("replay: GraphedCallable (GraphedFlags::no_fallback): " + s.failure);
    }
    return with_graph;
  }

  static GraphedOutputs collect(detail::GraphedState& s, const Route<::std::int64_t>& route, ::std::int64_t batch,
                                const ::std::source_location& where) {
    GraphedOutputs out;
    out.batch_ = batch;
    out.padded_batch_ = route.shape;
    out.route_ = route.kind;
    const bool graphed = route.graph();
    ::std::vector<::at::Tensor> produced;
    if (graphed) {
      const ::std::vector<::at::Tensor>* launched = s.context->launched_outputs();
      if (launched == nullptr) {
        throw usage_error("GraphedCallable: internal error: a graph ran but no static outputs are known", where);
      }
      produced = *launched;
    } else {
      produced = s.context->take_outputs();
    }
    const bool slice = route.shape > batch;
    const bool views = graphed && has_flag(s.flags, GraphedFlags::view_outputs);
    detail::GradScope grad(s.flags);  // the static outputs are inference tensors by default
    out.tensors_.reserve(produced.size());
    for (::at::Tensor& t : produced) {
      ::at::Tensor part = slice && t.dim() > 0 && t.size(0) == route.shape ? t.narrow(0, 0, batch) : ::std::move(t);
      out.tensors_.push_back(graphed && !views ? part.clone() : ::std::move(part));
    }
    if (views) {
      out.generation_ = s.context->generation_counter();
      out.valid_generation_ = s.context->generation();
    }
    return out;
  }

  ::std::unique_ptr<detail::GraphedState> state_;
};

}  // namespace replay
