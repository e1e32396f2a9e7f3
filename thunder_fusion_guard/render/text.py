"""What every picture shares: the colours of the guard's actions, and the text of nodes, edges and totals."""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Any

from ..decisions import Subgraph
from ..wording import fit, human_bytes
from .table import op_groups, percent_text, plural

# (fill, stroke) per guard action; regions without a decision, ops, views and the function's inputs/outputs.
ACTION_STYLE: dict[str | None, tuple[str, str]] = {
    "keep": ("#e3f4e1", "#2e7d32"),
    "reject": ("#fde2de", "#c62828"),
    "switch": ("#fff3e0", "#e65100"),
    "rehome": ("#dde9fb", "#1565c0"),
    "fold": ("#efe2f8", "#6a1b9a"),
    "remove": ("#fff2cc", "#b26a00"),
    "hoist": ("#e0f2f1", "#00695c"),
    "rescue": ("#fce4ec", "#ad1457"),
    "capture": ("#f3e5f5", "#4a148c"),
    "enter": ("#e0f2f1", "#00695c"),
    "share": ("#e8eaf6", "#283593"),
    None: ("#eceff1", "#455a64"),
}
KIND_STYLE: dict[str, tuple[str, str]] = {
    "op": ("#ffffff", "#616161"),
    "view": ("#fafafa", "#9e9e9e"),
    "inputs": ("#fff8e1", "#8d6e63"),
    "outputs": ("#fff8e1", "#8d6e63"),
}
FONT = "DejaVu Sans, Verdana, Helvetica, Arial, sans-serif"
MINUS = "\u2212"


# What a profile's time columns mean: printed under its text table, above its HTML table.
HOST_LEGEND_CPU = (
    "host: wall time of one call of the region's fusion callable, the fusion call's own overhead included (what "
    "the program pays for it); eager: the same ops run one by one by Thunder's torch executor; host-eager > 0: the "
    "fusion call costs more here"
)
HOST_LEGEND_CUDA = (
    "host: wall time of one call of the region's fusion callable, synchronised, so its kernels and the fusion "
    "call's own overhead included; device: its kernels' time on the GPU; overhead: host - device; eager: the same "
    "ops run one by one by Thunder's torch executor, synchronised"
)


def ops_summary(ops: Sequence[str]) -> str:
    """``mul x4, add x2, tanh`` (with a multiplication sign): each op once, with its count, in order of first use."""
    return ", ".join(op_groups(list(ops)))


def display_name(op: str) -> str:
    """An op's name without the torch executor's wrapping: ``torch_prims_reshape_impl`` is ``reshape``."""
    for prefix in ("torch_prims_", "torch_"):
        if op.startswith(prefix) and op.endswith("_impl"):
            return op[len(prefix) : -len("_impl")]
    return op


def wrap(text: str, chars: int, lines: int) -> list[str]:
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
        out = [*out[: lines - 1], fit(" ".join(out[lines - 1 :]), chars)]
    return [fit(line, chars) for line in out]


def node_lines(node: Any, chars: int = 46) -> list[str]:
    """The text of a node, line by line: title, ops, measurements, notes."""
    if node.kind in ("inputs", "outputs"):
        return [node.name]
    if node.kind in ("op", "view"):
        suffix = " (view)" if node.kind == "view" else ""
        action = f" · {node.action}" if node.action else ""
        return [fit(f"{display_name(node.name)}{suffix}{action}", chars)]
    title = " · ".join(x for x in (node.name, node.executor, node.action) if x)
    n = len(node.ops)
    lines = [fit(title, chars), *wrap(f"{plural(n, 'op')}: {ops_summary(node.ops)}", chars, 2)]
    if node.device_us is not None:
        lines.append(f"device {node.device_us:.1f} µs · host {node.host_us or 0:.1f} µs")
    elif node.host_us is not None:
        eager = "" if node.eager_us is None else f" · eager {node.eager_us:.1f} µs"
        lines.append(f"fusion call {node.host_us:.1f} µs{eager}")
    if node.kernels is not None:
        schedulers = "+".join(node.schedulers)
        count = count_text(node.kernels, "kernel")
        lines.append(fit(f"{count}: {schedulers}" if schedulers else count, chars))
    if node.gbps is not None:
        peak = percent_text(node.peak_fraction)
        lines.append(f"{node.gbps:.0f} GB/s" + (f" · {peak} of peak" if peak else ""))
    if node.notes:
        lines += wrap("guard: " + "; ".join(node.notes), chars, 2)
    return lines


