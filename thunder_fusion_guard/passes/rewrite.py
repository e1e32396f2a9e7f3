"""Rewriting traces: replacing a fusion call by the same operations run by Thunder's torch executor."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from .. import _thunder as th
from ..ops import copies_into_grad_tensor, effect_count
from ..regions import Region


class RewriteError(RuntimeError):
    """A region could not be rewritten safely; the guard keeps it as it was."""


@dataclass(frozen=True)
class CallChange:
    """How one region is called now: through a new callable (``changed``), or as before ``because``."""

    region: str
    changed: bool
    because: str | None = None


def lower_region(trace: th.TraceCtx, region: Region) -> list[th.BoundSymbol]:
    """The region's operations as torch-executor calls, checked to run on the torch (or Python) executor
    only, to keep every in-place write of the region and to define every region output."""
    for bsym in region.body:
        target = copies_into_grad_tensor(bsym)
        if target is not None:
            raise RewriteError(
                f"{region.name} copies into {target}, which requires grad: Thunder's torch executor refuses that "
                "for a leaf tensor, where the fusion runs it"
            )
    lowered = th.lower_to_torch(trace, region.body, region.outputs)
    allowed = th.lowering_executor_names()
    defined = {p.name for p in region.inputs}
    unknown: list[str] = []  # read before anything defines them
    for bsym in lowered:
        if th.is_fusion(bsym):
            raise RewriteError(f"lowering {region.name} produced a fusion call {bsym.sym.name}")
        unknown.extend(sorted({p.name for p in bsym.flat_proxy_args} - defined - set(unknown)))
        if th.executed_by(bsym) not in allowed:
            raise RewriteError(
                f"lowering {region.name} left {bsym.sym.name} to executor {th.executed_by(bsym)!r}, not torch"
            )
        defined.update(p.name for p in bsym.flat_proxy_outs)
    before, after = sum(map(effect_count, region.body)), sum(map(effect_count, lowered))
    if before != after:
        raise RewriteError(
            f"lowering {region.name} changes its in-place writes: {before} in the region, {after} lowered"
        )
    missing = sorted(p.name for p in region.outputs if p.name not in defined)
    if missing:
        raise RewriteError(f"lowering {region.name} does not define its outputs {missing}")
    if unknown:  # a region Thunder built without some of its inputs: its ops cannot run either
        raise RewriteError(f"{region.name} reads {', '.join(unknown)}, which it is not given")
    return lowered


def readers(bsyms: list[th.BoundSymbol | None]) -> dict[str, set[int]]:
    """For each proxy name, the positions of the bound symbols that read it (``del``s and gaps aside)."""
    found: dict[str, set[int]] = defaultdict(set)
    for i, b in enumerate(bsyms):
        if b is not None and not th.is_comment_or_del(b):
            for p in b.flat_proxy_args:
                found[p.name].add(i)
    return found


def replace_regions(trace: th.TraceCtx, replacements: dict[int, list[th.BoundSymbol]], provenance: str) -> th.TraceCtx:
    """A new trace in which each bound symbol at a position in ``replacements`` is swapped for its list."""
    if not replacements:
        return trace
    bsyms: list[th.BoundSymbol] = []
    for position, bsym in enumerate(trace.bound_symbols):
        bsyms.extend(replacements.get(position, (bsym,)))
    new = th.new_trace_like(trace, bsyms)
    new = th.refresh_dels(new)
    th.set_provenance(new, provenance)
    return new
