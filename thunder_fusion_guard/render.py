"""Pictures without dependencies: dataflow graphs as SVG (a layered layout, computed here) and Graphviz DOT,
and the self-contained HTML report (decisions, profile with sortable columns, pictures; no network needed).

Works on the plain objects of :mod:`.report` and :mod:`.measure` (decisions, profile rows, ``TraceGraph``
and ``GraphPair``), read by attribute only.
"""

from __future__ import annotations

import html
import itertools
import math
from collections import Counter, defaultdict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .report import ACTIONS, Decision, Subgraph, _estimate_text, kernels_text

if TYPE_CHECKING:
    from .measure.dataflow import GraphPair, Node, TraceGraph
    from .measure.profile import RegionProfile

# (fill, stroke) per guard action; regions without a decision, ops, views and the function's inputs/outputs.
ACTION_STYLE: dict[str | None, tuple[str, str]] = {
    "keep": ("#e3f4e1", "#2e7d32"),
    "reject": ("#fde2de", "#c62828"),
    "rehome": ("#dde9fb", "#1565c0"),
    "fold": ("#efe2f8", "#6a1b9a"),
    "remove": ("#fff2cc", "#b26a00"),
    None: ("#eceff1", "#455a64"),
}
KIND_STYLE: dict[str, tuple[str, str]] = {
    "op": ("#ffffff", "#616161"),
    "view": ("#fafafa", "#9e9e9e"),
    "inputs": ("#fff8e1", "#8d6e63"),
    "outputs": ("#fff8e1", "#8d6e63"),
}
FONT = "DejaVu Sans, Verdana, Helvetica, Arial, sans-serif"
CHAR_W = 7.0  # px per character at 12 px in a wide sans font: widths are estimated, not measured
LINE_H = 15
REGION_W = 340
ROW_GAP = 64
COL_GAP = 28
MAX_ROW_W = 1100
TIMES, MINUS = "\u00d7", "\u2212"
EDGE_W = 58
STUB_SPAN = 2


def human_bytes(n: int | None) -> str:
    if n is None:
        return "?"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"


def ops_summary(ops: Sequence[str]) -> str:
    """``mul x4, add x2, tanh`` (with a multiplication sign): each op once, with its count, in order of first use."""
    counts = Counter(ops)
    return ", ".join(f"{op}{TIMES}{counts[op]}" if counts[op] > 1 else op for op in dict.fromkeys(ops))


def display_name(op: str) -> str:
    """An op's name without the torch executor's wrapping: ``torch_prims_reshape_impl`` is ``reshape``."""
    for prefix in ("torch_prims_", "torch_"):
        if op.startswith(prefix) and op.endswith("_impl"):
            return op[len(prefix) : -len("_impl")]
    return op


def _fit(text: str, chars: int) -> str:
    return text if len(text) <= chars else text[: max(1, chars - 1)] + "…"


def _wrap(text: str, chars: int, lines: int) -> list[str]:
    """``text`` in at most ``lines`` lines of ``chars``, broken after commas, the last cut with an ellipsis."""
    out, current = [], ""
    for word in text.split(" "):
        candidate = f"{current} {word}".strip()
        if len(candidate) <= chars or not current:
            current = candidate
            continue
        out.append(current)
        current = word
    out.append(current)
    if len(out) > lines:
        out = [*out[: lines - 1], _fit(" ".join(out[lines - 1 :]), chars)]
    return [_fit(line, chars) for line in out]


def _percent(fraction: float | None) -> str:
    return "" if fraction is None else f"{100 * fraction:.0f}%"


