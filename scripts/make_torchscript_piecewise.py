#!/usr/bin/env python3
"""Writes the piecewise benchmark's model with random weights as two TorchScript
files: DIR/readback.pt (24 residual blocks of width 1024 with a read-back
halfway, `if float(h.abs().max()) > 1e4: h = h.clamp(...)`) and DIR/whole.pt
(the same weights, without the read-back: what one whole graph can hold).

    python3 scripts/make_torchscript_piecewise.py DIR [--seed N]

The modules are scripted (the branch on the read-back is TorchScript control
flow) in fp32 on the CPU; the C++ side moves them to the GPU and to fp16.
bench/torch_piecewise_bench.py imports PiecewiseModel from here for its peer.
"""
import argparse
import os
import sys
import time

import torch

WIDTH = 1024
BLOCKS = 24
THRESHOLD = 1e4


class PiecewiseModel(torch.nn.Module):
    def __init__(self, read_back: bool = True, width: int = WIDTH, blocks: int = BLOCKS):
        super().__init__()
        self.read_back = read_back
        self.first = torch.nn.ModuleList([torch.nn.Linear(width, width) for _ in range(blocks // 2)])
        self.second = torch.nn.ModuleList([torch.nn.Linear(width, width) for _ in range(blocks - blocks // 2)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x
        for block in self.first:
            h = h + torch.relu(block(h))
        if self.read_back:
            if float(h.abs().max()) > 10000.0:
                h = h.clamp(-10000.0, 10000.0)
        for block in self.second:
            h = h + torch.relu(block(h))
        return h


def make(seed: int):
    torch.manual_seed(seed)
    with_read_back = PiecewiseModel(True).eval()
    for p in with_read_back.parameters():
        p.data.mul_(0.5)  # keeps activations of random inputs far below the threshold through 24 blocks
    whole = PiecewiseModel(False).eval()
    whole.load_state_dict(with_read_back.state_dict())
    return with_read_back, whole


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("output", help="the directory to write readback.pt and whole.pt into")
    parser.add_argument("--seed", type=int, default=0, help="seed for the random weights")
    args = parser.parse_args()
    start = time.perf_counter()
    with_read_back, whole = make(args.seed)
    os.makedirs(args.output, exist_ok=True)
    example = torch.randn(2, WIDTH)
    with torch.no_grad():
        for name, model in (("readback.pt", with_read_back), ("whole.pt", whole)):
            scripted = torch.jit.script(model)
            err = (scripted(example) - model(example)).abs().max().item()
            if err > 1e-4:
                print(f"make_torchscript_piecewise: scripted {name} differs from eager by {err}", file=sys.stderr)
                return 1
            scripted.save(os.path.join(args.output, name))
    print(f"make_torchscript_piecewise: wrote {args.output}/readback.pt and whole.pt (torch {torch.__version__}) "
          f"in {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
