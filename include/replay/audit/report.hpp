#pragma once
// AuditReport: what the capture audit found. The calls made while the
// capture was open, the call that broke it, the work that escaped it, the
// unsafe calls that did not break it this time, and the graph's kernel
// inventory against the launches seen; as text (one finding a line: what
// happened, where, and what to do) or as JSON.
#include <replay/detail/require_cxx20.hpp>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "replay/audit/call.hpp"
#include "replay/audit/detail/frames.hpp"
#include "replay/audit/detail/json.hpp"
#include "replay/capture_scope.hpp"
#include "replay/detail/message.hpp"

namespace replay {

// What kind of finding an AuditFinding is.
enum class AuditFindingKind : unsigned char {
  breaking_call,  // the call that broke the capture (returned a capture error, or most likely invalidated it)
  escaped_work,   // work of the capturing thread that ran eagerly outside the capture and is not in the graph
  unsafe_call,    // a call that did not break this capture but would in another mode or thread arrangement
};

// One finding of the audit: the call (or the work) it is about, its thread,
// stream and user frame, and what it means.
struct AuditFinding {
  // Breaking call, escaped work or unsafe call.
  AuditFindingKind kind = AuditFindingKind::breaking_call;
  // The call, as CUPTI names it
  ::std::string api;
  // Its return code
  int status = 0;
  // "cudaErrorStreamCaptureUnsupported"; "cudaSuccess" for escaped work
  ::std::string status_name;
  // Launches: the kernel's demangled name
  ::std::string kernel;
  // OS thread id
  ::std::uint64_t thread = 0;
  // Made by the thread that began the capture.
  bool capturing_thread = false;
  // The call's stream as it stood when the call began.
  AuditStreamState stream_state = AuditStreamState::none;
  // The stream handle as passed (0: none or the default stream).
  ::std::uintptr_t stream = 0;
  // The user's frame (CUDA, CUPTI, replay and std frames skipped)
  ::std::optional<AuditFrame> frame;
  // The whole resolved stack, innermost first
  ::std::vector<AuditFrame> frames;
  // With libtorch: the aten operator that was running
  ::std::string op;
  // With TorchScript: the script's lines that called `op`, innermost first
  ::std::vector<AuditFrame> script_frames;
  // A breaking call found by elimination (no call returned the first capture
  // error; this is the last unsafe call before the capture was seen invalidated).
  bool inferred = false;
  // What happened, in one sentence
  ::std::string summary;
  // What to do
  ::std::string advice;
  // Index into AuditReport::calls
  ::std::optional<::std::size_t> call;

  // "cudaStreamSynchronize returned cudaErrorStreamCaptureUnsupported on the
  // capturing thread at model.cu:42 (in f()): <advice>"
  ::std::string to_string() const {
    ::std::string out = summary;
    if (!advice.empty()) {
      out += "; ";
      out += advice;
    }
    return out;
  }
};

// One kernel (by name) in the inventory.
struct AuditInventoryEntry {
  // Demangled
  ::std::string kernel;
  // Successful launches recorded on the capture's streams
  ::std::size_t launched = 0;
  // Kernel nodes of the graph (child graphs included)
  ::std::size_t in_graph = 0;
};

// The work seen on the capture's streams against the graph's nodes.
struct AuditInventory {
  // False when there was no graph to compare with
  bool checked = false;
  // Every kernel launched or in the graph, by demangled name.
  ::std::vector<AuditInventoryEntry> kernels;
  // Stream-ordered copies on the capture's streams
  ::std::size_t copies_launched = 0;
  // Copy nodes of the graph.
  ::std::size_t copy_nodes = 0;
  // Stream-ordered memsets on the capture's streams.
  ::std::size_t memsets_launched = 0;
  // Memset nodes of the graph.
  ::std::size_t memset_nodes = 0;
  // Host, event, graph memory and other nodes (not compared)
  ::std::size_t other_nodes = 0;