def node_lines(node: Node, chars: int = 46) -> list[str]:
    """The text of a node, line by line: title, ops, measurements, notes."""
    if node.kind in ("inputs", "outputs"):
        return [node.name]
    if node.kind in ("op", "view"):
        suffix = " (view)" if node.kind == "view" else ""
        action = f" · {node.action}" if node.action else ""
        return [_fit(f"{display_name(node.name)}{suffix}{action}", chars)]
    title = " · ".join(x for x in (node.name, node.executor, node.action) if x)
    n = len(node.ops)
    lines = [_fit(title, chars), *_wrap(f"{n} op{'s' if n != 1 else ''}: {ops_summary(node.ops)}", chars, 2)]
    if node.device_us is not None:
        lines.append(f"device {node.device_us:.1f} µs · host {node.host_us or 0:.1f} µs")
    elif node.host_us is not None:
        eager = "" if node.eager_us is None else f" · eager {node.eager_us:.1f} µs"
        lines.append(f"fusion call {node.host_us:.1f} µs{eager}")
    if node.kernels is not None:
        schedulers = "+".join(node.schedulers)
        count = _count(node.kernels, "kernel")
        lines.append(_fit(f"{count}: {schedulers}" if schedulers else count, chars))
    if node.gbps is not None:
        peak = _percent(node.peak_fraction)
        lines.append(f"{node.gbps:.0f} GB/s" + (f" · {peak} of peak" if peak else ""))
    if node.notes:
        lines += _wrap("guard: " + "; ".join(node.notes), chars, 2)
    return lines


def _node_tooltip(node: Node) -> str:
    parts = [f"{node.name} ({node.kind}{', ' + node.executor if node.executor else ''})"]
    if node.ops and node.kind == "region":
        parts.append("ops: " + ", ".join(node.ops))
    if node.action:
        parts.append(f"{node.action}: {node.reason or ''}")
    parts += [f"guard: {n}" for n in node.notes]
    if node.outputs:
        parts.append("writes: " + ", ".join(node.outputs))
    return "\n".join(parts)


def _style(node: Node) -> tuple[str, str]:
    if node.kind == "region":
        return ACTION_STYLE.get(node.action, ACTION_STYLE[None])
    if node.action in ("reject", "rehome", "fold", "remove"):
        return ACTION_STYLE[node.action]
    return KIND_STYLE[node.kind]


def _edge_tooltip(edge: Any) -> str:
    lines = [f"{edge.src} → {edge.dst}: {human_bytes(edge.nbytes)}"]
    lines += [f"{t.name}: {t.text} {human_bytes(t.nbytes)}" for t in edge.tensors[:40]]
    if len(edge.tensors) > 40:
        lines.append(f"… {len(edge.tensors) - 40} more")
    return "\n".join(lines)


def _edge_label(edge: Any) -> str:
    count = len(edge.tensors)
    return human_bytes(edge.nbytes) + (f" ({count})" if count > 1 else "")


# --- layout -------------------------------------------------------------------------------------------


class _Box:
    __slots__ = ("h", "lines", "node", "w", "x", "y")

    def __init__(self, node: Node, lines: list[str], w: float, h: float) -> None:
        self.node, self.lines, self.w, self.h = node, lines, w, h
        self.x = self.y = 0.0


def _box(node: Node, edges: int) -> _Box:
    """A node's box, wide enough for its text and for one edge label (``EDGE_W``) per edge on its busier side."""
    lines = node_lines(node)
    room = EDGE_W * (edges + 1)
    if node.kind == "region":
        return _Box(node, lines, max(REGION_W, min(room, 2 * REGION_W)), 12 + LINE_H * len(lines))
    if node.kind in ("inputs", "outputs"):
        return _Box(node, lines, max(110.0, CHAR_W * len(node.name) + 28, room), 30)
    return _Box(node, lines, max(70.0, CHAR_W * 0.92 * len(lines[0]) + 22, room), 26 if node.kind == "view" else 28)


def _layers(graph: TraceGraph) -> dict[str, int]:
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


def stubs(graph: TraceGraph, layer: dict[str, int]) -> set[tuple[str, str]]:
    """Edges from the function's inputs or to its outputs that span more than ``STUB_SPAN`` layers: drawn as
    short stubs at the node (``in 16 KiB``) rather than as lines across the whole picture."""
    return {
        (e.src, e.dst)
        for e in graph.edges
        if (e.src == "inputs" or e.dst == "outputs") and layer[e.dst] - layer[e.src] > STUB_SPAN
    }


