"""Constants Thunder's backward reads but its fusion pass lost, made again in the region that reads them.

Where a value gets no gradient (an output of ``split``, of ``broadcast_tensors``, of an alias update nothing reads),
Thunder 0.2.6's grad transform makes its gradient a zero tensor from nothing (``zeros``). Its torch.compile fusion
pass can leave that ``zeros`` out of the backward region that reads it: the region reads a name nothing defines,
and the backward fails at its first call (torch.compile cannot find the name). Such a name is made again at the top
of the region by the very op Thunder's joint trace defines it with, found among the traces of the compilation: only
an op that reads no tensor (a factory: ``zeros``, ``full``), so that nothing else moves.

Never in a program that writes into memory another tensor views (a write followed by an alias update of more than
one tensor): Thunder's gradient of such a write is wrong, and a backward that runs would hide it; that program fails
as without the guard.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .. import _thunder as th
from ..decisions import Decision, Details
from ..ops import writes_inputs
from ..regions import Region, find_regions
from .context import PassContext
from .records import op_decision

# What a user can do where the guard cannot restore what Thunder lost.
LOST_CONSTANT_FIX = (
    "write the copies into views out of place (translate_library_ops() does so for e3nn's Extract, in nn.Gate), "
    "or run under ThunderFX"
)


@dataclass(frozen=True)
class Restored:
    """A region whose body read ``names`` that nothing defined, each now made by ``ops`` (Thunder's own)."""

    region: Region
    names: tuple[str, ...]
    ops: tuple[str, ...]


def restore_lost_constants(
    trace: th.TraceCtx, earlier: Sequence[th.TraceCtx]
) -> tuple[th.TraceCtx, list[Restored], str | None]:
    """``trace`` (a backward trace) with each fusion region that reads tensors nothing defines, where ``earlier``
    (the compilation's traces, the joint one among them) defines each by an op reading no tensor, rebuilt to make
    them first; the records, and why none was restored where a region reads such names but they stay lost."""
    lost_by_region = lost_values(trace)
    if not lost_by_region:
        return trace, [], None
    if any(_writes_into_viewed_memory(t) for t in earlier):
        return trace, [], "the program writes into memory another tensor views, whose gradient Thunder gets wrong"
    makers = _factories(earlier)
    bsyms = list(trace.bound_symbols)
    restored: list[Restored] = []
    for region, lost in lost_by_region:
        found = [makers.get(name) for name in lost]
        if any(f is None for f in found):
            missing = ", ".join(n for n, f in zip(lost, found, strict=True) if f is None)
            return trace, [], f"{region.name} reads {missing}, which no op reading no tensor defines"
        body = [f.from_bsym() for f in found] + list(region.body)
        bsyms[region.position] = th.rebuild_fusion(region.bsym, body, region.inputs, region.outputs)
        restored.append(Restored(region, tuple(lost), tuple(th.op_name(f) for f in found)))
    new = th.new_trace_like(trace, bsyms)
    th.set_provenance(new, "FusionGuard: constants Thunder's fusion pass lost, made again")
    return new, restored, None


def lost_values(trace: th.TraceCtx) -> list[tuple[Region, dict[str, th.Proxy]]]:
    """Each fusion region of ``trace`` (a backward trace) that reads tensors nothing defines (not its inputs, its own
    ops, the trace's inputs or another op), with those tensors by name; none for a trace that is no backward."""
    if not th.is_backward(trace):
        return []
    defined = {p.name for b in trace.bound_symbols for p in b.flat_proxy_outs}
    defined |= {p.name for p in th.trace_inputs(trace, unpacked=True)}
    found: list[tuple[Region, dict[str, th.Proxy]]] = []
    for region in find_regions(trace):
        made = {p.name for p in region.inputs}
        lost: dict[str, th.Proxy] = {}
        for b in region.body:
            lost.update((p.name, p) for p in b.flat_proxy_args if p.name not in made and p.name not in defined)
            made.update(p.name for p in b.flat_proxy_outs)
        if lost:
            found.append((region, lost))
    return found


def _factories(traces: Sequence[th.TraceCtx]) -> dict[str, th.BoundSymbol]:
    """Each name an op of ``traces`` makes from no tensor (its only output), the latest trace's op first."""
    found: dict[str, th.BoundSymbol] = {}
    for trace in reversed(traces):
        for b in trace.bound_symbols:
            outs = list(b.flat_proxy_outs)
            if len(outs) == 1 and not list(b.flat_proxy_args) and not th.is_fusion(b) and th.tensor_spec(outs[0]):
                found.setdefault(outs[0].name, b)
    return found


def _writes_into_viewed_memory(trace: th.TraceCtx) -> bool:
    """Whether an alias update right after a write in ``trace`` renames more than one tensor."""
    bsyms = trace.bound_symbols
    return any(
        th.is_alias_update(b) and op is not None and writes_inputs(op) and len(b.output) > 1
        for b, op in zip(bsyms, th.op_before_each(bsyms), strict=True)
    )


def lost_constant_pass(trace: th.TraceCtx, context: PassContext) -> tuple[th.TraceCtx, list[Decision]]:
    """Make again, in the backward region that reads it, each constant (a zero gradient) Thunder's fusion pass left
    out (:func:`restore_lost_constants`)."""
    new, restored, refused = restore_lost_constants(trace, th.compiling_traces())
    applied = not context.options.report_only
    made = []
    if refused:
        facts = {"why": refused}
        details = Details(fix=LOST_CONSTANT_FIX)
        made.append(
            op_decision(context.where, "backward", "torch", [], "keep", "lost_constant_refused", facts, details)
        )
    for r in restored:
        names = ", ".join(r.names)
        facts = {"region": r.region.name, "executor": r.region.executor, "name": names, "count": len(r.names)}
        details = Details(restored=list(r.names), made_by=list(r.ops))
        decision = op_decision(
            context.where,
            r.region.name,
            r.region.executor,
            list(r.ops),
            "rescue",
            "lost_constant_restored",
            facts,
            details,
            applied=applied,
        )
        made.append(decision)
    return new, made