  // Every kernel as often in the graph as launched, copies and memsets alike.
  bool matches() const noexcept {
    if (!checked) {
      return true;
    }
    for (const AuditInventoryEntry& entry : kernels) {
      if (entry.launched != entry.in_graph) {
        return false;
      }
    }
    return copies_launched == copy_nodes && memsets_launched == memset_nodes;
  }
  // Kernel nodes of the graph.
  ::std::size_t kernel_nodes() const noexcept {
    ::std::size_t n = 0;
    for (const AuditInventoryEntry& entry : kernels) {
      n += entry.in_graph;
    }
    return n;
  }
  // Kernel launches seen on the capture's streams.
  ::std::size_t kernel_launches() const noexcept {
    ::std::size_t n = 0;
    for (const AuditInventoryEntry& entry : kernels) {
      n += entry.launched;
    }
    return n;
  }
};

// What the audit found for one capture (see docs/audit.md).
struct AuditReport {
  // Every call made while the capture was open, in the order they began
  ::std::vector<AuditedCall> calls;
  // The call that broke the capture, if one did.
  ::std::optional<AuditFinding> breaking;
  // Work of the capturing thread that ran outside the capture.
  ::std::vector<AuditFinding> escaped;
  // Calls that did not break this capture but break others.
  ::std::vector<AuditFinding> unsafe;
  // Launches, copies and memsets on the capture's streams against the graph.
  AuditInventory inventory;
  // Where the capture was begun ("file:line (function)")
  ::std::string begun_at;
  // The OS thread id of the thread that began the capture.
  ::std::uint64_t capturing_thread = 0;
  // The capture's mode.
  CaptureMode mode = CaptureMode::this_thread;
  // What cudaStreamEndCapture returned
  int end_status = 0;
  // A graph came out of the capture.
  bool graph_made = false;
  // The capture was invalidated, whether or not the breaking call is known.
  bool invalidated = false;
  // What the captured work threw, if it threw
  ::std::string work_error;
  // Limits of this report (no line information, ...)
  ::std::vector<::std::string> notes;

  // No breaking call, no escaped work, no unsafe call, the inventory
  // matches and the capture ended successfully.
  bool clean() const noexcept {
    return !breaking && !invalidated && escaped.empty() && unsafe.empty() && inventory.matches() &&
           end_status == 0 && work_error.empty();
  }

  // One line for an error message: the breaking call and the escaped work.
  ::std::string verdict() const {
    if (clean()) {
      return detail::concat("capture audit: clean (", calls.size(), " calls, ", inventory.kernel_nodes(),
                            " kernel nodes)");
    }
    ::std::string out = "capture audit: ";
    bool first = true;
    auto add = [&](const ::std::string& part) {
      out += first ? "" : "; ";
      out += part;
      first = false;
    };
    if (breaking) {
      add(breaking->to_string());
    } else if (invalidated) {
      add("the capture was invalidated, but by no call the audit saw (a call of another process, or one made "
          "before the audit began)");
    }
    for (const AuditFinding& finding : escaped) {
      add(finding.summary);
    }
    if (!escaped.empty()) {
      add(escaped.front().advice);
    }
    if (!unsafe.empty()) {
      add(detail::concat(unsafe.size(), " unsafe call", unsafe.size() == 1 ? "" : "s", " (first: ",
                         unsafe.front().summary, ")"));
    }
    if (!inventory.matches()) {
      add(inventory_line());
    }
    if (!work_error.empty() && !breaking) {
      add(detail::concat("the captured work threw: ", work_error));
    }
    return out;
  }

  // The whole report: a heading, then one finding a line, then the inventory.
  ::std::string to_string() const {
    ::std::string out = detail::concat("capture audit of the capture begun at ", begun_at, " (", mode_name(mode),
                                       ", capturing thread ", capturing_thread, "): ", calls.size(),
                                       " CUDA calls recorded, cudaStreamEndCapture returned ", end_status_name(),
                                       "\n");
    if (clean()) {
      out += "  clean: nothing broke the capture, no work escaped it, no unsafe call\n";
    }
    if (breaking) {
      out += "  BROKEN BY: " + breaking->to_string() + "\n";
    } else if (invalidated) {
      out += "  BROKEN: the capture was invalidated, but by no call the audit saw\n";
    }
    for (const AuditFinding& finding : escaped) {
      out += "  ESCAPED: " + finding.to_string() + "\n";
    }
    for (const AuditFinding& finding : unsafe) {
      out += "  UNSAFE: " + finding.to_string() + "\n";
    }
    if (!work_error.empty()) {
      out += "  THE WORK THREW: " + work_error + "\n";
    }
    out += "  INVENTORY: " + inventory_line() + "\n";
    for (const AuditInventoryEntry& entry : inventory.kernels) {
      out += detail::concat("    ", entry.launched == entry.in_graph ? "" : "MISMATCH ", entry.kernel, ": ",
                            entry.launched, " launched, ", entry.in_graph, " in the graph\n");
    }
    for (const ::std::string& note : notes) {
      out += "  NOTE: " + note + "\n";
    }
    return out;
  }

