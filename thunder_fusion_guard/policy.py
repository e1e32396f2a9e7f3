"""Deciding each region's fate. A pure function of the region, the options, the cost constants and, for a
region near break-even, its measurement, so the same program always gets the same trace on one machine
(measurements are cached per region signature)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from . import reasons
from .cost import CostConstants, Measured, UnknownSize, estimate
from .ops import (
    inexact_ops,
    is_communication,
    random_ops,
    region_is_metadata_only,
    switch_keeps_bits,
)
from .options import GuardOptions
from .reasons import Doubt, Facts, Narrowing, Outcome, ReasonCode
from .regions import Region

# Compile options by which a program asks Thunder, by name, for what the guard would otherwise undo.
SHAPE_ONLY = "nv_enable_shape_only_fusion"  # shape-only nvFuser regions
BOOKEND = "nv_enable_bookend"  # views at nvFuser region edges run outside the region

# A compute region is timed when eager and fused are estimated within this factor of each other. The
# model's errors seen so far are 2-5x (benchmarks/RESULTS.md, "decision accuracy"); outside 3x its
# verdict was right, and timing every region would cost a compilation per region on CPU. Where the guard
# doubts its constants (ModelDoubt: not calibrated on this machine, or a timing of its own the estimates
# missed by more than this factor) it times every exact region instead, within 'costs.measure_budget_s'.
MEASURE_BAND = 3.0
# A timed region is rejected once eager is faster by more than the timing's own spread, and by at least
# this much (the option 'costs.margin' still caps it), where the timing is what the program sees: calls run
# synchronously (CPU), or eager is no dearer on the host nor on the device, timed apart (CUDA). Elsewhere
# on CUDA, where the host runs ahead of the device, an isolated timing may not be what the stream sees in
# the program: 'costs.margin' holds.
MEASURED_MARGIN_FLOOR = 0.05


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
    region (``decide(doubt=...)``), within the option ``costs.measure_budget_s``."""

    reasons: dict[tuple[str, str], Doubt] = field(default_factory=dict)

    def why(self, device: str, executor: str) -> Doubt | None:
        """Why the model for ``executor`` on ``device`` is doubted, as facts (None: it is not)."""
        return self.reasons.get((device, executor))

    def note(self, device: str, executor: str, reason: Doubt) -> None:
        """Doubt the model for ``executor`` on ``device`` from now on, for ``reason`` (the first one stays)."""
        self.reasons.setdefault((device, executor), reason)

    def learn(
        self, device: str, executor: str, region: str, estimates: Mapping[str, float], measured: Measured
    ) -> None:
        """Doubt the model once a timing of ``region`` shows its eager/fused ratio off by more than the band."""
        off = model_error(estimates, measured)
        if off is not None and off > MEASURE_BAND:
            self.note(device, executor, Doubt(by="timing", region=region, off=off, band=MEASURE_BAND))


@dataclass(frozen=True)
class Verdict:
    """A region's fate, the code of its reason and the facts that decided it (:mod:`.reasons` words them), the
    model's numbers, and ``details``: the explanation where it says more than the reason, ``decided_by``
    (``option``, ``metadata``, ``rule``, ``no constants``, ``exactness``, ``model`` or ``measured``), what the
    model alone said, and any measurement.
    ``measurable``: a measurement would decide it (near break-even, exact); ``alternative``: the other fusion
    executor a measurement may time it with (None: there is none, or it may compute other bits)."""

    action: str
    code: ReasonCode
    facts: Facts = field(default_factory=lambda: Facts())
    estimates: dict[str, float] = field(default_factory=dict)
    details: dict[str, Any] = field(default_factory=dict)
    measurable: bool = False
    alternative: str | None = None

    def __post_init__(self) -> None:
        self.details.update(reasons.words(self.code, self.facts)[1])  # the explanation, where it says more

    @property
    def reason(self) -> str:
        """The reason, on one line."""
        return reasons.words(self.code, self.facts)[0]

    @property
    def explanation(self) -> str:
        """The reason's longer explanation (the reason itself where there is none that says more)."""
        return self.details.get("explanation", self.reason)


