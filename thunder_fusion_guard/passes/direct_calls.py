"""Direct calls: each nvFuser region of a trace called through :class:`~.._thunder.DirectNvFuserCall`.

The region, its fusion definition and its kernels stay Thunder's; only the Python around each call shrinks
(the definition is looked up once per input layout instead of on every call), so the bits cannot change.
With ``runtime.share_fusions``, a region whose definition nvFuser calls equal to one compiled before (the same layer
one layer up) runs that one (:mod:`.._thunder.shared_fusions`): compiled once, the same kernels.
"""

from __future__ import annotations

from collections.abc import Callable

from .. import _thunder as th
from ..decisions import Decision, Details, trace_place
from ..regions import Region
from .context import PassContext, TraceContext
from .records import instead, region_decision, source_details
from .rewrite import CallChange

# Told (the region, the label of the region that compiled the definition it now runs) at its first call.
OnShared = Callable[[Region, str], None]


def direct_calls(
    trace: th.TraceCtx,
    may_change: Callable[[th.BoundSymbol], bool],
    shared: th.SharedFusions | None = None,
    label: Callable[[str], str] = str,
    on_shared: OnShared | None = None,
) -> tuple[th.TraceCtx, list[CallChange]]:
    """``trace`` with every nvFuser region that ``may_change`` allows called directly (sharing equal definitions
    through ``shared``, each region named ``label(name)`` there), and one record per region (``changed``: called
    directly)."""
    changes: list[CallChange] = []
    bsyms: list[th.BoundSymbol] = []
    for position, bsym in enumerate(trace.bound_symbols):
        if th.is_fusion(bsym) and th.executor_name(bsym) == "nvfuser" and may_change(bsym):
            name = bsym.sym.name
            told = None
            if on_shared is not None:
                region = Region(position, name, "nvfuser", bsym)
                told = lambda first, region=region: on_shared(region, first)  # noqa: E731
            call = th.direct_nvfuser_call(th.region_callable(bsym), shared, label(name), told)
            if isinstance(call, str):
                changes.append(CallChange(name, False, call))
            else:
                changes.append(CallChange(name, True))
                bsym = th.with_region_callable(bsym, call)
        bsyms.append(bsym)
    if not any(c.changed for c in changes):
        return trace, changes
    return th.new_trace_like(trace, bsyms), changes


# details["call"] of a region called directly.
DIRECT = "direct"


def region_label(where: TraceContext, name: str) -> str:
    """How a region is named among those of every program: ``[function#compile:][subgraph/]trace name``."""
    return f"{trace_place(where.trace, where.subgraph, where.function, where.compile_index)} {name}"


def shared_decision(where: TraceContext, region: Region, first: str) -> Decision:
    """The decision a region records at its first call when its definition equals the one ``first`` compiled."""
    facts = {"region": region.name, "name": first, "count": len(region.ops)}
    details = Details(shared_with=first, **source_details(region))
    return region_decision(where, region, "share", "shared_fusion", facts, details)


def direct_call_pass(trace: th.TraceCtx, context: PassContext) -> tuple[th.TraceCtx, list[Decision]]:
    """Call each nvFuser region without Thunder's per-call lookup, equal definitions compiled once
    (``runtime.share_fusions``); record how each region is called."""
    options, where, record = context.options, context.where, context.record
    shared = th.SHARED_FUSIONS if options.runtime.share_fusions else None
    on_shared = None
    if shared is not None and record is not None:

        def on_shared(region: Region, first: str) -> None:
            record(shared_decision(where, region, first))

    new, changes = direct_calls(
        trace,
        lambda fusion: options.guards(th.executor_name(fusion)),
        shared,
        lambda name: region_label(where, name),
        on_shared,
    )
    regions = context.region_decisions()
    made = []
    for c in changes:
        d = regions.get(c.region)
        if d is not None:
            call = DIRECT if c.changed else f"Thunder's: {c.because}"
            made.append(instead(d, details={**d.details, "call": call}))
    return new, made
