"""The guard's runner: the passes of :data:`PASSES` run in order over a trace, each enabled by its option, a
failing pass (or one that would change the communication ops) undone and recorded, and their decisions added
to the report once, after the last."""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from .. import _thunder as th
from ..decisions import Decision
from ..options import GuardOptions
from ..policy import ModelDoubt
from ..progress import Progress
from ..report import Report
from .context import (
    CommunicationChanged,
    ConstantsFor,
    FusionGuardError,
    MeasureRegion,
    PassContext,
    PassFunction,
    TraceContext,
    check_communication,
)
from .decide import merged_region_pass, region_pass
from .dels import dels_pass
from .direct_calls import DIRECT, direct_call_pass
from .exact_vjps import exact_vjp_pass
from .fold import fold_pass
from .hoist import HoistLedger
from .hoist_pass import hoist_pass
from .identity import identity_pass
from .lost_constants import lost_constant_pass
from .padded_sums import padded_sum_pass
from .records import instead, op_decision
from .rehome import merge_pass, rehome_pass
from .rescue import rescue_pass
from .scatters import scatter_pass
from .small_matmuls import late_small_matmul_pass, small_matmul_pass
from .unused_grads import unused_grad_pass

__all__ = [
    "PASSES",
    "CommunicationChanged",
    "FusionGuardError",
    "Pass",
    "PassContext",
    "TraceContext",
    "guard_trace",
    "run_pass",
]


@dataclass(frozen=True)
class Pass:
    """One step of :func:`guard_trace`: its name (the report names a failed pass by it), the option that turns it
    on (None: always on; ``group.field`` for a grouped one), and whether it runs in ``report_only`` mode too (it then
    records what it would do)."""

    name: str
    option: str | None
    function: PassFunction
    report_only: bool = True

    def enabled(self, options: GuardOptions) -> bool:
        on = self.option is None or bool(functools.reduce(getattr, self.option.split("."), options))
        return on and (self.report_only or not options.report_only)


# The passes of guard_trace, in order: (name, the option that turns it on, the function, runs in report_only).
PASSES: tuple[Pass, ...] = (
    Pass("lost_constant_pass", "rescue", lost_constant_pass),
    Pass("small_matmul_pass", "rewrites.small_matmuls", small_matmul_pass),
    Pass("region_pass", None, region_pass),
    Pass("fold_pass", "rewrites.fold_setitem", fold_pass),
    Pass("identity_pass", "rewrites.remove_identities", identity_pass),
    Pass("padded_sum_pass", "rewrites.concat_padded_sums", padded_sum_pass),
    Pass("rehome_pass", "rewrites.rehome", rehome_pass),
    Pass("merge_pass", "rewrites.merge_regions", merge_pass),
    Pass("merged_region_pass", "rewrites.merge_regions", merged_region_pass, report_only=False),
    Pass("scatter_pass", "rewrites.merge_regions", scatter_pass),
    # applied moves only: in report_only mode the first pass moved nothing, and this one would record its moves again
    Pass("late_small_matmul_pass", "rewrites.small_matmuls", late_small_matmul_pass, report_only=False),
    Pass("hoist_pass", "hoist", hoist_pass),
    Pass("dels_pass", None, dels_pass, report_only=False),
    Pass("direct_call_pass", "runtime.direct_calls", direct_call_pass, report_only=False),
    Pass("exact_vjp_pass", "runtime.exact_vjps", exact_vjp_pass, report_only=False),
    Pass("rescue_pass", "rescue", rescue_pass, report_only=False),
    # last: the trace it returns carries its own program, which a pass rebuilding the trace would drop
    Pass("unused_grad_pass", None, unused_grad_pass, report_only=False),
)


def guard_trace(
    trace: th.TraceCtx,
    options: GuardOptions,
    report: Report,
    where: TraceContext,
    constants_for: ConstantsFor | None = None,
    measure_region: MeasureRegion | None = None,
    hoisted: HoistLedger | None = None,
    doubt: ModelDoubt | None = None,
    record: Callable[[Decision], None] | None = None,
) -> th.TraceCtx:
    """Return ``trace`` with every rejected region unfused, setitem copies folded, identity ops
    removed and input-independent work hoisted, recording a decision for each region and each op changed.

    Runs the passes of :data:`PASSES` in order, each enabled by its option, and adds their decisions to
    ``report`` once, after the last.
    ``constants_for(device, executor)`` gives the cost model's constants (None: no cost decisions);
    ``measure_region(trace, region)`` times a region the model puts near break-even (None: never);
    ``hoisted`` carries what a forward trace hoisted and saved over to its backward trace; ``doubt`` says
    where the guard does not let the model decide alone and learns from each timing. A region rescued
    while the program runs adds its decision to ``report`` then, through ``record`` where given.
    With ``report_only`` every pass that may runs and records, and the trace comes back unchanged.
    """
    shown = Progress(_progress_task(where))
    context = PassContext(
        options,
        where,
        trace,
        (),
        constants_for,
        measure_region,
        hoisted or HoistLedger(),
        record=record or report.add,
        doubt=doubt,
        progress=shown,
    )
    new_trace = trace
    seen = [trace]  # every trace a pass got: a decision's values may be ones an earlier pass made (a region lowered)
    with shown:
        for step in PASSES:
            if step.enabled(options):
                if new_trace is not seen[-1]:
                    seen.append(new_trace)
                shown.update(step.name.replace("_", " "))
                new_trace, made = run_pass(step, new_trace, context)
                context = replace(context, decided=_merged(context.decided, made))
        shown.update("done", *_regions_done(context.decided, where.trace))
    finders: dict[int, Callable[[list[str]], str | None]] = {}

    def source_of(names: list[str]) -> str | None:
        for t in seen:
            if id(t) not in finders:
                finders[id(t)] = th.source_finder(t)
            found = finders[id(t)](names)
            if found:
                return found
        return None

    for d in context.decided:
        report.add(_located(d, source_of))
    if options.report_only or new_trace is trace:
        return trace
    th.set_provenance(new_trace, f"FusionGuard ({_summary(list(context.decided))})")
    return new_trace


