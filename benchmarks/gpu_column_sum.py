"""The column sum of the joined weight gradient of ``e3nn-nequip-modules`` ([9808, 17408] fp32, 683 MB), each way
it can run alone: ATen's sum, Inductor's (defaults, combo kernels; the region's ``+ 0.0`` too), a GEMV by ones; and
the region's whole tail by Inductor, eleven pieces joined, kept and summed over edges, with ``+ 0.0`` on the joined
tensor or on each piece (the guard's padded-sum fold). Device µs a call (``host_device_us``: CUDA events, balanced
order, median of 20 rounds); the sums' max difference against a float64 sum.

    python3 benchmarks/gpu_column_sum.py [OUT.json]
"""

from __future__ import annotations

import sys
from typing import Any

import torch
from device_ways import device_ways, report

WIDTHS = [3072, 1024, 1024, 1024, 3072, 1024, 1024, 1024, 1024, 3072, 1024]  # the eleven pieces, 17408 in all


def _joined_then_plus_zero(pieces: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    joined = torch.cat([p * 2.0 for p in pieces], 1) + 0.0
    return joined, joined.sum(0)


def _each_plus_zero(pieces: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    joined = torch.cat([p * 2.0 + 0.0 for p in pieces], 1)
    return joined, joined.sum(0)


def main() -> int:
    torch.manual_seed(0)
    x = torch.randn(9808, sum(WIDTHS), device="cuda")
    pieces = [p.contiguous() for p in x.split(WIDTHS, 1)]
    ref = x.double().sum(0)
    ones = torch.ones(1, 9808, device="cuda")
    sums = {
        "aten sum(0)": lambda: x.sum(0),
        "gemv ones @ x": lambda: (ones @ x)[0],
        "inductor": torch.compile(lambda: x.sum(0)),
        "inductor combo": torch.compile(lambda: x.sum(0), options={"combo_kernels": True}),
        "inductor cat+0 then sum": torch.compile(lambda: (x + 0.0).sum(0)),
    }
    tails = {  # the region's tail: the pieces made (here doubled), joined, kept, summed; the sum of 2x is twice ref
        "inductor tail, cat then + 0.0": torch.compile(lambda: _joined_then_plus_zero(pieces)),
        "inductor tail, each piece + 0.0": torch.compile(lambda: _each_plus_zero(pieces)),
    }
    ways = {**sums, **tails}

    def max_diff(name: str, result: Any) -> float:
        summed = result[1] / 2 if name in tails else result
        return (summed.double() - ref).abs().max().item()

    out = device_ways(ways, max_diff, {name: x.numel() * 4 for name in sums})  # a sum reads the tensor once
    report(out, sys.argv[1] if len(sys.argv) > 1 else None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
