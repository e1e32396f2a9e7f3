"""The suites' cases, defined once in :mod:`thunder_fusion_guard.bench.cases` (``fusion-guard bench run``
uses the same ones), and the one way each suite's test times a variant."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from thunder_fusion_guard.bench.cases import (
    CASES,
    HEAVY_ENV,
    Workload,
    case_named,
    fresh_compile_state,
    heavy_requested,
    make_step,
    requested_variants,
)

WARMUP = 3
_workload: dict[tuple[str, str], Workload] = {}


def bench_params(suite: str) -> list:
    """``(case name, variant)`` parameters of a suite, ids ``<case>-<variant>``; heavy ones skip unless asked.

    The variants are ``TFG_BENCH_VARIANTS`` (comma-separated, as ``bench run --variants``), else the default set.
    """
    skip_heavy = pytest.mark.skip(reason=f"heavy case: opt in with {HEAVY_ENV}=1")
    skip_cuda = pytest.mark.skip(reason="CUDA-only case (asks for shape-only nvFuser regions)")
    on_cuda = torch.cuda.is_available()
    return [
        pytest.param(
            case.name,
            variant,
            id=f"{case.name}-{variant}",
            marks=([skip_heavy] if case.heavy and not heavy_requested() else [])
            + ([skip_cuda] if case.cuda_only and not on_cuda else []),
        )
        for case in CASES
        if case.suite == suite
        for variant in requested_variants()
    ]


def _step(name: str, variant: str, device: str) -> Callable[[], None]:
    key = (name, device)
    if key not in _workload:
        _workload.clear()  # the variants of one case run together and share inputs and weights
        fresh_compile_state()  # torch.compile starts each case afresh, as `bench run` does
        _workload[key] = case_named(name).build(device)
    return make_step(_workload[key], variant, device)


def run_benchmark(benchmark, name: str, variant: str, device: str) -> None:
    """Time one variant of one case; the first calls (compilation) and a warmup stay out of the timing."""
    case = case_named(name)
    benchmark.group = case.group
    benchmark.extra_info.update(device=device, suite=case.suite)
    step = _step(name, variant, device)
    for _ in range(1 + WARMUP):
        step()
    benchmark(step)
