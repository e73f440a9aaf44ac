#pragma once
// Breakable torch captures: TorchBreaks (what an operator that cannot be
// captured does to a GraphedCallable's capture), the operators that break a
// capture by default, and what became of each bucket's capture
// (GraphedCallable::capture_report). See docs/torch.md, "Breaks".
#include <replay/detail/require_cxx20.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace replay {

// What an operator that cannot be captured (a read-back, an output sized by
// the data) does to a torch capture.
enum class TorchBreaks : unsigned char {
  // The capture fails there and the bucket runs eagerly from then on (the
  // reason goes to GraphedOptions::on_capture_failure).
  eager,
  // The capture breaks there: the graph segment captured so far ends, the
  // operator runs eagerly on the real data, and the next segment begins.
  // Replays launch the segments and re-run the operators between them; the
  // value an operator returns (a scalar, an output's shape) chooses the
  // segments after it, captured once per value.
  piecewise,
};

// The operators a piecewise torch capture runs eagerly whatever
// GraphedOptions::eager_operators adds: a read-back of a value
// (.item(), int(t), float(t), bool(t), `if t:` all end in
// aten::_local_scalar_dense) and the operators whose output is sized by the data.
inline constexpr ::std::array<::std::string_view, 3> default_eager_operators = {
    "aten::_local_scalar_dense", "aten::nonzero", "aten::masked_select"};

// One break of a piecewise torch capture.
struct TorchBreakInfo {
  // The operator that ran eagerly ("aten::_local_scalar_dense").
  ::std::string op;
  // The TorchScript line that called it ("model.py:42"), empty outside TorchScript.
  ::std::string script_line;
  // Why it could not be captured.
  ::std::string why;
};

// What became of a bucket's capture.
enum class BucketCaptureKind : unsigned char {
  not_captured,  // not captured (yet): lazy capture, or evicted
  whole,         // one graph
  piecewise,     // graph segments with eager operators between them
  eager,         // runs eagerly; BucketCaptureReport::reason says why
};

// The kind's name: "whole", "piecewise", "eager" or "not captured".
inline constexpr ::std::string_view to_string(BucketCaptureKind kind) noexcept {
  switch (kind) {
    case BucketCaptureKind::whole:
      return "whole";
    case BucketCaptureKind::piecewise:
      return "piecewise";
    case BucketCaptureKind::eager:
      return "eager";
    default:
      return "not captured";
  }
}

// A bucket's capture, for inspection (GraphedCallable::capture_report).
struct BucketCaptureReport {
  // The batch bucket this report is for.
  ::std::int64_t bucket = 0;
  // How the bucket is served: whole, piecewise, eager, or not captured yet.
  BucketCaptureKind kind = BucketCaptureKind::not_captured;
  // piecewise: graph segments of the path launched last (breaks + 1).
  ::std::size_t segments = 0;
  // piecewise: paths kept (sequences of the breaks' values).
  ::std::size_t paths = 0;
  // piecewise: the breaks of the path launched last, in order.
  ::std::vector<TorchBreakInfo> breaks;
  // eager: why the bucket runs eagerly.
  ::std::string reason;
  // piecewise: launches that met a break value never seen on any kept path
  // (each captured a new path), and launches that moved to another kept path
  // part-way (the segments before the switch ran twice).
  ::std::uint64_t misses = 0;
  // piecewise: launches that moved to another kept path part-way.
  ::std::uint64_t path_switches = 0;
};

}  // namespace replay
