"""The why-not-fused report as text and HTML: its summary line, its table through the one text-table module, and
its HTML section. Reads rows by attribute (``trace``, ``subgraph``, ``op``, ``kind`` with its ``label``,
``labels``, ``of_ops`` and ``rank``, ``count``, ``repeats``, ``bytes``, ``reason``, ``detail``,
``established_by``, ``try_``, ``source``, ``executor``); imports nothing of the package above ``render``."""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Any

from ..wording import WIDTH
from .table import TIMES, plural, text_table, wrapped
from .text import human_bytes

HEADER = ("trace", "subgraph", "op", "kind", "bytes", "reason", "try", "source")


def op_text(row: Any) -> str:
    """The row's op, with ``TIMES`` N (a multiplication sign) where it stands for N rows that said the same."""
    return f"{row.op} {TIMES}{row.repeats}" if row.repeats > 1 else row.op


def summary_text(rows: Sequence[Any]) -> str:
    """One line of counts: ops outside fusions by kind, then splits, rematerializations, segmented regions,
    rescues and what could not be analysed."""
    kinds = sorted({r.kind for r in rows}, key=lambda k: k.rank)
    outside = [r for r in rows if r.kind.of_ops]
    parts = []
    for kind in (k for k in kinds if k.of_ops):
        mine = [r for r in outside if r.kind == kind]
        n = sum(r.count for r in mine)
        if kind == "claimed":
            parts.append(f"{n} claimed by {'/'.join(sorted({r.executor or '?' for r in mine}))}")
        else:
            parts.append(f"{n} {kind.label if n == 1 else kind.labels}")
    text = f"{plural(sum(r.count for r in outside), 'op')} outside fusions" + (f": {', '.join(parts)}" if parts else "")
    for kind in (k for k in kinds if not k.of_ops):
        mine = [r for r in rows if r.kind == kind]
        if kind == "segmented":
            text += f"; {plural(len(mine), 'region')} run as {sum(r.count for r in mine)} segments"
        else:
            text += f"; {plural(sum(r.repeats for r in mine), kind.label, kind.labels)}"
    return text


def why_text(summary: str, ranked: Sequence[Any], wide: bool = False) -> str:
    """The summary, then the rows (ranked as given) under a header: lines of at most 120 characters, subgraph, op,
    reason and try wrapped at spaces, the last column under its row where it has too little room, never cut;
    ``wide``: one line per row, however long."""
    lines = [
        (r.trace, r.subgraph or "", op_text(r), str(r.kind), human_bytes(r.bytes), r.reason, r.try_, r.source or "")
        for r in ranked
    ]
    width = None if wide else WIDTH
    table = text_table([list(HEADER), *lines], last_free=True, width=width, wrap=(1, 2, 5, 6))
    return "\n".join([*wrapped(summary, width, "  "), *table])


def why_html(summary: str, ranked: Sequence[Any]) -> str:
    """An HTML ``<section class="why-not-fused">``: the summary and a table row per row, all text escaped."""
    e = html.escape
    cells = "".join(
        "<tr>"
        + "".join(
            f"<td>{e(str(v))}</td>"
            for v in (
                r.trace,
                r.subgraph or "",
                op_text(r),
                r.count,
                r.kind,
                human_bytes(r.bytes),
                r.reason + (f" ({r.detail})" if r.detail else ""),
                r.established_by,
                r.try_,
                r.source or "",
            )
        )
        + "</tr>"
        for r in ranked
    )
    head = "".join(
        f"<th>{h}</th>"
        for h in ("trace", "subgraph", "op", "count", "kind", "bytes", "reason", "established by", "try", "source")
    )
    return (
        f'<section class="why-not-fused"><h2>Why not fused</h2><p>{e(summary)}</p>'
        f"<table><thead><tr>{head}</tr></thead><tbody>{cells}</tbody></table></section>"
    )
