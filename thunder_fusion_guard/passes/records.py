"""The decisions passes make, built whole: placed where the trace comes from, the reason worded from its code and
facts by :mod:`..reasons`, every detail given at construction."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any, NamedTuple

from .. import _thunder as th
from ..decisions import Action, Decision, Details
from ..reasons import Facts, ReasonCode, words
from ..regions import Region
from .context import TraceContext


def decision(
    where: TraceContext,
    region: str,
    executor: str,
    ops: list[str],
    action: Action,
    code: ReasonCode,
    facts: Facts,
    details: Details | None = None,
    **more: Any,
) -> Decision:
    """A decision placed where ``where`` says (trace, function, compiled program, subgraph, rank), its reason
    worded from ``code`` and ``facts`` (the explanation, where it says more, first in ``details``); ``more``:
    further Decision fields."""
    reason, told = words(code, facts)
    return Decision(
        trace=where.trace,
        region=region,
        executor=executor,
        ops=ops,
        action=action,
        reason=reason,
        code=code,
        facts=dict(facts),
        function=where.function,
        compile_index=where.compile_index,
        subgraph=where.subgraph,
        rank=where.rank,
        details=Details(**{**(details or {}), **told}),
        **more,
    )


def op_decision(
    where: TraceContext,
    region: str,
    executor: str,
    ops: list[str],
    action: Action,
    code: ReasonCode,
    facts: Facts,
    details: Details | None = None,
    **more: Any,
) -> Decision:
    """A decision about ops (``details["scope"] == "op"``), not about a whole region."""
    scoped = Details(scope="op", **(details or {}))
    return decision(where, region, executor, list(ops), action, code, facts, scoped, **more)


class OpCalls(NamedTuple):
    """The calls of one op a pass changed: the op's name, how many, the first call's user line."""

    op: str
    count: int
    source: str | None


def op_calls(found: Mapping[str, Sequence[th.BoundSymbol]]) -> list[OpCalls]:
    """One :class:`OpCalls` for each op name among ``found`` (its changed calls, in trace order)."""
    return [OpCalls(op, len(calls), th.source_line(calls[0])) for op, calls in found.items()]


def op_calls_decisions(
    where: TraceContext, calls: Sequence[OpCalls], action: Action, code: ReasonCode, **more: Any
) -> list[Decision]:
    """One decision for each op of ``calls``: its facts the op's name and count, its details the first call's line."""
    return [
        op_decision(
            where,
            c.op,
            "torch",
            [c.op],
            action,
            code,
            {"name": c.op, "count": c.count},
            Details(source=c.source) if c.source else None,
            **more,
        )
        for c in calls
    ]


def region_decision(
    where: TraceContext,
    region: Region,
    action: Action,
    code: ReasonCode,
    facts: Facts,
    details: Details | None = None,
    **more: Any,
) -> Decision:
    """A decision about the whole ``region``."""
    return decision(where, region.name, region.executor, region.ops, action, code, facts, details, **more)


def source_details(region: Region) -> Details:
    """``details`` naming the user's source line of ``region``'s first op, where the trace knows one: for the
    decisions recorded at a call, after the pass that names every other decision's line has run."""
    source = th.source_line(*region.body)
    return Details(source=source) if source else Details()


def instead(earlier: Decision, **changes: Any) -> Decision:
    """A new decision about the region of ``earlier``, which stays as it was: its fields with ``changes``."""
    copies = {
        "ops": list(earlier.ops),
        "estimates": dict(earlier.estimates),
        "details": dict(earlier.details),
        "facts": dict(earlier.facts),
    }
    return replace(earlier, **{**copies, **changes})


def reworded(earlier: Decision, code: ReasonCode, facts: Facts, **changes: Any) -> Decision:
    """A new decision about the region of ``earlier`` for another reason: its details keep what they held (the
    explanation now the new reason's, where it says more), its fields take ``changes``."""
    reason, told = words(code, facts)
    kept = {key: value for key, value in earlier.details.items() if key != "explanation"}  # the new reason's, if any
    told_details = Details(**{**kept, **told})
    return instead(earlier, reason=reason, code=code, facts=dict(facts), details=told_details, **changes)
