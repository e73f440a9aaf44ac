#pragma once
// AuditSwitch: whether a capture is audited by the capture audit
// (replay/audit.hpp, target replay::audit). replay::capture, CaptureScope,
// ShapeRouterOptions and GraphedOptions take one; the default follows the
// environment variable REPLAY_AUDIT (1, on, true or yes: audit every capture).
#include <replay/detail/require_cxx20.hpp>

namespace replay {

// Whether a capture is audited (see docs/audit.md).
enum class AuditSwitch : unsigned char {
  // Audited when REPLAY_AUDIT=1 is set (read once per process). The audit
  // then only reports: when it cannot subscribe (a profiler holds CUPTI), it
  // says so once on stderr and captures run unaudited.
  from_environment,
  // Audited; a capture throws audit_unavailable_error when the audit cannot subscribe.
  on,
  // Never audited, whatever the environment says.
  off,
};

}  // namespace replay
