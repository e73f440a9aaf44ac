#pragma once
// What the capture audit records of one CUDA runtime or driver API call: its
// name, return code, thread, stream and that stream's capture state, the
// kernel it launched, and where it was called from (AuditFrame).
#include <replay/detail/require_cxx20.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace replay {

// What a call does, as far as a capture is concerned (from its name).
enum class AuditCallKind : unsigned char {
  other,         // queries, attribute calls, stream and event creation...
  kernel_launch,  // cudaLaunchKernel, <<<>>>, cuLaunchKernel...
  host_launch,   // cudaLaunchHostFunc, cuLaunchHostFunc
  graph_launch,  // cudaGraphLaunch, cuGraphLaunch
  copy,          // stream-ordered copies (cudaMemcpyAsync...)
  sync_copy,     // synchronous copies on the default stream (cudaMemcpy...)
  memset,        // stream-ordered memsets (cudaMemsetAsync...)
  sync_memset,   // synchronous memsets (cudaMemset...)
  stream_sync,   // cudaStreamSynchronize, cuStreamSynchronize
  event_sync,    // cudaEventSynchronize, cuEventSynchronize
  device_sync,   // cudaDeviceSynchronize, cuCtxSynchronize
  stream_query,  // cudaStreamQuery, cuStreamQuery
  event_query,   // cudaEventQuery, cuEventQuery
  allocation,    // cudaMalloc, cudaMallocHost, cudaHostRegister, cuMemAlloc...
  free,          // cudaFree, cudaFreeHost, cudaHostUnregister, cuMemFree...
  stream_allocation,  // cudaMallocAsync, cudaFreeAsync (legal in a capture: graph memory nodes)
  event_record,  // cudaEventRecord (a fork point inside a capture)
  stream_wait,   // cudaStreamWaitEvent (a join inside a capture)
  capture_control,  // cudaStreamBeginCapture, cudaStreamEndCapture...
};

// The stream a call was issued on, as it stood when the call began.
enum class AuditStreamState : unsigned char {
  none,             // the call takes no stream
  legacy,           // the legacy default stream (stream 0 / cudaStreamLegacy): never captured
  not_capturing,    // a stream that was not capturing: the work ran eagerly
  this_capture,     // a stream of the audited capture (its origin, or one forked from it)
  this_capture_invalidated,  // a stream of the audited capture, which was already invalidated
  other_capture,    // a stream capturing into another graph
  outside,          // a stream whose handle could not be read, and the work added nothing to the graph
  unknown,          // the stream's state could not be read
};

// One frame of a call's stack, resolved when the report was made.
struct AuditFrame {
  // The return address
  ::std::uintptr_t address = 0;
  // The shared object or executable
  ::std::string object;
  // Demangled; empty when unknown
  ::std::string function;
  // Empty when there is no line information
  ::std::string file;
  // The line in `file`; 0 when unknown.
  unsigned line = 0;
};

// One CUDA runtime or driver API call made while the audited capture was open.
struct AuditedCall {
  // Order in which the calls began, over all threads
  ::std::uint64_t sequence = 0;
  // As CUPTI names it, e.g. "cudaStreamSynchronize", "cuLaunchKernel_ptsz"
  ::std::string api;
  // A driver (cu*) call rather than a runtime (cuda*) one
  bool driver_api = false;
  // Made by the CUDA runtime inside another call of this thread (a driver
  // call inside a runtime call): listed, never a finding of its own.
  bool nested = false;
  // False: still running when the capture ended
  bool returned = false;
  // CudaError_t or CUresult (they share capture error numbers)
  int status = 0;
  // The OS thread id (gettid)
  ::std::uint64_t thread = 0;
  // Made by the thread that owns the audited capture
  bool capturing_thread = false;
  // What the call does, from its name.
  AuditCallKind kind = AuditCallKind::other;
  // Its stream's capture state when it began.
  AuditStreamState stream_state = AuditStreamState::none;
  // The stream handle as passed (0: none or the default stream)
  ::std::uintptr_t stream = 0;
  // For launches: the kernel's (mangled) name
  ::std::string kernel;
  // With libtorch: the aten operator running on this thread, if any
  ::std::string op;
  // With TorchScript: the lines of the script that called `op`, innermost
  // first (function, file and line; no address or object)
  ::std::vector<AuditFrame> script_frames;
  // Nodes CUDA reported adding to the audited capture's graph during the call
  int graph_nodes = 0;
  // Return addresses, innermost first (symbolized on demand)
  ::std::vector<::std::uintptr_t> stack;
};

}  // namespace replay
