#pragma once
// One piecewise capture: runs the user's work with its breaks, segment by
// segment. Live, each segment is captured, instantiated and launched at its
// break, then the region runs eagerly (so it sees the real results of the
// segments before it), and the next segment begins. Resuming after a miss,
// the regions this launch already ran are not run again: their values are
// handed back, and the segments before them are captured into throwaway
// graphs (a capture executes nothing) until the missed region, after which
// the capture goes live.
#include <replay/detail/require_cxx20.hpp>

#include <cuda_runtime_api.h>

#include <cstddef>
#include <map>
#include <memory>
#include <optional>
#include <source_location>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "replay/capture_scope.hpp"
#include "replay/detail/capture_state.hpp"
#include "replay/detail/message.hpp"
#include "replay/error.hpp"
#include "replay/graph.hpp"
#include "replay/graph_exec.hpp"
#include "replay/piecewise/detail/segment_tree.hpp"
#include "replay/piecewise/detail/session.hpp"
#include "replay/piecewise/options.hpp"
#include "replay/shape_router/graph_memory.hpp"
#include "replay/stream_ref.hpp"

namespace replay::detail {

// One segment: its executable graph (none when it captured no node), what it
// holds, and the region after it (none at the end of a path).
struct PiecewiseSegment {
  ::std::optional<GraphExec> exec;
  ::std::map<NodeType, ::std::size_t> node_counts;
  SegmentCost segment_cost;
  bool has_region = false;
  ::std::string region_name;
  PiecewiseCallable region;

  SegmentCost cost() const noexcept { return segment_cost; }
};
using PiecewiseTree = SegmentTree<PiecewiseSegment>;
using PiecewiseNode = PiecewiseTree::Node;

// Runs a kept region on `stream`, its value's bytes into `value`. A region
// that leaves a stream capture open on its stream is refused, and that
// capture ended, so the stream stays usable.
inline void run_region(const PiecewiseSegment& segment, StreamRef stream, ::std::string& value,
                       const ::std::source_location& where) {
  {
    RegionRunning running;
    segment.region(stream, value);
  }
  if (stream.capture_status(where) != CaptureStatus::none) [[unlikely]] {
    ::cudaGraph_t abandoned = nullptr;
    const ::cudaError_t status = ::cudaStreamEndCapture(stream.get(), &abandoned);
    if (abandoned != nullptr) {
      (void)::cudaGraphDestroy(abandoned);
    }
    clear_error_slot(status);
    throw usage_error(concat("the region \"", segment.region_name,
                             "\" began a stream capture on its stream and left it open; a region runs eagerly (that "
                             "capture was ended and discarded)"),
                      where);
  }
}

class PiecewiseCapture final : public PiecewiseBreaks {
 public:
  // `replayed`: the values of the regions this launch already ran, handed back
  // to the work without running them; `prefix`: the kept nodes they ran at, to
  // check that the work takes the same path. Both empty for a first capture.
  PiecewiseCapture(StreamRef stream, CaptureMode mode, ::std::span<const ::std::string> replayed,
                   ::std::span<PiecewiseNode* const> prefix, PiecewiseStats& stats)
      : stream_(stream), mode_(mode), replayed_(replayed), prefix_(prefix), stats_(stats) {}
  PiecewiseCapture(const PiecewiseCapture&) = delete;
  PiecewiseCapture& operator=(const PiecewiseCapture&) = delete;

  // Runs `work` and returns the new nodes, a chain: the first is the segment
  // after the last replayed region (the root for a first capture).
  ::std::unique_ptr<PiecewiseNode> run(const PiecewiseCallable& work, const ::std::source_location& where) {
    BreaksInstalled installed(this);
    begin_segment(where);
    ::std::string ignored;
    work(stream_, ignored);
    refuse_after_failed_region(where);
    Graph last = end_segment("the end of the piecewise work", where);
    if (index_ < replayed_.size()) {
      throw usage_error(concat("the piecewise work returned before the region \"", prefix_[index_]->segment.region_name,
                               "\" it reached before with the same region values; the work must take the same "
                               "path given the same region values"),
                        where);
    }
    append(make_segment(::std::move(last), where));
    return ::std::move(chain_);
  }

