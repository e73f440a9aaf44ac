#!/usr/bin/env python3
"""scripts/include_layout.py: the real tree passes, and each rule fires on a
made-up tree that breaks it (so the check cannot pass by seeing nothing)."""
import pathlib
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "include_layout.py"


def run(root):
    return subprocess.run([sys.executable, str(SCRIPT), "--root", str(root)], capture_output=True, text=True)


def tree(files):
    base = pathlib.Path(tempfile.mkdtemp())
    for name, includes in files.items():
        path = base / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("#pragma once\n" + "".join(f'#include "{i}"\n' for i in includes))
    return base


GOOD = {
    "replay/error.hpp": [],
    "replay/detail/message.hpp": ["replay/error.hpp"],
    "replay/router.hpp": ["replay/router/table.hpp"],
    "replay/router/table.hpp": ["replay/router/detail/table.hpp", "replay/detail/message.hpp"],
    "replay/router/detail/table.hpp": ["replay/router/detail/keys.hpp"],
    "replay/router/detail/keys.hpp": ["replay/error.hpp"],
    "replay/pipeline/pipeline.hpp": ["replay/pipeline/detail/state.hpp", "replay/router/table.hpp"],
    "replay/pipeline/detail/state.hpp": [],
    "replay/replay.hpp": ["replay/router.hpp"],
}

failures = []


def expect(name, files, fragment):
    result = run(tree(files))
    ok = (result.returncode != 0 and fragment in result.stdout) if fragment else result.returncode == 0
    if not ok:
        failures.append(f"{name}: exit {result.returncode}, output:\n{result.stdout}{result.stderr}")


real = run(ROOT / "include")
if real.returncode != 0:
    failures.append(f"the tree's own headers break the layout:\n{real.stdout}")
expect("a layout that keeps the rules", GOOD, None)
expect("rule 1", {**GOOD, "replay/detail/message.hpp": ["replay/router/table.hpp"]}, "(rule 1)")
expect("rule 2", {**GOOD, "replay/pipeline/detail/state.hpp": ["replay/router/detail/keys.hpp"]}, "(rule 2)")
expect("rule 3", {**GOOD, "replay/error.hpp": ["replay/router.hpp"]}, "(rule 3)")
expect("rule 4", {**GOOD, "replay/router/detail/dead.hpp": []}, "(rule 4)")
expect("a missing header", {**GOOD, "replay/error.hpp": ["replay/nowhere.hpp"]}, "does not exist")
expect("graph.hpp is core", {**GOOD, "replay/graph.hpp": [], "replay/graph/builder.hpp": [],
                             "replay/graph_builder.hpp": ["replay/graph/builder.hpp"],
                             "replay/capture.hpp": ["replay/graph.hpp"]}, None)
expect("graph_builder.hpp is the graph component", {**GOOD, "replay/graph/builder.hpp": [],
                                                    "replay/graph_builder.hpp": ["replay/graph/builder.hpp"],
                                                    "replay/capture.hpp": ["replay/graph_builder.hpp"]}, "(rule 3)")
for failure in failures:
    print("FAILED:", failure)
print(f"include layout test: {8 + 1 - len(failures)} passed, {len(failures)} failed")
sys.exit(1 if failures else 0)