def layout(graph: TraceGraph) -> tuple[dict[str, _Box], float, float, set[tuple[str, str]]]:
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


# --- SVG ----------------------------------------------------------------------------------------------

_ids = itertools.count()


def _a(value: Any) -> str:
    return html.escape(str(value), quote=True)


def graph_svg(graph: TraceGraph, peak_gbps: float | None = None) -> str:
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
        f'viewBox="0 0 {width:.0f} {height:.0f}" data-trace="{_a(graph.trace)}" data-stage="{_a(graph.stage)}" '
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
            f'fill="#37474f" stroke="#ffffff" stroke-width="3" paint-order="stroke">{_a(text)}</text>'
        )

    for e in graph.edges:
        src, dst = boxes[e.src], boxes[e.dst]
        stroke = 1.0 + 5.0 * math.log2(1 + e.nbytes) / math.log2(1 + biggest)
        kernel_edge = src.node.is_kernel or dst.node.is_kernel
        colour = "#78909c" if kernel_edge else "#b0bec5"
        attrs = f'fill="none" stroke="{colour}" stroke-width="{stroke:.1f}" marker-end="url(#{marker})"'
        head = (
            f'<g class="edge" data-src="{_a(e.src)}" data-dst="{_a(e.dst)}" data-bytes="{e.nbytes}">'
            f"<title>{_a(_edge_tooltip(e))}</title>"
        )
        if (e.src, e.dst) in stubbed and e.src == "inputs":
            x2, y2 = port(dst, ins[e.dst].index(e), len(ins[e.dst])), dst.y - 2
            stub = f"M{x2:.1f},{y2 - 14:.1f} L{x2:.1f},{y2:.1f}"
            parts.append(f'{head}<path d="{stub}" {attrs} stroke-dasharray="3 2"/></g>')
            labels.append(label(x2, y2 - 18, f"in {_edge_label(e)}"))
            continue
        if (e.src, e.dst) in stubbed:
            x1, y1 = port(src, outs[e.src].index(e), len(outs[e.src])), src.y + src.h
            stub = f"M{x1:.1f},{y1:.1f} L{x1:.1f},{y1 + 14:.1f}"
            parts.append(f'{head}<path d="{stub}" {attrs} stroke-dasharray="3 2"/></g>')
            labels.append(label(x1, y1 + 25, f"out {_edge_label(e)}"))
            continue
        x1 = port(src, outs[e.src].index(e), len(outs[e.src]))
        i, k = ins[e.dst].index(e), len(ins[e.dst])
        x2 = port(dst, i, k)
        y1, y2 = src.y + src.h, dst.y - 2
        bend = max(28.0, (y2 - y1) / 2)
        path = f"M{x1:.1f},{y1:.1f} C{x1:.1f},{y1 + bend:.1f} {x2:.1f},{y2 - bend:.1f} {x2:.1f},{y2:.1f}"
        parts.append(f'{head}<path d="{path}" {attrs} stroke-opacity="0.85"/></g>')
        stagger = 13 * (i % 2) if dst.w / (k + 1) < EDGE_W else 0
        labels.append(label(x2, y2 - 9 - stagger, _edge_label(e)))
    parts.append("</g>")
    parts.append('<g class="nodes">')
    for b in boxes.values():
        node = b.node
        fill, stroke = _style(node)
        dash = ' stroke-dasharray="4 3"' if node.kind == "view" else ""
        radius = 8 if node.kind == "region" else 14 if node.kind in ("inputs", "outputs") else 4
        width_px = 2.0 if node.kind == "region" else 1.2
        classes = " ".join(x for x in ("node", node.kind, node.action) if x)
        parts.append(
            f'<g class="{_a(classes)}" data-node="{_a(node.id)}"><title>{_a(_node_tooltip(node))}</title>'
            f'<rect x="{b.x:.1f}" y="{b.y:.1f}" width="{b.w:.1f}" height="{b.h:.1f}" rx="{radius}" '
            f'fill="{fill}" stroke="{stroke}" stroke-width="{width_px}"{dash}/>'
        )
        if node.kind == "region":
            for j, line in enumerate(b.lines):
                weight = ' font-weight="bold"' if j == 0 else ""
                parts.append(
                    f'<text x="{b.x + 9:.1f}" y="{b.y + 18 + j * LINE_H:.1f}"{weight} fill="#212121">{_a(line)}</text>'
                )
        else:
            size = "11" if node.kind == "view" else "12"
            parts.append(
                f'<text x="{b.x + b.w / 2:.1f}" y="{b.y + b.h / 2 + 4:.1f}" text-anchor="middle" font-size="{size}" '
                f'fill="#212121">{_a(b.lines[0])}</text>'
            )
        parts.append("</g>")
    parts.append("</g>")
    parts.append(f'<g class="edge-labels">{"".join(labels)}</g>')
    parts.append("</svg>")
    return "\n".join(parts)


