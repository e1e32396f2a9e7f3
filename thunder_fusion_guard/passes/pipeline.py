"""The guard pass: find regions, decide each one, rewrite the rejected ones, record everything."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from .. import _thunder as th
from ..cost import CostConstants, Measured
from ..decisions import Decision
from ..ops import (
    ELEMENTWISE_ROUNDING_OPS,
    contractible_products,
    contracts,
    hoist_inexact_ops,
    hoist_keeps_bits,
    is_communication,
    rebuild_keeps_bits,
    rounding_at_cut,
)
from ..options import GuardOptions
from ..policy import BOOKEND, ModelDoubt, decide, explained
from ..progress import Progress
from ..regions import Region, find_regions
from ..report import Report
from ..wording import error_line, error_text
from .collectives import communication_changes
from .direct_calls import direct_calls
from .fold import SETITEM, fold_setitem_copies
from .hoist import HoistLedger, Refusal, check_backward, hoist_constants
from .hoist_runtime import HOISTED_NAME, HoistedValues
from .identity import remove_identities
from .rehome import absorb_metadata_ops, merge_adjacent_regions
from .rescue import announce, describe_inputs, nvfuser_reproduction, rescue_calls
from .rewrite import lower_region, replace_regions


class FusionGuardError(RuntimeError):
    """Raised in strict mode where the default mode would keep a region and record the failure."""


class CommunicationChanged(FusionGuardError):
    """A pass would have added, dropped, reordered or moved something across a communication op."""


@dataclass(frozen=True)
class TraceContext:
    """Where a trace comes from, for the report."""

    trace: str
    function: str | None = None
    compile_index: int = 0
    subgraph: str | None = None
    compile_options: Mapping[str, Any] = field(default_factory=dict)  # passed to thunder.jit by name
    rank: int | None = None


ConstantsFor = Callable[[str, str], "CostConstants | None"]


@dataclass
class Alternative:
    """A region fused by another fusion ``executor`` as number ``counter``, built on first use and kept: the
    symbol a measurement times is the one a switch puts into the trace (one build, one compile)."""

    executor: Any
    fusion: th.BoundSymbol
    counter: int
    _built: th.BoundSymbol | None = None

    @property
    def name(self) -> str:
        return self.executor.name

    def bsym(self) -> th.BoundSymbol:
        if self._built is None:
            self._built = th.fuse_with(self.executor, self.fusion, self.counter)
        return self._built


# Times a region on this machine (with, given, the region fused by another executor): a measurement, or why
# there is none.
MeasureRegion = Callable[[th.TraceCtx, Region, "Alternative | None"], "Measured | str"]


@dataclass(frozen=True)
class PassContext:
    """What a pass reads besides its trace: the options, where the trace comes from, the trace the guard was
    given, the decisions of the passes before it (read only), what the region pass and hoisting need, and
    ``record``, which takes a decision made later, while the program runs (a region rescued at a call)."""

    options: GuardOptions
    where: TraceContext
    original: th.TraceCtx
    decided: tuple[Decision, ...] = ()
    constants_for: ConstantsFor | None = None
    measure_region: MeasureRegion | None = None
    hoisted: HoistLedger = field(default_factory=HoistLedger)
    record: Callable[[Decision], None] | None = None
    doubt: ModelDoubt | None = None
    progress: Progress = field(default_factory=Progress.off)

    def region_decisions(self) -> dict[str, Decision]:
        """The decisions so far about each region of this trace, by region name."""
        return {d.region: d for d in self.decided if d.about_region and d.trace == self.where.trace}


# A pass: the trace it was given, or a new one, and the decisions it made. A decision about a whole region
# replaces the earlier one about that region (a pass that changes a region's fate returns its new decision).
PassFunction = Callable[[th.TraceCtx, PassContext], tuple[th.TraceCtx, list[Decision]]]


@dataclass(frozen=True)
class Pass:
    """One step of :func:`guard_trace`: its name (the report names a failed pass by it), the option that turns it
    on (None: always on), and whether it runs in ``report_only`` mode too (it then records what it would do)."""

    name: str
    option: str | None
    function: PassFunction
    report_only: bool = True

    def enabled(self, options: GuardOptions) -> bool:
        on = self.option is None or bool(getattr(options, self.option))
        return on and (self.report_only or not options.report_only)


def guard_trace(
    trace: th.TraceCtx,
    options: GuardOptions,
    report: Report,
    where: TraceContext,
    constants_for: ConstantsFor | None = None,
    measure_region: MeasureRegion | None = None,
    hoisted: HoistLedger | None = None,
    doubt: ModelDoubt | None = None,
) -> th.TraceCtx:
    """Return ``trace`` with every rejected region unfused, setitem copies folded, identity ops
    removed and input-independent work hoisted, recording a decision for each region and each op changed.

    Runs the passes of :data:`PASSES` in order, each enabled by its option, and adds their decisions to
    ``report`` once, after the last.
    ``constants_for(device, executor)`` gives the cost model's constants (None: no cost decisions);
    ``measure_region(trace, region)`` times a region the model puts near break-even (None: never);
    ``hoisted`` carries what a forward trace hoisted and saved over to its backward trace; ``doubt`` says
    where the guard does not let the model decide alone and learns from each timing. A region rescued
    while the program runs adds its decision to ``report`` then.
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
        record=report.add,
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
        _locate(d, source_of)
        report.add(d)
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


