"""A step's CUDA launches under torch.profiler, read by the package's ``launches`` (as ``fusion-guard kernels`` reads
them, replays of a CUDA graph too): the shared part of ``gpu_seed_vs_inductor.py`` and ``gpu_region_anatomy.py``."""

from __future__ import annotations

from collections.abc import Callable

import torch

from thunder_fusion_guard.examine.kernel_histogram import Launch, launches


def profiled_launches(step: Callable[[], object], steps: int) -> list[Launch]:
    """The launches of ``steps`` calls of ``step``, profiled together, in the order they ran."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    return launches(prof.events())
