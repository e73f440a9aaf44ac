#!/usr/bin/env python3
"""The Python half of the BERT benchmark: a BERT-base-sized encoder
(transformers.BertConfig(), random weights, fp16) timed as PyTorch eager and
torch.compile(mode="reduce-overhead", dynamic=False: one compilation per
shape) at the shapes examples/torch_bert times C++ eager and C++ replay (one
call then torch.cuda.synchronize() per iteration, host clock, p50/p99),
inputs int64 input_ids and an all-ones attention_mask [batch, sequence].

    python3 bench/torch_bert_bench.py [--shapes 1x16,8x128,...] [--json OUT]
                                      [--cpp-json CPP] [--compile-budget-s S]

With --cpp-json (torch_bert's --json output) it prints one side-by-side table
and the targets: C++ replay p50 <= torch.compile p50 at every measured shape,
and C++ eager p50 / C++ replay p50 >= 2. Where the C++ side also timed the
shape's bucket as a graph without replay (torch's CUDAGraph, raw
cudaGraphLaunch), it prints per shape C++ replay / that raw graph (<= 1.05,
the target we propose: what replay's routing and copies cost) and C++ eager /
the raw graph, the most that eager / replay can be there, and the raw graph /
torch.compile, the least that replay / torch.compile can be; a target that
replay misses and the raw graph misses too says so beside its MISS. torch.compile runs
last, shape by shape, while its budget lasts.
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_resnet_bench import measure, save_and_merge, verdict  # noqa: E402  (the same timing loop)

DEFAULT_SHAPES = "1x16,8x128,4x64,1x128,8x16,3x40"  # torch.compile goes in this order
LABELS = {
    "py_eager": "PyTorch eager (Python)",
    "py_compile": "torch.compile reduce-overhead",
    "cpp_eager": "C++ eager (prepared TorchScript)",
    "cpp_replay": "C++ replay (2-D buckets)",
    "cpp_raw_graph": "C++ bucket's graph, raw launch",
}


def iterations_for(batch, seq, forced):
    if forced:
        return forced
    return 300 if batch * seq <= 256 else 150


def run_python(args, shapes):
    import torch
    import transformers
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    model = BertModel(BertConfig()).eval().to("cuda", torch.float16)
    inputs = {}
    for b, s in shapes:
        ids = torch.randint(1, 30522, (b, s), device="cuda")
        inputs[(b, s)] = (ids, torch.ones_like(ids))
    rows = []
    with torch.inference_mode():
        for (b, s), (ids, mask) in inputs.items():
            n = iterations_for(b, s, args.iterations)
            rows.append({"impl": "py_eager", "batch": b, "seq": s,
                         **measure(torch, lambda: model(input_ids=ids, attention_mask=mask), n, max(10, n // 10), b)})
        if not args.skip_compile:
            try:
                compiled = torch.compile(model, mode="reduce-overhead", dynamic=False)
                deadline = time.perf_counter() + args.compile_budget_s
                for (b, s), (ids, mask) in inputs.items():
                    if time.perf_counter() > deadline:
                        print(f"torch.compile: budget spent, {b}x{s} not measured", file=sys.stderr)
                        break

                    def call():
                        torch.compiler.cudagraph_mark_step_begin()
                        return compiled(input_ids=ids, attention_mask=mask)

                    start = time.perf_counter()
                    for _ in range(3):  # compile, then the CUDA-graph warm-up and recording runs
                        call()
                    torch.cuda.synchronize()
                    compile_s = time.perf_counter() - start
                    n = max(50, iterations_for(b, s, args.iterations) // 2)
                    rows.append({"impl": "py_compile", "batch": b, "seq": s, "compile_s": compile_s,
                                 **measure(torch, call, n, 10, b)})
            except Exception as exc:  # report, keep the rest
                print(f"torch.compile failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}",
                      file=sys.stderr)
    meta = {"torch": torch.__version__, "transformers": transformers.__version__,
            "device": torch.cuda.get_device_name(), "dtype": "fp16"}
    return rows, meta


def print_table(rows, meta, shapes):
    by = {(r["impl"], r["batch"], r.get("seq")): r for r in rows}
    print(f"BERT-base fp16 on {meta.get('device', '?')}, torch {meta.get('torch', '?')}, transformers "
          f"{meta.get('transformers', '?')}: p50 / p99 ms")
    print(f"  {'':33}" + "".join(f"| {f'{b}x{s}':<13} " for b, s in shapes))
    for impl, label in LABELS.items():
        if not any((impl, b, s) in by for b, s in shapes):
            continue
        line = f"  {label:33}"
        for b, s in shapes:
            r = by.get((impl, b, s))
            line += f"| {r['p50_ms']:6.3f} {r['p99_ms']:6.3f} " if r else f"| {'-':>6} {'-':>6} "
        print(line)

    for b, s in shapes:
        replay, compiled, eager, raw = (by.get((i, b, s)) for i in ("cpp_replay", "py_compile", "cpp_eager",
                                                                    "cpp_raw_graph"))
        vs_compile = replay["p50_ms"] / compiled["p50_ms"] if replay and compiled else None
        vs_eager = eager["p50_ms"] / replay["p50_ms"] if replay and eager else None
        # A miss that the bucket's graph launched raw, without replay, misses
        # too is the kernels' and the host's, not replay's: said beside it.
        compile_bound = eager_bound = ""
        if raw and vs_compile is not None and vs_compile > 1.0 and raw["p50_ms"] / compiled["p50_ms"] > 1.0:
            compile_bound = f" (the raw graph misses too: {raw['p50_ms'] / compiled['p50_ms']:.3f})"
        if raw and vs_eager is not None and vs_eager < 2.0 and eager["p50_ms"] / raw["p50_ms"] < 2.0:
            eager_bound = f" (the raw graph misses too: {eager['p50_ms'] / raw['p50_ms']:.2f}x)"
        print(f"  target {b}x{s}: C++ replay p50 / torch.compile p50 = "
              f"{vs_compile if vs_compile is not None else float('nan'):.3f} (<= 1.0): "
              f"{verdict(None if vs_compile is None else vs_compile <= 1.0)}{compile_bound}; "
              f"C++ eager / C++ replay = {vs_eager if vs_eager is not None else float('nan'):.2f}x (>= 2): "
              f"{verdict(None if vs_eager is None else vs_eager >= 2.0)}{eager_bound}")
    for b, s in shapes:
        replay, raw, eager, compiled = (by.get((i, b, s)) for i in ("cpp_replay", "cpp_raw_graph", "cpp_eager",
                                                                     "py_compile"))
        if not (replay and raw):
            continue
        vs_raw = replay["p50_ms"] / raw["p50_ms"]
        line = (f"  bound {b}x{s}: C++ replay / the bucket's graph launched raw = {vs_raw:.3f} "
                f"(<= 1.05, proposed): {verdict(vs_raw <= 1.05)}")
        if eager:
            line += (f"; C++ eager / that raw graph = {eager['p50_ms'] / raw['p50_ms']:.2f}x "
                     "(the most eager / replay can be)")
        if compiled:
            line += (f"; that raw graph / torch.compile = {raw['p50_ms'] / compiled['p50_ms']:.3f} "
                     "(the least replay / torch.compile can be)")
        print(line)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", default=DEFAULT_SHAPES, help="BATCHxSEQ,... (torch.compile goes in this order)")
    parser.add_argument("--iterations", type=int, default=0)
    parser.add_argument("--json", help="write the Python rows here")
    parser.add_argument("--cpp-json", help="torch_bert's --json output, to merge into the table")
    parser.add_argument("--compile-budget-s", type=float, default=90.0,
                        help="no new torch.compile shape is started after this many seconds")
    parser.add_argument("--skip-compile", action="store_true")
    args = parser.parse_args()
    shapes = [tuple(int(v) for v in part.lower().split("x")) for part in args.shapes.split(",")]

    try:
        import torch
        import transformers  # noqa: F401
    except ImportError:
        print("torch_bert_bench.py: needs torch and transformers", file=sys.stderr)
        return 1
    if not torch.cuda.is_available():
        print("torch_bert_bench.py: no CUDA device; nothing to measure.")
        return 0
    rows, meta = run_python(args, shapes)
    print_table(save_and_merge(rows, meta, args, "torch_bert_bench.py"), meta, shapes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
