"""Ways to compute one thing on a CUDA GPU, each checked once, then timed together in a balanced order: the shared
part of ``gpu_column_sum.py`` and ``gpu_joined_gemms.py``."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from thunder_fusion_guard.measure.timing import host_device_us


def device_ways(
    ways: dict[str, Callable[[], Any]], max_diff: Callable[[str, Any], float], read_bytes: dict[str, int]
) -> dict[str, dict]:
    """Each of ``ways`` run once (``max_diff(name, result)``, or why it does not run), then those that run timed
    together: device µs a call (``host_device_us``: CUDA events, balanced order, median of 20 rounds), and GB/s
    where ``read_bytes`` names what the way reads."""
    out: dict[str, dict] = {}
    for name, fn in ways.items():
        try:
            out[name] = {"max_diff": max_diff(name, fn())}
        except Exception as e:  # one way failing must not lose the others
            out[name] = {"error": f"{type(e).__name__}: {e}"[:300]}
    running = [name for name in ways if "error" not in out[name]]
    timed = host_device_us([ways[name] for name in running], [], reps=20, cuda=True) or []
    if running and not timed:
        print("not timed: a call waits for the device (host_device_us)", flush=True)
    for name, us in zip(running, timed, strict=False):
        out[name]["us"] = round(us.device_us, 1)
        if name in read_bytes:
            out[name]["GB/s"] = round(read_bytes[name] / us.device_us / 1e3, 0)
    return out


def report(out: dict[str, dict], path: str | None) -> None:
    """Each way's row printed, and all of them written as JSON to ``path`` where given."""
    for name, row in out.items():
        print(name, row, flush=True)
    if path:
        with open(path, "w") as f:
            f.write(json.dumps(out, indent=1))
