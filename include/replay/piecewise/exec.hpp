#pragma once
// PiecewiseExec: an executable of graph segments and eager regions, made by
// replay::capture_piecewise. launch(stream) replays them in order: segment,
// region, then the segment kept for the value the region returned, and so
// on. It synchronizes nothing itself: a region synchronizes what it needs.
#include <replay/detail/require_cxx20.hpp>

#include <cstddef>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <source_location>
#include <string>
#include <utility>
#include <vector>

#include "replay/detail/message.hpp"
#include "replay/detail/signature_checks.hpp"
#include "replay/error.hpp"
#include "replay/graph.hpp"
#include "replay/piecewise/detail/capture.hpp"
#include "replay/piecewise/detail/dot.hpp"
#include "replay/piecewise/detail/session.hpp"
#include "replay/piecewise/detail/state.hpp"
#include "replay/piecewise/options.hpp"
#include "replay/stream_ref.hpp"

namespace replay {

class PiecewiseExec;

// Captures `work(stream)` piecewise: the work runs once, now, and each
// replay::eager(stream, ...) inside it splits it into graph segments and the
// eager region between them. Unlike replay::capture, this executes the work
// (each segment is launched at its break, so a region sees the real results
// before it). The work is kept, and run again (its segments captured, not
// executed, and its regions' values handed back) after a region returns a
// value never seen at that point: it must take the same path given the same
// region values, as any capture must, and what it refers to must outlive the
// executable.
template <class Work>
[[nodiscard]] PiecewiseExec capture_piecewise(StreamRef stream, Work&& work, const PiecewiseOptions& options = {},
                                              ::std::source_location where = ::std::source_location::current());

// One segment of a path, for inspection.
struct PiecewiseSegmentInfo {
  // Graph nodes (0: nothing was captured before the break).
  ::std::size_t nodes = 0;
  // Graph nodes by type.
  ::std::map<NodeType, ::std::size_t> node_counts;
  // The name of the region after it; empty at the end of the path.
  ::std::string region;
};

// An executable of graph segments and eager regions, made by
// capture_piecewise(): launch() replays them in order, choosing the segments
// after a region by the value it returned. Move-only.
class PiecewiseExec {
 public:
  // Holds the executable for one thread: launches from other threads wait
  // until it ends. Take it around staging inputs, launch() and reading
  // outputs when several threads share the executable (its segments share
  // their buffers). Ending it orders the next user's stream after it. It
  // must end on the thread that took it, before the executable is destroyed.
  class Lease {
   public:
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    ~Lease() { state_->end_lease(); }

   private:
    friend class PiecewiseExec;
    explicit Lease(detail::PiecewiseState* state) noexcept : state_(state) {}
    detail::PiecewiseState* state_;
  };

  // Moves; a moved-from executable throws usage_error on use.
  PiecewiseExec(PiecewiseExec&&) noexcept = default;
  // Moves; a moved-from executable throws usage_error on use.
  PiecewiseExec& operator=(PiecewiseExec&&) noexcept = default;
  ~PiecewiseExec() = default;

  // Replays the segments and regions on `stream`, in order. A region value
  // never seen at its break captures the rest of the path (running it live,
  // once) and keeps it. Safe from several threads: launches are serialized
  // (regions run host code), and a launch on another stream than the last one
  // waits on the device for the last one's work. An exception from a region
  // reaches the caller; the segments before it are on the stream, the
  // executable and the stream stay usable.
  void launch(StreamRef stream, ::std::source_location where = ::std::source_location::current()) {
    state(where).launch(stream, where);
  }

  // Holds the executable for this thread, on `stream`, until the lease ends.
  [[nodiscard]] Lease lease(StreamRef stream, ::std::source_location where = ::std::source_location::current()) {
    detail::PiecewiseState& s = state(where);
    s.begin_lease(stream, where);
    return Lease(&s);
  }

  // What it did and what it keeps.
  PiecewiseStats stats(::std::source_location where = ::std::source_location::current()) const {
    const detail::PiecewiseState& s = state(where);
    const auto lock = s.inspect();
    return s.stats();
  }
  // The options it was captured with.
  const PiecewiseOptions& options(::std::source_location where = ::std::source_location::current()) const {
    return state(where).options();
  }
  // Paths (sequences of region values) kept.
  ::std::size_t path_count(::std::source_location where = ::std::source_location::current()) const {
    return stats(where).paths;
  }
  // Segments kept, over all paths.
  ::std::size_t segment_count(::std::source_location where = ::std::source_location::current()) const {
    return stats(where).segments;
  }

  // The segments the latest launch (or the capture) went through, in order,
  // with the region after each. Empty when that launch failed or its path was not kept.
  ::std::vector<PiecewiseSegmentInfo> last_path(
      ::std::source_location where = ::std::source_location::current()) const {
    const detail::PiecewiseState& s = state(where);
    const auto lock = s.inspect();
    ::std::vector<PiecewiseSegmentInfo> out;
    for (const detail::PiecewiseNode* n = s.last_leaf(); n != nullptr; n = n->parent) {
      out.push_back({n->segment.segment_cost.nodes, n->segment.node_counts,
                     n->segment.has_region ? n->segment.region_name : ::std::string()});
    }
    return {out.rbegin(), out.rend()};
  }

  // The whole tree in Graphviz DOT: segments as boxes (node counts by type),
  // regions as hexagons, the edges after a region labelled with its value.
  ::std::string to_dot(::std::source_location where = ::std::source_location::current()) const {
    const detail::PiecewiseState& s = state(where);
    const auto lock = s.inspect();
    return detail::piecewise_dot(s.tree());
  }
  // Writes to_dot() to `path`.
  void write_dot(const ::std::filesystem::path& path,
                 ::std::source_location where = ::std::source_location::current()) const {
    const ::std::string dot = to_dot(where);
    ::std::ofstream file(path);
    file << dot;
    if (!file) {
      throw usage_error(detail::concat("PiecewiseExec::write_dot: cannot write ", path.string()), where);
    }
  }

 private:
  template <class Work>
  friend PiecewiseExec capture_piecewise(StreamRef, Work&&, const PiecewiseOptions&, ::std::source_location);

  explicit PiecewiseExec(::std::unique_ptr<detail::PiecewiseState> state) noexcept : state_(::std::move(state)) {}

  detail::PiecewiseState& state(const ::std::source_location& where) const {
    if (state_ == nullptr) [[unlikely]] {
      throw usage_error("PiecewiseExec used after move", where);
    }
    return *state_;
  }

  ::std::unique_ptr<detail::PiecewiseState> state_;
};

template <class Work>
PiecewiseExec capture_piecewise(StreamRef stream, Work&& work, const PiecewiseOptions& options,
                                ::std::source_location where) {
  detail::check_capture_work<Work>();
  detail::refuse_piecewise_here("replay::capture_piecewise()", where);
  if (options.max_paths == 0 || options.max_nodes == 0) {
    throw usage_error("PiecewiseOptions: max_paths and max_nodes must be at least 1", where);
  }
  if (stream.handle(where) == nullptr || stream.get() == cudaStreamLegacy) {
    throw usage_error("replay::capture_piecewise: cannot capture the legacy default stream; capture a replay::Stream",
                      where);
  }
  auto state = ::std::make_unique<detail::PiecewiseState>(
      detail::PiecewiseCallable::make(::std::forward<Work>(work)), options, where);
  state->capture(stream, where);
  return PiecewiseExec(::std::move(state));
}

}  // namespace replay
