"""The hoisting pass: input-independent work computed once per compiled program (:func:`.hoist.hoist_constants`),
what stays and why, and what a backward may write of it (:func:`.hoist.check_backward`)."""

from __future__ import annotations

from collections.abc import Sequence

from .. import _thunder as th
from ..decisions import Decision, Details
from ..ops import (
    ELEMENTWISE_ROUNDING_OPS,
    contractible_products,
    contracts,
    hoist_inexact_ops,
    hoist_keeps_bits,
    rounding_at_cut,
)
from ..options import GuardOptions
from .context import PassContext, TraceContext
from .hoist import Hoist, Refusal, check_backward, hoist_constants
from .hoist_runtime import HOISTED_NAME, HoistedValues
from .records import op_decision, reworded


def hoist_pass(trace: th.TraceCtx, context: PassContext) -> tuple[th.TraceCtx, list[Decision]]:
    """Compute input-independent work once per compiled program."""
    options, where, ledger = context.options, context.where, context.hoisted
    applied = not options.report_only
    made = []
    if where.trace == "backward":
        for name in check_backward(trace, ledger.take(), options.rewrites.metadata_ops):
            made.append(
                op_decision(
                    where, HOISTED_NAME, "fusion_guard", [], "keep", "hoist_written_by_backward", {"name": name}
                )
            )

    def may_rebuild(fusion: th.BoundSymbol, body: list[th.BoundSymbol], crossing: Sequence[th.Proxy]) -> Refusal | None:
        return rebuild_refusal(fusion, body, crossing, options)

    new, pieces, caches = hoist_constants(
        trace, may_rebuild, options.runtime.hoist_max_bytes, options.rewrites.metadata_ops
    )
    regions = context.region_decisions()
    saved: dict[str, HoistedValues] = {}
    for index, piece in enumerate(pieces):
        made.append(_piece_decision(where, index, piece, applied))
        if piece.hoisted:
            saved.update({name: caches[piece.call] for name in piece.saved_for_backward})
            for name in piece.regions:
                kept = regions.get(name)
                if kept is not None:
                    made.append(reworded(kept, "hoisted_region", {"call": piece.call}, action="hoist", applied=applied))
    if where.trace == "forward":
        ledger.forward_done({} if options.report_only else saved)
    return new, made


def rebuild_refusal(
    fusion: th.BoundSymbol, body: list[th.BoundSymbol], crossing: Sequence[th.Proxy], options: GuardOptions
) -> Refusal | None:
    """Why hoisting may not rebuild ``fusion`` with ``body`` (handing ``crossing`` across the cut), and the option
    setting that would let it; None where it may. The words are the region's, the same for each piece of it."""
    region, executor = fusion.sym.name, th.executor_name(fusion)
    if not options.guards(executor):
        return Refusal(region, executor, "executors=None", unguarded=True)
    if not options.exact_only:
        return None
    cut = rounding_at_cut(body, crossing)
    device = th.proxy_device([*fusion.flat_proxy_outs, *fusion.flat_proxy_args])
    fma = contractible_products(body) if contracts(executor, device) else []
    if not cut and not fma and hoist_keeps_bits(body, options.rewrites.metadata_ops, executor):
        return None
    inexact = hoist_inexact_ops(th.fusion_body(fusion), options.rewrites.metadata_ops, executor)
    per_element = [n for n in inexact if n in ELEMENTWISE_ROUNDING_OPS]
    return Refusal(
        region, executor, "exact_only=False", False, tuple(inexact), tuple(per_element), tuple(fma), tuple(cut.items())
    )


def _piece_decision(where: TraceContext, index: int, piece: Hoist, applied: bool) -> Decision:
    """The decision about one piece of input-independent work: hoisted, or kept and why."""
    details = Details(
        piece=index,
        same_as=piece.same_as,
        bytes=piece.nbytes,
        ops_saved_per_call=piece.ops_saved,
        calls_saved_per_call=piece.calls_saved,
        fused_ops_saved_per_call=piece.fused_ops_saved,
        outputs=list(piece.outputs),
        regions=list(piece.regions),
        split=list(piece.split),
        duplicated=list(piece.duplicated),
        saved_for_backward=list(piece.saved_for_backward),
    )
    facts = {"ops_saved": piece.ops_saved, "nbytes": piece.nbytes}
    if piece.hoisted:
        facts.update(same_as=piece.same_as, split=piece.split, duplicated=piece.duplicated)
        return op_decision(
            where, piece.call, "fusion_guard", piece.ops, "hoist", "hoisted", facts, details, applied=applied
        )
    if piece.option:
        details["would_hoist_with"] = piece.option
        facts.update(option=piece.option, refused=[r.facts() for r in piece.refused])
        return op_decision(where, HOISTED_NAME, "fusion_guard", piece.ops, "keep", "hoist_refused", facts, details)
    facts["not_taken"] = piece.not_taken
    if piece.not_taken == "budget":
        facts["budget_left"] = piece.budget_left
    elif piece.not_taken == "same_as":
        facts["same_as"] = piece.same_as
    return op_decision(where, HOISTED_NAME, "fusion_guard", piece.ops, "keep", "hoist_not_taken", facts, details)
