#pragma once
// Piecewise capture: a capture with eager breaks. Inside
// replay::capture_piecewise(stream, work), replay::eager(stream, name, region)
// ends the current graph segment, runs `region` eagerly (a read-back, a host
// decision, a call that cannot be captured) and begins the next segment on the
// same stream in the same mode. The result, a PiecewiseExec, replays segments
// and regions in order; a value a region returns keys the segments after it
// (a tree, bounded like the router's cache), so a branch taken on the host is
// never replayed stale. See docs/piecewise.md.
#include <replay/detail/require_cxx20.hpp>

// IWYU pragma: begin_exports
#include "replay/piecewise/options.hpp"
#include "replay/piecewise/region.hpp"
#include "replay/piecewise/exec.hpp"
// IWYU pragma: end_exports
