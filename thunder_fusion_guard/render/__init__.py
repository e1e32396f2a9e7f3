"""Text and pictures without dependencies: the one text-table module (:mod:`.table`: fixed-width and Markdown
tables, the decision text, decisions grouped by ThunderFX subgraph), dataflow graphs as SVG (:mod:`.svg`, own
layered layout) and Graphviz DOT (:mod:`.dot`), and the self-contained HTML report (:mod:`.html`).

A leaf: it reads decisions, profile rows and dataflow graphs by attribute only, and imports nothing of the
package but :mod:`..decisions` (the records) and :mod:`..wording` (text cut or wrapped to a width).
"""

from __future__ import annotations

from .dot import pairs_dot
from .html import html_page
from .svg import graph_svg, layout
from .text import (
    ACTION_STYLE,
    HOST_LEGEND_CPU,
    HOST_LEGEND_CUDA,
    display_name,
    human_bytes,
    node_lines,
    ops_summary,
    totals_text,
)

__all__ = [
    "ACTION_STYLE",
    "HOST_LEGEND_CPU",
    "HOST_LEGEND_CUDA",
    "display_name",
    "graph_svg",
    "html_page",
    "human_bytes",
    "layout",
    "node_lines",
    "ops_summary",
    "pairs_dot",
    "totals_text",
]
