#pragma once
// The recorder: one CUPTI subscriber for the process (shared by every
// CaptureAudit alive, counted), with the runtime and driver API domains
// enabled while any is alive, and a log of the calls made while at least
// one audited capture is open. Each call is recorded at its entry (name,
// thread, stream and that stream's capture state, kernel, return
// addresses) and completed at its exit (return code); the expensive parts
// (demangling, symbolizing) wait for the report.
//
// CUDA calls made inside a callback call back again: a thread-local depth
// keeps the recorder's own calls out of the log. Driver calls that the
// runtime makes inside a runtime call are marked nested. What a record holds,
// and what the report makes of it, is in audit/detail/raw_call.hpp.
#include <replay/detail/require_cxx20.hpp>

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <cupti_callbacks.h>
#include <cupti_result.h>
#include <cupti_version.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <source_location>
#include <string>
#include <utility>
#include <vector>

#include "replay/audit/detail/api_names.hpp"
#include "replay/audit/detail/raw_call.hpp"
#include "replay/audit/detail/stream_params.hpp"
#include "replay/audit/detail/symbolize.hpp"
#include "replay/audit/errors.hpp"
#include "replay/detail/capture_observer.hpp"
#include "replay/detail/kernel_node_symbol.hpp"
#include "replay/detail/message.hpp"
#include "replay/error.hpp"

namespace replay::detail::audit {

// A stream's capture state as the driver reports it.
struct CaptureState {
  int status = -1;  // CUstreamCaptureStatus; -1: could not be read
  ::std::uint64_t id = 0;
  ::std::uintptr_t graph = 0;  // the graph being captured into
};

// The driver's cuStreamGetCaptureInfo: _v2 (6 parameters) as of CUDA 12.0,
// _v3 (7: edge data before the count) from 12.3, which is what the entry-point
// query of a CUDA 12.4 runtime gives. Called with 7 arguments, the last three
// null: right for both (a 6-parameter callee ignores the seventh).
using CaptureInfoFn = CUresult (*)(CUstream, CUstreamCaptureStatus*, cuuint64_t*, CUgraph*, const CUgraphNode**,
                                   const void*, ::std::size_t*);

inline ::std::uint64_t os_thread_id() noexcept {
  thread_local const auto id = static_cast<::std::uint64_t>(::syscall(SYS_gettid));
  return id;
}

// >0 while this thread makes CUDA calls on the recorder's behalf.
inline int& own_calls() noexcept {
  thread_local int depth = 0;
  return depth;
}

// Marks this thread's CUDA calls for a scope as the audit's own (not recorded).
class OwnCalls {
 public:
  OwnCalls() noexcept { ++own_calls(); }
  OwnCalls(const OwnCalls&) = delete;
  OwnCalls& operator=(const OwnCalls&) = delete;
  ~OwnCalls() { --own_calls(); }
};

inline ::std::string describe_cupti(CUptiResult result) {
  const char* text = nullptr;
  if (::cuptiGetResultString(result, &text) != CUPTI_SUCCESS || text == nullptr) {
    return concat("CUPTI error ", static_cast<int>(result));
  }
  return concat(text, " (", static_cast<int>(result), ")");
}

class Recorder {
 public:
  static Recorder& instance() noexcept {
    static Recorder* recorder = new Recorder();  // never destroyed: callbacks may run until exit
    return *recorder;
  }

