"""Which operations are metadata-only: they change a tensor's shape, strides or view, never its data."""

from __future__ import annotations

from collections.abc import Iterable

from . import _thunder as th

# Thunder prims (by name) that only re-describe memory. `stride_order` is left out: it may copy.
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
    }
)

# Torch-level ids that are views in eager PyTorch, for executors that keep them undecomposed.
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
        )
    }
    | {
        f"torch.Tensor.{name}"
        for name in ("view", "view_as", "reshape_as", "expand", "expand_as", "unsqueeze", "squeeze", "permute")
    }
)


def is_metadata(bsym: th.BoundSymbol, extra: Iterable[str] = ()) -> bool:
    """True when ``bsym`` (or, for a composite op, every operation it decomposes into) is metadata-only."""
    extra = frozenset(extra)
    return _is_metadata(bsym, extra)


def _is_metadata(bsym: th.BoundSymbol, extra: frozenset[str]) -> bool:
    oid, name = th.op_id(bsym), th.op_name(bsym)
    if oid in extra or name in extra or oid in METADATA_PRIMS or oid in METADATA_TORCH_OPS:
        return True
    subs = th.subsymbols(bsym)
    return bool(subs) and all(_is_metadata(s, extra) for s in subs)


def region_is_metadata_only(bsyms: Iterable[th.BoundSymbol], extra: Iterable[str] = ()) -> bool:
    extra = frozenset(extra)
    ops = [b for b in bsyms if not th.is_comment_or_del(b)]
    return bool(ops) and all(_is_metadata(b, extra) for b in ops)
