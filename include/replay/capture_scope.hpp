#pragma once
// CaptureScope: RAII stream capture. The capture always ends: finish() returns
// the captured Graph; a scope destroyed without finish() (an exception
// unwinding through it, an early return) ends the capture, discards the
// partial graph and leaves the stream usable for the next capture or eager
// work. When a capture was broken, finish() throws a cuda_error that says the
// capture was invalidated, names the likely causes and, where the breaking
// call went through replay::check, which call it was and where. With the
// capture audit switched on (AuditSwitch, or REPLAY_AUDIT=1, and
// replay/audit.hpp in the program) the error carries the audit's verdict:
// the call that broke the capture, its thread and its source line.
#include <replay/detail/require_cxx20.hpp>

#include <cuda_runtime_api.h>

#include <concepts>
#include <functional>
#include <memory>
#include <source_location>
#include <string>
#include <utility>

#include "replay/audit_switch.hpp"
#include "replay/detail/capture_coordinator.hpp"
#include "replay/detail/capture_observer.hpp"
#include "replay/detail/capture_state.hpp"
#include "replay/detail/deferred_free.hpp"
#include "replay/detail/message.hpp"
#include "replay/detail/signature_checks.hpp"
#include "replay/error.hpp"
#include "replay/graph.hpp"
#include "replay/stream_ref.hpp"

namespace replay {

enum class CaptureMode {
  // cudaStreamCaptureModeThreadLocal (the default): this thread may not make
  // potentially unsafe calls (cudaMalloc, synchronous copies...) while capturing;
  // other threads are unaffected.
  this_thread = ::cudaStreamCaptureModeThreadLocal,
  // cudaStreamCaptureModeGlobal: no thread in the process may make unsafe calls.
  global = ::cudaStreamCaptureModeGlobal,
  // cudaStreamCaptureModeRelaxed: unsafe calls are allowed; the caller vouches for them.
  relaxed = ::cudaStreamCaptureModeRelaxed,
};

class CaptureScope {
 public:
  // Begins capturing `stream` into a new graph.
  explicit CaptureScope(StreamRef stream, CaptureMode mode = CaptureMode::this_thread,
                        ::std::source_location where = ::std::source_location::current())
      : CaptureScope(stream, mode, AuditSwitch::from_environment, where) {}

  // The same, audited or not as `audit` says (see AuditSwitch). An audit
  // asked for with AuditSwitch::on that cannot subscribe throws
  // audit_unavailable_error before the capture begins.
  CaptureScope(StreamRef stream, CaptureMode mode, AuditSwitch audit,
               ::std::source_location where = ::std::source_location::current())
      : stream_(stream), mode_(mode), begun_at_(where) {
    refuse_bad_stream(where);
    observation_ = detail::observe_capture(audit, where);
    // Counted open before it begins, so that synchronize_device() never runs inside it.
    token_.acquire(detail::device_of(stream_.get(), where));
    begin(::cudaStreamBeginCapture(stream_.get(), static_cast<::cudaStreamCaptureMode>(mode_)),
          "cudaStreamBeginCapture", where);
  }

  // Begins capturing `stream` into an existing graph (cudaStreamBeginCaptureToGraph):
  // the captured work is appended, with no dependency on the graph's current
  // nodes. finish() hands the graph back. If the capture fails, the graph is
  // destroyed with the partial capture; clone() it first to keep the original.
  CaptureScope(StreamRef stream, Graph&& into, CaptureMode mode = CaptureMode::this_thread,
               ::std::source_location where = ::std::source_location::current())
      : stream_(stream), mode_(mode), begun_at_(where), into_(::std::move(into)) {
    refuse_bad_stream(where);
    observation_ = detail::observe_capture(AuditSwitch::from_environment, where);
    // Counted open before it begins, so that synchronize_device() never runs inside it.
    token_.acquire(detail::device_of(stream_.get(), where));
    begin(::cudaStreamBeginCaptureToGraph(stream_.get(), into_.handle(where), nullptr, nullptr, 0,
                                          static_cast<::cudaStreamCaptureMode>(mode_)),
          "cudaStreamBeginCaptureToGraph", where);
  }

