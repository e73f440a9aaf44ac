#!/usr/bin/env python3
"""bench/kernel_trace/summarize_trace.py: steps cut at idle time or at an
anchor kernel, only graphed work counted, the steps of the most common (or
the asked) length kept, each step's span split into the activities' own
durations and the idle time between them; bad input refused with a clear
message. From made-up kernel traces."""
import gzip
import json
import os
import subprocess
import sys
import tempfile

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench", "kernel_trace",
                      "summarize_trace.py")
failures = []


def check(condition, what):
    if not condition:
        failures.append(what)
        print("FAILED:", what)


def run(lines, *options, compress=False):
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "trace.csv.gz" if compress else "trace.csv")
        text = "".join(line + "\n" for line in lines)
        if compress:
            with gzip.open(path, "wt") as file:
                file.write(text)
        else:
            with open(path, "w") as file:
                file.write(text)
        out = os.path.join(directory, "summary.json")
        result = subprocess.run([sys.executable, SCRIPT, path, "--json", out, *options], capture_output=True,
                                text=True)
        summary = None
        if result.returncode == 0:
            with open(out) as file:
                summary = json.load(file)
        return result, summary


def step(t, node, names_and_us, gap_us=0.5, stream=7):
    """Activities back to back from t (ns), each after gap_us of idle time; returns (lines, end)."""
    lines = []
    for i, (name, us) in enumerate(names_and_us):
        if i:
            t += int(gap_us * 1000)
        lines.append(f"{t},{t + int(us * 1000)},{stream},{node + i},{name}")
        t += int(us * 1000)
    return lines, t


# Three graphed steps of A (2 us), B (3 us), C (1 us), 0.5 us idle between them, 50 us between steps; an
# ungraphed kernel between steps (ignored) and one graphed step with a fourth kernel (not the common length).
lines, t = [], 1_000_000
for s in range(3):
    part, t = step(t, 100, [("void ns::A<1; 2>", 2), ("B", 3), ("C", 1)])
    lines += part
    lines.append(f"{t + 20_000},{t + 25_000},7,0,eager_kernel")
    t += 50_000
part, t = step(t, 200, [("void ns::A<1; 2>", 2), ("B", 3), ("C", 1), ("D", 4)])
lines += part
# Records CUPTI did not complete (no start, or an end before the start) are skipped.
lines += ["0,5000,7,300,incomplete", f"{t + 90_000},{t + 80_000},7,301,incomplete"]

result, summary = run(lines)
check(result.returncode == 0, f"idle-time steps: exit 0 (got {result.returncode}: {result.stderr})")
if summary:
    check(summary["steps"] == 3 and summary["activities_per_step"] == 3, "the three steps of three kept")
    check(abs(summary["span_us"] - 7.0) < 1e-6, f"span 7 us (got {summary['span_us']})")
    check(abs(summary["durations_us"] - 6.0) < 1e-6, f"durations 6 us (got {summary['durations_us']})")
    check(abs(summary["idle_us"] - 1.0) < 1e-6, f"idle 1 us (got {summary['idle_us']})")
    check([e["name"] for e in summary["by_name"]] == ["B", "void ns::A<1; 2>", "C"], "by name, longest first")
    check(all(e["name"] != "eager_kernel" for e in summary["by_name"]), "ungraphed work not counted")
    check(summary["step_lengths"] == {"3": 3, "4": 1}, f"step lengths reported (got {summary['step_lengths']})")
check("idle time between them 1.0 us" in result.stdout, "the text names the idle time")

# --kernels 4: the other step; --all: the ungraphed kernels count (each its own step of 1 here).
result, summary = run(lines, "--kernels", "4")
check(summary is not None and summary["steps"] == 1 and abs(summary["durations_us"] - 10.0) < 1e-6,
      "--kernels 4 keeps the four-kernel step")
result, summary = run(lines, "--all", "--kernels", "1")
check(summary is not None and summary["steps"] == 3 and summary["by_name"][0]["name"] == "eager_kernel",
      "--all counts ungraphed work")

