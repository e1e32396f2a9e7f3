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

import torch

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

# Metadata prims the torch executor runs as a plain identity: no dispatch, no view made, nothing to cost.
IDENTITY_AT_RUN_TIME: frozenset[str] = frozenset({"update_aliases"})

# Ops whose cost is counted in FLOPs (2 * output elements * the reduced dimension), not per element.
MATMUL_OPS: frozenset[str] = frozenset({"matmul", "linear"})
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
NOT_RANDOM_NAMES = ("normalize",)  # names that contain a hint and draw nothing


def _leaf_names(bsym: th.BoundSymbol, extra) -> list[str]:
    if is_metadata(bsym, extra):
        return []
    subs = th.subsymbols(bsym)
    name = th.op_name(bsym)
    if name in EXACT_OPS or name in EXACT_ALONE or not subs:
        return [name]
    return [n for s in subs for n in _leaf_names(s, extra)]


def inexact_ops(region: Region, extra: Iterable[str] = ()) -> list[str]:
    """Why the region's bits could change if PyTorch ran its ops one by one instead of the fusion: ops
    that round differently even alone, then roundings the fusion and the op-by-op run place differently
    (:func:`rounding_hazards`). Empty when rejecting the region keeps every bit."""
    names = [n for b in region.body for n in _leaf_names(b, extra)]
    alone = len(names) == 1
    inexact = sorted({n for n in names if n not in EXACT_OPS and not (alone and n in EXACT_ALONE)})
    return inexact + rounding_hazards(region.body, extra)


def rebuild_keeps_bits(body: list[th.BoundSymbol], extra: Iterable[str] = ()) -> bool:
    """Whether a fusion rebuilt from ``body`` plus or minus views still computes the same bits.

    Only element-wise exact arithmetic qualifies: a reduction's order, and so its rounding, follows the
    schedule the fusion compiler picks, and a different fusion definition may get a different one (a
    nanoGPT block's backward on nvFuser did). Roundings a fusion may skip (:func:`rounding_hazards`)
    count too: a rebuilt fusion may skip them differently.
    """
    body = [b for b in body if not th.is_comment_or_del(b)]
    names = {n for b in body for n in _leaf_names(b, extra)}
    return names <= REBUILD_SAFE and not rounding_hazards(body, extra)


# --- Rounding: where running ops one by one rounds differently from one fusion ----------------------
#
# Thunder computes a bf16/fp16 op in float32 and rounds its result back: `a + b + c` is upcast, add,
# round to bf16, upcast, add, round. Run op by op, every one of those roundings happens. Inside one
# fusion, a rounding whose result only feeds the next op is skipped (Thunder's nvFuser executor removes
# the round-then-upcast pair, see `remove_redundant_casts`; Inductor keeps the float32 value), so the
# fusion rounds once. And eager PyTorch rounds a Python number to a bf16/fp16 tensor's dtype before
# adding it (CPU kernels do), where Thunder adds it in float32. A region is exact to run op by op only
# when neither happens; the rule is checked on the innermost ops, where the roundings are explicit.

# (exponent bits, significand bits including the implicit one) of each floating-point dtype.
_FLOAT_BITS: dict[torch.dtype, tuple[int, int]] = {
    torch.float64: (11, 53),
    torch.float32: (8, 24),
    torch.bfloat16: (8, 8),
    torch.float16: (5, 11),
    torch.float8_e4m3fn: (4, 4),
    torch.float8_e5m2: (5, 3),
}


def holds_every_value(target: torch.dtype, source: torch.dtype) -> bool:
    """True when converting ``source`` values to ``target`` never rounds (float32 -> float64, int8 -> bfloat16);
    conversions to integer or boolean dtypes count as holding (a fusion never skips them)."""
    if target not in _FLOAT_BITS or target == source:
        return True
    exp_t, sig_t = _FLOAT_BITS[target]
    if source == torch.bool:
        return True
    if source in _FLOAT_BITS:
        exp_s, sig_s = _FLOAT_BITS[source]
        return exp_t >= exp_s and sig_t >= sig_s
    if source.is_floating_point or source.is_complex:
        return False
    return sig_t >= torch.iinfo(source).bits - int(source.is_signed)


def _is_value_of(number: object, dtype: torch.dtype) -> bool:
    if not isinstance(number, (int, float)):
        return False  # a number proxy: its value is not known here
    try:
        return float(torch.tensor(float(number), dtype=torch.float64).to(dtype)) == number
    except (OverflowError, RuntimeError):
        return False


def _reduced(dtype: torch.dtype | None) -> bool:
    return dtype in _FLOAT_BITS and _FLOAT_BITS[dtype][1] < _FLOAT_BITS[torch.float32][1]


