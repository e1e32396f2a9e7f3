"""profile_regions: measure every fusion region of a jitted function with the inputs it really gets.

Each region's own callable is timed against the same ops run by Thunder's torch executor (the
lowering the guard uses), so the cost of a fusion call can be read region by region, and next to it
the guard's decision for that region. ThunderFX objects are profiled subgraph by subgraph. On CUDA
each region's effective bandwidth (bytes in and out over device time) is set against the device's peak,
and the profile carries the dataflow graphs of the traces (:mod:`.dataflow`) for pictures.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.utils._pytree import tree_flatten

from .. import _thunder as th
from ..decisions import Decision, Subgraph, short_source, trace_place
from ..distributed import current_rank
from ..measure import breakeven
from ..measure.timing import uses_cuda
from ..progress import Progress
from ..render import HOST_LEGEND_CPU, HOST_LEGEND_CUDA, html_page
from ..render.table import (
    kernels_text,
    ops_text,
    percent_text,
    plural,
    region_text,
    spread_text,
    text_table,
    wrapped,
)
from ..transform import guards_of
from ..wording import WIDTH
from .bandwidth import Peak, gbps, peak_bandwidth
from .calls import ProgramCalls, RegionCall, program_calls
from .dataflow import GraphPair, graphs_to_dot, trace_graphs
from .explain import name_subgraphs
from .profile_rows import RegionRow, measure_row
from .segments import device_kernels

logger = logging.getLogger("thunder_fusion_guard")


@dataclass
class RegionProfile:
    """The rows of :func:`profile_regions`, the guard decisions of the same compilation, the dataflow
    graphs of its traces (before and after the guard) and, on CUDA, the device's peak memory bandwidth.

    ``executors`` lists (name, is a fusion executor) of the executors the programs were compiled with;
    ``threads`` is torch's intra-op thread count during the CPU timings.
    """

    function: str | None
    device: str
    reps: int
    rows: list[RegionRow]
    decisions: list[Decision] = field(default_factory=list)
    graphs: list[GraphPair] = field(default_factory=list)
    peak: Peak | None = None
    subgraphs: dict[str, Subgraph] = field(default_factory=dict)
    executors: list[tuple[str, bool]] = field(default_factory=list)
    threads: int | None = None
    rank: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "function": self.function,
            "device": self.device,
            "rank": self.rank,
            "reps": self.reps,
            "peak": None if self.peak is None else asdict(self.peak),
            "threads": self.threads,
            "executors": [name for name, _ in self.executors],
            "rows": [asdict(r) for r in self.rows],
            "decisions": [d.to_dict() for d in self.decisions],
            "graphs": [g.to_dict() for g in self.graphs],
        }

    def to_html(self, title: str | None = None, meta: Sequence[str] = (), sections: Sequence[str] = ()) -> str:
        """A self-contained HTML page: the pictures, the profile and the decisions, in sortable tables;
        ``meta`` lines go under the title, ``sections`` (HTML, e.g. ``why_not_fused(...).to_html()``) last."""
        title = title or f"FusionGuard profile of {self.function or 'jitted function'} on {self.device}"
        return html_page(
            title, self.decisions, self.subgraphs, profile=self, graphs=self.graphs, meta=meta, extra_sections=sections
        )

    def to_dot(self) -> str:
        """The dataflow graphs as Graphviz DOT text."""
        title = f"FusionGuard dataflow of {self.function or 'jitted function'}"
        return graphs_to_dot(self.graphs, title, self.subgraphs)

    def to_json(self, **kwargs: Any) -> str:
        return json.dumps(self.to_dict(), **kwargs)

    def __str__(self) -> str:
        return format_profile(self)

    def to_text(self, wide: bool = False) -> str:
        """The profile table (what ``str(profile)`` gives): lines of at most 120 characters, long cells wrapped
        at spaces, never cut; ``wide``: one line per region, however long."""
        return format_profile(self, wide=wide)

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
    timed on its recorded arguments, ``reps`` calls after ``warmup``. On a shared CPU, pin torch's threads
    first (``torch.set_num_threads(1)``): with several, each call may wait for a busy core.
    In a distributed run call it on
    every rank (the program's collectives run twice); the profile names the rank, and a region holding a
    collective is not timed alone.
    """
    rows, decisions, executors = [], [], []
    cuda = uses_cuda(*tree_flatten((args, kwargs))[0])
    peak = peak_bandwidth() if cuda else None
    with Progress("profile_regions") as shown:
        shown.update("running twice, recording each region's arguments")
        programs = program_calls(jitted, args, kwargs)
        total = sum(len(program.calls) for program in programs)
        for program in programs:
            decisions += program.decisions
            executors += [e for e in th.executors_of(program.jitted) if e not in executors]
            rows += _program_rows(program, reps, warmup, peak, shown, total, len(rows))
    try:
        graphs = trace_graphs(jitted, rows)
    except Exception as e:  # pictures are extra: a trace they cannot read must not cost the profile
        logger.warning("profile_regions: no dataflow graphs: %s: %s", type(e).__name__, e)
        graphs = []
    if cuda:
        _count_step_kernels(programs, graphs)
    name = th.thunderfx_function_name(jitted) if th.is_thunderfx(jitted) else th.jitted_function_name(jitted)
    subgraphs = _named_subgraphs(jitted)
    device = "cuda" if cuda else "cpu"
    threads = torch.get_num_threads() if device == "cpu" else None
    return RegionProfile(
        name, device, reps, rows, decisions, graphs, peak, subgraphs, executors, threads, current_rank()
    )