def _locate(d: Decision, source_of: Callable[[list[str]], str | None]) -> None:
    """Give ``d`` the user's source line (``details["source"]``) of the region or values it is about, where
    known: what names it for a reader (:attr:`Decision.name`)."""
    if "source" in d.details:
        return
    names = [d.region, d.details.get("output"), d.details.get("into"), *(d.details.get("outputs") or [])]
    names += [*(d.details.get("regions") or []), *(d.details.get("split") or [])]  # a hoisted piece's regions
    source = source_of([n for n in names if n])
    if source:
        d.details["source"] = source


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
    except Exception as e:
        return trace, [_pass_failed(step, e, context)]
    try:
        if new is not trace:
            check_communication(trace, new)
    except CommunicationChanged as e:
        return trace, [_pass_failed(step, e, context)]
    return new, made


def _pass_failed(step: Pass, e: Exception, context: PassContext) -> Decision:
    moved = isinstance(e, CommunicationChanged)
    where = context.where
    if context.options.strict:
        error = CommunicationChanged if moved else FusionGuardError
        what = "would change the communication of" if moved else "failed on"
        raise error(f"{step.name} {what} the {where.trace} trace: {e}") from e
    why = "it would change the communication ops" if moved else "it failed"
    failed = _op_decision(where, "-", "-", [], "keep", f"{step.name} skipped: {why}")
    failed.error = f"{type(e).__name__}: {e}"
    return failed


