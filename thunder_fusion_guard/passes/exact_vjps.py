"""Thunder's automatic gradients run without their forward, the same values.

Thunder 0.2.6 differentiates an op it registered automatically (``tensordot``, ``torch.mm`` as ``spmm``, ``narrow``,
``sinc``) by ``torch.autograd.functional.vjp``: each backward call runs the op forward again, then autograd's engine.
Where such a gradient runs on Thunder's torch executor (beside nvFuser's regions, or with no fusion executor), it is
called through :class:`~.._thunder.ExactVjp` instead: the ops autograd runs for it, recorded once per argument layout,
without the forward nothing returned reads; each recording's first result is checked bit for bit against Thunder's
call, and a layout that differs or cannot be recorded runs Thunder's call from then on (recorded).
"""

from __future__ import annotations

from collections import Counter

from .. import _thunder as th
from ..decisions import Decision, Details
from .context import PassContext
from .records import op_decision


def exact_vjp_pass(trace: th.TraceCtx, context: PassContext) -> tuple[th.TraceCtx, list[Decision]]:
    """``trace`` with each automatic gradient it calls (not inside a fusion region) called without its forward;
    one decision per op (``remove``, ``vjp_forward_removed``), and one more at run time for a layout left to
    Thunder's call."""
    where, record = context.where, context.record
    counts: Counter[str] = Counter()
    first_line: dict[str, str | None] = {}
    bsyms: list[th.BoundSymbol] = []
    for bsym in trace.bound_symbols:
        torchfn = th.automatic_vjp_of(bsym)
        if torchfn is None:
            bsyms.append(bsym)
            continue
        name = bsym.sym.name
        counts[name] += 1
        first_line.setdefault(name, th.source_line(bsym))

        def on_first(why: str | None, name: str = name) -> None:
            if why is not None and record is not None:
                facts = {"name": name, "error": why}
                record(op_decision(where, name, "torch", [name], "keep", "vjp_forward_kept", facts))

        bsyms.append(th.with_call(bsym, th.ExactVjp(torchfn, on_first)))
    if not counts:
        return trace, []
    made = [
        op_decision(
            where,
            name,
            "torch",
            [name],
            "remove",
            "vjp_forward_removed",
            {"name": name, "count": count},
            Details(source=first_line[name]) if first_line[name] else None,
        )
        for name, count in counts.items()
    ]
    return th.new_trace_like(trace, bsyms), made
