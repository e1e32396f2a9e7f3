"""The column sum of the joined weight gradient of ``e3nn-nequip-modules`` ([9808, 17408] fp32, 683 MB), each way
it can run alone: ATen's sum, Inductor's (defaults, combo kernels; the region's ``+ 0.0`` too), a GEMV by ones; and
the region's whole tail by Inductor, eleven pieces joined, kept and summed over edges, with ``+ 0.0`` on the joined
tensor or on each piece (the guard's padded-sum fold). Device µs a call (``host_device_us``: CUDA events, balanced
order, median of 20 rounds); the sums' max difference against a float64 sum.

    python3 benchmarks/gpu_column_sum.py [OUT.json]
"""

from __future__ import annotations

import json
import sys

import torch

from thunder_fusion_guard.measure.timing import host_device_us

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
    out: dict[str, dict] = {}
    for name, fn in {**sums, **tails}.items():  # each compiled and run once: its difference, or why it does not run
        try:
            result = fn()
            summed = result[1] / 2 if name in tails else result
            out[name] = {"max_diff": (summed.double() - ref).abs().max().item()}
        except Exception as e:  # one way failing must not lose the others
            out[name] = {"error": f"{type(e).__name__}: {e}"[:300]}
    ways = {**sums, **tails}
    running = [name for name in ways if "error" not in out[name]]
    timed = host_device_us([ways[name] for name in running], [], reps=20, cuda=True) or []
    if running and not timed:
        print("not timed: a call waits for the device (host_device_us)", flush=True)
    for name, us in zip(running, timed, strict=False):
        device = us.device_us
        out[name]["us"] = round(device, 1)
        if name in sums:  # one read of the tensor
            out[name]["GB/s"] = round(x.numel() * 4 / device / 1e3, 0)
    for name, row in out.items():
        print(name, row, flush=True)
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            f.write(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
