#!/usr/bin/env python3
"""bench/torch_bert_bench.py's table on made-up rows: the two targets per
shape with PASS and MISS on either side of them, and the bound lines (C++
replay / the bucket's graph launched raw, C++ eager / that graph, that graph /
torch.compile) only at the shapes where the C++ side timed the raw graph; a
missed target says when the raw graph misses it too, and only then."""
import contextlib
import importlib.util
import io
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import named_checks  # noqa: E402

BENCH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench")


def load():
    sys.path.insert(0, BENCH)  # torch_bert_bench imports torch_resnet_bench beside it
    spec = importlib.util.spec_from_file_location("torch_bert_bench", os.path.join(BENCH, "torch_bert_bench.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # must not need torch
    return module


def row(impl, batch, seq, p50):
    return {"impl": impl, "batch": batch, "seq": seq, "p50_ms": p50, "p99_ms": p50 * 1.1}


def main():
    module = load()
    rows = [
        # 8x128: GPU-bound; replay within 5% of the raw graph, eager / replay short of 2x, bounded by eager / raw.
        row("py_compile", 8, 128, 1.012), row("cpp_eager", 8, 128, 1.825), row("cpp_replay", 8, 128, 1.071),
        row("cpp_raw_graph", 8, 128, 1.050),
        # 1x16: host-bound; replay 10% slower than the raw graph (a proposed-target miss).
        row("py_compile", 1, 16, 0.873), row("cpp_eager", 1, 16, 2.238), row("cpp_replay", 1, 16, 0.660),
        row("cpp_raw_graph", 1, 16, 0.600),
        # 2x32: replay misses torch.compile where the raw graph meets it: a plain MISS, no note.
        row("py_compile", 2, 32, 0.700), row("cpp_eager", 2, 32, 1.500), row("cpp_replay", 2, 32, 0.720),
        row("cpp_raw_graph", 2, 32, 0.680),
        # 4x64: an older C++ side, no raw graph: no bound line.
        row("py_compile", 4, 64, 0.862), row("cpp_eager", 4, 64, 2.370), row("cpp_replay", 4, 64, 0.723),
    ]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        module.print_table(rows, {"device": "test", "torch": "t", "transformers": "t"},
                           [(8, 128), (1, 16), (2, 32), (4, 64)])
    lines = out.getvalue().splitlines()
    text = "\n".join(lines)
    bounds = [line for line in lines if line.startswith("  bound ")]
    expected = [
        ("a raw-graph row in the table", any(line.startswith("  C++ bucket's graph, raw launch") for line in lines)),
        ("8x128: compile missed, the raw graph too",
         "target 8x128: C++ replay p50 / torch.compile p50 = 1.058 (<= 1.0): MISS (the raw graph misses too: 1.038)"
         in text),
        ("8x128: eager missed, the raw graph too",
         "C++ eager / C++ replay = 1.70x (>= 2): MISS (the raw graph misses too: 1.74x)" in text),
        ("8x128: replay within 5% of the raw graph",
         "bound 8x128: C++ replay / the bucket's graph launched raw = 1.020 (<= 1.05, proposed): PASS" in text),
        ("8x128: eager / raw bound", "C++ eager / that raw graph = 1.74x (the most eager / replay can be)" in text),
        ("8x128: raw / compile bound",
         "that raw graph / torch.compile = 1.038 (the least replay / torch.compile can be)" in text),
        ("1x16: both targets met", "target 1x16: C++ replay p50 / torch.compile p50 = 0.756 (<= 1.0): PASS; "
         "C++ eager / C++ replay = 3.39x (>= 2): PASS\n" in text + "\n"),
        ("1x16: replay 10% over the raw graph",
         "bound 1x16: C++ replay / the bucket's graph launched raw = 1.100 (<= 1.05, proposed): MISS" in text),
        ("2x32: a miss the raw graph does not share has no note",
         "target 2x32: C++ replay p50 / torch.compile p50 = 1.029 (<= 1.0): MISS; C++ eager" in text),
        ("4x64: no bound line without a raw graph", len(bounds) == 3 and not any("4x64" in b for b in bounds)),
        ("4x64: no note without a raw graph", "target 4x64" in text and "misses too" not in
         next(line for line in lines if line.startswith("  target 4x64"))),
    ]
    return named_checks.report("bert_table_test", expected, text)


if __name__ == "__main__":
    sys.exit(main())
