"""The report: every decision one guard made, what it saw, and the table and Markdown that show them."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

from . import _thunder as th
from .decisions import ACTIONS, Decision, Subgraph
from .render import html_page
from .render.table import (
    Section,
    action_text,
    estimate_text,
    explanation_text,
    kernels_text,
    markdown_table,
    md_cell,
    ops_text,
    plural,
    reason_text,
    region_text,
    sections,
    subgraph_heading,
    table_blocks,
    wrapped,
)
from .wording import WIDTH


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
    ``choose_backends`` chose for each ThunderFX subgraph (``BackendChoice.to_dict()``). ``first_call`` holds where
    a first call timed with ``first_call()`` spent its seconds (``FirstCall.to_dict()``: ``phases_s`` by phase).
    ``einsums_ordered`` counts the einsum tracings (Thunder traces one einsum more than once) whose labels were
    walked in sorted order (option ``ordered_einsum``).
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
        self.first_call: dict[str, Any] | None = None
        self.einsums_ordered = 0  # einsum tracings in sorted label order (``ordered_einsum``)

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
            f"FusionGuard: called, but Thunder made no fusion region in the {plural(self.traces_seen, 'trace')} "
            "it compiled; "
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
        if self.first_call:
            data["first_call"] = dict(self.first_call)
        if self.einsums_ordered:
            data["einsums_ordered"] = self.einsums_ordered
        return data

    def to_json(self, **kwargs: Any) -> str:
        return json.dumps(self.to_dict(), **kwargs)

    def to_markdown(self, title: str = "FusionGuard report") -> str:
        text = format_markdown(self.decisions, self.subgraphs, title, self.recompiles)
        text += "".join(f"\nwarning: {md_cell(w)}\n" for w in self.warnings)
        notice = self.notice()
        return text if notice is None else f"{text}\n{notice}\n"

    def to_html(self, title: str = "FusionGuard report", graphs: Any = ()) -> str:
        """A self-contained HTML page of the decisions (sortable), with pictures of the dataflow graphs
        ``graphs`` (``trace_graphs(jitted)``) when given; ``profile_regions(...).to_html()`` adds the profile."""
        return html_page(title, self.decisions, self.subgraphs, graphs=list(graphs), recompiles=self.recompiles)

    def __str__(self) -> str:
        return self.to_text()

    def to_text(self, wide: bool = False) -> str:
        """The decision table (what ``str(report)`` gives): lines of at most 120 characters, a long reason wrapped
        onto lines of its own, never cut; ``wide``: one line per decision, however long."""
        notice = self.notice()
        if not self.decisions and not self.subgraphs:
            return notice or format_table([])
        width = None if wide else WIDTH
        text = format_table(self.decisions, self.subgraphs, self.recompiles, wide=wide)
        m = self.measuring
        if m.get("timed") or m.get("from_cache"):
            text += (
                f"\nmeasured near break-even: {plural(m['timed'], 'region')} timed in {m['seconds']:.2f} s, "
                f"{m['from_cache']} from the cache"
            )
        lines = [f"calibration of {c['executor']} on {c['device']}: {c['result']}" for c in self.calibrations]
        lines += [f"backend of {backend_choice_line(c)}" for c in self.backend_choices]
        lines += [first_call_line(self.first_call)] if self.first_call else []
        lines += [f"warning: {w}" for w in self.warnings]
        lines += [notice] if notice is not None else []
        return "\n".join([text, *(part for line in lines for part in wrapped(line, width, "  "))])

    def __repr__(self) -> str:
        return f"Report({self.counts()})"


def backend_choice_line(choice: dict[str, Any]) -> str:
    """'subgraph: backend: why', and each backend that failed on it, of one ``choose_backends`` choice."""
    failed = "".join(f"; {name} failed: {problem}" for name, problem in choice.get("problems", {}).items())
    return f"{choice['subgraph']}: {choice['chosen']}: {choice['reason']}{failed}"


def first_call_line(first: dict[str, Any]) -> str:
    """'first call N s: phase s, ...' of a ``FirstCall.to_dict()``, its phases of 1 ms or more, largest first."""
    phases = sorted(((s, p) for p, s in first["phases_s"].items() if s >= 5e-4), reverse=True)
    parts = ", ".join(f"{p.replace('_', ' ')} {s:.3f} s" for s, p in phases)
    return f"first call {first['wall_s']:.3f} s: {parts or 'no phase of 1 ms or more'}"


def _header(with_kernels: bool) -> tuple[str, ...]:
    kernels = ("kernels",) if with_kernels else ()
    return ("trace", "region", "executor", "ops", *kernels, "action", "est µs region/eager", "reason")


def _row(d: Decision, with_kernels: bool, grouped: bool, alike: int = 1) -> tuple[str, ...]:
    """A decision's cells; ``alike``: it stands for a run of that many decisions alike (:func:`alike_runs`)."""
    where = d.place(subgraph=not grouped)
    kernels = (kernels_text(d.details),) if with_kernels else ()
    ops = ops_text(d.ops * alike)
    cells = (where, region_text(d), d.executor, ops, *kernels, action_text(d), estimate_text(d))
    reason = reason_text(d)
    return (*cells, reason if alike == 1 else f"{reason} (and {alike - 1} more alike: the JSON has each)")


def alike_runs(decisions: list[Decision]) -> dict[int, int]:
    """The decisions a table shows, by ``id``, each with how many it stands for: a run of consecutive decisions of
    one place, region, executor, ops, action and reason code (each op an identity removed, say) is one row, its
    first; the others are left out. Decisions without a code, and estimates or errors, are never merged."""
    shown: dict[int, int] = {}
    last: Decision | None = None
    last_key: tuple | None = None
    for d in decisions:
        key = _alike_key(d)
        if last is not None and key is not None and key == last_key:
            shown[id(last)] += 1
            continue
        shown[id(d)], last, last_key = 1, d, key
    return shown