  // Subscribes when this is the first user. Throws audit_unavailable_error.
  void acquire(const ::std::source_location& where) {
    CaptureInfoFn capture_info = nullptr;
    {
      const OwnCalls own;
      capture_info = reinterpret_cast<CaptureInfoFn>(find_driver_function("cuStreamGetCaptureInfo", 12000));
    }
    // Not the log's mutex: CUPTI may wait for callbacks in flight, and those take the log's.
    const ::std::lock_guard<::std::mutex> lock(subscription_mutex_);
    if (users_ > 0) {
      ++users_;
      return;
    }
    if (capture_info == nullptr) {
      throw audit_unavailable_error("the CUDA driver's cuStreamGetCaptureInfo could not be found (no driver, or "
                                    "one older than CUDA 12.0)",
                                    where);
    }
    capture_info_.store(capture_info, ::std::memory_order_release);
    RawStack warm;
    capture_stack(warm);  // backtrace() loads the unwinder on its first call: not inside a callback
    CUpti_SubscriberHandle subscriber = nullptr;
    char holder[CUPTI_OLD_SUBSCRIBER_NAME_MIN_LEN + 1] = {};
#if CUPTI_API_VERSION >= 130001  // cuptiSubscribe_v2 names the subscriber that holds CUPTI
    CUpti_SubscriberParams params{};
    params.structSize = CUpti_SubscriberParams_STRUCT_SIZE;
    params.subscriberName = "replay capture audit";
    params.oldSubscriberName = holder;
    params.oldSubscriberSize = sizeof holder - 1;
    CUptiResult result = ::cuptiSubscribe_v2(&subscriber, &on_api_call, nullptr, &params);
#else
    CUptiResult result = ::cuptiSubscribe(&subscriber, &on_api_call, nullptr);
#endif
    if (result == CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED) {
      throw audit_unavailable_error(
          concat("CUDA's profiling interface (CUPTI) allows one subscriber per process, and it is already held",
                 holder[0] != '\0' ? concat(" by ", holder) : ::std::string(),
                 " (a profiler such as Nsight Systems or Nsight Compute, cuda-gdb, compute-sanitizer, or another "
                 "CUPTI client in this process). Run without it to audit captures, or profile without the audit"),
          where);
    }
    if (result != CUPTI_SUCCESS) {
      throw audit_unavailable_error(concat("cuptiSubscribe failed: ", describe_cupti(result)), where);
    }
    for (const CUpti_CallbackDomain domain : {CUPTI_CB_DOMAIN_RUNTIME_API, CUPTI_CB_DOMAIN_DRIVER_API}) {
      result = ::cuptiEnableDomain(1, subscriber, domain);
      if (result != CUPTI_SUCCESS) {
        (void)::cuptiUnsubscribe(subscriber);
        throw audit_unavailable_error(concat("cuptiEnableDomain failed: ", describe_cupti(result)), where);
      }
    }
    // Graph nodes created during a call (stream capture adds them): the
    // direct evidence that a call's work went into a graph. Optional.
    (void)::cuptiEnableCallback(1, subscriber, CUPTI_CB_DOMAIN_RESOURCE, CUPTI_CBID_RESOURCE_GRAPHNODE_CREATED);
    subscriber_ = subscriber;
    epoch_.fetch_add(1, ::std::memory_order_acq_rel);
    users_ = 1;
  }

  void release() noexcept {
    const ::std::lock_guard<::std::mutex> lock(subscription_mutex_);
    if (users_ > 0 && --users_ == 0) {
      (void)::cuptiUnsubscribe(subscriber_);
      subscriber_ = nullptr;
    }
  }

  // Where a session's calls begin in the log.
  struct Mark {
    ::std::size_t first = 0;
    ::std::uint32_t generation = 0;
  };

  Mark open_session() {
    const ::std::lock_guard<::std::mutex> lock(mutex_);
    if (sessions_ == 0) {
      log_.clear();
      ++generation_;
    }
    ++sessions_;
    recording_.store(1, ::std::memory_order_release);
    return Mark{log_.size(), generation_};
  }

  // The calls since `mark` (those still running have returned == false).
  ::std::vector<RawCall> close_session(const Mark& mark) {
    const ::std::lock_guard<::std::mutex> lock(mutex_);
    ::std::vector<RawCall> out;
    if (mark.generation == generation_ && mark.first <= log_.size()) {
      out.assign(log_.begin() + static_cast<::std::ptrdiff_t>(mark.first), log_.end());
    }
    if (sessions_ > 0 && --sessions_ == 0) {
      recording_.store(0, ::std::memory_order_release);
    }
    return out;
  }

