#pragma once
// The hook between the core's captures and the capture audit, which the
// core does not depend on: replay/audit.hpp installs an observer here when
// it is included (static initialization), and CaptureScope (and the torch
// backend) ask it to observe a capture when the audit switch is on. With
// the switch off nothing is called; with it on and no observer installed,
// one line on stderr says so, once.
#include <replay/detail/require_cxx20.hpp>

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <source_location>
#include <span>
#include <string>
#include <string_view>

#include "replay/audit_switch.hpp"

namespace replay::detail {

// What an observation found when its capture ended: the verdict for an
// error message ("" when nothing was found), and whether it names the call
// that broke the capture (then the generic list of likely causes is left out).
struct CaptureVerdict {
  ::std::string text;
  bool names_cause = false;
};

// One observed capture (implemented by the audit).
class CaptureObservation {
 public:
  CaptureObservation() = default;
  CaptureObservation(const CaptureObservation&) = delete;
  CaptureObservation& operator=(const CaptureObservation&) = delete;
  virtual ~CaptureObservation() = default;
  // The capture just began on `stream`, on this thread (mode: cudaStreamCaptureMode).
  virtual void begin(::cudaStream_t stream, int mode, const ::std::source_location& where) noexcept = 0;
  // The capture is about to end: stop observing.
  virtual void stop() noexcept = 0;
  // The capture ended: `end_status` is what cudaStreamEndCapture returned
  // (-1: not known), `graph` what it produced (null if none).
  virtual CaptureVerdict end(int end_status, ::cudaGraph_t graph) noexcept = 0;
};

// Makes an observation for a capture about to begin; `required`: the audit
// was asked for explicitly (AuditSwitch::on), so that being unable to audit
// throws rather than warns.
using CaptureObserver = ::std::unique_ptr<CaptureObservation> (*)(bool required, const ::std::source_location& where);

inline ::std::atomic<CaptureObserver>& capture_observer() noexcept {
  static ::std::atomic<CaptureObserver> observer{nullptr};
  return observer;
}

inline bool install_capture_observer(CaptureObserver observer) noexcept {
  capture_observer().store(observer, ::std::memory_order_release);
  return true;
}

// One line of a framework's own interpreted program (TorchScript's source
// ranges) that the running operator was called from.
struct OperatorCaller {
  ::std::string function;  // "forward"
  ::std::string file;      // "model.py"
  unsigned line = 0;       // 1-based
};

// The operator running on the calling thread, as a framework adapter knows
// it; valid until that operator returns.
struct RunningOperator {
  // "aten::_local_scalar_dense"; null when no operator runs
  const char* name = nullptr;
  // The interpreted program's lines it was called from, innermost first
  // (empty outside an interpreter)
  ::std::span<const OperatorCaller> callers;
};

// Says which operator runs on the calling thread: set by a framework adapter
// (the libtorch adapter tracks aten operators, and TorchScript's lines,
// while an audited capture runs) and asked by the audit for each call it records.
using RunningOperatorSource = RunningOperator (*)() noexcept;
inline ::std::atomic<RunningOperatorSource>& running_operator_source() noexcept {
  static ::std::atomic<RunningOperatorSource> source{nullptr};
  return source;
}

// REPLAY_AUDIT=1 (or on, true, yes), read once.
inline bool audit_requested_by_environment() noexcept {
  static const bool requested = [] {
    const char* value = ::std::getenv("REPLAY_AUDIT");
    if (value == nullptr) {
      return false;
    }
    const ::std::string_view v(value);
    return v == "1" || v == "on" || v == "ON" || v == "true" || v == "TRUE" || v == "yes" || v == "YES";
  }();
  return requested;
}

// The switch a component (ShapeRouter, GraphedCallable) sets for the
// captures its backend makes on this thread: a CaptureScope left at
// AuditSwitch::from_environment follows it.
inline AuditSwitch& audit_request_for_this_thread() noexcept {
  thread_local AuditSwitch request = AuditSwitch::from_environment;
  return request;
}

class AuditRequestScope {
 public:
  explicit AuditRequestScope(AuditSwitch request) noexcept : saved_(audit_request_for_this_thread()) {
    if (request != AuditSwitch::from_environment) {
      audit_request_for_this_thread() = request;
    }
  }
  AuditRequestScope(const AuditRequestScope&) = delete;
  AuditRequestScope& operator=(const AuditRequestScope&) = delete;
  ~AuditRequestScope() { audit_request_for_this_thread() = saved_; }

 private:
  AuditSwitch saved_;
};

// The switch in force for a capture asked to use `requested`.
inline AuditSwitch effective_audit_switch(AuditSwitch requested) noexcept {
  if (requested == AuditSwitch::from_environment) {
    requested = audit_request_for_this_thread();
  }
  if (requested == AuditSwitch::from_environment) {
    return audit_requested_by_environment() ? AuditSwitch::from_environment : AuditSwitch::off;
  }
  return requested;
}

// An observation for a capture about to begin, or null (not asked for, or
// no audit in this program: said once on stderr). May throw
// audit_unavailable_error when the audit was asked for explicitly.
inline ::std::unique_ptr<CaptureObservation> observe_capture(AuditSwitch requested, const ::std::source_location& where) {
  const AuditSwitch effective = effective_audit_switch(requested);
  if (effective == AuditSwitch::off) [[likely]] {
    return nullptr;
  }
  const CaptureObserver observer = capture_observer().load(::std::memory_order_acquire);
  if (observer == nullptr) {
    static ::std::atomic<bool> said{false};
    if (!said.exchange(true)) {
      (void)::std::fputs("replay: a capture audit was asked for (REPLAY_AUDIT or AuditSwitch::on), but this program "
                         "does not contain the audit: include <replay/audit.hpp> and link replay::audit (it needs "
                         "CUPTI). Captures run unaudited.\n",
                         stderr);
    }
    return nullptr;
  }
  return observer(effective == AuditSwitch::on, where);
}

}  // namespace replay::detail
