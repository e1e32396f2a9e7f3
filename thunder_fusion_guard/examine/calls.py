"""The fusion calls of one run: every region of the final traces, with the arguments it really got.

Works on a ``thunder.jit`` result and on a ThunderFX object (``thunderfx(...)``), whose Thunder
programs are the split subgraphs; both the profiler and the kernel collector start from here.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_map

from .. import _thunder as th
from ..decisions import Decision
from ..ops import is_in_place_name
from ..passes.rescue import copied_args
from ..regions import Region, find_regions
from ..transform import guards_of


@dataclass
class RegionCall:
    """One fusion region of a final forward or backward trace and the arguments of its last call (None: not called)."""

    trace: str
    region: Region
    args: tuple | None
    decision: Decision | None = None

    def replay_args(self) -> tuple | None:
        """The recorded arguments; copies where the region writes into its inputs (in-place ops)."""
        if self.args is None or not any(is_in_place_name(op) for op in self.region.ops):
            return self.args
        return copied_args(self.args)


@dataclass
class ProgramCalls:
    """One Thunder program (the jitted function, or one ThunderFX subgraph), its regions' calls and decisions.

    ``subgraph`` is the guard's id for a ThunderFX subgraph (Thunder's name for it without a guard);
    ``args`` and ``kwargs`` are what the program was called with.
    """

    jitted: Any
    subgraph: str | None
    traces: dict[str, th.TraceCtx] = field(default_factory=dict)
    calls: list[RegionCall] = field(default_factory=list)
    decisions: list[Decision] = field(default_factory=list)
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)


def step(
    fn: Any,
    args: tuple,
    kwargs: dict,
    backward: bool = True,
    phase: Callable[[str], AbstractContextManager] | None = None,
) -> Any:
    """Call ``fn``; with ``backward``, also the backward of the sum of the floating outputs that require grad.
    ``phase('forward')`` and ``phase('backward')``, given, are entered around each (a profiler range, say)."""
    around = phase or (lambda name: nullcontext())
    with around("forward"):
        out = fn(*args, **kwargs)
    if backward:
        flat = tree_flatten(out)[0]
        grads = [t for t in flat if isinstance(t, torch.Tensor) and t.requires_grad and t.is_floating_point()]
        if grads:
            with around("backward"):
                sum(t.float().sum() for t in grads).backward()
    return out


def program_calls(obj: Any, args: tuple, kwargs: dict, backward: bool = True) -> list[ProgramCalls]:
    """Run ``obj`` and record the arguments of every fusion call of each of its Thunder programs.

    A jitted function runs twice, the second time recording. A ThunderFX object runs twice, the second
    time recording what each Thunder-compiled subgraph receives; then each subgraph runs on its own,
    twice, on copies of those inputs (detached, so its backward stays local; laid out and sharing memory
    as the originals, so that Thunder runs the program it compiled for them, see :func:`_detached_copies`).
    """
    if not th.is_thunderfx(obj):
        return [_record(obj, None, args, kwargs, backward)]
    return [
        _record(sub.jitted, _subgraph_key(sub) or sub.label, sub_args, sub_kwargs, backward)
        for sub, sub_args, sub_kwargs in subgraph_inputs(obj, args, kwargs, backward)
    ]


def programs(obj: Any) -> list[tuple[Any, str | None]]:
    """The Thunder programs of ``obj`` compiled so far, as (jitted, subgraph id): the function itself, or
    each ThunderFX subgraph."""
    if not th.is_thunderfx(obj):
        return [(obj, None)]
    return [(sub.jitted, _subgraph_key(sub) or sub.label) for sub in th.thunderfx_subgraphs(obj)]


def subgraph_inputs(
    obj: Any, args: tuple, kwargs: dict, backward: bool = True
) -> list[tuple[th.FxSubgraph, tuple, dict]]:
    """Each Thunder-compiled subgraph that runs when ``obj(*args, **kwargs)`` runs, with copies of its inputs."""
    step(obj, args, kwargs, backward)
    subgraphs = th.thunderfx_subgraphs(obj)
    seen: dict[int, tuple[tuple, dict]] = {}

    def recorder(index: int):
        def hook(module: Any, sub_args: tuple, sub_kwargs: dict) -> None:
            if index not in seen:
                seen[index] = _detached_copies((tuple(sub_args), dict(sub_kwargs)))

        return hook

    handles = [s.jitted.register_forward_pre_hook(recorder(i), with_kwargs=True) for i, s in enumerate(subgraphs)]
    try:
        step(obj, args, kwargs, backward)
    finally:
        for handle in handles:
            handle.remove()
    return [(subgraphs[i], *seen[i]) for i in sorted(seen)]


def _detached_copies(values: Any) -> Any:
    """Detached copies of the tensors in ``values`` with the originals' sizes, strides and offsets, and
    tensors that shared memory sharing one copy of it.

    Thunder specialises a compiled program on which inputs share memory (and torch.compile on strides):
    a copy that gave views of one tensor separate memory would make Thunder compile the subgraph again
    for unaliased inputs, and the profile would time that second program instead of the one the model
    runs (it did: the report then listed the subgraph twice, with a second compilation index).
    """
    copies: dict[tuple[Any, ...], torch.Tensor] = {}

    def copy(value: Any) -> Any:
        if not isinstance(value, torch.Tensor):
            return value
        differentiable = value.is_floating_point() or value.is_complex()
        grad = value.requires_grad and differentiable
        if type(value) is not torch.Tensor or value.layout is not torch.strided:
            return value.detach().clone().requires_grad_(grad)  # a subclass (DTensor, ...): its own copy
        storage = value.untyped_storage()
        key = (value.device, storage.data_ptr())
        if key not in copies:
            copies[key] = torch.empty(0, dtype=torch.uint8, device=value.device).set_(storage.clone())
        shared = copies[key].untyped_storage()
        out = torch.empty(0, dtype=value.dtype, device=value.device)
        out.set_(shared, value.storage_offset(), value.size(), value.stride())
        return out.requires_grad_(grad)

    return tree_map(copy, values)


def _subgraph_key(sub: th.FxSubgraph) -> str | None:
    for guard in guards_of(sub.jitted):
        key = guard.subgraph_of(sub.module)
        if key is not None:
            return key
    return None


def _record(jitted: Any, subgraph: str | None, args: tuple, kwargs: dict, backward: bool) -> ProgramCalls:
    step(jitted, args, kwargs, backward)
    with th.recording_fusion_calls(jitted) as recorded:
        step(jitted, args, kwargs, backward)
    program = ProgramCalls(jitted, subgraph, decisions=latest_decisions(jitted), args=args, kwargs=kwargs)
    by_region = {(d.trace, d.region): d for d in program.decisions if d.about_region}
    for kind, trace in zip(("forward", "backward"), th.last_traces(jitted), strict=True):
        if trace is None:
            continue
        program.traces[kind] = trace
        for region in find_regions(trace):
            args_seen = recorded.get((kind, region.name))
            program.calls.append(RegionCall(kind, region, args_seen, by_region.get((kind, region.name))))
    return program


def latest_decisions(jitted: Any) -> list[Decision]:
    """The decisions of the latest compilation of ``jitted`` (for a ThunderFX subgraph: of that subgraph)."""
    module = th.compiled_module(jitted)
    name = th.jitted_function_name(jitted)
    mine = []
    for guard in guards_of(jitted):
        key = guard.subgraph_of(module)
        if key is not None:
            mine += [d for d in guard.report if d.subgraph == key]
        else:
            mine += [d for d in guard.report if d.function == name and d.subgraph is None]
    if not mine:
        return []
    latest = max(d.compile_index for d in mine)
    return [d for d in mine if d.compile_index == latest]
