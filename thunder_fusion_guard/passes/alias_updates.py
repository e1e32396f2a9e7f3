"""Alias updates nothing reads, pruned before Thunder's grad transform.

After an in-place op Thunder renames every tensor that may share memory with the one written
(``prims.update_aliases``), also those the program never reads again. Thunder 0.2.6's grad transform gives each
unread new name a zero gradient that its backward trace then reads without defining: the backward fails (an
unknown proxy, a name torch.compile cannot find), as e3nn's gates do (a copy into ``new_zeros``, then ``narrow``s
of it). Each alias update here keeps only the tensors read after it. No value changes: an unread name takes part
in nothing; its only trace in Thunder's backward was a zero gradient added to another. Only an update after an op
that writes nothing (a view taken of a tensor written before) is pruned: one right after a write couples the tensor
written with those that view it, and Thunder's gradient of the write reaches them through it; such an update stays
whole, and the program fails as without the guard.

This pass runs on the computation trace before Thunder differentiates it (``transform_traces_pre_prologue``),
only where it will (a tensor argument requires grad).
"""

from __future__ import annotations

from dataclasses import dataclass

from .. import _thunder as th
from ..decisions import Decision, Details
from ..ops import writes_inputs
from .context import TraceContext
from .records import op_decision


@dataclass(frozen=True)
class PrunedUpdate:
    """One alias update made smaller: the new names nothing reads, what they renamed, and the user's line of the
    op whose write it follows."""

    unread: tuple[str, ...]
    renamed: tuple[str, ...]
    after_op: str
    source: str | None


def prune_alias_updates(trace: th.TraceCtx) -> tuple[th.TraceCtx, list[PrunedUpdate]]:
    """``trace`` with each alias update keeping only the tensors some later op (or the return) reads; an update
    left with none is dropped. ``trace`` itself where none changes or Thunder will not differentiate it."""
    if not th.trace_requires_grad(trace):
        return trace, []
    bsyms = list(trace.bound_symbols)
    after = th.op_before_each(bsyms)  # for an alias update, the op whose write it follows
    # Backwards: the names read later, an update that may be pruned reading only the tensors it keeps.
    kept: dict[int, list[int]] = {}
    live: set[str] = set()
    for i in range(len(bsyms) - 1, -1, -1):
        bsym = bsyms[i]
        if th.is_alias_update(bsym) and not (after[i] is not None and writes_inputs(after[i])):
            (aliases,) = bsym.args
            keep = kept[i] = [j for j, out in enumerate(bsym.output) if out.name in live]
            live |= {aliases[j].name for j in keep}
        else:
            live |= {p.name for p in bsym.flat_proxy_args}
    new: list[th.BoundSymbol] = []
    pruned: list[PrunedUpdate] = []
    for i, bsym in enumerate(bsyms):
        keep = kept.get(i)
        if keep is None or len(keep) == len(bsym.output):
            new.append(bsym)
            continue
        (aliases,) = bsym.args
        dropped = [j for j in range(len(bsym.output)) if j not in keep]
        op = after[i]
        pruned.append(
            PrunedUpdate(
                unread=tuple(bsym.output[j].name for j in dropped),
                renamed=tuple(aliases[j].name for j in dropped),
                after_op=th.op_name(op) if op is not None else "",
                source=th.source_line(op) if op is not None else None,
            )
        )
        if keep:
            new.append(th.alias_update_keeping(bsym, keep))
    if not pruned:
        return trace, []
    out = th.new_trace_like(trace, new)
    th.set_provenance(out, "FusionGuard: alias updates nothing reads pruned")
    return out, pruned


def alias_update_decisions(where: TraceContext, pruned: list[PrunedUpdate], applied: bool) -> list[Decision]:
    """One decision (action ``remove``) for each alias update made smaller."""
    made = []
    for p in pruned:
        facts = {"name": ", ".join(p.unread), "count": len(p.unread), "after": p.after_op}
        details = Details(unread=list(p.unread), renamed=list(p.renamed), after_op=p.after_op)
        if p.source:
            details["source"] = p.source
        made.append(
            op_decision(
                where,
                p.unread[0],
                "torch",
                ["update_aliases"],
                "remove",
                "alias_update_pruned",
                facts,
                details,
                applied=applied,
            )
        )
    return made
