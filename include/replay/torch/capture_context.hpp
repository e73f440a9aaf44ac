#pragma once
// TorchCaptureContext: what the graphs of one model share (device, private
// memory pool, capture stream, the outputs handed from work to backend).
#include <replay/detail/require_cxx20.hpp>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <source_location>
#include <string>
#include <utility>
#include <vector>

#include "replay/detail/message.hpp"
#include "replay/error.hpp"
#include "replay/stream.hpp"
#include "replay/stream_ref.hpp"
#include "replay/torch/detail/capture.hpp"
#include "replay/torch/piecewise.hpp"

namespace torch::jit {
struct Graph;
}

namespace replay {
namespace detail {
class TorchPiecewise;
}

// What the graphs of one model share: the device, the private memory pool of
// the caching allocator, the stream captures run on, and the static outputs
// handed from the work callable to the backend. The outputs slot and the
// launched-outputs record are not synchronized: a router over one context is
// used by one thread at a time (GraphedCallable serializes its calls). Created by GraphedCallable;
// create one yourself to use TorchGraphBackend with your own ShapeRouter (the
// work callable then reports what it computed with set_outputs()).
class TorchCaptureContext {
 public:
  // `generators`: the CUDA generators the work draws random numbers from;
  // each is put into capture mode while a graph is captured and advanced on
  // every replay. `capture_default_generator`: also the device's default
  // generator (as torch.cuda.graph does); every other thread's eager random
  // numbers on that device then fail while a capture is open, so leave it
  // off unless no other thread draws from it then.
  explicit TorchCaptureContext(::c10::Device device, CaptureMode mode = CaptureMode::this_thread,
                               ::std::vector<::at::Generator> generators = {},
                               ::std::source_location where = ::std::source_location::current(),
                               bool capture_default_generator = false)
      : device_(checked_device(device, where)),
        mode_(mode),
        generators_(::std::move(generators)),
        capture_default_generator_(capture_default_generator),
        pool_(::at::cuda::graph_pool_handle()),
        capture_stream_(make_stream(device_, where)),
        generation_(::std::make_shared<::std::atomic<::std::uint64_t>>(0)) {
    // The context holds a reference on the pool for its whole life, as
    // torch.cuda.MemPool does: a pool whose use count drops to 0 (every graph
    // evicted, or a first capture that failed) becomes "freeable", and the
    // caching allocator refuses to capture into it again.
    ::at::globalContext().lazyInitDevice(::at::kCUDA);
    ::c10::cuda::CUDAGuard guard(device_);
    try {
      ::c10::cuda::CUDACachingAllocator::createOrIncrefPool(device_.index(), pool_);
      holds_pool_ = true;
    } catch (const ::c10::Error&) {
      holds_pool_ = false;  // an allocator backend without private pools (cudaMallocAsync)
    }
    // The pinned host allocator keeps its own private pool per graph pool id,
    // with the same rule: once its use count reached 0 (the last graph
    // evicted), a new capture into that id trips an internal assertion. Hold a
    // reference there too: begin routing (which creates the pool, or takes a
    // reference) with a filter that routes nothing, and end it at once.
    try {
      ::at::HostAllocator* host = ::at::getHostAllocator(::at::kCUDA);
      host->begin_allocate_to_pool(pool_, [](::c10::Stream) { return false; });
      host->end_allocate_to_pool(pool_);
      holds_host_pool_ = true;
    } catch (const ::c10::Error&) {
      holds_host_pool_ = false;
    }
  }

  TorchCaptureContext(const TorchCaptureContext&) = delete;
  TorchCaptureContext& operator=(const TorchCaptureContext&) = delete;
  TorchCaptureContext(TorchCaptureContext&&) = delete;
  TorchCaptureContext& operator=(TorchCaptureContext&&) = delete;