  void take_break(StreamRef stream, ::std::string_view name, PiecewiseCallable&& region, ::std::string& value,
                  const ::std::source_location& where) override {
    refuse_after_failed_region(where);
    if (open_capture_scopes() != depth_) {
      throw usage_error(concat("replay::eager(\"", name,
                               "\") inside a capture nested in the piecewise one (a GraphBuilder conditional body, "
                               "a CaptureScope on another stream): a region cannot run inside a graph; end that "
                               "capture before the break"),
                        where);
    }
    if (!(stream == stream_)) {
      throw usage_error(concat("replay::eager(\"", name, "\") on ", describe_piecewise_stream(stream),
                               ", but the piecewise capture is on ", describe_piecewise_stream(stream_),
                               ": a break ends the capturing stream's segment; pass the stream the work was given"),
                        where);
    }
    Graph graph = end_segment(concat("replay::eager(\"", name, "\")"), where);
    if (index_ < replayed_.size()) {
      refuse_other_path(graph, name, where);
      value = replayed_[index_++];
      begin_segment(where);
      return;
    }
    PiecewiseSegment segment = make_segment(::std::move(graph), where);
    segment.has_region = true;
    segment.region_name = ::std::string(name);
    segment.region = ::std::move(region);
    PiecewiseNode& node = append(::std::move(segment));
    try {
      run_region(node.segment, stream_, value, where);
    } catch (...) {
      failed_region_ = node.segment.region_name;
      throw;
    }
    ++stats_.region_runs;
    key_ = value;
    ++index_;
    begin_segment(where);
  }

 private:
  void begin_segment(const ::std::source_location& where) {
    scope_.emplace(stream_, mode_, where);
    depth_ = open_capture_scopes();
  }
  Graph end_segment(const ::std::string& at, const ::std::source_location& where) {
    Graph graph;
    try {
      graph = scope_->finish(where);
    } catch (const cuda_error& error) {
      scope_.reset();
      if (error.status() == ::cudaErrorStreamCaptureUnjoined) {
        throw usage_error(concat(at, ": a stream forked from the capturing ", describe_piecewise_stream(stream_),
                                 " in this segment was not joined back; join every forked stream (replay::join, "
                                 "ScopedFork::join) before a break and before the work returns (fork() keeps no "
                                 "record of the streams it forks, so this one cannot be named)"),
                          where);
      }
      throw;
    }
    scope_.reset();
    return graph;
  }
  // Instantiates and launches a live segment (an empty one is kept, not launched).
  PiecewiseSegment make_segment(Graph graph, const ::std::source_location& where) {
    PiecewiseSegment segment;
    segment.node_counts = graph.node_counts(where);
    for (const auto& [type, count] : segment.node_counts) {
      segment.segment_cost.nodes += count;
    }
    if (segment.node_counts.contains(NodeType::mem_alloc)) {
      segment.segment_cost.alloc_bytes = graph_alloc_bytes(graph, where);
    }
    if (segment.segment_cost.nodes != 0) {
      segment.exec.emplace(graph, InstantiateFlags::none, stream_, where);
      segment.exec->launch(stream_, where);
      ++stats_.segment_launches;
    }
    return segment;
  }
  PiecewiseNode& append(PiecewiseSegment segment) {
    auto node = PiecewiseTree::make_node(::std::move(segment));
    if (chain_ == nullptr) {
      chain_ = ::std::move(node);
      tail_ = chain_.get();
    } else {
      tail_ = PiecewiseTree::append(*tail_, key_, ::std::move(node));
    }
    return *tail_;
  }
  void refuse_other_path(const Graph& graph, ::std::string_view name, const ::std::source_location& where) const {
    const PiecewiseSegment& kept = prefix_[index_]->segment;
    const ::std::size_t nodes = graph.node_count(where);
    if (name != kept.region_name || nodes != kept.segment_cost.nodes) {
      throw usage_error(concat("the piecewise work took another path than before with the same region values: break ",
                               index_ + 1, " is replay::eager(\"", name, "\") after ", nodes,
                               " captured nodes, where it was replay::eager(\"", kept.region_name, "\") after ",
                               kept.segment_cost.nodes,
                               "; the work must be the same given the same region values (as for any capture)"),
                        where);
    }
  }
  void refuse_after_failed_region(const ::std::source_location& where) const {
    if (!failed_region_.empty()) {
      throw usage_error(concat("the piecewise work went on after the region \"", failed_region_,
                               "\" threw; let a region's exception leave the work (the capture is abandoned)"),
                        where);
    }
  }

  StreamRef stream_;
  CaptureMode mode_;
  ::std::span<const ::std::string> replayed_;
  ::std::span<PiecewiseNode* const> prefix_;
  PiecewiseStats& stats_;
  int depth_ = 0;             // open_capture_scopes() inside this capture's segment
  ::std::size_t index_ = 0;   // breaks taken so far
  ::std::string key_;         // the value of the last live region: the key of the next node
  ::std::unique_ptr<PiecewiseNode> chain_;
  PiecewiseNode* tail_ = nullptr;
  ::std::string failed_region_;
  // Last, so that an open segment's capture is ended before the chain's
  // executable graphs are destroyed.
  ::std::optional<CaptureScope> scope_;
};

}  // namespace replay::detail
