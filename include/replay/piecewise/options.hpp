#pragma once
// PiecewiseOptions: the capture mode of every segment and the bounds of a
// piecewise executable's tree of segments; PiecewiseStats: what it did.
#include <replay/detail/require_cxx20.hpp>

#include <cstddef>
#include <cstdint>
#include <limits>

#include "replay/capture_scope.hpp"

namespace replay {

// How a piecewise capture captures its segments, and the bounds of the tree
// of segments it keeps (see capture_piecewise()).
struct PiecewiseOptions {
  // The mode every segment is captured in (each segment is its own stream capture).
  CaptureMode mode = CaptureMode::this_thread;
  // Paths (distinct sequences of region values, i.e. leaves of the tree) kept
  // at once. A new path beyond it evicts the least recently launched one.
  ::std::size_t max_paths = 64;
  // Graph nodes kept over all segments (what an executable graph's memory grows with).
  ::std::size_t max_nodes = ::std::size_t{1} << 20;
  // Bytes requested by the segments' memory-allocation nodes (cudaMallocAsync
  // captured in a segment), over all segments.
  ::std::size_t max_alloc_bytes = ::std::numeric_limits<::std::size_t>::max();
};

// What a segment costs against the bounds.
struct SegmentCost {
  // Graph nodes.
  ::std::size_t nodes = 0;
  // Bytes its memory-allocation nodes request.
  ::std::size_t alloc_bytes = 0;
};

// What a PiecewiseExec did and what it keeps (PiecewiseExec::stats()).
struct PiecewiseStats {
  // launch() calls that completed.
  ::std::uint64_t launches = 0;
  // Executable segments launched (empty segments are not).
  ::std::uint64_t segment_launches = 0;
  // Regions run, captures included.
  ::std::uint64_t region_runs = 0;
  // Launches that met a region value never seen at that point.
  ::std::uint64_t misses = 0;
  // Paths captured: the first, and one per miss.
  ::std::uint64_t captures = 0;
  // Paths evicted to stay within the bounds.
  ::std::uint64_t evictions = 0;
  // Paths dropped because they alone exceed a bound.
  ::std::uint64_t refusals = 0;
  // Paths kept now.
  ::std::size_t paths = 0;
  // Segments kept now.
  ::std::size_t segments = 0;
  // Graph nodes kept now.
  ::std::size_t nodes = 0;
  // Allocation-node bytes kept now.
  ::std::size_t alloc_bytes = 0;
};

}  // namespace replay
