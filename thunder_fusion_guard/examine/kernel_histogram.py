"""Kernels a step, counted by kind and by source: GEMMs, fusion kernels (nvFuser, Triton), copies, memsets and fills,
index and scatter kernels, reductions and elementwise ATen kernels, each with the fusion region that launched it
(and the user's line the guard recorded for it) or else the ATen op.

One training step (forward and the backward of the sum of the floating outputs) is profiled after warm-up steps;
each CUDA launch is read off the CPU event that launched it (torch.profiler links the two) and the ranges around
that event: the step's forward or backward, the fusion region (each region's call wrapped in a profiler range
while the step is profiled, the program rebuilt from the same final traces) and the innermost ATen op.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from .. import _thunder as th
from ..render.table import text_table
from ..wording import WIDTH, fit

__all__ = ["KINDS", "KernelHistogram", "Launch", "format_histograms", "kernel_kind", "launches", "step_histogram"]

KINDS = ("GEMM", "nvFuser", "Triton", "copy", "memset/fill", "index/scatter", "reduction", "elementwise", "other")

# Range names: the step's phase, and a fusion region's call (``region:<trace>:<subgraph>:<name>``).
PHASE = "FusionGuard step:"
REGION = "FusionGuard region:"

_GEMM_NAMES = ("gemm", "gemv", "cutlass", "xmma", "nvjet", "cublas", "splitkreduce", "dot_kernel", "_mma")
_GEMM_OPS = frozenset(
    f"aten::{op}" for op in ("mm", "bmm", "addmm", "baddbmm", "addbmm", "matmul", "linear", "_scaled_mm", "addmv", "mv")
)
_COPY_OPS = frozenset(f"aten::{op}" for op in ("copy_", "clone", "contiguous", "_to_copy", "to", "cat", "stack"))
_FILL_OPS = frozenset(f"aten::{op}" for op in ("zero_", "fill_", "zeros", "ones", "full", "zeros_like", "new_zeros"))
_INDEX_NAMES = ("index", "scatter", "gather", "embedding", "segment")
_INDEX_OPS = frozenset(
    f"aten::{op}"
    for op in ("index", "index_add_", "index_select", "index_put_", "scatter_add_", "scatter_reduce", "gather")
)


def kernel_kind(name: str, op: str | None = None) -> str:
    """The kind (one of :data:`KINDS`) of a CUDA kernel by its name and, where known, the ATen op that launched it."""
    n = name.lower()
    if "nvfuser" in n or "cudageneratedkernel" in n:
        return "nvFuser"
    if n.startswith("triton"):
        return "Triton"
    if n.startswith("memset") or "fill_kernel" in n or op in _FILL_OPS:
        return "memset/fill"
    if n.startswith("memcpy") or "copy_kernel" in n or "catarray" in n or op in _COPY_OPS:
        return "copy"
    if any(s in n for s in _GEMM_NAMES) or op in _GEMM_OPS:
        return "GEMM"
    if any(s in n for s in _INDEX_NAMES) or op in _INDEX_OPS:
        return "index/scatter"
    if "reduce" in n:
        return "reduction"
    if "elementwise" in n:
        return "elementwise"
    return "other"


@dataclass(frozen=True)
class Launch:
    """One CUDA launch of a step: the kernel's name and kind, its device µs, ``phase`` (forward, backward),
    ``source`` (the fusion region, else the ATen op, else None) and the user's ``line`` where known."""

    name: str
    kind: str
    device_us: float
    phase: str | None
    source: str | None
    line: str | None = None


@dataclass
class KernelHistogram:
    """The launches of one step of one compiled path (``path``: guarded, inductor, ...)."""

    path: str
    launches: list[Launch] = field(default_factory=list)

    @property
    def kernels(self) -> int:
        return len(self.launches)

    @property
    def device_us(self) -> float:
        return sum(x.device_us for x in self.launches)

    def by_kind(self) -> dict[str, tuple[int, float]]:
        """Kernels and device µs of each kind, in :data:`KINDS` order (kinds with none left out)."""
        counts: dict[str, list] = {kind: [0, 0.0] for kind in KINDS}
        for x in self.launches:
            counts[x.kind][0] += 1
            counts[x.kind][1] += x.device_us
        return {kind: (n, us) for kind, (n, us) in counts.items() if n}

    def by_source(self) -> list[dict[str, Any]]:
        """One row a (phase, source, line): its kernels, device µs and kinds, most kernels first."""
        rows: dict[tuple, dict[str, Any]] = {}
        for x in self.launches:
            row = rows.setdefault(
                (x.phase, x.source, x.line),
                {"phase": x.phase, "source": x.source, "line": x.line, "kernels": 0, "device_us": 0.0, "kinds": {}},
            )
            row["kernels"] += 1
            row["device_us"] += x.device_us
            row["kinds"][x.kind] = row["kinds"].get(x.kind, 0) + 1
        return sorted(rows.values(), key=lambda r: (-r["kernels"], -r["device_us"]))

    def to_dict(self) -> dict[str, Any]:
        return {
            "kernels": self.kernels,
            "device_us": round(self.device_us, 1),
            "by_kind": {k: {"kernels": n, "device_us": round(us, 1)} for k, (n, us) in self.by_kind().items()},
            "sources": [{**r, "device_us": round(r["device_us"], 1)} for r in self.by_source()],
            "launches": [asdict(x) for x in self.launches],
        }