def decide(
    region: Region,
    options: GuardOptions,
    constants: CostConstants | None = None,
    measured: Measured | None = None,
    compile_options: Mapping[str, Any] | None = None,
    alternative: str | None = None,
    doubt: Doubt | None = None,
    captured: bool = False,
) -> Verdict:
    """Keep a region, reject it to the torch executor when its fusion call buys nothing, or switch it to
    the fusion executor ``alternative`` (one that can run all of it) when that runs it faster.

    ``measured`` (a timing of this region on this machine) decides a region the model puts near
    break-even, and any region with an alternative it may switch to; elsewhere the model's estimate decides.
    ``compile_options`` are those the program passed to ``thunder.jit`` by name: a region kind it asked for
    is kept unless ``rewrites.override_compile_options``. ``doubt`` (:class:`ModelDoubt`'s reason): the model's
    estimates are not trusted to decide alone, so a measurement decides any exact region, however far apart
    its estimates (the decision's ``model_doubted`` says why). ``captured``: the program replays in CUDA graphs,
    which spend no host time, so the model's device estimates decide, and a timing its device times where it has
    them.
    """
    comms = [op for op, b in zip(region.ops, region.body, strict=True) if is_communication(b)]
    if comms:
        return _verdict("keep", "communication", "rule", ops=sorted(set(comms)))
    if not options.guards(region.executor):
        return _verdict("keep", "not_guarded", "option", executor=region.executor)
    if region_is_metadata_only(region.body, options.rewrites.metadata_ops):
        asked = (compile_options or {}).get(SHAPE_ONLY) is True and region.executor == "nvfuser"
        if asked and not options.rewrites.override_compile_options:
            return _verdict("keep", "shape_only_asked", "option", option=SHAPE_ONLY)
        return _verdict("reject", "metadata_only", "metadata")
    if not options.costs.cost_model:
        return _verdict("keep", "cost_model_off", "option")
    if constants is None:
        return _verdict(
            "keep", "no_constants", "no constants", executor=region.executor, calibration=options.costs.calibration
        )
    randoms = random_ops(region)
    if randoms:
        return _verdict("keep", "random", "rule", randoms=randoms)
    try:
        est = estimate(region.body, region.inputs, region.outputs, constants, options.rewrites.metadata_ops)
    except UnknownSize as e:
        return _verdict("keep", "unknown_size", "rule", error=str(e))
    if captured:  # replayed in CUDA graphs: no host time is spent, the device's decides
        est = est.on_device()
    record = est.as_record()
    inexact = inexact_ops(region, options.rewrites.metadata_ops) if options.exact_only else []
    model = _by_numbers(est.region_us, est.eager_us, options.costs.margin)
    ratio = est.eager_us / est.region_us if est.region_us > 0 else float("inf")
    near = 1 / MEASURE_BAND <= ratio <= MEASURE_BAND
    details: dict[str, Any] = {"decided_by": "model", "model_action": model[0], "margin": options.costs.margin}
    if inexact:
        details["inexact"] = list(inexact)
    if (
        alternative is not None
        and options.exact_only
        and not switch_keeps_bits(region.body, options.rewrites.metadata_ops)
    ):
        details["alternative_not_timed"] = reasons.alternative_not_timed(alternative)
        alternative = None
    doubted = doubt is not None and not near and not inexact
    if doubted:
        details["model_doubted"] = reasons.doubt_words(doubt)
    measurable = alternative is not None or ((near or doubted) and not inexact)
    facts = Facts(
        executor=region.executor,
        inexact=inexact,
        est_region_us=est.region_us,
        est_eager_us=est.eager_us,
        margin=options.costs.margin,
        outcome=model[1],
        near=near,
        band=MEASURE_BAND,
        doubt=dict(doubt) if doubted else None,
    )
    # a timing of this very region an earlier run left in the cache (a profile's, where it disagreed with the
    # model) decides an exact region however far apart the estimates: never kept for want of a timing
    cached_only = measured is not None and not measurable and measured.source == "cache" and not inexact
    if measured is not None and (measurable or cached_only):
        timed = measured
        seen = measured.on_device() if captured else None
        if seen is not None:  # in CUDA graphs only the device's time is spent: the margin as the user set it
            measured, margin, narrowed = seen, options.costs.margin, None
        else:
            margin, narrowed = measured_margin(options.costs.margin, measured, constants.overlapped)
        action, outcome = _by_numbers(measured.region_us, measured.eager_us, margin)
        by_rule = bool(inexact) and action == "reject"  # the rule, not the timing, keeps it
        if by_rule:
            action = "keep"
        facts.update(measured=measured, margin=margin, outcome=outcome, by_rule=by_rule, narrowed=narrowed)
        if cached_only:
            facts["cached_only"] = True
            details["cached_only"] = True
        if margin != options.costs.margin:
            facts["margin_from"] = options.costs.margin
            details["margin_narrowed"] = narrowed
        between = spread_margin(margin, measured) if seen is not None else margin
        switched = _switch(region.executor, action, measured, between)
        if switched is not None:
            action = "switch"
            facts.update(switched_to=measured.other, chosen=switched[0], chosen_us=switched[1])
            if between != margin:
                facts["switch_margin"] = between
        by = "exactness" if by_rule and switched is None else "measured"
        details = {**details, "decided_by": by, "margin": margin, **timed.as_record()}
        if seen is not None:
            facts["on_device"] = True
            details["decided_on"] = "device"
        return Verdict(action, "measured", facts, record, details, False, alternative)
    if captured:  # the model decided on its device estimates (a timing says so only where it had device times)
        facts["on_device"] = True
    if inexact and model[0] == "keep":  # the cost model keeps it: exactness did not decide
        return Verdict("keep", "cost_model", facts, record, details, measurable, alternative)
    if inexact:
        details["decided_by"] = "exactness"
        return Verdict("keep", "exactness", facts, record, details, measurable, alternative)
    return Verdict(model[0], "cost_model", facts, record, details, measurable, alternative)


