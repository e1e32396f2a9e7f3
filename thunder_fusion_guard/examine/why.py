"""Why an op is not in a fusion region: every op left outside the regions of a compiled program (classified in
``why_classify.py``), each split and rematerialized region, each node ThunderFX left to torch, each statement
Dynamo ran in Python (a graph break, with Dynamo's reason), each rescue and, given the arguments, each region
nvFuser ran as several kernels (``why_segments.py``); the rows that say the same as one (``why_rows.py``).

Runs only when asked, after the program ran; it reads the last traces and changes neither them nor outputs.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Any

from .. import _thunder as th
from .._thunder import partition as pt
from ..ops.kinds import compute_bound
from ..progress import Progress
from ..render.table import op_groups
from ..transform import guards_of
from .why_classify import (
    WhyContext,
    classify,
    context_of,
    graph_break_rows,
    io_bytes,
    is_cost_free,
    is_work,
    outside_thunder_row,
)
from .why_rows import NO_FIX, WhyKind, WhyReport, WhyRow, grouped, not_analysed
from .why_segments import kernel_rows

__all__ = ["numbering_gap_rows", "recomputed_rows", "rescue_rows", "split_rows", "trace_rows", "why_not_fused"]


def why_not_fused(fn: Any, *args: Any, backward: bool = True, **kwargs: Any) -> WhyReport:
    """Why each op of ``fn``'s last run is outside a fusion region. ``fn``: a ``thunder.jit`` function or
    module, a ThunderFX-compiled module (``thunder.dynamo.thunderfx``) or its ``ThunderCompiler``, after it
    ran. Where a FusionGuard rewrote the traces, the traces as Thunder made them are read.

    Given ``args`` (and ``kwargs``), ``fn`` runs once more (and its backward, with ``backward``) to record each
    nvFuser region's arguments, and every region nvFuser ran as several kernels gets a ``segmented`` row."""
    rows: list[WhyRow] = []
    if th.is_thunderfx(fn):
        programs = [(sub.jitted, sub.label, "thunderfx") for sub in th.thunderfx_subgraphs(fn)]
        rows += [outside_thunder_row(op) for op in th.thunderfx_split_ops(fn)]
        rows += graph_break_rows(th.graph_breaks(fn))
    elif th.is_jitted(fn):
        programs = [(fn, None, "thunder.jit")]
    else:
        raise TypeError(f"{type(fn).__name__} is neither a thunder.jit function nor a thunderfx object")
    rows += rescue_rows(fn)
    with Progress("why_not_fused") as shown:
        rows, regions, ran = _all_program_rows(programs, rows, shown)
        if not ran and not rows:
            raise RuntimeError("no trace to read: call the compiled function first")
        if args or kwargs:
            shown.update(f"running once more for nvFuser's kernels ({regions} regions found)")
            try:
                rows += kernel_rows(fn, args, kwargs, backward)
            except Exception as e:  # one more run of the model may fail in any way: the report says so, still returned
                rows.append(not_analysed("forward", None, "nvFuser's kernels of one more run", e))
    return WhyReport(grouped(rows), regions)


def _all_program_rows(
    programs: Sequence[tuple[Any, str | None, str]], rows: list[WhyRow], shown: Progress
) -> tuple[list[WhyRow], int, int]:
    """``rows`` and the rows of each program's traces; the regions found and the programs that ran."""
    rows, regions, ran = list(rows), 0, 0
    for index, (jitted, subgraph, frontend) in enumerate(programs):
        shown.update(f"reading traces ({regions} regions found)", index, len(programs), "programs")
        if frontend == "thunderfx" and getattr(th.module_call(jitted), "rescued", False):
            continue  # Thunder failed on it: its rescue row says what runs it
        forward_trace, backward_trace = th.traces_before_guard(jitted)
        if forward_trace is None:  # a subgraph compiled but not run yet
            continue
        ran += 1
        traces = [(name, t) for name, t in (("forward", forward_trace), ("backward", backward_trace)) if t is not None]
        try:
            rows += _program_rows(context_of(jitted, subgraph=subgraph, frontend=frontend), traces)
        except Exception as e:  # the report is still returned, saying what it could not read
            rows.append(not_analysed("forward", subgraph, "the program's traces", e))
        regions += sum(1 for _, t in traces for b in t.bound_symbols if th.is_fusion(b))
    shown.update(f"reading traces ({regions} regions found)", len(programs), len(programs), "programs")
    return rows, regions, ran


