#pragma once
// The audit behind the core's capture hook (replay/detail/capture_observer.hpp):
// installed when replay/audit.hpp is part of the program, it audits the
// captures that CaptureScope, replay::capture, ShapeRouter and
// GraphedCallable make with the audit switched on (or REPLAY_AUDIT=1).
// A broken capture's error then carries the verdict; a capture that
// succeeded with findings (escaped work, unsafe calls) is reported on stderr.
#include <replay/detail/require_cxx20.hpp>

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdio>
#include <memory>
#include <optional>
#include <source_location>
#include <string>

#include "replay/audit/detail/session.hpp"
#include "replay/audit/errors.hpp"
#include "replay/audit/report.hpp"
#include "replay/capture_scope.hpp"
#include "replay/detail/capture_observer.hpp"
#include "replay/detail/message.hpp"

namespace replay::detail::audit {

// The report of the last capture this thread's hook audited (for tests and
// for callers that want more than the verdict).
inline ::std::optional<AuditReport>& last_hook_report() noexcept {
  thread_local ::std::optional<AuditReport> report;
  return report;
}

class HookObservation final : public CaptureObservation {
 public:
  explicit HookObservation(const ::std::source_location& where) : lease_(where) {}

  void begin(::cudaStream_t stream, int mode, const ::std::source_location& where) noexcept override {
    session_.emplace(stream, static_cast<CaptureMode>(mode), where);
  }
  void stop() noexcept override {
    if (session_) {
      session_->stop();
    }
  }
  CaptureVerdict end(int end_status, ::cudaGraph_t graph) noexcept override {
    if (!session_) {
      return {};
    }
    try {
      AuditReport report = session_->report(end_status, graph);
      CaptureVerdict verdict;
      if (end_status != ::cudaSuccess) {  // failed (or -1: failed, status not known)
        verdict.text = report.verdict();
        verdict.names_cause = report.breaking.has_value();
      } else if (!report.clean()) {
        // The capture succeeded but the audit found something (work that
        // escaped the graph): nobody would hear of it otherwise.
        const ::std::string text = concat("replay: ", report.to_string());
        (void)::std::fputs(text.c_str(), stderr);
      }
      last_hook_report() = ::std::move(report);
      return verdict;
    } catch (...) {
      return {};
    }
  }

 private:
  RecorderLease lease_;
  ::std::optional<Session> session_;
};

inline ::std::unique_ptr<CaptureObservation> make_hook_observation(bool required, const ::std::source_location& where) {
  try {
    return ::std::make_unique<HookObservation>(where);
  } catch (const audit_unavailable_error& e) {
    if (required) {
      throw;
    }
    static ::std::atomic<bool> said{false};
    if (!said.exchange(true)) {
      const ::std::string line = concat("replay: REPLAY_AUDIT is set, but ", e.what(), "; captures run unaudited\n");
      (void)::std::fputs(line.c_str(), stderr);
    }
    return nullptr;
  }
}

// Installed once per program, before main(), by including replay/audit.hpp.
inline const bool hook_installed = install_capture_observer(&make_hook_observation);

}  // namespace replay::detail::audit