def region_pass(trace: th.TraceCtx, context: PassContext) -> tuple[th.TraceCtx, list[Decision]]:
    """Decide every region; return ``trace`` with the rejected ones run by the torch executor and the
    switched ones fused by the other fusion executor that was timed faster."""
    options, where, measure_region = context.options, context.where, context.measure_region
    replacements: dict[int, list[th.BoundSymbol]] = {}
    decided: list[Decision] = []
    counter = th.free_fusion_counter(trace)
    regions = find_regions(trace)
    shown = context.progress
    for index, region in enumerate(regions):
        shown.update("deciding", index, len(regions), "regions")
        device = th.proxy_device(region.inputs + region.outputs)
        constants = context.constants_for(device, region.executor) if context.constants_for and device else None
        fuser = th.alternative_fuser(region.bsym) if options.choose_executor and measure_region else None
        other = None if fuser is None else Alternative(fuser, region.bsym, counter)
        other_name = None if other is None else other.name
        doubt = context.doubt.why(device, region.executor) if context.doubt is not None and device else None
        verdict = decide(region, options, constants, None, where.compile_options, other_name, doubt)
        not_measured = None
        if verdict.measurable and measure_region is not None:
            try:
                measured = measure_region(trace, region, other if verdict.alternative else None)
            except Exception as e:  # measuring is an optimisation: it never breaks compilation
                measured = f"measuring failed: {type(e).__name__}: {e}"
            if isinstance(measured, Measured):
                if context.doubt is not None and device:
                    context.doubt.learn(device, region.executor, region.name, verdict.estimates, measured)
                verdict = decide(region, options, constants, measured, where.compile_options, other_name, doubt)
            else:
                not_measured = measured
        decision = _region_decision(where, region, verdict.action, verdict.reason)
        decision.estimates = dict(verdict.estimates)
        decision.details.update(verdict.details)
        if not_measured:
            decision.details["not_measured"] = not_measured
        decision.applied = verdict.action == "keep" or not options.report_only
        if verdict.action in ("reject", "switch"):
            switch = verdict.action == "switch"
            try:
                if switch:
                    replacements[region.position] = [other.bsym()]
                    decision.details["switched_to"] = th.op_name(replacements[region.position][0])
                    counter += 1
                else:
                    replacements[region.position] = lower_region(trace, region)
            except Exception as e:
                what = f"fusing it with {other_name}" if switch else "rewriting"
                if options.strict:
                    change = f"switch {region.name} to {other_name}" if switch else f"rewrite {region.name}"
                    raise FusionGuardError(f"could not {change} ({where.trace}): {e}") from e
                decision.action, decision.applied = "keep", True
                decision.error = f"{type(e).__name__}: {e}"
                decision.reason = f"kept as it was: {what} failed"
                explanation = verdict.details.get("explanation", verdict.reason)
                decision.details["explanation"] = f"kept as it was: {what} failed ({explanation})"
        decided.append(decision)
    shown.update("deciding", len(regions), len(regions), "regions")
    if not replacements:
        return trace, decided
    try:
        new = replace_regions(trace, replacements, f"FusionGuard: {len(replacements)} regions rejected or switched")
        check_communication(trace, new)
        return new, decided
    except Exception as e:
        moved = isinstance(e, CommunicationChanged)
        if options.strict:
            raise (CommunicationChanged if moved else FusionGuardError)(
                f"could not rebuild the {where.trace} trace: {e}"
            ) from e
        for d in decided:
            if d.action in ("reject", "switch"):
                d.action, d.error = "keep", f"{type(e).__name__}: {e}"
                why = "it would change the communication ops" if moved else "rebuilding the trace failed"
                d.details["explanation"] = f"kept as it was: {why} ({d.details.get('explanation', d.reason)})"
                d.reason = f"kept as it was: {why}"
        return trace, decided


def check_communication(before: th.TraceCtx, after: th.TraceCtx) -> None:
    """Raise :class:`CommunicationChanged` when ``after`` does not run the communication ops of ``before``
    in the same order, with nothing moved across one."""
    problem = communication_changes(before, after)
    if problem is not None:
        raise CommunicationChanged(problem)


def _may_change(options: GuardOptions) -> Callable[[th.BoundSymbol], bool]:
    """Which fusion calls op passes may rebuild: guarded ones without communication ops, and with
    ``exact_only`` only those a rebuild cannot change the bits of."""

    def may_change(fusion: th.BoundSymbol) -> bool:
        if not options.guards(th.executor_name(fusion)) or is_communication(fusion):
            return False
        return not options.exact_only or rebuild_keeps_bits(list(th.subsymbols(fusion)), options.metadata_ops)

    return may_change


def _instead(earlier: Decision, **changes: Any) -> Decision:
    """A new decision about the region of ``earlier``, which stays as it was: its fields with ``changes``."""
    copies = {"ops": list(earlier.ops), "estimates": dict(earlier.estimates), "details": dict(earlier.details)}
    return replace(earlier, **{**copies, **changes})


