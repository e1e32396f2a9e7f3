"""What Thunder and Dynamo record of a compilation's time: a ``thunder.jit`` function's ``CompileStats`` timestamps
(``time.perf_counter_ns``) and Dynamo's ``compilation_time_metrics`` (seconds per timed step), read, never set."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

import thunder

__all__ = [
    "DYNAMO_BACKEND",
    "DYNAMO_FRAME",
    "INDUCTOR_COMPILE",
    "ThunderTimes",
    "dynamo_counts",
    "dynamo_seconds",
    "thunder_times",
]

# Dynamo's keys: a frame's whole compile, the backend's call within it, and AOT autograd with Inductor's compile of a
# graph (``torch._inductor.compile``: the pieces ThunderFX's splitter leaves out of Thunder).
DYNAMO_FRAME = "_compile.compile_inner"
DYNAMO_BACKEND = "OutputGraph.call_user_compiler"
INDUCTOR_COMPILE = "create_aot_dispatcher_function"
_KEYS = (DYNAMO_FRAME, DYNAMO_BACKEND, INDUCTOR_COMPILE)


@dataclass(frozen=True)
class ThunderTimes:
    """One ``thunder.jit`` function's records: its calls and compilations so far, and of its last call, in ns:
    tracing (Thunder's interpreter), from the end of tracing to the prologue's run (its transforms, the guard's
    passes among them; 0 where the last call found its program in the cache) and the computation's run."""

    calls: int
    compiles: int
    tracing_ns: int
    transforms_ns: int
    execution_ns: int


def _span(start: int, stop: int) -> int:
    return stop - start if 0 < start <= stop else 0


def thunder_times(jitted: Any) -> ThunderTimes | None:
    """Thunder's records of ``jitted`` (a ``thunder.jit`` function or module); None for anything else."""
    cs = thunder.compile_stats(jitted)
    if cs is None:
        return None
    tracing_stop = cs.last_trace_tracing_stop
    compiled_last = cs.last_prologue_transformation_start > 0  # Thunder sets it 0 on a cache hit
    return ThunderTimes(
        calls=cs.calls,
        compiles=cs.cache_misses,
        tracing_ns=_span(cs.last_trace_tracing_start, tracing_stop),
        transforms_ns=_span(tracing_stop, cs.last_prologue_execution_start) if compiled_last else 0,
        execution_ns=_span(cs.last_trace_host_execution_start, cs.last_trace_host_execution_stop),
    )


def _metrics() -> dict[str, list[float]]:
    utils = sys.modules.get("torch._dynamo.utils")  # never loads Dynamo: without it, it recorded nothing
    return getattr(utils, "compilation_time_metrics", None) or {}


def dynamo_counts() -> dict[str, int]:
    """How many records Dynamo holds now of each step it times that a first call's phases read."""
    metrics = _metrics()
    return {key: len(metrics.get(key, ())) for key in _KEYS}


def dynamo_seconds(before: dict[str, int], after: dict[str, int], apart: list[tuple[dict, dict]]) -> dict[str, float]:
    """Seconds per key Dynamo recorded between the counts ``before`` and ``after``, less those recorded within any
    ``(before, after)`` pair of ``apart`` (compiles that belong to another phase)."""
    metrics = _metrics()
    seconds = {}
    for key in _KEYS:
        records = metrics.get(key, [])
        skipped = {i for b, a in apart for i in range(b.get(key, 0), a.get(key, 0))}
        first, last = before.get(key, 0), after.get(key, 0)
        seconds[key] = sum(records[i] for i in range(first, min(last, len(records))) if i not in skipped)
    return seconds
