"""Which operations are metadata-only: they change a tensor's shape, strides or view, never its data; and
which ops the cost model counts apart (matmuls by FLOPs, ops eager runs per element).

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

from .. import _thunder as th
from .effects import EFFECT_TAGS

__all__ = [
    "CONVOLUTION_OPS",
    "EAGER_ONLY_COMPUTE",
    "IDENTITY_AT_RUN_TIME",
    "MATMUL_OPS",
    "METADATA_PRIMS",
    "METADATA_TORCH_OPS",
    "REINTERPRETING",
    "TORCH_EXECUTOR_VIEWS",
    "is_metadata",
    "only_numbers",
    "region_is_metadata_only",
    "runs_as_view",
]


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


# Metadata prims the torch executor runs as a plain identity: no dispatch, no view made, nothing to cost.
IDENTITY_AT_RUN_TIME: frozenset[str] = frozenset({"update_aliases"})


# Ops whose cost is counted in FLOPs (2 * output elements * the reduced dimension), not per element.
MATMUL_OPS: frozenset[str] = frozenset({"matmul", "linear"})


# Convolutions, counted in FLOPs too (2 * output elements * input channels per group * kernel elements). Thunder
# writes a convolution's backward as convolutions (the input's gradient a convolution of the padded gradient with
# the flipped weight, the weight's a convolution of the input with the gradient), so these count it too;
# ``conv1d``/``conv2d``/``conv3d`` decompose into ``convolution``.
CONVOLUTION_OPS: frozenset[str] = frozenset({"convolution"})


# Ops whose eager CPU kernel spends per element what a fused kernel does not: torch.where branches on
# each element (slow on a random mask), a fusion selects without branching.
EAGER_ONLY_COMPUTE: frozenset[str] = frozenset({"where"})


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


# The torch executor's own implementations of view prims: what a lowered reshape or slice runs as.
TORCH_EXECUTOR_VIEWS: frozenset[str] = frozenset({"torch_prims_reshape_impl", "torch_slice_prim_impl"})


def is_metadata(bsym: th.BoundSymbol, metadata_ops: Iterable[str] = ()) -> bool:
    """True when ``bsym`` (or, for a composite op, every operation it decomposes into) is metadata-only."""
    metadata_ops = frozenset(metadata_ops)
    return _is_metadata(bsym, metadata_ops)


def _is_metadata(bsym: th.BoundSymbol, metadata_ops: frozenset[str]) -> bool:
    oid, name = th.op_id(bsym), th.op_name(bsym)
    if oid in metadata_ops or name in metadata_ops:
        return True
    if oid in REINTERPRETING and not _same_itemsize(bsym):
        return False
    if oid in METADATA_PRIMS or oid in METADATA_TORCH_OPS or only_numbers(bsym):
        return True
    subs = th.subsymbols(bsym)
    return bool(subs) and all(_is_metadata(s, metadata_ops) for s in subs)


def _same_itemsize(bsym: th.BoundSymbol) -> bool:
    sizes = th.reinterpreted_itemsizes(bsym)
    return sizes is None or sizes[0] == sizes[1]


def region_is_metadata_only(bsyms: Iterable[th.BoundSymbol], metadata_ops: Iterable[str] = ()) -> bool:
    """True when the region has ops and every one is metadata-only (see the module's rule)."""
    metadata_ops = frozenset(metadata_ops)
    ops = [b for b in bsyms if not th.is_comment_or_del(b)]
    return bool(ops) and all(_is_metadata(b, metadata_ops) for b in ops)


def runs_as_view(bsym: th.BoundSymbol, metadata_ops: Iterable[str] = ()) -> bool:
    """True when an op run outside a fusion launches no kernel in eager (a view; a reshape may copy where
    its input's strides need it): metadata-only, or the torch executor's implementation of a view prim."""
    return th.op_id(bsym) in TORCH_EXECUTOR_VIEWS or is_metadata(bsym, metadata_ops)


def only_numbers(bsym: th.BoundSymbol) -> bool:
    """True when ``bsym`` and every op it decomposes into take and give numbers only, with no effect but
    their outputs (no random state, sync, mutation; checks excepted, they only raise on a bad value)."""
    tags = th.tag_names(bsym, deep=False)
    if tags & EFFECT_TAGS:
        return False
    is_check = th.op_name(bsym).startswith("check_")
    if "DONT_DCE" in tags and not is_check:
        return False
    if not bsym.flat_outs and not is_check:
        return False
    if not all(th.is_number_like(x) for x in (*bsym.flat_args, *bsym.flat_outs)):
        return False
    return all(only_numbers(s) for s in th.subsymbols(bsym))
