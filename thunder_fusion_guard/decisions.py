"""Decision records: the fate of a region or of ops, the ThunderFX subgraphs they belong to, and the text
every report and picture writes them with."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

ACTIONS = ("keep", "reject", "switch", "rehome", "remove", "fold", "hoist")


@dataclass
class Decision:
    """The fate of one fusion region (kept, rejected to the torch executor, switched to another fusion executor)
    or of ops (folded, removed, re-homed, hoisted; ``details["scope"] == "op"``) in one trace."""

    trace: str
    region: str
    executor: str
    ops: list[str]
    action: str
    reason: str
    function: str | None = None
    compile_index: int = 0
    applied: bool = True
    error: str | None = None
    estimates: dict[str, float] = field(default_factory=dict)
    subgraph: str | None = None
    details: dict[str, Any] = field(default_factory=dict)
    rank: int | None = None

    @property
    def about_region(self) -> bool:
        """True for a decision about a whole region, False for one about ops."""
        return self.details.get("scope") != "op"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Subgraph:
    """A ThunderFX split subgraph the guard compiled: its id, its fx ops, and once known Thunder's name for it
    (``dynamo graph 0, thunder_0``), why Thunder split the Dynamo graph there, and why Thunder compiled it
    again (``recompiles``: one line per compilation after the first, '' where no check told)."""

    id: str
    ops: list[str]
    name: str | None = None
    split_reasons: list[str] = field(default_factory=list)
    recompiles: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def heading(self) -> str:
        label = self.id if self.name is None else f"{self.id} ({self.name})"
        return f"{label}, {len(self.ops)} op{'s' if len(self.ops) != 1 else ''}: {ops_text(self.ops, 100)}"


TIMES = "\u00d7"


def _counted(ops: list[str]) -> list[tuple[str, int]]:
    counts: dict[str, int] = {}
    for op in ops:
        counts[op] = counts.get(op, 0) + 1
    return list(counts.items())


def op_groups(ops: list[str]) -> list[str]:
    """``['transpose x3', 'mul x2', 'add']`` (with a multiplication sign, no space): each op name once, with
    its count when above one, in order of first use."""
    return [f"{op}{TIMES}{n}" if n > 1 else op for op, n in _counted(ops)]


def ops_text(ops: list[str], limit: int | None = 48) -> str:
    """The ops as counted groups (``transpose x3, mul x2, add``, see :func:`op_groups`), whole groups only:
    where they do not fit in ``limit`` characters, the last groups are left out and counted
    (``transpose x3, … +5 ops``), never cut inside a name. ``limit=None``: all of them."""
    groups, sizes = op_groups(ops), [n for _, n in _counted(ops)]
    text = ", ".join(groups)
    if limit is None or len(text) <= limit:
        return text

    def cut(shown: int) -> str:
        left = sum(sizes[shown:])
        return f"{', '.join(groups[:shown])}, … +{left} op{'s' if left > 1 else ''}"

    shown = len(groups) - 1
    while shown > 1 and len(cut(shown)) > limit:
        shown -= 1
    return cut(shown)


def compilations_note(decisions: list[Decision], reasons: list[str] | None = None) -> str | None:
    """A line for a program (a function, a ThunderFX subgraph) that Thunder compiled more than once: how
    many times, under which indices, what differed each time (``reasons``, as in
    :attr:`Subgraph.recompiles`), and whether the compilations decided alike. None for one compilation.

    Thunder compiles a program again for inputs that fail the checks of its earlier compilations (another
    shape, dtype or requires_grad, other inputs sharing memory, grad mode): the report then lists the
    decisions of each compilation, under ``function#index``.
    """
    reasons = list(reasons or [])
    indices = sorted({d.compile_index for d in decisions})
    count = max(len(indices), len(reasons) + 1)
    if count < 2:
        return None
    function = next((d.function for d in decisions if d.function), None)
    which, labels = "", [f"compilation {k}" for k in range(2, count + 1)]
    if function and len(indices) == count:
        which = f" ({function}#{indices[0]}, {', '.join(f'#{i}' for i in indices[1:])})"
        labels = [f"#{i}" for i in indices[1:]]
    why = "; ".join(f"{label} {reason}" for label, reason in zip(labels, reasons, strict=False) if reason) or (
        "what its inputs failed is not known (another shape, dtype or requires_grad, other inputs sharing "
        "memory, grad mode)"
    )
    text = f"compiled {count} times{which}, each time for inputs the compilation before did not accept: {why}"
    if len(indices) < 2:
        return f"{text}; shown: the latest compilation"
    decided = {frozenset(_decided(d) for d in decisions if d.compile_index == i) for i in indices}
    alike = "each compilation made the same decisions" if len(decided) == 1 else "the compilations decided differently"
    return f"{text}; {alike}, listed for each"


def compilation_notes(
    sub: Subgraph | None, decisions: list[Decision], recompiles: dict[str, list[str]] | None = None
) -> list[str]:
    """A line per program of ``decisions`` (the subgraph ``sub``, else each function) that Thunder compiled
    more than once (:func:`compilations_note`)."""
    if sub is not None:
        note = compilations_note(decisions, sub.recompiles)
        return [note] if note else []
    notes = []
    for function in dict.fromkeys(d.function for d in decisions):
        mine = [d for d in decisions if d.function == function]
        note = compilations_note(mine, (recompiles or {}).get(function or ""))
        if note:
            notes.append(f"{function}: {note}" if function else note)
    return notes


def _decided(d: Decision) -> tuple[Any, ...]:
    return (d.trace, d.region, tuple(d.ops), d.action, d.reason, d.applied)


def estimate_text(d: Decision) -> str:
    """'12.0 / 3.5': the model's µs for the region as a fusion call and run eagerly, and what was measured."""
    region, eager = d.estimates.get("est_region_us"), d.estimates.get("est_eager_us")
    if region is None or eager is None:
        return ""
    text = f"{region:.1f} / {eager:.1f}"
    if d.details.get("decided_by") == "measured":
        text += f" (measured {d.details['measured_region_us']:.1f} / {d.details['measured_eager_us']:.1f})"
    return text


def kernels_text(details: dict[str, Any]) -> str:
    """'2 segmented: reduction+pointwise' from a region's kernel details; '' when none were recorded."""
    count = details.get("kernels")
    if count is None:
        return ""
    schedulers = "+".join(details.get("schedulers") or [])
    flag = " segmented" if details.get("segmented") else ""
    return f"{count}{flag}: {schedulers}" if schedulers else f"{count}{flag}"


def action_text(d: Decision) -> str:
    """The action, marked ``(not applied)`` where the guard only recorded it."""
    return d.action if d.applied else f"{d.action} (not applied)"


def reason_text(d: Decision) -> str:
    """The reason, with the error in brackets where something failed."""
    return d.reason if d.error is None else f"{d.reason} [{d.error}]"


def percent_text(fraction: float | None, missing: str = "") -> str:
    """'42%' of a fraction; ``missing`` when there is none."""
    return missing if fraction is None else f"{100 * fraction:.0f}%"


def text_table(rows: list[list[str]]) -> list[str]:
    """Rows of cells as fixed-width lines, columns two spaces apart."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