def _program_rows(
    program: ProgramCalls, reps: int, warmup: int, peak: Peak | None, shown: Progress, total: int, done: int
) -> list[RegionRow]:
    """One program's regions, each timed on its recorded arguments and given its decision; ``shown`` counts them
    (``done`` of ``total`` before this program)."""
    rows = []
    for call in program.calls:
        shown.update("timing", done + len(rows), total, "regions")
        row = measure_row(program.traces[call.trace], call, reps, warmup)
        row.subgraph = program.subgraph
        if call.decision is not None:
            d = call.decision
            row.action, row.reason, row.estimates = d.action, d.reason, dict(d.estimates)
            row.decided_by, row.source = d.details.get("decided_by"), d.details.get("source")
            row.disagreement = disagreement(row, d, program.decisions)
            if row.disagreement and row.decided_by == "model" and _remembered(program, call, row):
                row.disagreement += "; this timing is cached: the next compilation decides the region by it"
        _bandwidth(row, peak)
        rows.append(row)
    shown.update("timing", done + len(rows), total, "regions")
    return rows


def _remembered(program: ProgramCalls, call: RegionCall, row: RegionRow) -> bool:
    """Cache a timing that says a region the model kept runs slower fused (:func:`..measure.breakeven.remember`),
    so that a region is not kept for want of a timing; on CUDA its host time (a captured program's device time
    is the guard's to time). False where nothing was cached."""
    if row.host_us is None or row.eager_us is None or call.trace not in program.traces:
        return False
    return breakeven.remember(program.traces[call.trace], call.region, row.host_us, row.eager_us)


def disagreement(row: RegionRow, decision: Decision, decisions: Sequence[Decision]) -> str | None:
    """Why ``decision`` kept a region this profile times slower fused than eager; None where they agree
    (or nothing was timed). Profile times come from this run, decisions from compile time."""
    if decision.action != "keep" or row.host_us is None or row.eager_us is None or row.host_us <= row.eager_us:
        return None
    slower = f"fused {row.host_us / row.eager_us - 1:.0%} slower here"
    split = any(
        d.action == "hoist" and row.region in (d.details.get("split") or []) and d.trace == row.trace
        for d in decisions
        if d.subgraph == decision.subgraph
    )
    if split:
        return f"{slower}; decided with {len(decision.ops)} ops, before hoisting took the input-independent ones out"
    how = decision.details.get("decided_by")
    if how == "exactness":
        return f"{slower}; kept for exactness (never rejected, so not timed while compiling)"
    if how == "measured":
        region, eager = decision.details.get("measured_region_us"), decision.details.get("measured_eager_us")
        within = eager is not None and region is not None and eager >= region * 0.8
        return (
            f"{slower}; timed while compiling at {region:.1f} µs fused vs {eager:.1f} µs eager"
            + (", within the margin" if within else "")
            + " (timings move with the machine's load)"
        )
    if how == "model":
        why = decision.details.get("not_measured") or "estimates more than 3x apart"
        est = decision.estimates
        numbers = f" ({est['est_region_us']:.1f} vs {est['est_eager_us']:.1f} µs)" if "est_region_us" in est else ""
        return f"{slower}; model estimate{numbers}, not measured: {why}"
    return f"{slower}; kept by {how or 'the guard'}"