# The CUDA runtime and driver calls that launch work on the device: a device event shares its correlation id with one.
_LAUNCH_CALLS = ("cudaLaunch", "cuLaunch", "cudaMemset", "cudaMemcpy", "cudaGraphLaunch")


def launches(events: Iterable[Any], lines: dict[str, str] | None = None) -> list[Launch]:
    """The CUDA launches among torch.profiler ``events`` in the order they ran; ``lines`` maps a region range's name to
    the user's line. Each device event is read off the runtime call that launched it (the CPU event with its
    correlation id): the phase, region and ATen op among that call's parents, and where its parents name no phase
    or region, the innermost such ranges around the call's start (a backward runs on autograd's thread). Where no
    device event has its call among ``events``, each CPU event's ``kernels`` are read so instead, in launch order."""
    events = list(events)
    lines = lines or {}
    ranges = [e for e in events if e.name.startswith((PHASE, REGION))]
    calls = {e.id: e for e in events if _is_cpu(e) and e.name.startswith(_LAUNCH_CALLS)}
    # the profiler mirrors ranges on the device's timeline too (user annotations, ours and others'): no launches
    device = [
        e
        for e in events
        if not _is_cpu(e) and not e.name.startswith((PHASE, REGION)) and not getattr(e, "is_user_annotation", False)
    ]
    found = []
    if any(e.id in calls for e in device):
        for kernel in device:
            call = calls.get(kernel.id)
            phase, region, op = _source(call, ranges) if call is not None else (None, None, None)
            us = float(kernel.time_range.end - kernel.time_range.start)
            found.append((kernel.time_range.start, _launch(kernel.name, us, phase, region, op, lines)))
    else:
        for event in events:
            phase, region, op = _source(event, ranges) if getattr(event, "kernels", None) else (None, None, None)
            for kernel in getattr(event, "kernels", None) or ():
                launch = _launch(kernel.name, float(kernel.duration), phase, region, op, lines)
                found.append((event.time_range.start, launch))
    return [launch for _, launch in sorted(found, key=lambda pair: pair[0])]


def _is_cpu(event: Any) -> bool:
    from torch.autograd import DeviceType

    return getattr(event, "device_type", DeviceType.CPU) == DeviceType.CPU


def _launch(name: str, us: float, phase: str | None, region: str | None, op: str | None, lines: dict) -> Launch:
    return Launch(name, kernel_kind(name, op), us, phase, region or op, lines.get(region))


def _source(call: Any, ranges: list[Any]) -> tuple[str | None, str | None, str | None]:
    """The phase, region and ATen op a launch ``call`` ran under: among its parents, else (phase and region) the
    innermost ranges holding its start, on any thread (one step runs one thread at a time)."""
    phase, region, op = _above(call)
    if phase is None or region is None:
        around_phase, around_region = _around(call, ranges)
        phase, region = phase or around_phase, region or around_region
    return phase, region, op


def _above(event: Any) -> tuple[str | None, str | None, str | None]:
    """The phase, the region and the innermost ATen op among ``event``'s parents (itself included)."""
    phase = region = op = None
    parent = event
    while parent is not None:
        name = parent.name
        if phase is None and name.startswith(PHASE):
            phase = name[len(PHASE) :]
        elif region is None and name.startswith(REGION):
            region = name[len(REGION) :]
        elif op is None and name.startswith("aten::"):
            op = name
        parent = getattr(parent, "cpu_parent", None)
    return phase, region, op


