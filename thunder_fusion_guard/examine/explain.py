"""explain(): the readable report of the guards attached to a jitted function or a ThunderFX object."""

from __future__ import annotations

from typing import Any

from .. import _thunder as th
from ..render.table import wrapped
from ..report import Report
from ..transform import guards_of
from ..wording import WIDTH
from .why import why_not_fused


def report_of(obj: Any) -> Report:
    """The report of the one guard attached to ``obj`` (``ValueError`` if there is none).

    For a ThunderFX object, the report's subgraphs get Thunder's names and split reasons first.
    """
    guards = guards_of(obj)
    if not guards:
        raise ValueError(
            f"{type(obj).__name__} has no FusionGuard: build it with thunder.jit(fn, transforms=[FusionGuard()]) "
            "or thunderfx(fn, transforms=[FusionGuard()])"
        )
    if th.is_thunderfx(obj):
        name_subgraphs(obj, guards)
    else:
        name = th.jitted_function_name(obj)
        for guard in guards:
            guard.report.recompiles[name or ""] = th.recompile_reasons(obj)
    if len(guards) == 1:
        return guards[0].report
    merged = Report()
    for g in guards:
        for d in g.report:
            merged.add(d)
        for sub in g.report.subgraphs.values():
            merged.add_subgraph(sub)
        merged.traces_seen += g.report.traces_seen
        merged.executors += [e for e in g.report.executors if e not in merged.executors]
        merged.warnings += g.report.warnings
        merged.recompiles.update(g.report.recompiles)
    return merged


def name_subgraphs(obj: Any, guards: list[Any]) -> None:
    """Give each guard's subgraphs Thunder's name (``dynamo graph 0, thunder_0``), its split reasons and why
    Thunder compiled it again, if it did."""
    for sub in th.thunderfx_subgraphs(obj):
        for guard in guards:
            key = guard.subgraph_of(sub.module)
            if key in guard.report.subgraphs:
                entry = guard.report.subgraphs[key]
                entry.name, entry.split_reasons = sub.label, list(sub.split_reasons)
                entry.recompiles = th.recompile_reasons(sub.jitted)


def explain(obj: Any, wide: bool = False) -> str:
    """The decision table of the guard(s) attached to a function jitted with FusionGuard or a ThunderFX object,
    and a line counting why ops sit outside fusions (``why_not_fused(obj)`` has the rows); lines fit 120
    columns, long text wrapped (``wide``: one line a row, however long)."""
    text = report_of(obj).to_text(wide=wide)
    try:
        why = why_not_fused(obj)
    except Exception:  # nothing run yet, or not a Thunder program: the decision table says so
        return text
    line = f"why not fused: {why.summary()} (why_not_fused() for the rows)"
    return "\n".join([text, *wrapped(line, None if wide else WIDTH, "  ")])
