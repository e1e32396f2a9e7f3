"""One row of a region profile (:class:`RegionRow`): a fusion region's call, with the arguments it had in the
program, timed on the host and on the device, against the same ops run eagerly, with its kernels."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._pytree import tree_flatten

from .. import _thunder as th
from ..measure.timing import time_us, uses_cuda
from ..ops import is_communication
from ..passes.rewrite import RewriteError, lower_region
from ..regions import Region
from ..wording import error_line
from .calls import RegionCall
from .segments import device_kernels, summarize


@dataclass
class RegionRow:
    """One fusion region of the final forward or backward trace, measured with its real inputs.

    ``host_us`` is the wall time of one call (synchronised on CUDA), ``device_us`` the kernel time
    of one call, ``overhead_us`` their difference: what the call costs beyond its kernels. On CUDA
    ``kernel_names``, ``schedulers`` and ``kernel_us`` list the kernels of one call; ``gbps`` is the
    effective bandwidth (input and output bytes over device time) and ``peak_fraction`` its share of the
    device's peak; ``kernel_gbps`` gives it per kernel where a kernel's bytes are known (a region of one
    kernel: the region's; a segmented region's kernels also move intermediates, which are not counted, so None).
    ``subgraph`` names the ThunderFX subgraph the region belongs to. ``host_spread_us`` and
    ``eager_spread_us`` are the (first, third) quartiles of the samples behind ``host_us`` and ``eager_us``.
    ``decided_by`` is the decision's ``details["decided_by"]``; ``disagreement`` says why a region was kept
    although this profile times it slower fused than eager (None where they agree).
    """

    trace: str
    region: str
    executor: str
    n_ops: int
    ops: list[str]
    input_bytes: int | None = None
    output_bytes: int | None = None
    host_us: float | None = None
    device_us: float | None = None
    kernels: int | None = None
    eager_us: float | None = None
    overhead_us: float | None = None
    action: str | None = None
    reason: str | None = None
    estimates: dict[str, float] = field(default_factory=dict)
    error: str | None = None
    subgraph: str | None = None
    kernel_names: list[str] = field(default_factory=list)
    schedulers: list[str] = field(default_factory=list)
    kernel_us: list[float] = field(default_factory=list)
    gbps: float | None = None
    peak_fraction: float | None = None
    kernel_gbps: list[float | None] = field(default_factory=list)
    host_spread_us: tuple[float, float] | None = None
    eager_spread_us: tuple[float, float] | None = None
    decided_by: str | None = None
    disagreement: str | None = None
    source: str | None = None  # the user's source line of the region (its decision's ``details["source"]``)

    @property
    def excess_us(self) -> float | None:
        """What the region costs beyond its work: overhead on CUDA, host minus eager time on CPU."""
        if self.overhead_us is not None:
            return self.overhead_us
        if self.host_us is None or self.eager_us is None:
            return None
        return self.host_us - self.eager_us


def _nbytes(values: Sequence[Any]) -> int:
    flat = tree_flatten(list(values))[0]
    return sum(t.numel() * t.element_size() for t in flat if isinstance(t, torch.Tensor))


def measure_row(trace: th.TraceCtx, call: RegionCall, reps: int, warmup: int) -> RegionRow:
    region = call.region
    row = RegionRow(call.trace, region.name, region.executor, len(region.ops), region.ops)
    if is_communication(region.bsym):
        row.error = "holds communication ops: not timed alone (each call would run a collective)"
        return row
    args = call.replay_args()
    if args is None:
        row.error = "region was not called"
        return row
    fn = th.region_callable(region.bsym)
    cuda = uses_cuda(*args)
    with torch.no_grad():
        row.input_bytes = _nbytes(args)
        try:
            row.output_bytes = _nbytes([fn(*args)])
        except Exception as e:  # the region may fail in any way on its recorded inputs: the row says so, the rest go on
            row.error = f"not measured: the region fails on its recorded inputs ({error_line(e)})"
            return row
        row.host_us, row.host_spread_us = _timed(fn, args, reps, warmup)
        if cuda:
            row.device_us, row.kernels, names, row.kernel_us = _device_time(fn, args, max(1, min(reps, 20)))
            kernels = summarize(names)
            row.kernel_names, row.schedulers = kernels["kernel_names"], kernels["schedulers"]
            row.overhead_us = row.host_us - row.device_us
        eager = _eager_callable(trace, region)
        if isinstance(eager, str):
            row.error = eager
            return row
        try:
            row.eager_us, row.eager_spread_us = _timed(eager, args, reps, warmup)
        except Exception as e:  # the torch executor may fail in any way on these ops: the row says so, the rest go on
            row.error = f"eager not measured: Thunder's torch executor fails on these ops and inputs ({error_line(e)})"
    return row


def _eager_callable(trace: th.TraceCtx, region: Region) -> Callable | str:
    """The region's ops run one by one by Thunder's torch executor (the eager column), or why there is none."""
    try:
        body = lower_region(trace, region)
    except RewriteError as e:
        return f"eager not measured: {e}"
    except Exception as e:  # lowering runs Thunder's translations, which may raise anything: the row says why
        return f"eager not measured: Thunder's torch executor cannot take these ops ({error_line(e)})"
    return th.python_callable_from_symbols(f"{region.name}_eager", body, region.inputs, region.outputs)


def _timed(fn: Callable, args: tuple, reps: int, warmup: int) -> tuple[float, tuple[float, float]]:
    timing = time_us(fn, *args, reps=reps, warmup=warmup)
    return timing.median, (timing.q1, timing.q3)


def _device_time(fn: Callable, args: tuple, calls: int) -> tuple[float, int | None, list[str], list[float]]:
    """Device µs, kernel count, kernel names and each kernel's µs per call from torch.profiler; CUDA events
    (no count) as a fallback."""
    try:
        return _profiled_kernels(fn, args, calls)
    except Exception:  # torch.profiler can fail in many ways (CUPTI busy or missing, say): CUDA events time it instead
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        samples = []
        for _ in range(calls):
            start.record()
            fn(*args)
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) * 1e3)
        return statistics.median(samples), None, [], []


def _profiled_kernels(fn: Callable, args: tuple, calls: int) -> tuple[float, int, list[str], list[float]]:
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn(*args)
        torch.cuda.synchronize()
    on_device = [e for e in prof.events() if e.device_type == DeviceType.CUDA]
    kernels = device_kernels(on_device)
    total_us = sum(e.time_range.elapsed_us() for e in on_device)
    per_call = round(len(kernels) / calls)
    kernel_us = []
    if per_call and len(kernels) == per_call * calls:
        times = [e.time_range.elapsed_us() for e in kernels]
        kernel_us = [statistics.median(times[i::per_call]) for i in range(per_call)]
    return total_us / calls, per_call, [e.name for e in kernels[:per_call]], kernel_us
