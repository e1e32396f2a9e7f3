"""The rows of ``why_not_fused``: what kind of reason keeps an op (or a region) out of one fusion
(:class:`WhyKind`, each kind with the words the summary counts it in), one row (:class:`WhyRow`), built by
keyword only, and the report (:class:`WhyReport`), whose rows that say the same are one row with a count.

Data only: the text and HTML of a report are ``render/why.py``'s.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from enum import Enum
from typing import Any

from ..render.table import plural
from ..render.why import summary_text, why_html, why_text
from ..wording import error_line

__all__ = ["NO_FIX", "WhyKind", "WhyReport", "WhyRow", "grouped", "not_analysed", "region_row"]

NO_FIX = "none: no executor here can fuse it"


class WhyKind(str, Enum):
    """Why an op is outside every fusion region (the first nine: an op each), or what a row says of a region.
    A member equals its value (``WhyKind.CLAIMED == "claimed"``); ``label`` and ``labels`` are the words the
    summary counts it in, one and several; ``of_ops``: its rows are ops outside fusions. An op kind is declared
    with one label (the summary counts ops, "12 ops claimed"), a region kind with its singular and plural."""

    label: str
    labels: str
    of_ops: bool

    def __new__(cls, value: str, label: str, labels: str | None = None) -> WhyKind:
        member = str.__new__(cls, value)
        member._value_ = value
        member.label, member.labels, member.of_ops = label, labels or label, labels is None
        return member

    def __str__(self) -> str:
        return self.value

    @property
    def rank(self) -> int:
        """Its place in the summary (the order the members are declared in)."""
        return list(type(self)).index(self)

    CLAIMED = "claimed", "claimed"
    OUTSIDE_THUNDER = "outside_thunder", "outside Thunder (ThunderFX split)"
    GRAPH_BREAK = "graph_break", "run in Python (Dynamo graph break)"
    NO_TRANSLATION = "no_translation", "no translation"
    CHECKER = "checker", "refused by a checker"
    OPTION = "option", "behind a compile option"
    REGION_REFUSED = "region_refused", "in refused regions"
    NO_FUSION_EXECUTOR = "no_fusion_executor", "with no general fusion executor"
    UNKNOWN = "unknown", "unknown"
    SPLIT = "split", "region split", "regions split"
    REMATERIALIZED = "rematerialized", "rematerialization", "rematerializations"
    SEGMENTED = "segmented", "region run as several kernels", "regions run as several kernels"
    RESCUE = "rescue", "rescue (failed, run another way)", "rescues (failed, run another way)"
    NOT_ANALYSED = "not_analysed", "program or region not analysed", "programs or regions not analysed"


@dataclass(frozen=True, kw_only=True)
class WhyRow:
    """One op, or a counted group of ops (cost-free views, identical rows), or one split, rematerialized,
    segmented or rescued region, and why it is not inside a fusion region.

    ``trace``: 'forward' or 'backward' (or both, for the one row of a program without a fusion executor);
    ``kind``: a :class:`WhyKind`; ``count``: the ops it stands for (a segmented row: its segments);
    ``repeats``: how many rows that said the same it stands for (the table's op ends in a multiplication sign
    and that number); ``bytes``: of all of them; ``facts``: what its reason is worded from, by name."""

    trace: str
    op: str
    kind: WhyKind
    reason: str
    established_by: str
    try_: str
    subgraph: str | None = None
    source: str | None = None
    bytes: int | None = None
    count: int = 1
    repeats: int = 1
    executor: str | None = None
    ops: list[str] = field(default_factory=list)
    detail: str = ""  # what does not fit the one-line reason (nvFuser's verdicts, each edge tensor's bytes)
    facts: dict[str, Any] = field(default_factory=dict)  # what the reason says, as values (fuser, refused op...)

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", WhyKind(self.kind))  # a kind given by its name

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "kind": self.kind.value}


@dataclass
class WhyReport:
    """Every op outside a fusion region of a program's last forward and backward traces, with why."""

    rows: list[WhyRow]
    regions: int = 0
    kernels: int | None = None

    def ranked(self) -> list[WhyRow]:
        """The rows, the most bytes first."""
        return sorted(self.rows, key=lambda r: (-(r.bytes or 0), r.trace, r.kind.rank, r.op))

    def of_kind(self, kind: WhyKind | str) -> list[WhyRow]:
        return [r for r in self.rows if r.kind == kind]

    def summary(self) -> str:
        """One line of counts: ops outside fusions by kind, splits, rematerializations, segmented regions."""
        return summary_text(self.rows)

    def to_dict(self) -> dict[str, Any]:
        return {"summary": self.summary(), "regions": self.regions, "rows": [r.to_dict() for r in self.ranked()]}

    def __str__(self) -> str:
        return self.to_text()

    def to_text(self, wide: bool = False) -> str:
        """The summary and the ranked table, fitting 120 columns, long text wrapped, never cut (``wide``: a row a
        line)."""
        return why_text(self.summary(), self.ranked(), wide)

    def to_html(self) -> str:
        """An HTML ``<section>`` with the summary and the ranked table (all text escaped)."""
        return why_html(self.summary(), self.ranked())