def _alike_key(d: Decision) -> tuple | None:
    if d.code is None or d.error or d.estimates:
        return None
    return (d.place(), d.subgraph, d.region, d.executor, tuple(d.ops), d.action, d.applied, d.code)


# The columns of the text table that may wrap to fit its width: trace, region, ops, kernels (or the action: one
# word), estimates (by index from the end: a kernels column may come before them); the reason always may.
_WRAPPED = (0, 1, 3, 4, -2)


def _rank_of(decisions: list[Decision]) -> int | None:
    ranks = {d.rank for d in decisions if d.rank is not None}
    return ranks.pop() if len(ranks) == 1 else None


def _summary(decisions: list[Decision], subgraphs: dict[str, Subgraph]) -> str:
    counts = Counter(d.action for d in decisions)
    summary = ", ".join(f"{counts[a]} {a}" for a in ACTIONS if counts[a])
    where = f" in {plural(len(subgraphs), 'subgraph')}" if subgraphs else ""
    rank = _rank_of(decisions)
    who = "FusionGuard" if rank is None else f"FusionGuard (rank {rank})"
    return f"{who}: {plural(len(decisions), 'decision')} ({summary}){where}"


def format_table(
    decisions: list[Decision],
    subgraphs: dict[str, Subgraph] | None = None,
    recompiles: dict[str, list[str]] | None = None,
    wide: bool = False,
) -> str:
    """A fixed-width table, one row per decision; under ThunderFX a heading per subgraph with its ops (the
    groups of :func:`~.render.table.sections`). A program Thunder compiled more than once gets a line saying so.

    A ``kernels`` column (count and nvFuser schedulers) appears once kernel details were collected. Lines fit
    120 characters, long cells wrapped at spaces onto lines of their own, nothing cut; ``wide``: one line each.
    """
    subgraphs = subgraphs or {}
    if not decisions and not subgraphs:
        return "FusionGuard: no fusion regions seen yet (call the jitted function first)."
    width = None if wide else WIDTH
    with_kernels = any("kernels" in d.details for d in decisions)
    grouped = bool(subgraphs)
    alike = alike_runs(decisions)
    shown = [d for d in decisions if id(d) in alike]
    rows = [_header(with_kernels), *(_row(d, with_kernels, grouped, alike[id(d)]) for d in shown)]
    blocks = table_blocks(rows, last_free=True, width=width, wrap=_WRAPPED)
    rule = "-" * min(width or 160, max(len(line) for block in blocks for line in block))
    block_of = {id(d): block for d, block in zip(shown, blocks[1:], strict=True)}
    block_of.update({id(d): [] for d in decisions if id(d) not in alike})  # said by the first of their run
    lines = [*blocks[0], rule]
    rank = _rank_of(decisions)
    if rank is not None:
        lines.insert(0, f"FusionGuard report (rank {rank})")

    def text(line: str) -> list[str]:
        return wrapped(line, width, "  ")

    for section in sections(decisions, subgraphs, recompiles):
        rows_of = [line for d in section.decisions for line in block_of[id(d)]]
        if section.title is None:
            lines += rows_of + [part for note in section.notes for part in text(note)]
            continue
        lines += text(subgraph_heading(section.subgraph) if section.subgraph else f"{section.title}:")
        lines += [part for split in section.split_lines for part in text(f"  {split}")]
        lines += [part for note in section.notes for part in text(f"  {note}")]
        lines += rows_of or ["  (no fusion region)"]
    lines.append(_summary(decisions, subgraphs))
    return "\n".join(lines)


def _markdown_section(section: Section, with_kernels: bool, grouped: bool) -> list[str]:
    lines = []
    if section.title is not None:
        lines += [f"## {md_cell(section.title)}", ""]
        if section.subgraph is not None:
            lines += [f"ops ({len(section.subgraph.ops)}): {md_cell(', '.join(section.subgraph.ops))}", ""]
        lines += [f"- {md_cell(split)}" for split in section.split_lines]
    lines += [f"- {md_cell(note)}" for note in section.notes] + ([""] if section.notes else [])
    if not section.decisions:
        return [*lines, "no fusion region", ""]
    rows = []
    alike = alike_runs(section.decisions)
    for d in (d for d in section.decisions if id(d) in alike):
        cells = list(_row(d, with_kernels, grouped, alike[id(d)]))
        cells[3] = ops_text(d.ops * alike[id(d)], None)  # every op, counted
        explanation = explanation_text(d)
        if explanation:  # an explanation that opens with the reason stands for both
            cells[-1] = explanation if explanation.startswith(cells[-1]) else f"{cells[-1]} — {explanation}"
        rows.append(cells)
    return [*lines, *markdown_table(_header(with_kernels), rows), ""]


def format_markdown(
    decisions: list[Decision],
    subgraphs: dict[str, Subgraph] | None = None,
    title: str = "FusionGuard report",
    recompiles: dict[str, list[str]] | None = None,
) -> str:
    """The report as Markdown: a table per ThunderFX subgraph and one of the decisions outside them (or one
    table; the groups of :func:`~.render.table.sections`), each reason followed by its long explanation, then
    the summary."""
    subgraphs = subgraphs or {}
    with_kernels = any("kernels" in d.details for d in decisions)
    rank = _rank_of(decisions)
    lines = [f"# {md_cell(title if rank is None else f'{title} (rank {rank})')}", ""]
    for section in sections(decisions, subgraphs, recompiles):
        lines += _markdown_section(section, with_kernels, bool(subgraphs))
    lines.append(_summary(decisions, subgraphs))
    return "\n".join(lines) + "\n"
