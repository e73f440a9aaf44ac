#pragma once
// Internals of the libtorch adapter's capture: at::cuda::CUDAGraph with
// clean abandonment of a failed capture, cuBLAS workspace release, torch
// stream and allocator queries, the grad-mode scope, failure messages.
#include <replay/detail/require_cxx20.hpp>

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
#include <cstddef>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>
#include <tuple>
#include <vector>

#include "replay/detail/message.hpp"
#include "replay/error.hpp"
#include "replay/flags.hpp"
#include "replay/stream_ref.hpp"
#include "replay/torch/options.hpp"

namespace replay::detail {

// at::cuda::CUDAGraph, with what a failed capture needs to be undone cleanly
// and what the replay fast path needs to know. The base class handles the
// caching allocator's private pool, the host allocator's pool and the CUDA
// generators exactly as torch.cuda.graph does; it does not recover from a
// capture that fails half-way (capture_end throws before it ends the
// allocator's routing, so the next capture into the same pool would be
// refused), which abandon_capture() does.
//
// keep_graph: false (torch.cuda.graph's way), capture_end() instantiates the
// graph and destroys the cudaGraph_t; true, capture_end() only ends the
// capture and the cudaGraph_t stays (raw_cuda_graph()) until the destructor,
// which destroys it and gives back the pool reference like any other
// (CUDAGraph::reset()): a graph wrapper (TorchGraphBackend) instantiates a
// graph of its own around it, and torch's executable graph is never made.
class TorchCudaGraph : public ::at::cuda::CUDAGraph {
 public:
  explicit TorchCudaGraph(bool keep_graph = false) : ::at::cuda::CUDAGraph(keep_graph) {}

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

  // The generator states registered so far (capture_begin adds the device's
  // default generator's on its own).
  ::std::vector<const void*> registered_generator_states() const {
    ::std::vector<const void*> out;
    for (const auto& entry : captured_generator_states_) {
      out.push_back(entry.first.get());
    }
    return out;
  }
  // Takes every registered state not in `keep` out of capture mode again:
  // capture_begin always registers the device's default generator and puts
  // it into capture mode, which makes every other thread's eager random
  // numbers on the device fail while the capture is open. The caller holds
  // the default generator's mutex from before capture_begin until after
  // this, so no other thread sees it in capture mode in between.
  void leave_capture_mode_except(const ::std::vector<const void*>& keep) noexcept {
    for (auto& entry : captured_generator_states_) {
      if (::std::find(keep.begin(), keep.end(), entry.first.get()) == keep.end()) {
        [](auto& state) {
          if constexpr (requires { state->capturing_ = false; }) {
            state->capturing_ = false;
          }
        }(entry.first);
      }
    }
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
    clear_error_slot_if(is_capture_error);  // a capture error is reported by the exception, not left behind
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

// cuBLAS handles keep a workspace per stream, allocated on first use through
// the caching allocator. Made before a capture on torch's current stream, it
// comes from the ordinary pool; made during the capture it would sit in the
// private pool for good and keep it from being freed.
inline void prepare_cublas_for_capture() {
#ifdef REPLAY_TORCH_PREPARE_CUBLAS
  (void)::at::cuda::getCurrentCUDABlasHandle();
  (void)::at::cuda::getCurrentCUDABlasLtHandle();
  (void)::at::cuda::getCUDABlasLtWorkspace();
#endif
}

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
    if (d != 0) {
      out += ", ";
    }
    out += ::std::to_string(sizes[d]);
  }
  out += ']';
  return out;
}

// Every torch capture holds it: shared by captures that leave the default
// generator alone and register no generator of their own; exclusive for
// those that put generators into capture mode (two at once would share a
// generator's capture state and offset, and a shared one ending its capture
// would take the default generator out of capture mode under them).
inline ::std::shared_mutex& generator_capture_mutex() noexcept {
  static ::std::shared_mutex mutex;
  return mutex;
}

// Inside a catch block for a failed capture: true when the cause was outside
// the captured work (the capture was invalidated by another thread, memory
// ran out), as opposed to a call of the work that cannot be captured.
inline bool capture_was_interrupted() noexcept {
  try {
    throw;
  } catch (const ::c10::OutOfMemoryError&) {
    return true;
  } catch (const cuda_error& e) {
    return e.status() == ::cudaErrorStreamCaptureInvalidated || e.status() == ::cudaErrorMemoryAllocation;
  } catch (const ::std::exception& e) {
    const ::std::string what = e.what();
    // torch reports CUDA errors by their text ("operation failed due to a
    // previous error during capture" for cudaErrorStreamCaptureInvalidated);
    // a call of the work that is illegal in a capture reads "operation not
    // permitted when stream is capturing" instead.
    return what.find(::cudaGetErrorString(::cudaErrorStreamCaptureInvalidated)) != ::std::string::npos &&
           what.find(::cudaGetErrorString(::cudaErrorStreamCaptureUnsupported)) == ::std::string::npos;
  } catch (...) {
    return false;
  }
}

// Inside a catch block: what was thrown, without c10's backtrace.
inline ::std::string describe_torch_exception() {
  try {
    throw;
  } catch (const ::c10::Error& e) {
    return e.what_without_backtrace();
  } catch (...) {
    return describe_current_exception();
  }
}

// The message of a failed capture, without c10's backtrace; the generic list
// of likely causes is left out when the capture audit named the cause.
inline ::std::string describe_capture_failure(CaptureErrorHint hint = CaptureErrorHint::likely_causes) {
  const ::std::string reason = describe_torch_exception();
  ::std::string out = detail::concat("capturing the torch callable failed: ", reason);
  if (reason.find("not in capture mode") != ::std::string::npos) {
    out += "; the callable draws random numbers from the device's default CUDA generator, which is not put into "
           "capture mode by default (that would make eager random numbers in every other thread on the device fail "
           "for the whole capture). Draw from a generator of your own and pass it in GraphedOptions::generators "
           "(or TorchCaptureContext's generators), or set GraphedFlags::capture_default_generator when no other "
           "thread uses the default generator during captures";
  }
  if (hint == CaptureErrorHint::likely_causes && reason.find("captur") != ::std::string::npos &&
      reason.find(capture_error_hint) == ::std::string::npos) {
    out += "; ";
    out += capture_error_hint;
    out += " (in torch code: .item(), .cpu(), printing a CUDA tensor, nonzero(), data-dependent shapes)";
  }
  return out;
}

}  // namespace replay::detail
