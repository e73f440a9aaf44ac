#pragma once
// One audited capture: recording from just after the capture began until
// just before it ends, then the report (classification, inventory,
// symbolized findings).
#include <replay/detail/require_cxx20.hpp>

#include <cuda_runtime_api.h>

#include <cstdint>
#include <optional>
#include <source_location>
#include <string>
#include <utility>
#include <vector>

#include "replay/audit/detail/build_report.hpp"
#include "replay/audit/detail/inventory.hpp"
#include "replay/audit/detail/recorder.hpp"
#include "replay/audit/detail/symbolize.hpp"
#include "replay/audit/report.hpp"
#include "replay/capture_scope.hpp"
#include "replay/error.hpp"

namespace replay::detail::audit {

// A subscription to the recorder for as long as it lives (the first one
// subscribes, the last one unsubscribes).
class RecorderLease {
 public:
  explicit RecorderLease(const ::std::source_location& where) { Recorder::instance().acquire(where); }
  RecorderLease(const RecorderLease&) = delete;
  RecorderLease& operator=(const RecorderLease&) = delete;
  ~RecorderLease() { Recorder::instance().release(); }
};

class Session {
 public:
  // Call right after the capture of `origin` began on this thread (a lease must be held).
  Session(::cudaStream_t origin, CaptureMode mode, ::std::source_location begun_at) noexcept
      : origin_(origin), mode_(mode), begun_at_(begun_at), thread_(os_thread_id()) {
    const CaptureState state = Recorder::instance().capture_state(origin);
    if (state.status == CU_STREAM_CAPTURE_STATUS_ACTIVE) {
      capture_id_ = state.id;
      capture_graph_ = state.graph;
    }
    try {
      mark_ = Recorder::instance().open_session();
      open_ = true;
    } catch (...) {  // out of memory: the report will say that nothing was recorded
    }
  }
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;
  ~Session() { stop(); }

  // Stops recording (before the capture ends).
  void stop() noexcept {
    if (!open_) {
      return;
    }
    open_ = false;
    try {
      raw_ = Recorder::instance().close_session(mark_);
    } catch (...) {
      lost_ = true;
    }
  }

  // True when the origin stream's capture is invalidated now (before it ends).
  bool origin_invalidated() const noexcept {
    return Recorder::instance().capture_state(origin_).status == CU_STREAM_CAPTURE_STATUS_INVALIDATED;
  }

  // The report, once the capture ended with `end_status` and made `graph` (null if none).
  AuditReport report(int end_status, ::cudaGraph_t graph, ::std::string work_error = {}) {
    stop();
    ReportInput input;
    input.calls.reserve(raw_.size());
    ::std::vector<::std::uintptr_t> capture_streams{reinterpret_cast<::std::uintptr_t>(origin_)};
    for (const RawCall& raw : raw_) {
      input.calls.push_back(to_audited_call(raw, capture_id_, thread_, capture_streams, capture_graph_));
      if (input.calls.back().kernel.empty() && raw.kernel_handle.kind != KernelHandle::Kind::none) {
        input.calls.back().kernel = kernel_name(raw.kernel_handle);
      }
    }
    apply_node_evidence(input.calls);
    input.facts = CaptureFacts{thread_, mode_, end_status};
    if (graph != nullptr) {
      input.graph = graph_contents(graph);
    }
    input.begun_at = replay::to_string(begun_at_);
    input.work_error = ::std::move(work_error);
    if (capture_id_ == 0) {
      input.notes.emplace_back("the capture's id could not be read when it began: streams of the capture are "
                               "recognized by the origin stream only");
    }
    if (lost_) {
      input.notes.emplace_back("out of memory while collecting the calls: the list is incomplete");
    }
    AuditReport report = build_report(::std::move(input), [](const auto& stacks) {
      return Symbolizer::instance().resolve(stacks);
    });
    if ((report.breaking || !report.escaped.empty() || !report.unsafe.empty()) &&
        !Symbolizer::instance().has_line_information()) {
      report.notes.emplace_back("no addr2line was found (binutils), so frames have function names but no "
                                "file:line; install binutils or set REPLAY_AUDIT_ADDR2LINE to one");
    }
    return report;
  }

 private:
  ::cudaStream_t origin_;
  CaptureMode mode_;
  ::std::source_location begun_at_;
  ::std::uint64_t thread_;
  ::std::uint64_t capture_id_ = 0;
  ::std::uintptr_t capture_graph_ = 0;
  Recorder::Mark mark_;
  bool open_ = false;
  bool lost_ = false;
  ::std::vector<RawCall> raw_;
};

}  // namespace replay::detail::audit