def region_row(
    trace: str, subgraph: str | None, region: str, kind: WhyKind, reason: str, established_by: str, **more: Any
) -> WhyRow:
    """A row about a whole region (or the whole program), not one op: there is no rewrite to try for it."""
    return WhyRow(
        trace=trace,
        subgraph=subgraph,
        op=region,
        kind=kind,
        reason=reason,
        established_by=established_by,
        try_=NO_FIX,
        **more,
    )


def not_analysed(trace: str, subgraph: str | None, what: str, error: Exception, region: str = "-") -> WhyRow:
    """The row saying that ``what`` could not be analysed, and the error: the report is made all the same."""
    reason = f"{what} could not be analysed: {error_line(error)}"
    return region_row(trace, subgraph, region, WhyKind.NOT_ANALYSED, reason, "FusionGuard", detail=str(error))


def grouped(rows: Iterable[WhyRow]) -> list[WhyRow]:
    """``rows`` with those that say the same as one: every ``no_fusion_executor`` row of the program as one
    (one piece of advice, not one per op, trace or subgraph), and rows of one trace alike in kind, op, source,
    reason and try as one with their count (of the ops of each ThunderFX subgraph alike, or of a loop's).
    Segmented rows stay apart: their count is the region's segments."""
    out: list[WhyRow | list[WhyRow]] = []
    groups: dict[tuple, list[WhyRow]] = {}
    for row in rows:
        if row.kind == WhyKind.SEGMENTED:
            out.append(row)
            continue
        if row.kind == WhyKind.NO_FUSION_EXECUTOR:
            key: tuple = (row.kind, row.reason, row.try_)
        else:
            key = (row.trace, row.kind, row.op, row.source, row.reason, row.try_)
        if key not in groups:
            groups[key] = []
            out.append(groups[key])
        groups[key].append(row)
    return [item if isinstance(item, WhyRow) else _one(item) for item in out]


def _one(same: Sequence[WhyRow]) -> WhyRow:
    first = same[0]
    if len(same) == 1 and first.kind != WhyKind.NO_FUSION_EXECUTOR:
        return first
    known = [r.bytes for r in same]
    nbytes = None if None in known else sum(b for b in known if b is not None)
    subgraphs = "; ".join(dict.fromkeys(r.subgraph for r in same if r.subgraph)) or None
    count = sum(r.count for r in same)
    if first.kind == WhyKind.NO_FUSION_EXECUTOR:
        ops = [op for r in same for op in (r.ops or [r.op])]
        return replace(
            first,
            trace=", ".join(dict.fromkeys(r.trace for r in same)),
            subgraph=subgraphs,
            op=plural(count, "op"),
            source=None,
            bytes=nbytes,
            count=count,
            ops=ops,
            executor=None,
        )
    return replace(first, subgraph=subgraphs, bytes=nbytes, count=count, repeats=sum(r.repeats for r in same))