def _program_rows(context: WhyContext, traces: Sequence[tuple[str, Any]]) -> list[WhyRow]:
    rows: list[WhyRow] = []
    for name, trace in traces:
        rows += trace_rows(trace, replace(context, trace=name))
    return rows + recomputed_rows(traces, context.subgraph) + numbering_gap_rows(traces, context.subgraph)


def trace_rows(trace: Any, context: WhyContext) -> list[WhyRow]:
    """The rows of one final trace: each op outside a region (the cost-free ones of one kind and executor as
    one row) and each split between two regions of one executor."""
    rows: list[WhyRow] = []
    views: dict[tuple[str, str], list[WhyRow]] = {}
    for bsym in trace.bound_symbols:
        if not is_work(bsym):
            continue
        row = classify(bsym, context)
        if is_cost_free(bsym):
            views.setdefault((row.kind, row.executor or ""), []).append(row)
        else:
            rows.append(row)
    for group in views.values():
        names = [r.op for r in group]
        many = {"op": "views: " + ", ".join(op_groups(names)), "count": len(group), "ops": names, "source": None}
        rows.append(replace(group[0], **many) if len(group) > 1 else group[0])
    return rows + split_rows(trace, context)


def rescue_rows(fn: Any) -> list[WhyRow]:
    """A ``rescue`` row for each region or ThunderFX subgraph the guards of ``fn`` rescued: it failed in Thunder
    or its fusion executor, and runs another way (the decision's ``details`` say how)."""
    rows = []
    for guard in guards_of(fn):
        for d in guard.report.filter(action="rescue"):
            if d.error is None:
                continue  # outputs restrided: nothing failed
            sub = guard.report.subgraphs.get(d.subgraph) if d.subgraph else None
            repro = "; details['reproduction'] reproduces it alone" if d.details.get("reproduction") else ""
            rows.append(
                WhyRow(
                    trace=d.trace,
                    subgraph=(sub.name or sub.id) if sub is not None else d.subgraph,
                    op=d.region,
                    source=d.details.get("source"),
                    kind=WhyKind.RESCUE,
                    reason=d.reason,
                    established_by="FusionGuard rescue",
                    try_=f"runs by {d.details.get('rescued_by', '?')} now{repro}",
                    executor=d.executor,
                    ops=list(d.ops),
                    detail=str(d.details.get("explanation", "")),
                )
            )
    return rows


# --- regions: splits, the same outputs computed twice, numbering gaps ------------------------------------

_NUMBERED = re.compile(r"^(?P<stem>.*?)(?P<n>\d+)$")


def _regions(trace: Any) -> list[tuple[int, Any]]:
    return [(i, b) for i, b in enumerate(trace.bound_symbols) if th.is_fusion(b)]


def _names(values: Iterable[Any]) -> set[str]:
    return {getattr(p, "name", None) for p in th.tensor_proxies(list(values))} - {None}


def split_rows(trace: Any, context: WhyContext) -> list[WhyRow]:
    """A row per two consecutive regions of one executor that the fusion pass did not merge, and why: ops
    between them the executor could not take (consecutive fusion), or merging would make a cycle (dataflow)."""
    rows = []
    by_executor: dict[str, list[tuple[int, Any]]] = {}
    for i, b in _regions(trace):
        by_executor.setdefault(th.executor_name(b), []).append((i, b))
    mode = pt.fusion_type(context.cd)
    for executor, regions in by_executor.items():
        for (i, first), (j, second) in itertools.pairwise(regions):
            between = [b for b in trace.bound_symbols[i + 1 : j] if is_work(b) and not th.is_fusion(b)]
            crossing = _names(first.flat_outs) & _names(second.flat_args)
            nbytes = 2 * sum(th.tensor_nbytes(p) or 0 for p in th.tensor_proxies(first.flat_outs) if p.name in crossing)
            names = [pt.qualified_name(b) for b in between]
            if mode == "consecutive" and between:
                kind, by = WhyKind.SPLIT, "consecutive fusion re-run"
                reason = f"{len(between)} op(s) between that {executor} could not take: {', '.join(names[:4])}"
            elif between and _depends_through(trace, i, j, between):
                kind, by = WhyKind.SPLIT, "dataflow re-run"
                reason = f"merging would make a cycle through {', '.join(names[:4])}"
            else:
                kind, by = WhyKind.UNKNOWN, f"{mode} fusion re-run"
                reason = f"two {executor} regions not merged; tried: ops between ({len(between)}), cycle check"
            rows.append(
                WhyRow(
                    trace=context.trace,
                    subgraph=context.subgraph,
                    op=f"{first.sym.name} | {second.sym.name}",
                    kind=kind,
                    reason=reason,
                    established_by=by,
                    bytes=nbytes,
                    try_="see the rows of the ops between" if between else NO_FIX,
                    executor=executor,
                    ops=names,
                )
            )
    return rows


