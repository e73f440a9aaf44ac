#!/usr/bin/env python3
"""scripts/test_summary.py: counts per label and the reason for each skip,
from made-up ctest JUnit output."""
import pathlib
import subprocess
import sys
import tempfile

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "test_summary.py"


def case(name, status, label, out="", skipped=None):
    extra = f'<skipped message="{skipped}"/>' if skipped else ("<failure message=\"Failed\"/>" if status == "fail" else "")
    return (f'<testcase name="{name}" classname="{name}" time="0.1" status="{status}">{extra}'
            f'<properties><property name="cmake_labels" value="{label}"/></properties>'
            f"<system-out>{out}</system-out></testcase>")


XML = ('<?xml version="1.0" encoding="UTF-8"?><testsuite name="x" tests="6">'
       + case("a", "run", "host") + case("b", "run", "host") + case("c", "fail", "host")
       + case("d", "notrun", "gpu", "[replay_test] no CUDA GPU or NVIDIA driver found, so the gpu cases were "
              "skipped (not passed)\n", "SKIP_RETURN_CODE=77")
       + case("e", "notrun", "gpu", "[replay_test] no CUDA GPU or NVIDIA driver found, so the gpu cases were "
              "skipped (not passed)\n", "SKIP_RETURN_CODE=77")
       + case("f", "notrun", "package", "", "SKIP_REGULAR_EXPRESSION_MATCHED")
       + "</testsuite>")

path = pathlib.Path(tempfile.mkdtemp()) / "results.xml"
path.write_text(XML)
out = subprocess.run([sys.executable, str(SCRIPT), str(path)], capture_output=True, text=True).stdout.splitlines()
expected = [
    "host: 2 passed, 1 failed",
    "gpu: 0 passed, 0 failed, 2 skipped (no CUDA GPU or NVIDIA driver found)",
    "package: 0 passed, 0 failed, 1 skipped (SKIP_REGULAR_EXPRESSION_MATCHED)",
    "tests: 2 passed, 1 failed, 3 skipped",
]
if out != expected:
    print("FAILED: expected\n  " + "\n  ".join(expected) + "\ngot\n  " + "\n  ".join(out))
    sys.exit(1)
print("test summary test: 1 passed, 0 failed")
