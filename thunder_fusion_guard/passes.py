"""The guard pass: find regions, decide each one, rewrite the rejected ones, record everything."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from . import _thunder as th
from .cost import CostConstants
from .decide import decide
from .options import GuardOptions
from .regions import find_regions
from .report import Decision, Report
from .rewrite import lower_region, replace_regions


class FusionGuardError(RuntimeError):
    """Raised in strict mode where the default mode would keep a region and record the failure."""


@dataclass(frozen=True)
class TraceContext:
    """Where a trace comes from, for the report."""

    trace: str
    function: str | None = None
    compile_index: int = 0
    subgraph: str | None = None


ConstantsFor = Callable[[str, str], "CostConstants | None"]


def guard_trace(
    trace: th.TraceCtx,
    options: GuardOptions,
    report: Report,
    where: TraceContext,
    constants_for: ConstantsFor | None = None,
) -> th.TraceCtx:
    """Return ``trace`` with every rejected region unfused, recording a decision for each region.

    ``constants_for(device, executor)`` gives the cost model's constants (None: no cost decisions).
    """
    replacements: dict[int, list[th.BoundSymbol]] = {}
    made: list[Decision] = []
    for region in find_regions(trace):
        device = th.proxy_device(region.inputs + region.outputs)
        constants = constants_for(device, region.executor) if constants_for and device else None
        verdict = decide(region, options, constants)
        decision = Decision(
            trace=where.trace,
            region=region.name,
            executor=region.executor,
            ops=region.ops,
            action=verdict.action,
            reason=verdict.reason,
            function=where.function,
            compile_index=where.compile_index,
            subgraph=where.subgraph,
            estimates=dict(verdict.estimates),
            applied=verdict.action == "keep" or not options.report_only,
        )
        if verdict.action == "reject" and decision.applied:
            try:
                replacements[region.position] = lower_region(trace, region)
            except Exception as e:
                if options.strict:
                    raise FusionGuardError(f"could not rewrite {region.name} ({where.trace}): {e}") from e
                decision.action, decision.applied = "keep", True
                decision.error = f"{type(e).__name__}: {e}"
                decision.reason = f"kept as it was: rewriting failed ({verdict.reason})"
        made.append(decision)
    new_trace = trace
    if replacements:
        try:
            new_trace = replace_regions(trace, replacements, f"FusionGuard: {len(replacements)} regions to torch")
        except Exception as e:
            if options.strict:
                raise FusionGuardError(f"could not rebuild the {where.trace} trace: {e}") from e
            for d in made:
                if d.action == "reject" and d.applied:
                    d.action, d.error = "keep", f"{type(e).__name__}: {e}"
                    d.reason = "kept as it was: rebuilding the trace failed"
            new_trace = trace
    for d in made:
        report.add(d)
    return new_trace