def _depends_through(trace: Any, i: int, j: int, between: list[Any]) -> bool:
    """True when region ``j`` reads, through ops of ``between``, what region ``i`` wrote."""
    reached = _names(trace.bound_symbols[i].flat_outs)
    via = False
    for b in between:
        if _names(b.flat_args) & reached:
            reached |= _names(b.flat_outs)
            via = True
    return via and bool(_names(trace.bound_symbols[j].flat_args) & reached)


def recomputed_rows(traces: Sequence[tuple[str, Any]], subgraph: str | None) -> list[WhyRow]:
    """A row per set of regions that compute the same outputs (by name), across a program's ``(name, trace)``
    pairs: regions of one trace (rematerialization moved a producer's ops into each consumer), or a forward
    region and a backward one (computed again in backward instead of saved)."""
    produced: dict[str, list[tuple[tuple[str, str], Any]]] = {}
    for name, trace in traces:
        for _, region in _regions(trace):
            for sub in region.subsymbols:
                for out in _names(sub.flat_outs):
                    produced.setdefault(out, []).append(((name, region.sym.name), sub))
    places: dict[tuple[tuple[str, str], ...], list[Any]] = {}
    for found in produced.values():
        where = tuple(dict.fromkeys(place for place, _ in found))
        if len(where) > 1:
            places.setdefault(where, []).append(found[0][1])
    rows = []
    for where, subs in places.items():
        names = [pt.qualified_name(s) for s in subs]
        in_traces = list(dict.fromkeys(t for t, _ in where))
        if len(in_traces) == 1:
            reason = f"computed in each of {', '.join(r for _, r in where)} (rematerialization)"
            saves = "the write and read"
        else:
            first, *again = in_traces
            regions = {t: ", ".join(r for u, r in where if u == t) for t in in_traces}
            reason = f"computed in {first} {regions[first]} and again in " + ", ".join(
                f"{t} {regions[t]}" for t in again
            )
            reason += " instead of saved"
            saves = f"storing the result for {in_traces[-1]}"
        rows.append(
            WhyRow(
                trace=in_traces[-1],
                subgraph=subgraph,
                op=", ".join(dict.fromkeys(names)),
                source=th.source_line(*subs),
                kind=WhyKind.REMATERIALIZED,
                reason=reason,
                established_by="output names",
                bytes=io_bytes(*subs),  # what the recomputation reads and writes
                try_=_recomputed_try(saves, compute_bound(names)),
                count=len(subs),
                ops=names,
                facts={"regions": {t: [r for u, r in where if u == t] for t in in_traces}},
            )
        )
    return rows


def _recomputed_try(saves: str, heavy: list[str]) -> str:
    """What a rematerialized row offers: nothing where the recomputation only reads and writes memory; where it
    repeats a convolution, a matrix product or attention, that it costs their FLOPs again."""
    if not heavy:
        return f"none needed: recomputing saves {saves}"
    return f"weigh it: recomputing saves {saves} but runs {', '.join(heavy)} again (its FLOPs, not only its bytes)"


def numbering_gap_rows(traces: Sequence[tuple[str, Any]], subgraph: str | None) -> list[WhyRow]:
    """A row per fusion number missing across a program's traces (Thunder numbers the backward's regions on
    from the forward's): rematerialization moved that region's ops into its consumers and it was removed."""
    numbers: dict[tuple[str, str], dict[int, str]] = {}
    for name, trace in traces:
        for _, region in _regions(trace):
            match = _NUMBERED.match(region.sym.name)
            if match:
                numbers.setdefault((th.executor_name(region), match["stem"]), {})[int(match["n"])] = name
    rows = []
    for (executor, stem), seen in numbers.items():
        for n in sorted(set(range(max(seen) + 1)) - set(seen)):
            before = [k for k in seen if k < n]
            rows.append(
                WhyRow(
                    trace=seen[max(before)] if before else "forward",
                    subgraph=subgraph,
                    op=f"{stem}{n}",
                    kind=WhyKind.REMATERIALIZED,
                    reason=f"{stem}{n} is gone: rematerialization moved its ops into the regions that consume them",
                    established_by="fusion numbering",
                    bytes=0,
                    try_="none needed: recomputing saves the write and read",
                    executor=executor,
                )
            )
    return rows
