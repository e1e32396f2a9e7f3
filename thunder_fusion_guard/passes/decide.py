"""The region pass: each region decided (:func:`..policy.decide`, timed where a timing would decide it), the
rejected ones lowered to Thunder's torch executor and the switched ones fused by the executor timed faster."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from .. import _thunder as th
from ..cost import Measured
from ..decisions import Decision, Details
from ..policy import Verdict, decide
from ..reasons import Facts
from ..regions import Region, find_regions
from .context import (
    Alternative,
    CommunicationChanged,
    FusionGuardError,
    MeasureRegion,
    PassContext,
    check_communication,
)
from .records import instead, region_decision, reworded
from .rewrite import lower_region, replace_regions


def region_pass(trace: th.TraceCtx, context: PassContext) -> tuple[th.TraceCtx, list[Decision]]:
    """Decide every region; return ``trace`` with the rejected ones run by the torch executor and the
    switched ones fused by the other fusion executor that was timed faster."""
    found = find_regions(trace)
    asked = context.options.choose_executor and context.measure_region is not None
    return _decide(trace, context, found, _alternative_fusers(found) if asked else {})


def _alternative_fusers(regions: list[Region]) -> dict[str, Any]:
    """The other fusion executor of each region that has one, by region name (``th.alternative_fuser``)."""
    return {r.name: fuser for r in regions if (fuser := th.alternative_fuser(r.bsym)) is not None}


def merged_region_pass(trace: th.TraceCtx, context: PassContext) -> tuple[th.TraceCtx, list[Decision]]:
    """Decide again each region ``merge_pass`` made, where it may switch executor (``choose_executor``): timed
    whole against the other fusion executor, which may run the merged ops faster than its own (nvFuser may split a
    merged region into many kernels where Inductor makes a few). Its decision takes the place of its last part's,
    whose name it keeps."""
    options, where = context.options, context.where
    if not options.choose_executor or context.measure_region is None:
        return trace, []
    into = {d.region: d.facts["into"] for d in context.decided if d.code == "merged" and d.trace == where.trace}
    parts: dict[str, list[str]] = {}
    for part in into:  # each merged region by the name it kept (its last part's): every region merged into it
        last = part
        while last in into:
            last = into[last]
        parts.setdefault(last, []).append(part)
    found = [r for r in find_regions(trace) if r.name in parts]
    fusers = _alternative_fusers(found)
    if not fusers:
        return trace, []
    new, made = _decide(trace, context, [r for r in found if r.name in fusers], fusers)
    return new, [instead(d, details={**d.details, "merged_from": [*parts[d.region], d.region]}) for d in made]


def _decide(
    trace: th.TraceCtx, context: PassContext, regions: list[Region], fusers: dict[str, Any]
) -> tuple[th.TraceCtx, list[Decision]]:
    """Decide ``regions`` of ``trace``: rejected ones lowered, switched ones fused by the other executor (each
    region's in ``fusers`` by name; a region not there has none to switch to)."""
    options, where = context.options, context.where
    replacements: dict[int, list[th.BoundSymbol]] = {}
    decided: list[Decision] = []
    counter = th.free_fusion_counter(trace)
    shown = context.progress
    for index, region in enumerate(regions):
        shown.update("deciding", index, len(regions), "regions")
        verdict, other, not_measured = _verdict(trace, region, context, counter, fusers.get(region.name))
        details = Details(**verdict.details)
        if not_measured:
            details["not_measured"] = not_measured
        applied = verdict.action == "keep" or not options.report_only
        if verdict.action not in ("reject", "switch"):
            decided.append(_decided(context, region, verdict, details, applied))
            continue
        switch = verdict.action == "switch"
        try:
            if switch:
                replacements[region.position] = [other.bsym()]
                details["switched_to"] = th.op_name(replacements[region.position][0])
                counter += 1
            else:
                replacements[region.position] = lower_region(trace, region)
        except Exception as e:  # a rewrite runs Thunder's trace code, which may raise anything: the region stays fused
            other_name = None if other is None else other.name
            if options.strict:
                change = f"switch {region.name} to {other_name}" if switch else f"rewrite {region.name}"
                raise FusionGuardError(f"could not {change} ({where.trace}): {e}") from e
            what = f"fusing it with {other_name}" if switch else "rewriting"
            facts = {"what": what, "before_code": verdict.code, "before_facts": dict(verdict.facts)}
            error = f"{type(e).__name__}: {e}"
            estimates = dict(verdict.estimates)
            decided.append(
                region_decision(
                    where, region, "keep", "rewrite_failed", facts, details, error=error, estimates=estimates
                )
            )
            continue
        decided.append(_decided(context, region, verdict, details, applied))
    shown.update("deciding", len(regions), len(regions), "regions")
    if not replacements:
        return trace, decided
    try:
        new = replace_regions(trace, replacements, f"FusionGuard: {len(replacements)} regions rejected or switched")
        check_communication(trace, new)
        return new, decided
    except Exception as e:  # rebuilding may fail anywhere in Thunder: the trace stays as it was (strict mode raises)
        moved = isinstance(e, CommunicationChanged)
        if options.strict:
            raise (CommunicationChanged if moved else FusionGuardError)(
                f"could not rebuild the {where.trace} trace: {e}"
            ) from e
        error = f"{type(e).__name__}: {e}"
        return trace, [_kept(d, moved, error) if d.action in ("reject", "switch") else d for d in decided]


def _verdict(
    trace: th.TraceCtx, region: Region, context: PassContext, counter: int, fuser: Any | None
) -> tuple[Verdict, Alternative | None, str | None]:
    """The region's verdict (timed where a timing would decide it), the other fusion executor it may switch to
    (``fuser``, where there is one), and why a region near break-even was not timed (None: it was, or needed not
    be)."""
    options, where, measure_region = context.options, context.where, context.measure_region
    device = th.proxy_device(region.inputs + region.outputs)
    constants = context.constants_for(device, region.executor) if context.constants_for and device else None
    # on Triton's devices torch.compile is timed, and runs a region it wins, with Inductor's combo kernels
    other = None if fuser is None else Alternative(th.combo_kernels_fuser(fuser, device), region.bsym, counter)
    plain = None if fuser is None else Alternative(fuser, region.bsym, counter)  # Inductor's defaults
    other_name = None if other is None else other.name
    doubt = context.doubt.why(device, region.executor) if context.doubt is not None and device else None

    def decided(measured: Measured | None) -> Verdict:
        return decide(region, options, constants, measured, where.compile_options, other_name, doubt, where.captured)

    verdict = decided(None)
    if measure_region is None:
        return verdict, other, None
    if not verdict.measurable:
        cached = getattr(measure_region, "cached", None)
        earlier = cached(trace, region) if verdict.code == "cost_model" and cached is not None else None
        if earlier is None:
            return verdict, other, None
        verdict = decided(earlier)
        return verdict, other, None
    measured = _measured(trace, region, measure_region, other if verdict.alternative else None)
    combo_failed, inductor_options = None, th.inductor_options(other.executor) if other else {}
    if isinstance(measured, Measured) and measured.other_problem and inductor_options:
        # Inductor failed with the options: torch.compile is timed again with its defaults
        combo_failed, other, inductor_options = measured.other_problem, plain, {}
        measured = _measured(trace, region, measure_region, other)
    if isinstance(measured, Measured):
        if context.doubt is not None and device:
            context.doubt.learn(device, region.executor, region.name, verdict.estimates, measured)
        verdict = decided(measured)
    lost = inductor_options and isinstance(measured, Measured) and measured.other_us is not None
    if lost and verdict.action != "switch":  # combo kernels lost: torch.compile with its defaults may win
        timed = _timed_plain(trace, region, context, plain, measured, decided)
        if isinstance(timed, tuple):  # it won: it takes the region
            (verdict, measured), other, inductor_options = timed, plain, {}
        elif timed:  # it lost too, or could not be timed: recorded beside the verdict
            verdict = replace(verdict, details={**verdict.details, "plain_timed": timed})
    if combo_failed:  # why torch.compile was timed (or was to be timed) with its defaults
        verdict = replace(verdict, details={**verdict.details, "inductor_options_failed": combo_failed})
    if verdict.action == "switch" and inductor_options:
        verdict = replace(verdict, facts=Facts(**verdict.facts, inductor_options=inductor_options))
    return verdict, other, None if isinstance(measured, Measured) else measured


def _timed_plain(
    trace: th.TraceCtx,
    region: Region,
    context: PassContext,
    plain: Alternative,
    combo: Measured,
    decided: Callable[[Measured], Verdict],
) -> tuple[Verdict, Measured] | dict[str, Any]:
    """Where torch.compile with combo kernels lost (``combo``), ``plain`` torch.compile, with Inductor's defaults,
    timed: its verdict and timing when it wins (launched as one, independent kernels can be slower than apart);
    else its µs, or why it was not timed (``problem``), for the record."""
    again = _measured(trace, region, context.measure_region, plain)
    if not isinstance(again, Measured):
        return {"problem": again}
    if again.other_problem:
        return {"problem": again.other_problem}
    verdict = decided(again)
    if verdict.action != "switch":
        return _timed_us(again)
    return replace(verdict, details={**verdict.details, "combo_kernels_timed": _timed_us(combo)}), again


def _timed_us(measured: Measured) -> dict[str, float]:
    """The other executor's µs of ``measured`` (wall, and device where timed), rounded for the record."""
    timed = {"other_us": measured.other_us, "other_device_us": measured.other_device_us}
    return {key: round(us, 3) for key, us in timed.items() if us is not None}


def _measured(
    trace: th.TraceCtx, region: Region, measure_region: MeasureRegion, other: Alternative | None
) -> Measured | str:
    """``measure_region``'s timing of ``region`` (with ``other``), or why there is none."""
    try:
        return measure_region(trace, region, other)
    except Exception as e:  # measuring is an optimisation: it never breaks compilation
        return f"measuring failed: {type(e).__name__}: {e}"


def _decided(context: PassContext, region: Region, verdict: Verdict, details: Details, applied: bool) -> Decision:
    return region_decision(
        context.where,
        region,
        verdict.action,
        verdict.code,
        verdict.facts,
        details,
        applied=applied,
        estimates=dict(verdict.estimates),
    )


def _kept(d: Decision, moved: bool, error: str) -> Decision:
    """``d``, a reject or switch, kept as it was: rebuilding the trace failed, or would change its communication."""
    facts = {"moved": moved, "before_code": d.code, "before_facts": dict(d.facts)}
    return reworded(d, "rebuild_failed", facts, action="keep", error=error)
