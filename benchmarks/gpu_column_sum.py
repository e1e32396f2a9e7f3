"""The column sum of the joined weight gradient of ``e3nn-nequip-modules`` ([9808, 17408] fp32, 683 MB), each way
it can run alone: ATen's sum, Inductor's (defaults, combo kernels; the region's ``+ 0.0`` too), a GEMV by ones;
device µs a call (``host_device_us``: CUDA events, balanced order, median of 20 rounds); max difference against a
float64 sum. In the guarded modules step the same
sum runs inside the joined gradient's region, by torch.compile (``gpu_region_anatomy.py``).

    python3 benchmarks/gpu_column_sum.py [OUT.json]
"""

from __future__ import annotations

import json
import sys

import torch

from thunder_fusion_guard.measure.timing import host_device_us


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
    out: dict[str, dict] = {}
    for name, fn in ways.items():  # each compiled and run once: its difference, or why it does not run
        try:
            out[name] = {"max_diff": (fn(x).double() - ref).abs().max().item()}
        except Exception as e:  # one way failing must not lose the others
            out[name] = {"error": f"{type(e).__name__}: {e}"[:300]}
    running = [name for name in ways if "error" not in out[name]]
    timed = host_device_us([ways[name] for name in running], [x], reps=20) or []
    if running and not timed:
        print("not timed: a call waits for the device (host_device_us)", flush=True)
    for name, us in zip(running, timed, strict=False):
        device = us.device_us
        out[name].update({"us": round(device, 1), "GB/s": round(x.numel() * 4 / device / 1e3, 0)})
    for name, row in out.items():
        print(name, row, flush=True)
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            f.write(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
