"""The report: every decision one guard made, what it saw, and the table and Markdown that show them."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

from . import _thunder as th
from .decisions import (
    ACTIONS,
    Decision,
    Subgraph,
    action_text,
    compilation_notes,
    estimate_text,
    kernels_text,
    ops_text,
    reason_text,
)
from .render import html_page


class Report:
    """Every decision one :class:`FusionGuard` has made, across all the traces it has seen.

    Under ThunderFX, ``subgraphs`` maps each split subgraph's id to its :class:`Subgraph`; decisions
    name theirs in ``Decision.subgraph``. ``traces_seen`` counts the traces the guard was handed and
    ``executors`` lists (name, is a fusion executor) of the executors they were compiled with, so that an
    empty report can tell "not compiled yet" from "compiled, but Thunder made no fusion region".
    ``measuring`` says what timing regions near break-even cost (``seconds`` in all, ``timed``,
    ``from_cache``, ...), ``calibrations`` each calibration run while compiling. In a distributed run
    decisions name their rank, and ``warnings`` says where ranks decided differently (see ``FusionGuard.check_ranks``).
    ``recompiles`` says, per function name, why Thunder compiled a ``thunder.jit`` function again (filled by
    ``explain``; a ThunderFX subgraph's are in its :class:`Subgraph`). ``backend_choices`` holds what
    ``choose_backends`` chose for each ThunderFX subgraph (``BackendChoice.to_dict()``).
    """

    def __init__(self) -> None:
        self.decisions: list[Decision] = []
        self.subgraphs: dict[str, Subgraph] = {}
        self.measuring: dict[str, Any] = {}
        self.calibrations: list[dict[str, Any]] = []
        self.traces_seen = 0
        self.executors: list[tuple[str, bool]] = []
        self.warnings: list[str] = []
        self.recompiles: dict[str, list[str]] = {}
        self.backend_choices: list[dict[str, Any]] = []

    def saw_trace(self, executors: list[tuple[str, bool]]) -> None:
        """Count one trace handed to the guard, compiled with ``executors`` ((name, is fusion) pairs)."""
        self.traces_seen += 1
        self.executors += [e for e in executors if e not in self.executors]

    def notice(self) -> str | None:
        """A line for a report without region decisions: nothing compiled yet, or why there was no region."""
        if self.traces_seen == 0 and not self.decisions:
            return (
                "FusionGuard: nothing compiled yet: Thunder compiles, and the guard decides, at the first call; "
                "call the jitted function first."
            )
        if any(d.about_region for d in self.decisions):
            return None
        return (
            f"FusionGuard: called, but Thunder made no fusion region in the {self.traces_seen} "
            f"trace{'s' if self.traces_seen != 1 else ''} it compiled; "
            f"{th.no_region_hint(self.executors)}."
        )

    @property
    def rank(self) -> int | None:
        """The rank the decisions were made on (None outside a distributed run, or for several ranks)."""
        return _rank_of(self.decisions)

    def add(self, decision: Decision) -> None:
        if decision.action not in ACTIONS:
            raise ValueError(f"unknown action {decision.action!r}; allowed: {ACTIONS}")
        self.decisions.append(decision)

    def add_subgraph(self, subgraph: Subgraph) -> None:
        self.subgraphs[subgraph.id] = subgraph

    def __len__(self) -> int:
        return len(self.decisions)

    def __iter__(self):
        return iter(self.decisions)

    def filter(self, **match: Any) -> list[Decision]:
        """Decisions whose fields equal every ``field=value`` given."""
        return [d for d in self.decisions if all(getattr(d, k) == v for k, v in match.items())]

    def counts(self) -> dict[str, int]:
        return dict(Counter(d.action for d in self.decisions))

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"counts": self.counts(), "decisions": [d.to_dict() for d in self.decisions]}
        data["traces_seen"] = self.traces_seen
        data["executors"] = [name for name, _ in self.executors]
        notice = self.notice()
        if notice:
            data["notice"] = notice
        if self.subgraphs:
            data["subgraphs"] = {key: sub.to_dict() for key, sub in self.subgraphs.items()}
        if self.measuring:
            data["measuring"] = dict(self.measuring)
        if self.calibrations:
            data["calibrations"] = list(self.calibrations)
        if self.rank is not None:
            data["rank"] = self.rank
        if self.warnings:
            data["warnings"] = list(self.warnings)
        if self.recompiles:
            data["recompiles"] = {k: list(v) for k, v in self.recompiles.items()}
        if self.backend_choices:
            data["backend_choices"] = [dict(c) for c in self.backend_choices]
        return data

    def to_json(self, **kwargs: Any) -> str:
        return json.dumps(self.to_dict(), **kwargs)

    def to_markdown(self, title: str = "FusionGuard report") -> str:
        text = format_markdown(self.decisions, self.subgraphs, title, self.recompiles)
        text += "".join(f"\nwarning: {_md_cell(w)}\n" for w in self.warnings)
        notice = self.notice()
        return text if notice is None else f"{text}\n{notice}\n"

    def to_html(self, title: str = "FusionGuard report", graphs: Any = ()) -> str:
        """A self-contained HTML page of the decisions (sortable), with pictures of the dataflow graphs
        ``graphs`` (``trace_graphs(jitted)``) when given; ``profile_regions(...).to_html()`` adds the profile."""
        return html_page(title, self.decisions, self.subgraphs, graphs=list(graphs), recompiles=self.recompiles)

    def __str__(self) -> str:
        notice = self.notice()
        if not self.decisions and not self.subgraphs:
            return notice or format_table([])
        text = format_table(self.decisions, self.subgraphs, self.recompiles)
        m = self.measuring
        if m.get("timed") or m.get("from_cache"):
            text += (
                f"\nmeasured near break-even: {m['timed']} regions timed in {m['seconds']:.2f} s, "
                f"{m['from_cache']} from the cache"
            )
        for c in self.calibrations:
            text += f"\ncalibration of {c['executor']} on {c['device']}: {c['result']}"
        text += "".join(f"\nbackend of {backend_choice_line(c)}" for c in self.backend_choices)
        text += "".join(f"\nwarning: {w}" for w in self.warnings)
        return text if notice is None else f"{text}\n{notice}"

    def __repr__(self) -> str:
        return f"Report({self.counts()})"


def backend_choice_line(choice: dict[str, Any]) -> str:
    """'subgraph: backend: why', and each backend that failed on it, of one ``choose_backends`` choice."""
    failed = "".join(f"; {name} failed: {problem}" for name, problem in choice.get("problems", {}).items())
    return f"{choice['subgraph']}: {choice['chosen']}: {choice['reason']}{failed}"


def _header(with_kernels: bool) -> tuple[str, ...]:
    kernels = ("kernels",) if with_kernels else ()
    return ("trace", "region", "executor", "ops", *kernels, "action", "est µs region/eager", "reason")


def _row(d: Decision, with_kernels: bool, grouped: bool) -> tuple[str, ...]:
    where = d.trace if d.subgraph is None or grouped else f"{d.subgraph}/{d.trace}"
    if d.function:
        where = f"{d.function}#{d.compile_index}:{where}"
    kernels = (kernels_text(d.details),) if with_kernels else ()
    return (where, d.region, d.executor, ops_text(d.ops), *kernels, action_text(d), estimate_text(d), reason_text(d))


def _groups(decisions: list[Decision], subgraphs: dict[str, Subgraph]) -> list[tuple[Subgraph | None, list[Decision]]]:
    """Decisions by subgraph, in the order the subgraphs were compiled; the rest (not ThunderFX) last."""
    groups: list[tuple[Subgraph | None, list[Decision]]] = []
    for key, sub in subgraphs.items():
        mine = [d for d in decisions if d.subgraph == key]
        groups.append((sub, mine))
    rest = [d for d in decisions if d.subgraph not in subgraphs]
    if rest:
        groups.append((None, rest))
    return groups


def _rank_of(decisions: list[Decision]) -> int | None:
    ranks = {d.rank for d in decisions if d.rank is not None}
    return ranks.pop() if len(ranks) == 1 else None


def _summary(decisions: list[Decision], subgraphs: dict[str, Subgraph]) -> str:
    counts = Counter(d.action for d in decisions)
    summary = ", ".join(f"{counts[a]} {a}" for a in ACTIONS if counts[a])
    where = f" in {len(subgraphs)} subgraph{'s' * (len(subgraphs) != 1)}" if subgraphs else ""
    rank = _rank_of(decisions)
    who = "FusionGuard" if rank is None else f"FusionGuard (rank {rank})"
    return f"{who}: {len(decisions)} decision{'s' * (len(decisions) != 1)} ({summary}){where}"


def format_table(
    decisions: list[Decision],
    subgraphs: dict[str, Subgraph] | None = None,
    recompiles: dict[str, list[str]] | None = None,
) -> str:
    """A fixed-width table, one row per decision; under ThunderFX a heading per subgraph with its ops. A
    program Thunder compiled more than once gets a line saying so (:func:`compilation_notes`).

    A ``kernels`` column (count and nvFuser schedulers) appears once kernel details were collected.
    """
    subgraphs = subgraphs or {}
    if not decisions and not subgraphs:
        return "FusionGuard: no fusion regions seen yet (call the jitted function first)."
    with_kernels = any("kernels" in d.details for d in decisions)
    header = _header(with_kernels)
    grouped = bool(subgraphs)
    groups = _groups(decisions, subgraphs) if grouped else [(None, decisions)]
    rows = {id(d): _row(d, with_kernels, grouped) for d in decisions}
    widths = [max(len(str(r[i])) for r in [header, *rows.values()]) for i in range(len(header) - 1)]

    def line(r: tuple[str, ...]) -> str:
        return "  ".join(str(c).ljust(w) for c, w in zip(r[:-1], widths, strict=True)) + "  " + r[-1]

    lines = [line(header), "-" * min(160, sum(widths) + 2 * len(widths) + 20)]
    rank = _rank_of(decisions)
    if rank is not None:
        lines.insert(0, f"FusionGuard report (rank {rank})")
    for sub, mine in groups:
        if grouped:
            lines.append(sub.heading() if sub else "not from ThunderFX:")
            lines += [f"  split: {reason}" for reason in (sub.split_reasons if sub else [])]
            lines += [f"  {note}" for note in compilation_notes(sub, mine, recompiles)]
            if not mine:
                lines.append("  (no fusion region)")
        lines += [line(rows[id(d)]) for d in mine]
        if not grouped:
            lines += compilation_notes(None, mine, recompiles)
    lines.append(_summary(decisions, subgraphs))
    return "\n".join(lines)


def _md_cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def format_markdown(
    decisions: list[Decision],
    subgraphs: dict[str, Subgraph] | None = None,
    title: str = "FusionGuard report",
    recompiles: dict[str, list[str]] | None = None,
) -> str:
    """The report as Markdown: a table per ThunderFX subgraph (or one table), then the summary."""
    subgraphs = subgraphs or {}
    with_kernels = any("kernels" in d.details for d in decisions)
    header = _header(with_kernels)
    grouped = bool(subgraphs)
    rank = _rank_of(decisions)
    lines = [f"# {_md_cell(title if rank is None else f'{title} (rank {rank})')}", ""]
    for sub, mine in _groups(decisions, subgraphs) if grouped else [(None, decisions)]:
        if grouped:
            title = sub.id if sub is None or sub.name is None else f"{sub.id} ({sub.name})"
            lines += [f"## {title if sub else 'not from ThunderFX'}", ""]
            if sub:
                lines += [f"ops ({len(sub.ops)}): {_md_cell(', '.join(sub.ops))}", ""]
                lines += [f"- split: {_md_cell(reason)}" for reason in sub.split_reasons]
        notes = compilation_notes(sub, mine, recompiles)
        lines += [f"- {_md_cell(note)}" for note in notes] + ([""] if notes else [])
        if not mine:
            lines += ["no fusion region", ""]
            continue
        lines += ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
        for d in mine:
            cells = list(_row(d, with_kernels, grouped))
            cells[3] = ops_text(d.ops, None)  # every op, counted
            lines.append("| " + " | ".join(_md_cell(c) for c in cells) + " |")
        lines.append("")
    lines.append(_summary(decisions, subgraphs))
    return "\n".join(lines) + "\n"
