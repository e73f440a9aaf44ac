#pragma once
// The audit's judgement, as pure functions over the recorded calls (tested
// on the CPU with made-up call lists): which call broke the capture, which
// work escaped it, which calls were unsafe, what each finding says, and the
// inventory of launches against the graph's nodes.
#include <replay/detail/require_cxx20.hpp>

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "replay/audit/call.hpp"
#include "replay/audit/detail/api_names.hpp"
#include "replay/audit/detail/frames.hpp"
#include "replay/audit/report.hpp"
#include "replay/capture_scope.hpp"
#include "replay/detail/message.hpp"

namespace replay::detail::audit {

struct CaptureFacts {
  ::std::uint64_t capturing_thread = 0;
  CaptureMode mode = CaptureMode::this_thread;
  int end_status = 0;  // cudaStreamEndCapture's
};

struct Classification {
  ::std::optional<::std::size_t> breaking;  // index into the calls
  bool inferred = false;                    // the breaking call was found by elimination
  bool invalidated = false;                 // the capture was invalidated (whether or not by a known call)
  ::std::vector<::std::size_t> escaped;
  ::std::vector<::std::size_t> unsafe;
};

inline bool succeeded_call(const AuditedCall& call) noexcept { return call.returned && call.status == 0; }

// Work on a stream outside the capture: it ran eagerly (or went into
// another capture's graph), not into this one.
inline bool outside_capture(AuditStreamState state) noexcept {
  return state == AuditStreamState::legacy || state == AuditStreamState::not_capturing ||
         state == AuditStreamState::other_capture || state == AuditStreamState::outside;
}

// Stream-ordered work that a capture turns into graph nodes.
inline bool makes_nodes(AuditCallKind kind) noexcept {
  return kind == AuditCallKind::kernel_launch || kind == AuditCallKind::copy || kind == AuditCallKind::memset ||
         kind == AuditCallKind::host_launch || kind == AuditCallKind::graph_launch;
}

// Where CUDA reported graph nodes created by calls of this capture (so its
// reports work), a successful launch, copy or memset whose stream could not
// be read and that created no node in the graph went outside the capture.
inline void apply_node_evidence(::std::vector<AuditedCall>& calls) {
  bool reported = false;
  for (const AuditedCall& call : calls) {
    reported = reported || call.graph_nodes > 0;
  }
  if (!reported) {
    return;
  }
  for (AuditedCall& call : calls) {
    if (!call.nested && succeeded_call(call) && makes_nodes(call.kind) && call.graph_nodes == 0 &&
        (call.stream_state == AuditStreamState::none || call.stream_state == AuditStreamState::unknown)) {
      call.stream_state = AuditStreamState::outside;
    }
  }
}

// A call that a capture refuses: on the capturing thread any unsafe kind;
// on another thread what CaptureMode::global refuses, and legacy-stream
// work (which joins every blocking stream, captured ones included). A
// synchronization of another thread's own stream is legal.
inline bool unsafe_for_capture(const AuditedCall& call) noexcept {
  const bool legacy_work = is_work(call.kind) && call.stream_state == AuditStreamState::legacy;
  return call.capturing_thread ? is_unsafe(call.kind) || legacy_work
                               : is_unsafe_from_any_thread(call.kind) || legacy_work;
}

inline Classification classify(::std::span<const AuditedCall> calls, const CaptureFacts& facts) {
  Classification out;
  // 1. The first call that returned a capture error other than "invalidated"
  //    (the error a broken capture gives every later call) broke it.
  for (::std::size_t i = 0; i < calls.size(); ++i) {
    const AuditedCall& call = calls[i];
    if (!call.nested && call.returned && is_capture_status(call.status) &&
        call.status != ::cudaErrorStreamCaptureInvalidated) {
      out.breaking = i;
      out.invalidated = true;
      break;
    }
  }
  // 2. Otherwise, where the capture is first seen broken (a call returned
  //    "invalidated", a stream of the capture was found invalidated, or the
  //    end said so), the last unsafe call before that point most likely
  //    broke it: legal for its own thread, fatal to this capture (another
  //    thread's device synchronization or allocation under
  //    CaptureMode::global, work on the legacy stream).
  if (!out.breaking) {
    ::std::optional<::std::size_t> seen_broken;
    for (::std::size_t i = 0; i < calls.size(); ++i) {
      const AuditedCall& call = calls[i];
      if ((!call.nested && call.returned && call.status == ::cudaErrorStreamCaptureInvalidated) ||
          call.stream_state == AuditStreamState::this_capture_invalidated) {
        seen_broken = i;
        break;
      }
    }
    const bool ended_broken = facts.end_status == ::cudaErrorStreamCaptureInvalidated;
    if (seen_broken || ended_broken) {
      out.invalidated = true;
      const ::std::size_t limit = seen_broken ? *seen_broken : calls.size();
      for (::std::size_t i = limit; i-- > 0;) {
        const AuditedCall& call = calls[i];
        if (call.nested || !call.returned) {
          continue;
        }
        if (unsafe_for_capture(call)) {
          out.breaking = i;
          out.inferred = true;
          break;
        }
      }
    }
  }
  // 3. Escaped work: the capturing thread's successful work on a stream
  //    outside the capture. 4. Unsafe calls that succeeded.
  for (::std::size_t i = 0; i < calls.size(); ++i) {
    const AuditedCall& call = calls[i];
    if (call.nested || !succeeded_call(call) || (out.breaking && *out.breaking == i)) {
      continue;
    }
    if (call.capturing_thread && is_work(call.kind) && outside_capture(call.stream_state)) {
      out.escaped.push_back(i);
      continue;
    }
    if (unsafe_for_capture(call)) {
      out.unsafe.push_back(i);
    }
  }
  return out;
}

// "the capturing thread (tid 123)" / "another thread (tid 456)".
inline ::std::string describe_thread(const AuditedCall& call) {
  return concat(call.capturing_thread ? "the capturing thread" : "another thread", " (tid ", call.thread, ")");
}

inline ::std::string hex(::std::uintptr_t value) {
  char text[32];
  (void)::std::snprintf(text, sizeof text, "0x%zx", static_cast<::std::size_t>(value));
  return text;
}

inline ::std::string describe_stream(const AuditedCall& call) {
  switch (call.stream_state) {
    case AuditStreamState::legacy:
      return "the legacy default stream";
    case AuditStreamState::not_capturing:
      return call.stream == 0 ? ::std::string("the per-thread default stream (not capturing)")
                              : concat("stream ", hex(call.stream), " (not capturing)");
    case AuditStreamState::other_capture:
      return concat("stream ", hex(call.stream), " (capturing into another graph)");
    case AuditStreamState::outside:
      return "a stream outside the capture (its handle could not be read; the work added no node to the graph)";
    case AuditStreamState::this_capture:
    case AuditStreamState::this_capture_invalidated:
      return concat("stream ", hex(call.stream), " of this capture");
    default:
      return concat("stream ", hex(call.stream));
  }
}

// What a well-known synchronizing aten operator is in the model's own
// terms ("" for the others).
constexpr ::std::string_view operator_gloss(::std::string_view op) noexcept {
  if (op == "aten::_local_scalar_dense" || op == "aten::item") {
    return "a .item()";
  }
  if (op == "aten::nonzero") {
    return "an output sized by the data";
  }
  return {};
}

// What to do about a synchronizing aten operator ("" for the others).
constexpr ::std::string_view operator_advice(::std::string_view op) noexcept {
  if (op == "aten::_local_scalar_dense" || op == "aten::item") {
    return "the model reads a tensor's value on the host (.item(), int(t), float(t), bool(t), `if t:`), which "
           "waits for the stream: keep the value on the device (torch.where, clamp, masks), read it outside "
           "the graphed work, or let the capture break there (GraphedOptions::breaks = "
           "replay::TorchBreaks::piecewise runs it eagerly between graph segments)";
  }
  if (op == "aten::nonzero") {
    return "the size of nonzero's output (torch.nonzero, indexing with a boolean mask) depends on the data, so "
           "the host waits for the stream to learn it: use a fixed-size form (torch.where(mask, x, y), "
           "multiplying by the mask), or let the capture break there (GraphedOptions::breaks = "
           "replay::TorchBreaks::piecewise)";
  }
  return {};
}

// " inside aten::_local_scalar_dense (a .item()), called from model.py:42
// (in forward)": the framework's operator that made the call and the
// script lines that called it; "" without a framework.
inline ::std::string describe_operator(::std::string_view op, ::std::span<const AuditFrame> script_frames) {
  if (op.empty()) {
    return {};
  }
  ::std::string out = concat(" inside ", op);
  if (const ::std::string_view gloss = operator_gloss(op); !gloss.empty()) {
    out += concat(" (", gloss, ")");
  }
  for (::std::size_t i = 0; i < script_frames.size(); ++i) {
    out += i == 0 ? ", called from " : " via ";
    out += describe_frame(script_frames[i]);
  }
  if (!script_frames.empty()) {
    out += ",";
  }
  return out;
}

// For a read-back the host must act on, made by an ordinary call of the
// captured work: the break API.
inline constexpr ::std::string_view piecewise_advice =
    "when the host must act on what it waits for (a read-back that decides what follows), break the capture "
    "there: capture with replay::capture_piecewise and wrap the call in replay::eager(stream, name, region), "
    "which runs it eagerly between two graph segments";

// What to do about a call of this kind inside (or during) a capture.
inline ::std::string advice_for(const AuditedCall& call, AuditFindingKind finding) {
  const ::std::string_view base = split_api_name(call.api).base;
  if (finding != AuditFindingKind::escaped_work && call.capturing_thread) {
    if (const ::std::string_view advice = operator_advice(call.op); !advice.empty()) {
      return ::std::string(advice);
    }
  }
  if (finding == AuditFindingKind::escaped_work) {
    if (call.kind == AuditCallKind::sync_copy || call.kind == AuditCallKind::sync_memset) {
      return concat(base, " is synchronous and runs on the default stream, outside the capture, once: use its "
                          "Async form on the capturing stream (host memory pinned, e.g. replay::PinnedBuffer, for host copies)");
    }
    if (call.stream_state == AuditStreamState::legacy) {
      return "the legacy default stream (stream 0) is never captured: it ran eagerly, once, and is not in the "
             "graph; issue it on the capturing stream";
    }
    if (call.stream_state == AuditStreamState::other_capture) {
      return "it went into another capture's graph, not this one; issue it on this capture's stream";
    }
    return "it ran eagerly, once, and is not in the graph; issue it on the capturing stream, or on a stream forked "
           "from it (replay::fork, or cudaStreamWaitEvent on an event recorded in the capture) and joined back";
  }
  const bool other_thread = !call.capturing_thread;
  switch (call.kind) {
    case AuditCallKind::stream_sync:
      return other_thread ? "synchronizing a capturing stream is not allowed: synchronize before or after the "
                            "capture, or order the work with events inside it"
                          : concat("synchronizing a capturing stream is not allowed: synchronize before or after the "
                                   "capture, or order the work with events inside it; ",
                                   piecewise_advice);
    case AuditCallKind::event_sync:
    case AuditCallKind::event_query:
      return concat("an event recorded inside a capture cannot be waited on or queried from the host while it is "
                    "open: make the stream wait on it (cudaStreamWaitEvent), or query it after the capture",
                    other_thread ? ::std::string() : concat("; ", piecewise_advice));
    case AuditCallKind::stream_query:
      return "a capturing stream cannot be queried: query it after the capture";
    case AuditCallKind::device_sync:
      return other_thread
                 ? "another thread synchronized the device while the capture was open: synchronize that thread's "
                   "own stream or event instead, or use replay::synchronize_device(), which waits until no capture "
                   "replay opened is open"
                 : "a device-wide synchronization waits on the capturing stream: move it out of the captured work";
    case AuditCallKind::allocation:
      return other_thread ? "under CaptureMode::global an allocation on any thread breaks the capture: allocate "
                            "before capturing, or capture in CaptureMode::this_thread"
                          : "allocate before the capture (warm the allocator up), or allocate stream-ordered on "
                            "the capturing stream (cudaMallocAsync: a graph memory node)";
    case AuditCallKind::free:
      return other_thread ? "under CaptureMode::global a free on any thread breaks the capture: free after the "
                            "captures end, or capture in CaptureMode::this_thread"
                          : "free after the capture ends, or free stream-ordered on the capturing stream "
                            "(cudaFreeAsync)";
    case AuditCallKind::sync_copy:
    case AuditCallKind::sync_memset:
      return concat(base, " is synchronous and uses the default stream: use its Async form on the capturing "
                          "stream (host memory pinned for host copies)");
    default:
      break;
  }
  if (is_work(call.kind) && call.stream_state == AuditStreamState::legacy) {
    return "work on the legacy default stream implicitly synchronizes with blocking streams and breaks their "
           "captures: use a stream of its own (or the capturing stream)";
  }
  return ::std::string(capture_error_hint);
}

// The finding's sentence: what happened, on which thread, where.
inline ::std::string summary_for(const AuditedCall& call, AuditFindingKind finding, const ::std::optional<AuditFrame>& frame,
                                 bool inferred, CaptureMode mode) {
  const ::std::string where = frame ? concat(" at ", describe_frame(*frame)) : ::std::string(" (no user frame found)");
  const ::std::string what = call.kernel.empty() ? call.api : concat(call.api, " of kernel ", call.kernel);
  const ::std::string op = describe_operator(call.op, call.script_frames);
  switch (finding) {
    case AuditFindingKind::breaking_call:
      if (inferred) {
        return concat(what, op, " on ", describe_thread(call), where,
                      " most likely broke the capture: it succeeded, and the capture was invalidated after it");
      }
      return concat(what, op, " returned ", status_name(call.status, call.driver_api), " on ", describe_thread(call),
                    where, " and broke the capture");
    case AuditFindingKind::escaped_work:
      return concat(what, op, " on ", describe_stream(call), " by ", describe_thread(call), where,
                    " escaped the capture");
    case AuditFindingKind::unsafe_call:
      break;
  }
  // An allocation or free that succeeded on the capturing thread of a
  // this_thread or global capture was made with the thread switched to
  // relaxed mode for it (PyTorch's caching allocator does that); anything
  // else that succeeded there waits on work outside the capture.
  const bool memory = call.kind == AuditCallKind::allocation || call.kind == AuditCallKind::free;
  const char* would = !call.capturing_thread ? "would break a capture in CaptureMode::global"
                      : mode == CaptureMode::relaxed
                          ? "would break a capture in CaptureMode::this_thread or global"
                      : memory ? "would break a capture in CaptureMode::this_thread or global (the thread was switched "
                                 "to CaptureMode::relaxed for it)"
                               : "would break a capture of the stream it waits on";
  return concat(what, op, " on ", describe_thread(call), where, " succeeded but ", would);
}

// What the graph holds, by node kind (kernel nodes by demangled name; ""
// where the driver could not name one).
struct GraphContents {
  ::std::map<::std::string, ::std::size_t> kernels;
  ::std::size_t copies = 0;
  ::std::size_t memsets = 0;
  ::std::size_t other = 0;
};

// Launches, copies and memsets that succeeded on the capture's streams
// against the graph's nodes, kernels by (demangled) name.
inline AuditInventory make_inventory(::std::span<const AuditedCall> calls, const GraphContents& graph) {
  AuditInventory out;
  out.checked = true;
  ::std::map<::std::string, AuditInventoryEntry> by_name;
  for (const AuditedCall& call : calls) {
    if (call.nested || !succeeded_call(call) || call.stream_state != AuditStreamState::this_capture) {
      continue;
    }
    switch (call.kind) {
      case AuditCallKind::kernel_launch: {
        AuditInventoryEntry& entry = by_name[call.kernel];
        ++entry.launched;
        break;
      }
      case AuditCallKind::copy: ++out.copies_launched; break;
      case AuditCallKind::memset: ++out.memsets_launched; break;
      default: break;
    }
  }
  if (graph.kernels.contains("")) {
    // The driver could not name the graph's kernels: compare the totals.
    AuditInventoryEntry all;
    for (const auto& [name, entry] : by_name) {
      all.launched += entry.launched;
    }
    for (const auto& [name, count] : graph.kernels) {
      all.in_graph += count;
    }
    by_name.clear();
    all.kernel = "all kernels (the driver could not name the graph's kernel nodes)";
    out.kernels.push_back(::std::move(all));
  } else {
    for (const auto& [name, count] : graph.kernels) {
      by_name[name].in_graph += count;
    }
  }
  for (auto& [name, entry] : by_name) {
    entry.kernel = name.empty() ? ::std::string("<unnamed kernel>") : name;
    out.kernels.push_back(::std::move(entry));
  }
  out.copy_nodes = graph.copies;
  out.memset_nodes = graph.memsets;
  out.other_nodes = graph.other;
  return out;
}

}  // namespace replay::detail::audit
