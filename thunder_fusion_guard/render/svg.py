"""Dataflow graphs as SVG, with a layered layout computed here (no dependency)."""

from __future__ import annotations

import itertools
import math
from collections import Counter, defaultdict
from typing import Any

from .text import (
    FONT,
    attr,
    edge_label,
    edge_tooltip,
    node_lines,
    node_style,
    node_tooltip,
)

CHAR_W = 7.0  # px per character at 12 px in a wide sans font: widths are estimated, not measured
LINE_H = 15
REGION_W = 340
ROW_GAP = 64
COL_GAP = 28
MAX_ROW_W = 1100
EDGE_W = 58
STUB_SPAN = 2


class _Box:
    __slots__ = ("h", "lines", "node", "w", "x", "y")

    def __init__(self, node: Any, lines: list[str], w: float, h: float) -> None:
        self.node, self.lines, self.w, self.h = node, lines, w, h
        self.x = self.y = 0.0


def _box(node: Any, edges: int) -> _Box:
    """A node's box, wide enough for its text and for one edge label (``EDGE_W``) per edge on its busier side."""
    lines = node_lines(node)
    room = EDGE_W * (edges + 1)
    if node.kind == "region":
        return _Box(node, lines, max(REGION_W, min(room, 2 * REGION_W)), 12 + LINE_H * len(lines))
    if node.kind in ("inputs", "outputs"):
        return _Box(node, lines, max(110.0, CHAR_W * len(node.name) + 28, room), 30)
    return _Box(node, lines, max(70.0, CHAR_W * 0.92 * len(lines[0]) + 22, room), 26 if node.kind == "view" else 28)


def _layers(graph: Any) -> dict[str, int]:
    """Longest path from the inputs; nodes without inputs sit just above their first reader."""
    preds: dict[str, list[str]] = defaultdict(list)
    succs: dict[str, list[str]] = defaultdict(list)
    for e in graph.edges:
        preds[e.dst].append(e.src)
        succs[e.src].append(e.dst)
    layer: dict[str, int] = {}
    for node in graph.nodes:  # trace order: producers come first
        if node.kind == "inputs":
            layer[node.id] = 0
        elif node.kind != "outputs":
            layer[node.id] = 1 + max((layer[p] for p in preds[node.id] if p in layer), default=0)
    for node in reversed(graph.nodes):
        if node.kind not in ("inputs", "outputs") and not preds[node.id]:
            below = [layer[s] for s in succs[node.id] if s in layer]
            if below:
                layer[node.id] = max(1, min(below) - 1)
    layer["outputs"] = 1 + max(layer.values(), default=0)
    return layer


def stubs(graph: Any, layer: dict[str, int]) -> set[tuple[str, str]]:
    """Edges from the function's inputs or to its outputs that span more than ``STUB_SPAN`` layers: drawn as
    short stubs at the node (``in 16 KiB``) rather than as lines across the whole picture."""
    return {
        (e.src, e.dst)
        for e in graph.edges
        if (e.src == "inputs" or e.dst == "outputs") and layer[e.dst] - layer[e.src] > STUB_SPAN
    }