  CaptureScope(const CaptureScope&) = delete;
  CaptureScope& operator=(const CaptureScope&) = delete;
  CaptureScope(CaptureScope&&) = delete;
  CaptureScope& operator=(CaptureScope&&) = delete;

  ~CaptureScope() { abort(); }

  bool active() const noexcept { return active_; }
  StreamRef stream() const noexcept { return stream_; }
  CaptureMode mode() const noexcept { return mode_; }

  // Ends the capture and returns the graph. Throws cuda_error if the capture
  // was invalidated; the stream is usable again either way.
  [[nodiscard]] Graph finish(::std::source_location where = ::std::source_location::current()) {
    if (!active_) {
      throw usage_error("CaptureScope::finish() called on a scope that has already ended", where);
    }
    ::cudaGraph_t captured = nullptr;
    if (observation_) {
      observation_->stop();
    }
    const ::cudaError_t status = ::cudaStreamEndCapture(stream_.get(), &captured);
    const detail::CaptureBreak broken = detail::capture_break();
    const int freed = detail::frees_during_capture();
    const detail::CaptureVerdict verdict =
        observation_ ? observation_->end(static_cast<int>(status), status == ::cudaSuccess ? captured : nullptr)
                     : detail::CaptureVerdict{};
    close();
    if (status != ::cudaSuccess) {
      discard(captured);
      detail::clear_error_slot(status);  // the failure is reported by the exception below
      throw cuda_error(status, "cudaStreamEndCapture", where,
                       verdict.text.empty() ? describe_break(broken)
                                            : detail::concat(describe_break(broken), "; ", verdict.text),
                       verdict.names_cause ? CaptureErrorHint::omitted : CaptureErrorHint::likely_causes);
    }
    if (freed != freed_at_open_) {
      // The graph may read or write memory that is freed now that the
      // capture has ended: refuse it rather than hand out a dangling graph.
      discard(captured);
      into_ = Graph();
      throw usage_error("a StaticBuffer (or other replay-owned memory) was destroyed while this capture was open; the "
                        "graph could use its address after it is freed. Keep buffers alive as long as the graphs "
                        "that use them",
                        where);
    }
    if (into_) {
      // Capture-to-graph returns the graph it was given.
      return ::std::move(into_);
    }
    return Graph::from_native_handle(captured);
  }

  // Ends the capture and discards what was captured. Never throws; also what
  // the destructor does for a scope that was not finished.
  void abort() noexcept {
    if (!active_) {
      return;
    }
    ::cudaGraph_t captured = nullptr;
    if (observation_) {
      observation_->stop();
    }
    const ::cudaError_t status = ::cudaStreamEndCapture(stream_.get(), &captured);
    close();
    discard(captured);
    into_ = Graph();  // the partially appended graph goes too
    // Leave no error of this capture behind for unrelated code.
    detail::clear_error_slot(status);
    detail::clear_error_slot_if(is_capture_error);
  }