def _named_subgraphs(obj: Any) -> dict[str, Subgraph]:
    """The ThunderFX subgraphs of the guards attached to ``obj``, with Thunder's names (empty otherwise)."""
    guards = guards_of(obj)
    if not guards or not th.is_thunderfx(obj):
        return {}
    name_subgraphs(obj, guards)
    return {key: sub for g in guards for key, sub in g.report.subgraphs.items()}


def _bandwidth(row: RegionRow, peak: Peak | None) -> None:
    if row.device_us is None or row.input_bytes is None or row.output_bytes is None:
        return
    nbytes = row.input_bytes + row.output_bytes
    row.gbps = gbps(nbytes, row.device_us)
    if peak is not None and row.gbps is not None:
        row.peak_fraction = row.gbps / peak.gbps
    if row.kernels == 1 and len(row.kernel_us) == 1:
        row.kernel_gbps = [gbps(nbytes, row.kernel_us[0])]
    else:
        row.kernel_gbps = [None] * len(row.kernel_us)


def _count_step_kernels(programs: list[ProgramCalls], graphs: list[GraphPair]) -> None:
    """Measured kernels per call of each program's forward and backward, onto the 'after' graphs."""
    for program in programs:
        try:
            counts = step_kernels(program.jitted, program.args, program.kwargs)
        except Exception as e:  # kernel counts are extra: any failure (program, profiler) must not cost the profile
            logger.warning("profile_regions: kernels per call not counted: %s: %s", type(e).__name__, e)
            continue
        for pair in graphs:
            if pair.subgraph == program.subgraph and counts.get(pair.trace) is not None:
                pair.after.kernels_per_call = counts[pair.trace]


