"""Why one nvFuser region ran as several kernels: nvFuser's segmented-fusion dump read out of its scheduled IR
(each segment's scheduler in order, the tensors on the edges between segments with their bytes), each
scheduler's verdict on the whole fusion, and a ``segmented`` row per such region of one more run (CUDA only).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .. import _thunder as th
from .._thunder import partition as pt
from ..render.table import plural
from ..render.text import human_bytes
from .why_rows import WhyKind, WhyRow, not_analysed, region_row

__all__ = ["SegmentEdge", "kernel_rows", "segmented_groups", "segmented_rows"]

# nvFuser's segmented-fusion dump (``SegmentedFusion`` printed before the kernels in the scheduled IR, as
# nvFuser 0.2.36 prints it): ``groups:`` lists each segment as ``scheduler{expr ids}`` in order, ``edges:`` each
# tensor written by one segment and read by another as ``e{ from -> to(T3_g_float[iS6{512}, bS7{1 ex 32}]) }``.
_GROUP = re.compile(r"^\s*(?P<scheduler>[a-z_]+)\{[\d, ]*\}\s*$", re.M)
_EDGE = re.compile(r"^\s*e\{.*?->.*?\((?P<tensor>T\d+_g_(?P<dtype>\w+?))\[(?P<dims>[^\]]*)\]\) \}\s*$", re.M)
_EXTENT = re.compile(r"(?P<kind>[a-zA-Z]+)\d+\{(?P<extent>\d+)[^}]*\}")
_ITEM_BYTES = {"float": 4, "__bfloat": 2, "__half": 2, "double": 8, "int64_t": 8, "int": 4, "bool": 1, "int32_t": 4}


@dataclass(frozen=True)
class SegmentEdge:
    """A tensor one nvFuser segment writes to global memory and another reads back: its name and bytes (None where
    its dtype or extents are not printed as numbers)."""

    tensor: str
    bytes: int | None


def _edge_bytes(dtype: str, dims: str) -> int | None:
    """Bytes of an edge tensor from its printed extents: broadcast dimensions (``bS``) hold one element."""
    item = _ITEM_BYTES.get(dtype)
    extents = [1 if m["kind"].startswith("b") else int(m["extent"]) for m in _EXTENT.finditer(dims)]
    if item is None or (not extents and dims.strip()):
        return None
    return item * math.prod(extents)


def segmented_groups(scheduled_ir: str) -> tuple[list[str], list[SegmentEdge]] | None:
    """(the scheduler of each segment, in the order nvFuser lists them; the tensors on the edges between segments)
    read from nvFuser's segmented-fusion dump in a scheduled IR; None where the IR holds no such dump."""
    if "Segmented_Fusion{" not in scheduled_ir:
        return None
    dump = scheduled_ir.split("Segmented_Fusion{", 1)[1].split("group details:", 1)[0]
    groups_text, _, edges_text = dump.partition("edges:")
    groups = [m["scheduler"] for m in _GROUP.finditer(groups_text.split("groups:", 1)[-1])]
    edges = [SegmentEdge(m["tensor"], _edge_bytes(m["dtype"], m["dims"])) for m in _EDGE.finditer(edges_text)]
    return groups, edges


def segmented_rows(
    region_fn: Any, inputs: Sequence[Any], trace: str, region: str, subgraph: str | None = None
) -> list[WhyRow]:
    """A row for an nvFuser region that ran as several kernels (CUDA only, after a run): the groups and edge
    tensors of nvFuser's segmented-fusion dump in its most recent scheduled IR, and for each scheduler used
    ``nvfuser_direct.schedule.can_schedule`` on the whole fusion (why that scheduler could not take it all).
    ``region_fn`` is the region's callable (Thunder's ``FusionDefinitionWrapper``), ``inputs`` its last
    arguments. [] where the region ran as one kernel; a row saying what is missing where nvFuser does not
    expose the IR."""
    fec = getattr(getattr(region_fn, "last_used", None), "fec", None)
    ir = th.nvfuser_scheduled_ir(region_fn)
    if ir is None:
        missing = "nvFuser's scheduled IR is not exposed here (no fec.get_most_recent_scheduled_ir)"
        return [region_row(trace, subgraph, region, WhyKind.UNKNOWN, missing, "scheduled IR", executor="nvfuser")]
    groups = segmented_groups(ir)
    if groups is None or len(groups[0]) < 2:
        return []
    schedulers, edges = groups
    kernels = [name for name in schedulers if name != "expr_eval"]
    verdicts = pt.scheduler_verdicts(fec, inputs, list(dict.fromkeys(kernels)))
    known = [e.bytes for e in edges if e.bytes is not None]
    crossing = 2 * sum(known) if edges and len(known) == len(edges) else None  # written once, read back once
    counted = ", ".join(f"{n} {name}" for name, n in Counter(schedulers).items())
    through = plural(len(edges), "edge tensor") + (
        f", {human_bytes(crossing)} written and read back" if crossing else ""
    )
    first = next(iter(verdicts.items()), None)
    why = f"; {first[0]}: {first[1]}" if first else ""
    detail = "; ".join(
        [f"segments in nvFuser's order: {', '.join(schedulers)}"]
        + [f"edge {e.tensor}: {human_bytes(e.bytes)}" for e in edges]
        + [f"{name} on the whole fusion: {text}" for name, text in verdicts.items()]
        + ["expr_eval segments run through nvFuser's expression evaluator (ATen or aliasing), no generated kernel"]
    )
    return [
        region_row(
            trace,
            subgraph,
            region,
            WhyKind.SEGMENTED,
            f"{len(schedulers)} segments ({counted}), {through}{why}",
            "scheduled IR + can_schedule",
            bytes=crossing,
            count=len(schedulers),
            executor="nvfuser",
            ops=[e.tensor for e in edges],
            detail=detail,
        )
    ]


def kernel_rows(fn: Any, args: tuple, kwargs: dict, backward: bool) -> list[WhyRow]:
    """``segmented`` rows for the nvFuser regions of one more run of ``fn`` (none off CUDA)."""
    from .calls import program_calls

    rows: list[WhyRow] = []
    for program in program_calls(fn, args, kwargs, backward):
        for call in program.calls:
            replay = call.replay_args()
            if call.region.executor != "nvfuser" or replay is None:
                continue
            region_fn = th.region_callable(call.region.bsym)
            if getattr(region_fn, "rescued", False):
                continue  # nvFuser failed on it: its rescue row says so
            try:
                region_fn(*replay)  # the most recent scheduled IR is then this region's, for these inputs
                rows += segmented_rows(region_fn, replay, call.trace, call.region.name, program.subgraph)
            except Exception as e:  # a region nvFuser's scheduler queries cannot analyse
                what = f"{call.region.name}'s nvFuser segments"
                rows.append(not_analysed(call.trace, program.subgraph, what, e, call.region.name))
    return rows