def _progress_task(where: TraceContext) -> str:
    """What a first call's progress line names: the guard, the trace and where it comes from."""
    of = f" of {where.function}" if where.function else ""
    sub = f", subgraph {where.subgraph}" if where.subgraph else ""
    return f"FusionGuard compiling: {where.trace} trace{of}{sub}"


def _regions_done(decided: Sequence[Decision], trace: str) -> tuple[int, int, str]:
    """(regions decided, regions found, "regions") of one trace, for its last progress line."""
    regions = sum(1 for d in decided if d.about_region and d.trace == trace)
    return regions, regions, "regions"


def _located(d: Decision, source_of: Callable[[list[str]], str | None]) -> Decision:
    """``d`` with the user's source line (``details["source"]``) of the region or values it is about, where
    known: what names it for a reader (:attr:`Decision.name`)."""
    if "source" in d.details:
        return d
    names = [d.region, d.details.get("output"), d.details.get("into"), *(d.details.get("outputs") or [])]
    names += [*(d.details.get("regions") or []), *(d.details.get("split") or [])]  # a hoisted piece's regions
    source = source_of([n for n in names if n])
    return instead(d, details={**d.details, "source": source}) if source else d


def _merged(decided: tuple[Decision, ...], made: list[Decision]) -> tuple[Decision, ...]:
    """``decided`` and then ``made``, a decision about a region already decided taking the earlier one's place."""
    out = list(decided)
    at = {(d.trace, d.region): i for i, d in enumerate(out) if d.about_region}
    for d in made:
        i = at.get((d.trace, d.region)) if d.about_region else None
        if i is None:
            if d.about_region:
                at[(d.trace, d.region)] = len(out)
            out.append(d)
        else:
            out[i] = d
    return tuple(out)


def _summary(made: list[Decision]) -> str:
    counts = Counter(d.action for d in made if d.action != "keep")
    text = ", ".join(f"{n} {action}" for action, n in sorted(counts.items())) or "no change"
    direct = sum(d.details.get("call") == DIRECT for d in made)
    return f"{text}; {direct} regions called directly" if direct else text


def run_pass(step: Pass, trace: th.TraceCtx, context: PassContext) -> tuple[th.TraceCtx, list[Decision]]:
    """Run one pass; if it fails or would change the communication ops, keep the trace as it was and return one
    decision saying why in place of the pass's own (strict mode: raise)."""
    try:
        new, made = step.function(trace, context)
    except FusionGuardError:
        raise  # strict mode's own errors, worded where they happen
    except Exception as e:  # a pass is an optimisation: any failure of it keeps the trace as it was, and is reported
        return trace, [_pass_failed(step, e, context)]
    try:
        if new is not trace:
            check_communication(trace, new)
    except CommunicationChanged as e:
        return trace, [_pass_failed(step, e, context)]
    return new, made


def _pass_failed(step: Pass, e: Exception, context: PassContext) -> Decision:
    where = context.where
    if context.options.strict:
        raise pass_failed_error(step.name, where.trace, e) from e
    return pass_failed_decision(where, step.name, e)


def pass_failed_error(step: str, trace: str, e: Exception) -> FusionGuardError:
    """What strict mode raises where pass ``step`` failed on the ``trace`` trace (or would have moved
    communication ops)."""
    if isinstance(e, CommunicationChanged):
        return CommunicationChanged(f"{step} would change the communication of the {trace} trace: {e}")
    return FusionGuardError(f"{step} failed on the {trace} trace: {e}")


def pass_failed_decision(where: TraceContext, step: str, e: Exception) -> Decision:
    """The decision recording that pass ``step`` failed with ``e`` (or would have moved communication ops) and
    left the trace as it was."""
    facts = {"step": step, "moved": isinstance(e, CommunicationChanged)}
    return op_decision(where, "-", "-", [], "keep", "pass_failed", facts, error=f"{type(e).__name__}: {e}")
