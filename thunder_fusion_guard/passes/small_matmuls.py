"""A matmul or linear over a few terms, or too small to be worth a GEMM launch, computed inside the fusion region
that reads it first, as products and a sum.

e3nn's tensor products contract the components of irreps: batched matmuls over 1, 3 or 5 terms (outer products)
whose [edges, 32, 32] results cuBLAS writes and one region alone reads, often only to transpose them into a joined
tensor. Computed inside that region as ``sum(a[..., :, :, None] * b[..., None, :, :], -2)``, the result is never
written nor read back and a GEMM launch goes. Inductor unrolls such a sum into multiply-adds in the order cuBLAS
adds the terms (the same bits on an H200 in e3nn's sizes), but nothing promises it, so this is opt-in
(``rewrites.small_matmuls``) as ``merge_regions`` is. e3nn's linears on nodes are matmuls over 32 or 96 terms of a
few million products ([768, 32] @ [32, 32] for 256 atoms' vectors): their GEMM is launch-bound, and cuBLAS runs
several of them split over K, a second kernel adding the parts; a short sum inside the reading region costs less.
The pass runs before regions are decided, so that ``choose_executor`` times each region with its products on both
executors. A second pass, once regions are decided, takes the rest into regions other than nvFuser's (nvFuser 0.2.36
asserts on some e3nn regions given them): the radial networks' first layers, linears over 8 terms that cuBLAS runs as
four kernels (split-K GEMM, scaling, epilogue, memset), their results saved for the backward (the region computes and
outputs them); and e3nn's backward matmuls behind the views nvFuser leaves outside its regions (shape ops alone make
no region), which move in with the matmul, the torch executor's reshape as Thunder's prim.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

from .. import _thunder as th
from ..decisions import Decision, Details
from ..ops import communication_segments, crosses_communication, runs_as_view
from .context import FusionGuardError, PassContext, may_change
from .records import op_decision
from .rewrite import readers

SMALL_INNER = 8  # the most terms a matmul moved into a region sums (Inductor unrolls sums of up to 8), any size
# A launch-bound matmul moves too: at most this many terms and this many products (output elements times terms).
SHORT_INNER, LAUNCH_BOUND_PRODUCTS = 256, 1 << 22


@dataclass(frozen=True)
class MatmulMoved:
    """One matmul or linear computed in the region that reads it (``error``: why rebuilding that region failed;
    ``refused``: why its executor cannot run the products), its op, output, terms and where it went; ``views``: the
    views outside any region, from the result to the region, that went in with it; ``also_output``: the region
    outputs the result for the ops that read it after the region."""

    op: str
    output: str
    inner: int
    into: str
    executor: str
    source: str | None
    error: str = ""
    refused: str = ""
    views: tuple[str, ...] = ()
    also_output: bool = False


@dataclass(frozen=True)
class Reach:
    """Which matmuls a pass moves beyond a matmul whose result one region alone reads: ``linears``; ``shared``, a
    result a region reads first and later ops too (the region then outputs it: the return, the backward's saved
    values); ``through_views``, a result reaching its region through a chain of views left outside regions (nvFuser
    leaves views between two matmuls outside, a region of shape ops alone), each read by the next alone, which go in
    with it."""

    linears: bool = False
    shared: bool = False
    through_views: bool = False


def matmuls_into_regions(
    trace: th.TraceCtx,
    may_rebuild: Callable[[th.BoundSymbol], bool],
    max_inner: int = SMALL_INNER,
    metadata_ops: frozenset[str] = frozenset(),
    reach: Reach = Reach(),
    tried: frozenset[str] = frozenset(),
) -> tuple[th.TraceCtx, list[MatmulMoved]]:
    """``trace`` with each float32 matmul over at most ``max_inner`` terms, or launch-bound (:func:`launch_bound`),
    whose result one later fusion region alone reads (``may_rebuild`` allows) computed inside that region as products
    and a sum; linears, shared results and results behind views too as ``reach`` says. A result only non-fusion ops
    read, or one with a communication op between the matmul and its reader, stays outside, as does one whose output
    is among ``tried`` (an earlier pass kept it)."""
    bsyms: list[th.BoundSymbol | None] = list(trace.bound_symbols)
    readers_of = readers(bsyms)
    segments = communication_segments(bsyms)
    moved: list[MatmulMoved] = []
    for i in range(len(bsyms) - 1, -1, -1):  # the last first: each region's products end up in trace order
        b = bsyms[i]
        mm = th.matmul_of(b) if b is not None and not th.is_fusion(b) else None
        if mm is None or mm.out.name in tried or (mm.linear and not reach.linears):
            continue
        if mm.inner > max_inner and not launch_bound(mm):
            continue
        reached = _reading_region(bsyms, readers_of, mm.out.name, metadata_ops, reach)
        if reached is None:
            continue
        chain, j, also_output = reached
        region = bsyms[j]
        if not may_rebuild(region) or crosses_communication(segments, i, j):
            continue
        into, ex = region.sym.name, th.executor_name(region)
        views = [th.view_as_prim(bsyms[k]) for k in chain]
        found = MatmulMoved(
            th.op_name(b), mm.out.name, mm.inner, into, ex, th.source_line(b),
            views=tuple(th.op_name(v) for v in views), also_output=also_output,
        )  # fmt: skip
        products = th.matmul_products(trace, mm)
        if not all(th.executor_claims(region, op) for op in (*products, *views)):
            moved.append(replace(found, refused=f"{ex} does not claim the products and their sum"))
            continue
        made = {mm.out.name, *(p.name for v in views for p in v.flat_proxy_outs)}
        inputs = th.unique_proxies([*mm.operands, *(p for p in region.flat_proxy_args if p.name not in made)])
        outputs = [*region.flat_proxy_outs, *([mm.out] if also_output else [])]
        try:
            bsyms[j] = th.rebuild_fusion(region, [*products, *views, *th.subsymbols(region)], inputs, outputs)
        except Exception as e:  # rebuilding a fusion may raise anything in Thunder or the executor: the matmul stays
            moved.append(replace(found, error=f"{type(e).__name__}: {e}"))
            continue
        for k in (i, *chain):
            bsyms[k] = None
        for p in mm.operands:
            readers_of[p.name].discard(i)
            readers_of[p.name].add(j)
        moved.append(found)
    if all(m.error or m.refused for m in moved):
        return trace, moved[::-1]
    return th.new_trace_like(trace, [b for b in bsyms if b is not None]), moved[::-1]


def _reading_region(
    bsyms: list[th.BoundSymbol | None],
    readers_of: dict[str, set[int]],
    name: str,
    metadata_ops: frozenset[str],
    reach: Reach,
) -> tuple[list[int], int, bool] | None:
    """Where the tensor ``name`` goes into a fusion region: the views outside regions on the way (their positions),
    the region's position, and whether ops after the region read ``name`` too; None where no region reads it first
    (as far as ``reach`` looks), or a view on the way has another reader or reads another tensor."""
    read_by = readers_of.get(name, set())
    if not read_by or (len(read_by) > 1 and not reach.shared):
        return None
    first = min(read_by)
    if th.is_fusion(bsyms[first]):
        return [], first, len(read_by) > 1
    chain: list[int] = []
    while len(read_by) == 1 and reach.through_views:
        (k,) = read_by
        view = bsyms[k]
        if th.is_fusion(view):
            return chain, k, False
        outs = view.flat_proxy_outs
        if [p.name for p in view.flat_proxy_args] != [name] or len(outs) != 1 or not runs_as_view(view, metadata_ops):
            return None
        chain.append(k)
        name = outs[0].name
        read_by = readers_of.get(name, set())
    return None


def launch_bound(mm: th.Matmul) -> bool:
    """Whether ``mm`` sums at most ``SHORT_INNER`` terms in at most ``LAUNCH_BOUND_PRODUCTS`` products: a GEMM whose
    launch (and cuBLAS's split-K reduction, where it splits) costs more than the products in a fusion."""
    return mm.inner <= SHORT_INNER and math.prod(int(n) for n in mm.out.shape) * mm.inner <= LAUNCH_BOUND_PRODUCTS


def small_matmul_pass(trace: th.TraceCtx, context: PassContext) -> tuple[th.TraceCtx, list[Decision]]:
    """Before regions are decided: compute matmuls over a few terms inside the region that alone reads them
    (:func:`matmuls_into_regions`), so that ``choose_executor`` times that region with its products."""
    return _moved(trace, context, may_change(context.options, keep_bits=False), Reach())


# After regions are decided, the rest moves into regions of the executors that compile the products with the
# region's work: not nvFuser's (0.2.36 fails with an internal assert, getInputAllocationSizes, on some e3nn regions
# given the views and linears, H200 at 6760f77).
LATE_REACH = Reach(linears=True, shared=True, through_views=True)
NOT_INTO = frozenset({"nvfuser"})


def late_small_matmul_pass(trace: th.TraceCtx, context: PassContext) -> tuple[th.TraceCtx, list[Decision]]:
    """After regions are decided: linears, results read later too, and results behind views outside regions,
    computed inside the region that reads them first, where its executor is not nvFuser."""
    may = may_change(context.options, keep_bits=False)
    where = context.where.trace
    ours = [d for d in context.decided if d.trace == where and d.code == "matmul_kept"]
    kept = frozenset(d.details.get("output", "") for d in ours)
    return _moved(trace, context, lambda r: th.executor_name(r) not in NOT_INTO and may(r), LATE_REACH, kept)


def _moved(
    trace: th.TraceCtx,
    context: PassContext,
    may_rebuild: Callable[[th.BoundSymbol], bool],
    reach: Reach,
    tried: frozenset[str] = frozenset(),
) -> tuple[th.TraceCtx, list[Decision]]:
    """The moves of :func:`matmuls_into_regions` as decisions (applied unless ``report_only``)."""
    options = context.options
    # Opted into knowing the products may round differently, so exact_only does not hold them back.
    metadata_ops = frozenset(options.rewrites.metadata_ops)
    new, moves = matmuls_into_regions(trace, may_rebuild, metadata_ops=metadata_ops, reach=reach, tried=tried)
    made = []
    for m in moves:
        details = Details(output=m.output, into=m.into, **({"source": m.source} if m.source else {}))
        facts: dict = {"into": m.into, "inner": m.inner}
        if m.views:
            facts["views"] = details["views"] = list(m.views)
        if m.also_output:
            facts["also_output"] = details["also_output"] = True
        if m.error and options.strict:
            raise FusionGuardError(
                f"could not compute the matmul {m.output} inside {m.into} ({context.where.trace}): {m.error}"
            )
        if m.error or m.refused:
            facts["skipped"] = m.refused or "rebuilding it failed"
            action, code, more = "keep", "matmul_kept", {"error": m.error} if m.error else {}
        else:
            action, code, more = "rehome", "matmul_moved", {"applied": not options.report_only}
        made.append(op_decision(context.where, m.into, m.executor, [m.op], action, code, facts, details, **more))
    return (trace if options.report_only else new), made
