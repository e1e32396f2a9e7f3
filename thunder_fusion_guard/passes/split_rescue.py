"""Split rescue: a torch.compile region that failed while it holds gradients Thunder registered automatically
(``scatter_reduce_vjp``, run through ``torch.autograd.grad`` on pytrees, which Dynamo cannot trace) runs from then
on as torch.compile regions around those gradients, which Thunder's torch executor runs.

Without it the whole region runs op by op: one such gradient in a backward that Thunder fused into one
torch.compile region (NequIP's, under ``thunder.jit`` on CPU) leaves all of that backward unfused. Each part is a
region of the failed one's executor, called through its own rescuing call: a part that fails too runs op by op.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from .. import _thunder as th
from ..regions import Region
from .rewrite import unique_proxies

# Fusion executors whose regions Dynamo traces: the ones a gradient run through torch.autograd breaks.
DYNAMO_EXECUTORS: frozenset[str] = frozenset({"torchcompile", "torchcompile_cat"})


@dataclass(frozen=True)
class SplitBody:
    """The ops a failed region runs instead: ``body`` (parts of its executor and the gradients between them),
    ``parts`` (the new regions' names) and ``apart`` (the op names run by Thunder's torch executor)."""

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
    wanted = {p.name for p in region.outputs}
    later: list[set[str]] = []  # names read after each run: by the runs after it, or as the region's outputs
    for run in reversed(runs):
        later.append(set(wanted))
        wanted |= {p.name for b in run for p in b.flat_proxy_args}
    later.reverse()
    counter = th.free_fusion_counter(trace)
    split = SplitBody([], [], [])
    for run, read_after in zip(runs, later, strict=True):
        made = {p.name for b in run for p in b.flat_proxy_outs}
        outputs = unique_proxies(p for b in run for p in b.flat_proxy_outs if p.name in read_after)
        if th.is_automatic_gradient(run[0]):
            split.body.extend(th.lower_to_torch(trace, run, outputs))
            split.apart.append(run[0].sym.name)
            continue
        inputs = unique_proxies(p for b in run for p in b.flat_proxy_args if p.name not in made)
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
