"""Deciding each region's fate. A pure function of the region, the options, the cost constants and, for a
region near break-even, its measurement, so the same program always gets the same trace on one machine
(measurements are cached per region signature)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from . import wording
from .cost import CostConstants, Measured, UnknownSize, estimate
from .ops import (
    exactness_reason,
    inexact_ops,
    is_communication,
    random_ops,
    region_is_metadata_only,
    switch_keeps_bits,
)
from .options import GuardOptions
from .regions import Region

# Compile options by which a program asks Thunder, by name, for what the guard would otherwise undo.
SHAPE_ONLY = "nv_enable_shape_only_fusion"  # shape-only nvFuser regions
BOOKEND = "nv_enable_bookend"  # views at nvFuser region edges run outside the region

# A compute region is timed when eager and fused are estimated within this factor of each other. The
# model's errors seen so far are 2-5x (benchmarks/RESULTS.md, "decision accuracy"); outside 3x its
# verdict was right, and timing every region would cost a compilation per region on CPU. Where the guard
# doubts its constants (ModelDoubt: not calibrated on this machine, or a timing of its own the estimates
# missed by more than this factor) it times every exact region instead, within 'measure_budget_s'.
MEASURE_BAND = 3.0
# A timed region is rejected once eager is faster by more than the timing's own spread, and by at least
# this much (the option 'margin' still caps it), where the timing is what the program sees: calls run
# synchronously (CPU), or eager is no dearer on the host nor on the device, timed apart (CUDA). Elsewhere
# on CUDA, where the host runs ahead of the device, an isolated timing may not be what the stream sees in
# the program: 'margin' holds.
MEASURED_MARGIN_FLOOR = 0.05


def explained(reason: str, explanation: str | None = None) -> tuple[str, dict[str, str]]:
    """A decision's reason, whole on one line (what decided it, first), and the ``details`` holding the longer
    ``explanation`` where there is one that says more; never cut: tables wrap it (:mod:`.render.table`)."""
    short = wording.whole_line(reason)
    full = wording.whole_line(explanation) if explanation is not None else short
    return short, ({"explanation": full} if full != short else {})


def model_error(estimates: Mapping[str, float], measured: Measured) -> float | None:
    """How far the estimated eager/fused ratio is from the measured one, as a factor >= 1 (None: unknown):
    what decides whether a region outside :data:`MEASURE_BAND` could lie on the other side of break-even."""
    est_fused, est_eager = estimates.get("est_region_us"), estimates.get("est_eager_us")
    if not est_fused or not est_eager or measured.region_us <= 0 or measured.eager_us <= 0:
        return None
    off = (est_eager / est_fused) / (measured.eager_us / measured.region_us)
    return max(off, 1 / off)


@dataclass
class ModelDoubt:
    """Why one guard does not let its cost model decide alone where the estimates lie more than
    :data:`MEASURE_BAND` apart, per (device, executor): its constants were not calibrated on this machine,
    or a timing of its own showed the estimates off by more than that band. There it times every exact
    region (``decide(doubt=...)``), within the option ``measure_budget_s``."""

    reasons: dict[tuple[str, str], str] = field(default_factory=dict)

    def why(self, device: str, executor: str) -> str | None:
        """Why the model for ``executor`` on ``device`` is doubted (None: it is not)."""
        return self.reasons.get((device, executor))

    def note(self, device: str, executor: str, reason: str) -> None:
        """Doubt the model for ``executor`` on ``device`` from now on, for ``reason`` (the first one stays)."""
        self.reasons.setdefault((device, executor), reason)

    def learn(
        self, device: str, executor: str, region: str, estimates: Mapping[str, float], measured: Measured
    ) -> None:
        """Doubt the model once a timing of ``region`` shows its eager/fused ratio off by more than the band."""
        off = model_error(estimates, measured)
        if off is not None and off > MEASURE_BAND:
            self.note(
                device,
                executor,
                f"a timing of {region} found the estimated eager/fused ratio {off:.1f}x off "
                f"(more than the {MEASURE_BAND:g}x band)",
            )


@dataclass(frozen=True)
class Verdict:
    """A region's fate, why, the model's numbers, and ``details``: ``decided_by`` (``option``,
    ``metadata``, ``rule``, ``no constants``, ``exactness``, ``model`` or ``measured``), what the model alone said,
    and any measurement. ``measurable``: a measurement would decide it (near break-even, exact);
    ``alternative``: the other fusion executor a measurement may time it with (None: there is none, or it
    may compute other bits)."""

    action: str
    reason: str
    estimates: dict[str, float] = field(default_factory=dict)
    details: dict[str, Any] = field(default_factory=dict)
    measurable: bool = False
    alternative: str | None = None


def decide(
    region: Region,
    options: GuardOptions,
    constants: CostConstants | None = None,
    measured: Measured | None = None,
    compile_options: Mapping[str, Any] | None = None,
    alternative: str | None = None,
    doubt: str | None = None,
) -> Verdict:
    """Keep a region, reject it to the torch executor when its fusion call buys nothing, or switch it to
    the fusion executor ``alternative`` (one that can run all of it) when that runs it faster.

    ``measured`` (a timing of this region on this machine) decides a region the model puts near
    break-even, and any region with an alternative it may switch to; elsewhere the model's estimate decides.
    ``compile_options`` are those the program passed to ``thunder.jit`` by name: a region kind it asked for
    is kept unless ``override_compile_options``. ``doubt`` (:class:`ModelDoubt`'s reason): the model's
    estimates are not trusted to decide alone, so a measurement decides any exact region, however far apart
    its estimates (the decision's ``model_doubted`` says why).
    """
    comms = [op for op, b in zip(region.ops, region.body, strict=True) if is_communication(b)]
    if comms:
        ops = sorted(set(comms))
        why = f"kept by rule: region holds communication ops {ops}: never rewritten or moved"
        return _verdict("keep", f"kept by rule: communication ops {ops}", "rule", why)
    if not options.guards(region.executor):
        return _verdict(
            "keep", f"kept by option: executor {region.executor!r} is not guarded (option 'executors')", "option"
        )
    if region_is_metadata_only(region.body, options.metadata_ops):
        asked = (compile_options or {}).get(SHAPE_ONLY) is True and region.executor == "nvfuser"
        if asked and not options.override_compile_options:
            return _verdict(
                "keep",
                f"kept by option: the program asked for shape-only regions ({SHAPE_ONLY}=True)",
                "option",
                f"kept by option: shape-only region kept: the program asked for them ({SHAPE_ONLY}=True); "
                "FusionGuard(override_compile_options=True) rejects them",
            )
        return _verdict(
            "reject",
            "metadata-only region: PyTorch re-describes tensors without a kernel",
            "metadata",
            "metadata-only region: its ops only re-describe tensors, which PyTorch does without a kernel "
            "or a fusion call",
        )
    if not options.cost_model:
        return _verdict("keep", "kept by option: region computes (cost model off)", "option")
    if constants is None:
        return _verdict(
            "keep",
            f"kept without cost constants for {region.executor!r} here",
            "no constants",
            f"kept without cost constants: region computes; {_no_constants(region.executor, options)}",
        )
    randoms = random_ops(region)
    if randoms:
        return _verdict(
            "keep",
            f"kept by rule: random ops {randoms}",
            "rule",
            f"kept by rule: random ops {randoms}: running them elsewhere would change the random stream",
        )
    try:
        est = estimate(region.body, region.inputs, region.outputs, constants, options.metadata_ops)
    except UnknownSize as e:
        return _verdict("keep", f"kept by rule: cannot estimate: {e}", "rule")
    record = est.as_record()
    inexact = inexact_ops(region, options.metadata_ops) if options.exact_only else []
    model = _by_numbers(est.region_us, est.eager_us, options.margin, "estimated", est.eager_ops)
    ratio = est.eager_us / est.region_us if est.region_us > 0 else float("inf")
    near = 1 / MEASURE_BAND <= ratio <= MEASURE_BAND
    details: dict[str, Any] = {"decided_by": "model", "model_action": model[0]}
    if alternative is not None and options.exact_only and not switch_keeps_bits(region.body, options.metadata_ops):
        details["alternative_not_timed"] = (
            f"{alternative} may compute it with other bits: its ops are not exact whoever runs them "
            "(option 'exact_only')"
        )
        alternative = None
    exactness = short_exactness = None
    if inexact:  # never rejected, whatever the numbers say; timed only to choose its fusion executor
        cheaper = "eager looks cheaper" if est.eager_us < est.region_us else "the fusion looks cheaper"
        exactness = (
            f"kept for exactness: {exactness_reason(inexact)} (option 'exact_only'); "
            f"cost aside: estimated {est.region_us:.1f} µs fused vs {est.eager_us:.1f} µs "
            f"eager ({cheaper})"
        )
        short_exactness = f"kept for exactness: {exactness_reason(inexact)}"
    doubted = doubt is not None and not near and exactness is None
    if doubted:
        details["model_doubted"] = doubt
    measurable = alternative is not None or ((near or doubted) and exactness is None)
    if measured is not None and measurable:
        margin, narrowed = measured_margin(options.margin, measured, constants)
        timed = _by_numbers(measured.region_us, measured.eager_us, margin, "measured", est.eager_ops)
        by_rule = exactness is not None and timed[0] == "reject"  # the rule, not the timing, keeps it
        if by_rule:
            action, reason = "keep", f"{exactness}; measured {measured.region_us:.1f} µs fused"
            short = short_exactness
        elif exactness is not None:  # the timing keeps it anyway: that is the reason
            action, short = timed
            reason = f"measured while compiling: {short}; {_also_inexact(inexact)}"
        else:
            action, short = timed
            why = "near break-even" if near else "another executor could run it"
            if doubted:
                why = f"estimates more than {MEASURE_BAND:g}x apart, but {doubt}"
            reason = (
                f"measured while compiling ({why}): {short}; the model estimated {est.region_us:.1f} µs "
                f"fused vs {est.eager_us:.1f}"
            )
        if margin != options.margin:
            reason += f"; margin narrowed from {options.margin:.0%} to the timing's spread: {narrowed}"
        switched = _switch(region.executor, action, measured, margin)
        if switched is not None:
            action, reason, short = "switch", f"{switched[1]}; {reason}", switched[0]
        by = "exactness" if by_rule and switched is None else "measured"
        short, told = explained(short, reason)
        details = {**details, "decided_by": by, **measured.as_record(), **told}
        return Verdict(action, short, record, details, False, alternative)
    if exactness is not None and model[0] == "keep":  # the cost model keeps it: exactness did not decide
        short, told = explained(f"cost model: {model[1]}", f"cost model: {model[1]}; {_also_inexact(inexact)}")
        return Verdict("keep", short, record, {**details, **told}, measurable, alternative)
    if exactness is not None:
        short, told = explained(short_exactness, exactness)
        return Verdict("keep", short, record, {**details, "decided_by": "exactness", **told}, measurable, alternative)
    unmeasured = "" if near else "; not timed: the estimates are more than 3x apart"
    if doubted:
        unmeasured = f"; the estimates are more than {MEASURE_BAND:g}x apart, but {doubt}"
    short, told = explained(f"cost model: {model[1]}", f"cost model: {model[1]}{unmeasured}")
    return Verdict(model[0], short, record, {**details, **told}, measurable, alternative)


def measured_margin(margin: float, measured: Measured, constants: CostConstants) -> tuple[float, str]:
    """The margin a measured decision uses, and why it is narrower than ``margin`` when it is: the timing's
    spread (at least :data:`MEASURED_MARGIN_FLOOR`) where the timing is what the program sees (calls
    are synchronous, or eager is no dearer on the host nor on the device, each within that spread)."""
    if measured.spread is None:
        return margin, ""
    narrow = min(margin, max(MEASURED_MARGIN_FLOOR, measured.spread))
    if not constants.overlapped:
        return narrow, "calls here are synchronous"
    if measured.host is None or measured.device is None:
        return margin, ""
    (fused_host, eager_host), (fused_device, eager_device) = measured.host, measured.device
    if eager_host <= fused_host * (1 + narrow) and eager_device <= fused_device * (1 + narrow):
        return narrow, (
            f"eager is no dearer on the host ({eager_host:.1f} vs {fused_host:.1f} µs) nor on the device "
            f"({eager_device:.1f} vs {fused_device:.1f} µs), whichever bounds the program"
        )
    return margin, ""


def _switch(executor: str, action: str, measured: Measured, margin: float) -> tuple[str, str] | None:
    """Why the region goes to the other executor ``measured`` timed, when that beats what ``action`` chose
    (its own fusion call, or eager for a reject) by ``margin``, in short and in full; None when it does not."""
    if measured.other is None or measured.other_us is None:
        return None
    chosen, chosen_us = ("eager", measured.eager_us) if action == "reject" else (executor, measured.region_us)
    if measured.other_us >= chosen_us * (1 - margin):
        return None
    short = f"switched to {measured.other}: measured {measured.other_us:.1f} µs there vs {chosen_us:.1f} µs {chosen}"
    return short, (
        f"{short} (margin {margin:.0%}; {measured.region_us:.1f} µs by {executor}, {measured.eager_us:.1f} µs eager)"
    )


def _verdict(action: str, reason: str, decided_by: str, explanation: str | None = None) -> Verdict:
    short, told = explained(reason, explanation)
    return Verdict(action, short, details={"decided_by": decided_by, **told})


def _also_inexact(inexact: list[str]) -> str:
    """What a kept region's inexact ops add when the numbers kept it: they would have kept it too."""
    return f"exactness would keep it too: {exactness_reason(inexact)} (option 'exact_only')"


def _by_numbers(region_us: float, eager_us: float, margin: float, how: str, eager_ops: int) -> tuple[str, str]:
    """Reject when eager is cheaper by at least ``margin``; the reason says which side won and by how much."""
    if eager_us < region_us * (1 - margin):
        return (
            "reject",
            f"eager is cheaper: {how} {eager_us:.1f} µs eager vs {region_us:.1f} µs fused (margin {margin:.0%})",
        )
    if eager_us < region_us:
        saved = 1 - eager_us / region_us
        return "keep", (
            f"eager {how} {saved:.0%} cheaper, under the margin: {eager_us:.1f} µs eager vs {region_us:.1f} µs fused "
            f"(margin {margin:.0%})"
        )
    return "keep", f"fusion call is worth it: {how} {region_us:.1f} µs fused vs {eager_us:.1f} µs eager"


def _no_constants(executor: str, options: GuardOptions) -> str:
    mode = options.calibration
    if mode in ("auto", "measure"):
        why = f"calibration={mode!r} could not measure them (see the thunder_fusion_guard log)"
    elif mode == "shipped":
        why = "none shipped for this device (calibration='shipped')"
    else:
        why = "none cached or shipped for this device (calibration='cached'; run `fusion-guard calibrate`)"
    return f"no cost constants for executor {executor!r} here: {why}"
