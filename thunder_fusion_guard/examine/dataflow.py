"""Dataflow graphs of traces: what runs as a kernel, which tensors flow between kernels, and how many bytes.

A node is a fusion call (``region``), an op run outside a fusion (``op``: an eager kernel), a view op
outside a fusion (``view``: no kernel; its output aliases its input), or the function's ``inputs`` and
``outputs``. An edge carries the tensors one node hands to another.

Bytes at kernel boundaries: each tensor a kernel node (region or op) writes and someone reads or the
function returns, counted once, plus each tensor a kernel node reads (function inputs included), counted
once per reader: the memory traffic between kernels, which fusing them could save. Views move no bytes: a
kernel that reads a view reads the view's bytes. Graphs are built from the trace the guard received
(``before``) and the final trace (``after``); merging regions removes the bytes between them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from .. import _thunder as th
from ..decisions import Decision
from ..ops import runs_as_view
from ..render import pairs_dot
from .calls import latest_decisions, programs

KERNEL_KINDS = ("region", "op")


@dataclass
class TensorInfo:
    """One tensor on an edge: its name in the trace, ``f32[6, 4, 5]``, and its bytes (None: unknown size)."""

    name: str
    text: str
    nbytes: int | None


@dataclass
class Edge:
    """The tensors node ``src`` hands to node ``dst``."""

    src: str
    dst: str
    tensors: list[TensorInfo] = field(default_factory=list)

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes or 0 for t in self.tensors)


@dataclass
class Node:
    """A fusion region, an op outside a fusion, a view outside a fusion, or the function's inputs/outputs.

    ``action`` and ``reason`` come from the guard's decisions, ``notes`` from its op-level decisions
    (an op moved in, a region merged in, an identity removed); the measured fields from a profile.
    """

    id: str
    kind: str
    name: str
    executor: str | None = None
    ops: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    action: str | None = None
    reason: str | None = None
    notes: list[str] = field(default_factory=list)
    host_us: float | None = None
    device_us: float | None = None
    eager_us: float | None = None
    kernels: int | None = None
    schedulers: list[str] = field(default_factory=list)
    gbps: float | None = None
    peak_fraction: float | None = None

    @property
    def is_kernel(self) -> bool:
        return self.kind in KERNEL_KINDS


# What TraceGraph.totals() reports.
TOTALS = (
    "boundary_bytes",
    "bytes_read",
    "bytes_written",
    "unknown_sizes",
    "fusion_calls",
    "eager_ops",
    "view_ops",
    "region_kernels",
    "kernels_per_call",
)


@dataclass
class TraceGraph:
    """The dataflow graph of one trace: ``trace`` is forward/backward, ``stage`` before/after the guard.

    ``kernels_per_call`` is the measured number of kernels one call of the trace launches (CUDA, profiled).
    """

    trace: str
    stage: str
    subgraph: str | None
    nodes: list[Node]
    edges: list[Edge]
    kernels_per_call: int | None = None

    def node(self, node_id: str) -> Node:
        for n in self.nodes:
            if n.id == node_id:
                return n
        raise KeyError(node_id)

    def _kinds(self) -> dict[str, str]:
        return {n.id: n.kind for n in self.nodes}

    @property
    def bytes_read(self) -> int:
        """Bytes kernel nodes read: each tensor once per reading kernel."""
        kinds = self._kinds()
        return sum(e.nbytes for e in self.edges if kinds[e.dst] in KERNEL_KINDS)

    @property
    def bytes_written(self) -> int:
        """Bytes kernel nodes write that another node reads or the function returns: each tensor once."""
        kinds = self._kinds()
        written = {t.name: t.nbytes or 0 for e in self.edges if kinds[e.src] in KERNEL_KINDS for t in e.tensors}
        return sum(written.values())

    @property
    def boundary_bytes(self) -> int:
        """Memory read and written at kernel boundaries (see the module docstring)."""
        return self.bytes_read + self.bytes_written

    @property
    def unknown_sizes(self) -> int:
        """Tensors whose size is not known as numbers (symbolic shapes): left out of the byte counts."""
        return len({t.name for e in self.edges for t in e.tensors if t.nbytes is None})

    @property
    def fusion_calls(self) -> int:
        return sum(n.kind == "region" for n in self.nodes)

    @property
    def eager_ops(self) -> int:
        """Ops run outside fusions that launch work (not views)."""
        return sum(n.kind == "op" for n in self.nodes)

    @property
    def view_ops(self) -> int:
        return sum(n.kind == "view" for n in self.nodes)

    @property
    def region_kernels(self) -> int | None:
        """Kernels the fusion calls launch, summed; None unless there are regions and every count is known."""
        counts = [n.kernels for n in self.nodes if n.kind == "region"]
        return None if not counts or any(c is None for c in counts) else sum(c for c in counts if c is not None)

    def totals(self) -> dict[str, Any]:
        """The graph's totals (:data:`TOTALS`) by name."""
        return {name: getattr(self, name) for name in TOTALS}

    def to_dict(self) -> dict[str, Any]:
        return {
            "trace": self.trace,
            "stage": self.stage,
            "subgraph": self.subgraph,
            "totals": self.totals(),
            "nodes": [asdict(n) for n in self.nodes],
            "edges": [{**asdict(e), "nbytes": e.nbytes} for e in self.edges],
        }


