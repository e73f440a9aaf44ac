#pragma once
// Makes an AuditReport from the recorded calls: classifies them, resolves
// the stacks of the calls behind findings (only those: symbolizing costs
// far more than recording), picks each one's user frame and writes the
// findings. Generic over the resolver, so that the CPU tests can use made-up frames.
#include <replay/detail/require_cxx20.hpp>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "replay/audit/call.hpp"
#include "replay/audit/detail/api_names.hpp"
#include "replay/audit/detail/classify.hpp"
#include "replay/audit/detail/frames.hpp"
#include "replay/audit/report.hpp"

namespace replay::detail::audit {

struct ReportInput {
  ::std::vector<AuditedCall> calls;
  CaptureFacts facts;
  ::std::optional<GraphContents> graph;  // none when no graph was made
  ::std::string begun_at;
  ::std::string work_error;
  ::std::vector<::std::string> notes;
};

// `resolve(stacks)` turns lists of return addresses into frames (Symbolizer::resolve).
template <class Resolve>
AuditReport build_report(ReportInput input, Resolve&& resolve) {
  AuditReport report;
  report.begun_at = ::std::move(input.begun_at);
  report.capturing_thread = input.facts.capturing_thread;
  report.mode = input.facts.mode;
  report.end_status = input.facts.end_status;
  report.graph_made = input.graph.has_value();
  report.work_error = ::std::move(input.work_error);
  report.notes = ::std::move(input.notes);
  const Classification verdict = classify(input.calls, input.facts);
  report.invalidated = verdict.invalidated;
  if (input.graph) {
    report.inventory = make_inventory(input.calls, *input.graph);
  }

  // The stacks to resolve: one per finding.
  ::std::vector<::std::size_t> wanted;
  if (verdict.breaking) {
    wanted.push_back(*verdict.breaking);
  }
  for (const ::std::size_t i : verdict.escaped) {
    wanted.push_back(i);
  }
  for (const ::std::size_t i : verdict.unsafe) {
    wanted.push_back(i);
  }
  ::std::vector<::std::vector<::std::uintptr_t>> stacks;
  stacks.reserve(wanted.size());
  for (const ::std::size_t i : wanted) {
    stacks.push_back(input.calls[i].stack);
  }
  ::std::vector<::std::vector<AuditFrame>> frames =
      stacks.empty() ? ::std::vector<::std::vector<AuditFrame>>{} : resolve(stacks);
  frames.resize(wanted.size());

  // Host-side launch stubs carry the kernels' names: CUDA's code, not the user's.
  ::std::vector<::std::string> kernels;
  for (const AuditedCall& call : input.calls) {
    if (!call.kernel.empty()) {
      kernels.push_back(call.kernel);
    }
  }
  auto finding = [&](::std::size_t slot, AuditFindingKind kind, bool inferred) {
    const ::std::size_t index = wanted[slot];
    const AuditedCall& call = input.calls[index];
    AuditFinding out;
    out.kind = kind;
    out.api = call.api;
    out.status = call.status;
    out.status_name = status_name(call.status, call.driver_api);
    out.kernel = call.kernel;
    out.thread = call.thread;
    out.capturing_thread = call.capturing_thread;
    out.stream_state = call.stream_state;
    out.stream = call.stream;
    out.op = call.op;
    out.script_frames = call.script_frames;
    out.inferred = inferred;
    out.frames = ::std::move(frames[slot]);
    if (const auto user = first_user_frame(out.frames, kernels)) {
      out.frame = out.frames[*user];
    }
    out.summary = summary_for(call, kind, out.frame, inferred, input.facts.mode);
    out.advice = advice_for(call, kind);
    out.call = index;
    return out;
  };
  ::std::size_t slot = 0;
  if (verdict.breaking) {
    report.breaking = finding(slot++, AuditFindingKind::breaking_call, verdict.inferred);
  }
  for (::std::size_t i = 0; i < verdict.escaped.size(); ++i) {
    report.escaped.push_back(finding(slot++, AuditFindingKind::escaped_work, false));
  }
  for (::std::size_t i = 0; i < verdict.unsafe.size(); ++i) {
    report.unsafe.push_back(finding(slot++, AuditFindingKind::unsafe_call, false));
  }
  if (!report.breaking && report.end_status != 0 && is_capture_status(report.end_status) &&
      report.end_status != ::cudaErrorStreamCaptureInvalidated) {
    report.notes.push_back(concat(
        "cudaStreamEndCapture returned ", status_name(report.end_status, false),
        report.end_status == ::cudaErrorStreamCaptureUnjoined
            ? ": a stream forked into the capture (it waited on an event recorded in it) was not joined back "
              "into the origin stream before the end; make the origin stream wait on an event recorded last on it"
            : ""));
  }
  report.calls = ::std::move(input.calls);
  return report;
}

}  // namespace replay::detail::audit