def _around(event: Any, ranges: list[Any]) -> tuple[str | None, str | None]:
    """The innermost phase and region ranges holding ``event``'s start."""
    start = event.time_range.start
    holding = [r for r in ranges if r.time_range.start <= start <= r.time_range.end and r is not event]
    holding.sort(key=lambda r: r.time_range.start, reverse=True)  # innermost first
    phase = next((r.name[len(PHASE) :] for r in holding if r.name.startswith(PHASE)), None)
    region = next((r.name[len(REGION) :] for r in holding if r.name.startswith(REGION)), None)
    return phase, region


def step_histogram(
    path: str, fn: Any, args: tuple, kwargs: dict, *, backward: bool = True, warmup: int = 2
) -> KernelHistogram:
    """The launches of one step of ``fn`` (forward, then with ``backward`` the backward of the sum of its floating
    outputs) after ``warmup`` steps, under torch.profiler; the fusion regions of Thunder programs named by
    :func:`labeled_regions`."""
    from torch.profiler import ProfilerActivity, profile

    from .calls import step

    for _ in range(warmup):
        step(fn, args, kwargs, backward)
    torch.cuda.synchronize()
    with labeled_regions(fn) as lines, profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        step(fn, args, kwargs, backward, phase=lambda name: torch.profiler.record_function(PHASE + name))
        torch.cuda.synchronize()
    return KernelHistogram(path, launches(prof.events(), lines))


@contextlib.contextmanager
def labeled_regions(obj: Any) -> Iterator[dict[str, str]]:
    """While open, each fusion call of the Thunder programs of ``obj`` (a ``thunder.jit`` result or a ThunderFX
    object; anything else runs as it is) runs inside a profiler range naming it; yields each range's user line."""
    from .calls import latest_decisions

    programs: list[tuple[Any, str | None]] = []
    if th.is_thunderfx(obj):
        programs = [(sub.jitted, sub.name) for sub in th.thunderfx_subgraphs(obj)]
    elif th.is_jitted(obj):
        programs = [(obj, None)]
    lines: dict[str, str] = {}
    with contextlib.ExitStack() as stack:
        for jitted, subgraph in programs:
            where = {(d.trace, d.region): d.at for d in latest_decisions(jitted) if d.about_region}
            label = _labeler(subgraph, where, lines)
            with contextlib.suppress(Exception):  # a program never called (or cached off) is counted unlabeled
                stack.enter_context(th.instrumenting_program(jitted, label))
        yield lines


def _labeler(subgraph: str | None, where: dict, lines: dict[str, str]) -> Callable:
    def label(kind: str, name: str, fn: Callable) -> Callable:
        range_name = REGION + (f"{subgraph} {kind} {name}" if subgraph else f"{kind} {name}")
        line = where.get((kind, name))
        if line and line != name:
            lines[range_name[len(REGION) :]] = line

        def call(*args: Any) -> Any:
            with torch.profiler.record_function(range_name):
                return fn(*args)

        return call

    return label


def format_histograms(histograms: list[KernelHistogram], top: int = 15, wide: bool = False) -> str:
    """Kernels and device µs a step by kind, one column pair a path, then each path's ``top`` sources."""
    width = None if wide else WIDTH
    header = ["kind"] + [f"{h.path} {what}" for h in histograms for what in ("kernels", "µs")]
    rows = [header]
    by_kind = [h.by_kind() for h in histograms]
    kinds = [k for k in KINDS if any(k in counted for counted in by_kind)]
    for kind in kinds:
        cells = [kind]
        for counted in by_kind:
            n, us = counted.get(kind, (0, 0.0))
            cells += [str(n) if n else "-", f"{us:.0f}" if n else "-"]
        rows.append(cells)
    rows.append(["total"] + [c for h in histograms for c in (str(h.kernels), f"{h.device_us:.0f}")])
    lines = ["Kernels a step (forward and backward) by kind, device µs beside", ""]
    lines += text_table(rows, rule=True, width=width)
    for h in histograms:
        sources = h.by_source()
        lines += [
            "",
            f"{h.path}: where its {h.kernels} kernels come from ({min(top, len(sources))} sources of {len(sources)})",
        ]
        table = [["phase", "kernels", "µs", "kinds", "source"]]
        for r in sources[:top]:
            kinds_text = ", ".join(f"{n} {k}" for k, n in Counter(r["kinds"]).most_common())
            where = r["source"] or "(no ATen op or region)"
            if r["line"]:
                where += f" ({r['line']})"
            table.append([r["phase"] or "-", str(r["kernels"]), f"{r['device_us']:.0f}", kinds_text, fit(where, 200)])
        lines += text_table(table, rule=True, width=width, last_free=True)
    return "\n".join(lines)