  // The whole report as one JSON object (the calls included).
  ::std::string to_json() const {
    using detail::audit::JsonObject;
    using detail::audit::json_array;
    ::std::string out;
    {
      JsonObject report(out);
      report.text("begun_at", begun_at)
          .text("mode", mode_name(mode))
          .number("capturing_thread", capturing_thread)
          .number("end_status", end_status)
          .text("end_status_name", end_status_name())
          .boolean("graph_made", graph_made)
          .boolean("invalidated", invalidated)
          .boolean("clean", clean())
          .text("verdict", verdict());
      report.raw("breaking", breaking ? finding_json(*breaking) : ::std::string("null"));
      report.raw("escaped", json_array(escaped, [](::std::string& o, const AuditFinding& f) { o += finding_json(f); }));
      report.raw("unsafe", json_array(unsafe, [](::std::string& o, const AuditFinding& f) { o += finding_json(f); }));
      ::std::string inv;
      {
        JsonObject object(inv);
        object.boolean("checked", inventory.checked)
            .boolean("matches", inventory.matches())
            .number("copies_launched", inventory.copies_launched)
            .number("copy_nodes", inventory.copy_nodes)
            .number("memsets_launched", inventory.memsets_launched)
            .number("memset_nodes", inventory.memset_nodes)
            .number("other_nodes", inventory.other_nodes);
        object.raw("kernels", json_array(inventory.kernels, [](::std::string& o, const AuditInventoryEntry& e) {
          JsonObject entry(o);
          entry.text("kernel", e.kernel).number("launched", e.launched).number("in_graph", e.in_graph);
        }));
      }
      report.raw("inventory", inv);
      report.raw("calls", json_array(calls, [](::std::string& o, const AuditedCall& c) {
        JsonObject call(o);
        call.number("sequence", c.sequence)
            .text("api", c.api)
            .boolean("driver_api", c.driver_api)
            .boolean("nested", c.nested)
            .boolean("returned", c.returned)
            .number("status", c.status)
            .number("thread", c.thread)
            .boolean("capturing_thread", c.capturing_thread)
            .text("kind", kind_name(c.kind))
            .text("stream_state", stream_state_name(c.stream_state))
            .number("stream", static_cast<::std::uint64_t>(c.stream))
            .text("kernel", c.kernel)
            .text("op", c.op)
            .raw("script_frames",
                 detail::audit::json_array(c.script_frames, [](::std::string& frames, const AuditFrame& fr) {
                   frames += frame_json(fr);
                 }));
      }));
      report.text("work_error", work_error);
      report.raw("notes", json_array(notes, [](::std::string& o, const ::std::string& n) {
        o += detail::audit::json_string(n);
      }));
    }
    return out;
  }

  // What cudaStreamEndCapture returned ("not known" where the capture was
  // ended by code that does not say, e.g. libtorch's after a failure).
  const char* end_status_name() const noexcept {
    return end_status < 0 ? "(not known)" : ::cudaGetErrorName(static_cast<::cudaError_t>(end_status));
  }

