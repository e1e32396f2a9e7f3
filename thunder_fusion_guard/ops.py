"""Which operations are metadata-only: they change a tensor's shape, strides or view, never its data.

The rule: an op counts as metadata-only when eager PyTorch runs it without a kernel, as a view of its
input, whatever that input's strides; ``reshape`` (and ops built on it) also counts, since where eager
copies a non-contiguous input the fusion region had to move the same bytes. Ops that touch no tensor
(shape arithmetic and checks on numbers, as ``cache="symbolic values"`` puts them next to every view)
count too: Python runs them without a kernel.

Left out on purpose: ``stride_order`` (may copy); ``as_strided`` (its result depends on how its input's
storage is laid out, which a fusion may lay out differently); ``view_as_complex`` and reinterpreting a
dtype as one of another item size (eager needs particular strides and raises otherwise); ``real`` and
``imag`` (views in eager, computed by Thunder).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from . import _thunder as th

if TYPE_CHECKING:
    from .regions import Region

# Thunder prims (by name) that only re-describe memory (`shape` only reads it; `update_aliases` is the
# identity at run time, it only tells Thunder which tensors alias after an in-place write).
METADATA_PRIMS: frozenset[str] = frozenset(
    {
        "reshape",
        "view",
        "transpose",
        "squeeze",
        "broadcast_in_dim",
        "slice_prim",
        "shallow_copy",
        "unfold",
        "bitcast",
        "shape",
        "update_aliases",
    }
)

# Torch-level ids that are views in eager PyTorch, for executors that keep them undecomposed (and for
# `diagonal`, which Thunder decomposes into a gather while eager returns a view).
METADATA_TORCH_OPS: frozenset[str] = frozenset(
    {
        f"torch.{name}"
        for name in (
            "reshape",
            "flatten",
            "unflatten",
            "permute",
            "transpose",
            "squeeze",
            "unsqueeze",
            "movedim",
            "split",
            "chunk",
            "tensor_split",
            "narrow",
            "select",
            "diagonal",
            "view_as_real",
        )
    }
    | {
        f"torch.Tensor.{name}"
        for name in ("view", "view_as", "reshape_as", "expand", "expand_as", "unsqueeze", "squeeze", "permute")
    }
)

# Ops that may reinterpret the bits as another dtype: metadata-only when the item size stays the same
# (a view for any strides); to another item size eager needs a contiguous last dimension.
REINTERPRETING: frozenset[str] = frozenset({"bitcast", "torch.Tensor.view"})


def is_metadata(bsym: th.BoundSymbol, extra: Iterable[str] = ()) -> bool:
    """True when ``bsym`` (or, for a composite op, every operation it decomposes into) is metadata-only."""
    extra = frozenset(extra)
    return _is_metadata(bsym, extra)


def _is_metadata(bsym: th.BoundSymbol, extra: frozenset[str]) -> bool:
    oid, name = th.op_id(bsym), th.op_name(bsym)
    if oid in extra or name in extra:
        return True
    if oid in REINTERPRETING and not _same_itemsize(bsym):
        return False
    if oid in METADATA_PRIMS or oid in METADATA_TORCH_OPS or th.only_numbers(bsym):
        return True
    subs = th.subsymbols(bsym)
    return bool(subs) and all(_is_metadata(s, extra) for s in subs)


def _same_itemsize(bsym: th.BoundSymbol) -> bool:
    sizes = th.reinterpreted_itemsizes(bsym)
    return sizes is None or sizes[0] == sizes[1]


def region_is_metadata_only(bsyms: Iterable[th.BoundSymbol], extra: Iterable[str] = ()) -> bool:
    """True when the region has ops and every one is metadata-only (see the module's rule)."""
    extra = frozenset(extra)
    ops = [b for b in bsyms if not th.is_comment_or_del(b)]
    return bool(ops) and all(_is_metadata(b, extra) for b in ops)


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


def _leaf_names(bsym: th.BoundSymbol, extra) -> list[str]:
    if is_metadata(bsym, extra):
        return []
    subs = th.subsymbols(bsym)
    name = th.op_name(bsym)
    if name in EXACT_OPS or name in EXACT_ALONE or not subs:
        return [name]
    return [n for s in subs for n in _leaf_names(s, extra)]


def inexact_ops(region: Region, extra: Iterable[str] = ()) -> list[str]:
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


# Communication ops: Thunder's distributed prims (thunder/distributed/prims.py), the torch executor's
# implementations of them (`torch_<prim>_prim_impl`) and thunder.torch's wrappers of torch.distributed.
# Every rank must reach each collective in the same order; a wait ends one in flight; pack, unpack and
# update_bucket_view fill and drain gradient buckets with in-place copies. So the guard never rejects or
# rebuilds a region holding one, never moves an op across one, and never reorders them.
COMMUNICATION_PRIMS: frozenset[str] = frozenset(
    {
        "all_gather",
        "all_reduce",
        "broadcast",
        "reduce_scatter",
        "synchronize",
        "wait",
        "pack",
        "unpack",
        "pack_for_fsdp",
        "unpack_for_fsdp",
        "update_bucket_view",
        "stash_grad_for_fsdp",
        "synchronize_tensor_parallel_output",
        "synchronize_tensor_parallel_input",
    }
)
COMMUNICATION_OPS: frozenset[str] = frozenset({f"torch_{name}_prim_impl" for name in COMMUNICATION_PRIMS}) | {
    "functional_all_gather",
    "all_gather_",
    "functional_all_reduce",
    "all_reduce_",
    "functional_broadcast",
    "functional_reduce_scatter",
    "reduce_scatter_",
    "torch.Tensor.wait",
}


def is_communication(bsym: th.BoundSymbol) -> bool:
    """True when ``bsym`` is a communication op or its wait, or holds one (a fusion region, a composite op)."""
    if th.is_distributed_prim(bsym) or th.op_id(bsym) in COMMUNICATION_OPS or th.op_name(bsym) in COMMUNICATION_OPS:
        return True
    return any(is_communication(s) for s in th.subsymbols(bsym))


def communication_positions(bsyms: Iterable[th.BoundSymbol | None]) -> list[int]:
    """Positions, in order, of the communication ops (and of what holds one) in a list of bound symbols."""
    return [i for i, b in enumerate(bsyms) if b is not None and is_communication(b)]


def crosses_communication(positions: list[int], start: int, stop: int) -> bool:
    """Whether moving an op from ``start`` to ``stop`` (either way) passes a communication op, given
    :func:`communication_positions` of the same list."""
    from bisect import bisect_right

    lo, hi = sorted((start, stop))
    i = bisect_right(positions, lo)
    return i < len(positions) and positions[i] < hi
