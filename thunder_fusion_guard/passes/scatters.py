"""Scatters into the region that makes their values: an ``index_add`` or an embedding's gradient left to torch after
the torch.compile region that computes what it sums runs at the end of that region.

nvFuser 0.2.36 has no accumulating scatter, so Thunder leaves e3nn's message sums (``index_add`` into the atoms) and
the gradients of its gathers to the torch executor: a copy of the tensor summed into, then a scatter kernel reading
values a region wrote to memory for it. Inductor computes those values inside its scatter kernel, and copies the
tensor summed into among the region's kernels. Legal by construction: every input of the scatter exists when the
region ends and nothing between writes one, and the scatter moves earlier, before every reader of its result; a value
of the region that only the scatter read is no longer an output. Nothing moves across a communication op. Opt-in with
``rewrites.merge_regions``: the adds then land in another order, which may round differently.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .. import _thunder as th
from ..decisions import Decision, Details
from ..ops import communication_segments, crosses_communication, sums_by_index, writes_inputs
from .context import FusionGuardError, PassContext, may_change
from .records import op_decision
from .rewrite import readers


@dataclass(frozen=True)
class ScatterMoved:
    """One scatter run at the end of the region that makes its values (``error``: why rebuilding it failed);
    ``dropped``: the region's outputs only the scatter read, no longer written."""

    op: str
    output: str
    into: str
    executor: str
    error: str = ""
    dropped: tuple[str, ...] = ()


def scatters_into_producers(
    trace: th.TraceCtx,
    may_change: Callable[[th.BoundSymbol], bool],
    claims: Callable[[th.BoundSymbol, th.BoundSymbol], bool] = th.executor_claims,
) -> tuple[th.TraceCtx, list[ScatterMoved]]:
    """Move each sum by index (:data:`~thunder_fusion_guard.ops.SUMS_BY_INDEX`) run outside a fusion into the region
    that last made one of its inputs, where that region's executor claims it, every other input exists before the
    region ends, and no op between the two talks to another process or writes any tensor it is given."""
    bsyms: list[th.BoundSymbol | None] = list(trace.bound_symbols)
    made_at = {p.name: i for i, b in enumerate(bsyms) if not th.is_comment_or_del(b) for p in b.flat_proxy_outs}
    readers_of = readers(bsyms)
    segments = communication_segments(bsyms)
    moves: list[ScatterMoved] = []
    for i, b in enumerate(bsyms):
        if b is None or th.is_fusion(b) or not sums_by_index(b):
            continue
        args = th.unique_proxies(b.flat_proxy_args)
        j = max((made_at.get(p.name, -1) for p in args), default=-1)
        region = bsyms[j] if j >= 0 else None
        if region is None or not th.is_fusion(region) or not may_change(region) or not claims(region, b):
            continue
        if crosses_communication(segments, j, i) or any(
            x is not None and not th.is_comment_or_del(x) and writes_inputs(x) for x in bsyms[j + 1 : i]
        ):
            continue
        outs = {p.name for p in b.flat_proxy_outs}
        kept = [p for p in region.flat_proxy_outs if readers_of.get(p.name, set()) - {i}]
        dropped = tuple(sorted({p.name for p in region.flat_proxy_outs} - {p.name for p in kept}))
        inputs = th.unique_proxies([*region.flat_proxy_args, *(p for p in args if made_at.get(p.name, -1) != j)])
        name, ex, output = region.sym.name, th.executor_name(region), ", ".join(sorted(outs))
        try:
            rebuilt = th.rebuild_fusion(region, [*th.subsymbols(region), b], inputs, [*kept, *b.flat_proxy_outs])
        except Exception as e:  # rebuilding a fusion may raise anything in Thunder or the executor: the scatter stays
            moves.append(ScatterMoved(th.op_name(b), output, name, ex, f"{type(e).__name__}: {e}"))
            continue
        bsyms[j], bsyms[i] = rebuilt, None
        for p in args:
            readers_of[p.name].discard(i)
            readers_of[p.name].add(j)
        made_at.update({n: j for n in outs})
        moves.append(ScatterMoved(th.op_name(b), output, name, ex, dropped=dropped))
    if all(m.error for m in moves):
        return trace, moves
    return th.new_trace_like(trace, [b for b in bsyms if b is not None]), moves


def scatter_pass(trace: th.TraceCtx, context: PassContext) -> tuple[th.TraceCtx, list[Decision]]:
    """Run each scatter left to torch at the end of the torch.compile region that makes its values."""
    options = context.options
    new, moves = scatters_into_producers(trace, may_change(options, keep_bits=False))
    made = []
    for m in moves:
        facts: dict = {"into": m.into}
        details = Details(output=m.output, into=m.into)
        if m.error:
            if options.strict:
                raise FusionGuardError(f"could not move {m.output} into {m.into} ({context.where.trace}): {m.error}")
            made.append(
                op_decision(
                    context.where, m.into, m.executor, [m.op], "keep", "scatter_kept", facts, details, error=m.error
                )
            )
            continue
        facts["dropped"] = len(m.dropped)
        made.append(
            op_decision(
                context.where,
                m.into,
                m.executor,
                [m.op],
                "rehome",
                "scatter_moved",
                facts,
                details,
                applied=not options.report_only,
            )
        )
    return new, made
