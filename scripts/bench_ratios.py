#!/usr/bin/env python3
"""Prints the ratios that replay's targets are stated in, from Google Benchmark
JSON files of one run. The ratios are defined in bench/*.ratios, one per line:

    label | numerator | denominator | target

where numerator and denominator are benchmark name regexes (or a plain number,
such as 1 for a counter that already is a ratio) and target is like '<=1.02'
or '>=4.5' (or '-' for none). With `--ratios A.ratios[,B.ratios]` first, those
files are read instead (the libtorch adapter's, in bench/torch/, are read by
scripts/gpu-check.d/torch.sh). The time used is each benchmark's real_time
(manual time where the benchmark sets it); a regex may also end in '@counter'
to use a user counter instead. Exit status 0; the verdict of each line is
printed (PASS, MISS, or n/a when a benchmark is absent).

Confirming a miss (scripts/gpu-check.sh): `--miss-filters` prints, for each
program (JSON file name) behind a MISS, one line `program<TAB>regex` that
selects just the benchmarks of those rows, so that they can be run again.
`--rerun DIR` (repeatable) adds such runs: every row with values from more
than one run is then judged on the median of its ratios, all of them shown.
A ratio that really misses still misses in most runs, so the median misses.
"""
import glob
import json
import os
import re
import statistics
import sys

UNIT = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}


def load(paths):
    rows = []
    for path in paths:
        try:
            data = json.load(open(path))
        except Exception as exc:  # a crashed benchmark leaves a broken file
            print(f"{os.path.basename(path)}: unreadable ({exc})")
            continue
        program = os.path.basename(path)[: -len(".json")] if path.endswith(".json") else os.path.basename(path)
        for b in data.get("benchmarks", []):
            if b.get("run_type") == "aggregate" or b.get("error_occurred"):
                continue
            b["_program"] = program
            rows.append(b)
    return rows


def number(spec):
    try:
        return float(spec)
    except ValueError:
        return None


def split(spec):
    """(name regex, counter or None) of a numerator or denominator."""
    if "@" in spec:
        name, counter = spec.rsplit("@", 1)
        return name.strip(), counter.strip()
    return spec.strip(), None


def find(rows, spec):
    """The first row whose name matches the spec's regex, or None."""
    name, _ = split(spec)
    pattern = re.compile(name)
    for b in rows:
        if pattern.search(b["name"]):
            return b
    return None


def value(rows, spec):
    constant = number(spec)
    if constant is not None:
        return constant
    b = find(rows, spec)
    if b is None:
        return None
    _, counter = split(spec)
    if counter:
        return float(b[counter]) if counter in b else None
    return float(b["real_time"]) * UNIT.get(b.get("time_unit", "ns"), 1e-9)


def ratio_of(rows, num, den):
    a, b = value(rows, num), value(rows, den)
    if a is None or b is None or b == 0:
        return None
    return a / b


def specs(spec_files):
    for spec_file in spec_files:
        for line in open(spec_file):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            label, num, den, target = [p.strip() for p in line.split("|")]
            yield label, num, den, target


def verdict_of(ratio, target):
    m = re.match(r"(<=|>=)\s*([0-9.]+)", target)
    if not m:
        return None
    return ratio <= float(m.group(2)) if m.group(1) == "<=" else ratio >= float(m.group(2))


def main():
    args = sys.argv[1:]
    spec_files = None
    reruns = []
    miss_filters = False
    while args[:1] and args[0].startswith("--"):
        if args[0] == "--ratios" and len(args) >= 2:  # these ratio files instead of bench/*.ratios
            spec_files, args = args[1].split(","), args[2:]
        elif args[0] == "--rerun" and len(args) >= 2:
            reruns.append(load(sorted(glob.glob(os.path.join(args[1], "*.json")))))
            args = args[2:]
        elif args[0] == "--miss-filters":
            miss_filters, args = True, args[1:]
        else:
            print(f"bench_ratios.py: unknown option {args[0]}")
            return 2
    rows = load(args)
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench")
    spec_files = spec_files or sorted(glob.glob(os.path.join(root, "*.ratios")))
    filters = {}  # program -> name regexes behind its missed rows
    for label, num, den, target in specs(spec_files):
        ratio = ratio_of(rows, num, den)
        if ratio is None:
            if not miss_filters:
                print(f"n/a   {label}: benchmark missing")
            continue
        ratios = [ratio] + [r for r in (ratio_of(run, num, den) for run in reruns) if r is not None]
        judged = statistics.median(ratios) if len(ratios) > 1 else ratio
        ok = verdict_of(judged, target)
        if miss_filters:
            if ok is False:
                for spec in (num, den):
                    b = find(rows, spec) if number(spec) is None else None
                    if b is not None:
                        filters.setdefault(b["_program"], []).append(split(spec)[0])
            continue
        verdict = "" if ok is None else ("PASS" if ok else "MISS") + f" (target {target})"
        if len(ratios) > 1:
            shown = ", ".join(f"{r:.3f}" for r in ratios)
            verdict += f" [median of {len(ratios)} runs: {shown}]"
        print(f"{judged:8.3f}  {label}  {verdict}")
    for program, names in filters.items():
        unique = list(dict.fromkeys(names))
        print(f"{program}\t" + "|".join(unique))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BrokenPipeError:  # output cut short by a pager or `head`
        sys.exit(0)
