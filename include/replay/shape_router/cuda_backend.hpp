#pragma once
// CudaGraphBackend: ShapeRouter's GPU backend, stream capture into a Graph
// instantiated (and uploaded) as a GraphExec.
#include <replay/detail/require_cxx20.hpp>

#include <cuda_runtime_api.h>

#include <concepts>
#include <cstddef>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <source_location>
#include <string>
#include <utility>
#include <vector>

#include "replay/capture_scope.hpp"
#include "replay/detail/capture_coordinator.hpp"
#include "replay/shape_router/detail/recapture.hpp"
#include "replay/device.hpp"
#include "replay/error.hpp"
#include "replay/event.hpp"
#include "replay/flags.hpp"
#include "replay/graph.hpp"
#include "replay/graph_exec.hpp"
#include "replay/piecewise/exec.hpp"
#include "replay/piecewise/options.hpp"
#include "replay/shape_router/backend.hpp"
#include "replay/shape_router/graph_memory.hpp"
#include "replay/shape_router/stats.hpp"
#include "replay/stream.hpp"
#include "replay/stream_ref.hpp"

namespace replay {

// The GPU backend: stream capture into a Graph, instantiated as a GraphExec.
// Captures run on streams of the backend's own (one per capture in flight,
// on the caller's stream's device), never on the caller's stream, so that a
// capture in one thread and the router's ordering of another thread's stream
// never meet. Allocations the captured work makes with
// cudaMallocAsync/cudaFreeAsync become graph memory nodes, served from the
// device's graph memory pool, which all graphs launched into the same stream
// share (see docs/shape_router.md).
//
// Failure classes: a capture invalidated while this thread's last-error slot
// holds no capture error of its own (another thread broke it: a
// device-wide synchronization, legacy-stream work), and out of memory while
// instantiating or uploading, are thrown as capture_interrupted_error (the
// router retries). Everything else is the work's own failure.
class CudaGraphBackend {
 public:
  using stream_type = StreamRef;
  using exec_type = GraphExec;
  // What a key whose work declares a break is kept as (BreakPolicy::piecewise).
  using piecewise_type = PiecewiseExec;

  // `flags` for every instantiation; with InstantiateFlags::upload (the
  // default) each new or re-instantiated graph is uploaded on the caller's
  // stream, so its first launch pays no upload and its pool memory is mapped
  // when it is captured, not in the serving path. `piecewise`: the bounds of
  // each piecewise executable (BreakPolicy::piecewise); its segments are
  // captured in `mode`.
  explicit CudaGraphBackend(CaptureMode mode = CaptureMode::this_thread,
                            InstantiateFlags flags = InstantiateFlags::upload, PiecewiseOptions piecewise = {})
      : mode_(mode),
        piecewise_(piecewise),
        upload_(has_flag(flags, InstantiateFlags::upload)),
        // Uploads are issued explicitly on the caller's stream (see upload_),
        // never on the stream a GraphExec remembers from its construction.
        flags_(flags & ~InstantiateFlags::upload),
        shared_(::std::make_shared<Shared>()) {}

  template <class Issue>
    requires ::std::invocable<Issue&, StreamRef>
  CapturedGraph<GraphExec> capture(StreamRef stream, Issue&& issue,
                                   ::std::source_location where = ::std::source_location::current()) const {
    const int device = detail::device_of(stream.get(), where);
    const detail::DeviceScope on_device(device, where);
    Graph graph = capture_graph(device, issue, where);
    GraphMemory memory;
    memory.alloc_bytes = graph_alloc_bytes(graph, where);
    const ::std::size_t reserved_before = pool_reserved(device, where);
    GraphExec exec = instantiate(graph, stream, where);
    memory.footprint_bytes = growth(reserved_before, pool_reserved(device, where));
    return CapturedGraph<GraphExec>{::std::move(exec), memory};
  }

