"""Split rescue: a failed region runs from then on as parts of its own executor, not all op by op.

- Around gradients: a torch.compile region that holds gradients Thunder registered automatically
  (``scatter_reduce_vjp``, run through ``torch.autograd.grad`` on pytrees, which Dynamo cannot trace) runs as
  torch.compile regions around them, which Thunder's torch executor runs. One such gradient in a backward that
  Thunder fused into one torch.compile region (NequIP's, under ``thunder.jit`` on CPU) would leave all of that
  backward unfused. A part that fails too runs op by op.
- In halves: a region of an executor in :data:`HALVED` (nvFuser, torch.compile) runs as its first half and its
  second, each a region of its own, halved again where it fails too, down to single ops that Thunder's torch
  executor runs. nvFuser's failures are asserts of its scheduler on a few of a region's ops (NequIP's backward
  region), and its compiles take moments; torch.compile's are Inductor's C++ compile of a whole backward (NequIP's at
  l_max 3 under ``thunder.jit`` on CPU: op by op, that step ran 1.15x eager's), and each half takes a compile of its
  own, so the first call takes longer where a region fails, once, and the step keeps its fusions.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial

from .. import _thunder as th
from ..regions import Region

# Fusion executors whose regions Dynamo traces: the ones a gradient run through torch.autograd breaks.
DYNAMO_EXECUTORS: frozenset[str] = frozenset({"torchcompile", "torchcompile_cat"})

# Fusion executors whose failed regions run in halves of their own.
HALVED: frozenset[str] = frozenset({"nvfuser", "torchcompile"})

# What a failed half tells: the half (a fusion bound symbol), the error, the call's arguments and the halves it runs
# as from then on (None: op by op).
OnHalfRescue = Callable[[th.BoundSymbol, Exception, tuple, "SplitBody | None"], None]


@dataclass(frozen=True)
class SplitBody:
    """The ops a failed region runs instead: ``body`` (parts of its executor and the ops between them), ``parts``
    (the new regions' names) and ``apart`` (the op names run by Thunder's torch executor between them)."""

    body: list[th.BoundSymbol]
    parts: list[str]
    apart: list[str]


def split_around_gradients(
    trace: th.TraceCtx, region: Region, on_part_rescue: Callable[[th.BoundSymbol, Exception, tuple], None]
) -> SplitBody | None:
    """``region``'s ops as regions of its executor around its automatically registered gradients, those run by
    Thunder's torch executor; None where the region is no torch.compile region or holds no such gradient, or where
    no part would hold an op. A part that fails runs op by op and tells ``on_part_rescue(part, error, args)``."""
    body = region.body
    if region.executor not in DYNAMO_EXECUTORS or not any(th.is_automatic_gradient(b) for b in body):
        return None
    runs: list[list[th.BoundSymbol]] = []
    for bsym in body:
        alone = th.is_automatic_gradient(bsym)
        if alone or not runs or th.is_automatic_gradient(runs[-1][0]):
            runs.append([bsym])
        else:
            runs[-1].append(bsym)
    if not any(not th.is_automatic_gradient(run[0]) for run in runs):
        return None
    counter = th.free_fusion_counter(trace)
    split = SplitBody([], [], [])
    for run, (inputs, outputs) in zip(runs, boundaries(runs, region.outputs), strict=True):
        if th.is_automatic_gradient(run[0]):
            split.body.extend(th.lower_to_torch(trace, run, outputs))
            split.apart.append(run[0].sym.name)
            continue
        part = th.fuse_part(region.bsym, run, inputs, outputs, counter)
        counter += 1
        told = partial(on_part_rescue, part)
        split.body.append(th.with_region_callable(part, _rescuing(trace, part, run, told)))
        split.parts.append(part.sym.name)
    return split


def _rescuing(
    trace: th.TraceCtx, part: th.BoundSymbol, run: list[th.BoundSymbol], on_rescue: Callable[[Exception, tuple], None]
) -> th.RescuingCall:
    inputs, outputs = list(part.flat_proxy_args), list(part.flat_proxy_outs)

    def fallback() -> Callable:
        lowered = th.lower_to_torch(trace, run, outputs)
        return th.python_callable_from_symbols(f"{part.sym.name}_rescued", lowered, inputs, outputs)

    return th.RescuingCall(th.region_callable(part), fallback, on_rescue)


def boundaries(
    runs: Sequence[Sequence[th.BoundSymbol]], outputs: Sequence[th.Proxy]
) -> list[tuple[list[th.Proxy], list[th.Proxy]]]:
    """For each run of consecutive ops of a region (in order): the values it reads and does not make, and the values
    it makes that a later run reads or the region returns (``outputs``)."""
    wanted = {p.name for p in outputs}
    later: list[set[str]] = []  # names read after each run
    for run in reversed(runs):
        later.append(set(wanted))
        wanted |= {p.name for b in run for p in b.flat_proxy_args}
    later.reverse()
    found = []
    for run, read_after in zip(runs, later, strict=True):
        made = {p.name for b in run for p in b.flat_proxy_outs}
        reads = th.unique_proxies(p for b in run for p in b.flat_proxy_args if p.name not in made)
        returns = th.unique_proxies(p for b in run for p in b.flat_proxy_outs if p.name in read_after)
        found.append((reads, returns))
    return found


def halves(
    trace: th.TraceCtx, fusion: th.BoundSymbol, counter: Iterator[int], on_half_rescue: OnHalfRescue
) -> SplitBody | None:
    """The ops of the fusion call ``fusion`` as two regions of its executor, its first half and its second in trace
    order, each called so that where it fails it runs in halves again, down to single ops that Thunder's torch
    executor runs; ``on_half_rescue`` is told each half that fails. New regions take their numbers from ``counter``.
    None where the region holds fewer than two ops, or where a half would write one of its inputs (nvFuser loses a
    write into a non-contiguous input, which the region's own call guards against and a half's would not)."""
    body = th.fusion_body(fusion)
    if len(body) < 2:
        return None
    runs = [body[: len(body) // 2], body[len(body) // 2 :]]
    edges = boundaries(runs, fusion.flat_proxy_outs)
    if any(th.written_inputs(list(run), inputs) for run, (inputs, _) in zip(runs, edges, strict=True)):
        return None
    split = SplitBody([], [], [])
    for run, (inputs, outputs) in zip(runs, edges, strict=True):
        if not outputs:  # nothing it makes is read: dead ops
            continue
        half = th.fuse_part(fusion, run, inputs, outputs, next(counter))
        split.body.append(th.with_region_callable(half, _halved(trace, half, counter, on_half_rescue)))
        split.parts.append(half.sym.name)
    return split


def _halved(
    trace: th.TraceCtx, half: th.BoundSymbol, counter: Iterator[int], on_half_rescue: OnHalfRescue
) -> th.RescuingCall:
    inputs, outputs = list(half.flat_proxy_args), list(half.flat_proxy_outs)
    made: dict[str, SplitBody | None] = {}

    def fallback() -> Callable:
        inner = made["halves"] = halves(trace, half, counter, on_half_rescue)
        body = inner.body if inner is not None else th.lower_to_torch(trace, th.fusion_body(half), outputs)
        return th.python_callable_from_symbols(f"{half.sym.name}_rescued", body, inputs, outputs)

    def told(error: Exception, args: tuple) -> None:
        on_half_rescue(half, error, args, made.get("halves"))

    return th.RescuingCall(th.region_callable(half), fallback, told)
