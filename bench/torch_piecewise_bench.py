#!/usr/bin/env python3
"""The Python half of the piecewise torch benchmark: the model of
scripts/make_torchscript_piecewise.py (24 residual blocks of width 1024, fp16,
a read-back halfway: `if float(h.abs().max()) > 1e4: h = h.clamp(...)`, same
seed, same weights) as PyTorch eager and torch.compile(mode="reduce-overhead"),
whose graph breaks at the read-back, timed as bench/torch_resnet_bench.py
times its peers (one call then torch.cuda.synchronize(), host clock, p50).

    python3 bench/torch_piecewise_bench.py [--batches 1,8,64] [--cpp-json CPP] [--json OUT]

torch.compile gets its best settings for this model: fullgraph=False (dynamo
breaks the graph at the read-back and graphs each side: cudagraph trees),
dynamic=False (one graph specialized per batch, as the C++ side has one per
batch), 20 warm-up calls per batch after both branches were taken; the cuBLAS
settings (torch.backends.cuda.matmul) are left at libtorch's defaults, which
the C++ side uses too, and printed.

With --cpp-json (torch_piecewise_bench's --json output) it prints a summary
line per batch, each ratio with its target and PASS or MISS: torch.compile /
C++ piecewise (>= 1.0), C++ piecewise / whole graph without the read-back
(<= 1.10; beside it, the same break written by hand in raw CUDA / whole
graph), C++ piecewise / a whole graph with the read-back's kernels, the value
left on the GPU (<= 1.10, the target we propose: it leaves out only the break
itself, the wait for the value and the second launch; with the two parts of
the break in microseconds), replay's break against the hand-written one, each
as its split / a whole graph of its own kernels (<= 1.05: replay's break costs
no more than writing it by hand; the hand-written break runs the blocks as
separate ATen operators, other kernels than the TorchScript model's), C++
piecewise / the hand-written raw split and / the one with torch's
CUDAGraph::replay() (reported: other kernels), C++ eager /
piecewise (>= 3 at batch 1), the key's pool / the whole graph's pool (<= 1.10,
one pool); and one per BERT shape when the C++ side measured BERT with a
read-back (--bert).
"""
import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def verdict(value, target, at_least):
    ok = value >= target if at_least else value <= target
    return f"{value:.2f}x ({'>=' if at_least else '<='} {target:.2f} {'PASS' if ok else 'MISS'})"


def summary(rows, cpp, bert_rows):
    for r in rows:
        c = cpp.get(r["batch"])
        if c is None:
            print(f"  summary b={r['batch']}: n/a (no C++ row)")
            continue
        whole = f"piecewise / whole {verdict(c['cpp_piecewise_ms'] / c['cpp_whole_ms'], 1.10, False)}"
        if "cpp_raw_ms" in c:
            whole += f", raw CUDA break by hand / whole {c['cpp_raw_ms'] / c['cpp_whole_ms']:.2f}x"
        parts = [f"torch.compile / piecewise {verdict(r['py_compile_ms'] / c['cpp_piecewise_ms'], 1.0, True)}", whole]
        if "cpp_whole_kernels_ms" in c:
            kernels = c["cpp_whole_kernels_ms"]
            parts.append(f"piecewise / whole with the read-back's kernels "
                         f"{verdict(c['cpp_piecewise_ms'] / kernels, 1.10, False)} proposed, "
                         f"those kernels {(kernels - c['cpp_whole_ms']) * 1e3:.1f} us, "
                         f"the break without them {(c['cpp_piecewise_ms'] - kernels) * 1e3:.1f} us")
        if "cpp_hand_whole_ms" in c:
            relative = (c["cpp_piecewise_ms"] / c["cpp_whole_ms"]) / (c["cpp_raw_ms"] / c["cpp_hand_whole_ms"])
            parts.append(f"break / the hand-written break, each against a whole graph of its own kernels "
                         f"{verdict(relative, 1.05, False)}")
        if "cpp_raw_ms" in c:
            parts.append(f"piecewise / raw CUDA break by hand {c['cpp_piecewise_ms'] / c['cpp_raw_ms']:.2f}x, "
                         f"/ torch CUDAGraph by hand {c['cpp_piecewise_ms'] / c['cpp_by_hand_ms']:.2f}x (other kernels)")
        eager = c["cpp_eager_ms"] / c["cpp_piecewise_ms"]
        parts.append(f"eager / piecewise {verdict(eager, 3.0, True)}" if r["batch"] == 1 else
                     f"eager / piecewise {eager:.2f}x")
        parts.append(pool_part(c))
        print(f"  summary b={r['batch']}: " + " | ".join(parts))
    for c in bert_rows:
        print(f"  summary BERT {c['shape']}: piecewise / whole {verdict(c['cpp_piecewise_ms'] / c['cpp_whole_ms'], 1.10, False)}"
              f" | eager / piecewise {c['cpp_eager_ms'] / c['cpp_piecewise_ms']:.2f}x | {pool_part(c)}"
              f" | bit for bit {'PASS' if c.get('equal') else 'MISS'}")