def fold_pass(trace: th.TraceCtx, context: PassContext) -> tuple[th.TraceCtx, list[Decision]]:
    """Fold setitem + copy_ pairs into one in-place setitem."""
    options, where = context.options, context.where
    new, folds = fold_setitem_copies(trace, _may_change(options))
    regions = context.region_decisions()
    saves = "one in-place setitem: no clone of the tensor, no copy back"
    made = []
    for f in folds:
        kept = regions.get(f.region) if f.region else None
        if kept is not None:
            reason, told = explained(
                "setitem + its copy_ back folded into one in-place setitem",
                f"its lone copy_ writes back the setitem before it: both folded into {saves}",
            )
            details = {**kept.details, **told}
            made.append(_instead(kept, action="fold", reason=reason, applied=not options.report_only, details=details))
            continue
        reason = "setitem + the copy_ of its result back folded into one in-place setitem"
        explanation = f"a setitem and the copy_ of its result back into its input, folded into {saves}"
        d = _op_decision(where, f.output, "torch", [SETITEM, "copy_"], "fold", reason, explanation)
        d.applied = not options.report_only
        made.append(d)
    return new, made


def identity_pass(trace: th.TraceCtx, context: PassContext) -> tuple[th.TraceCtx, list[Decision]]:
    """Remove identity ops, renaming their uses."""
    new, removals = remove_identities(trace, _may_change(context.options))
    made = []
    for r in removals:
        reason = f"identity op ({r.reason}): its uses now read {r.replaced_by}"
        d = _op_decision(context.where, r.region or r.output, r.executor, [r.op], "remove", reason)
        d.applied = not context.options.report_only
        d.details.update(output=r.output, replaced_by=r.replaced_by)
        made.append(d)
    return new, made


def rehome_pass(trace: th.TraceCtx, context: PassContext) -> tuple[th.TraceCtx, list[Decision]]:
    """Move metadata ops run outside a fusion into the region that alone reads them."""
    options, where = context.options, context.where

    def refused(fusion: th.BoundSymbol, op: th.BoundSymbol) -> str | None:
        ex = th.executor_name(fusion)
        if not th.executor_claims(fusion, op):
            return f"{ex} cannot run {th.op_name(op)} (Thunder's executor does not claim it)"
        if ex == "nvfuser" and where.compile_options.get(BOOKEND) is True and not options.override_compile_options:
            return f"the program asked for views at nvFuser region edges to run outside ({BOOKEND}=True)"
        return None

    new, moves = absorb_metadata_ops(trace, _may_change(options), options.metadata_ops, refused)
    made = []
    for m in moves:
        if m.blocked_by:
            reason = f"kept outside {m.into}: {m.blocked_by} stands between them"
            explanation = f"metadata op read only by {m.into} kept outside: {m.blocked_by} stands between them"
            d = _op_decision(where, m.into, m.executor, [m.op], "keep", reason, explanation)
        elif m.error:
            reason = f"metadata op read only by {m.into} kept outside: rebuilding {m.into} failed"
            d = _op_decision(where, m.into, m.executor, [m.op], "keep", reason)
            d.error = m.error
        elif m.skipped:
            reason = f"kept outside {m.into}: {m.skipped}"
            d = _op_decision(where, m.into, m.executor, [m.op], "keep", reason, f"metadata op {reason}")
        else:
            reason = f"metadata op read only by {m.into}: moved into it (no eager dispatch)"
            explanation = (
                f"metadata op run outside a fusion and read only by {m.into}: moved into it (no eager dispatch)"
            )
            d = _op_decision(where, m.into, m.executor, [m.op], "rehome", reason, explanation)
            d.applied = not options.report_only
        d.details.update(output=m.moved, into=m.into)
        made.append(d)
    return new, made


