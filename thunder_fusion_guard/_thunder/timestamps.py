"""What Thunder and Dynamo record of a compilation's time: a ``thunder.jit`` function's ``CompileStats`` timestamps
(``time.perf_counter_ns``) and Dynamo's ``compilation_time_metrics`` (seconds per timed step), read, never set; and
whose each Dynamo compile is (the user's frame, or one Thunder started: a region's, a measurement's), told by
Dynamo's own compile callbacks, registered for a window and removed after it."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import thunder
import torch

__all__ = [
    "DYNAMO_BACKEND",
    "DYNAMO_FRAME",
    "INDUCTOR_COMPILE",
    "INDUCTOR_LOAD",
    "DynamoCompile",
    "ThunderTimes",
    "dynamo_counts",
    "dynamo_seconds",
    "thunder_times",
    "watching_dynamo_compiles",
]

# Dynamo's keys: a frame's whole compile, the backend's call within it, and AOT autograd with Inductor's compile of a
# graph (``torch._inductor.compile``: the pieces ThunderFX's splitter leaves out of Thunder), or its load from
# AOT autograd's cache in place of that compile.
DYNAMO_FRAME = "_compile.compile_inner"
DYNAMO_BACKEND = "OutputGraph.call_user_compiler"
INDUCTOR_COMPILE = "create_aot_dispatcher_function"
INDUCTOR_LOAD = "AOTAutogradCache.inductor_load"
_KEYS = (DYNAMO_FRAME, DYNAMO_BACKEND, INDUCTOR_COMPILE, INDUCTOR_LOAD)

_THUNDER_DIR = os.path.dirname(thunder.__file__) + os.sep
_THUNDERFX_DIR = os.path.join(_THUNDER_DIR, "dynamo") + os.sep


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
    # the transforms end where the compiled program first runs: its prologue, or its computation where a later call
    # ran the prologue again without Thunder's cache search (which would reset the start above)
    ran = [t for t in (cs.last_prologue_execution_start, cs.last_trace_host_execution_start) if t >= tracing_stop > 0]
    return ThunderTimes(
        calls=cs.calls,
        compiles=cs.cache_misses,
        tracing_ns=_span(cs.last_trace_tracing_start, tracing_stop),
        transforms_ns=_span(tracing_stop, min(ran)) if compiled_last and ran else 0,
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


@dataclass
class DynamoCompile:
    """One Dynamo compile seen by :func:`watching_dynamo_compiles`: Dynamo's record counts before and after it, its
    start and stop (ns, the window's clock), whether it ran inside Thunder's computation (``in_run``: a fusion
    region's ``torch.compile`` at its first call, forward or backward) or its compilation or the guard's
    (``in_compile``), neither of them the user's frame; in the forward (``forward``); and inside a section the
    guard timed itself (``timed``)."""

    before: dict[str, int]
    after: dict[str, int]
    start_ns: int
    stop_ns: int
    in_run: bool
    in_compile: bool
    forward: bool
    timed: bool
    trigger: str = "DYNAMO"  # Dynamo's name for what started it: a frame it traces, or at run time a deferred backward

    @property
    def frame(self) -> bool:
        """A frame Dynamo traced (else a compile deferred to run time: a backward, a CUDA graph's recording)."""
        return self.trigger == "DYNAMO"

    @property
    def users(self) -> bool:
        return not (self.in_run or self.in_compile)


def _whose(frame: Any) -> tuple[bool, bool]:
    """(inside Thunder's computation, inside Thunder's compilation) for the stack from ``frame`` up. Thunder's
    computation is code it generated (files named ``thunder.<name>``); its compilation, its own modules (the guard's
    passes and measurements run inside them). ThunderFX's modules call the user's compiled frames: the user's, as
    are Inductor's compiles of a graph the guard hands it at run time (a rescue)."""
    in_run = in_compile = False
    while frame is not None:
        name = frame.f_code.co_filename
        if name.startswith("thunder.") and os.sep not in name:
            in_run = True
        elif name.startswith(_THUNDER_DIR) and not name.startswith(_THUNDERFX_DIR):
            in_compile = True
        frame = frame.f_back
    return in_run, in_compile and not in_run


@contextlib.contextmanager
def watching_dynamo_compiles(clock: Callable[[], int], timing: Callable[[], bool]) -> Iterator[list[DynamoCompile]]:
    """Each Dynamo compile that starts inside the block, in order (filled as they end), told apart by whose it is;
    ``timing`` says whether the guard times a section of its own now. Dynamo's compile callbacks are registered for
    the block and removed after it."""
    from torch._dynamo.callback import callback_handler

    seen: list[DynamoCompile] = []
    open_: list[tuple[dict[str, int], int, bool, bool, bool, bool]] = []

    def start(args: Any) -> None:
        with contextlib.suppress(Exception):  # a record is never worth the user's compile
            in_run, in_compile = _whose(sys._getframe(1))
            forward = torch._C._current_graph_task_id() == -1
            open_.append((dynamo_counts(), clock(), in_run, in_compile, forward, timing()))

    def end(args: Any) -> None:
        with contextlib.suppress(Exception):
            if open_:
                before, start_ns, in_run, in_compile, forward, timed = open_.pop()
                after = dynamo_counts()
                trigger = str(getattr(args.callback_trigger, "name", ""))
                if trigger == "DYNAMO":
                    after[DYNAMO_FRAME] += 1  # the frame's own record is made just after its callbacks end
                stop = clock()
                seen.append(DynamoCompile(before, after, start_ns, stop, in_run, in_compile, forward, timed, trigger))

    callback_handler.register_start_callback(start)
    callback_handler.register_end_callback(end)
    try:
        yield seen
    finally:
        callback_handler.remove_start_callback(start)
        callback_handler.remove_end_callback(end)
