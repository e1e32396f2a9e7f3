"""Identity elimination: ops that hand back their input unchanged are removed and their uses renamed.

A reshape or view to the same shape, a permutation or broadcast that moves nothing, a conversion to
the dtype the tensor already has, a shallow copy: Thunder keeps each as a call (``shallow_copy`` at the
bottom). Removing one changes no value; the result is the input tensor itself rather than a fresh view
of it, so ops whose results the trace returns are left alone (a caller may tell the two apart).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .. import _thunder as th
from ..decisions import Decision, Details
from ..ops import identity_reason
from .context import PassContext, may_change
from .records import op_decision


@dataclass(frozen=True)
class Removal:
    """One identity op removed: its result, the tensor now used instead, where it was and why."""

    op: str
    output: str
    replaced_by: str
    region: str | None
    executor: str
    reason: str


def _resolve(p: th.Proxy, renames: dict[str, th.Proxy]) -> th.Proxy:
    while p.name in renames:
        p = renames[p.name]
    return p


def _all_args(bsym: th.BoundSymbol):
    yield from bsym.flat_proxy_args
    for s in th.subsymbols(bsym):
        yield from _all_args(s)


def remove_identities(
    trace: th.TraceCtx, guarded_region: Callable[[th.BoundSymbol], bool]
) -> tuple[th.TraceCtx, list[Removal]]:
    """``trace`` without its identity ops, every use renamed to the op's input.

    Covers ops run outside fusions and, in regions of guarded executors, ops inside them (the
    region is rebuilt by its executor). Left alone: ops whose result the trace returns, ops feeding a
    region of an executor the guard does not touch, and an identity whose result leaves its region
    while its input is made inside it.
    """
    returned = {p.name for p in th.returned_proxies(trace)}
    untouchable = {
        p.name for b in trace.bound_symbols if th.is_fusion(b) and not guarded_region(b) for p in b.flat_proxy_args
    }
    renames: dict[str, th.Proxy] = {}
    removals: list[Removal] = []
    bsyms: list[th.BoundSymbol] = []

    def swap(b: th.BoundSymbol) -> th.BoundSymbol:
        named = {p.name: p for p in _all_args(b) if p.name in renames}
        return th.swap_proxies(b, [(p, _resolve(p, renames)) for p in named.values()])

    for bsym in trace.bound_symbols:
        if th.is_fusion(bsym) and guarded_region(bsym):
            bsyms.extend(_region_without_identities(bsym, swap, renames, returned | untouchable, removals))
            continue
        reason = None if th.is_fusion(bsym) or th.is_comment_or_del(bsym) else identity_reason(bsym)
        out = bsym.flat_proxy_outs[0] if reason else None
        if reason and out.name not in returned and out.name not in untouchable:
            src = _resolve(bsym.args[0], renames)
            renames[out.name] = src
            removals.append(Removal(th.op_name(bsym), out.name, src.name, None, th.executed_by(bsym) or "?", reason))
            continue
        bsyms.append(swap(bsym))
    if not removals:
        return trace, []
    return th.new_trace_like(trace, bsyms), removals


def _region_without_identities(fusion, swap, renames, keep, removals) -> list[th.BoundSymbol]:
    """The fusion bound symbol with its inner identity ops removed (rebuilt if anything changed).

    ``keep`` names results that must stay as they are (returned, or read by an unguarded region).
    """
    inputs = th.unique_proxies(_resolve(p, renames) for p in fusion.flat_proxy_args)
    outputs = list(fusion.flat_proxy_outs)
    output_names = {p.name for p in outputs}
    made_inside: set[str] = set()
    body: list[th.BoundSymbol] = []
    removed_here = False
    for sub in th.subsymbols(fusion):
        reason = None if th.is_comment_or_del(sub) else identity_reason(sub)
        if reason:
            out = sub.flat_proxy_outs[0]
            src = _resolve(sub.args[0], renames)
            leaves = out.name in output_names
            if out.name not in keep and not (leaves and src.name in made_inside):
                renames[out.name] = src
                removals.append(
                    Removal(th.op_name(sub), out.name, src.name, fusion.sym.name, th.executor_name(fusion), reason)
                )
                removed_here = True
                continue
        body.append(swap(sub))
        made_inside.update(p.name for p in sub.flat_proxy_outs)
    renamed_inputs = [p.name for p in inputs] != [p.name for p in fusion.flat_proxy_args]
    if not removed_here and not renamed_inputs:
        return [fusion]
    input_names = {p.name for p in inputs}
    kept_outputs = [p for p in outputs if p.name not in renames and p.name not in input_names]
    if not kept_outputs:
        if body:
            raise RuntimeError(f"{fusion.sym.name} would keep ops but no output after removing identities")
        return []
    return [th.rebuild_fusion(fusion, body, inputs, kept_outputs)]


def identity_pass(trace: th.TraceCtx, context: PassContext) -> tuple[th.TraceCtx, list[Decision]]:
    """Remove identity ops, renaming their uses."""
    new, removals = remove_identities(trace, may_change(context.options))
    applied = not context.options.report_only
    made = []
    for r in removals:
        facts = {"why": r.reason, "replaced_by": r.replaced_by}
        details = Details(output=r.output, replaced_by=r.replaced_by)
        region = r.region or r.output
        made.append(
            op_decision(
                context.where, region, r.executor, [r.op], "remove", "identity_removed", facts, details, applied=applied
            )
        )
    return new, made