  // The capture state of `stream` now. Never records itself.
  CaptureState capture_state(::cudaStream_t stream) noexcept {
    CaptureState out;
    const CaptureInfoFn capture_info = capture_info_.load(::std::memory_order_acquire);
    if (capture_info == nullptr) {
      return out;
    }
    const OwnCalls own;
    CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
    cuuint64_t id = 0;
    CUgraph graph = nullptr;
    if (capture_info(reinterpret_cast<CUstream>(stream), &status, &id, &graph, nullptr, nullptr, nullptr) !=
        CUDA_SUCCESS) {
      return out;
    }
    out.status = static_cast<int>(status);
    out.id = static_cast<::std::uint64_t>(id);
    out.graph = reinterpret_cast<::std::uintptr_t>(graph);
    return out;
  }

 private:
  Recorder() = default;

  // Runtime calls open on this thread, counted again from 0 for each
  // subscription (a call left open by the last one must not mark every
  // later call nested).
  struct RuntimeDepth {
    ::std::uint32_t epoch = 0;
    int depth = 0;
  };
  static RuntimeDepth& runtime_depth() noexcept {
    thread_local RuntimeDepth depth;
    return depth;
  }

  // The recorded top-level call this thread is in (its correlation), for
  // the graph-node callbacks that happen inside it.
  static ::std::uint64_t& current_call() noexcept {
    thread_local ::std::uint64_t correlation = 0;
    return correlation;
  }

  static void CUPTIAPI on_api_call(void* /*userdata*/, CUpti_CallbackDomain domain, CUpti_CallbackId cbid,
                                   const void* data) {
    if (own_calls() > 0 || data == nullptr) {
      return;
    }
    Recorder& self = instance();
    if (domain == CUPTI_CB_DOMAIN_RESOURCE) {
      if (cbid == CUPTI_CBID_RESOURCE_GRAPHNODE_CREATED && current_call() != 0 &&
          self.recording_.load(::std::memory_order_acquire) != 0) {
        self.node_created(*static_cast<const CUpti_ResourceData*>(data));
      }
      return;
    }
    if (domain != CUPTI_CB_DOMAIN_RUNTIME_API && domain != CUPTI_CB_DOMAIN_DRIVER_API) {
      return;
    }
    const auto* info = static_cast<const CUpti_CallbackData*>(data);
    const bool runtime = domain == CUPTI_CB_DOMAIN_RUNTIME_API;
    RuntimeDepth& depth = runtime_depth();
    if (const ::std::uint32_t epoch = self.epoch_.load(::std::memory_order_acquire); depth.epoch != epoch) {
      depth = RuntimeDepth{epoch, 0};
    }
    if (info->callbackSite == CUPTI_API_ENTER) {
      const bool nested = depth.depth > 0;
      if (runtime) {
        ++depth.depth;
      }
      if (info->correlationData != nullptr) {
        *info->correlationData = 0;
      }
      if (self.recording_.load(::std::memory_order_acquire) != 0) {
        self.enter(runtime, cbid, *info, nested);
      }
      return;
    }
    if (runtime && depth.depth > 0) {
      --depth.depth;
    }
    if (info->correlationData != nullptr && *info->correlationData != 0) {
      self.exit(runtime, *info);
    }
  }

  void enter(bool runtime, CUpti_CallbackId cbid, const CUpti_CallbackData& info, bool nested) {
    RawCall call;
    call.name = info.functionName;
    call.driver_api = !runtime;
    call.nested = nested;
    call.thread = os_thread_id();
    if (!nested) {
      call.per_thread = info.functionName != nullptr && split_api_name(info.functionName).per_thread;
      call.stream = runtime ? runtime_stream_argument(cbid, info.functionParams)
                            : driver_stream_argument(cbid, info.functionParams);
      if (call.stream.present) {
        read_stream_state(call);
      }
      if (info.symbolName != nullptr) {
        call.kernel = info.symbolName;
      } else {
        call.kernel_handle = launch_kernel_handle(runtime, cbid, info.functionParams);
      }
      // The aten operator running, and the TorchScript lines that called
      // it, where the libtorch adapter tracks them.
      if (const RunningOperatorSource source = running_operator_source().load(::std::memory_order_acquire);
          source != nullptr) {
        if (const RunningOperator op = source(); op.name != nullptr) {
          call.op = op.name;
          call.op_callers.assign(op.callers.begin(), op.callers.end());
        }
      }
      capture_stack(call.stack);
    }
    const ::std::lock_guard<::std::mutex> lock(mutex_);
    if (recording_.load(::std::memory_order_relaxed) == 0) {
      return;
    }
    call.sequence = next_sequence_++;
    const bool top_level = !call.nested;
    log_.push_back(::std::move(call));
    if (info.correlationData != nullptr && log_.size() < 0xffffffffU) {
      const ::std::uint64_t correlation = (static_cast<::std::uint64_t>(generation_) << 32) | log_.size();
      *info.correlationData = correlation;
      if (top_level) {
        current_call() = correlation;
      }
    }
  }

