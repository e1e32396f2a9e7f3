"""Thunder's automatic gradients run without their forward, the same values.

Thunder 0.2.6 differentiates an op it registered automatically (``tensordot``, ``torch.mm`` as ``spmm``, ``narrow``,
``sinc``) by ``torch.autograd.functional.vjp``: each backward call runs the op forward again, then autograd's engine.
Where such a gradient runs on Thunder's torch executor (beside nvFuser's regions, or with no fusion executor), it is
called through :class:`~.._thunder.ExactVjp` instead: the ops autograd runs for it, recorded once per argument layout,
without the forward nothing returned reads; each recording's first result is checked bit for bit against Thunder's
call, and a layout that differs or cannot be recorded runs Thunder's call from then on (recorded).
"""

from __future__ import annotations

from .. import _thunder as th
from ..decisions import Decision
from .context import PassContext
from .records import op_calls, op_calls_decisions, op_decision


def exact_vjp_pass(trace: th.TraceCtx, context: PassContext) -> tuple[th.TraceCtx, list[Decision]]:
    """``trace`` with each automatic gradient it calls (not inside a fusion region) called without its forward;
    one decision per op (``remove``, ``vjp_forward_removed``), and one more at run time for a layout left to
    Thunder's call."""
    where, record = context.where, context.record
    found: dict[str, list[th.BoundSymbol]] = {}
    bsyms: list[th.BoundSymbol] = []
    for bsym in trace.bound_symbols:
        torchfn = th.automatic_vjp_of(bsym)
        if torchfn is not None:
            name = bsym.sym.name
            found.setdefault(name, []).append(bsym)

            def on_first(why: str | None, name: str = name) -> None:
                if why is not None and record is not None:
                    facts = {"name": name, "error": why}
                    record(op_decision(where, name, "torch", [name], "keep", "vjp_forward_kept", facts))

            bsym = th.with_call(bsym, th.ExactVjp(torchfn, on_first))
        bsyms.append(bsym)
    if not found:
        return trace, []
    made = op_calls_decisions(where, op_calls(found), "remove", "vjp_forward_removed")
    return th.new_trace_like(trace, bsyms), made
