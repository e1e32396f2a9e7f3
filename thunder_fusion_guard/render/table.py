"""The one home of text tables and of the text every report writes decisions with: fixed-width and Markdown
table lines, counts in words, ops as counted groups, and the decisions grouped by ThunderFX subgraph
(:func:`sections`), so the text table, the Markdown and the HTML page cannot group them differently.

Reads decisions and subgraphs by attribute; imports nothing of the package but :mod:`..decisions`'s types and
:mod:`..wording` (which breaks the lines).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .. import wording
from ..wording import plural

if TYPE_CHECKING:
    from ..decisions import Decision, Details, Subgraph

TIMES = "\u00d7"
NOT_THUNDERFX = "not from ThunderFX"


def text_table(
    rows: Sequence[Sequence[str]],
    *,
    last_free: bool = False,
    rule: bool = False,
    width: int | None = None,
    wrap: Collection[int] = (),
) -> list[str]:
    """Rows of cells as fixed-width lines, columns two spaces apart, trailing blanks cut. ``last_free``: the
    last column (a long reason) is not padded nor counted in the widths; ``rule``: a line of dashes under
    the first row (the header). ``width``: every line fits in it, nothing cut (see :func:`table_blocks`)."""
    blocks, widths = _layout(rows, last_free, width, wrap)
    lines = [line for block in blocks for line in block]
    if rule:
        lines.insert(len(blocks[0]), "-" * min(160 if width is None else width, sum(widths) + 2 * len(widths) + 20))
    return lines


# A wrapped column is never narrowed below this; a free last column with less room than a third of the width
# goes on the lines below its row, indented by INDENT.
MIN_COLUMN = 8
INDENT = "    "
# A name longer than this (a file or function name, a long op) may be broken, at a joint, before a column of
# words is narrowed below it.
NAME_COLUMN = 20


def table_blocks(
    rows: Sequence[Sequence[str]], *, last_free: bool = False, width: int | None = None, wrap: Collection[int] = ()
) -> list[list[str]]:
    """The lines of each row of :func:`text_table` (its rule left out). With ``width``, cells are broken at
    spaces onto further lines of their row, never cut: the columns whose indices are in ``wrap`` are narrowed
    (the widest first, not below their longest word, or ``NAME_COLUMN`` where that is longer, while another may
    narrow; then down to ``MIN_COLUMN``, the columns with a word longer than ``NAME_COLUMN`` first: a word longer
    than its column goes on on the next line, broken at a joint, :func:`..wording.wrap`) until the row fits (a
    row too wide even then is left wider), and a free last column is wrapped where it starts or, with less than
    a third of ``width`` left there, on the lines below the row, indented. None: one line per row."""
    return _layout(rows, last_free, width, wrap)[0]


def _layout(
    rows: Sequence[Sequence[str]], last_free: bool, width: int | None, wrap: Collection[int]
) -> tuple[list[list[str]], list[int]]:
    """:func:`table_blocks`, and the widths of the padded columns."""
    cells = [[str(c) for c in r] for r in rows]
    count = len(cells[0])
    padded = count - 1 if last_free else count
    natural = [max(len(r[i]) for r in cells) for i in range(padded)]
    widths = list(natural)
    if width is not None:
        narrowable = {i % count for i in wrap} & set(range(padded))
        budget = width - 2 * max(0, padded - (0 if last_free else 1))
        # the widest first, not below a column's longest word (or NAME_COLUMN, where its longest word is longer)
        # while another may narrow; then, where the row is still too wide, below it: first the columns of names
        # longer than NAME_COLUMN, then any (a word too long for its column goes on on the next line: wording.wrap)
        longest = {i: max(len(w) for r in cells for w in [*r[i].split(), ""]) for i in narrowable}
        floor = {i: max(MIN_COLUMN, min(longest[i], NAME_COLUMN)) for i in narrowable}
        while sum(widths) > budget:
            candidates = [i for i in narrowable if widths[i] > floor[i]]
            candidates = candidates or [i for i in narrowable if longest[i] > NAME_COLUMN and widths[i] > MIN_COLUMN]
            candidates = candidates or [i for i in narrowable if widths[i] > MIN_COLUMN]
            if not candidates:
                break
            widths[max(candidates, key=lambda i: widths[i])] -= 1
    start = sum(widths) + 2 * padded
    room = None if width is None else width - start
    below = room is not None and last_free and room < width // 3 and any(len(r[-1]) > room for r in cells)
    blocks = []
    for r in cells:
        columns = [wording.lines_of(r[i], widths[i] if widths[i] < natural[i] else None) for i in range(padded)]
        free = r[padded:]
        if last_free and not below:
            columns.append(wording.lines_of(free[0], None if room is None else max(room, MIN_COLUMN)))
        height = max(len(c) for c in columns)
        lines = []
        for k in range(height):
            parts = [(c[k] if k < len(c) else "").ljust(widths[i]) for i, c in enumerate(columns[:padded])]
            parts += [c[k] if k < len(c) else "" for c in columns[padded:]]
            lines.append("  ".join(parts).rstrip())
        if below and free[0]:
            lines += [INDENT + line for line in wording.lines_of(free[0], width - len(INDENT))]
        blocks.append(lines)
    return blocks, widths


def wrapped(text: str, width: int | None, indent: str = "") -> list[str]:
    """A line of a table's text (a heading, a note) as lines of at most ``width`` characters (None: one line),
    every line after the first indented by ``indent`` more than the first."""
    lead = text[: len(text) - len(text.lstrip(" "))]
    return [lead + line for line in wording.lines_of(text, None if width is None else width - len(lead), indent)]


def md_cell(text: Any) -> str:
    """``text`` fit for a Markdown table cell or line: pipes escaped, line breaks as spaces."""
    return str(text).replace("|", "\\|").replace("\n", " ")


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """A Markdown table's lines, every cell escaped (:func:`md_cell`)."""
    lines = ["| " + " | ".join(md_cell(h) for h in header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    return lines + ["| " + " | ".join(md_cell(c) for c in row) + " |" for row in rows]


def spread_text(median: float, q1: float, q3: float, digits: int = 1) -> str:
    """'12.3 (11.9-13.0)': a median and, in brackets, its first and third quartiles."""
    return f"{median:.{digits}f} ({q1:.{digits}f}-{q3:.{digits}f})"


def percent_text(fraction: float | None, missing: str = "") -> str:
    """'42%' of a fraction; ``missing`` when there is none."""
    return missing if fraction is None else f"{100 * fraction:.0f}%"


def _counted(ops: Sequence[str]) -> list[tuple[str, int]]:
    counts: dict[str, int] = {}
    for op in ops:
        counts[op] = counts.get(op, 0) + 1
    return list(counts.items())


def op_groups(ops: Sequence[str]) -> list[str]:
    """``['transpose x3', 'mul x2', 'add']`` (with a multiplication sign, no space): each op name once, with
    its count when above one, in order of first use."""
    return [f"{op}{TIMES}{n}" if n > 1 else op for op, n in _counted(ops)]


def ops_text(ops: Sequence[str], limit: int | None = 48) -> str:
    """The ops as counted groups (``transpose x3, mul x2, add``, see :func:`op_groups`), whole groups only:
    where they do not fit in ``limit`` characters, the last groups are left out and counted
    (``transpose x3, … +5 ops``), never cut inside a name. ``limit=None``: all of them."""
    groups, sizes = op_groups(ops), [n for _, n in _counted(ops)]
    text = ", ".join(groups)
    if limit is None or len(text) <= limit:
        return text

    def cut(shown: int) -> str:
        return f"{', '.join(groups[:shown])}, … +{plural(sum(sizes[shown:]), 'op')}"

    shown = len(groups) - 1
    while shown > 1 and len(cut(shown)) > limit:
        shown -= 1
    return cut(shown)


def subgraph_label(sub: Subgraph) -> str:
    """'subgraph0 (dynamo graph 0, thunder_0)': a subgraph's id and, once known, Thunder's name for it."""
    return sub.id if sub.name is None else f"{sub.id} ({sub.name})"


def subgraph_heading(sub: Subgraph) -> str:
    """A subgraph's heading line in the text table: its label, how many fx ops and which."""
    return f"{subgraph_label(sub)}, {plural(len(sub.ops), 'op')}: {ops_text(sub.ops, 100)}"


def estimate_text(d: Decision) -> str:
    """'12.0 / 3.5': the model's µs for the region as a fusion call and run eagerly, and what was measured."""
    region, eager = d.estimates.get("est_region_us"), d.estimates.get("est_eager_us")
    if region is None or eager is None:
        return ""
    text = f"{region:.1f} / {eager:.1f}"
    if d.details.get("decided_by") == "measured":
        text += f" (measured {d.details['measured_region_us']:.1f} / {d.details['measured_eager_us']:.1f})"
    return text


def kernels_text(details: Details | Mapping[str, Any]) -> str:
    """'2 segmented: reduction+pointwise' from a region's kernel details; '' when none were recorded."""
    count = details.get("kernels")
    if count is None:
        return ""
    schedulers = "+".join(details.get("schedulers") or [])
    flag = " segmented" if details.get("segmented") else ""
    return f"{count}{flag}: {schedulers}" if schedulers else f"{count}{flag}"


def region_text(d: Decision) -> str:
    """The region column of a decision: where the user wrote it and, in brackets, the name traces give it
    (``model.py:12 (nvFusion0)``); that name alone where no source line is known."""
    return d.region if d.at == d.region else f"{d.at} ({d.region})"


def action_text(d: Decision) -> str:
    """The action, marked ``(not applied)`` where the guard only recorded it."""
    return d.action if d.applied else f"{d.action} (not applied)"


def reason_text(d: Decision) -> str:
    """The short reason, with the error's first line in brackets where something failed (a rescue's reason is
    that line already)."""
    if d.error is None or d.action == "rescue":
        return d.reason
    lines = d.error.strip().splitlines()
    return f"{d.reason} [{lines[0] if lines else d.error}]"


def explanation_text(d: Decision) -> str:
    """The long explanation of a decision (``details["explanation"]``), '' where it has none."""
    return str(d.details.get("explanation") or "")


def compilations_note(decisions: Sequence[Decision], reasons: Sequence[str] | None = None) -> str | None:
    """A line for a program (a function, a ThunderFX subgraph) that Thunder compiled more than once: how
    many times, under which indices, what differed each time (``reasons``, as in
    :attr:`Subgraph.recompiles`), and whether the compilations decided alike. None for one compilation.

    Thunder compiles a program again for inputs that fail the checks of its earlier compilations (another
    shape, dtype or requires_grad, other inputs sharing memory, grad mode): the report then lists the
    decisions of each compilation, under ``function#index``. A compilation whose checks are those of the one
    before (its reason '') was not for other inputs: threads calling the program at once each missed the cache
    while another compiled it.
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
    text = f"compiled {count} times{which}" + _recompiled_why(labels, reasons)
    if len(indices) < 2:
        return f"{text}; shown: the latest compilation"
    # An entry decision is about the subgraph's calls, not what a compilation decided.
    decided = {
        frozenset(_decided(d) for d in decisions if d.compile_index == i and d.action != "enter") for i in indices
    }
    alike = "each compilation made the same decisions" if len(decided) == 1 else "the compilations decided differently"
    return f"{text}; {alike}, listed for each"


def _recompiled_why(labels: Sequence[str], reasons: Sequence[str]) -> str:
    """After 'compiled N times': why each compilation after the first happened: for inputs the one before did not
    accept (what differed), or, for one with the same checks (reason ''), by threads compiling the program at once;
    unknown without reasons."""
    if not reasons:
        return (
            ", each time for inputs the compilation before did not accept: what its inputs failed is not known "
            "(another shape, dtype or requires_grad, other inputs sharing memory, grad mode)"
        )
    pairs = list(zip(labels, reasons, strict=False))
    changed = "; ".join(f"{label} {reason}" for label, reason in pairs if reason)
    same = [label for label, reason in pairs if not reason]
    at_once = (
        f"by {len(same) + 1} threads at once, for the same inputs (each call missed the cache while another "
        "compilation was still running)"
    )
    if not changed:
        return f" {at_once}"
    if not same:
        return f", each time for inputs the compilation before did not accept: {changed}"
    return f", for inputs the compilation before did not accept: {changed}; {', '.join(same)} {at_once}"


def compilation_notes(
    sub: Subgraph | None, decisions: Sequence[Decision], recompiles: Mapping[str, Sequence[str]] | None = None
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


@dataclass
class Section:
    """One group of a report's decisions: a ThunderFX subgraph's (``subgraph``), or, under ``title`` 'not from
    ThunderFX', those of no subgraph; a report without subgraphs is one section with ``title`` None. ``notes``
    say where Thunder compiled the program more than once."""

    title: str | None
    subgraph: Subgraph | None
    decisions: list[Decision]
    notes: list[str] = field(default_factory=list)
    shown_split: list[str] | None = None  # the split reasons no section before this one shows
    split_as: str | None = None  # the title of the section before that shows this one's other split reasons

    @property
    def split_reasons(self) -> list[str]:
        """The subgraph's split reasons that no earlier section shows (each reason once per report)."""
        if self.shown_split is not None:
            return list(self.shown_split)
        return list(self.subgraph.split_reasons) if self.subgraph is not None else []

    @property
    def split_lines(self) -> list[str]:
        """What a report writes of this section's split reasons: each reason not shown before, and for those
        already shown one line naming the section that shows them."""
        lines = [f"split: {reason}" for reason in self.split_reasons]
        return lines + ([f"split: as {self.split_as}"] if self.split_as else [])


def sections(
    decisions: Sequence[Decision],
    subgraphs: Mapping[str, Subgraph] | None = None,
    recompiles: Mapping[str, Sequence[str]] | None = None,
) -> list[Section]:
    """The decisions grouped as every report shows them: by ThunderFX subgraph in the order the subgraphs were
    compiled (a subgraph without decisions included), those of no known subgraph last; with no subgraphs,
    one untitled section of them all."""
    if not subgraphs:
        return [Section(None, None, list(decisions), compilation_notes(None, decisions, recompiles))]
    groups = []
    shown: dict[str, str] = {}  # each split reason, and the title of the section that shows it
    for key, sub in subgraphs.items():
        mine = [d for d in decisions if d.subgraph == key]
        title = subgraph_label(sub)
        fresh = [r for r in dict.fromkeys(sub.split_reasons) if r not in shown]
        earlier = next((shown[r] for r in sub.split_reasons if r in shown), None)
        shown.update(dict.fromkeys(fresh, title))
        groups.append(Section(title, sub, mine, compilation_notes(sub, mine), fresh, earlier))
    rest = [d for d in decisions if d.subgraph not in subgraphs]
    if rest:
        groups.append(Section(NOT_THUNDERFX, None, rest, compilation_notes(None, rest, recompiles)))
    return groups