  void node_created(const CUpti_ResourceData& data) {
    if (data.resourceDescriptor == nullptr) {
      return;
    }
    const auto* graph = static_cast<const CUpti_GraphData*>(data.resourceDescriptor);
    const ::std::uint64_t correlation = current_call();
    const auto generation = static_cast<::std::uint32_t>(correlation >> 32);
    const auto index = static_cast<::std::size_t>(correlation & 0xffffffffU) - 1;
    const ::std::lock_guard<::std::mutex> lock(mutex_);
    if (generation == generation_ && index < log_.size()) {
      ++log_[index].graph_nodes;
      log_[index].node_graph = reinterpret_cast<::std::uintptr_t>(graph->graph);
    }
  }

  void exit(bool runtime, const CUpti_CallbackData& info) {
    int status = -1;
    if (info.functionReturnValue != nullptr) {
      status = runtime ? static_cast<int>(*static_cast<const ::cudaError_t*>(info.functionReturnValue))
                       : static_cast<int>(*static_cast<const CUresult*>(info.functionReturnValue));
    }
    const ::std::uint64_t correlation = *info.correlationData;
    if (current_call() == correlation) {
      current_call() = 0;
    }
    const auto generation = static_cast<::std::uint32_t>(correlation >> 32);
    const auto index = static_cast<::std::size_t>(correlation & 0xffffffffU) - 1;
    const ::std::lock_guard<::std::mutex> lock(mutex_);
    if (generation != generation_ || index >= log_.size()) {
      return;
    }
    RawCall& call = log_[index];
    call.status = status;
    call.returned = true;
    if (call.kernel.empty() && info.symbolName != nullptr && !call.nested) {
      call.kernel = info.symbolName;
    }
  }

  // The legacy stream is never captured and is not queried: asking about it
  // while another stream captures can itself be refused.
  void read_stream_state(RawCall& call) noexcept {
    const ::std::uintptr_t handle = call.stream.handle;
    const auto legacy = reinterpret_cast<::std::uintptr_t>(CU_STREAM_LEGACY);
    if ((handle == 0 && !call.per_thread) || handle == legacy) {
      call.legacy_stream = true;
      return;
    }
    const ::std::uintptr_t queried = handle == 0 ? reinterpret_cast<::std::uintptr_t>(CU_STREAM_PER_THREAD) : handle;
    const CaptureState state = capture_state(reinterpret_cast<::cudaStream_t>(queried));
    call.capture_status = state.status;
    call.capture_id = state.id;
  }

  ::std::mutex subscription_mutex_;  // subscriber_, users_
  CUpti_SubscriberHandle subscriber_ = nullptr;
  int users_ = 0;
  ::std::mutex mutex_;  // the log: sessions_, log_, generation_, next_sequence_
  int sessions_ = 0;
  ::std::atomic<int> recording_{0};
  ::std::atomic<::std::uint32_t> epoch_{0};
  ::std::atomic<CaptureInfoFn> capture_info_{nullptr};
  ::std::vector<RawCall> log_;
  ::std::uint32_t generation_ = 0;
  ::std::uint64_t next_sequence_ = 0;
};

}  // namespace replay::detail::audit