def rounding_hazards(body: Iterable[th.BoundSymbol], extra: Iterable[str] = ()) -> list[str]:
    """Roundings that running ``body`` op by op would place differently from one fusion of it: a
    narrowing conversion (float32 -> bf16, ...) whose result another op of the body reads, and a number
    that is not a value of the bf16/fp16 tensor it meets. Each item says which and where."""
    extra = frozenset(extra)
    body = [b for b in body if not th.is_comment_or_del(b)]
    found: list[str] = []
    leaves = [leaf for b in body for leaf in th.leaves(b) if not th.is_comment_or_del(leaf)]
    read_by: dict[str, list[str]] = {}
    for leaf in leaves:
        for p in leaf.flat_proxy_args:
            read_by.setdefault(p.name, []).append(th.op_name(leaf))
    for leaf in leaves:
        conv = th.conversion(leaf)
        if conv is None:
            continue
        source, target = conv
        source_dtype = th.torch_dtype(source)
        readers = read_by.get(leaf.output.name, []) if isinstance(leaf.output, th.Proxy) else []
        if source_dtype is not None and readers and not holds_every_value(target, source_dtype):
            found.append(
                f"{leaf.output.name}: {_short(source_dtype)} rounded to {_short(target)} and read again inside "
                f"the region (by {readers[0]}), a rounding the fusion may skip"
            )
    for b in body:
        for op in (b, *th.leaves(b)):
            if is_metadata(op, extra):
                continue
            reduced = {d for d in map(th.torch_dtype, op.flat_proxy_args) if _reduced(d)}
            for number in th.number_args(op):
                for dtype in sorted(reduced, key=str):
                    if not _is_value_of(number, dtype):
                        found.append(
                            f"{th.op_name(op)} of a {_short(dtype)} tensor and the number {number} (not a "
                            f"{_short(dtype)} value: eager rounds it first, the fusion does not)"
                        )
    return list(dict.fromkeys(found))


def rounding_at_cut(body: Iterable[th.BoundSymbol], crossing: Iterable[th.Proxy]) -> list[str]:
    """Values of ``crossing`` (what one piece of a split region hands the other) that ``body`` computes by a
    narrowing conversion, directly or through ops that keep them in reduced precision (views, cat, where).

    Splitting stores a crossing value at its dtype; the whole fusion may have skipped that rounding
    (:func:`rounding_hazards`), so such a value changes the bits. Roundings on one side of the cut are
    made alike by the piece's own fusion, and values that never cross are stored as before.
    """
    wanted = {p.name for p in crossing}
    if not wanted:
        return []
    rounded: dict[str, str] = {}
    for b in body:
        for leaf in th.leaves(b):
            if th.is_comment_or_del(leaf):
                continue
            conv = th.conversion(leaf)
            source = th.torch_dtype(conv[0]) if conv is not None else None
            if conv is not None and source is not None and not holds_every_value(conv[1], source):
                how = f"{_short(source)} rounded to {_short(conv[1])}"
            else:
                how = next((rounded[p.name] for p in leaf.flat_proxy_args if p.name in rounded), None)
            if how is None:
                continue
            for out in leaf.flat_proxy_outs:
                if _reduced(th.torch_dtype(out)):
                    rounded[out.name] = how
    return [
        f"{name}: {rounded[name]} inside the region and handed across the split, which would store it rounded"
        for name in sorted(wanted & rounded.keys())
    ]


def _short(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def random_ops(region: Region) -> list[str]:
    """Names of the region's ops that draw random numbers or touch the random state (:func:`is_random`)."""
    return sorted({th.op_name(b) for b in region.body if is_random(b)})


def _random_name(name: str) -> bool:
    return any(h in name for h in RANDOM_HINTS) and not any(n in name for n in NOT_RANDOM_NAMES)


# The torch executor's own implementations of view prims: what a lowered reshape or slice runs as.
TORCH_EXECUTOR_VIEWS: frozenset[str] = frozenset({"torch_prims_reshape_impl", "torch_slice_prim_impl"})


def runs_as_view(bsym: th.BoundSymbol, extra: Iterable[str] = ()) -> bool:
    """True when an op run outside a fusion launches no kernel in eager (a view; a reshape may copy where
    its input's strides need it): metadata-only, or the torch executor's implementation of a view prim."""
    return th.op_id(bsym) in TORCH_EXECUTOR_VIEWS or is_metadata(bsym, extra)


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


# --- hoisting (issue 11): which ops may run once per compiled program and be reused -----------------

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
    return any(_random_name(n) for n in th.op_names_deep(bsym))


def hoistable(bsym: th.BoundSymbol) -> bool:
    """Whether ``bsym``, given arguments that never change, may run once and have its outputs reused.

    Yes when it reads nothing but its arguments and acts on nothing but its outputs and the tensors it
    is given: no random numbers, no device sync, no unknown torch function (Thunder's fallback), no
    context manager, no other process, no argument that is not a proxy or a plain constant; the only
    writes allowed are in-place ops and ``copy_`` (whoever they write is checked by the pass).
    """
    if th.is_plumbing(bsym) or not th.plain_arguments(bsym):
        return False
    tags = th.tag_names(bsym)
    if tags & NOT_HOISTABLE_TAGS or is_random(bsym):
        return False
    if is_communication(bsym):
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
