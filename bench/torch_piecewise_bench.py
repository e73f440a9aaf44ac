#!/usr/bin/env python3
"""The Python half of the piecewise torch benchmark: the model of
scripts/make_torchscript_piecewise.py (24 residual blocks of width 1024, fp16,
a read-back halfway: `if float(h.abs().max()) > 1e4: h = h.clamp(...)`, same
seed, same weights) as PyTorch eager and torch.compile(mode="reduce-overhead"),
whose graph breaks at the read-back, timed as bench/torch_resnet_bench.py
times its peers (one call then torch.cuda.synchronize(), host clock, p50).

    python3 bench/torch_piecewise_bench.py [--batches 1,8,64] [--cpp-json CPP] [--json OUT]

With --cpp-json (torch_piecewise_bench's --json output) it prints the target:
C++ piecewise p50 <= torch.compile reduce-overhead p50 at every batch.
"""
import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "scripts"))
from torch_resnet_bench import measure  # noqa: E402  (the same timing loop)
from make_torchscript_piecewise import make  # noqa: E402  (the same model and weights)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", default="1,8,64")
    parser.add_argument("--iterations", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0, help="the weights' seed (as make_torchscript_piecewise.py)")
    parser.add_argument("--cpp-json", help="torch_piecewise_bench's --json output")
    parser.add_argument("--json", help="where to write the Python rows")
    args = parser.parse_args()
    import torch

    batches = [int(b) for b in args.batches.split(",")]
    model, _ = make(args.seed)
    model = model.to("cuda", torch.float16)
    compiled = torch.compile(model, mode="reduce-overhead")
    rows = []
    with torch.inference_mode():
        for b in batches:
            torch.manual_seed(b)
            x = torch.randn(b, 1024, device="cuda", dtype=torch.float16)
            big = torch.randn(b, 1024, device="cuda", dtype=torch.float16) * 5e3
            # The compiled model takes both branches too (its guard on the read-back).
            for probe in (x, big):
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
    if args.cpp_json:
        try:
            with open(args.cpp_json) as f:
                cpp = {r["batch"]: r for r in json.load(f).get("rows", [])}
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