def merge_pass(trace: th.TraceCtx, context: PassContext) -> tuple[th.TraceCtx, list[Decision]]:
    """Merge adjacent regions of one executor into one fusion call."""
    options = context.options
    # Opted into knowing the merged code may round differently, so exact_only does not hold it back.
    new, merges = merge_adjacent_regions(
        trace, lambda fusion: options.guards(th.executor_name(fusion)) and not is_communication(fusion)
    )
    made = []
    for m in merges:
        reason = f"merged into {m.into}: next to it, same executor (one fusion call, not two)"
        explanation = f"next to {m.into}, same executor, nothing between: merged into it (one fusion call, not two)"
        d = _op_decision(context.where, m.moved, m.executor, [], "rehome", reason, explanation)
        d.applied = not options.report_only
        d.details.update(into=m.into)
        made.append(d)
    return new, made


def hoist_pass(trace: th.TraceCtx, context: PassContext) -> tuple[th.TraceCtx, list[Decision]]:
    """Compute input-independent work once per compiled program."""
    options, where, ledger = context.options, context.where, context.hoisted
    made = []
    if where.trace == "backward":
        for name in check_backward(trace, ledger.take(), options.metadata_ops):
            reason = f"hoisted {name} may be written by the backward: computed on every call again"
            explanation = f"hoisted {name} is saved for the backward, which may write it: computed on every call again"
            made.append(_op_decision(where, HOISTED_NAME, "fusion_guard", [], "keep", reason, explanation))

    def may_rebuild(fusion: th.BoundSymbol, body: list[th.BoundSymbol], crossing: Sequence[th.Proxy]) -> Refusal | None:
        return _rebuild_refusal(fusion, body, crossing, options)

    new, pieces, caches = hoist_constants(trace, may_rebuild, options.hoist_max_bytes, options.metadata_ops)
    regions = context.region_decisions()
    saved: dict[str, HoistedValues] = {}
    for index, piece in enumerate(pieces):
        made.append(_hoist_decision(where, index, piece, options))
        if piece.hoisted:
            saved.update({name: caches[piece.call] for name in piece.saved_for_backward})
            for name in piece.regions:
                kept = regions.get(name)
                if kept is not None:
                    reason, told = explained(
                        f"input-independent: run once per compiled program in {piece.call}",
                        f"every input is input-independent: run once per compiled program in {piece.call}",
                    )
                    applied = not options.report_only
                    details = {**kept.details, **told}
                    made.append(_instead(kept, action="hoist", applied=applied, reason=reason, details=details))
    if where.trace == "forward":
        ledger.forward_done({} if options.report_only else saved)
    return new, made


def _rebuild_refusal(
    fusion: th.BoundSymbol, body: list[th.BoundSymbol], crossing: Sequence[th.Proxy], options: GuardOptions
) -> Refusal | None:
    """Why hoisting may not rebuild ``fusion`` with ``body`` (handing ``crossing`` across the cut), and the option
    setting that would let it; None where it may. The words are the region's, the same for each piece of it."""
    region, executor = fusion.sym.name, th.executor_name(fusion)
    if not options.guards(executor):
        return Refusal(f"{region} runs on {executor}, which the executors option leaves unguarded", "executors=None")
    if not options.exact_only:
        return None
    cut = rounding_at_cut(body, crossing)
    device = th.proxy_device([*fusion.flat_proxy_outs, *fusion.flat_proxy_args])
    fma = contractible_products(body) if contracts(executor, device) else []
    if not cut and not fma and hoist_keeps_bits(body, options.metadata_ops, executor):
        return None
    inexact = hoist_inexact_ops(th.fusion_body(fusion), options.metadata_ops, executor)
    per_element = [n for n in inexact if n in ELEMENTWISE_ROUNDING_OPS]
    how = f" ({executor} computes {per_element} by code that depends on the fusion around them)" if per_element else ""
    why = [f"ops {inexact} could round differently once rebuilt{how}"] if inexact else []
    if fma:
        why.append(
            f"products {fma} are read by an addition, which {executor} contracts into one multiply-add or not "
            "depending on how it segments the rebuilt fusion"
        )
    return Refusal(f"splitting {region} could change its bits: {'; '.join([*why, *cut])}", "exact_only=False")