  // Captures anew and updates `exec` in place (cudaGraphExecUpdate: same
  // topology, new pointers or parameters), or re-instantiates once when CUDA
  // refuses: at most two instantiations per re-capture (one, and one
  // diagnostic retry when it fails, kept when it succeeds).
  // An in-place update is safe while earlier launches still run (they keep
  // the old parameters); a replaced executable graph is freed by CUDA once
  // its launches finish. `exec` is unchanged when this throws.
  template <class Issue>
    requires ::std::invocable<Issue&, StreamRef>
  RecaptureResult recapture(GraphExec& exec, StreamRef stream, Issue&& issue,
                            ::std::source_location where = ::std::source_location::current()) const {
    const int device = detail::device_of(stream.get(), where);
    const detail::DeviceScope on_device(device, where);
    Graph graph = capture_graph(device, issue, where);
    RecaptureResult result;
    result.memory.alloc_bytes = graph_alloc_bytes(graph, where);
    const ::std::size_t reserved_before = pool_reserved(device, where);
    InstantiateSteps steps{*this, stream, where};
    result.path = detail::update_or_reinstantiate(exec, graph, steps);
    result.memory.footprint_bytes = growth(reserved_before, pool_reserved(device, where));
    return result;
  }

  void launch(const GraphExec& exec, StreamRef stream,
              ::std::source_location where = ::std::source_location::current()) const {
    exec.launch(stream, where);
  }

  // Captures issue(s) with replay::capture_piecewise, which runs the work
  // once: on a capture stream of the backend's own, in `stream`'s order (it
  // waits for the work issued on `stream` so far, and what is issued on
  // `stream` next waits for it, also when the capture throws). Not on `stream`
  // itself: a stream capture takes in whatever any thread issues on its
  // stream meanwhile. Memory: the allocation nodes' bytes, and the growth of
  // the device's graph pool while it was captured (its segments are
  // instantiated and launched at their breaks); paths captured later, at
  // launches, are bounded by the PiecewiseOptions given at construction, not
  // by the router's max_bytes.
  template <class Issue>
    requires ::std::invocable<Issue&, StreamRef>
  CapturedPieces<PiecewiseExec> capture_piecewise(StreamRef stream, Issue&& issue,
                                                  ::std::source_location where = ::std::source_location::current()) const {
    const int device = detail::device_of(stream.get(), where);
    const detail::DeviceScope on_device(device, where);
    const CaptureStream on(*shared_, device, where);  // also makes the device one trim() covers
    const Event before(EventFlags::disable_timing, where);
    before.record(stream, where);
    before.wait_on(on.ref(), where);
    const JoinBack join_back(on.ref(), stream, where);
    PiecewiseOptions options = piecewise_;
    options.mode = mode_;
    const ::std::size_t reserved_before = pool_reserved(device, where);
    PiecewiseExec exec = replay::capture_piecewise(on.ref(), ::std::forward<Issue>(issue), options, where);
    GraphMemory memory;
    memory.footprint_bytes = growth(reserved_before, pool_reserved(device, where));
    memory.alloc_bytes = exec.stats(where).alloc_bytes;
    ::std::vector<::std::string> regions;
    const ::std::vector<PiecewiseSegmentInfo> path = exec.last_path(where);
    for (const PiecewiseSegmentInfo& segment : path) {
      if (!segment.region.empty()) {
        regions.push_back(segment.region);
      }
    }
    return CapturedPieces<PiecewiseExec>{::std::move(exec), memory, path.size(), ::std::move(regions)};
  }
  // A piecewise executable's launch: it serializes its own launches and
  // orders them across streams.
  void launch_piecewise(PiecewiseExec& exec, StreamRef stream,
                        ::std::source_location where = ::std::source_location::current()) const {
    exec.launch(stream, where);
  }

