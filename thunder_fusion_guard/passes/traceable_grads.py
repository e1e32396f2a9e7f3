"""Library ops whose automatic gradient a torch.compile region cannot run, given a gradient of Thunder's ops.

Thunder 0.2.6 registers ``torch.tensordot`` and ``torch.narrow`` (e3nn's tensor products call both) automatically;
the gradient, ``tensordot_vjp``, reruns the op under ``torch.autograd.functional.vjp``, which Dynamo cannot trace.
Where the torch.compile executor fuses the backward, the region holding it fails at its first backward: unguarded
Thunder stops there; the rescue would split the region around each one and rerun every forward. Here each such op
calls the same torch function forward (the forward's bits) and its gradient is Thunder's ops (a matmul per side, a
pad), fused with the rest. This pass runs on the computation trace before Thunder differentiates it
(``transform_traces_pre_prologue``), only where it will and where torch.compile is among the executors: with
nvFuser the gradients run on Thunder's torch executor, as unguarded, and keep its bits.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from .. import _thunder as th
from ..decisions import Decision, Details
from .context import TraceContext
from .records import op_decision


@dataclass(frozen=True)
class GradientsTraced:
    """One op given a gradient of Thunder's ops: its name, how many calls, the first call's user line."""

    op: str
    count: int
    source: str | None


def trace_gradients(trace: th.TraceCtx, executors: list[str]) -> tuple[th.TraceCtx, list[GradientsTraced]]:
    """``trace`` with each automatically registered ``tensordot`` and ``narrow`` (static arguments) calling this
    package's operator for it; ``trace`` itself where there is none, Thunder will not differentiate it, or no
    torch.compile executor (``executors``: the compilation's names) would run its gradient."""
    if "torchcompile" not in executors or not th.trace_requires_grad(trace):
        return trace, []
    names = [th.traceable_op(b) for b in trace.bound_symbols]
    if not any(names):
        return trace, []
    new = [th.rebound_traceable(b) if n else b for b, n in zip(trace.bound_symbols, names, strict=True)]
    counts = Counter(n for n in names if n)
    first = {n: next(b for b, m in zip(trace.bound_symbols, names, strict=True) if m == n) for n in counts}
    out = th.new_trace_like(trace, new)
    th.set_provenance(out, "FusionGuard: library ops given gradients of Thunder's ops")
    return out, [GradientsTraced(n, c, th.source_line(first[n])) for n, c in counts.items()]


def gradients_traced_decisions(where: TraceContext, traced: list[GradientsTraced], applied: bool) -> list[Decision]:
    """One decision (action ``rescue``) for each op given a gradient of Thunder's ops."""
    return [
        op_decision(
            where,
            t.op,
            "torch",
            [t.op],
            "rescue",
            "gradient_traced",
            {"name": t.op, "count": t.count},
            Details(source=t.source) if t.source else None,
            applied=applied,
        )
        for t in traced
    ]