# Back to back (no idle time long enough to cut): --anchor cuts at each A, skipping --warmup steps.
lines, t = [], 1000
for s in range(8):
    part, t = step(t, 1, [("first", 1), ("mid", 2), ("last", 1)], gap_us=0.25)
    lines += part
    t += 250  # 0.25 us to the next step
back_to_back = lines
result, summary = run(lines, "--anchor", "first", "--warmup", "2", compress=True)
check(result.returncode == 0, f"anchor steps from a .gz trace: exit 0 (got {result.returncode}: {result.stderr})")
if summary:
    # 8 starts give 7 steps between them, 2 skipped.
    check(summary["steps"] == 5, f"5 steps after the warm-up (got {summary['steps']})")
    check(abs(summary["span_us"] - 4.75) < 1e-6, f"start to next start 4.75 us (got {summary['span_us']})")
    check(abs(summary["idle_us"] - 0.5) < 1e-6, f"idle 0.5 us inside a step (got {summary['idle_us']})")
result, summary = run(lines)
check(summary is not None and summary["steps"] == 1 and summary["activities_per_step"] == 24,
      "without --anchor, back-to-back steps are one")

# Overlap (a programmatic launch starts before its predecessor ends): A 0-10 us, B 2-4, C 11-12 in each step.
# B's idle time is 0, C's is 1 us after the latest end before it (A's, not B's); durations + idle - span = 2.
lines = []
for s in range(4):
    t = 1_000_000 + s * 100_000
    lines += [f"{t},{t + 10_000},7,1,A", f"{t + 2_000},{t + 4_000},7,2,B", f"{t + 11_000},{t + 12_000},7,3,C"]
result, summary = run(lines)
check(summary is not None and abs(summary["idle_us"] - 1.0) < 1e-6 and abs(summary["overlap_us"] - 2.0) < 1e-6
      and abs(summary["span_us"] - 12.0) < 1e-6,
      f"overlapping kernels: idle 1 us after the latest end, overlap 2 us (got {summary})")

# A step of another length between kept ones: each kept step's span is its own (start to next start), and a
# step of the common length whose kernels differ is left out, not mixed into the positions.
lines, t = [], 1000
for s in range(6):
    kernels = [("first", 1), ("mid", 2), ("last", 1)]
    if s == 2:
        kernels.append(("extra", 10))
    if s == 4:
        kernels = [("first", 1), ("other", 5), ("last", 1)]
    part, t = step(t, 1, kernels, gap_us=0.25)
    lines += part
    t += 250
result, summary = run(lines, "--anchor", "first", "--warmup", "0")
check(summary is not None and abs(summary["span_us"] - 4.75) < 1e-6,
      f"a dropped step does not stretch its neighbour's span (got {summary and summary['span_us']})")
check(summary is not None and summary["steps"] == 3 and summary["other_sequences"] == 1
      and all(e["name"] != "other" for e in summary["by_name"]),
      f"the step with other kernels left out (got {summary and (summary['steps'], summary['other_sequences'])})")

result, summary = run(lines, "--anchor", "first", "--warmup", "1")
check(summary is not None and summary["steps"] == 2 and abs(summary["span_us"] - 4.75) < 1e-6,
      f"after the warm-up, each step keeps its own span (got {summary and (summary['steps'], summary['span_us'])})")

# Refusals: no step of the asked length (the lengths found named), a malformed line, an empty trace.
result, _ = run(back_to_back, "--anchor", "first", "--warmup", "2", "--kernels", "9")
check(result.returncode == 2 and "no step of 9 activities" in result.stderr and "{3: 5}" in result.stderr,
      f"--kernels 9 refused naming the lengths found (got {result.returncode}: {result.stderr})")
result, _ = run(["1,2,3"])
check(result.returncode == 2 and "trace.csv:1" in result.stderr, f"a malformed line named (got {result.stderr})")
result, _ = run([])
check(result.returncode == 2 and "no steps found" in result.stderr, f"an empty trace refused (got {result.stderr})")

print(f"summarize_trace: {'FAILED ' + str(len(failures)) if failures else 'all checks passed'}")
sys.exit(1 if failures else 0)