  // Every graph is gone by now (the backend holding them keeps this alive),
  // and the caller has made sure no replay still runs: drop the capture
  // stream's cuBLAS workspaces (the graphs' cuBLAS kernels used them) and
  // hand the pool's cached segments back to the device. Segments still
  // holding tensors the caller kept are freed by the allocator later.
  ~TorchCaptureContext() {
#ifdef REPLAY_TORCH_PREPARE_CUBLAS
    detail::release_cublas_workspaces(capture_stream_.get());
#endif
    try {
      ::c10::cuda::CUDAGuard guard(device_);
      if (holds_pool_) {
        ::c10::cuda::CUDACachingAllocator::releasePool(device_.index(), pool_);
      }
      if (holds_host_pool_) {
        ::at::getHostAllocator(::at::kCUDA)->release_pool(pool_);
      }
      if (pool_touched_ || holds_pool_) {
        ::c10::cuda::CUDACachingAllocator::emptyCache(pool_);
      }
    } catch (...) {
    }
  }

  ::c10::Device device() const noexcept { return device_; }
  ::c10::MempoolId_t pool() const noexcept { return pool_; }
  CaptureMode mode() const noexcept { return mode_; }
  const ::std::vector<::at::Generator>& generators() const noexcept { return generators_; }
  bool captures_default_generator() const noexcept { return capture_default_generator_; }
  // Held across each capture: the captures of one context share its stream,
  // its pool and the outputs slot.
  ::std::mutex& capture_mutex() const noexcept { return capture_mutex_; }
  StreamRef capture_stream() const noexcept { return StreamRef(capture_stream_.get()); }

  // The work callable reports its outputs here; during a capture they become
  // the graph's static outputs.
  void set_outputs(::std::vector<::at::Tensor> outputs) { outputs_ = ::std::move(outputs); }
  ::std::vector<::at::Tensor> take_outputs() noexcept { return ::std::exchange(outputs_, {}); }

  // The static outputs of the graph launched last, and the replay count that
  // fast-mode outputs are checked against.
  const ::std::vector<::at::Tensor>* launched_outputs() const noexcept { return launched_; }
  ::std::uint64_t generation() const noexcept { return generation_->load(::std::memory_order_acquire); }
  ::std::shared_ptr<const ::std::atomic<::std::uint64_t>> generation_counter() const noexcept { return generation_; }
  void note_launch(const ::std::vector<::at::Tensor>* outputs) noexcept {
    launched_ = outputs;
    generation_->fetch_add(1, ::std::memory_order_acq_rel);
  }
  void note_capture() noexcept { pool_touched_ = true; }

  // What an operator that cannot be captured does to this context's
  // captures (TorchBreaks::eager: the capture fails, as before), the
  // operators a piecewise capture runs eagerly on top of
  // default_eager_operators ("my_ns::my_op"), and the paths of distinct
  // break values one key keeps before it runs eagerly. Set before capturing.
  void set_breaks(TorchBreaks breaks, const ::std::vector<::std::string>& eager_operators = {},
                  ::std::size_t max_paths = 16, ::std::source_location where = ::std::source_location::current()) {
    if (max_paths == 0) {
      throw usage_error("TorchCaptureContext::set_breaks: max_paths must be at least 1", where);
    }
    for (const ::std::string& op : eager_operators) {
      if (op.find("::") == ::std::string::npos) {
        throw usage_error(detail::concat("TorchCaptureContext::set_breaks: \"", op,
                                         "\" is not an operator name; name it with its namespace, as the dispatcher "
                                         "does (\"my_ns::my_op\", \"aten::unique\")"),
                          where);
      }
    }
    breaks_ = breaks;
    operators_.assign(default_eager_operators.begin(), default_eager_operators.end());
    operators_.insert(operators_.end(), eager_operators.begin(), eager_operators.end());
    max_break_paths_ = max_paths;
  }
  // What set_breaks() set: the policy, the operators that break a capture
  // (replay's defaults first, then the user's), and the paths kept per key.
  TorchBreaks breaks() const noexcept { return breaks_; }
  // The operators that break a capture under TorchBreaks::piecewise.
  const ::std::vector<::std::string>& eager_operators() const noexcept { return operators_; }
  // The paths of break values kept per key before it runs eagerly.
  ::std::size_t max_break_paths() const noexcept { return max_break_paths_; }

