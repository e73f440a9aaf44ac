#pragma once
// The capture audit (optional component, CMake target replay::audit, which
// links CUPTI): which call broke a capture, on which thread and line, which
// work escaped it, and whether the graph holds every kernel launched into it.
//
//   auto audited = replay::audit_capture(stream, [&](replay::StreamRef s) { model(s); });
//   std::puts(audited.report.to_string().c_str());
//
// Including this header also lets replay::capture, CaptureScope, ShapeRouter
// and GraphedCallable audit their captures when asked to (AuditSwitch::on in
// their options, or REPLAY_AUDIT=1 in the environment). See docs/audit.md.
// Never included by replay/replay.hpp.
#include <replay/detail/require_cxx20.hpp>

// IWYU pragma: begin_exports
#include "replay/audit/call.hpp"
#include "replay/audit/capture_audit.hpp"
#include "replay/audit/detail/observer.hpp"
#include "replay/audit/errors.hpp"
#include "replay/audit/report.hpp"
#include "replay/audit_switch.hpp"
// IWYU pragma: end_exports
