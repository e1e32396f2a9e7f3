"""The guard pass: find regions, decide each one, rewrite the rejected ones, record everything."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .. import _thunder as th
from ..cost import CostConstants, Measured
from ..decisions import Decision
from ..ops import hoist_keeps_bits, is_communication, rebuild_keeps_bits, rounding_at_cut
from ..options import GuardOptions
from ..policy import BOOKEND, decide
from ..regions import Region, find_regions
from ..report import Report
from .collectives import communication_changes
from .direct_calls import direct_calls
from .fold import SETITEM, fold_setitem_copies
from .hoist import HoistLedger, check_backward, hoist_constants
from .hoist_runtime import HOISTED_NAME, HoistedValues
from .identity import remove_identities
from .rehome import absorb_metadata_ops, merge_adjacent_regions
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


def guard_trace(
    trace: th.TraceCtx,
    options: GuardOptions,
    report: Report,
    where: TraceContext,
    constants_for: ConstantsFor | None = None,
    measure_region: MeasureRegion | None = None,
    hoisted: HoistLedger | None = None,
) -> th.TraceCtx:
    """Return ``trace`` with every rejected region unfused, setitem copies folded, identity ops
    removed and input-independent work hoisted, recording a decision for each region and each op changed.

    ``constants_for(device, executor)`` gives the cost model's constants (None: no cost decisions);
    ``measure_region(trace, region)`` times a region the model puts near break-even (None: never);
    ``hoisted`` carries what a forward trace hoisted and saved over to its backward trace.
    With ``report_only`` every pass runs and records, and the trace comes back unchanged.
    """
    made: list[Decision] = []
    new_trace = unfuse_rejected(trace, options, made, where, constants_for, measure_region)
    if options.fold_setitem:
        new_trace = _op_pass(fold_pass, new_trace, options, made, where)
    if options.remove_identities:
        new_trace = _op_pass(identity_pass, new_trace, options, made, where)
    if options.rehome:
        new_trace = _op_pass(rehome_pass, new_trace, options, made, where)
    if options.merge_regions:
        new_trace = _op_pass(merge_pass, new_trace, options, made, where)
    if options.hoist:
        new_trace = _op_pass(_hoist_pass(hoisted or HoistLedger()), new_trace, options, made, where)
    if not options.report_only:
        if new_trace is not trace:
            new_trace = th.refresh_dels(new_trace)
        if options.direct_calls:
            new_trace = _op_pass(direct_call_pass, new_trace, options, made, where)
    for d in made:
        report.add(d)
    if options.report_only:
        return trace
    if new_trace is trace:
        return trace
    th.set_provenance(new_trace, f"FusionGuard ({_summary(made)})")
    return new_trace


def _summary(made: list[Decision]) -> str:
    counts = Counter(d.action for d in made if d.action != "keep")
    text = ", ".join(f"{n} {action}" for action, n in sorted(counts.items())) or "no change"
    direct = sum(d.details.get("call") == DIRECT for d in made)
    return f"{text}; {direct} regions called directly" if direct else text


def unfuse_rejected(
    trace: th.TraceCtx,
    options: GuardOptions,
    made: list[Decision],
    where: TraceContext,
    constants_for: ConstantsFor | None = None,
    measure_region: MeasureRegion | None = None,
) -> th.TraceCtx:
    """Decide every region; return ``trace`` with the rejected ones run by the torch executor and the
    switched ones fused by the other fusion executor that was timed faster."""
    replacements: dict[int, list[th.BoundSymbol]] = {}
    decided: list[Decision] = []
    counter = th.free_fusion_counter(trace)
    for region in find_regions(trace):
        device = th.proxy_device(region.inputs + region.outputs)
        constants = constants_for(device, region.executor) if constants_for and device else None
        fuser = th.alternative_fuser(region.bsym) if options.choose_executor and measure_region else None
        other = None if fuser is None else Alternative(fuser, region.bsym, counter)
        other_name = None if other is None else other.name
        verdict = decide(region, options, constants, None, where.compile_options, other_name)
        not_measured = None
        if verdict.measurable and measure_region is not None:
            try:
                measured = measure_region(trace, region, other if verdict.alternative else None)
            except Exception as e:  # measuring is an optimisation: it never breaks compilation
                measured = f"measuring failed: {type(e).__name__}: {e}"
            if isinstance(measured, Measured):
                verdict = decide(region, options, constants, measured, where.compile_options, other_name)
            else:
                not_measured = measured
        decision = _decision(where, region.name, region.executor, region.ops, verdict.action, verdict.reason, op=False)
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
                decision.reason = f"kept as it was: {what} failed ({verdict.reason})"
        decided.append(decision)
    made.extend(decided)
    if not replacements:
        return trace
    try:
        new = replace_regions(trace, replacements, f"FusionGuard: {len(replacements)} regions rejected or switched")
        check_communication(trace, new)
        return new
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
                d.reason = f"kept as it was: {why}"
        return trace


def check_communication(before: th.TraceCtx, after: th.TraceCtx) -> None:
    """Raise :class:`CommunicationChanged` when ``after`` does not run the communication ops of ``before``
    in the same order, with nothing moved across one."""
    problem = communication_changes(before, after)
    if problem is not None:
        raise CommunicationChanged(problem)


OpPass = Callable[[th.TraceCtx, GuardOptions, list[Decision], TraceContext], th.TraceCtx]


def _op_pass(op_pass: OpPass, trace: th.TraceCtx, options: GuardOptions, made: list[Decision], where) -> th.TraceCtx:
    """Run one op-level pass; if it fails, keep the trace as it was and record why (strict: raise)."""
    before = len(made)
    try:
        new = op_pass(trace, options, made, where)
        if new is not trace:
            check_communication(trace, new)
        return new
    except Exception as e:
        moved = isinstance(e, CommunicationChanged)
        if options.strict:
            error = CommunicationChanged if moved else FusionGuardError
            what = "would change the communication of" if moved else "failed on"
            raise error(f"{op_pass.__name__} {what} the {where.trace} trace: {e}") from e
        del made[before:]
        why = "it would change the communication ops" if moved else "it failed"
        failed = _decision(where, "-", "-", [], "keep", f"{op_pass.__name__} skipped: {why}")
        failed.error = f"{type(e).__name__}: {e}"
        made.append(failed)
        return trace


def _may_change(options: GuardOptions) -> Callable[[th.BoundSymbol], bool]:
    """Which fusion calls op passes may rebuild: guarded ones without communication ops, and with
    ``exact_only`` only those a rebuild cannot change the bits of."""

    def may_change(fusion: th.BoundSymbol) -> bool:
        if not options.guards(th.executor_name(fusion)) or is_communication(fusion):
            return False
        return not options.exact_only or rebuild_keeps_bits(list(th.subsymbols(fusion)), options.metadata_ops)

    return may_change


def fold_pass(trace: th.TraceCtx, options: GuardOptions, made: list[Decision], where: TraceContext) -> th.TraceCtx:
    """Fold setitem + copy_ pairs into one in-place setitem."""
    new, folds = fold_setitem_copies(trace, _may_change(options))
    regions = {(d.region, d.trace): d for d in made if d.about_region}
    saves = "one in-place setitem: no clone of the tensor, no copy back"
    for f in folds:
        reason = f"a setitem and the copy_ of its result back into its input, folded into {saves}"
        kept = regions.get((f.region, where.trace)) if f.region else None
        if kept is not None:
            kept.action = "fold"
            kept.reason = f"its lone copy_ writes back the setitem before it: both folded into {saves}"
            kept.applied = not options.report_only
            continue
        d = _decision(where, f.output, "torch", [SETITEM, "copy_"], "fold", reason)
        d.applied = not options.report_only
        made.append(d)
    return new


def identity_pass(trace: th.TraceCtx, options: GuardOptions, made: list[Decision], where: TraceContext) -> th.TraceCtx:
    """Remove identity ops, renaming their uses."""
    new, removals = remove_identities(trace, _may_change(options))
    for r in removals:
        reason = f"identity op ({r.reason}): its uses now read {r.replaced_by}"
        d = _decision(where, r.region or r.output, r.executor, [r.op], "remove", reason)
        d.applied = not options.report_only
        d.details.update(output=r.output, replaced_by=r.replaced_by)
        made.append(d)
    return new


def rehome_pass(trace: th.TraceCtx, options: GuardOptions, made: list[Decision], where: TraceContext) -> th.TraceCtx:
    """Move metadata ops run outside a fusion into the region that alone reads them."""

    def refused(fusion: th.BoundSymbol, op: th.BoundSymbol) -> str | None:
        ex = th.executor_name(fusion)
        if not th.executor_claims(fusion, op):
            return f"{ex} cannot run {th.op_name(op)} (Thunder's executor does not claim it)"
        if ex == "nvfuser" and where.compile_options.get(BOOKEND) is True and not options.override_compile_options:
            return f"the program asked for views at nvFuser region edges to run outside ({BOOKEND}=True)"
        return None

    new, moves = absorb_metadata_ops(trace, _may_change(options), options.metadata_ops, refused)
    for m in moves:
        if m.blocked_by:
            reason = f"metadata op read only by {m.into} kept outside: {m.blocked_by} stands between them"
            d = _decision(where, m.into, m.executor, [m.op], "keep", reason)
        elif m.error:
            reason = f"metadata op read only by {m.into} kept outside: rebuilding {m.into} failed"
            d = _decision(where, m.into, m.executor, [m.op], "keep", reason)
            d.error = m.error
        elif m.skipped:
            d = _decision(where, m.into, m.executor, [m.op], "keep", f"metadata op kept outside {m.into}: {m.skipped}")
        else:
            reason = f"metadata op run outside a fusion and read only by {m.into}: moved into it (no eager dispatch)"
            d = _decision(where, m.into, m.executor, [m.op], "rehome", reason)
            d.applied = not options.report_only
        d.details.update(output=m.moved, into=m.into)
        made.append(d)
    return new


def merge_pass(trace: th.TraceCtx, options: GuardOptions, made: list[Decision], where: TraceContext) -> th.TraceCtx:
    """Merge adjacent regions of one executor into one fusion call."""
    # Opted into knowing the merged code may round differently, so exact_only does not hold it back.
    new, merges = merge_adjacent_regions(
        trace, lambda fusion: options.guards(th.executor_name(fusion)) and not is_communication(fusion)
    )
    for m in merges:
        reason = f"next to {m.into}, same executor, nothing between: merged into it (one fusion call, not two)"
        d = _decision(where, m.moved, m.executor, [], "rehome", reason)
        d.applied = not options.report_only
        d.details.update(into=m.into)
        made.append(d)
    return new


DIRECT = "direct"


def direct_call_pass(trace: th.TraceCtx, options: GuardOptions, made: list[Decision], where: TraceContext):
    """Call each nvFuser region without Thunder's per-call lookup; record how each region is called."""
    new, changes = direct_calls(trace, lambda fusion: options.guards(th.executor_name(fusion)))
    regions = {d.region: d for d in made if d.about_region and d.trace == where.trace}
    for c in changes:
        d = regions.get(c.region)
        if d is not None:
            d.details["call"] = DIRECT if c.direct else f"Thunder's: {c.because}"
    return new


