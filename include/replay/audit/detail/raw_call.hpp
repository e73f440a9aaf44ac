#pragma once
// One CUDA call as the recorder logs it (RawCall: cheap to take inside the
// CUPTI callback), and the report's view of it (to_audited_call(): its kind,
// and its stream's state relative to the audited capture). Used by
// audit/detail/recorder.hpp and the session that closes a capture.
#include <replay/detail/require_cxx20.hpp>

#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "replay/audit/call.hpp"
#include "replay/audit/detail/api_names.hpp"
#include "replay/audit/detail/stream_params.hpp"
#include "replay/audit/detail/symbolize.hpp"
#include "replay/detail/capture_observer.hpp"

namespace replay::detail::audit {

// One call as recorded (see AuditedCall for what the report makes of it).
struct RawCall {
  ::std::uint64_t sequence = 0;
  const char* name = nullptr;  // CUPTI's function name: a global constant
  bool driver_api = false;
  bool nested = false;
  bool returned = false;
  bool per_thread = false;      // a _ptsz / _ptds entry point
  int status = 0;
  ::std::uint64_t thread = 0;
  StreamArgument stream;
  bool legacy_stream = false;   // the stream argument meant the legacy default stream
  int capture_status = -1;      // CUstreamCaptureStatus at entry; -1: not read
  ::std::uint64_t capture_id = 0;
  ::std::string kernel;         // mangled, as CUPTI gives it
  KernelHandle kernel_handle;   // to name it when CUPTI gives no name
  ::std::string op;             // the aten operator running (libtorch), if any
  ::std::vector<OperatorCaller> op_callers;  // the script lines that called it (TorchScript)
  int graph_nodes = 0;          // graph nodes CUDA reported created during the call...
  ::std::uintptr_t node_graph = 0;  // ...in this graph (the last one)
  RawStack stack;
};

// The report's view of a recorded call, for the capture whose id is
// `capture_id`, begun by `thread` on `origin`. `capture_streams` collects
// the streams seen in the capture (to recognize one later found
// invalidated when the driver no longer gives its id).
inline AuditedCall to_audited_call(const RawCall& raw, ::std::uint64_t capture_id, ::std::uint64_t thread,
                                   ::std::vector<::std::uintptr_t>& capture_streams,
                                   ::std::uintptr_t capture_graph = 0) {
  AuditedCall call;
  call.sequence = raw.sequence;
  call.api = raw.name != nullptr ? raw.name : "(unnamed call)";
  call.driver_api = raw.driver_api;
  call.nested = raw.nested;
  call.returned = raw.returned;
  call.status = raw.status;
  call.thread = raw.thread;
  call.capturing_thread = raw.thread == thread;
  call.kind = api_kind(split_api_name(call.api).base);
  call.stream = raw.stream.handle;
  call.kernel = raw.kernel.empty() ? ::std::string() : demangle(raw.kernel.c_str());
  call.op = raw.op;
  call.script_frames.reserve(raw.op_callers.size());
  for (const OperatorCaller& caller : raw.op_callers) {
    call.script_frames.push_back(AuditFrame{0, {}, caller.function, caller.file, caller.line});
  }
  const auto seen = [&](::std::uintptr_t s) {
    for (const ::std::uintptr_t known : capture_streams) {
      if (known == s) {
        return true;
      }
    }
    return false;
  };
  if (!raw.stream.present) {
    // Synchronous copies and memsets take no stream: they run on the
    // default stream (legacy, or the per-thread one for _ptds entries).
    const bool synchronous = call.kind == AuditCallKind::sync_copy || call.kind == AuditCallKind::sync_memset;
    call.stream_state = !synchronous        ? AuditStreamState::none
                        : raw.per_thread     ? AuditStreamState::not_capturing
                                             : AuditStreamState::legacy;
  } else if (raw.legacy_stream) {
    call.stream_state = AuditStreamState::legacy;
  } else if (raw.capture_status < 0) {
    call.stream_state = AuditStreamState::unknown;
  } else if (raw.capture_status == CU_STREAM_CAPTURE_STATUS_NONE) {
    call.stream_state = AuditStreamState::not_capturing;
  } else if (raw.capture_status == CU_STREAM_CAPTURE_STATUS_ACTIVE) {
    call.stream_state =
        raw.capture_id == capture_id ? AuditStreamState::this_capture : AuditStreamState::other_capture;
    if (call.stream_state == AuditStreamState::this_capture && !seen(call.stream)) {
      capture_streams.push_back(call.stream);
    }
  } else {
    const bool ours = raw.capture_id == capture_id || (raw.capture_id == 0 && seen(call.stream));
    call.stream_state = ours ? AuditStreamState::this_capture_invalidated : AuditStreamState::other_capture;
  }
  // Work that CUDA reported adding nodes to this capture's graph went into
  // it, whatever its stream argument seemed to say.
  call.graph_nodes = capture_graph != 0 && raw.node_graph == capture_graph ? raw.graph_nodes : 0;
  if (call.graph_nodes > 0 && is_work(call.kind) && call.stream_state != AuditStreamState::this_capture_invalidated) {
    call.stream_state = AuditStreamState::this_capture;
  }
  if (!raw.nested) {
    call.stack.reserve(static_cast<::std::size_t>(raw.stack.depth));
    for (int i = 0; i < raw.stack.depth; ++i) {
      call.stack.push_back(reinterpret_cast<::std::uintptr_t>(raw.stack.frames[static_cast<::std::size_t>(i)]));
    }
  }
  return call;
}

}  // namespace replay::detail::audit
