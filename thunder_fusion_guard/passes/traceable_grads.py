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

from .. import _thunder as th
from .records import OpCalls, op_calls


def trace_gradients(trace: th.TraceCtx, executors: list[str]) -> tuple[th.TraceCtx, list[OpCalls]]:
    """``trace`` with each automatically registered op :func:`.._thunder.traceable_op` names calling this package's
    operator for it, and the calls changed, by op; ``trace`` itself where there is none, Thunder will not
    differentiate it, or no torch.compile executor (``executors``: the compilation's names) would run its gradient."""
    if "torchcompile" not in executors or not th.trace_requires_grad(trace):
        return trace, []
    found: dict[str, list[th.BoundSymbol]] = {}
    bsyms: list[th.BoundSymbol] = []
    for bsym in trace.bound_symbols:
        name = th.traceable_op(bsym)
        if name is not None:
            found.setdefault(name, []).append(bsym)
            bsym = th.rebound_traceable(bsym)
        bsyms.append(bsym)
    if not found:
        return trace, []
    out = th.new_trace_like(trace, bsyms)
    th.set_provenance(out, "FusionGuard: library ops given gradients of Thunder's ops")
    return out, op_calls(found)