def layout(graph: Any) -> tuple[dict[str, _Box], float, float, set[tuple[str, str]]]:
    """Boxes placed row by row, top to bottom in data order: each layer sorted by where its inputs come
    from (barycentre), centred, and wrapped into more rows where it is wider than ``MAX_ROW_W``; and the
    edges drawn as stubs."""
    layer = _layers(graph)
    stubbed = stubs(graph, layer)
    drawn = [e for e in graph.edges if (e.src, e.dst) not in stubbed]
    ins, outs = Counter(e.dst for e in graph.edges), Counter(e.src for e in graph.edges)
    outs["inputs"] = sum(e.src == "inputs" for e in drawn)
    ins["outputs"] = sum(e.dst == "outputs" for e in drawn)
    boxes = {n.id: _box(n, max(ins[n.id], outs[n.id])) for n in graph.nodes}
    order = {n.id: i for i, n in enumerate(graph.nodes)}
    preds: dict[str, list[str]] = defaultdict(list)
    for e in drawn:
        preds[e.dst].append(e.src)
    placed: set[str] = set()
    rows: list[list[_Box]] = []

    def barycentre(b: _Box) -> float:
        xs = [boxes[p].x + boxes[p].w / 2 for p in preds[b.node.id] if p in placed]
        return sum(xs) / len(xs) if xs else 0.0

    for level in sorted(set(layer.values())):
        members = sorted((boxes[n] for n, lv in layer.items() if lv == level), key=lambda b: order[b.node.id])
        members.sort(key=barycentre)
        row: list[_Box] = []
        level_rows = []
        for b in members:
            if row and sum(x.w + COL_GAP for x in row) + b.w > MAX_ROW_W:
                level_rows.append(row)
                row = []
            row.append(b)
        level_rows.append(row)
        for r in level_rows:
            x = -(sum(b.w for b in r) + COL_GAP * (len(r) - 1)) / 2
            for b in r:
                b.x, x = x, x + b.w + COL_GAP
                placed.add(b.node.id)
        rows += level_rows
    left = min((b.x for b in boxes.values()), default=0.0)
    width = max((b.x + b.w for b in boxes.values()), default=0.0) - left + 2 * COL_GAP
    y = 20.0
    for r in rows:
        height = max(b.h for b in r)
        for b in r:
            b.x, b.y = b.x - left + COL_GAP, y + (height - b.h) / 2
        y += height + ROW_GAP
    return boxes, width, y - ROW_GAP + 20, stubbed


_ids = itertools.count()