def _hoist_pass(ledger: HoistLedger) -> OpPass:
    def hoist_pass(trace: th.TraceCtx, options: GuardOptions, made: list[Decision], where: TraceContext):
        """Compute input-independent work once per compiled program."""
        if where.trace == "backward":
            for name in check_backward(trace, ledger.take(), options.metadata_ops):
                reason = f"hoisted {name} is saved for the backward, which may write it: computed on every call again"
                made.append(_decision(where, HOISTED_NAME, "fusion_guard", [], "keep", reason))

        def may_rebuild(fusion: th.BoundSymbol, body: list[th.BoundSymbol], crossing: Sequence[th.Proxy]) -> bool:
            if not options.guards(th.executor_name(fusion)):
                return False
            if not options.exact_only:
                return True
            return hoist_keeps_bits(body, options.metadata_ops) and not rounding_at_cut(body, crossing)

        new, pieces, caches = hoist_constants(trace, may_rebuild, options.hoist_max_bytes, options.metadata_ops)
        regions = {(d.region, d.trace): d for d in made if d.about_region}
        saved: dict[str, HoistedValues] = {}
        for index, piece in enumerate(pieces):
            made.append(_hoist_decision(where, index, piece, options))
            if piece.hoisted:
                saved.update({name: caches[piece.call] for name in piece.saved_for_backward})
                for name in piece.regions:
                    kept = regions.get((name, where.trace))
                    if kept is not None:
                        kept.action, kept.applied = "hoist", not options.report_only
                        kept.reason = f"every input is input-independent: run once per compiled program in {piece.call}"
        if where.trace == "forward":
            ledger.forward_done({} if options.report_only else saved)
        return new

    return hoist_pass


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
        reason = (
            f"input-independent: computed once on the first call of this compiled program and reused, "
            f"{piece.ops_saved} ops fewer per call, {kib:.1f} KiB kept{more}"
        )
        d = _decision(where, piece.call, "fusion_guard", piece.ops, "hoist", reason)
        d.applied = not options.report_only
    else:
        d = _decision(
            where, HOISTED_NAME, "fusion_guard", piece.ops, "keep", f"input-independent but not hoisted: {piece.reason}"
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
    where: TraceContext, region: str, executor: str, ops: list[str], action: str, reason: str, *, op: bool = True
) -> Decision:
    """A decision; ``op=True`` (the default) marks one about ops rather than about a whole region."""
    return Decision(
        trace=where.trace,
        region=region,
        executor=executor,
        ops=list(ops),
        action=action,
        reason=reason,
        function=where.function,
        compile_index=where.compile_index,
        subgraph=where.subgraph,
        rank=where.rank,
        details={"scope": "op"} if op else {},
    )
