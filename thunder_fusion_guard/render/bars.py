"""Grouped horizontal bars as SVG: one group per row (a step, the host, a pass and kind of work), one bar per
variant, so where one compiler spends more than another shows at a glance (``fusion-guard bench versus``)."""

from __future__ import annotations

from collections.abc import Sequence
from html import escape

from .text import FONT

PALETTE = ("#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#b07aa1", "#76b7b2")
LABEL_W, BAR_W, VALUE_W = 230, 440, 90
BAR_H, GAP = 11, 9


def grouped_bars_svg(variants: Sequence[str], rows: Sequence[tuple[str, Sequence[float]]], unit: str = "µs") -> str:
    """An SVG of ``rows`` (label, one value per variant); bars share one scale, each labelled with its value."""
    width = LABEL_W + BAR_W + VALUE_W
    top = 28
    group_h = len(variants) * BAR_H + GAP
    height = top + len(rows) * group_h + 8
    peak = max((v for _, values in rows for v in values), default=0.0) or 1.0
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="{FONT}" '
        f'font-size="11" role="img">'
    ]
    x = LABEL_W
    for i, name in enumerate(variants):
        colour = PALETTE[i % len(PALETTE)]
        parts.append(f'<rect x="{x}" y="8" width="10" height="10" fill="{colour}"/>')
        parts.append(f'<text x="{x + 14}" y="17">{escape(name)}</text>')
        x += 24 + 7 * len(name)
    for r, (label, values) in enumerate(rows):
        y = top + r * group_h
        parts.append(f'<text x="{LABEL_W - 6}" y="{y + group_h / 2}" text-anchor="end">{escape(label)}</text>')
        for i, value in enumerate(values):
            w = max(0.0, value) / peak * BAR_W
            by = y + i * BAR_H
            colour = PALETTE[i % len(PALETTE)]
            parts.append(
                f'<rect x="{LABEL_W}" y="{by}" width="{w:.1f}" height="{BAR_H - 1}" fill="{colour}">'
                f"<title>{escape(variants[i])}: {escape(label)} {value:.1f} {unit}</title></rect>"
            )
            parts.append(f'<text x="{LABEL_W + w + 4:.1f}" y="{by + BAR_H - 2}">{value:.0f}</text>')
    parts.append("</svg>")
    return "".join(parts)
