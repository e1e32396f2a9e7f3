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


# --- hoisting (issue 11): which ops may run once per compiled program and be reused -----------------

# Thunder's distributed prims talk to other processes; never run them once for all calls. (The check
# on plain arguments below also catches them: they take a process group.)
DISTRIBUTED_OPS: frozenset[str] = frozenset(
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
# Tags of ops whose result may differ from call to call, or that act beyond their outputs.
NOT_HOISTABLE_TAGS: frozenset[str] = frozenset(
    {"RANDOM_OP", "DEVICE_SYNC_OP", "AUTO_REGISTERED", "CTX_MANAGER_ENTER_EXIT_OP"}
)
# Ops that write a tensor they are given (``copy_(src, dst)`` writes dst; ``inplace_setitem`` its first
# argument); a torch name ending in "_" is an in-place op by PyTorch's convention.
IN_PLACE_OPS: frozenset[str] = frozenset({"copy_", "inplace_setitem", "setitem_"})
# Name parts of ops that may return a view of (or the very) tensor they are given, besides the
# metadata-only ops: ``to`` and ``contiguous`` return their input when nothing changes.
ALIAS_NAME_PARTS: frozenset[str] = frozenset(
    {
        "view",
        "reshape",
        "expand",
        "squeeze",
        "unsqueeze",
        "permute",
        "transpose",
        "narrow",
        "select",
        "slice",
        "split",
        "chunk",
        "unbind",
        "flatten",
        "unflatten",
        "movedim",
        "moveaxis",
        "swapaxes",
        "swapdims",
        "diagonal",
        "real",
        "imag",
        "getitem",
        "alias",
        "aliases",
        "detach",
        "contiguous",
        "to",
        "type",
        "strided",
        "shallow",
        "bitcast",
        "unfold",
        "broadcast",
        "adjoint",
        "t",
        "T",
        "mT",
        "mH",
        "H",
        "stride",
    }
)


def _in_place_name(name: str) -> bool:
    return name in IN_PLACE_OPS or (name.endswith("_") and not name.startswith("_"))


def writes_inputs(bsym: th.BoundSymbol) -> bool:
    """Whether ``bsym`` (or an op inside it) may write a tensor it is given: in-place ops, ``copy_``, any
    op Thunder must never remove."""
    tags = th.tag_names(bsym)
    if "IN_PLACE" in tags or "DONT_DCE" in tags:
        return True
    return any(_in_place_name(n) for n in th.op_names_deep(bsym))


def is_random(bsym: th.BoundSymbol) -> bool:
    """Whether ``bsym`` (or an op inside it) draws random numbers or touches the random state."""
    if "RANDOM_OP" in th.tag_names(bsym):
        return True
    return any(h in n for n in th.op_names_deep(bsym) for h in RANDOM_HINTS)


def hoistable(bsym: th.BoundSymbol) -> bool:
    """Whether ``bsym``, given arguments that never change, may run once and have its outputs reused.

    Yes when it reads nothing but its arguments and acts on nothing but its outputs and the tensors it
    is given: no random numbers, no device sync, no unknown torch function (Thunder's fallback), no
    context manager, no other process, no argument that is not a proxy or a plain constant; the only
    writes allowed are in-place ops and ``copy_`` (whoever they write is checked by the pass).
    """
    if th.is_structural(bsym) or not th.plain_arguments(bsym):
        return False
    tags = th.tag_names(bsym)
    if tags & NOT_HOISTABLE_TAGS or is_random(bsym):
        return False
    names = th.op_names_deep(bsym)
    if names & DISTRIBUTED_OPS:
        return False
    if "DONT_DCE" in tags:
        # Only the writes we know (copy_, in-place ops); anything else Thunder keeps may act outside.
        return all(_in_place_name(n) for n in _dont_dce_names(bsym))
    return True


def _dont_dce_names(bsym: th.BoundSymbol) -> set[str]:
    found = {bsym.sym.name} if "DONT_DCE" in {t.name for t in (bsym.sym.tags or ())} else set()
    for s in th.subsymbols(bsym):
        found |= _dont_dce_names(s)
    return found


def _name_parts(name: str) -> set[str]:
    return {part for part in name.replace(".", "_").split("_") if part}


def may_alias_inputs(bsym: th.BoundSymbol, extra: Iterable[str] = ()) -> bool:
    """Whether an output of ``bsym`` may share memory with a tensor it is given: views, metadata ops,
    ``to``/``contiguous`` (which return their input when nothing changes), in-place ops.

    Computing ops (elementwise, reductions, matmul, attention...) make new tensors. An op made of
    others (a fusion region, a torch op and its decomposition) is judged by what it holds: see
    :func:`aliased_outputs`.
    """
    if is_metadata(bsym, extra):
        return True
    if th.subsymbols(bsym):
        return bool(aliased_outputs(bsym, extra))
    if writes_inputs(bsym):
        return True
    return bool(_name_parts(th.op_name(bsym)) & ALIAS_NAME_PARTS)


def aliased_outputs(bsym: th.BoundSymbol, extra: Iterable[str] = ()) -> dict[str, set[str]]:
    """For each output of an op made of others (a fusion region, a decomposed op) that may share memory
    with some of its inputs, those inputs, following the inner ops that may alias their inputs."""
    inputs = {p.name for p in bsym.flat_proxy_args}
    reaches: dict[str, set[str]] = {name: {name} for name in inputs}
    for sub in th.subsymbols(bsym):
        if th.is_comment_or_del(sub) or not may_alias_inputs(sub, extra):
            continue
        sources = set().union(*(reaches.get(p.name, set()) for p in sub.flat_proxy_args))
        for out in sub.flat_proxy_outs:
            reaches.setdefault(out.name, set()).update(sources)
    return {p.name: reaches[p.name] for p in bsym.flat_proxy_outs if reaches.get(p.name)}


def _integers_only(bsym: th.BoundSymbol) -> bool:
    tensors = [p for p in (*bsym.flat_proxy_args, *bsym.flat_proxy_outs) if isinstance(p, th.TensorProxy)]
    return bool(tensors) and all(th.is_integer_or_bool(p) for p in tensors)


# Ops that only move or fill data (no arithmetic): the same bits whoever runs them.
DATA_MOVEMENT_OPS: frozenset[str] = frozenset(
    {"copy_with_setitem", "setitem", "setitem_", "inplace_setitem", "cat", "pad"}
)


def hoist_keeps_bits(body: Iterable[th.BoundSymbol], extra: Iterable[str] = ()) -> bool:
    """Whether the ops of ``body`` give the same bits in a fusion rebuilt to hoist part of a region:
    :func:`rebuild_keeps_bits` ops, ops that only move data (setitem, cat, pad), and ops that compute
    on integers and booleans only (``arange``, index arithmetic, comparisons: no rounding)."""
    extra = tuple(extra)
    return all(_op_keeps_bits(b, extra) for b in body if not th.is_comment_or_del(b))


def _op_keeps_bits(bsym: th.BoundSymbol, extra: tuple[str, ...]) -> bool:
    if th.op_name(bsym) in DATA_MOVEMENT_OPS or _integers_only(bsym) or rebuild_keeps_bits([bsym], extra):
        return True
    subs = [s for s in th.subsymbols(bsym) if not th.is_comment_or_del(s)]
    return bool(subs) and all(_op_keeps_bits(s, extra) for s in subs)