def dels_pass(trace: th.TraceCtx, context: PassContext) -> tuple[th.TraceCtx, list[Decision]]:
    """Re-derive the ``del`` statements of a trace the passes before changed."""
    return (trace if trace is context.original else th.refresh_dels(trace)), []


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
            made.append(_instead(d, details={**d.details, "call": call}))
    return new, made


def rescue_pass(trace: th.TraceCtx, context: PassContext) -> tuple[th.TraceCtx, list[Decision]]:
    """Call each region so that, should its fusion fail to compile or to run, Thunder's torch executor runs it
    instead, and the failure is recorded then (strict mode: the failure is raised as it was)."""
    options, where, record = context.options, context.where, context.record
    if options.strict or record is None:
        return trace, []

    def may_rescue(fusion: th.BoundSymbol) -> bool:
        return options.guards(th.executor_name(fusion)) and not is_communication(fusion)

    def on_rescue(region: Region, error: Exception, args: tuple) -> None:
        decision = _rescue_decision(where, region, error, args)
        record(decision)
        announce(decision)

    def on_strided_write(region: Region, args: tuple, at: list[int]) -> None:
        decision = _strided_write_decision(where, region, args, at)
        record(decision)
        announce(decision)

    new, wraps = rescue_calls(trace, may_rescue, on_rescue, on_strided_write)
    regions = context.region_decisions()
    unwrapped = [(regions.get(w.region), w.because) for w in wraps if not w.changed]
    return new, [_instead(d, details={**d.details, "rescue": f"none: {why}"}) for d, why in unwrapped if d]


def _rescue_decision(where: TraceContext, region: Region, error: Exception, args: tuple) -> Decision:
    explanation = (
        f"{region.executor} failed on {region.name} ({error_line(error)}); Thunder's torch executor runs its "
        f"{len(region.ops)} ops one by one from then on, as a rejected region's"
    )
    d = _region_decision(where, region, "rescue", error_line(error))
    d.error = error_text(error)
    d.details.update(
        explanation=explanation,
        rescued_by="Thunder's torch executor",
        error_type=type(error).__name__,
        inputs=describe_inputs(args),
    )
    _add_source(d, region)
    reproduction = nvfuser_reproduction(th.region_callable(region.bsym), args, f"{region.name} ({where.trace})")
    if reproduction:
        d.details["reproduction"] = reproduction
    return d


def _strided_write_decision(where: TraceContext, region: Region, args: tuple, at: list[int]) -> Decision:
    names = ", ".join(region.bsym.args[i].name for i in at)
    d = _region_decision(where, region, "rescue", f"{region.executor} loses writes into non-contiguous input {names}")
    d.details.update(
        explanation=(
            f"{region.name} writes its input {names}, which is not contiguous (a narrow or slice of a wider tensor); "
            f"{region.executor} loses or misplaces a write into such an input (seen: a narrow of zeros left zeros), "
            "so unguarded the input keeps its old values. Where such an input is not contiguous, the fusion writes a "
            "contiguous copy, copied into the input after the call: the values the fusion computes, where the "
            "program puts them"
        ),
        rescued_by=f"{region.executor}, through a contiguous copy of the input it writes",
        inputs=describe_inputs(args),
    )
    _add_source(d, region)
    return d


def _add_source(d: Decision, region: Region) -> None:
    """``d``'s details get the user's source line of ``region``'s first op, where the trace knows one."""
    source = th.source_line(*region.body)
    if source:
        d.details["source"] = source