  // The work of the key being captured, as the work callable runs it: a
  // piecewise graph runs it again, live, to capture the path of a break value
  // never seen (and eagerly, when the key gives up). GraphedCallable sets it;
  // a work callable of your own calls it before issuing (the function must
  // stay valid as long as the graphs).
  void set_work(::std::int64_t key, ::std::function<void(StreamRef)> work) {
    work_key_ = key;
    work_ = ::std::move(work);
  }
  // The key set_work() was last called with.
  ::std::int64_t work_key() const noexcept { return work_key_; }

  // The TorchScript graph the work runs (inlined), where a piecewise capture
  // looks up how a float read back is used: compared with constants and
  // branched on, the comparisons' outcomes key the segments after it instead
  // of its exact value. GraphedCallable sets it for a torch::jit::Module.
  void set_script_graph(::std::shared_ptr<::torch::jit::Graph> graph) { script_graph_ = ::std::move(graph); }
  // The graph set_script_graph() set (null for a C++ callable).
  const ::std::shared_ptr<::torch::jit::Graph>& script_graph() const noexcept { return script_graph_; }
  // Hands over the work set_work() set, leaving none (a piecewise capture keeps it).
  ::std::function<void(StreamRef)> take_work() noexcept { return ::std::exchange(work_, {}); }

  // The piecewise graphs by key, for reports (held weakly: the router owns them).
  void note_piecewise(::std::int64_t key, const ::std::shared_ptr<detail::TorchPiecewise>& graph) {
    const ::std::lock_guard<::std::mutex> lock(piecewise_mutex_);
    piecewise_[key] = graph;
  }
  // The piecewise graph noted for `key`, or null (none, or already destroyed).
  ::std::shared_ptr<detail::TorchPiecewise> piecewise_for(::std::int64_t key) const {
    const ::std::lock_guard<::std::mutex> lock(piecewise_mutex_);
    const auto it = piecewise_.find(key);
    return it == piecewise_.end() ? nullptr : it->second.lock();
  }

  // Bytes of device memory in the pool's segments (the caching allocator's
  // snapshot): what the graphs' intermediate and output tensors occupy.
  ::std::size_t pool_reserved_bytes() const {
    ::std::size_t bytes = 0;
    const auto snapshot = ::c10::cuda::CUDACachingAllocator::snapshot(pool_);
    for (const auto& segment : snapshot.segments) {
      if (segment.owner_private_pool_id == pool_ && segment.device == device_.index()) {
        bytes += segment.total_size;
      }
    }
    return bytes;
  }

 private:
  static ::c10::Device checked_device(::c10::Device device, const ::std::source_location& where) {
    if (!device.is_cuda()) {
      throw usage_error(detail::concat("TorchCaptureContext: the device must be a CUDA device, got ", device.str()),
                        where);
    }
    if (!device.has_index()) {
      return ::c10::Device(::c10::kCUDA, ::c10::cuda::current_device());
    }
    return device;
  }
  static Stream make_stream(::c10::Device device, const ::std::source_location& where) {
    ::c10::cuda::CUDAGuard guard(device);
    return Stream(StreamFlags::non_blocking, 0, where);
  }

  ::c10::Device device_;
  CaptureMode mode_;
  ::std::vector<::at::Generator> generators_;
  bool capture_default_generator_ = false;
  mutable ::std::mutex capture_mutex_;
  ::c10::MempoolId_t pool_;
  Stream capture_stream_;
  ::std::vector<::at::Tensor> outputs_;
  const ::std::vector<::at::Tensor>* launched_ = nullptr;
  ::std::shared_ptr<::std::atomic<::std::uint64_t>> generation_;
  bool pool_touched_ = false;
  bool holds_pool_ = false;
  bool holds_host_pool_ = false;
  TorchBreaks breaks_ = TorchBreaks::eager;
  ::std::vector<::std::string> operators_{default_eager_operators.begin(), default_eager_operators.end()};
  ::std::size_t max_break_paths_ = 16;
  ::std::int64_t work_key_ = 0;
  ::std::function<void(StreamRef)> work_;
  ::std::shared_ptr<::torch::jit::Graph> script_graph_;
  mutable ::std::mutex piecewise_mutex_;
  ::std::map<::std::int64_t, ::std::weak_ptr<detail::TorchPiecewise>> piecewise_;
};

}  // namespace replay