  // "CaptureMode::this_thread"...
  static const char* mode_name(CaptureMode m) noexcept {
    switch (m) {
      case CaptureMode::this_thread: return "CaptureMode::this_thread";
      case CaptureMode::global: return "CaptureMode::global";
      case CaptureMode::relaxed: return "CaptureMode::relaxed";
    }
    return "unknown mode";
  }
  // "kernel_launch", "sync_copy"...
  static const char* kind_name(AuditCallKind kind) noexcept {
    switch (kind) {
      case AuditCallKind::other: return "other";
      case AuditCallKind::kernel_launch: return "kernel_launch";
      case AuditCallKind::host_launch: return "host_launch";
      case AuditCallKind::graph_launch: return "graph_launch";
      case AuditCallKind::copy: return "copy";
      case AuditCallKind::sync_copy: return "sync_copy";
      case AuditCallKind::memset: return "memset";
      case AuditCallKind::sync_memset: return "sync_memset";
      case AuditCallKind::stream_sync: return "stream_sync";
      case AuditCallKind::event_sync: return "event_sync";
      case AuditCallKind::device_sync: return "device_sync";
      case AuditCallKind::stream_query: return "stream_query";
      case AuditCallKind::event_query: return "event_query";
      case AuditCallKind::allocation: return "allocation";
      case AuditCallKind::free: return "free";
      case AuditCallKind::stream_allocation: return "stream_allocation";
      case AuditCallKind::event_record: return "event_record";
      case AuditCallKind::stream_wait: return "stream_wait";
      case AuditCallKind::capture_control: return "capture_control";
    }
    return "other";
  }
  // "legacy", "this_capture"...
  static const char* stream_state_name(AuditStreamState state) noexcept {
    switch (state) {
      case AuditStreamState::none: return "none";
      case AuditStreamState::legacy: return "legacy";
      case AuditStreamState::not_capturing: return "not_capturing";
      case AuditStreamState::this_capture: return "this_capture";
      case AuditStreamState::this_capture_invalidated: return "this_capture_invalidated";
      case AuditStreamState::other_capture: return "other_capture";
      case AuditStreamState::outside: return "outside";
      case AuditStreamState::unknown: return "unknown";
    }
    return "unknown";
  }

 private:
  ::std::string inventory_line() const {
    if (!inventory.checked) {
      return "not checked (no graph was made)";
    }
    if (inventory.matches()) {
      return detail::concat("the graph holds every kernel launched on the capture's streams (",
                            inventory.kernel_nodes(), " kernel nodes, ", inventory.copy_nodes, " copies, ",
                            inventory.memset_nodes, " memsets)");
    }
    ::std::string out = detail::concat("the graph does not match the work seen on the capture's streams: ",
                                       inventory.kernel_launches(), " kernel launches against ",
                                       inventory.kernel_nodes(), " kernel nodes, ", inventory.copies_launched,
                                       " copies against ", inventory.copy_nodes, " copy nodes, ",
                                       inventory.memsets_launched, " memsets against ", inventory.memset_nodes,
                                       " memset nodes");
    for (const AuditInventoryEntry& entry : inventory.kernels) {
      if (entry.launched != entry.in_graph) {
        out += detail::concat("; ", entry.kernel, ": ", entry.launched, " launched, ", entry.in_graph, " in the graph");
      }
    }
    return out;
  }

  static ::std::string frame_json(const AuditFrame& f) {
    ::std::string out;
    {
      // Closes the object when it goes
      detail::audit::JsonObject frame(out);
      frame.number("address", static_cast<::std::uint64_t>(f.address))
          .text("object", f.object)
          .text("function", f.function)
          .text("file", f.file)
          .number("line", f.line);
    }
    return out;
  }
  static ::std::string finding_json(const AuditFinding& f) {
    ::std::string out;
    {
      // Closes the object when it goes
      detail::audit::JsonObject finding(out);
      finding
          .text("kind", f.kind == AuditFindingKind::breaking_call ? "breaking_call"
                        : f.kind == AuditFindingKind::escaped_work ? "escaped_work"
                                                                   : "unsafe_call")
          .text("api", f.api)
          .number("status", f.status)
          .text("status_name", f.status_name)
          .text("kernel", f.kernel)
          .number("thread", f.thread)
          .boolean("capturing_thread", f.capturing_thread)
          .text("stream_state", stream_state_name(f.stream_state))
          .number("stream", static_cast<::std::uint64_t>(f.stream))
          .raw("frame", f.frame ? frame_json(*f.frame) : ::std::string("null"))
          .raw("frames", detail::audit::json_array(f.frames, [](::std::string& o, const AuditFrame& fr) {
            o += frame_json(fr);
          }))
          .text("op", f.op)
          .raw("script_frames", detail::audit::json_array(f.script_frames, [](::std::string& o, const AuditFrame& fr) {
            o += frame_json(fr);
          }))
          .boolean("inferred", f.inferred)
          .text("summary", f.summary)
          .text("advice", f.advice)
          .raw("call", f.call ? ::std::to_string(*f.call) : ::std::string("null"));
    }
    return out;
  }
};

}  // namespace replay
