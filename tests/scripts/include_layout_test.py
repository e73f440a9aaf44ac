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


def tree(files, lines=None):
    """Headers with their includes; `lines` pads a header to that many lines."""
    base = pathlib.Path(tempfile.mkdtemp())
    for name, includes in files.items():
        path = base / name
        path.parent.mkdir(parents=True, exist_ok=True)
        text = ["#pragma once"] + [f'#include "{i}"' for i in includes]
        text += ["// padding"] * ((lines or {}).get(name, 0) - len(text))
        path.write_text("\n".join(text) + "\n")
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
checks = 0


def expect(name, files, fragment, lines=None):
    global checks
    checks += 1
    result = run(tree(files, lines))
    ok = (result.returncode != 0 and fragment in result.stdout) if fragment else result.returncode == 0
    if not ok:
        failures.append(f"{name}: exit {result.returncode}, output:\n{result.stdout}{result.stderr}")


checks += 1
real = run(ROOT / "include")
if real.returncode != 0:
    failures.append(f"the tree's own headers break the layout:\n{real.stdout}")
expect("a layout that keeps the rules", GOOD, None)
expect("rule 1", {**GOOD, "replay/detail/message.hpp": ["replay/router/table.hpp"]}, "(rule 1)")
expect("rule 2", {**GOOD, "replay/pipeline/detail/state.hpp": ["replay/router/detail/keys.hpp"]}, "(rule 2)")
expect("rule 2, from a component's public header", {**GOOD, "replay/pipeline/pipeline.hpp": [
    "replay/pipeline/detail/state.hpp", "replay/router/table.hpp", "replay/router/detail/keys.hpp"]}, "(rule 2)")
expect("rule 2, from a component's umbrella", {**GOOD, "replay/router.hpp": [
    "replay/router/table.hpp", "replay/pipeline/detail/state.hpp"]}, "(rule 2)")
expect("rule 3", {**GOOD, "replay/error.hpp": ["replay/router.hpp"]}, "(rule 3)")
expect("rule 4", {**GOOD, "replay/router/detail/dead.hpp": []}, "(rule 4)")
expect("a missing header", {**GOOD, "replay/error.hpp": ["replay/nowhere.hpp"]}, "does not exist")
expect("graph.hpp is core", {**GOOD, "replay/graph.hpp": [], "replay/graph_builder/builder.hpp": [],
                             "replay/graph_builder.hpp": ["replay/graph_builder/builder.hpp"],
                             "replay/capture.hpp": ["replay/graph.hpp"]}, None)
expect("graph_builder.hpp is the builder's umbrella", {**GOOD, "replay/graph_builder/builder.hpp": [],
                                                       "replay/graph_builder.hpp": ["replay/graph_builder/builder.hpp"],
                                                       "replay/capture.hpp": ["replay/graph_builder.hpp"]}, "(rule 3)")
expect("rule 5", GOOD, "(rule 5)", lines={"replay/router/table.hpp": 451})
expect("rule 5 counts every line, includes too", GOOD, "(rule 5)", lines={"replay/detail/message.hpp": 451})
expect("450 lines are within rule 5", GOOD, None, lines={"replay/router/table.hpp": 450})
OPTIONAL = {"replay/decode.hpp": ["replay/decode/scheduler.hpp"],
            "replay/decode/scheduler.hpp": ["replay/router/table.hpp", "replay/error.hpp"]}
expect("an optional component builds on the others", {**GOOD, **OPTIONAL}, None)
expect("rule 6, replay.hpp", {**GOOD, **OPTIONAL, "replay/replay.hpp": ["replay/router.hpp", "replay/decode.hpp"]},
       "(rule 6)")
expect("rule 6, another component", {**GOOD, **OPTIONAL, "replay/pipeline/pipeline.hpp": [
    "replay/pipeline/detail/state.hpp", "replay/decode/scheduler.hpp"]}, "(rule 6)")
for failure in failures:
    print("FAILED:", failure)
print(f"include layout test: {checks - len(failures)} passed, {len(failures)} failed")
sys.exit(1 if failures else 0)
