#!/usr/bin/env python3
"""bench/torch_piecewise_bench.py's summary on made-up rows: each ratio with
its target, PASS and MISS on either side of it, the hand-written break's
ratios only where the C++ side measured it, and no row where it did not."""
import contextlib
import importlib.util
import io
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import named_checks  # noqa: E402

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench", "torch_piecewise_bench.py")


def load():
    spec = importlib.util.spec_from_file_location("torch_piecewise_bench", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # must not need torch
    return module


def cpp_row(batch, piecewise, whole, eager, raw=None, by_hand=None, pool=(2, 2), one_pool=True, kernels=None,
            hand_whole=None):
    row = {"batch": batch, "cpp_eager_ms": eager, "cpp_piecewise_ms": piecewise, "cpp_whole_ms": whole,
           "piecewise_pool_bytes": pool[0], "whole_pool_bytes": pool[1], "one_pool": one_pool, "equal": True}
    if raw is not None:
        row.update(cpp_raw_ms=raw, cpp_by_hand_ms=by_hand)
    if kernels is not None:
        row.update(cpp_whole_kernels_ms=kernels)
    if hand_whole is not None:
        row.update(cpp_hand_whole_ms=hand_whole)
    return row


def summary_lines(module, rows, cpp, bert_rows=()):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        module.summary(rows, cpp, list(bert_rows))
    return out.getvalue().splitlines()


def main():
    module = load()
    rows = [{"batch": 1, "py_eager_ms": 0.9, "py_compile_ms": 0.31},
            {"batch": 8, "py_eager_ms": 0.9, "py_compile_ms": 0.30},
            {"batch": 32, "py_eager_ms": 1.0, "py_compile_ms": 0.33},
            {"batch": 64, "py_eager_ms": 1.3, "py_compile_ms": 0.38},
            {"batch": 128, "py_eager_ms": 1.5, "py_compile_ms": 0.40}]
    cpp = {
        # Within every target; replay's break, against its own whole graph, as the hand-written one's.
        1: cpp_row(1, piecewise=0.174, whole=0.162, eager=0.569, raw=0.209, by_hand=0.217, kernels=0.166,
                   hand_whole=0.196),
        # Replay's break costlier than the hand-written one; eager short of 3x (not judged past batch 1).
        8: cpp_row(8, piecewise=0.214, whole=0.190, eager=0.5, raw=0.200, by_hand=0.230, kernels=0.193,
                   hand_whole=0.195),
        # An older C++ side: the hand-written split without its whole graph: reported, not judged.
        32: cpp_row(32, piecewise=0.180, whole=0.165, eager=0.6, raw=0.215, by_hand=0.220),
        # A run without the hand-written break (an older C++ side): no such parts; one pool missing.
        64: cpp_row(64, piecewise=0.191, whole=0.170, eager=0.768, pool=(3, 2), one_pool=False),
    }
    lines = summary_lines(module, rows, cpp)
    if len(lines) != 5:
        print(f"FAILED: one line per batch, got {lines}")
        return 1
    b1, b8, b32, b64, b128 = lines
    bert = [{"shape": "8x128", "cpp_eager_ms": 2.453, "cpp_piecewise_ms": 0.959, "cpp_whole_ms": 1.028,
             "piecewise_pool_bytes": 22, "whole_pool_bytes": 22, "one_pool": True, "equal": False}]
    (line,) = summary_lines(module, [], {}, bert)
    expected = [
        ("batch 1: compile / piecewise", "torch.compile / piecewise 1.78x (>= 1.00 PASS)" in b1),
        ("batch 1: piecewise / whole", "piecewise / whole 1.07x (<= 1.10 PASS)" in b1),
        ("batch 1: the hand-written break / whole", "raw CUDA break by hand / whole 1.29x" in b1),
        ("batch 1: the break against the hand-written break",
         "break / the hand-written break, each against a whole graph of its own kernels 1.01x (<= 1.05 PASS)" in b1),
        ("batch 1: against the hand-written splits, reported",
         "piecewise / raw CUDA break by hand 0.83x, / torch CUDAGraph by hand 0.80x (other kernels)" in b1),
        ("batch 1: eager judged", "eager / piecewise 3.27x (>= 3.00 PASS)" in b1),
        ("batch 1: pool", "pool / whole pool 1.00x (<= 1.10 PASS), one pool" in b1),
        ("batch 1: the proposed target against the read-back's kernels",
         "piecewise / whole with the read-back's kernels 1.05x (<= 1.10 PASS) proposed, those kernels 4.0 us, "
         "the break without them 8.0 us" in b1),
        ("batch 8: piecewise / whole missed", "piecewise / whole 1.13x (<= 1.10 MISS)" in b8),
        ("batch 8: the proposed target missed", "whole with the read-back's kernels 1.11x (<= 1.10 MISS)" in b8),
        ("batch 8: costlier than by hand",
         "break / the hand-written break, each against a whole graph of its own kernels 1.10x (<= 1.05 MISS)" in b8),
        ("batch 32: the split reported", "piecewise / raw CUDA break by hand 0.84x" in b32),
        ("batch 32: no judgement without the hand-written whole graph", "the hand-written break" not in b32),
        ("batch 8: eager reported, not judged", "eager / piecewise 2.34x |" in b8 and ">= 3.00" not in b8),
        ("batch 64: no hand-written parts", "by hand" not in b64),
        ("batch 64: no kernels-only graph measured", "read-back's kernels" not in b64),
        ("batch 64: pool missed", "pool / whole pool 1.50x (<= 1.10 MISS), NOT one pool: MISS" in b64),
        ("batch 128: no C++ row", b128 == "  summary b=128: n/a (no C++ row)"),
        ("BERT: piecewise / whole", "summary BERT 8x128: piecewise / whole 0.93x (<= 1.10 PASS)" in line),
        ("BERT: outputs unequal", line.endswith("bit for bit MISS")),
    ]
    return named_checks.report("piecewise_summary_test", expected)


if __name__ == "__main__":
    sys.exit(main())
