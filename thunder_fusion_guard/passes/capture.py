"""The record of the CUDA graphs :class:`~..cuda_graphs.GuardedCUDAGraphs` captured in one trace: how many graphs,
against Thunder's own grouping, what is no longer copied, and a graph whose gradients were still held when it would
replay or whose capture ran out of memory; and the recommendation of it where Thunder's own transform was given."""

from __future__ import annotations

import dataclasses

from .. import _thunder as th
from ..cuda_graphs import GuardedCUDAGraphs
from ..decisions import Decision, Details
from ..reasons import explained
from ..render.table import plural
from ..render.text import human_bytes
from ..wording import error_line
from .context import TraceContext
from .records import op_decision


def capture_decision(where: TraceContext, summary: th.CaptureSummary) -> Decision:
    """A ``capture`` decision for the graphs ``summary`` tells of, placed where ``where`` says."""
    in_place = sum(nbytes for _, _, nbytes in summary.in_place)
    reason = f"{plural(len(summary.captures), 'CUDA graph')} of {summary.ops} ops"
    if summary.thunder_captures != len(summary.captures) or summary.thunder_empty:
        reason += f" where Thunder's grouping made {summary.thunder_captures}"
        if summary.thunder_empty:
            reason += (
                f" ({summary.thunder_empty} of nothing but deletions, their {summary.thunder_empty_inputs} inputs "
                "copied at each replay)"
            )
    if summary.in_place:
        reason += (
            f"; {plural(len(summary.in_place), 'input')} read in an earlier graph's buffer, not copied "
            f"({human_bytes(in_place)} a replay)"
        )
    if summary.copied_in:
        copied = sum(nbytes for _, _, nbytes in summary.copied_in)
        reason += (
            f"; {plural(len(summary.copied_in), 'input')} copied into the graphs' own buffers at each replay, "
            f"batched by dtype ({human_bytes(copied)} a replay)"
        )
    if summary.copied_back:
        back = sum(nbytes for _, _, nbytes in summary.copied_back)
        reason += (
            f"; {plural(len(summary.copied_back), 'input')} the graph may write copied back to the caller's "
            f"tensor after each replay ({human_bytes(back)} a replay)"
        )
    if summary.handed_over:
        handed = sum(nbytes for _, _, nbytes in summary.handed_over)
        reason += (
            f"; {plural(len(summary.handed_over), 'gradient')} handed to autograd in the graph's own buffers, "
            f"not copied by it ({human_bytes(handed)} a replay)"
        )
    explanation = (
        f"{reason}. Thunder's CUDAGraphTransform groups the ops it captures by the compile option fusion_type "
        "(ThunderFX sets 'dataflow'), copies each input of a graph into the graph's own buffer at every replay "
        "unless it is a parameter or a forward graph's output saved for the backward, and captures a group of "
        "deletions alone. With share_buffers (the default) each run of consecutive ops is one graph, as "
        "under thunder.jit, and a graph reads an earlier graph's output where that graph leaves it (the same "
        "tensor at every replay): the same ops and kernels in the trace's order, without the copies. Thunder's "
        "graphs replay on their own copies of their inputs, so an op that writes an input (x += y on a tensor made "
        "before the graph) would leave the caller's tensor unwritten: such inputs are copied back. A graph's "
        "outputs are the buffers its next replay writes, which Thunder's runner keeps, and autograd copies a gradient "
        "another tensor holds before it becomes a .grad: each gradient is handed on a tensor of its own over "
        "the graph's buffer, which autograd takes as it is. Where a gradient handed so is still held when the graph "
        "would replay (a .grad kept and accumulated into), the graph stops handing its gradients over, runs its ops "
        f"uncaptured while they are held and is captured anew after {th.UNCAPTURED_WHILE_HELD} such calls in a row "
        "(a decision says so). Each graph is warmed up on a stream of its own, not on the stream it is "
        "captured on, so that its matmuls use a cuBLAS workspace allocated in the graph's own memory pool during the "
        "capture: one allocated during a warm-up on the capture stream is freed by whoever clears cuBLAS's "
        "workspaces (torch.compile's CUDA graphs do, at each capture), and the graph would write memory given to "
        "other tensors at every replay. "
        f"The graphs are captured by {summary.captured_by}, Thunder's CUDAGraphTransform with this capture. "
        "Thunder's runner copies a graph's inputs into the "
        "graph's own buffers one copy_ at a time; these are copied in one batched copy (torch._foreach_copy_): "
        "the same bits in the same buffers before the same replay, with one call and a few kernels."
    )
    short, told = explained(reason, explanation)
    return Decision(
        trace="backward" if summary.backward else "forward",
        region=", ".join(summary.captures),
        executor="cudagraph",
        ops=list(summary.captures),
        action="capture",
        reason=short,
        function=where.function,
        compile_index=where.compile_index,
        subgraph=where.subgraph,
        rank=where.rank,
        details={
            "scope": "op",
            **told,
            "captures": list(summary.captures),
            "thunder_captures": summary.thunder_captures,
            "thunder_empty_captures": summary.thunder_empty,
            "read_in_place": [name for name, _, _ in summary.in_place],
            "bytes_not_copied": in_place,
            "still_copied": list(summary.written),
            "copied_back": [name for name, _, _ in summary.copied_back],
            "handed_over": [name for name, _, _ in summary.handed_over],
            "bytes_handed_over": sum(nbytes for _, _, nbytes in summary.handed_over),
            "own_workspace": list(summary.own_workspace),
            "copied_in": [name for name, _, _ in summary.copied_in],
            "bytes_copied_in": sum(nbytes for _, _, nbytes in summary.copied_in),
            "captured_by": summary.captured_by,
        },
    )