def step_kernels(fn: Any, args: tuple, kwargs: dict) -> dict[str, int | None]:
    """CUDA kernels one call of ``fn`` launches (``forward``) and its backward (``backward``: of the sum of
    the floating outputs, seeded with precomputed ones, gradients of the leaves set to None first so
    accumulation launches nothing; they are restored after)."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        out = fn(*args, **kwargs)
        torch.cuda.synchronize()
    counts: dict[str, int | None] = {"forward": len(device_kernels(prof.events())), "backward": None}
    outs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor) and t.requires_grad]
    outs = [t for t in outs if t.is_floating_point() and t.grad_fn is not None]
    if not outs:
        return counts
    seeds = [torch.ones_like(t) for t in outs]
    flat = tree_flatten((args, kwargs))[0]
    leaves = [t for t in flat if isinstance(t, torch.Tensor) and t.requires_grad and t.is_leaf]
    module = th.compiled_module(fn)
    if isinstance(module, torch.nn.Module):
        leaves += [p for p in module.parameters() if p.requires_grad]
    saved = [t.grad for t in leaves]
    for t in leaves:
        t.grad = None
    torch.cuda.synchronize()
    try:
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            torch.autograd.backward(outs, seeds)
            torch.cuda.synchronize()
        counts["backward"] = len(device_kernels(prof.events()))
    finally:
        for t, grad in zip(leaves, saved, strict=True):
            t.grad = grad
    return counts


def _fmt(value: float | int | None, digits: int = 1) -> str:
    if value is None:
        return "-"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def format_profile(profile: RegionProfile, wide: bool = False) -> str:
    """A fixed-width table, one row per region, then the guard's decisions for regions no longer there; lines
    of at most 120 characters, long cells wrapped at spaces, never cut (``wide``: one line each)."""
    width = None if wide else WIDTH
    cuda = profile.device == "cuda"
    threads = "" if profile.threads is None else f"; {plural(profile.threads, 'intra-op thread')}"
    on = profile.device if profile.rank is None else f"{profile.device}, rank {profile.rank}"
    executors = list(dict.fromkeys(r.executor for r in profile.rows))
    one_executor = len(executors) == 1 and not wide  # named once in the title, not in a column of its own
    of = f"{executors[0]} " if one_executor else ""
    title = (
        f"profile of {profile.function or 'jitted function'} on {on} (µs: median (first-third "
        f"quartile) of {profile.reps} calls of each {of}region's own callable with its real inputs{threads})"
    )
    if not profile.rows and any(d.about_region for d in profile.decisions):
        lines = [*wrapped(title, width, "  "), "no fusion region left in the final traces"]
    elif not profile.rows:
        lines = [*wrapped(title, width, "  ")]
        lines += wrapped(f"no fusion region in the final traces: {th.no_region_hint(profile.executors)}", width, "  ")
    else:
        header = ["trace", "region", "executor", "ops", "in KiB", "out KiB", "host", "eager"]
        # a column the same on every row is the title's word; on CUDA, to fit 120 columns, only the device time is
        # a column of its own, the rest of the GPU's figures lead the row's last part (wide: a column each)
        apart = cuda and wide
        header += (
            ["device", "GB/s", "% peak", "kernels", "overhead"] if apart else ["device"] if cuda else ["host-eager"]
        )
        notes = wide and any(r.disagreement for r in profile.rows)  # else after the reason
        header += ["action", *(["why kept though slower here"] if notes else []), "reason"]
        table = [header]
        for r in profile.rows:
            where = trace_place(r.trace, r.subgraph)
            region = f"{short_source(r.source)} ({r.region})" if r.source else r.region
            cells = [where, region, r.executor, f"{r.n_ops}: {ops_text(r.ops, 32)}"]
            cells += [_kib(r.input_bytes), _kib(r.output_bytes)]
            cells += [_spread(r.host_us, r.host_spread_us), _spread(r.eager_us, r.eager_spread_us)]
            bandwidth = [_fmt(r.gbps), percent_text(r.peak_fraction, "-")]
            if apart:
                cells += [_fmt(r.device_us), *bandwidth, _kernels(r), _fmt(r.overhead_us)]
            else:
                cells += [_fmt(r.device_us)] if cuda else [_fmt(r.excess_us)]
            reason = r.reason or ""
            if r.error:
                reason = f"{reason} [{r.error}]".strip()
            if r.disagreement and not notes:
                reason += f"; why kept though slower here: {r.disagreement}"
            if cuda and not apart:
                reason = f"{_gpu_figures(r)}; {reason}" if reason else _gpu_figures(r)
            table.append([*cells, r.action or "-", *([r.disagreement or ""] if notes else []), reason])
        # trace, region, executor, ops, host, eager and (CUDA, wide) kernels may wrap; the reason always may
        narrow = [0, 1, 2, 3, 6, 7, 11] if apart else [0, 1, 2, 3, 6, 7]
        if one_executor:
            table = [[c for i, c in enumerate(row) if i != 2] for row in table]
            narrow = [i - (i > 2) for i in narrow if i != 2]
        lines = wrapped(title, width, "  ") + text_table(table, last_free=True, width=width, wrap=narrow)
        lines += wrapped(HOST_LEGEND_CUDA if cuda else HOST_LEGEND_CPU, width, "  ")
        if cuda:
            peak = "unknown" if profile.peak is None else f"{profile.peak.gbps:.0f} GB/s ({profile.peak.source})"
            lines += wrapped(
                f"GB/s: input + output bytes over device time; peak memory bandwidth {peak}; above 100%: the "
                "region reads less than its whole inputs (an embedding table, a gather)",
                width,
                "  ",
            )
    present = {(r.subgraph, r.trace, r.region) for r in profile.rows}
    gone = [d for d in profile.decisions if d.about_region and (d.subgraph, d.trace, d.region) not in present]
    if gone:
        lines.append("guard decisions for regions no longer in the traces:")
        for d in gone:
            line = f"  {trace_place(d.trace, d.subgraph)} {region_text(d)} ({', '.join(d.ops)}): {d.action}: {d.reason}"
            lines += wrapped(line, width, "  ")
    return "\n".join(lines)


def _spread(median: float | None, quartiles: tuple[float, float] | None) -> str:
    if median is None or quartiles is None:
        return _fmt(median)
    return spread_text(median, *quartiles)


def _gpu_figures(row: RegionRow) -> str:
    """'overhead 5.0 µs, 812.5 GB/s (24% peak), 3 segmented kernels: pointwise+reduction': the GPU's figures of a
    CUDA row beside its device time, for the text table's last part."""
    parts = [
        f"overhead {_fmt(row.overhead_us)} µs",
        f"{_fmt(row.gbps)} GB/s ({percent_text(row.peak_fraction, '-')} peak)",
    ]
    if row.kernels is not None:
        parts.append(f"kernels {_kernels(row)}")
    return ", ".join(parts)


def _kernels(row: RegionRow) -> str:
    if row.kernels is None:
        return "-"
    return kernels_text({"kernels": row.kernels, "schedulers": row.schedulers, "segmented": row.kernels > 1})


def _kib(n: int | None) -> str:
    return "-" if n is None else f"{n / 1024:.1f}"