def pool_part(c):
    if not c.get("whole_pool_bytes"):
        return "pool n/a"
    ratio = c["piecewise_pool_bytes"] / c["whole_pool_bytes"]
    one = "one pool" if c.get("one_pool") else "NOT one pool: MISS"
    return f"pool / whole pool {verdict(ratio, 1.10, False)}, {one}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", default="1,8,64")
    parser.add_argument("--iterations", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0, help="the weights' seed (as make_torchscript_piecewise.py)")
    parser.add_argument("--cpp-json", help="torch_piecewise_bench's --json output")
    parser.add_argument("--json", help="where to write the Python rows")
    args = parser.parse_args()
    # Imported here, so that summary() can be tested without torch.
    sys.path.insert(0, HERE)
    sys.path.insert(0, os.path.join(HERE, "..", "scripts"))
    import torch
    from make_torchscript_piecewise import make  # the same model and weights
    from torch_resnet_bench import measure  # the same timing loop

    matmul = torch.backends.cuda.matmul
    print(f"  cuBLAS settings (libtorch's defaults, as on the C++ side): allow_tf32={matmul.allow_tf32} "
          f"allow_fp16_reduced_precision_reduction={matmul.allow_fp16_reduced_precision_reduction} "
          f"allow_bf16_reduced_precision_reduction={matmul.allow_bf16_reduced_precision_reduction}",
          file=sys.stderr)
    batches = [int(b) for b in args.batches.split(",")]
    model = make(args.seed)[0]
    model = model.to("cuda", torch.float16)
    compiled = torch.compile(model, mode="reduce-overhead", fullgraph=False, dynamic=False)
    rows = []
    with torch.inference_mode():
        for b in batches:
            torch.manual_seed(b)
            x = torch.randn(b, 1024, device="cuda", dtype=torch.float16)
            big = torch.randn(b, 1024, device="cuda", dtype=torch.float16) * 5e3
            # The compiled model takes both branches too (its guard on the read-back).
            for probe in (x, big, x, big):
                same = torch.equal(compiled(probe), model(probe))
                print(f"  batch {b}: torch.compile equals eager bit for bit: {same}", file=sys.stderr)
            n = args.iterations
            eager = measure(torch, lambda: model(x), n, 20, b)
            comp = measure(torch, lambda: compiled(x), n, 20, b)
            rows.append({"batch": b, "py_eager_ms": eager["p50_ms"], "py_compile_ms": comp["p50_ms"]})
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "torch": torch.__version__}, f, indent=1)
    cpp = {}
    bert_rows = []
    if args.cpp_json:
        try:
            with open(args.cpp_json) as f:
                loaded = json.load(f)
            cpp = {r["batch"]: r for r in loaded.get("rows", [])}
            bert_rows = loaded.get("bert_rows", [])
        except (OSError, ValueError) as exc:
            print(f"torch_piecewise_bench.py: could not read {args.cpp_json}: {exc}", file=sys.stderr)
    print(f"Piecewise model (24 x 1024, fp16, a read-back halfway), torch {torch.__version__}: p50 ms")
    print(f"  {'batch':>5} {'py eager':>9} {'compile':>9} {'C++ eager':>9} {'C++ piecewise':>13} {'C++ whole':>9}")
    for r in rows:
        c = cpp.get(r["batch"], {})
        fmt = lambda v: f"{v:9.3f}" if isinstance(v, (int, float)) else f"{'n/a':>9}"  # noqa: E731
        print(f"  {r['batch']:>5} {fmt(r['py_eager_ms'])} {fmt(r['py_compile_ms'])} {fmt(c.get('cpp_eager_ms'))} "
              f"{fmt(c.get('cpp_piecewise_ms')):>13} {fmt(c.get('cpp_whole_ms'))}")
    for r in rows:
        c = cpp.get(r["batch"])
        if c is None:
            print(f"  target C++ piecewise >= 1.0x torch.compile reduce-overhead, batch {r['batch']}: n/a (no C++ row)")
            continue
        ratio = r["py_compile_ms"] / c["cpp_piecewise_ms"]
        print(f"  target C++ piecewise >= 1.0x torch.compile reduce-overhead, batch {r['batch']}: {ratio:.2f}x "
              f"{'met' if ratio >= 1.0 else 'MISSED'}")
    if cpp or bert_rows:
        summary(rows, cpp, bert_rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
