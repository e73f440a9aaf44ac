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
  unknown,          // the stream's state could not be read
};

// One frame of a call's stack, resolved when the report was made.
struct AuditFrame {
  ::std::uintptr_t address = 0;  // the return address
  ::std::string object;          // the shared object or executable
  ::std::string function;        // demangled; empty when unknown
  ::std::string file;            // empty when there is no line information
  unsigned line = 0;
};

// One CUDA runtime or driver API call made while the audited capture was open.
struct AuditedCall {
  ::std::uint64_t sequence = 0;  // order in which the calls began, over all threads
  ::std::string api;             // as CUPTI names it, e.g. "cudaStreamSynchronize", "cuLaunchKernel_ptsz"
  bool driver_api = false;       // a driver (cu*) call rather than a runtime (cuda*) one
  // Made by the CUDA runtime inside another call of this thread (a driver
  // call inside a runtime call): listed, never a finding of its own.
  bool nested = false;
  bool returned = false;         // false: still running when the capture ended
  int status = 0;                // cudaError_t or CUresult (they share capture error numbers)
  ::std::uint64_t thread = 0;    // the OS thread id (gettid)
  bool capturing_thread = false; // made by the thread that owns the audited capture
  AuditCallKind kind = AuditCallKind::other;
  AuditStreamState stream_state = AuditStreamState::none;
  ::std::uintptr_t stream = 0;   // the stream handle as passed (0: none or the default stream)
  ::std::string kernel;          // for launches: the kernel's (mangled) name
  ::std::string op;              // with libtorch: the aten operator running on this thread, if any
  int graph_nodes = 0;           // nodes CUDA reported adding to the audited capture's graph during the call
  ::std::vector<::std::uintptr_t> stack;  // return addresses, innermost first (symbolized on demand)
};

}  // namespace replay