  // Stream ordering (see OrdersStreams). mark() records the backend's order
  // event on `s` (made on the first mark, on `s`'s device); wait_mark() makes
  // `to` wait for the latest record; drain() synchronizes `to`'s device once
  // no capture replay made is open on it (replay::synchronize_device).
  // Records from several threads on one stream are safe: the latest record
  // follows every launch whose thread recorded before it.
  void mark(StreamRef s, ::std::source_location where = ::std::source_location::current()) {
    order_event(s, where).record(s, where);
  }
  void wait_mark(StreamRef to, ::std::source_location where = ::std::source_location::current()) {
    order_event(to, where).wait_on(to, where);
  }
  void drain(StreamRef to, ::std::source_location where = ::std::source_location::current()) {
    const detail::DeviceScope on_device(detail::device_of(to.get(), where), where);
    synchronize_device(where);
  }

  // Gives graph-pool memory that no live graph uses back (cudaDeviceGraphMemTrim
  // on every device this backend captured on): called after evictions.
  void trim(::std::source_location /*where*/ = ::std::source_location::current()) noexcept {
    ::std::vector<int> devices;
    try {
      const ::std::lock_guard<::std::mutex> lock(shared_->mutex);
      devices.assign(shared_->devices.begin(), shared_->devices.end());
    } catch (...) {
      return;
    }
    for (const int device : devices) {
      (void)detail::succeeded(::cudaDeviceGraphMemTrim(device));
    }
  }

  // The graph memory pool of the device this backend captured on last (the
  // current device before any capture).
  GraphPoolMemory pool_memory(::std::source_location where = ::std::source_location::current()) const {
    int device = -1;
    {
      const ::std::lock_guard<::std::mutex> lock(shared_->mutex);
      device = shared_->last_device;
    }
    return graph_pool_memory(device >= 0 ? device : current_device(where), where);
  }

 private:
  // Capture streams (idle ones per device), the ordering event, the devices
  // captured on. Shared so that the backend stays movable.
  struct Shared {
    ::std::mutex mutex;
    ::std::vector<::std::pair<int, Stream>> idle;
    ::std::set<int> devices;
    int last_device = -1;
    ::std::optional<Event> order;  // made once, under `mutex`, by order_event()
  };

  EventRef order_event(StreamRef s, const ::std::source_location& where) {
    const ::std::lock_guard<::std::mutex> lock(shared_->mutex);
    if (!shared_->order) {
      const detail::DeviceScope on_device(detail::device_of(s.get(), where), where);
      shared_->order.emplace(EventFlags::disable_timing, where);
    }
    return *shared_->order;
  }

  // A capture stream on `device` for one capture, handed back afterwards.
  class CaptureStream {
   public:
    CaptureStream(Shared& shared, int device, const ::std::source_location& where) : shared_(shared), device_(device) {
      {
        const ::std::lock_guard<::std::mutex> lock(shared_.mutex);
        shared_.devices.insert(device);
        shared_.last_device = device;
        for (auto it = shared_.idle.begin(); it != shared_.idle.end(); ++it) {
          if (it->first == device) {
            stream_ = ::std::move(it->second);
            shared_.idle.erase(it);
            return;
          }
        }
      }
      stream_ = Stream(StreamFlags::non_blocking, 0, where);  // the device is current (DeviceScope)
    }
    CaptureStream(const CaptureStream&) = delete;
    CaptureStream& operator=(const CaptureStream&) = delete;
    ~CaptureStream() {
      try {
        const ::std::lock_guard<::std::mutex> lock(shared_.mutex);
        shared_.idle.emplace_back(device_, ::std::move(stream_));
      } catch (...) {  // the stream is destroyed instead
      }
    }
    StreamRef ref() const noexcept { return StreamRef(stream_.get()); }

   private:
    Shared& shared_;
    int device_;
    Stream stream_ = Stream::from_native_handle(detail::invalid_stream());  // empty until taken or made
  };

