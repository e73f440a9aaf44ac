#!/usr/bin/env python3
"""Writes the piecewise benchmark's model with random weights as three TorchScript
files: DIR/readback.pt (24 residual blocks of width 1024 with a read-back
halfway, `if float(h.abs().max()) > 1e4: h = h.clamp(...)`), DIR/whole.pt
(the same weights, without the read-back: what one whole graph can hold) and
DIR/kernels.pt (the same weights and the read-back's kernels, `h.abs().max()`
computed halfway and returned beside the output, left on the GPU: the
piecewise model's work without the break itself, the wait for the value and
the second launch).

    python3 scripts/make_torchscript_piecewise.py DIR [--seed N]

The modules are scripted (the branch on the read-back is TorchScript control
flow) in fp32 on the CPU; the C++ side moves them to the GPU and to fp16.
bench/torch_piecewise_bench.py imports PiecewiseModel from here for its peer.
"""
import argparse
import os
import sys
import time
from typing import Tuple

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


class ReadBackKernelsModel(PiecewiseModel):
    """The read-back's kernels without the read-back: the maximum is computed
    where PiecewiseModel reads it back, and returned beside the output."""

    def __init__(self, width: int = WIDTH, blocks: int = BLOCKS):
        super().__init__(False, width, blocks)

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        h = x
        for block in self.first:
            h = h + torch.relu(block(h))
        largest = h.abs().max()
        for block in self.second:
            h = h + torch.relu(block(h))
        return h, largest


def make(seed: int):
    """The read-back model, the same weights without the read-back, and with its kernels only."""
    torch.manual_seed(seed)
    with_read_back = PiecewiseModel(True).eval()
    for p in with_read_back.parameters():
        p.data.mul_(0.5)  # keeps activations of random inputs far below the threshold through 24 blocks
    whole = PiecewiseModel(False).eval()
    whole.load_state_dict(with_read_back.state_dict())
    kernels = ReadBackKernelsModel().eval()
    kernels.load_state_dict(with_read_back.state_dict())
    return with_read_back, whole, kernels


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("output", help="the directory to write readback.pt, whole.pt and kernels.pt into")
    parser.add_argument("--seed", type=int, default=0, help="seed for the random weights")
    args = parser.parse_args()
    start = time.perf_counter()
    with_read_back, whole, kernels = make(args.seed)
    os.makedirs(args.output, exist_ok=True)
    example = torch.randn(2, WIDTH)
    with torch.no_grad():
        for name, model in (("readback.pt", with_read_back), ("whole.pt", whole), ("kernels.pt", kernels)):
            scripted = torch.jit.script(model)
            got, want = scripted(example), model(example)
            if isinstance(want, tuple):  # kernels.pt: (output, the maximum)
                err = max((g - w).abs().max().item() for g, w in zip(got, want))
            else:
                err = (got - want).abs().max().item()
            if err > 1e-4:
                print(f"make_torchscript_piecewise: scripted {name} differs from eager by {err}", file=sys.stderr)
                return 1
            scripted.save(os.path.join(args.output, name))
    print(f"make_torchscript_piecewise: wrote readback.pt, whole.pt and kernels.pt into {args.output} "
          f"(torch {torch.__version__}) "
          f"in {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
