"""Deciding each region's fate. A pure function of the region and the options, so the same program
always gets the same trace."""

from __future__ import annotations

from dataclasses import dataclass, field

from .ops import region_is_metadata_only
from .options import GuardOptions
from .regions import Region


@dataclass(frozen=True)
class Verdict:
    action: str
    reason: str
    estimates: dict[str, float] = field(default_factory=dict)


def decide(region: Region, options: GuardOptions) -> Verdict:
    """Keep a region, or reject it to the torch executor when its fusion call buys nothing."""
    if not options.guards(region.executor):
        return Verdict("keep", f"executor {region.executor!r} is not guarded (option 'executors')")
    if region_is_metadata_only(region.body, options.metadata_ops):
        return Verdict(
            "reject",
            "metadata-only region: its ops only re-describe tensors, which PyTorch does without a kernel "
            "or a fusion call",
        )
    return Verdict("keep", "region computes (not metadata-only)")