@dataclass
class GraphPair:
    """One trace of one Thunder program, as the guard received it and as it runs."""

    subgraph: str | None
    trace: str
    function: str | None
    before: TraceGraph
    after: TraceGraph
    changed: bool

    def to_dict(self) -> dict[str, Any]:
        where = {name: getattr(self, name) for name in ("subgraph", "trace", "function", "changed")}
        return {**where, "before": self.before.to_dict(), "after": self.after.to_dict()}


def trace_graph(
    trace: th.TraceCtx,
    kind: str = "forward",
    stage: str = "after",
    *,
    subgraph: str | None = None,
    decisions: Iterable[Decision] = (),
    rows: Iterable[Any] = (),
    metadata_ops: Iterable[str] = (),
) -> TraceGraph:
    """The dataflow graph of ``trace``, its nodes annotated with the guard's ``decisions`` for this trace
    and with profile ``rows`` (:class:`RegionRow`) of the same regions."""
    nodes: list[Node] = [Node("inputs", "inputs", "inputs")]
    edges: dict[tuple[str, str], Edge] = {}
    producer: dict[str, str] = {}

    def connect(src: str, dst: str, proxy: Any) -> None:
        edge = edges.setdefault((src, dst), Edge(src, dst))
        if all(t.name != proxy.name for t in edge.tensors):
            edge.tensors.append(TensorInfo(proxy.name, th.tensor_text(proxy), th.tensor_nbytes(proxy)))

    for bsym in trace.bound_symbols:
        if th.is_plumbing(bsym):
            continue
        outs = th.tensor_proxies(bsym.flat_proxy_outs)
        if th.is_fusion(bsym):
            node = Node(bsym.sym.name, "region", bsym.sym.name, th.executor_name(bsym))
            node.ops = [th.op_name(b) for b in th.fusion_body(bsym)]
        elif outs:
            view = runs_as_view(bsym, metadata_ops)
            node = Node(f"{th.op_name(bsym)}:{outs[0].name}", "view" if view else "op", th.op_name(bsym))
            node.executor, node.ops = th.executed_by(bsym), [th.op_name(bsym)]
        else:
            continue
        node.outputs = [p.name for p in outs]
        for proxy in th.tensor_proxies(bsym.flat_proxy_args):
            connect(producer.get(proxy.name, "inputs"), node.id, proxy)
        for name in node.outputs:
            producer[name] = node.id
        nodes.append(node)
    nodes.append(Node("outputs", "outputs", "outputs"))
    for proxy in th.tensor_proxies(th.returned_proxies(trace)):
        if proxy.name in producer:
            connect(producer[proxy.name], "outputs", proxy)
    graph = TraceGraph(kind, stage, subgraph, nodes, list(edges.values()))
    _annotate(graph, [d for d in decisions if d.trace == kind], stage)
    _measured(graph, [r for r in rows if r.trace == kind])
    return graph