def measured_margin(margin: float, measured: Measured, overlapped: bool) -> tuple[float, Narrowing | None]:
    """The margin a measured decision uses, and why it is narrower than ``margin`` when it is: the timing's
    spread (at least :data:`MEASURED_MARGIN_FLOOR`) where the timing is what the program sees (calls
    are synchronous, or eager is no dearer on the host nor on the device, each within that spread)."""
    if measured.spread is None:
        return margin, None
    narrow = spread_margin(margin, measured)
    if not overlapped:  # the device runs each call before the host goes on (CPU)
        return narrow, "synchronous"
    if measured.host is None or measured.device is None:
        return margin, None
    (fused_host, eager_host), (fused_device, eager_device) = measured.host, measured.device
    if eager_host <= fused_host * (1 + narrow) and eager_device <= fused_device * (1 + narrow):
        return narrow, "host_and_device"
    return margin, None


def dearer_on_device(measured: Measured) -> bool:
    """Whether the second program ``measured`` timed (``eager_us``: a compile given more options) costs the device more
    than the first by over :data:`MEASURED_MARGIN_FLOOR`, host and device timed apart (False where they were not). A
    compile faster on the stream for fewer launches may still cost the device more: replayed in CUDA graphs, where
    only the device's time counts, it would be slower, so it is not taken."""
    if measured.device is None:
        return False
    before, after = measured.device
    return after > before * (1 + MEASURED_MARGIN_FLOOR)


def spread_margin(margin: float, measured: Measured) -> float:
    """``margin`` narrowed to the timing's spread, at least :data:`MEASURED_MARGIN_FLOOR` (``margin`` where the
    timing has no spread): the one rule for a measured keep or reject, for a switch on device times and for a
    Dynamo graph run whole by Inductor where unguarded Thunder fails (:mod:`.whole_graph`).

    A switch between fusion executors on device times (a program replayed in CUDA graphs) always uses it: both sides
    are one region's kernels, no host time on either, so what the timing sees is what the replay spends."""
    return margin if measured.spread is None else min(margin, max(MEASURED_MARGIN_FLOOR, measured.spread))


def _switch(executor: str, action: str, measured: Measured, margin: float) -> tuple[str, float] | None:
    """What the other executor ``measured`` timed beats, and its time, when it beats what ``action`` chose (its
    own fusion call, or eager for a reject) by ``margin``; None when it does not."""
    if measured.other is None or measured.other_us is None:
        return None
    chosen, chosen_us = ("eager", measured.eager_us) if action == "reject" else (executor, measured.region_us)
    if measured.other_us >= chosen_us * (1 - margin):
        return None
    return chosen, chosen_us


def _verdict(action: str, code: ReasonCode, decided_by: str, **facts: Any) -> Verdict:
    return Verdict(action, code, Facts(**facts), details={"decided_by": decided_by})


def _by_numbers(region_us: float, eager_us: float, margin: float) -> tuple[str, Outcome]:
    """Reject when eager is cheaper by at least ``margin``; and how the comparison came out."""
    if eager_us < region_us * (1 - margin):
        return "reject", "cheaper"
    if eager_us < region_us:
        return "keep", "under_margin"
    return "keep", "worth_it"
