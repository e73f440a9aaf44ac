#!/usr/bin/env python3
"""Where a graphed step's time goes, from a kernel trace (kernel_trace.cpp's
CSV: start_ns,end_ns,stream,graph_node,name; gzip-compressed or not).

Only work launched from CUDA graphs counts (graph_node > 0) unless --all.
Steps are cut one of two ways:
  - by idle time (default): a new step starts after more than --gap-us with
    nothing running, as when each step is one graph launch with host work
    between launches; the steps kept are those of --kernels activities, or
    of the most common count;
  - by --anchor NAME: a new step starts at each activity whose name contains
    NAME, for steps launched back to back (the first --warmup steps are
    skipped).
For the steps kept it prints the median span of a step, the sum over its
positions of the median duration (the kernels' own time) and of the median
idle gap before each (time with nothing of the step running), and a table by
name. Kernels launched programmatically may start before their predecessor
ends: the overlap printed is durations + idle - span. The steps kept must run
the same kernels in the same order. --json writes the same as JSON.
"""
import argparse
import collections
import gzip
import json
import statistics
import sys


def read_trace(path, graph_only):
    opener = gzip.open if path.endswith(".gz") else open
    activities = []
    with opener(path, "rt") as file:
        for number, line in enumerate(file, 1):
            fields = line.rstrip("\n").split(",", 4)
            if len(fields) != 5:
                raise ValueError(f"{path}:{number}: expected start_ns,end_ns,stream,graph_node,name")
            start, end, stream, node = (int(f) for f in fields[:4])
            if start == 0 or end < start:  # a record CUPTI did not complete
                continue
            if graph_only and node == 0:
                continue
            activities.append((start, end, stream, node, fields[4]))
    activities.sort()
    return activities


def steps_by_idle_time(activities, gap_ns):
    """(steps, spans): a step's span from its first start to its last end."""
    steps, current, current_end = [], [], 0
    for activity in activities:
        if current and activity[0] - current_end > gap_ns:
            steps.append(current)
            current = []
        current_end = max(current_end, activity[1]) if current else activity[1]
        current.append(activity)
    if current:
        steps.append(current)
    return steps, [(max(a[1] for a in step) - step[0][0]) / 1e3 for step in steps]


def steps_by_anchor(activities, anchor, warmup):
    """(steps, spans): a step's span from its first start to the next step's (steps launched back to back)."""
    starts = [i for i, a in enumerate(activities) if anchor in a[4]]
    steps = [activities[a:b] for a, b in zip(starts, starts[1:])]
    spans = [(activities[b][0] - activities[a][0]) / 1e3 for a, b in zip(starts, starts[1:])]
    return steps[warmup:], spans[warmup:]


def summarize(steps, spans, kernels):
    counts = collections.Counter(len(step) for step in steps)
    if not counts:
        raise ValueError("no steps found")
    length = kernels if kernels is not None else counts.most_common(1)[0][0]
    of_length = [(step, span) for step, span in zip(steps, spans) if len(step) == length]
    if not of_length:
        raise ValueError(f"no step of {length} activities (step lengths found: {dict(counts.most_common(8))})")
    # Positions are compared across steps: keep the steps that run the most common sequence of kernels.
    sequence = collections.Counter(tuple(a[4] for a in step) for step, _ in of_length).most_common(1)[0][0]
    kept = [step for step, _ in of_length if tuple(a[4] for a in step) == sequence]
    kept_spans = [span for step, span in of_length if tuple(a[4] for a in step) == sequence]
    positions = []
    for j in range(length):
        duration = statistics.median((step[j][1] - step[j][0]) / 1e3 for step in kept)
        gap = statistics.median(
            max(0.0, (step[j][0] - max(a[1] for a in step[:j])) / 1e3) if j else 0.0 for step in kept)
        positions.append({"position": j, "name": kept[0][j][4], "duration_us": duration, "gap_before_us": gap})
    by_name = collections.OrderedDict()
    for p in positions:
        entry = by_name.setdefault(p["name"], {"name": p["name"], "count": 0, "duration_us": 0.0, "gaps_us": 0.0})
        entry["count"] += 1
        entry["duration_us"] += p["duration_us"]
        entry["gaps_us"] += p["gap_before_us"]
    span = statistics.median(kept_spans)
    durations = sum(p["duration_us"] for p in positions)
    idle = sum(p["gap_before_us"] for p in positions)
    return {
        "steps": len(kept),
        "activities_per_step": length,
        "step_lengths": dict(counts.most_common(8)),
        "other_sequences": len(of_length) - len(kept),
        "span_us": span,
        "durations_us": durations,
        "idle_us": idle,
        "overlap_us": durations + idle - span,
        "by_name": sorted(by_name.values(), key=lambda e: -e["duration_us"]),
        "positions": positions,
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("trace")
    parser.add_argument("--gap-us", type=float, default=10.0, help="idle time that ends a step (default 10)")
    parser.add_argument("--anchor", help="a name the first activity of every step contains")
    parser.add_argument("--warmup", type=int, default=5, help="with --anchor: steps skipped first (default 5)")
    parser.add_argument("--kernels", type=int, help="keep the steps of this many activities")
    parser.add_argument("--all", action="store_true", help="count work not launched from a graph too")
    parser.add_argument("--positions", action="store_true", help="also print every position of the step")
    parser.add_argument("--json", help="also write the summary here")
    args = parser.parse_args()
    try:
        activities = read_trace(args.trace, not args.all)
        if args.anchor:
            steps, spans = steps_by_anchor(activities, args.anchor, args.warmup)
        else:
            steps, spans = steps_by_idle_time(activities, args.gap_us * 1e3)
        summary = summarize(steps, spans, args.kernels)
    except (OSError, ValueError) as error:
        print(f"summarize_trace: {error}", file=sys.stderr)
        return 2
    print(f"{summary['steps']} steps of {summary['activities_per_step']} activities "
          f"(step lengths: {summary['step_lengths']})")
    if summary["other_sequences"]:
        print(f"({summary['other_sequences']} steps of that length ran other kernels or another order: left out)")
    print(f"median step {summary['span_us']:.1f} us: the activities' durations sum to {summary['durations_us']:.1f} us, "
          f"idle time between them {summary['idle_us']:.1f} us; durations + idle - step {summary['overlap_us']:.1f} us "
          f"(positive: kernels overlapped)")
    print(f"{'us/step':>9} {'count':>5} {'mean us':>8} {'idle us':>8}  name")
    for e in summary["by_name"]:
        print(f"{e['duration_us']:9.1f} {e['count']:5d} {e['duration_us'] / e['count']:8.2f} {e['gaps_us']:8.1f}  "
              f"{e['name'][:100]}")
    if args.positions:
        for p in summary["positions"]:
            print(f"{p['position']:4d} {p['duration_us']:8.2f} {p['gap_before_us']:7.2f}  {p['name'][:100]}")
    if args.json:
        with open(args.json, "w") as file:
            json.dump(summary, file, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
