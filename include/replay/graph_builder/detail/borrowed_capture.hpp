#pragma once
#include <replay/detail/require_cxx20.hpp>
// BorrowedCapture: a capture into a graph GraphBuilder does not own
// (cudaStreamBeginCaptureToGraph), with CaptureScope's per-thread bookkeeping.
#include <cuda_runtime_api.h>

#include <source_location>

#include "replay/capture_scope.hpp"
#include "replay/detail/capture_state.hpp"
#include "replay/detail/deferred_free.hpp"
#include "replay/error.hpp"
#include "replay/graph_builder/node.hpp"
#include "replay/stream_ref.hpp"

namespace replay::detail {

// Per-thread capture bookkeeping, as a CaptureScope keeps it, for a capture
// into a graph the builder does not own.
class BorrowedCapture {
 public:
  BorrowedCapture(::cudaStream_t stream, ::cudaGraph_t graph, const Deps& deps, CaptureMode mode,
                  const ::std::source_location& where)
      : stream_(stream), relaxed_(mode == CaptureMode::relaxed) {
    if (stream == nullptr || stream == cudaStreamLegacy) {
      throw usage_error("GraphBuilder::capture: cannot capture the legacy default stream; capture a replay::Stream",
                        where);
    }
    if (StreamRef(stream).capture_status(where) != CaptureStatus::none) {
      throw usage_error("GraphBuilder::capture: the stream is already capturing", where);
    }
    check(::cudaStreamBeginCaptureToGraph(stream, graph, deps.data(), nullptr, deps.size(),
                                          static_cast<::cudaStreamCaptureMode>(mode)),
          "cudaStreamBeginCaptureToGraph", where);
    if (open_capture_scopes()++ == 0) {
      capture_break() = {};
    }
    if (relaxed_) {
      ++open_relaxed_capture_scopes();
    }
    active_ = true;
  }
  BorrowedCapture(const BorrowedCapture&) = delete;
  BorrowedCapture& operator=(const BorrowedCapture&) = delete;
  ~BorrowedCapture() {
    if (active_) {
      ::cudaGraph_t ignored = nullptr;
      (void)end(ignored);
      if (is_capture_error(::cudaPeekAtLastError())) {
        (void)::cudaGetLastError();
      }
    }
  }

  // Ends the capture; the status of cudaStreamEndCapture and the break seen, if any.
  ::cudaError_t end(::cudaGraph_t& captured) noexcept {
    const ::cudaError_t status = ::cudaStreamEndCapture(stream_, &captured);
    broken_ = capture_break();
    active_ = false;
    if (relaxed_) {
      --open_relaxed_capture_scopes();
    }
    if (--open_capture_scopes() == 0) {
      capture_break() = {};
    }
    flush_deferred_frees();
    return status;
  }
  const CaptureBreak& broken() const noexcept { return broken_; }

 private:
  ::cudaStream_t stream_;
  bool relaxed_;
  bool active_ = false;
  CaptureBreak broken_;
};

}  // namespace replay::detail
