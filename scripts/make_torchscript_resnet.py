#!/usr/bin/env python3
"""Writes torchvision's ResNet-50 with random weights (nothing is downloaded)
as a TorchScript file, for the torch_resnet example and the torch benchmark.

    python3 scripts/make_torchscript_resnet.py OUT.pt [--seed N]

The model is traced in eval mode, in fp32, on the CPU; the C++ side moves it to
the GPU and to fp16 itself. Tracing (not scripting) keeps the graph free of
Python control flow; ResNet-50 has none that depends on the input.
"""
import argparse
import os
import sys
import time


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("output", help="where to write the TorchScript file")
    parser.add_argument("--seed", type=int, default=0, help="seed for the random weights")
    args = parser.parse_args()

    start = time.perf_counter()
    try:
        import torch
        import torchvision
    except ImportError as exc:
        print(f"make_torchscript_resnet: needs torch and torchvision ({exc})", file=sys.stderr)
        return 1

    torch.manual_seed(args.seed)
    model = torchvision.models.resnet50(weights=None).eval()
    example = torch.randn(1, 3, 224, 224)
    with torch.no_grad():
        traced = torch.jit.trace(model, example)
        # The traced module must compute what the Python one does.
        err = (traced(example) - model(example)).abs().max().item()
    if err > 1e-4:
        print(f"make_torchscript_resnet: traced model differs from eager by {err}", file=sys.stderr)
        return 1
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    traced.save(args.output)
    size_mb = os.path.getsize(args.output) / 2**20
    print(f"make_torchscript_resnet: wrote {args.output} ({size_mb:.0f} MiB, torch {torch.__version__}, "
          f"torchvision {torchvision.__version__}) in {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
