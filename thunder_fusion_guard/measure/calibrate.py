"""Calibration: measure the cost model's constants for one executor on this machine, cache them.

Five timings, each of a lone op: a tiny and a large ``add`` through the executor's fusion call and
eagerly, and an eager ``view``. Cached on disk per device and software versions; shipped defaults
(measured on our machines) stand in until a calibration has been run.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch

from .. import _thunder as th
from ..cost import CostConstants
from ..defaults import SHIPPED
from .timing import median_us

SMALL = (16, 16)
LARGE_CPU = (2048, 2048)
LARGE_CUDA = (8192, 8192)


def cache_path() -> Path:
    root = os.environ.get("TFG_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "thunder-fusion-guard")
    return Path(root) / "calibration.json"


def device_name(device: str) -> str:
    return torch.cuda.get_device_name() if device == "cuda" else "cpu"


def cache_key(device: str, executor: str) -> str:
    v = th.software_versions()
    return f"{device_name(device)}|{executor}|torch {v['torch']}|thunder {v['thunder']}|nvfuser {v['nvfuser']}"


def _load_cache() -> dict[str, Any]:
    try:
        return json.loads(cache_path().read_text())
    except (OSError, ValueError):
        return {}


def _jit_lone_add(executor: str):
    import thunder
    from thunder.extend import get_executor

    def add(a, b):
        return a + b

    return thunder.jit(add, executors=[get_executor(executor)], nv_enable_shape_only_fusion=True)


def _region_time(executor: str, a: torch.Tensor, b: torch.Tensor, inner: int) -> float:
    import thunder

    jitted = _jit_lone_add(executor)
    jitted(a, b)
    trace = thunder.last_traces(jitted)[-1]
    (bsym,) = [x for x in trace.bound_symbols if th.is_fusion(x)]
    by_name = dict(zip(th.trace_arg_names(trace), (a, b), strict=True))
    args = [by_name[p.name] for p in bsym.flat_proxy_args]
    return median_us(th.region_callable(bsym), *args, reps=30, warmup=5, inner=inner)


def measure(device: str, executor: str) -> CostConstants:
    """Measure the constants for ``executor`` on ``device`` ('cpu' or 'cuda'): a few seconds."""
    large = LARGE_CUDA if device == "cuda" else LARGE_CPU
    sa, sb = (torch.randn(SMALL, device=device) for _ in range(2))
    la, lb = (torch.randn(large, device=device) for _ in range(2))
    big_bytes = 3 * la.numel() * la.element_size()
    # Streams of tiny calls measure host cost; single synchronised large calls measure bandwidth.
    fusion_call_us = _region_time(executor, sa, sb, inner=50)
    fusion_big_us = _region_time(executor, la, lb, inner=1)
    eager_op_us = median_us(torch.add, sa, sb, reps=30, warmup=5, inner=50)
    eager_meta_us = median_us(lambda t: t.view(-1), sa, reps=30, warmup=5, inner=50)
    eager_big_us = median_us(torch.add, la, lb, reps=30, warmup=5)
    return CostConstants(
        fusion_call_us=round(fusion_call_us, 3),
        fusion_gbps=round(big_bytes / (fusion_big_us * 1e3), 2),
        eager_op_us=round(eager_op_us, 3),
        eager_meta_us=round(eager_meta_us, 3),
        eager_gbps=round(big_bytes / (eager_big_us * 1e3), 2),
        overlapped=device == "cuda",
        source=f"measured: {cache_key(device, executor)}",
    )


def calibrate(device: str, executor: str, *, save: bool = True) -> CostConstants:
    """Measure and (by default) cache the constants for ``executor`` on ``device``."""
    constants = measure(device, executor)
    if save:
        data = _load_cache()
        data[cache_key(device, executor)] = constants.to_dict()
        path = cache_path()
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data, indent=1, sort_keys=True))
    return constants


def shipped(device: str, executor: str) -> CostConstants | None:
    """The shipped default for this device family and executor, if there is one."""
    name = device_name(device)
    for family, ex, values in SHIPPED:
        if ex == executor and family.lower() in name.lower():
            return CostConstants.from_dict(values)
    return None


def lookup(device: str, executor: str) -> CostConstants | None:
    """Cached calibration for this machine if there is one, else the shipped default, else None."""
    cached = _load_cache().get(cache_key(device, executor))
    if cached is not None:
        try:
            return CostConstants.from_dict(cached)
        except ValueError:
            pass
    return shipped(device, executor)
