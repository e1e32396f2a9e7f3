"""Direct calls: each nvFuser region of a trace called through :class:`~.._thunder.DirectNvFuserCall`.

The region, its fusion definition and its kernels stay Thunder's; only the Python around each call shrinks
(the definition is looked up once per input layout instead of on every call), so the bits cannot change.
"""

from __future__ import annotations

from collections.abc import Callable

from .. import _thunder as th
from ..decisions import Decision
from .context import PassContext
from .records import instead
from .rewrite import CallChange


def direct_calls(
    trace: th.TraceCtx, may_change: Callable[[th.BoundSymbol], bool]
) -> tuple[th.TraceCtx, list[CallChange]]:
    """``trace`` with every nvFuser region that ``may_change`` allows called directly, and one record per region
    (``changed``: called directly)."""
    changes: list[CallChange] = []
    bsyms: list[th.BoundSymbol] = []
    for bsym in trace.bound_symbols:
        if th.is_fusion(bsym) and th.executor_name(bsym) == "nvfuser" and may_change(bsym):
            call = th.direct_nvfuser_call(th.region_callable(bsym))
            if isinstance(call, str):
                changes.append(CallChange(bsym.sym.name, False, call))
            else:
                changes.append(CallChange(bsym.sym.name, True))
                bsym = th.with_region_callable(bsym, call)
        bsyms.append(bsym)
    if not any(c.changed for c in changes):
        return trace, changes
    return th.new_trace_like(trace, bsyms), changes


# details["call"] of a region called directly.
DIRECT = "direct"


def direct_call_pass(trace: th.TraceCtx, context: PassContext) -> tuple[th.TraceCtx, list[Decision]]:
    """Call each nvFuser region without Thunder's per-call lookup; record how each region is called."""
    options = context.options
    new, changes = direct_calls(trace, lambda fusion: options.guards(th.executor_name(fusion)))
    regions = context.region_decisions()
    made = []
    for c in changes:
        d = regions.get(c.region)
        if d is not None:
            call = DIRECT if c.changed else f"Thunder's: {c.because}"
            made.append(instead(d, details={**d.details, "call": call}))
    return new, made