def graph_svg(graph: Any, peak_gbps: float | None = None) -> str:
    """The graph as one inline SVG element (class ``dataflow``; a ``g.node`` per node, a ``g.edge`` per edge)."""
    boxes, width, height, stubbed = layout(graph)
    uid = next(_ids)
    marker = f"arrow{uid}"
    biggest = max((e.nbytes for e in graph.edges), default=1) or 1
    ins: dict[str, list[Any]] = defaultdict(list)
    outs: dict[str, list[Any]] = defaultdict(list)
    for e in graph.edges:
        stub = (e.src, e.dst) in stubbed
        if not (stub and e.dst == "outputs"):
            ins[e.dst].append(e)
        if not (stub and e.src == "inputs"):
            outs[e.src].append(e)
    for es in ins.values():
        es.sort(key=lambda e: boxes[e.src].x)
    for es in outs.values():
        es.sort(key=lambda e: boxes[e.dst].x)

    def port(box: _Box, index: int, count: int) -> float:
        return box.x + box.w * (index + 1) / (count + 1)

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="dataflow" width="{width:.0f}" height="{height:.0f}" '
        f'viewBox="0 0 {width:.0f} {height:.0f}" data-trace="{attr(graph.trace)}" data-stage="{attr(graph.stage)}" '
        f'font-family="{FONT}" font-size="12">',
        f'<defs><marker id="{marker}" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="9" markerHeight="9" '
        'markerUnits="userSpaceOnUse" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="#78909c"/>'
        "</marker></defs>",
        '<g class="edges">',
    ]
    labels = []

    def label(x: float, y: float, text: str) -> str:
        return (
            f'<text class="edge-label" x="{x:.1f}" y="{y:.1f}" text-anchor="middle" font-size="10.5" '
            f'fill="#37474f" stroke="#ffffff" stroke-width="3" paint-order="stroke">{attr(text)}</text>'
        )

    for e in graph.edges:
        src, dst = boxes[e.src], boxes[e.dst]
        stroke = 1.0 + 5.0 * math.log2(1 + e.nbytes) / math.log2(1 + biggest)
        kernel_edge = src.node.is_kernel or dst.node.is_kernel
        colour = "#78909c" if kernel_edge else "#b0bec5"
        attrs = f'fill="none" stroke="{colour}" stroke-width="{stroke:.1f}" marker-end="url(#{marker})"'
        head = (
            f'<g class="edge" data-src="{attr(e.src)}" data-dst="{attr(e.dst)}" data-bytes="{e.nbytes}">'
            f"<title>{attr(edge_tooltip(e))}</title>"
        )
        if (e.src, e.dst) in stubbed and e.src == "inputs":
            x2, y2 = port(dst, ins[e.dst].index(e), len(ins[e.dst])), dst.y - 2
            stub = f"M{x2:.1f},{y2 - 14:.1f} L{x2:.1f},{y2:.1f}"
            parts.append(f'{head}<path d="{stub}" {attrs} stroke-dasharray="3 2"/></g>')
            labels.append(label(x2, y2 - 18, f"in {edge_label(e)}"))
            continue
        if (e.src, e.dst) in stubbed:
            x1, y1 = port(src, outs[e.src].index(e), len(outs[e.src])), src.y + src.h
            stub = f"M{x1:.1f},{y1:.1f} L{x1:.1f},{y1 + 14:.1f}"
            parts.append(f'{head}<path d="{stub}" {attrs} stroke-dasharray="3 2"/></g>')
            labels.append(label(x1, y1 + 25, f"out {edge_label(e)}"))
            continue
        x1 = port(src, outs[e.src].index(e), len(outs[e.src]))
        i, k = ins[e.dst].index(e), len(ins[e.dst])
        x2 = port(dst, i, k)
        y1, y2 = src.y + src.h, dst.y - 2
        bend = max(28.0, (y2 - y1) / 2)
        path = f"M{x1:.1f},{y1:.1f} C{x1:.1f},{y1 + bend:.1f} {x2:.1f},{y2 - bend:.1f} {x2:.1f},{y2:.1f}"
        parts.append(f'{head}<path d="{path}" {attrs} stroke-opacity="0.85"/></g>')
        stagger = 13 * (i % 2) if dst.w / (k + 1) < EDGE_W else 0
        labels.append(label(x2, y2 - 9 - stagger, edge_label(e)))
    parts.append("</g>")
    parts.append('<g class="nodes">')
    for b in boxes.values():
        node = b.node
        fill, stroke = node_style(node)
        dash = ' stroke-dasharray="4 3"' if node.kind == "view" else ""
        radius = 8 if node.kind == "region" else 14 if node.kind in ("inputs", "outputs") else 4
        width_px = 2.0 if node.kind == "region" else 1.2
        classes = " ".join(x for x in ("node", node.kind, node.action) if x)
        parts.append(
            f'<g class="{attr(classes)}" data-node="{attr(node.id)}"><title>{attr(node_tooltip(node))}</title>'
            f'<rect x="{b.x:.1f}" y="{b.y:.1f}" width="{b.w:.1f}" height="{b.h:.1f}" rx="{radius}" '
            f'fill="{fill}" stroke="{stroke}" stroke-width="{width_px}"{dash}/>'
        )
        if node.kind == "region":
            for j, line in enumerate(b.lines):
                weight = ' font-weight="bold"' if j == 0 else ""
                y = b.y + 18 + j * LINE_H
                parts.append(f'<text x="{b.x + 9:.1f}" y="{y:.1f}"{weight} fill="#212121">{attr(line)}</text>')
        else:
            size = "11" if node.kind == "view" else "12"
            parts.append(
                f'<text x="{b.x + b.w / 2:.1f}" y="{b.y + b.h / 2 + 4:.1f}" text-anchor="middle" font-size="{size}" '
                f'fill="#212121">{attr(b.lines[0])}</text>'
            )
        parts.append("</g>")
    parts.append("</g>")
    parts.append(f'<g class="edge-labels">{"".join(labels)}</g>')
    parts.append("</svg>")
    return "\n".join(parts)
