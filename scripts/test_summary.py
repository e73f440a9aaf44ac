#!/usr/bin/env python3
"""Closing lines of scripts/test.sh: what passed, failed and was skipped, by
label, and why anything was skipped, from ctest's JUnit output
(ctest --output-junit FILE).

  test_summary.py FILE

Prints, for example:
  host: 140 passed, 0 failed
  gpu: 0 passed, 0 failed, 98 skipped (no CUDA GPU or NVIDIA driver found)
  tests: 140 passed, 0 failed, 98 skipped
Exits 0; the caller keeps ctest's own exit status.
"""
import collections
import re
import sys
import xml.etree.ElementTree as ET

# The test main's line for a program whose gpu cases were skipped (tests/support/test_main.cpp).
GPU_SKIP = re.compile(r"\[replay_test\] (.*?),? so the gpu(?:_multi)? cases were skipped")


def summarize(path):
    root = ET.parse(path).getroot()
    counts = collections.OrderedDict()
    reasons = collections.defaultdict(collections.Counter)
    for case in root.iter("testcase"):
        labels = [p.get("value") for p in case.iter("property") if p.get("name") == "cmake_labels"]
        label = ",".join(sorted(set(",".join(labels).split(",")) - {""})) or "unlabelled"
        status = case.get("status")
        count = counts.setdefault(label, collections.Counter())
        if status == "run":
            count["passed"] += 1
        elif status == "fail":
            count["failed"] += 1
        else:  # notrun, disabled
            count["skipped"] += 1
            out = case.findtext("system-out") or ""
            found = GPU_SKIP.search(out)
            skipped = case.find("skipped")
            reason = found.group(1) if found else (skipped.get("message") if skipped is not None else status)
            reasons[label][reason] += 1
    lines = []
    total = collections.Counter()
    for label, count in counts.items():
        text = f"{label}: {count['passed']} passed, {count['failed']} failed"
        if count["skipped"]:
            why = "; ".join(f"{n} {r}" if len(reasons[label]) > 1 else r for r, n in reasons[label].most_common())
            text += f", {count['skipped']} skipped ({why})"
        lines.append(text)
        total.update(count)
    lines.append(f"tests: {total['passed']} passed, {total['failed']} failed, {total['skipped']} skipped")
    return lines


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    try:
        lines = summarize(sys.argv[1])
    except (OSError, ET.ParseError) as error:
        print(f"test summary: cannot read {sys.argv[1]}: {error}")
        return 0
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
