"""Deciding each region's fate. A pure function of the region, the options and the cost constants,
so the same program always gets the same trace."""

from __future__ import annotations

from dataclasses import dataclass, field

from . import _thunder as th
from .cost import CostConstants, UnknownSize, estimate
from .ops import is_metadata, region_is_metadata_only
from .options import GuardOptions
from .regions import Region

# Ops whose result is fixed to the bit by IEEE rules or by definition, whoever runs them.
EXACT_OPS: frozenset[str] = frozenset(
    {
        "copy_",
        "add",
        "sub",
        "neg",
        "abs",
        "convert_element_type",
        "where",
        "eq",
        "ne",
        "lt",
        "le",
        "gt",
        "ge",
        "maximum",
        "minimum",
        "full",
        "full_like",
        "fill",
        "zeros",
        "ones",
        "bitwise_and",
        "bitwise_or",
        "bitwise_xor",
        "bitwise_not",
        "logical_not",
        "to",
        "clone",
    }
)
# Exact alone, but a fusing compiler may contract them with a neighbour (a*b+c into one FMA).
EXACT_ALONE: frozenset[str] = frozenset({"mul"})  # nvFuser float division differs from torch.div by 1 ulp
# Element-wise ops whose bits do not depend on how a fusion is scheduled (a rebuilt fusion may be
# scheduled differently). Division is here: a fusion divides the same way whatever its schedule; it
# only differs from torch.div, which matters when a region is rejected, not when it is rebuilt.
REBUILD_SAFE: frozenset[str] = EXACT_OPS | EXACT_ALONE | {"div", "true_divide", "stride_order"}
RANDOM_HINTS = ("uniform", "rand", "philox", "bernoulli", "dropout", "normal", "multinomial", "rng", "seed")


@dataclass(frozen=True)
class Verdict:
    action: str
    reason: str
    estimates: dict[str, float] = field(default_factory=dict)


def _leaf_names(bsym: th.BoundSymbol, extra) -> list[str]:
    if is_metadata(bsym, extra):
        return []
    subs = th.subsymbols(bsym)
    name = th.op_name(bsym)
    if name in EXACT_OPS or name in EXACT_ALONE or not subs:
        return [name]
    return [n for s in subs for n in _leaf_names(s, extra)]


def inexact_ops(region: Region, extra=()) -> list[str]:
    """Ops of the region whose bits could change if PyTorch ran them instead of the fusion."""
    names = [n for b in region.body for n in _leaf_names(b, extra)]
    alone = len(names) == 1
    return sorted({n for n in names if n not in EXACT_OPS and not (alone and n in EXACT_ALONE)})


def rebuild_keeps_bits(body: list[th.BoundSymbol], extra=()) -> bool:
    """Whether a fusion rebuilt from ``body`` plus or minus views still computes the same bits.

    Only element-wise exact arithmetic qualifies: a reduction's order, and so its rounding, follows the
    schedule the fusion compiler picks, and a different fusion definition may get a different one (a
    nanoGPT block's backward on nvFuser did).
    """
    names = {n for b in body if not th.is_comment_or_del(b) for n in _leaf_names(b, extra)}
    return names <= REBUILD_SAFE


def random_ops(region: Region) -> list[str]:
    names = {th.op_name(s) for b in region.body for s in (b, *th.subsymbols(b))}
    return sorted(n for n in names if any(h in n for h in RANDOM_HINTS))


def decide(region: Region, options: GuardOptions, constants: CostConstants | None = None) -> Verdict:
    """Keep a region, or reject it to the torch executor when its fusion call buys nothing."""
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