def _annotate(graph: TraceGraph, decisions: Sequence[Decision], stage: str) -> None:
    """Actions, reasons and notes from the guard's decisions for this trace."""
    regions = {n.id: n for n in graph.nodes if n.kind == "region"}
    by_output = {o: n for n in graph.nodes if n.kind in ("op", "view") for o in n.outputs}
    for d in decisions:
        if d.about_region:
            # a switched region runs in the final trace under the name its new executor gave it
            name = d.details.get("switched_to", d.region) if stage == "after" and d.applied else d.region
            node = regions.get(name)
            if node is not None and node.action is None:
                node.action, node.reason = d.action, d.reason
                node.kernels = d.details.get("kernels", node.kernels)
                node.schedulers = list(d.details.get("schedulers") or node.schedulers)
    changes = [d for d in decisions if not d.about_region and d.action != "keep" and d.applied]
    merged_into = {d.region: d.details["into"] for d in changes if d.action == "rehome" and not d.ops}

    def home(name: str) -> str:
        """Where a region's ops run in this graph: merged regions are followed to the one they went into."""
        seen = set()
        while name not in regions and name in merged_into and name not in seen:
            seen.add(name)
            name = merged_into[name]
        return name

    for d in changes:
        into = d.details.get("into")
        if d.action == "rehome" and not d.ops and into:
            merged = regions.get(d.region)
            if merged is not None and stage == "before":
                merged.action, merged.reason = "rehome", d.reason
            target = regions.get(home(into))
            if target is not None and stage == "after":
                target.notes.append(f"{d.region} merged in")
            continue
        output = d.details.get("output")
        op_node = by_output.get(output) if output else None
        if op_node is None and d.action == "fold":
            op_node = by_output.get(d.region)
        if op_node is not None:
            op_node.action, op_node.reason = d.action, d.reason
        elif d.action == "rehome" and stage == "before":
            source = next((r for r in regions.values() if output in r.outputs and r.id != into), None)
            if source is not None:
                source.notes.append(f"then {', '.join(d.ops)} moved into {into}")
        region = regions.get(home(into or d.region))
        if region is not None:
            verb = {"rehome": "moved in", "remove": "removed", "fold": "folded"}.get(d.action, d.action)
            region.notes.append(f"{', '.join(d.ops)} {verb}")


def _measured(graph: TraceGraph, rows: Sequence[Any]) -> None:
    """Profile figures on the region nodes whose ops are those of the profiled region."""
    by_region = {r.region: r for r in rows}
    for node in graph.nodes:
        row = by_region.get(node.id)
        if node.kind != "region" or row is None or list(row.ops) != node.ops:
            continue
        node.host_us, node.device_us, node.eager_us = row.host_us, row.device_us, row.eager_us
        node.gbps, node.peak_fraction = getattr(row, "gbps", None), getattr(row, "peak_fraction", None)
        if row.kernels is not None:
            node.kernels, node.schedulers = row.kernels, list(row.schedulers)


def trace_graphs(obj: Any, rows: Iterable[Any] = (), metadata_ops: Iterable[str] = ()) -> list[GraphPair]:
    """Before/after dataflow graphs of every trace of ``obj`` (a ``thunder.jit`` result or a ThunderFX
    object, after it ran): forward and backward, per ThunderFX subgraph; annotated with the guard's
    decisions of the latest compilation and with profile ``rows`` (``profile_regions(...).rows``)."""
    rows = list(rows)
    pairs = []
    for jitted, subgraph in programs(obj):
        decisions = latest_decisions(jitted)
        mine = [r for r in rows if r.subgraph == subgraph]
        function = th.jitted_function_name(jitted)
        finals, befores = th.last_traces(jitted), th.traces_before_guard(jitted)
        for kind, after, before in zip(("forward", "backward"), finals, befores, strict=True):
            if after is None:
                continue
            before = before or after

            options: dict[str, Any] = dict(subgraph=subgraph, decisions=decisions, rows=mine, metadata_ops=metadata_ops)
            graphs = [
                trace_graph(trace, kind, stage, **options) for trace, stage in ((before, "before"), (after, "after"))
            ]
            pairs.append(GraphPair(subgraph, kind, function, *graphs, before is not after))
    return pairs


def graphs_to_dot(pairs: Sequence[GraphPair], title: str = "FusionGuard dataflow", subgraphs: Any = None) -> str:
    """Graphviz DOT text: one digraph, a cluster per trace and stage (``before`` only where the guard changed
    it); ``subgraphs`` (``Report.subgraphs``) names the ThunderFX subgraphs."""
    return pairs_dot(pairs, title, subgraphs)
