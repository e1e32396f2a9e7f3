"""Where a compiled step's host time goes: Dynamo, Thunder's cache lookup and prologue, the autograd bridge,
CUDA graphs (input copies, replays, bookkeeping), ops run outside any graph, the autograd engine, waiting for
the GPU, and the rest. A step whose wall time is far above its GPU work waits on these.

The step runs ``steps`` times alone (its wall time) and ``steps`` times under ``cProfile``; each function's own
time goes to the part its file or name belongs to, and a C function's to its caller's part (``copy_`` called by
a CUDA-graph runner is an input copy; called by a Thunder trace, an op outside the graphs). cProfile slows Python
more than C, so the shares are of the profiled time: read them as where to look, the wall time as the figure.
"""

from __future__ import annotations

import cProfile
import pstats
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["PARTS", "HostTime", "host_time", "part_of"]

PARTS = (
    "Dynamo and Inductor's wrappers (frames, guards)",
    "Thunder: cache lookup, prologue",
    "autograd bridge",
    "CUDA graphs: input copies",
    "CUDA graphs: replay",
    "CUDA graphs: bookkeeping",
    "ops outside the graphs",
    "autograd engine",
    "waiting for the GPU",
    "other Python (the user's code, the step)",
)
DYNAMO, THUNDER, BRIDGE, COPIES, REPLAY, BOOKKEEPING, OPS, ENGINE, WAITING, OTHER = PARTS

_BY_NAME = (  # a C function by its name, whoever calls it
    ("_cuda_synchronize", WAITING),
    ("run_backward", ENGINE),
    ("'replay' of", REPLAY),
    ("_foreach_copy_", COPIES),
    ("_dynamo", DYNAMO),
)
_BY_FILE = (  # a Python function by its file
    ("transforms/cudagraph.py", BOOKKEEPING),
    ("_thunder/cudagraphs.py", BOOKKEEPING),
    ("_thunder/graph_calls.py", BOOKKEEPING),
    ("_thunder/entry.py", THUNDER),
    ("torch/cuda/graphs.py", REPLAY),
    ("torch/_dynamo/", DYNAMO),
    ("torch/_guards", DYNAMO),
    ("torch/_inductor/cudagraph", BOOKKEEPING),
    ("torch/_inductor/", DYNAMO),
    ("torch/_functorch/", BRIDGE),
    ("thunder/executors/torch_autograd.py", BRIDGE),
    ("torch/autograd/function.py", BRIDGE),
    ("torch/autograd/", ENGINE),
    ("thunder/dynamo/", DYNAMO),
    ("thunder/", THUNDER),
    ("thunder.prologue", THUNDER),
    ("thunder.computation", OPS),
    ("thunder.backward_fn", OPS),
    ("thunder.augmented_forward", OPS),
)


def part_of(filename: str, name: str, caller: str | None = None) -> str:
    """The part of :data:`PARTS` a function belongs to, by its ``filename`` and ``name`` (cProfile's), and for a C
    function (``filename`` ``~``) not named in ``_BY_NAME``, by the part of its ``caller``."""
    path = filename.replace("\\", "/")
    if path == "~":
        for word, part in _BY_NAME:
            if word in name:
                return part
        if caller is None:
            return OTHER
        if caller in (BOOKKEEPING, REPLAY) and "copy_" in name:
            return COPIES
        return OPS if caller in (OTHER, OPS) and name.startswith("<method") else caller
    for word, part in _BY_FILE:
        if word in path:
            return part
    return OTHER


@dataclass
class HostTime:
    """A step's wall time alone and where its profiled host time went, in ms a step by part."""

    wall_ms: float
    profiled_ms: float
    parts_ms: dict[str, float] = field(default_factory=dict)  # by part, the profiled time a step
    calls: dict[str, float] = field(default_factory=dict)  # by part, function calls a step
    top: list[tuple[str, str, float]] = field(default_factory=list)  # (part, function, ms a step), largest first

    def table(self) -> str:
        """The parts as a text table: ms a step and share of the profiled time."""
        lines = [f"wall {self.wall_ms:.3f} ms a step alone; {self.profiled_ms:.3f} ms profiled"]
        for part in PARTS:
            ms = self.parts_ms.get(part, 0.0)
            if ms:
                lines.append(f"  {part:<42} {ms:8.3f} ms  {ms / self.profiled_ms:6.1%}")
        return "\n".join(lines)


def host_time(step: Callable[[], Any], steps: int = 20, warmup: int = 3, top: int = 12) -> HostTime:
    """Run ``step`` (one whole step: call, loss, backward, and a synchronize where the device needs one) ``warmup``
    times, then ``steps`` times alone for its wall time and ``steps`` times under cProfile for its parts."""
    if steps < 1 or warmup < 0:
        raise ValueError("host_time: steps must be >= 1 and warmup >= 0")
    for _ in range(warmup):
        step()
    began = time.perf_counter()
    for _ in range(steps):
        step()
    wall_ms = (time.perf_counter() - began) * 1e3 / steps
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(steps):
        step()
    profile.disable()
    stats = pstats.Stats(profile).stats  # (file, line, name) -> (calls, prim calls, own, cumulative, callers)
    own_part = {key: part_of(key[0], key[2]) for key in stats}
    parts: dict[str, float] = {}
    calls: dict[str, float] = {}
    by_function: dict[tuple[str, str], float] = {}
    for key, (count, _, own, _, callers) in stats.items():
        if key[0] == "~" and own_part[key] == OTHER and callers:
            for caller, edge in callers.items():  # a C function's time by the part of each caller
                part = part_of(key[0], key[2], own_part.get(caller, OTHER))
                parts[part] = parts.get(part, 0.0) + edge[2]
                calls[part] = calls.get(part, 0) + edge[0]
                by_function[part, key[2]] = by_function.get((part, key[2]), 0.0) + edge[2]
            continue
        part = own_part[key]
        parts[part] = parts.get(part, 0.0) + own
        calls[part] = calls.get(part, 0) + count
        label = key[2] if key[0] == "~" else f"{key[0].rsplit('/', 1)[-1]}:{key[1]}({key[2]})"
        by_function[part, label] = by_function.get((part, label), 0.0) + own
    per_step = 1e3 / steps
    ranked = sorted(by_function.items(), key=lambda kv: -kv[1])[:top]
    return HostTime(
        wall_ms=round(wall_ms, 3),
        profiled_ms=round(sum(parts.values()) * per_step, 3),
        parts_ms={p: round(parts[p] * per_step, 3) for p in PARTS if p in parts},
        calls={p: calls[p] / steps for p in PARTS if p in calls},
        top=[(part, name, round(ms * per_step, 3)) for (part, name), ms in ranked],
    )