def node_tooltip(node: Any) -> str:
    """The hover text of a node: what it is, its ops, the guard's action and notes, what it writes."""
    parts = [f"{node.name} ({node.kind}{', ' + node.executor if node.executor else ''})"]
    if node.ops and node.kind == "region":
        parts.append("ops: " + ", ".join(node.ops))
    if node.action:
        parts.append(f"{node.action}: {node.reason or ''}")
    parts += [f"guard: {n}" for n in node.notes]
    if node.outputs:
        parts.append("writes: " + ", ".join(node.outputs))
    return "\n".join(parts)


def node_style(node: Any) -> tuple[str, str]:
    """(fill, stroke) of a node: a region by its action, an op touched by the guard by that action, else by kind."""
    if node.kind == "region":
        return ACTION_STYLE.get(node.action, ACTION_STYLE[None])
    if node.action in ("reject", "rehome", "fold", "remove"):
        return ACTION_STYLE[node.action]
    return KIND_STYLE[node.kind]


def edge_tooltip(edge: Any) -> str:
    """The hover text of an edge: its bytes and each tensor it carries."""
    lines = [f"{edge.src} → {edge.dst}: {human_bytes(edge.nbytes)}"]
    lines += [f"{t.name}: {t.text} {human_bytes(t.nbytes)}" for t in edge.tensors[:40]]
    if len(edge.tensors) > 40:
        lines.append(f"… {len(edge.tensors) - 40} more")
    return "\n".join(lines)


def edge_label(edge: Any) -> str:
    """An edge's label: its bytes, and how many tensors where more than one."""
    count = len(edge.tensors)
    return human_bytes(edge.nbytes) + (f" ({count})" if count > 1 else "")


def attr(value: Any) -> str:
    """``value`` as text escaped for HTML and SVG attributes and text."""
    return html.escape(str(value), quote=True)


def graph_title(graph_or_pair: Any, subgraphs: dict[str, Subgraph] | None = None) -> str:
    """The title of a trace's picture: the trace, under its ThunderFX subgraph where it has one."""
    subgraph = graph_or_pair.subgraph
    if subgraph is None:
        return graph_or_pair.trace
    sub = (subgraphs or {}).get(subgraph)
    label = subgraph if sub is None or sub.name is None else f"{subgraph} ({sub.name})"
    return f"{label} · {graph_or_pair.trace}"


def count_text(n: int, what: str) -> str:
    """'1 kernel', '3 kernels'."""
    return f"{n} {what}" if n == 1 else f"{n} {what}s"


def totals_text(graph: Any) -> str:
    """One line of a graph's totals: bytes at kernel boundaries, fusion calls, ops outside fusions, kernels."""
    unknown = f" (+{count_text(graph.unknown_sizes, 'tensor')} of unknown size)" if graph.unknown_sizes else ""
    kernels = ""
    if graph.kernels_per_call is not None:
        kernels = f" · {count_text(graph.kernels_per_call, 'kernel')} per call (measured)"
    elif graph.region_kernels is not None:
        kernels = f" · {count_text(graph.region_kernels, 'kernel')} in fusion calls"
    outside = f"{count_text(graph.eager_ops, 'op')} outside fusions, {count_text(graph.view_ops, 'view')}"
    return (
        f"{human_bytes(graph.boundary_bytes)} at kernel boundaries{unknown} · "
        f"{count_text(graph.fusion_calls, 'fusion call')} · {outside}{kernels}"
    )