# --- DOT ----------------------------------------------------------------------------------------------


def _dot_str(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def graph_title(graph_or_pair: Any, subgraphs: dict[str, Subgraph] | None = None) -> str:
    subgraph = graph_or_pair.subgraph
    if subgraph is None:
        return graph_or_pair.trace
    sub = (subgraphs or {}).get(subgraph)
    label = subgraph if sub is None or sub.name is None else f"{subgraph} ({sub.name})"
    return f"{label} · {graph_or_pair.trace}"


def _count(n: int, what: str) -> str:
    return f"{n} {what}" if n == 1 else f"{n} {what}s"


def totals_text(graph: TraceGraph) -> str:
    """One line of a graph's totals: bytes at kernel boundaries, fusion calls, ops outside fusions, kernels."""
    unknown = f" (+{_count(graph.unknown_sizes, 'tensor')} of unknown size)" if graph.unknown_sizes else ""
    kernels = ""
    if graph.kernels_per_call is not None:
        kernels = f" · {_count(graph.kernels_per_call, 'kernel')} per call (measured)"
    elif graph.region_kernels is not None:
        kernels = f" · {_count(graph.region_kernels, 'kernel')} in fusion calls"
    outside = f"{_count(graph.eager_ops, 'op')} outside fusions, {_count(graph.view_ops, 'view')}"
    return (
        f"{human_bytes(graph.boundary_bytes)} at kernel boundaries{unknown} · "
        f"{_count(graph.fusion_calls, 'fusion call')} · {outside}{kernels}"
    )


def pairs_dot(
    pairs: Sequence[GraphPair], title: str = "FusionGuard dataflow", subgraphs: dict[str, Subgraph] | None = None
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
                fill, stroke = _style(node)
                style = '"rounded,filled,dashed"' if node.kind == "view" else '"rounded,filled"'
                text = "\n".join(node_lines(node))
                out.append(
                    f"    {_dot_str(f'{key}/{node.id}')} [label={_dot_str(text)}, fillcolor={_dot_str(fill)}, "
                    f"color={_dot_str(stroke)}, style={style}, tooltip={_dot_str(_node_tooltip(node))}];"
                )
            biggest = max((e.nbytes for e in graph.edges), default=1) or 1
            for e in graph.edges:
                width = 1.0 + 4.0 * math.log2(1 + e.nbytes) / math.log2(1 + biggest)
                out.append(
                    f"    {_dot_str(f'{key}/{e.src}')} -> {_dot_str(f'{key}/{e.dst}')} "
                    f"[label={_dot_str(_edge_label(e))}, penwidth={width:.1f}, tooltip={_dot_str(_edge_tooltip(e))}];"
                )
            out.append("  }")
    out.append("}")
    return "\n".join(out) + "\n"


# --- HTML ---------------------------------------------------------------------------------------------

_CSS = """
body { font-family: DejaVu Sans, Verdana, Helvetica, Arial, sans-serif; margin: 20px 28px; color: #212121; }
h1 { font-size: 22px; margin: 0 0 6px; } h2 { font-size: 18px; margin: 26px 0 8px; border-bottom: 1px solid #cfd8dc; }
h3 { font-size: 15px; margin: 20px 0 6px; } .meta { color: #546e7a; font-size: 13px; margin: 2px 0; }
nav a { margin-right: 14px; font-size: 13px; }
table { border-collapse: collapse; font-size: 12.5px; margin: 6px 0 12px; }
th, td { border: 1px solid #cfd8dc; padding: 3px 7px; text-align: left; vertical-align: top; }
th { background: #eceff1; } table.sortable th { cursor: pointer; user-select: none; }
table.sortable th:after { content: " ⇅"; color: #90a4ae; font-size: 11px; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
td.ops { max-width: 360px; } td.reason { max-width: 520px; color: #37474f; }
.down { color: #2e7d32; font-weight: bold; } .up { color: #c62828; font-weight: bold; }
.pair { display: flex; flex-wrap: wrap; gap: 18px; align-items: flex-start; }
figure { margin: 0; border: 1px solid #cfd8dc; border-radius: 6px; padding: 8px; background: #fff;
  width: min-content; max-width: 100%; } figcaption { min-width: 360px; }
figure .scroll { overflow: auto; max-height: 1400px; }
figcaption { font-size: 12.5px; margin-bottom: 6px; color: #37474f; }
figcaption b { color: #212121; } .legend span { display: inline-block; margin-right: 12px; font-size: 12px; }
.legend i { display: inline-block; width: 14px; height: 11px; border: 2px solid; border-radius: 3px; margin-right: 4px;
  vertical-align: -1px; }
.action-keep { color: #2e7d32; } .action-reject { color: #c62828; } .action-rehome { color: #1565c0; }
.action-fold { color: #6a1b9a; } .action-remove { color: #b26a00; }
"""

_JS = """
document.querySelectorAll("table.sortable th").forEach(function (th) {
  th.addEventListener("click", function () {
    var table = th.closest("table"), body = table.tBodies[0], i = th.cellIndex;
    var dir = th.dataset.dir === "asc" ? -1 : 1;
    table.querySelectorAll("th").forEach(function (h) { delete h.dataset.dir; });
    th.dataset.dir = dir === 1 ? "asc" : "desc";
    function key(row) {
      var cell = row.cells[i], v = cell.dataset.v !== undefined ? cell.dataset.v : cell.textContent.trim();
      var n = parseFloat(v);
      return v !== "" && !isNaN(n) && isFinite(v) ? n : v;
    }
    Array.prototype.slice.call(body.rows).sort(function (a, b) {
      var x = key(a), y = key(b);
      if (typeof x !== typeof y) { return (typeof x === "number" ? -1 : 1) * dir; }
      return (x > y ? 1 : x < y ? -1 : 0) * dir;
    }).forEach(function (row) { body.appendChild(row); });
  });
});
window.addEventListener("load", function () {
  document.querySelectorAll("svg.dataflow").forEach(function (svg) {
    var box = svg.getBBox();
    svg.dataset.bbox = Math.round(box.width) + "x" + Math.round(box.height);
    svg.dataset.rendered = String(svg.querySelectorAll("g.node").length);
  });
  document.body.dataset.height = String(document.documentElement.scrollHeight);
  document.body.dataset.rendered = "yes";
});
"""


def _cell(text: Any, value: Any = None, cls: str = "") -> str:
    data = "" if value is None else f' data-v="{_a(value)}"'
    klass = f' class="{cls}"' if cls else ""
    return f"<td{klass}{data}>{_a(text)}</td>"


def _num(value: float | int | None, digits: int = 1, suffix: str = "") -> str:
    if value is None:
        return _cell("-", "", "num")
    text = f"{value:.{digits}f}{suffix}" if isinstance(value, float) else f"{value}{suffix}"
    return _cell(text, value, "num")


def _where(subgraph: str | None, trace: str, subgraphs: dict[str, Subgraph]) -> str:
    if subgraph is None:
        return trace
    sub = subgraphs.get(subgraph)
    name = f" ({sub.name})" if sub is not None and sub.name else ""
    return f"{subgraph}{name} / {trace}"


def _table(header: Sequence[str], rows: Sequence[str], table_id: str) -> str:
    head = "".join(f"<th>{_a(h)}</th>" for h in header)
    body = "".join(rows)
    return f'<table class="sortable" id="{table_id}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _delta(before: int, after: int) -> str:
    if before == after:
        return _cell("=", 0, "num")
    cls = "num down" if after < before else "num up"
    sign = MINUS if after < before else "+"
    return _cell(f"{sign}{human_bytes(abs(after - before))}", after - before, cls)


def _summary_table(pairs: Sequence[GraphPair], subgraphs: dict[str, Subgraph]) -> str:
    header = ["program / trace", "bytes before", "bytes after", "change", "fusion calls before → after"]
    header += ["ops outside fusions before → after", "views before → after"]
    with_kernels = any(p.after.kernels_per_call is not None or p.after.region_kernels is not None for p in pairs)
    header += ["kernels per call after"] if with_kernels else []
    rows = []
    for p in pairs:
        b, a = p.before, p.after
        kernels = a.kernels_per_call if a.kernels_per_call is not None else a.region_kernels
        where = "" if a.kernels_per_call is not None else " in fusions"
        kernel_text = "-" if kernels is None else f"{kernels}{where}"
        kernel_cell = _cell(kernel_text, kernels if kernels is not None else "", "num") if with_kernels else ""
        rows.append(
            "<tr>"
            + _cell(_where(p.subgraph, p.trace, subgraphs))
            + _cell(human_bytes(b.boundary_bytes), b.boundary_bytes, "num")
            + _cell(human_bytes(a.boundary_bytes), a.boundary_bytes, "num")
            + _delta(b.boundary_bytes, a.boundary_bytes)
            + _cell(f"{b.fusion_calls} → {a.fusion_calls}", a.fusion_calls, "num")
            + _cell(f"{b.eager_ops} → {a.eager_ops}", a.eager_ops, "num")
            + _cell(f"{b.view_ops} → {a.view_ops}", a.view_ops, "num")
            + kernel_cell
            + "</tr>"
        )
    total_b = sum(p.before.boundary_bytes for p in pairs)
    total_a = sum(p.after.boundary_bytes for p in pairs)
    foot = (
        f"<p class='meta'>All traces: <b>{human_bytes(total_b)}</b> before the guard, <b>{human_bytes(total_a)}</b> "
        "after, read and written at kernel boundaries per call (each tensor a kernel writes and another node reads "
        "or the function returns, once; each tensor a kernel reads, once per reader; views move nothing).</p>"
    )
    return _table(header, rows, "summary") + foot


def _decision_table(decisions: Sequence[Decision], subgraphs: dict[str, Subgraph]) -> str:
    with_kernels = any("kernels" in d.details for d in decisions)
    header = ["where", "region", "executor", "ops", *(["kernels"] if with_kernels else [])]
    header += ["action", "est µs region / eager", "reason"]
    rows = []
    for d in decisions:
        where = _where(d.subgraph, d.trace, subgraphs)
        if d.function:
            where = f"{d.function}#{d.compile_index}: {where}"
        action = d.action if d.applied else f"{d.action} (not applied)"
        reason = d.reason if d.error is None else f"{d.reason} [{d.error}]"
        cells = [_cell(where), _cell(d.region), _cell(d.executor), _cell(", ".join(d.ops), cls="ops")]
        if with_kernels:
            cells.append(_cell(kernels_text(d.details)))
        cells += [
            f'<td class="action-{_a(d.action)}">{_a(action)}</td>',
            _cell(_estimate_text(d), d.estimates.get("est_region_us", ""), "num"),
            _cell(reason, cls="reason"),
        ]
        rows.append("<tr>" + "".join(cells) + "</tr>")
    return _table(header, rows, "decisions")


def _kernel_cell(row: Any) -> str:
    if row.kernels is None:
        return _cell("-", "")
    lines = [f"{row.kernels}: {'+'.join(row.schedulers)}" if row.schedulers else str(row.kernels)]
    for i, us in enumerate(row.kernel_us):
        name = row.kernel_names[i] if i < len(row.kernel_names) else f"kernel {i}"
        bw = row.kernel_gbps[i] if i < len(row.kernel_gbps) else None
        lines.append(f"{name}: {us:.1f} µs" + (f", {bw:.0f} GB/s" if bw is not None else ""))
    inner = "<br>".join(_a(line) for line in lines)
    return f'<td data-v="{row.kernels}">{inner}</td>'


def _profile_table(profile: RegionProfile, subgraphs: dict[str, Subgraph]) -> str:
    cuda = profile.device == "cuda"
    header = ["where", "region", "executor", "ops", "in KiB", "out KiB", "host µs", "eager µs"]
    header += ["device µs", "GB/s", "% of peak", "kernels", "overhead µs"] if cuda else [f"host {MINUS} eager µs"]
    header += ["action", "reason"]
    rows = []
    for r in profile.rows:
        cells = [_cell(_where(r.subgraph, r.trace, subgraphs)), _cell(r.region), _cell(r.executor)]
        cells.append(_cell(f"{r.n_ops}: {ops_summary(r.ops)}", r.n_ops, "ops"))
        cells += [_num(None if r.input_bytes is None else r.input_bytes / 1024)]
        cells += [_num(None if r.output_bytes is None else r.output_bytes / 1024)]
        cells += [_num(r.host_us), _num(r.eager_us)]
        if cuda:
            pct = None if r.peak_fraction is None else 100 * r.peak_fraction
            cells += [_num(r.device_us), _num(r.gbps, 0), _num(pct, 0, "%"), _kernel_cell(r), _num(r.overhead_us)]
        else:
            cells.append(_num(r.excess_us))
        reason = r.reason or ""
        if r.error:
            reason = f"{reason} [{r.error}]".strip()
        cells += [f'<td class="action-{_a(r.action or "")}">{_a(r.action or "-")}</td>', _cell(reason, cls="reason")]
        rows.append("<tr>" + "".join(cells) + "</tr>")
    what = (
        f"µs: median of {profile.reps} calls of each region's own callable with its real inputs; eager: the same "
        "ops run by Thunder's torch executor."
    )
    if cuda:
        peak = "unknown" if profile.peak is None else f"{profile.peak.gbps:.0f} GB/s ({profile.peak.source})"
        what += (
            f" GB/s: input + output bytes over device time; peak memory bandwidth {peak}. Above 100%: the "
            "region reads less than its whole inputs (an embedding table, a gather)."
        )
    return f"<p class='meta'>{_a(what)}</p>" + _table(header, rows, "profile")


def _legend() -> str:
    items = [(a, *ACTION_STYLE[a]) for a in ACTIONS if a in ACTION_STYLE]
    spans = [f'<span><i style="background:{f};border-color:{s}"></i>region: {_a(a)}</span>' for a, f, s in items]
    spans.append(
        f'<span><i style="background:{ACTION_STYLE[None][0]};border-color:{ACTION_STYLE[None][1]}"></i>'
        "region (not guarded)</span>"
    )
    spans.append('<span><i style="background:#fff;border-color:#616161"></i>op outside a fusion (a kernel)</span>')
    spans.append(
        '<span><i style="background:#fafafa;border-color:#9e9e9e;border-style:dashed"></i>view (no kernel)</span>'
    )
    spans.append(
        "<span>edge: tensors handed over, labelled with their bytes (count); thicker = more bytes; "
        "hover for names and shapes</span>"
    )
    return '<p class="legend">' + "".join(spans) + "</p>"


def _program_title(subgraph: str | None, function: str | None, subgraphs: dict[str, Subgraph]) -> str:
    if subgraph is None:
        return function or "jitted function"
    sub = subgraphs.get(subgraph)
    return subgraph if sub is None or sub.name is None else f"{subgraph} ({sub.name})"


def _pictures(pairs: Sequence[GraphPair], subgraphs: dict[str, Subgraph]) -> str:
    """A heading per program (the function, or each ThunderFX subgraph), then its pictures side by side:
    forward and backward, before and after the guard (one picture where the guard changed nothing)."""
    parts = [_legend()]
    programs: dict[str | None, list[GraphPair]] = {}
    for p in pairs:
        programs.setdefault(p.subgraph, []).append(p)
    for subgraph, mine in programs.items():
        parts.append(f"<h3>{_a(_program_title(subgraph, mine[0].function, subgraphs))}</h3>")
        sub = subgraphs.get(subgraph) if subgraph else None
        if sub is not None:
            parts.append(f"<p class='meta'>fx ops: {_a(', '.join(sub.ops))}</p>")
            parts += [f"<p class='meta'>split: {_a(r)}</p>" for r in sub.split_reasons]
        parts.append('<div class="pair">')
        for p in mine:
            stages = [("before the guard", p.before), ("after the guard", p.after)] if p.changed else []
            for label, graph in stages or [("unchanged by the guard", p.after)]:
                parts.append(
                    f'<figure data-trace="{_a(p.trace)}" data-stage="{_a(graph.stage)}"><figcaption>'
                    f"<b>{_a(p.trace)}, {_a(label)}</b>: {_a(totals_text(graph))}</figcaption>"
                    f"<div class='scroll'>{graph_svg(graph)}</div></figure>"
                )
        parts.append("</div>")
    return "\n".join(parts)


def html_page(
    title: str,
    decisions: Sequence[Decision],
    subgraphs: dict[str, Subgraph] | None = None,
    *,
    profile: RegionProfile | None = None,
    graphs: Sequence[GraphPair] = (),
    meta: Sequence[str] = (),
) -> str:
    """The HTML report: summary of bytes at kernel boundaries, the pictures, the profile, the decisions."""
    subgraphs = subgraphs or {}
    sections = []
    nav = []
    if graphs:
        nav += ['<a href="#summary">bytes at kernel boundaries</a>', '<a href="#pictures">pictures</a>']
        sections.append("<h2 id='summary'>Bytes at kernel boundaries, fusion calls and kernels</h2>")
        sections.append(_summary_table(graphs, subgraphs))
        sections.append("<h2 id='pictures'>Dataflow before and after the guard</h2>" + _pictures(graphs, subgraphs))
    if profile is not None:
        nav.append('<a href="#profile">profile</a>')
        sections.append("<h2 id='profile'>Profile</h2>" + _profile_table(profile, subgraphs))
    nav.append('<a href="#decisions">decisions</a>')
    counts = Counter(d.action for d in decisions)
    summary = ", ".join(f"{counts[a]} {a}" for a in ACTIONS if counts[a]) or "none"
    sections.append(f"<h2 id='decisions'>Decisions ({len(decisions)}: {_a(summary)})</h2>")
    if profile is not None:
        sections.append("<p class='meta'>Of the latest compilation of each program: the one profiled and pictured.</p>")
    sections.append(_decision_table(decisions, subgraphs) if decisions else "<p>No fusion region seen.</p>")
    head_meta = "".join(f"<p class='meta'>{_a(m)}</p>" for m in meta)
    return (
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
        f"<title>{_a(title)}</title><style>{_CSS}</style></head>\n<body>"
        f"<h1>{_a(title)}</h1>{head_meta}<nav>{''.join(nav)}</nav>\n"
        + "\n".join(sections)
        + f"\n<script>{_JS}</script></body></html>\n"
    )
