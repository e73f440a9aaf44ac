#!/usr/bin/env python3
"""Prints the ratios that replay's targets are stated in, from Google Benchmark
JSON files of one run. The ratios are defined in bench/*.ratios, one per line:

    label | numerator name regex | denominator name regex | target

where target is like '<=1.02' or '>=4.5' (or '-' for none). With
`--ratios A.ratios[,B.ratios]` first, those files are read instead (the
libtorch adapter's, in bench/torch/, are read by scripts/gpu-check.d/torch.sh). The time used is
each benchmark's real_time (manual time where the benchmark sets it); a regex
may also end in '@counter' to use a user counter instead. Exit status 0; the
verdict of each line is printed (PASS, MISS, or n/a when a benchmark is absent).
"""
import glob
import json
import os
import re
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
        for b in data.get("benchmarks", []):
            if b.get("run_type") == "aggregate" or b.get("error_occurred"):
                continue
            rows.append(b)
    return rows


def value(rows, spec):
    counter = None
    if "@" in spec:
        spec, counter = spec.rsplit("@", 1)
    pattern = re.compile(spec.strip())
    for b in rows:
        if pattern.search(b["name"]):
            if counter:
                return float(b[counter]) if counter in b else None
            return float(b["real_time"]) * UNIT.get(b.get("time_unit", "ns"), 1e-9)
    return None


def main():
    args = sys.argv[1:]
    spec_files = None
    if args[:1] == ["--ratios"] and len(args) >= 2:  # these ratio files instead of bench/*.ratios
        spec_files, args = args[1].split(","), args[2:]
    rows = load(args)
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench")
    for spec_file in spec_files or sorted(glob.glob(os.path.join(root, "*.ratios"))):
        for line in open(spec_file):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            label, num, den, target = [p.strip() for p in line.split("|")]
            a, b = value(rows, num), value(rows, den)
            if a is None or b is None or b == 0:
                print(f"n/a   {label}: benchmark missing")
                continue
            ratio = a / b
            verdict = ""
            m = re.match(r"(<=|>=)\s*([0-9.]+)", target)
            if m:
                ok = ratio <= float(m.group(2)) if m.group(1) == "<=" else ratio >= float(m.group(2))
                verdict = ("PASS" if ok else "MISS") + f" (target {target})"
            print(f"{ratio:8.3f}  {label}  {verdict}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BrokenPipeError:  # output cut short by a pager or `head`
        sys.exit(0)
