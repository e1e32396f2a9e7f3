"""The record of the CUDA graphs :class:`~..cuda_graphs.GuardedCUDAGraphs` captured in one trace: how many graphs,
against Thunder's own grouping, what is no longer copied, and a graph whose gradients were still held when it would
replay or whose capture ran out of memory; and the recommendation of it where Thunder's own transform was given."""

from __future__ import annotations

import dataclasses
from typing import Any

from .. import _thunder as th
from ..cuda_graphs import GuardedCUDAGraphs
from ..decisions import Decision, Details
from ..reasons import Facts, ReasonCode, words
from ..wording import error_line
from .context import TraceContext
from .records import op_decision


def capture_decision(where: TraceContext, summary: th.CaptureSummary) -> Decision:
    """A ``capture`` decision for the graphs ``summary`` tells of, placed where ``where`` says."""
    in_place = sum(nbytes for _, _, nbytes in summary.in_place)
    facts = Facts(
        captures=list(summary.captures),
        count=summary.ops,
        thunder_captures=summary.thunder_captures,
        thunder_empty=summary.thunder_empty,
        thunder_empty_inputs=summary.thunder_empty_inputs,
        in_place=len(summary.in_place),
        in_place_bytes=in_place,
        copied_in=len(summary.copied_in),
        copied_in_bytes=sum(nbytes for _, _, nbytes in summary.copied_in),
        copied_back=len(summary.copied_back),
        copied_back_bytes=sum(nbytes for _, _, nbytes in summary.copied_back),
        handed_over=len(summary.handed_over),
        handed_over_bytes=sum(nbytes for _, _, nbytes in summary.handed_over),
        captured_by=summary.captured_by,
        recaptured_after=th.UNCAPTURED_WHILE_HELD,
        regrouped=list(summary.regrouped),
    )
    short, told = words("captured", facts)
    return Decision(
        trace="backward" if summary.backward else "forward",
        region=", ".join(summary.captures),
        executor="cudagraph",
        ops=list(summary.captures),
        action="capture",
        reason=short,
        code="captured",
        facts=dict(facts),
        function=where.function,
        compile_index=where.compile_index,
        subgraph=where.subgraph,
        rank=where.rank,
        details={
            "scope": "op",
            **told,
            "captures": list(summary.captures),
            "thunder_captures": summary.thunder_captures,
            "thunder_empty_captures": summary.thunder_empty,
            "read_in_place": [name for name, _, _ in summary.in_place],
            "bytes_not_copied": in_place,
            "still_copied": list(summary.written),
            "copied_back": [name for name, _, _ in summary.copied_back],
            "handed_over": [name for name, _, _ in summary.handed_over],
            "bytes_handed_over": sum(nbytes for _, _, nbytes in summary.handed_over),
            "own_workspace": list(summary.own_workspace),
            "copied_in": [name for name, _, _ in summary.copied_in],
            "bytes_copied_in": sum(nbytes for _, _, nbytes in summary.copied_in),
            "captured_by": summary.captured_by,
            "regrouped": list(summary.regrouped),
        },
    )


def _about_graph(capture: Decision, graph: str, code: ReasonCode, facts: Facts, details: dict[str, Any]) -> Decision:
    """The decision ``capture`` (of a trace's captures) narrowed to one of its graphs, ``graph``: worded from
    ``code`` and ``facts``, with ``details`` beside the graph's name."""
    short, told = words(code, facts)
    return dataclasses.replace(
        capture,
        region=graph,
        ops=[graph],
        reason=short,
        code=code,
        facts=dict(facts),
        details={"scope": "op", **told, "captures": [graph], **details},
    )


def held_decision(capture: Decision, graph: str, held: list[str]) -> Decision:
    """The decision for a graph of ``capture`` whose gradients ``held`` were still held when it would replay: it
    stops handing its gradients over and runs uncaptured while they are held, captured anew after
    :data:`UNCAPTURED_WHILE_HELD` such calls in a row."""
    facts = Facts(name=graph, held=list(held), recaptured_after=th.UNCAPTURED_WHILE_HELD)
    return _about_graph(capture, graph, "capture_held", facts, {"held": list(held)})


def uncaptured_decision(capture: Decision, graph: str, error: BaseException) -> Decision:
    """The decision for a graph of ``capture`` whose capture ran out of device memory: its ops run uncaptured from
    then on, the step goes on."""
    facts = Facts(name=graph, error=error_line(error))
    details = {"uncaptured": graph, "error_type": type(error).__name__}
    return _about_graph(capture, graph, "capture_uncaptured", facts, details)


def moved_decision(capture: Decision, graph: str, moved: list[str], uncaptured: bool) -> Decision:
    """The decision for a graph of ``capture`` whose inputs ``moved`` (read in place, by name) lay elsewhere than at
    its capture: captured anew with them copied in, or (``uncaptured``: it writes one) run uncaptured."""
    facts = Facts(name=graph, moved_inputs=list(moved), writes_moved=uncaptured)
    details = {"moved_inputs": list(moved), **({"uncaptured": graph} if uncaptured else {})}
    return _about_graph(capture, graph, "capture_moved", facts, details)


def reentered_decision(capture: Decision, graph: str, in_backward: bool = False) -> Decision:
    """The decision for graph ``graph`` of ``capture`` that ran again before its earlier call's outputs were let go (a
    forward graph before the backward of its earlier call; ``in_backward``: a backward graph twice in one backward
    pass): every graph of that forward and its backward runs uncaptured from then on."""
    facts = Facts(name=graph, in_backward=in_backward)
    return _about_graph(capture, graph, "capture_reentered", facts, {"uncaptured": graph})


def recommend_decision(where: TraceContext, given: str) -> Decision:
    """The decision (action ``capture``, not applied) recommending :class:`~..cuda_graphs.GuardedCUDAGraphs` where
    Thunder's own ``CUDAGraphTransform`` (``given``, its class name) was given: it runs as given."""
    recommended = GuardedCUDAGraphs.__name__
    facts = {"name": given, "recommended": recommended}
    details = Details(captured_by=given, recommended=recommended)
    return op_decision(
        where, given, "cudagraph", [given], "capture", "cuda_graphs_recommended", facts, details, applied=False
    )
