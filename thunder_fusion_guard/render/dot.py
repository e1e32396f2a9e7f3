"""Dataflow graphs as Graphviz DOT text."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from ..decisions import Subgraph
from .text import edge_label, edge_tooltip, graph_title, node_lines, node_style, node_tooltip, totals_text


def _dot_str(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def pairs_dot(
    pairs: Sequence[Any], title: str = "FusionGuard dataflow", subgraphs: dict[str, Subgraph] | None = None
) -> str:
    """One digraph, a cluster per trace and stage (``before`` only where the guard changed the trace)."""
    out = [
        "digraph fusion_guard {",
        f"  graph [label={_dot_str(title)}, labelloc=t, fontname=Helvetica, rankdir=TB, compound=true];",
        '  node [shape=box, style="rounded,filled", fontname=Helvetica, fontsize=10];',
        '  edge [fontname=Helvetica, fontsize=9, color="#78909c"];',
    ]
    for c, pair in enumerate(pairs):
        stages = [pair.before, pair.after] if pair.changed else [pair.after]
        for graph in stages:
            key = f"c{c}_{graph.stage}"
            out.append(f"  subgraph cluster_{key} {{")
            label = f"{graph_title(pair, subgraphs)} · {graph.stage if pair.changed else 'unchanged by the guard'}"
            out.append(f"    label={_dot_str(label + chr(10) + totals_text(graph))};")
            for node in graph.nodes:
                fill, stroke = node_style(node)
                style = '"rounded,filled,dashed"' if node.kind == "view" else '"rounded,filled"'
                text = "\n".join(node_lines(node))
                out.append(
                    f"    {_dot_str(f'{key}/{node.id}')} [label={_dot_str(text)}, fillcolor={_dot_str(fill)}, "
                    f"color={_dot_str(stroke)}, style={style}, tooltip={_dot_str(node_tooltip(node))}];"
                )
            biggest = max((e.nbytes for e in graph.edges), default=1) or 1
            for e in graph.edges:
                width = 1.0 + 4.0 * math.log2(1 + e.nbytes) / math.log2(1 + biggest)
                out.append(
                    f"    {_dot_str(f'{key}/{e.src}')} -> {_dot_str(f'{key}/{e.dst}')} "
                    f"[label={_dot_str(edge_label(e))}, penwidth={width:.1f}, tooltip={_dot_str(edge_tooltip(e))}];"
                )
            out.append("  }")
    out.append("}")
    return "\n".join(out) + "\n"
