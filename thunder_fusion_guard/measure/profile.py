"""profile_regions: measure every fusion region of a jitted function with the inputs it really gets.

Each region's own callable is timed against the same ops run by Thunder's torch executor (the
lowering the guard uses), so the cost of a fusion call can be read region by region, and next to it
the guard's decision for that region. ThunderFX objects are profiled subgraph by subgraph.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.utils._pytree import tree_flatten

from .. import _thunder as th
from ..distributed import current_rank
from ..ops import is_communication
from ..passes.rewrite import lower_region
from ..report import Decision, _ops_text, kernels_text, text_table
from .calls import RegionCall, program_calls
from .segments import device_kernels, summarize
from .timing import median_us, uses_cuda


@dataclass
class RegionRow:
    """One fusion region of the final forward or backward trace, measured with its real inputs.

    ``host_us`` is the wall time of one call (synchronised on CUDA), ``device_us`` the kernel time
    of one call, ``overhead_us`` their difference: what the call costs beyond its kernels. On CUDA
    ``kernel_names`` and ``schedulers`` list the kernels of one call. ``subgraph`` names the ThunderFX
    subgraph the region belongs to.
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

    @property
    def excess_us(self) -> float | None:
        """What the region costs beyond its work: overhead on CUDA, host minus eager time on CPU."""
        if self.overhead_us is not None:
            return self.overhead_us
        if self.host_us is None or self.eager_us is None:
            return None
        return self.host_us - self.eager_us


@dataclass
class RegionProfile:
    """The rows of :func:`profile_regions` and the guard decisions of the same compilation."""

    function: str | None
    device: str
    reps: int
    rows: list[RegionRow]
    decisions: list[Decision] = field(default_factory=list)
    rank: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "function": self.function,
            "device": self.device,
            "rank": self.rank,
            "reps": self.reps,
            "rows": [asdict(r) for r in self.rows],
            "decisions": [d.to_dict() for d in self.decisions],
        }

    def to_json(self, **kwargs: Any) -> str:
        return json.dumps(self.to_dict(), **kwargs)

    def __str__(self) -> str:
        return format_profile(self)

    def plot(self, path: str | Path) -> Path:
        """Save a PNG bar chart of each region's excess time (needs matplotlib: the ``plot`` extra)."""
        try:
            from matplotlib.figure import Figure
        except ImportError as e:
            raise ImportError("RegionProfile.plot needs matplotlib: pip install 'thunder-fusion-guard[plot]'") from e
        rows = [r for r in self.rows if r.excess_us is not None]
        fig = Figure(figsize=(max(6.0, 0.6 * len(rows) + 2), 4.5))
        ax = fig.add_subplot()
        values = [r.excess_us for r in rows]
        ax.bar(
            [_bar_label(r) for r in rows],
            values,
            color=["tab:red" if v > 0 else "tab:green" for v in values],
        )
        ax.axhline(0.0, color="black", linewidth=0.8)
        cuda = self.device == "cuda"
        ax.set_ylabel("host - device µs per call" if cuda else "fusion call - eager µs per call")
        ax.set_title(f"{self.function or 'jitted function'}: {'overhead' if cuda else 'fusion vs eager'} per region")
        ax.tick_params(axis="x", labelrotation=60)
        fig.tight_layout()
        path = Path(path)
        fig.savefig(path, dpi=120)
        return path


def _bar_label(row: RegionRow) -> str:
    label = f"{'fwd' if row.trace == 'forward' else 'bwd'} {row.region}"
    return label if row.subgraph is None else f"{row.subgraph} {label}"


def profile_regions(jitted: Any, *args: Any, reps: int = 100, warmup: int = 10, **kwargs: Any) -> RegionProfile:
    """Run ``jitted(*args, **kwargs)`` (and its backward when outputs require grad) and measure each region.

    ``jitted`` is a ``thunder.jit`` result or a ThunderFX object (``thunderfx(...)``). The function runs
    twice, the second time recording each fusion call's arguments (under ThunderFX: each subgraph's
    inputs, then each subgraph runs twice on copies of them); the backward is that of the sum of the
    floating outputs, so gradients accumulate in ``.grad`` as in a training step. Then each region is
    timed on its recorded arguments, ``reps`` calls after ``warmup``. In a distributed run call it on
    every rank (the program's collectives run twice); the profile names the rank, and a region holding a
    collective is not timed alone.
    """
    rows, decisions = [], []
    for program in program_calls(jitted, args, kwargs):
        decisions += program.decisions
        for call in program.calls:
            row = _measure(program.traces[call.trace], call, reps, warmup)
            row.subgraph = program.subgraph
            if call.decision is not None:
                d = call.decision
                row.action, row.reason, row.estimates = d.action, d.reason, dict(d.estimates)
            rows.append(row)
    device = "cuda" if uses_cuda(*tree_flatten((args, kwargs))[0]) else "cpu"
    name = th.thunderfx_function_name(jitted) if th.is_thunderfx(jitted) else th.jitted_function_name(jitted)
    return RegionProfile(name, device, reps, rows, decisions, current_rank())