# The passes of guard_trace, in order: (name, the option that turns it on, the function, runs in report_only).
PASSES: tuple[Pass, ...] = (
    Pass("region_pass", None, region_pass),
    Pass("fold_pass", "fold_setitem", fold_pass),
    Pass("identity_pass", "remove_identities", identity_pass),
    Pass("rehome_pass", "rehome", rehome_pass),
    Pass("merge_pass", "merge_regions", merge_pass),
    Pass("hoist_pass", "hoist", hoist_pass),
    Pass("dels_pass", None, dels_pass, report_only=False),
    Pass("direct_call_pass", "direct_calls", direct_call_pass, report_only=False),
    Pass("rescue_pass", "rescue", rescue_pass, report_only=False),
)


def _hoist_decision(where: TraceContext, index: int, piece, options: GuardOptions) -> Decision:
    kib = piece.nbytes / 1024
    if piece.hoisted:
        what = []
        if piece.same_as is not None:
            what.append(f"the same as piece {piece.same_as}: hands out its tensors")
        if piece.split:
            what.append(f"taken out of {', '.join(piece.split)}")
        if piece.duplicated:
            what.append(f"computed again from {', '.join(piece.duplicated)}, which is left whole")
        more = f"; {'; '.join(what)}" if what else ""
        reason = f"input-independent: computed once, reused: {piece.ops_saved} ops fewer per call, {kib:.1f} KiB kept"
        explanation = (
            f"input-independent: computed once on the first call of this compiled program and reused, "
            f"{piece.ops_saved} ops fewer per call, {kib:.1f} KiB kept{more}"
        )
        d = _op_decision(where, piece.call, "fusion_guard", piece.ops, "hoist", reason, explanation)
        d.applied = not options.report_only
    elif piece.option:
        reason = f"input-independent, not hoisted ({piece.option} would): {piece.reason}"
        explanation = (
            f"input-independent, not hoisted: {piece.reason}; {piece.option} would hoist it: {piece.ops_saved} ops "
            f"fewer per call, {kib:.1f} KiB kept"
        )
        d = _op_decision(where, HOISTED_NAME, "fusion_guard", piece.ops, "keep", reason, explanation)
        d.details["would_hoist_with"] = piece.option
    else:
        d = _op_decision(
            where, HOISTED_NAME, "fusion_guard", piece.ops, "keep", f"input-independent, not hoisted: {piece.reason}"
        )
    d.details.update(
        piece=index,
        same_as=piece.same_as,
        bytes=piece.nbytes,
        ops_saved_per_call=piece.ops_saved,
        calls_saved_per_call=piece.calls_saved,
        fused_ops_saved_per_call=piece.fused_ops_saved,
        outputs=list(piece.outputs),
        regions=list(piece.regions),
        split=list(piece.split),
        duplicated=list(piece.duplicated),
        saved_for_backward=list(piece.saved_for_backward),
    )
    return d


def _decision(
    where: TraceContext, region: str, executor: str, ops: list[str], action: str, reason: str, **more: Any
) -> Decision:
    """A decision placed where ``where`` says (trace, function, compiled program, subgraph, rank); ``more``:
    further Decision fields."""
    return Decision(
        trace=where.trace,
        region=region,
        executor=executor,
        ops=ops,
        action=action,
        reason=reason,
        function=where.function,
        compile_index=where.compile_index,
        subgraph=where.subgraph,
        rank=where.rank,
        **more,
    )


def _op_decision(
    where: TraceContext, region: str, executor: str, ops: list[str], action: str, reason: str, explanation: str = ""
) -> Decision:
    """A decision about ops (``details["scope"] == "op"``), not about a whole region; ``reason`` is cut to one
    short line, the whole of it (or ``explanation``) kept in ``details["explanation"]``."""
    reason, told = explained(reason, explanation or None)
    return _decision(where, region, executor, list(ops), action, reason, details={"scope": "op", **told})


def _region_decision(where: TraceContext, region: Region, action: str, reason: str) -> Decision:
    """A decision about the whole ``region``."""
    return _decision(where, region.name, region.executor, region.ops, action, reason)
