"""Re-homing: metadata ops left outside a fusion move into the region that alone consumes them, and
regions of one executor that end up next to each other are merged into one call.

Thunder's partitioners already fuse a view into its consumer when they can; what stays outside is
what an executor chose to leave out (nvFuser's "bookend" views at region edges, ops claimed by an
operator executor, ops the first executor could not run between two regions switched to another). Moving
such an op in saves an eager dispatch; merging saves a fusion call, and merging across the ops between two
regions that their executor can run (views, an ``index_add`` between two torch.compile regions) runs those
inside it too. Both are legal here by construction: the op's inputs exist before it, the consumer comes
after it and is its only reader, and merged regions with the ops between them are consecutive in the trace,
so no cycle and no lost output. Nothing moves across a communication op or its wait
(``ops.is_communication``), nor is a random, in-place or compute-bound op merged: such an op stays outside
(a matmul merged into a torch.compile region stays a GEMM of its own, and Inductor fuses no more around it:
the e3nn steps, captured, ran as many kernels or more, H200 at 26e3ce4).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .. import _thunder as th
from ..decisions import Decision, Details
from ..ops import (
    communication_segments,
    compute_bound,
    crosses_communication,
    is_communication,
    is_metadata,
    is_random,
    writes_inputs,
)
from ..policy import BOOKEND
from .context import FusionGuardError, PassContext, may_change
from .records import op_decision
from .rewrite import readers


@dataclass(frozen=True)
class Rehome:
    """One op moved into a region, or one region merged into the next (``error``: why it failed;
    ``skipped``: why it was not tried; ``blocked_by``: the communication op it would have crossed, so it stayed)."""

    op: str
    moved: str
    into: str
    executor: str
    error: str
    skipped: str = ""
    blocked_by: str = ""
    across: tuple[str, ...] = ()  # a merge: the ops between the two regions that the merged call runs too


def absorb_metadata_ops(
    trace: th.TraceCtx,
    may_change: Callable[[th.BoundSymbol], bool],
    metadata_ops: frozenset[str] = frozenset(),
    refused: Callable[[th.BoundSymbol, th.BoundSymbol], str | None] = lambda fusion, op: None,
) -> tuple[th.TraceCtx, list[Rehome]]:
    """Move each metadata op run outside a fusion into the guarded region that is its only reader.

    Walks the trace backwards so a chain of views ends up in the region whole. A returned result has
    the return statement as a reader, so it never moves; an op with a communication op between it and
    its reader stays too (recorded with ``blocked_by``). ``refused(fusion, op)`` gives a reason not to
    move ``op`` into ``fusion`` (its executor cannot run it, say), checked before any rebuild.
    """
    bsyms: list[th.BoundSymbol | None] = list(trace.bound_symbols)
    moves: list[Rehome] = []
    readers_of = readers(bsyms)
    segments = communication_segments(bsyms)
    for i in range(len(bsyms) - 1, -1, -1):
        b = bsyms[i]
        if b is None or th.is_fusion(b) or th.is_comment_or_del(b) or not b.flat_proxy_outs:
            continue
        if not is_metadata(b, metadata_ops):
            continue
        outs = {p.name for p in b.flat_proxy_outs}
        read_by = set().union(*(readers_of.get(n, set()) for n in outs))
        if len(read_by) != 1:
            continue
        (j,) = read_by
        region = bsyms[j]
        if j < i or not (th.is_fusion(region) and may_change(region)):
            continue
        moved, into, ex = ", ".join(sorted(outs)), region.sym.name, th.executor_name(region)
        if crosses_communication(segments, i, j):
            between = next(bsyms[k] for k in range(i + 1, j) if segments[k] > segments[k - 1])
            moves.append(Rehome(th.op_name(b), moved, into, ex, "", blocked_by=th.op_name(between)))
            continue
        why_not = refused(region, b)
        if why_not:
            moves.append(Rehome(th.op_name(b), moved, into, ex, "", why_not))
            continue
        inputs = th.unique_proxies([*b.flat_proxy_args, *(p for p in region.flat_proxy_args if p.name not in outs)])
        try:
            bsyms[j] = th.rebuild_fusion(region, [b, *th.subsymbols(region)], inputs, region.flat_proxy_outs)
        except Exception as e:  # rebuilding a fusion may raise anything in Thunder or the executor: the op is not moved
            moves.append(Rehome(th.op_name(b), moved, into, ex, f"{type(e).__name__}: {e}"))
            continue
        bsyms[i] = None
        for p in b.flat_proxy_args:
            readers_of[p.name].discard(i)
            readers_of[p.name].add(j)
        moves.append(Rehome(th.op_name(b), moved, into, ex, ""))
    if all(m.error or m.blocked_by for m in moves):
        return trace, moves[::-1]
    return th.new_trace_like(trace, [b for b in bsyms if b is not None]), moves[::-1]


def merge_adjacent_regions(
    trace: th.TraceCtx,
    may_change: Callable[[th.BoundSymbol], bool],
    bridge: Callable[[th.BoundSymbol, th.BoundSymbol], bool] = lambda fusion, op: False,
) -> tuple[th.TraceCtx, list[Rehome]]:
    """Merge two guarded regions of one executor with nothing between them but ``del``s and ops that
    ``bridge(region, op)`` lets the merged call run (ops left to torch that the region's executor can run: an
    ``index_add`` between two torch.compile regions runs in the one compiled call, its scatter fused there)."""
    bsyms = list(trace.bound_symbols)
    readers_of = readers(bsyms)
    merges: list[Rehome] = []
    out: list[th.BoundSymbol] = []
    last_region: int | None = None
    covered: set[int] = set()  # positions in ``bsyms`` of the regions merged into out[last_region]
    held: list[tuple[int, int]] = []  # ops after out[last_region] it may run: (position in bsyms, in out)
    for i, b in enumerate(bsyms):
        if th.is_comment_or_del(b):
            out.append(b)
            continue
        prev = out[last_region] if last_region is not None else None
        if prev is not None and not th.is_fusion(b) and bridge(prev, b):
            held.append((i, len(out)))
            out.append(b)
            continue
        if (
            prev is not None
            and th.is_fusion(b)
            and may_change(b)
            and may_change(prev)
            and prev.sym.executor is b.sym.executor
        ):
            between = [bsyms[k] for k, _ in held]
            merged, error = _merged(prev, between, b, readers_of, covered | {i} | {k for k, _ in held})
            if error:
                merges.append(Rehome("region", prev.sym.name, b.sym.name, th.executor_name(b), error))
            else:
                out[last_region] = merged
                covered |= {i} | {k for k, _ in held}
                dropped = {j for _, j in held}
                out = [x for j, x in enumerate(out) if j not in dropped]
                across = tuple(th.op_name(x) for x in between)
                merges.append(Rehome("region", prev.sym.name, b.sym.name, th.executor_name(b), "", across=across))
                held = []
                continue
        last_region, covered, held = (len(out), {i}, []) if th.is_fusion(b) else (None, set(), [])
        out.append(b)
    if all(m.error for m in merges):
        return trace, merges
    return th.new_trace_like(trace, out), merges


def _merged(
    first: th.BoundSymbol, between: list[th.BoundSymbol], second: th.BoundSymbol, readers_of, merged: set[int]
) -> tuple[th.BoundSymbol | None, str]:
    """``first``, the ops ``between`` and ``second`` as one call, or None and why rebuilding failed; what ``first``
    and those ops make stays an output where read outside ``merged``. An op of ``second`` whose outputs are all made
    already (Thunder's rematerialization copies a cheap op into each region that reads it, under the same names)
    runs once."""
    made = {p.name for b in (first, *between) for p in b.flat_proxy_outs}
    inputs = th.unique_proxies(
        [
            *first.flat_proxy_args,
            *(p for b in (*between, second) for p in b.flat_proxy_args if p.name not in made),
        ]
    )
    body = [*th.subsymbols(first), *between]
    done = {p.name for b in body for p in b.flat_proxy_outs}
    for b in th.subsymbols(second):
        outs = {p.name for p in b.flat_proxy_outs}
        if not (outs and outs <= done):
            body.append(b)
            done |= outs
    outputs = th.unique_proxies(
        [
            *(p for b in (first, *between) for p in b.flat_proxy_outs if readers_of.get(p.name, set()) - merged),
            *second.flat_proxy_outs,
        ]
    )
    try:
        return th.rebuild_fusion(second, body, inputs, outputs), ""
    except Exception as e:  # rebuilding may raise anything in Thunder or the executor: the calls then stay apart
        return None, f"{type(e).__name__}: {e}"


def rehome_pass(trace: th.TraceCtx, context: PassContext) -> tuple[th.TraceCtx, list[Decision]]:
    """Move metadata ops run outside a fusion into the region that alone reads them."""
    options = context.options
    new, moves = absorb_metadata_ops(trace, may_change(options), options.rewrites.metadata_ops, _refusal(context))
    made = []
    for m in moves:
        details = Details(output=m.moved, into=m.into)
        facts = {"into": m.into}
        if m.blocked_by:
            code, action, more = "rehome_blocked", "keep", {}
            facts["blocked_by"] = details["blocked_by"] = m.blocked_by
        elif m.error:
            if options.strict:
                raise FusionGuardError(f"could not move {m.moved} into {m.into} ({context.where.trace}): {m.error}")
            code, action, more = "rehome_failed", "keep", {"error": m.error}
        elif m.skipped:
            code, action, more = "rehome_skipped", "keep", {}
            facts["skipped"] = m.skipped
        else:
            code, action, more = "rehomed", "rehome", {"applied": not options.report_only}
        made.append(op_decision(context.where, m.into, m.executor, [m.op], action, code, facts, details, **more))
    return new, made


def _refusal(context: PassContext) -> Callable[[th.BoundSymbol, th.BoundSymbol], str | None]:
    """Why ``op`` may not run inside ``fusion`` (None: it may): its executor does not claim it, or the program
    asked nvFuser to leave views at region edges outside."""
    options, where = context.options, context.where

    def refused(fusion: th.BoundSymbol, op: th.BoundSymbol) -> str | None:
        ex = th.executor_name(fusion)
        if not th.executor_claims(fusion, op):
            return f"{ex} cannot run {th.op_name(op)} (Thunder's executor does not claim it)"
        if (
            ex == "nvfuser"
            and where.compile_options.get(BOOKEND) is True
            and not options.rewrites.override_compile_options
        ):
            return f"the program asked for views at nvFuser region edges to run outside ({BOOKEND}=True)"
        return None

    return refused


def merge_pass(trace: th.TraceCtx, context: PassContext) -> tuple[th.TraceCtx, list[Decision]]:
    """Merge adjacent regions of one executor into one fusion call, also across ops left to torch that the
    executor can run (not a communication, random, in-place or compute-bound op)."""
    options = context.options
    refused = _refusal(context)

    def bridge(fusion: th.BoundSymbol, op: th.BoundSymbol) -> bool:
        if is_communication(op) or is_random(op) or writes_inputs(op) or compute_bound([th.op_name(op)]):
            return False
        return bool(op.flat_proxy_outs) and refused(fusion, op) is None

    # Opted into knowing the merged code may round differently, so exact_only does not hold it back.
    new, merges = merge_adjacent_regions(trace, may_change(options, keep_bits=False), bridge)
    applied = not options.report_only
    made = []
    for m in merges:
        facts: dict = {"into": m.into}
        details = Details(into=m.into)
        if m.error:
            if options.strict:
                raise FusionGuardError(f"could not merge {m.moved} into {m.into} ({context.where.trace}): {m.error}")
            made.append(
                op_decision(
                    context.where, m.moved, m.executor, [], "keep", "merge_failed", facts, details, error=m.error
                )
            )
            continue
        if m.across:
            facts["across"] = details["across"] = list(m.across)
        made.append(
            op_decision(
                context.where, m.moved, m.executor, list(m.across), "rehome", "merged", facts, details, applied=applied
            )
        )
    return new, made