def _nbytes(values: Sequence[Any]) -> int:
    flat = tree_flatten(list(values))[0]
    return sum(t.numel() * t.element_size() for t in flat if isinstance(t, torch.Tensor))


def _measure(trace: th.TraceCtx, call: RegionCall, reps: int, warmup: int) -> RegionRow:
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
        row.output_bytes = _nbytes([fn(*args)])
        row.host_us = median_us(fn, *args, reps=reps, warmup=warmup)
        if cuda:
            row.device_us, row.kernels, names = _device_time(fn, args, max(1, min(reps, 20)))
            kernels = summarize(names)
            row.kernel_names, row.schedulers = kernels["kernel_names"], kernels["schedulers"]
            row.overhead_us = row.host_us - row.device_us
        try:
            eager = th.python_callable_from_symbols(
                f"{region.name}_eager", lower_region(trace, region), region.inputs, region.outputs
            )
            row.eager_us = median_us(eager, *args, reps=reps, warmup=warmup)
        except Exception as e:
            row.error = f"eager: {type(e).__name__}: {e}"
    return row


def _device_time(fn: Callable, args: tuple, calls: int) -> tuple[float, int | None, list[str]]:
    """Kernel µs, kernel count and kernel names per call from torch.profiler; CUDA events (no count) as a fallback."""
    try:
        return _profiled_kernels(fn, args, calls)
    except Exception:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        samples = []
        for _ in range(calls):
            start.record()
            fn(*args)
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) * 1e3)
        return statistics.median(samples), None, []


def _profiled_kernels(fn: Callable, args: tuple, calls: int) -> tuple[float, int, list[str]]:
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
    return total_us / calls, per_call, [e.name for e in kernels[:per_call]]


def _fmt(value: float | int | None, digits: int = 1) -> str:
    if value is None:
        return "-"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def format_profile(profile: RegionProfile) -> str:
    """A fixed-width table, one row per region, then the guard's decisions for regions no longer there."""
    cuda = profile.device == "cuda"
    on = profile.device if profile.rank is None else f"{profile.device}, rank {profile.rank}"
    title = (
        f"profile of {profile.function or 'jitted function'} on {on} "
        f"(µs: median of {profile.reps} calls of each region's own callable with its real inputs)"
    )
    if not profile.rows:
        lines = [title, "no fusion regions in the final traces"]
    else:
        header = ["trace", "region", "executor", "ops", "in KiB", "out KiB", "host", "eager"]
        header += ["device", "kernels", "overhead"] if cuda else ["host-eager"]
        header += ["action", "reason"]
        table = [header]
        for r in profile.rows:
            where = r.trace if r.subgraph is None else f"{r.subgraph}/{r.trace}"
            cells = [where, r.region, r.executor, f"{r.n_ops}: {_ops_text(r.ops, 32)}"]
            cells += [_kib(r.input_bytes), _kib(r.output_bytes), _fmt(r.host_us), _fmt(r.eager_us)]
            cells += [_fmt(r.device_us), _kernels(r), _fmt(r.overhead_us)] if cuda else [_fmt(r.excess_us)]
            reason = r.reason or ""
            if r.error:
                reason = f"{reason} [{r.error}]".strip()
            table.append([*cells, r.action or "-", reason])
        lines = [title, *text_table(table)]
    present = {(r.subgraph, r.trace, r.region) for r in profile.rows}
    gone = [d for d in profile.decisions if d.about_region and (d.subgraph, d.trace, d.region) not in present]
    if gone:
        lines.append("guard decisions for regions no longer in the traces:")
        for d in gone:
            where = d.trace if d.subgraph is None else f"{d.subgraph}/{d.trace}"
            lines.append(f"  {where} {d.region} ({', '.join(d.ops)}): {d.action}: {d.reason}")
    return "\n".join(lines)


def _kernels(row: RegionRow) -> str:
    if row.kernels is None:
        return "-"
    return kernels_text({"kernels": row.kernels, "schedulers": row.schedulers, "segmented": row.kernels > 1})


def _kib(n: int | None) -> str:
    return "-" if n is None else f"{n / 1024:.1f}"