def held_decision(capture: Decision, graph: str, held: list[str]) -> Decision:
    """The decision for a graph of ``capture`` whose gradients ``held`` were still held when it would replay: it
    stops handing its gradients over and runs uncaptured while they are held, captured anew after
    :data:`UNCAPTURED_WHILE_HELD` such calls in a row."""
    reason = (
        f"{plural(len(held), 'gradient')} of {graph} still held when it would replay: its ops run uncaptured while "
        "they are held, its gradients copied by autograd from then on"
    )
    explanation = (
        f"{reason}. A gradient handed to autograd in a graph's own buffer is the parameter's .grad; a replay writes "
        "that buffer, so a .grad still held then (kept across steps and accumulated into, or a view of one) would be "
        f"overwritten. The graph's ops run uncaptured on the call's arguments instead (the same kernels, fresh "
        f"outputs) while the buffers are held; after {th.UNCAPTURED_WHILE_HELD} such calls in a row the graph is "
        "captured anew and its old buffers are left to their holders. From then on its gradients are handed as "
        "Thunder hands them, and autograd copies them."
    )
    short, told = explained(reason, explanation)
    details = {"scope": "op", **told, "captures": [graph], "held": list(held)}
    return dataclasses.replace(capture, region=graph, ops=[graph], reason=short, details=details)


def uncaptured_decision(capture: Decision, graph: str, error: BaseException) -> Decision:
    """The decision for a graph of ``capture`` whose capture ran out of device memory: its ops run uncaptured from
    then on, the step goes on."""
    reason = f"capturing {graph} ran out of device memory: its ops run uncaptured from now on"
    explanation = (
        f"{reason}. A capture warms the graph up and records it into buffers of its own, which need memory beside "
        "the step's; uncaptured, the same ops run on the call's arguments (the same kernels and values, one launch "
        f"each). The error: {error_line(error)}"
    )
    short, told = explained(reason, explanation)
    details = {"scope": "op", **told, "captures": [graph], "uncaptured": graph, "error_type": type(error).__name__}
    return dataclasses.replace(capture, region=graph, ops=[graph], reason=short, details=details)


def recommend_decision(where: TraceContext, given: str) -> Decision:
    """The decision (action ``capture``, not applied) recommending :class:`~..cuda_graphs.GuardedCUDAGraphs` where
    Thunder's own ``CUDAGraphTransform`` (``given``, its class name) was given: it runs as given."""
    recommended = GuardedCUDAGraphs.__name__
    facts = {"name": given, "recommended": recommended}
    details = Details(captured_by=given, recommended=recommended)
    return op_decision(
        where, given, "cudagraph", [given], "capture", "cuda_graphs_recommended", facts, details, applied=False
    )
