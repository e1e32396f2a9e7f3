"""Wall-clock timing of small calls: median microseconds, synchronising CUDA where tensors live there."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch


def _sync(device_is_cuda: bool) -> None:
    if device_is_cuda:
        torch.cuda.synchronize()


def uses_cuda(*values: Any) -> bool:
    """True when any tensor among ``values`` (searched one level into lists and tuples) is on CUDA."""
    for v in values:
        if isinstance(v, torch.Tensor) and v.is_cuda:
            return True
        if isinstance(v, (list, tuple)) and uses_cuda(*v):
            return True
    return False


@dataclass(frozen=True)
class Timing:
    """Per-call microseconds of a timed function: the median and the spread of the samples."""

    median: float
    q1: float
    q3: float
    min: float
    max: float
    samples: int

    @classmethod
    def of(cls, samples: Sequence[float]) -> Timing:
        ordered = sorted(samples)
        n = len(ordered)
        q1 = statistics.median(ordered[: n // 2]) if n > 1 else ordered[0]
        q3 = statistics.median(ordered[(n + 1) // 2 :]) if n > 1 else ordered[0]
        return cls(statistics.median(ordered), q1, q3, ordered[0], ordered[-1], n)

    def text(self, digits: int = 1) -> str:
        return spread_text(self.median, self.q1, self.q3, digits)


def spread_text(median: float, q1: float, q3: float, digits: int = 1) -> str:
    """'12.3 (11.9-13.0)': a median and, in brackets, its first and third quartiles."""
    return f"{median:.{digits}f} ({q1:.{digits}f}-{q3:.{digits}f})"


def time_us(
    fn: Callable[..., Any], *args: Any, reps: int = 200, warmup: int = 20, inner: int = 1, cuda: bool | None = None
) -> Timing:
    """Time one call of ``fn(*args)`` in microseconds over ``reps`` samples of ``inner`` calls.

    With ``cuda`` (default: any CUDA tensor argument) each sample ends with a device synchronise, so the
    figure is host time plus the kernels' device time, as a training step would see it.
    """
    if reps < 1 or warmup < 0 or inner < 1:
        raise ValueError("time_us: reps and inner must be >= 1 and warmup >= 0")
    cuda = uses_cuda(*args) if cuda is None else cuda
    for _ in range(warmup):
        fn(*args)
    _sync(cuda)
    samples = []
    for _ in range(reps):
        start = time.perf_counter_ns()
        for _ in range(inner):
            fn(*args)
        _sync(cuda)
        samples.append((time.perf_counter_ns() - start) / 1e3 / inner)
    return Timing.of(samples)


def median_us(
    fn: Callable[..., Any], *args: Any, reps: int = 200, warmup: int = 20, inner: int = 1, cuda: bool | None = None
) -> float:
    """Median time of one call of ``fn(*args)`` in microseconds (see :func:`time_us`)."""
    return time_us(fn, *args, reps=reps, warmup=warmup, inner=inner, cuda=cuda).median
