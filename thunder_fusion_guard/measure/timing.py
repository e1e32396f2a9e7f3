"""Wall-clock timing of small calls: median microseconds, synchronising CUDA where tensors live there."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..render.table import spread_text


def sync(device_is_cuda: bool) -> None:
    """Wait for the work queued on CUDA, where the timed work runs there (nothing elsewhere)."""
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
        """The timing of ``samples`` (per-call µs)."""
        q1, median, q3 = quartiles(samples)
        return cls(median, q1, q3, min(samples), max(samples), len(samples))

    def text(self, digits: int = 1) -> str:
        return spread_text(self.median, self.q1, self.q3, digits)


def quartiles(samples: Sequence[float]) -> tuple[float, float, float]:
    """(first quartile, median, third quartile) of ``samples``: the medians of the lower and upper halves
    (the middle sample of an odd count in neither), as pytest-benchmark computes them."""
    ordered = sorted(samples)
    n = len(ordered)
    if n == 1:
        return ordered[0], ordered[0], ordered[0]
    return statistics.median(ordered[: n // 2]), statistics.median(ordered), statistics.median(ordered[(n + 1) // 2 :])


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
    sync(cuda)
    samples = []
    for _ in range(reps):
        start = time.perf_counter_ns()
        for _ in range(inner):
            fn(*args)
        sync(cuda)
        samples.append((time.perf_counter_ns() - start) / 1e3 / inner)
    return Timing.of(samples)


def median_us(
    fn: Callable[..., Any], *args: Any, reps: int = 200, warmup: int = 20, inner: int = 1, cuda: bool | None = None
) -> float:
    """Median time of one call of ``fn(*args)`` in microseconds (see :func:`time_us`)."""
    return time_us(fn, *args, reps=reps, warmup=warmup, inner=inner, cuda=cuda).median


Clock = Callable[[], int]

# A sample times enough calls in a row to last about this long (a short call's time is its mean), at most MAX_INNER.
TARGET_SAMPLE_US = 200.0
MAX_INNER = 200


def interleaved_us(
    fns: Sequence[Callable[..., Any]],
    args: Sequence[Any],
    *,
    reps: int = 20,
    warmup: int = 2,
    target_sample_us: float = TARGET_SAMPLE_US,
    max_inner: int = MAX_INNER,
    deadline_ns: int | None = None,
    min_reps: int = 3,
    clock: Clock = time.perf_counter_ns,
    cuda: bool | None = None,
) -> list[list[float]]:
    """Per-call µs samples of each of ``fns`` on ``args``: rounds of one sample each, in a balanced order.

    Each function is called once untimed (a compile, if it has one), then ``warmup`` times; a sample
    times enough calls (``inner``, the same for all) to last about ``target_sample_us``. Rounds stop at
    ``reps`` or, after ``min_reps``, once ``clock()`` passes ``deadline_ns``. On CUDA a sample ends with a
    synchronise, so it is the stream's cost per call: the larger of host and device time.
    """
    if reps < 1 or warmup < 0 or min_reps < 1:
        raise ValueError("interleaved_us: reps and min_reps must be >= 1 and warmup >= 0")
    cuda = uses_cuda(*args) if cuda is None else cuda
    for fn in fns:
        for _ in range(1 + warmup):
            fn(*args)
    one_call = _one_call_us(fns, args, cuda, clock)
    inner = _calls_per_sample(min(one_call), target_sample_us, max_inner)
    calls = {i: (lambda fn=fn: fn(*args)) for i, fn in enumerate(fns)}
    rounds = interleaved_rounds(
        calls,
        reps,
        inner=inner,
        sync=(lambda: sync(cuda)),
        stop=lambda r: r >= min_reps and deadline_ns is not None and clock() > deadline_ns,
        clock=clock,
    )
    return [[s / 1e3 for s in rounds.samples[i]] for i in calls]


@dataclass
class Rounds:
    """Samples of interleaved rounds: per step, one time per round (the clock's unit per call); ``cut_at``, the
    round the ``stop`` test ended them at (None: all rounds ran)."""

    samples: dict[Any, list[float]]
    cut_at: int | None = None


def interleaved_rounds(
    steps: Mapping[Any, Callable[[], Any]],
    rounds: int,
    *,
    warmup: int = 0,
    inner: int = 1,
    sync: Callable[[], None] = lambda: None,
    stop: Callable[[int], bool] | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> Rounds:
    """The one timing loop of the benchmarks: ``warmup`` untimed rounds, then ``rounds`` rounds of one sample of
    each step, in a balanced order (:func:`_round_order`: each step first, and right after each other step, equally
    often), so that a slow drift of the machine and what a step leaves behind weigh on every step alike.
    A sample is ``inner`` calls between two ``sync()`` calls, divided by ``inner``;
    ``stop(round_index)``, asked before each timed round, ends the rounds early."""
    if rounds < 0 or warmup < 0 or inner < 1:
        raise ValueError("interleaved_rounds: rounds and warmup must be >= 0 and inner >= 1")
    order = list(steps)
    for _ in range(warmup):
        for key in order:
            steps[key]()
    result = Rounds({key: [] for key in order})
    for round_index in range(rounds):
        if stop is not None and stop(round_index):
            result.cut_at = round_index
            break
        for i in _round_order(len(order), round_index):
            step = steps[order[i]]
            sync()
            start = clock()
            for _ in range(inner):
                step()
            sync()
            result.samples[order[i]].append((clock() - start) / inner)
    return result


def _one_call_us(fns: Sequence[Callable[..., Any]], args: Sequence[Any], cuda: bool, clock: Clock) -> list[float]:
    """µs of one call of each of ``fns``, from a synchronised start to a synchronised end."""
    took = []
    for fn in fns:
        sync(cuda)
        start = clock()
        fn(*args)
        sync(cuda)
        took.append((clock() - start) / 1e3)
    return took


def _calls_per_sample(one_call_us: float, target_sample_us: float, max_inner: int) -> int:
    """Calls a sample times so that it lasts about ``target_sample_us`` (1 to ``max_inner``)."""
    return max(1, min(max_inner, int(target_sample_us / max(one_call_us, 1e-3))))


def _round_order(count: int, round_index: int) -> Sequence[int]:
    """The functions' order in a round, from a Williams design: over ``count`` rounds (``2 * count`` where
    ``count`` is odd) each function runs first equally often and right after each other function equally often,
    so that what one leaves behind (caches, the allocator's pools, clocks) weighs on every function alike. Two
    functions alternate: forward in even rounds, backward in odd ones. Reversing alone is not enough from three
    on: the middle one always runs next to both ends, and the last runs twice in a row every other round."""
    base = [0]  # 0, 1, n-1, 2, n-2, ...: the first row, whose steps cover every difference mod n once
    low, high = 1, count - 1
    while len(base) < count:
        base.append(low)
        low += 1
        if len(base) < count:
            base.append(high)
            high -= 1
    rows = count if count % 2 == 0 else 2 * count
    row = round_index % rows
    order = [(b + row) % count for b in base]
    return order if row < count else order[::-1]


# How often host_device_us doubles its sleep when the issuing outlasts it (a host slowed down by other processes)
# before it concludes that the calls wait for the device.
LONGER_SLEEPS = 3


@dataclass(frozen=True)
class HostDevice:
    """Per-call µs of a CUDA callable, apart: the host's time to issue it, and the device's time to run it."""

    host_us: float
    device_us: float


Pair = tuple[float, float]


def first_two_apart(found: Sequence[HostDevice] | None) -> tuple[Pair | None, Pair | None]:
    """The host and the device µs of the first two programs :func:`host_device_us` timed, each as a (first, second)
    pair (``Measured.host``, ``.device``); (None, None) where they were not timed apart."""
    if found is None:
        return None, None
    return (found[0].host_us, found[1].host_us), (found[0].device_us, found[1].device_us)


_cycles_per_us: float | None = None


def _sleep_cycles_per_us() -> float:
    """GPU clock cycles per µs of ``torch.cuda._sleep``, measured once per process."""
    global _cycles_per_us
    if _cycles_per_us is None:
        cycles = 2_000_000
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(cycles // 10)
        start.record()
        torch.cuda._sleep(cycles)
        end.record()
        end.synchronize()
        _cycles_per_us = cycles / max(start.elapsed_time(end) * 1e3, 1.0)
    return _cycles_per_us


def host_device_us(
    fns: Sequence[Callable[..., Any]],
    args: Sequence[Any],
    *,
    reps: int = 5,
    clock: Clock = time.perf_counter_ns,
    cuda: bool | None = None,
) -> list[HostDevice] | None:
    """Host and device µs per call of each of ``fns`` (already warm) on ``args``, medians of ``reps`` rounds in
    a balanced order; None off CUDA (``cuda``, default: any CUDA tensor argument), or where a call waits for
    the device (its host time then is not its own: the calls outlast a sleep doubled :data:`LONGER_SLEEPS` times).

    A sample queues a sleeping kernel first, long enough that every call of the sample is issued while the
    device still sleeps: the host time is then the issuing alone, and CUDA events around the calls time the
    device's work alone, without the gaps a host-bound stream leaves.
    """
    if not (uses_cuda(*args) if cuda is None else cuda):
        return None
    stream_us = _one_call_us(fns, args, True, clock)
    inner = _calls_per_sample(min(stream_us), TARGET_SAMPLE_US, MAX_INNER)
    sleep_us = 2 * max(stream_us) * inner + 100
    cycles = int(sleep_us * _sleep_cycles_per_us())
    host: list[list[float]] = [[] for _ in fns]
    device: list[list[float]] = [[] for _ in fns]
    longer = 0  # times the sleep was doubled: a host slowed down (other processes) outlasted it
    for round_index in range(reps):
        for i in _round_order(len(fns), round_index):
            while True:
                begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                torch.cuda.synchronize()
                torch.cuda._sleep(cycles)
                begin.record()
                start = clock()
                for _ in range(inner):
                    fns[i](*args)
                issued_us = (clock() - start) / 1e3
                end.record()
                end.synchronize()
                if issued_us <= 0.8 * sleep_us:
                    break
                if longer == LONGER_SLEEPS:  # the calls outlasted every sleep: they wait for the device
                    return None
                longer, sleep_us, cycles = longer + 1, 2 * sleep_us, 2 * cycles  # this sample again
            host[i].append(issued_us / inner)
            device[i].append(begin.elapsed_time(end) * 1e3 / inner)
    return [HostDevice(statistics.median(h), statistics.median(d)) for h, d in zip(host, device, strict=True)]
