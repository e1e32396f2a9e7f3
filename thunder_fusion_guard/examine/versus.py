"""Where a step's time goes under several compilers, side by side.

Each variant's step is timed (synchronised wall time, and the host's time until the step returns), then run
under ``torch.profiler``. Device time and launches are attributed to the pass (forward, backward) and the kind
of work (:func:`thunder_fusion_guard.ops.work_kind`: attention, matmul, norm, rope, activation, ...) from what
launched each kernel: a Thunder fusion region (its ops; every region call runs inside a profiler range named
after it), an aten op, or an Inductor kernel (its name lists the aten ops it fuses). On CPU the work of each
such call is its CPU time. For a Thunder program the host time is split into Thunder's prologue, the forward
and backward traces and, inside them, the fusion calls. :meth:`SideBySide.findings` says where the first
variant loses to the others, and which of it the guard cannot remove.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from html import escape
from typing import Any

import torch

from .. import _thunder as th
from ..measure.timing import interleaved_rounds, sync
from ..ops import work_kind
from ..regions import find_regions
from ..render.bars import grouped_bars_svg
from ..render.table import markdown_table, text_table
from .calls import programs

RANGE = "fusion_guard::"  # profiler ranges around Thunder's fusion calls: fusion_guard::<pass>::<region>
PASSES = ("forward", "backward")
# A kind's device-time gap is named when it exceeds both of these.
GAP_FRACTION = 0.05
GAP_US = 10.0
INSTRUMENTED_WARMUP = 3  # steps of a rebuilt (instrumented) program before it is measured
HOST_BOUND = 0.9  # the host's time until return over the synchronised step: above this, the step waits on the host


@dataclass
class Work:
    """Device time (µs per step) and launches per step of one pass and kind of work; ``host_us`` the host time of
    the Thunder fusion calls among them, timed without the profiler (0 where not measured)."""

    device_us: float = 0.0
    launches: float = 0.0
    host_us: float = 0.0


@dataclass
class VariantProfile:
    """One variant's step: ``step_us`` synchronised wall time, ``host_us`` time until the step's Python returned
    (medians), ``device_us`` and ``launches`` per step (kernels on CUDA; calls and their CPU time on CPU),
    ``work`` by ``"<pass> <kind>"``, ``host_parts`` the host time of a Thunder program by part, ``fusion_calls``
    Thunder fusion calls per step."""

    variant: str
    device: str
    step_us: float
    host_us: float
    device_us: float
    launches: float
    work: dict[str, Work] = field(default_factory=dict)
    host_parts: dict[str, float] = field(default_factory=dict)
    fusion_calls: float = 0.0

    @property
    def host_bound(self) -> bool:
        return self.device == "cuda" and self.host_us >= HOST_BOUND * self.step_us


@dataclass
class SideBySide:
    """The profiles of one step under several variants; the first is the one :meth:`findings` explains."""

    case: str
    profiles: list[VariantProfile]

    def table(self, markdown: bool = False) -> str:
        """Step, host and device rows, then device time per pass and kind, one column per variant."""
        names = [p.variant for p in self.profiles]
        head = ["", *names]
        if len(names) > 1:
            head.append(f"{names[0]} minus {names[1]}")

        def row(label: str, values: list[float], digits: int = 1) -> list[str]:
            cells = [f"{v:.{digits}f}" for v in values]
            if len(values) > 1:
                cells.append(f"{values[0] - values[1]:+.{digits}f}")
            return [label, *cells]

        first = self.profiles[0]
        unit = "µs" if first.device == "cuda" else "µs CPU"
        rows = [
            row("step µs (synchronised)", [p.step_us for p in self.profiles]),
            row("host µs until the step returns", [p.host_us for p in self.profiles]),
            row(f"work {unit}, all", [p.device_us for p in self.profiles]),
            row("launches" if first.device == "cuda" else "calls", [p.launches for p in self.profiles], 0),
        ]
        keys = sorted({k for p in self.profiles for k in p.work}, key=_work_order)
        for key in keys:
            rows.append(row(f"  {key}", [p.work.get(key, Work()).device_us for p in self.profiles]))
        for p in self.profiles:
            for part, us in p.host_parts.items():
                rows.append([f"host of {p.variant}: {part}", *[f"{us:.1f}" if q is p else "" for q in self.profiles]])
                if len(names) > 1:
                    rows[-1].append("")
        if markdown:
            return "\n".join(markdown_table(head, rows))
        return "\n".join(text_table([head, *rows]))

    def findings(self) -> list[str]:
        """Sentences: where the first variant loses to each other one (step, host, kinds of work), and what of
        its host time the guard cannot remove."""
        first, out = self.profiles[0], []
        for other in self.profiles[1:]:
            gap = first.step_us - other.step_us
            if gap <= 0:
                out.append(
                    f"{first.variant} is at or ahead of {other.variant}: {first.step_us:.0f} vs {other.step_us:.0f} µs"
                )
                continue
            device_gap = first.device_us - other.device_us
            host_bound = (
                f"; {first.variant} is host-bound (its host time is {first.host_us / first.step_us:.0%} of the step)"
            )
            out.append(
                f"{first.variant} is behind {other.variant} by {gap:.0f} µs a step ({first.step_us:.0f} vs "
                f"{other.step_us:.0f}); work on the device differs by {device_gap:+.0f} µs"
                + (host_bound if first.host_bound else "")
            )
            for key, diff in self._work_gaps(first, other):
                mine = first.work.get(key, Work())
                theirs = other.work.get(key, Work())
                out.append(
                    f"  {key}: {mine.device_us:.0f} vs {theirs.device_us:.0f} µs ({diff:+.0f}), "
                    f"{mine.launches:.0f} vs {theirs.launches:.0f} launches"
                )
        if first.host_parts:
            calls = first.host_parts.get("fusion calls", 0.0)
            per_call = calls / first.fusion_calls if first.fusion_calls else 0.0
            parts = ", ".join(f"{k} {v:.0f} µs" for k, v in first.host_parts.items())
            out.append(
                f"host time of {first.variant}: {parts}; a fusion call costs {per_call:.0f} µs on the host. "
                "The prologue (Thunder checks every input on every call), the interpretation of the traces op by "
                "op and the fusion executor's own per-call cost are Thunder's: no trace rewrite removes them; "
                "CUDA graphs (GuardedCUDAGraphs, or Thunder's CUDAGraphTransform) hide what they capture"
            )
        return out

    @staticmethod
    def _work_gaps(first: VariantProfile, other: VariantProfile) -> list[tuple[str, float]]:
        gaps = []
        for key in set(first.work) | set(other.work):
            mine, theirs = first.work.get(key, Work()).device_us, other.work.get(key, Work()).device_us
            diff = mine - theirs
            if diff > GAP_US and diff > GAP_FRACTION * max(theirs, 1e-9):
                gaps.append((key, diff))
        return sorted(gaps, key=lambda kv: -kv[1])

    def to_dict(self) -> dict[str, Any]:
        return {"case": self.case, "profiles": [asdict(p) for p in self.profiles], "findings": self.findings()}

    def svg(self) -> str:
        """The picture: step, host and each pass and kind of work as bars, one per variant."""
        keys = sorted({k for p in self.profiles for k in p.work}, key=_work_order)
        rows = [
            ("step (synchronised)", [p.step_us for p in self.profiles]),
            ("host until the step returns", [p.host_us for p in self.profiles]),
            *((key, [p.work.get(key, Work()).device_us for p in self.profiles]) for key in keys),
        ]
        return grouped_bars_svg([p.variant for p in self.profiles], rows)

    def html(self) -> str:
        """A self-contained page: the picture, the findings and the table."""
        findings = "".join(f"<li>{escape(f)}</li>" for f in self.findings())
        return (
            f"<!doctype html><html><head><meta charset='utf-8'><title>{escape(self.case)}: side by side</title>"
            f"</head><body><h1>{escape(self.case)}: {escape(' vs '.join(p.variant for p in self.profiles))}</h1>"
            f"{self.svg()}<h2>Where {escape(self.profiles[0].variant)} loses</h2><ul>{findings}</ul>"
            f"<h2>Table (µs per step)</h2><pre>{escape(self.table())}</pre></body></html>"
        )


def _work_order(key: str) -> tuple[int, str]:
    return (0 if key.startswith("forward") else 1, key)


def side_by_side(
    case: str,
    steps: Mapping[str, Callable[[], Any]],
    compiled: Mapping[str, Any] | None = None,
    *,
    rounds: int = 10,
    profiled_rounds: int = 3,
    warmup: int = 2,
    device: str = "cpu",
) -> SideBySide:
    """Profile one step under each variant (``steps``: unsynchronised step callables, first variant first);
    ``compiled[variant]`` is the ``thunder.jit`` or ThunderFX object a Thunder variant runs, whose fusion
    calls get profiler ranges and whose host time is split by part."""
    if rounds < 1 or profiled_rounds < 1:
        raise ValueError("side_by_side: rounds and profiled_rounds must be at least 1")
    compiled = compiled or {}
    out = []
    for variant, step in steps.items():
        for _ in range(warmup):
            step()
        sync(device == "cuda")
        step_us, host_us = _time(step, rounds, device)
        profile = _profile(variant, step, compiled.get(variant), profiled_rounds, device)
        profile.step_us, profile.host_us = step_us, host_us
        out.append(profile)
    return SideBySide(case, out)


def _time(step: Callable[[], Any], rounds: int, device: str) -> tuple[float, float]:
    """Median µs of a step, synchronised (the benchmarks' one timing loop), and of its host part alone (until the
    step returns)."""
    hosts: list[float] = []

    def timed() -> None:
        start = time.perf_counter_ns()
        step()
        hosts.append((time.perf_counter_ns() - start) / 1e3)

    walls = interleaved_rounds({"step": timed}, rounds, sync=lambda: sync(device == "cuda")).samples["step"]
    return statistics.median(walls) * 1e6, statistics.median(hosts)


@dataclass
class _Ranges:
    """What the instrumented Thunder programs record: region kinds and trace host times."""

    kinds: dict[str, str] = field(default_factory=dict)  # range name -> kind of work
    trace_ns: dict[str, list[int]] = field(default_factory=dict)
    call_ns: dict[str, list[int]] = field(default_factory=dict)  # range name -> host time of each call


@contextlib.contextmanager
def _instrumented(obj: Any, ranges: _Ranges, profiled: bool) -> Iterator[list[Any]]:
    """Each Thunder program of ``obj`` (none for other objects) rebuilt with its traces timed and, ``profiled``,
    a profiler range around every fusion call, else a timer."""
    if obj is None or not (th.is_thunderfx(obj) or th.is_jitted(obj)):
        yield []
        return
    found = programs(obj)
    with contextlib.ExitStack() as stack:
        for index, (jitted, _) in enumerate(found):
            for kind, trace in zip(PASSES, th.last_traces(jitted), strict=True):
                if trace is None:
                    continue
                for region in find_regions(trace):
                    ranges.kinds[range_label(kind, index, region.name)] = work_kind(region.deep_op_names)
            wrap_call = _range_call(index) if profiled else _timed_call(index, ranges)
            stack.enter_context(th.instrumenting_program(jitted, wrap_call, _timed_trace(ranges)))
        yield [jitted for jitted, _ in found]


def range_label(kind: str, index: int, region: str) -> str:
    """The profiler range (and timer) name of one fusion call: ``fusion_guard::<pass>::<program>:<region>``."""
    return f"{RANGE}{kind}::{index}:{region}"


def _range_call(index: int) -> th.WrapCall:
    def wrap(kind: str, name: str, fn: Callable) -> Callable:
        label = range_label(kind, index, name)

        def call(*args):
            with torch.profiler.record_function(label):
                return fn(*args)

        return call

    return wrap


def _timed_call(index: int, ranges: _Ranges) -> th.WrapCall:
    def wrap(kind: str, name: str, fn: Callable) -> Callable:
        samples = ranges.call_ns.setdefault(range_label(kind, index, name), [])

        def call(*args):
            start = time.perf_counter_ns()
            try:
                return fn(*args)
            finally:
                samples.append(time.perf_counter_ns() - start)

        return call

    return wrap


def _timed_trace(ranges: _Ranges) -> th.WrapTrace:
    def wrap(kind: str, fn: Callable) -> Callable:
        def call(*args, **kwargs):
            start = time.perf_counter_ns()
            try:
                return fn(*args, **kwargs)
            finally:
                ranges.trace_ns.setdefault(f"{kind} trace", []).append(time.perf_counter_ns() - start)

        return call

    return wrap


def _profile(variant: str, step: Callable[[], Any], obj: Any, rounds: int, device: str) -> VariantProfile:
    """Device time by pass and kind from ``rounds`` profiled steps; for a Thunder program, its host time by part
    from as many steps run with timers only (the profiler's own cost would swell host times)."""
    from torch.profiler import ProfilerActivity, profile, schedule

    result = VariantProfile(variant, device, 0.0, 0.0, 0.0, 0.0)
    timed = _Ranges()
    prologue: list[int] = []
    with _instrumented(obj, timed, profiled=False) as jitted:
        if jitted:
            for _ in range(INSTRUMENTED_WARMUP):  # a rebuilt program's first calls warm its executors' caches
                step()
            sync(device == "cuda")
            timed.trace_ns.clear()
            for samples in timed.call_ns.values():
                samples.clear()
            for _ in range(rounds):
                step()
                sync(device == "cuda")
                prologue += [th.last_prologue_ns(j) for j in jitted]
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    # Steps with the profiler on but not recording: the rebuilt program warms up, and a compiler that recompiles
    # under the profiler does so there.
    plan = schedule(wait=0, warmup=INSTRUMENTED_WARMUP, active=rounds, repeat=1)
    ranges = _Ranges()
    with _instrumented(obj, ranges, profiled=True), profile(activities=activities, schedule=plan) as prof:
        for _ in range(rounds + INSTRUMENTED_WARMUP):
            step()
            sync(device == "cuda")
            prof.step()
    _attribute(prof.events(), ranges, result, rounds, device)
    if jitted:
        for label, samples in timed.call_ns.items():
            kind = f"{label[len(RANGE) :].split('::', 1)[0]} {timed.kinds.get(label, 'other')}"
            result.work.setdefault(kind, Work()).host_us += sum(samples) / rounds / 1e3
        result.host_parts["prologue"] = sum(prologue) / rounds / 1e3
        for part, samples in timed.trace_ns.items():
            result.host_parts[part] = sum(samples) / rounds / 1e3
        result.host_parts["fusion calls"] = sum(w.host_us for w in result.work.values())
    return result


def _attribute(events: Sequence[Any], ranges: _Ranges, out: VariantProfile, rounds: int, device: str) -> None:
    """Add each kernel (CUDA) or each outermost call of known work (CPU) to ``out.work`` by pass and kind."""
    for event in events:
        if getattr(event, "device_type", None) != torch.autograd.DeviceType.CPU:
            continue
        owner = _owner(event, ranges)
        if event.name.startswith(RANGE):
            out.fusion_calls += 1 / rounds
        if device == "cuda":
            for kernel in event.kernels:
                key = owner[0] if owner[1] else f"{_pass_of(event)} {work_kind([kernel.name])}"
                _add(out, key, kernel.duration, rounds)
        elif owner[1] is event:
            _add(out, owner[0], event.cpu_time_total, rounds)
        elif owner[1] is None and _is_work(event):
            # CPU: each call's own time goes to its kind; only outermost calls count as calls
            call = not _has_work_ancestor(event)
            _add(out, f"{_pass_of(event)} {work_kind([event.name])}", event.self_cpu_time_total, rounds, call)


def _add(out: VariantProfile, key: str, us: float, rounds: int, call: bool = True) -> None:
    work = out.work.setdefault(key, Work())
    work.device_us += us / rounds
    out.device_us += us / rounds
    if call:
        work.launches += 1 / rounds
        out.launches += 1 / rounds


def _owner(event: Any, ranges: _Ranges) -> tuple[str, Any]:
    """The work key and range event of the Thunder fusion call ``event`` runs in (``("", None)`` if none)."""
    e = event
    while e is not None:
        if e.name.startswith(RANGE):
            kind_pass = e.name[len(RANGE) :].split("::", 1)[0]
            return f"{kind_pass} {ranges.kinds.get(e.name, 'other')}", e
        e = e.cpu_parent
    return "", None


def _is_work(event: Any) -> bool:
    name = event.name
    return name.startswith(("aten::", "triton_", "cpp_fused", "Torch-Compiled Region", "CompiledFunction"))


def _has_work_ancestor(event: Any) -> bool:
    e = event.cpu_parent
    while e is not None:
        if _is_work(e) or e.name.startswith(RANGE):
            return True
        e = e.cpu_parent
    return False


def _pass_of(event: Any) -> str:
    e = event
    while e is not None:
        if "Backward" in e.name or "evaluate_function" in e.name or "backward" in e.name.lower():
            return "backward"
        e = e.cpu_parent
    return "forward"
