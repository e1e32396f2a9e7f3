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
    report = report_of(obj)
    text = report.to_text(wide=wide)
    width = None if wide else WIDTH
    untimed = inductor_untimed_line(obj, report) if th.is_thunderfx(obj) else ""
    hint = wrapped(untimed, width, "  ") if untimed else []
    try:
        why = why_not_fused(obj)
    except Exception:  # nothing run yet, or not a Thunder program: the decision table says so
        return "\n".join([text, *hint])
    line = f"why not fused: {why.summary()} (why_not_fused() for the rows)"
    return "\n".join([text, *wrapped(line, width, "  "), *hint])


def inductor_untimed_line(obj: Any, report: Report) -> str:
    """For a ThunderFX object: how many of its Dynamo graphs run as ThunderFX split them with Inductor's whole graph
    never timed against that split (unguarded Thunder runs them, so the guard keeps its bits), and what times it;
    empty where none, or where ``choose_backends`` has chosen."""
    graphs = {sub.graph for sub in th.thunderfx_subgraphs(obj)}
    timed = {d.facts.get("region") for d in report if d.code in ("whole_graph", "whole_graph_kept")}
    untimed = sorted(g for g in graphs if th.dynamo_graph_label(g) not in timed)
    if not untimed or report.backend_choices:
        return ""
    return (
        f"inductor: Dynamo graphs run as ThunderFX split them, for unguarded Thunder's bits: {len(untimed)} of "
        f"{len(graphs)}; Inductor's whole graph is timed against that split only if asked: "
        "choose_backends(compiled, *args, whole_graphs=True) times both and runs the faster (where Inductor wins, "
        "its values, within its rounding)"
    )
