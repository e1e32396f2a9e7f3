"""Deciding each region's fate. A pure function of the region, the options and the cost constants,
so the same program always gets the same trace."""

from __future__ import annotations

from dataclasses import dataclass, field

from .cost import CostConstants, UnknownSize, estimate
from .ops import inexact_ops, is_communication, random_ops, region_is_metadata_only
from .options import GuardOptions
from .regions import Region


@dataclass(frozen=True)
class Verdict:
    action: str
    reason: str
    estimates: dict[str, float] = field(default_factory=dict)


def decide(region: Region, options: GuardOptions, constants: CostConstants | None = None) -> Verdict:
    """Keep a region, or reject it to the torch executor when its fusion call buys nothing."""
    comms = [op for op, b in zip(region.ops, region.body, strict=True) if is_communication(b)]
    if comms:
        return Verdict("keep", f"region holds communication ops {sorted(set(comms))}: never rewritten or moved")
    if not options.guards(region.executor):
        return Verdict("keep", f"executor {region.executor!r} is not guarded (option 'executors')")
    if region_is_metadata_only(region.body, options.metadata_ops):
        return Verdict(
            "reject",
            "metadata-only region: its ops only re-describe tensors, which PyTorch does without a kernel "
            "or a fusion call",
        )
    if not options.cost_model:
        return Verdict("keep", "region computes (cost model off)")
    if constants is None:
        return Verdict("keep", f"region computes; no cost constants for executor {region.executor!r} here")
    randoms = random_ops(region)
    if randoms:
        return Verdict("keep", f"random ops {randoms}: running them elsewhere would change the random stream")
    try:
        est = estimate(region.body, region.inputs, region.outputs, constants, options.metadata_ops)
    except UnknownSize as e:
        return Verdict("keep", f"cannot estimate: {e}")
    record = est.as_record()
    cheaper = est.eager_us < est.region_us * (1 - options.margin)
    if not cheaper:
        return Verdict(
            "keep",
            f"fusion call is worth it: est {est.region_us:.1f} µs fused vs {est.eager_us:.1f} µs eager",
            record,
        )
    inexact = inexact_ops(region, options.metadata_ops) if options.exact_only else []
    if inexact:
        return Verdict(
            "keep",
            f"eager looks cheaper ({est.eager_us:.1f} vs {est.region_us:.1f} µs) but ops {inexact} could round "
            "differently outside the fusion (option 'exact_only')",
            record,
        )
    return Verdict(
        "reject",
        f"eager is cheaper: est {est.eager_us:.1f} µs for {est.eager_ops} eager ops vs "
        f"{est.region_us:.1f} µs as a fusion call (margin {options.margin:.0%})",
        record,
    )
