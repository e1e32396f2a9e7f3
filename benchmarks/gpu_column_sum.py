"""The column sum of the joined weight gradient of ``e3nn-nequip-modules`` ([9808, 17408] fp32, 683 MB), each way
it can run alone: ATen's sum, Inductor's (defaults, combo kernels; the region's ``+ 0.0`` too), a GEMV by ones;
device µs by CUDA events, median of 20; max difference against a float64 sum. In the guarded modules step the same
sum runs inside the joined gradient's region, by torch.compile (``gpu_region_anatomy.py``).

    python3 benchmarks/gpu_column_sum.py [OUT.json]
"""

from __future__ import annotations

import json
import statistics
import sys

import torch


def timed(fn, x, reps: int = 20) -> float:
    for _ in range(3):
        fn(x)
    torch.cuda.synchronize()
    took = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn(x)
        b.record()
        torch.cuda.synchronize()
        took.append(a.elapsed_time(b) * 1e3)
    return statistics.median(took)


def main() -> int:
    torch.manual_seed(0)
    x = torch.randn(9808, 17408, device="cuda")
    ref = x.double().sum(0)
    ones = torch.ones(1, 9808, device="cuda")
    ways = {
        "aten sum(0)": lambda t: t.sum(0),
        "gemv ones @ x": lambda t: (ones @ t)[0],
        "inductor": torch.compile(lambda t: t.sum(0)),
        "inductor combo": torch.compile(lambda t: t.sum(0), options={"combo_kernels": True}),
        "inductor cat+0 then sum": torch.compile(lambda t: (t + 0.0).sum(0)),
    }
    out = {}
    for name, fn in ways.items():
        try:
            us = timed(fn, x)
            diff = (fn(x).double() - ref).abs().max().item()
            out[name] = {"us": round(us, 1), "GB/s": round(x.numel() * 4 / us / 1e3, 0), "max_diff": diff}
        except Exception as e:  # one way failing must not lose the others
            out[name] = {"error": f"{type(e).__name__}: {e}"[:300]}
        print(name, out[name], flush=True)
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            f.write(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
