"""Where a first call's time goes: seconds per phase (Dynamo, Thunder's tracing and transforms, the guard's passes
and measurements, the fusions compiling at their first call, Inductor, CUDA-graph capture, the execution) that add
up to the call's wall time with the rest as ``other``.

``with first_call(jitted) as first: jitted(x)`` times what runs inside. The guard times its own part
(:mod:`..phases`); Thunder's comes from its ``CompileStats`` timestamps and Dynamo's and Inductor's from Dynamo's
own records, each named with its seconds. Each guard of ``jitted`` gets the phases in its report (``first_call``).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from .. import _thunder as th
from ..phases import (
    CAPTURE,
    DYNAMO,
    EXECUTION,
    FUSION_COMPILE,
    GUARD_MEASUREMENTS,
    GUARD_PASSES,
    INDUCTOR,
    OTHER,
    PHASES,
    THUNDER_TRACING,
    THUNDER_TRANSFORMS,
    THUNDERFX_SPLIT,
    PhaseLedger,
    closing,
    opening,
)
from ..transform import guards_of
from ..wording import WIDTH, fit

__all__ = ["FirstCall", "first_call"]


@dataclass
class FirstCall:
    """A first call's wall time and its seconds per phase (:data:`..phases.PHASES`, every one, in order, ``other``
    last: they add up to ``wall_s``), and each fusion region's first call (``regions_s``, by where and name)."""

    wall_s: float = 0.0
    phases_s: dict[str, float] = field(default_factory=dict)
    regions_s: dict[str, float] = field(default_factory=dict)

    def to_dict(self, digits: int = 6) -> dict[str, Any]:
        """``{"wall_s": ..., "phases_s": {phase: seconds}, "regions_s": {region: seconds}}``, rounded."""
        return {
            "wall_s": round(self.wall_s, digits),
            "phases_s": {k: round(v, digits) for k, v in self.phases_s.items()},
            "regions_s": {k: round(v, digits) for k, v in self.regions_s.items()},
        }

    def table(self, width: int | None = WIDTH) -> str:
        """The phases as a text table: seconds, share of the wall time and what each holds; the slowest regions."""
        lines = [f"first call: {self.wall_s:.3f} s"]
        for phase, seconds in self.phases_s.items():
            share = seconds / self.wall_s if self.wall_s > 0 else 0.0
            line = f"  {phase:<20} {seconds:9.3f} s {share:6.1%}  {PHASES[phase]}"
            lines.append(line if width is None else fit(line, width))
        slowest = sorted(self.regions_s.items(), key=lambda kv: -kv[1])[:5]
        lines += [f"  fusion compile of {name}: {seconds:.3f} s" for name, seconds in slowest]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()


def _in_backward() -> bool:
    return torch._C._current_graph_task_id() != -1


def _thunder_functions(obj: Any) -> list[Any]:
    if th.is_thunderfx(obj):
        return [sub.jitted for sub in th.thunderfx_subgraphs(obj)]
    return [obj] if th.is_jitted(obj) else []


@contextlib.contextmanager
def first_call(obj: Any, *, clock: Callable[[], int] | None = None) -> Iterator[FirstCall]:
    """Time the first call of ``obj`` (a ``thunder.jit`` function or module, or a ThunderFX object) that runs inside,
    by phase; the :class:`FirstCall` it yields is filled when the block ends, and each :class:`~.FusionGuard` of
    ``obj`` gets it in its report (``report.first_call``). Put one call in the block (a training step's backward
    may follow it: its fusions' first calls count, the rest of it is ``other``). ``clock`` (nanoseconds) defaults to
    ``time.perf_counter_ns``, the clock of Thunder's own timestamps. One block at a time."""
    read = clock or (lambda: time.perf_counter_ns())  # looked up at each read
    record = FirstCall()
    before = {id(j): th.thunder_times(j) for j in _thunder_functions(obj)}
    counts = th.dynamo_counts()
    ledger = PhaseLedger(read, _in_backward, th.dynamo_counts)
    opening(ledger)
    start = read()
    try:
        with th.watching_dynamo_compiles(read, lambda: ledger.timing) as compiles:
            yield record
    finally:
        if torch.cuda.is_initialized():  # the call's device work done, as a first call's wall time holds it
            torch.cuda.synchronize()
        stop = read()
        closing(ledger)
        _fill(record, obj, ledger, (stop - start) / 1e9, before, counts, compiles)
        for guard in guards_of(obj):
            guard.report.first_call = record.to_dict()


def _fill(
    record: FirstCall,
    obj: Any,
    ledger: PhaseLedger,
    wall_s: float,
    before: dict[int, th.ThunderTimes | None],
    counts: dict[str, int],
    compiles: list[th.DynamoCompile],
) -> None:
    tracing = transforms = execution = 0
    for jitted in _thunder_functions(obj):
        now, then = th.thunder_times(jitted), before.get(id(jitted))
        if now is None or now.calls == (then.calls if then else 0):
            continue
        if now.compiles > (then.compiles if then else 0):
            tracing += now.tracing_ns
            transforms += now.transforms_ns
        execution += now.execution_ns
    # Dynamo compiles started inside Thunder's computation or compilation (a torch.compile region, the guard's
    # measurements there) are not the user's frames; a region's that the guard did not time itself (no guard in
    # ``obj``) is its fusion compile, out of the execution
    apart = ledger.probes + [(c.before, c.after) for c in compiles if not c.users]
    untimed = [c for c in compiles if c.in_run and not c.timed]
    fusion_ns = sum(c.stop_ns - c.start_ns for c in untimed)
    in_forward_ns = sum(c.stop_ns - c.start_ns for c in untimed if c.forward)
    # a backward compile deferred to run time outside Thunder's (a split piece's): Inductor's, none of Dynamo's keys
    deferred_ns = sum(c.stop_ns - c.start_ns for c in compiles if c.users and c.trigger == "LAZY_BACKWARD")
    phases = dict.fromkeys(PHASES, 0.0)
    if th.is_thunderfx(obj):
        dynamo = th.dynamo_seconds(counts, th.dynamo_counts(), apart)
        inductor = dynamo[th.INDUCTOR_COMPILE] + dynamo[th.INDUCTOR_LOAD]  # inside the backend's calls
        phases[DYNAMO] = max(dynamo[th.DYNAMO_FRAME] - dynamo[th.DYNAMO_BACKEND], 0.0)
        phases[THUNDERFX_SPLIT] = max(dynamo[th.DYNAMO_BACKEND] - inductor, 0.0)
        phases[INDUCTOR] = inductor + deferred_ns / 1e9
    phases[THUNDER_TRACING] = tracing / 1e9
    phases[THUNDER_TRANSFORMS] = max(transforms - ledger.compiling_ns, 0) / 1e9
    for phase in (GUARD_PASSES, GUARD_MEASUREMENTS, FUSION_COMPILE, CAPTURE):
        phases[phase] = ledger.seconds(phase)
    phases[FUSION_COMPILE] += fusion_ns / 1e9
    phases[EXECUTION] = max(execution - ledger.executing_ns - in_forward_ns, 0) / 1e9
    phases[OTHER] = wall_s - sum(phases.values())
    record.wall_s = wall_s
    record.phases_s = phases
    record.regions_s = {name: ns / 1e9 for name, ns in ledger.regions_ns.items()}
