#!/usr/bin/env python3
"""scripts/bench_ratios.py on made-up Google Benchmark JSON: PASS and MISS,
counters and constant denominators, absent benchmarks, the filters it gives
for re-running the benchmarks behind a miss, and the median over re-runs."""
import json
import os
import subprocess
import sys
import tempfile

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts", "bench_ratios.py")
failures = []


def check(what, ok):
    if not ok:
        failures.append(what)
        print(f"FAILED: {what}")


def bench(name, real_time, **counters):
    return dict(name=name, run_type="iteration", real_time=real_time, time_unit="us", **counters)


def write(directory, program, benchmarks):
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, program + ".json")
    json.dump({"benchmarks": benchmarks}, open(path, "w"))
    return path


def run(*args):
    out = subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True)
    check(f"exit status 0 for {args}", out.returncode == 0)
    return out.stdout.splitlines()


def line_of(lines, label):
    found = [l for l in lines if label in l]
    check(f"one line for {label!r} in {lines}", len(found) == 1)
    return found[0] if found else ""


with tempfile.TemporaryDirectory() as tmp:
    ratios = os.path.join(tmp, "t.ratios")
    open(ratios, "w").write(
        "# comment\n"
        "fast / slow | a/fast/ | a/slow/ | <=0.5\n"
        "slow / fast | a/slow/ | a/fast/ | >=3\n"
        "counter over one | b/pair/@ratio | 1 | <=1.02\n"
        "shown only | a/fast/ | a/slow/ | -\n"
        "absent | a/none/ | a/slow/ | <=1\n")
    first = [
        write(os.path.join(tmp, "run"), "prog_a", [bench("a/fast/manual_time", 10.0), bench("a/slow/manual_time", 40.0)]),
        write(os.path.join(tmp, "run"), "prog_b", [bench("b/pair/manual_time", 0.0, ratio=1.03)]),
    ]
    lines = run("--ratios", ratios, *first)
    check("0.25 passes <=0.5", "PASS (target <=0.5)" in line_of(lines, "fast / slow"))
    check("4 passes >=3", "PASS (target >=3)" in line_of(lines, "slow / fast"))
    check("a counter over a constant 1 misses <=1.02",
          "1.030" in line_of(lines, "counter over one") and "MISS (target <=1.02)" in line_of(lines, "counter over one"))
    check("no target, no verdict", "PASS" not in line_of(lines, "shown only") and "MISS" not in line_of(lines, "shown only"))
    check("an absent benchmark is n/a", line_of(lines, "absent").startswith("n/a"))

    # The filters select exactly the benchmarks behind the missed row, by program.
    filters = run("--ratios", ratios, "--miss-filters", *first)
    check(f"one filter line, for prog_b: {filters}", filters == ["prog_b\tb/pair/"])

    # Two re-runs: the row is judged on the median of its three ratios.
    write(os.path.join(tmp, "rerun1"), "prog_b", [bench("b/pair/manual_time", 0.0, ratio=1.00)])
    write(os.path.join(tmp, "rerun2"), "prog_b", [bench("b/pair/manual_time", 0.0, ratio=1.01)])
    lines = run("--ratios", ratios, "--rerun", os.path.join(tmp, "rerun1"), "--rerun", os.path.join(tmp, "rerun2"), *first)
    row = line_of(lines, "counter over one")
    check(f"median 1.01 of three passes: {row}", row.strip().startswith("1.010") and "PASS" in row)
    check(f"all three shown: {row}", "[median of 3 runs: 1.030, 1.000, 1.010]" in row)
    check("rows without re-runs keep their one value", "median of" not in line_of(lines, "fast / slow"))

    # A real regression misses in the re-runs too, and its median misses.
    write(os.path.join(tmp, "rerun3"), "prog_b", [bench("b/pair/manual_time", 0.0, ratio=1.05)])
    write(os.path.join(tmp, "rerun4"), "prog_b", [bench("b/pair/manual_time", 0.0, ratio=1.00)])
    lines = run("--ratios", ratios, "--rerun", os.path.join(tmp, "rerun3"), "--rerun", os.path.join(tmp, "rerun4"), *first)
    check("median 1.03 of three misses", "MISS (target <=1.02)" in line_of(lines, "counter over one"))

    # A row may take its numerator and denominator from two programs (one run
    # of several benchmark programs): it is judged, and the filters for a miss
    # name each program with its own benchmark.
    across = os.path.join(tmp, "across.ratios")
    open(across, "w").write("a over c | a/fast/ | c/slow/ | >=1\n")
    programs = first + [write(os.path.join(tmp, "run"), "prog_c", [bench("c/slow/manual_time", 40.0)])]
    lines = run("--ratios", across, *programs)
    row = line_of(lines, "a over c")
    check(f"a row across two programs is judged: {row}", row.strip().startswith("0.250") and "MISS" in row)
    filters = run("--ratios", across, "--miss-filters", *programs)
    check(f"one filter line per program: {filters}", sorted(filters) == ["prog_a\ta/fast/", "prog_c\tc/slow/"])

if failures:
    print(f"{len(failures)} check(s) failed")
    sys.exit(1)
print("bench_ratios: all checks passed")