  template <class Issue>
  Graph capture_graph(int device, Issue& issue, const ::std::source_location& where) const {
    const CaptureStream on(*shared_, device, where);
    CaptureScope scope(on.ref(), mode_, where);
    // "Invalidated" means the capture was already broken when the call was
    // made. A capture error of another kind in this thread's slot was left by
    // a call of the work itself (e.g. a synchronization whose status it
    // ignored); another thread that broke the capture left its error in its
    // own slot.
    // (Read before finish(): ending the broken capture overwrites the slot.)
    ::cudaError_t own = ::cudaSuccess;
    try {
      ::std::invoke(issue, on.ref());
      own = ::cudaPeekAtLastError();
      return scope.finish(where);
    } catch (const cuda_error& e) {
      if (e.status() == ::cudaErrorStreamCaptureInvalidated &&
          !(is_capture_error(own) && own != ::cudaErrorStreamCaptureInvalidated)) {
        throw capture_interrupted_error(e.what());
      }
      throw;
    }
  }

  // Orders `to` after the work issued on `from` when it goes out of scope
  // (the end of a piecewise capture, thrown or not).
  struct JoinBack {
    StreamRef from;
    StreamRef to;
    Event done;
    JoinBack(StreamRef f, StreamRef t, const ::std::source_location& where)
        : from(f), to(t), done(EventFlags::disable_timing, where) {}
    JoinBack(const JoinBack&) = delete;
    JoinBack& operator=(const JoinBack&) = delete;
    ~JoinBack() {
      if (!detail::succeeded(::cudaEventRecord(done.get(), from.get())) ||
          !detail::succeeded(::cudaStreamWaitEvent(to.get(), done.get(), 0))) {
        // Cannot order: wait on the host instead, so that `to` never runs ahead.
        (void)detail::succeeded(::cudaStreamSynchronize(from.get()));
      }
    }
  };

  // The CUDA steps of detail::update_or_reinstantiate (see there).
  struct InstantiateSteps {
    const CudaGraphBackend& backend;
    StreamRef stream;
    const ::std::source_location& where;

    bool update_in_place(GraphExec& exec, const Graph& graph) const {
      try {
        exec.update_in_place(graph, where);
        return true;
      } catch (const graph_update_error&) {
        // Refused (a topology change, or a node kind that cannot be updated,
        // refused with an error status on some drivers): re-instantiate.
        return false;
      }
    }
    GraphExec instantiate_new(const Graph& graph) const { return backend.instantiate(graph, stream, where); }
  };

  // GraphExec's instantiation (at most two attempts), uploaded on `stream`
  // when the backend uploads. Out of memory while instantiating or uploading
  // is thrown as capture_interrupted_error.
  GraphExec instantiate(const Graph& graph, StreamRef stream, const ::std::source_location& where) const {
    try {
      GraphExec exec(graph, flags_, stream, where);
      if (upload_) {
        exec.upload(stream, where);
      }
      return exec;
    } catch (const cuda_error& e) {
      if (e.status() == ::cudaErrorMemoryAllocation) {
        throw capture_interrupted_error(e.what());
      }
      throw;
    }
  }

  static ::std::size_t pool_reserved(int device, const ::std::source_location& where) {
    unsigned long long value = 0;  // cuuint64_t
    check(::cudaDeviceGetGraphMemAttribute(device, ::cudaGraphMemAttrReservedMemCurrent, &value),
          "cudaDeviceGetGraphMemAttribute", where);
    return static_cast<::std::size_t>(value);
  }
  static ::std::size_t growth(::std::size_t before, ::std::size_t after) noexcept {
    return after > before ? after - before : 0;
  }

  CaptureMode mode_;
  PiecewiseOptions piecewise_;
  bool upload_;
  InstantiateFlags flags_;
  ::std::shared_ptr<Shared> shared_;
};

static_assert(GraphBackend<CudaGraphBackend>);
static_assert(ReportsPoolMemory<CudaGraphBackend>);
static_assert(OrdersStreams<CudaGraphBackend>);
static_assert(TrimsMemory<CudaGraphBackend>);
static_assert(CapturesPiecewise<CudaGraphBackend>);

}  // namespace replay
