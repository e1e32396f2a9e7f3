"""Folding Thunder's functional setitem back into one in-place setitem.

Thunder traces ``a[key] = value`` as ``t = copy_with_setitem(a, key, value)`` (a clone of ``a`` with
the slice set) followed by ``copy_(t, a)``. When ``t`` has no other use, the pair is exactly
``a[key] = value``: one small kernel instead of a clone, a fill and a full copy. litgpt's
sliding-window mask loop does this 512 times per layer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .. import _thunder as th
from ..decisions import Decision
from ..ops import SETITEM, is_basic_index
from .context import PassContext, may_change
from .records import op_decision, reworded
from .rewrite import readers


@dataclass(frozen=True)
class Fold:
    """One setitem pair folded: its result name, and the fusion region the copy was in (if any)."""

    output: str
    region: str | None
    executor: str | None


def _copy_of(bsym: th.BoundSymbol, may_fold_region: Callable[[th.BoundSymbol], bool]) -> th.BoundSymbol | None:
    """The ``copy_`` that ``bsym`` runs: itself on the torch executor, or the lone op of a fusion region
    (``update_aliases``, which hands back its input at run time, aside)."""
    if th.is_torch_op(bsym, "copy_"):
        return bsym
    if th.is_fusion(bsym) and may_fold_region(bsym) and len(bsym.flat_proxy_outs) == 1:
        body = th.fusion_body(bsym)
        copies = [b for b in body if th.op_name(b) == "copy_"]
        if len(copies) == 1 and all(b is copies[0] or th.op_name(b) == "update_aliases" for b in body):
            return copies[0]
    return None


def fold_setitem_copies(
    trace: th.TraceCtx, may_fold_region: Callable[[th.BoundSymbol], bool]
) -> tuple[th.TraceCtx, list[Fold]]:
    """``trace`` with each foldable setitem + ``copy_`` pair replaced by one in-place setitem.

    A pair folds when the copy directly follows the setitem (only ``del``s between), copies its
    result, used nowhere else, back into the setitem's own input, the key is basic indexing
    (ints, slices, None, ...) and the value a Python number, so nothing read can alias what is written.
    """
    bsyms = list(trace.bound_symbols)
    readers_of = readers(bsyms)
    folds: list[Fold] = []
    drop: set[int] = set()
    for i, b in enumerate(bsyms):
        if not th.is_torch_op(b, SETITEM) or len(b.args) != 3:
            continue
        a, key, value = b.args
        if not (is_basic_index(key) and type(value) in (int, float, bool)):
            continue
        j = next((k for k in range(i + 1, len(bsyms)) if not th.is_comment_or_del(bsyms[k])), None)
        if j is None:
            continue
        copy = _copy_of(bsyms[j], may_fold_region)
        if copy is None or len(copy.args) < 2 or len(readers_of[b.output.name]) != 1:
            continue
        source, target = copy.args[0], copy.args[1]
        if not (isinstance(source, th.Proxy) and source.name == b.output.name and target.name == a.name):
            continue
        if th.is_fusion(bsyms[j]) and getattr(target, "requires_grad", False):
            continue  # the fusion runs this copy where the setitem would refuse a leaf that requires grad
        grad_enabled = copy.kwargs.get("grad_enabled", copy.args[2] if len(copy.args) > 2 else True)
        (out,) = bsyms[j].flat_proxy_outs
        region = bsyms[j] if th.is_fusion(bsyms[j]) else None
        folds.append(Fold(out.name, region and region.sym.name, region and th.executor_name(region)))
        bsyms[j] = th.inplace_setitem().bind(a, key, value, grad_enabled, output=out)
        drop.add(i)
    if not folds:
        return trace, []
    new = th.new_trace_like(trace, [b for k, b in enumerate(bsyms) if k not in drop])
    return new, folds


def fold_pass(trace: th.TraceCtx, context: PassContext) -> tuple[th.TraceCtx, list[Decision]]:
    """Fold setitem + copy_ pairs into one in-place setitem."""
    options, where = context.options, context.where
    new, folds = fold_setitem_copies(trace, may_change(options))
    regions = context.region_decisions()
    applied = not options.report_only
    made = []
    for f in folds:
        kept = regions.get(f.region) if f.region else None
        if kept is not None:
            made.append(reworded(kept, "folded_region", {}, action="fold", applied=applied))
            continue
        made.append(op_decision(where, f.output, "torch", [SETITEM, "copy_"], "fold", "folded", {}, applied=applied))
    return new, made