 private:
  // Checks that need no CUDA call. Whether the stream is already capturing is
  // asked only where it can be: when this thread has a capture open (a nested
  // scope on the same stream), and when the begin call fails.
  void refuse_bad_stream(const ::std::source_location& where) const {
    if (stream_.handle(where) == nullptr || stream_.get() == cudaStreamLegacy) {
      throw usage_error("cannot capture the legacy default stream; capture a replay::Stream", where);
    }
    if (detail::open_capture_scopes() > 0) {
      refuse_if_capturing(where);
    }
  }
  void refuse_if_capturing(const ::std::source_location& where) const {
    if (stream_.capture_status(where) != CaptureStatus::none) {
      throw usage_error("CaptureScope: the stream is already capturing", where);
    }
  }
  void begin(::cudaError_t status, const char* api, const ::std::source_location& where) {
    if (status != ::cudaSuccess) [[unlikely]] {
      detail::clear_error_slot(status);
      refuse_if_capturing(where);  // a capture begun elsewhere: say so rather than name the status
      check(status, api, where);
    }
    open();
    if (observation_) {
      observation_->begin(stream_.get(), static_cast<int>(mode_), where);
    }
  }
  void open() noexcept {
    active_ = true;
    if (detail::open_capture_scopes()++ == 0) {
      detail::capture_break() = {};
    }
    freed_at_open_ = detail::frees_during_capture();
    if (mode_ == CaptureMode::relaxed) {
      ++detail::open_relaxed_capture_scopes();
    }
  }
  void close() noexcept {
    active_ = false;
    observation_.reset();
    if (mode_ == CaptureMode::relaxed) {
      --detail::open_relaxed_capture_scopes();
    }
    if (--detail::open_capture_scopes() == 0) {
      detail::capture_break() = {};
    }
    token_.release();
    detail::flush_deferred_frees();
  }
  void discard(::cudaGraph_t captured) const noexcept {
    if (captured != nullptr && captured != into_.get()) {
      (void)::cudaGraphDestroy(captured);
    }
  }
  ::std::string describe_break(const detail::CaptureBreak& broken) const {
    if (broken.seen) {
      return detail::concat("the capture begun at ", replay::to_string(begun_at_), " was broken by ", broken.api,
                            " at ", replay::to_string(broken.where), " (", ::cudaGetErrorName(broken.status), ")");
    }
    return detail::concat("the capture begun at ", replay::to_string(begun_at_),
                          " was broken by a call that did not go through replay::check (a raw CUDA call, or "
                          "another thread under CaptureMode::global)");
  }

  StreamRef stream_;
  CaptureMode mode_;
  ::std::source_location begun_at_;
  Graph into_;  // empty unless capturing into a given graph
  detail::CaptureToken token_;  // released when the capture ends (or if beginning it throws)
  ::std::unique_ptr<detail::CaptureObservation> observation_;  // the audit's, when the capture is audited
  int freed_at_open_ = 0;       // detail::frees_during_capture() when it began
  bool active_ = false;
};

// Captures what `work(stream)` issues on `stream` and returns it as a Graph.
// If `work` throws, the capture is ended and discarded, and the exception
// propagates with the stream usable.
template <class Work>
[[nodiscard]] Graph capture(StreamRef stream, Work&& work, CaptureMode mode = CaptureMode::this_thread,
                            ::std::source_location where = ::std::source_location::current()) {
  detail::check_capture_work<Work>();  // work(replay::StreamRef), with a plain message otherwise
  CaptureScope scope(stream, mode, where);
  ::std::invoke(work, stream);
  return scope.finish(where);
}

// The same, audited or not as `audit` says: with the audit on, a capture
// that breaks throws a cuda_error that names the breaking call, its thread
// and its line, and one with escaped work says so on stderr.
template <class Work>
[[nodiscard]] Graph capture(StreamRef stream, Work&& work, CaptureMode mode, AuditSwitch audit,
                            ::std::source_location where = ::std::source_location::current()) {
  detail::check_capture_work<Work>();
  CaptureScope scope(stream, mode, audit, where);
  ::std::invoke(work, stream);
  return scope.finish(where);
}

// Appends what `work(stream)` issues to `into` and returns it.
template <class Work>
[[nodiscard]] Graph capture_into(Graph&& into, StreamRef stream, Work&& work,
                                 CaptureMode mode = CaptureMode::this_thread,
                                 ::std::source_location where = ::std::source_location::current()) {
  detail::check_capture_work<Work>();
  CaptureScope scope(stream, ::std::move(into), mode, where);
  ::std::invoke(work, stream);
  return scope.finish(where);
}

}  // namespace replay
