#pragma once
// CaptureAudit and audit_capture(): a capture recorded call by call through
// CUDA's profiling interface (CUPTI), and the report of what broke it, what
// escaped it and what the graph holds.
#include <replay/detail/require_cxx20.hpp>

#include <cuda_runtime_api.h>

#include <cstdint>
#include <exception>
#include <functional>
#include <optional>
#include <source_location>
#include <string>
#include <utility>

#include "replay/audit/detail/recorder.hpp"
#include "replay/audit/detail/session.hpp"
#include "replay/audit/errors.hpp"
#include "replay/audit/report.hpp"
#include "replay/audit_switch.hpp"
#include "replay/capture_scope.hpp"
#include "replay/detail/message.hpp"
#include "replay/detail/signature_checks.hpp"
#include "replay/error.hpp"
#include "replay/graph.hpp"
#include "replay/stream_ref.hpp"

namespace replay {

// What audit_capture() returns: the graph (empty when the capture failed),
// the report, and what the work threw, if it threw.
struct AuditedCapture {
  // The captured graph; empty when the capture failed.
  Graph graph;
  // What the audit found.
  AuditReport report;
  // What the captured work threw, if it threw.
  ::std::exception_ptr work_error;

  // Rethrows what the captured work threw, if anything.
  void rethrow_work_error() const {
    if (work_error != nullptr) {
      ::std::rethrow_exception(work_error);
    }
  }
};

// Subscribes to CUPTI's runtime and driver API callbacks for its lifetime
// (nothing before, nothing after; several CaptureAudits alive at once share
// one subscription) and audits the captures made through capture(). CUPTI
// allows one subscriber per process: under Nsight Systems or another
// profiler the constructor throws audit_unavailable_error saying so.
// Auditing costs about a microsecond per CUDA call of every thread while an
// audited capture is open, and a few on every call while a CaptureAudit lives.
class CaptureAudit {
 public:
  // Subscribes (or shares the subscription of a CaptureAudit alive); throws
  // audit_unavailable_error when CUPTI cannot be had.
  explicit CaptureAudit(::std::source_location where = ::std::source_location::current()) : lease_(where) {}
  CaptureAudit(const CaptureAudit&) = delete;
  CaptureAudit& operator=(const CaptureAudit&) = delete;
  CaptureAudit(CaptureAudit&&) = delete;
  CaptureAudit& operator=(CaptureAudit&&) = delete;
  ~CaptureAudit() = default;

  // Captures what work(stream) issues, as replay::capture does, and audits
  // it. Never throws for what happens inside the capture: a capture error
  // or an exception of the work is in the result (the graph is then empty).
  template <class Work>
  [[nodiscard]] AuditedCapture capture(StreamRef stream, Work&& work, CaptureMode mode = CaptureMode::this_thread,
                                       ::std::source_location where = ::std::source_location::current()) {
    detail::check_capture_work<Work>();
    AuditedCapture out;
    // Audited here, not again by the hook
    CaptureScope scope(stream, mode, AuditSwitch::off, where);
    detail::audit::Session session(stream.get(), mode, where);
    ::std::string work_error;
    try {
      ::std::invoke(work, stream);
    } catch (...) {
      out.work_error = ::std::current_exception();
      work_error = detail::describe_current_exception();
    }
    session.stop();
    if (out.work_error != nullptr) {
      const int end_status = session.origin_invalidated() ? ::cudaErrorStreamCaptureInvalidated : ::cudaSuccess;
      scope.abort();
      out.report = session.report(end_status, nullptr, ::std::move(work_error));
      return out;
    }
    int end_status = ::cudaSuccess;
    try {
      out.graph = scope.finish(where);
    } catch (const cuda_error& e) {
      end_status = e.status();
    } catch (...) {  // a buffer freed during the capture (usage_error): the graph was refused
      work_error = detail::describe_current_exception();
      out.work_error = ::std::current_exception();
    }
    out.report = session.report(end_status, out.graph ? out.graph.get() : nullptr, ::std::move(work_error));
    return out;
  }

  // The id the reports give this thread (its OS thread id).
  static ::std::uint64_t this_thread_id() noexcept { return detail::audit::os_thread_id(); }

 private:
  detail::audit::RecorderLease lease_;
};

// Audits one capture: CaptureAudit(where).capture(stream, work, mode, where).
template <class Work>
[[nodiscard]] AuditedCapture audit_capture(StreamRef stream, Work&& work, CaptureMode mode = CaptureMode::this_thread,
                                           ::std::source_location where = ::std::source_location::current()) {
  CaptureAudit audit(where);
  return audit.capture(stream, ::std::forward<Work>(work), mode, where);
}

}  // namespace replay
