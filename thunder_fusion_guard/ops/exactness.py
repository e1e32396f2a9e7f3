"""Which ops give the same bits outside a fusion or in a rebuilt one, alone or in a chain, and which products a
compiler may contract; where running ops one by one rounds differently is :mod:`.rounding`'s."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from .. import _thunder as th
from .effects import HasBody
from .metadata import is_metadata
from .rounding import is_integer_or_bool, rounded_values, rounding_hazards

__all__ = [
    "CONTRACTING",
    "DATA_MOVEMENT_OPS",
    "ELEMENTWISE_ROUNDING_OPS",
    "EXACT_ALONE",
    "EXACT_OPS",
    "GATHER_OPS",
    "PER_ELEMENT_EXECUTORS",
    "REBUILD_SAFE",
    "ROUNDING_OPS",
    "contractible_products",
    "contracts",
    "cut_can_move",
    "cut_hazards",
    "exactness_reason",
    "hoist_inexact_ops",
    "hoist_keeps_bits",
    "inexact_ops",
    "known_to_round",
    "rebuild_keeps_bits",
    "switch_keeps_bits",
]


# Ops whose result is fixed to the bit by IEEE rules or by definition, whoever runs them.
EXACT_OPS: frozenset[str] = frozenset(
    {
        "copy_",
        "add",
        "sub",
        "neg",
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


# Ops that copy elements picked by an index tensor (``embedding`` and ``index_select`` are ``take``): no
# arithmetic on the values, so the same bits whoever runs them. Not the scatters (``index_add``, ``scatter_add``,
# ``embedding_backward``: they add what several indices send to one place, in an order an executor picks).
GATHER_OPS: frozenset[str] = frozenset({"take", "take_along_axis", "gather"})


# Ops that only move or fill data (no arithmetic): the same bits whoever runs them.
DATA_MOVEMENT_OPS: frozenset[str] = frozenset(
    {"copy_with_setitem", "setitem", "setitem_", "inplace_setitem", "cat", "pad"}
)


# Element-wise ops whose bits do not depend on how a fusion is scheduled (a rebuilt fusion may be
# scheduled differently). Division is here: a fusion divides the same way whatever its schedule; it
# only differs from torch.div, which matters when a region is rejected, not when it is rebuilt.
# ``abs`` is here, not in EXACT_OPS: nvFuser's abs gives -0.0 for +0.0 where torch.abs gives +0.0 (seen on
# an H100, nvFuser 0.2.36), so rejecting a region with it changes the sign of zeros; any fusion agrees with itself.
REBUILD_SAFE: frozenset[str] = EXACT_OPS | EXACT_ALONE | {"abs", "div", "true_divide", "stride_order"}


# Ops known to round differently outside a fusion than inside it: their bits depend on the order of
# evaluation (reductions, matmul), on the math library (transcendentals, pow, sqrt), on a division the
# fusion compiler may compute otherwise, or on a neighbour a compiler may contract them with (mul, lerp).
# An op neither here nor in EXACT_OPS is only not known to be exact: nobody has shown that running it
# alone gives the fusion's bits (copy_with_setitem, index ops, ...), which does not mean that it rounds.
ELEMENTWISE_ROUNDING_OPS: frozenset[str] = frozenset(
    {
        # division and products
        *("div", "true_divide", "reciprocal", "fmod", "remainder", "mul", "lerp", "addcmul", "addcdiv"),
        # transcendentals and the like
        *("exp", "exp2", "expm1", "log", "log1p", "log2", "log10", "pow", "sqrt", "rsqrt", "sin", "cos"),
        *("tan", "asin", "acos", "atan", "atan2", "sinh", "cosh", "tanh", "asinh", "acosh", "atanh"),
        *("sigmoid", "erf", "erfc", "erfinv", "erfcinv", "ndtri", "lgamma", "digamma", "zeta", "gelu"),
        *("silu", "softplus", "mish", "elu", "selu", "celu", "logsigmoid", "hardswish", "hardsigmoid"),
    }
)
ROUNDING_OPS: frozenset[str] = ELEMENTWISE_ROUNDING_OPS | {
    # reductions and contractions
    *("sum", "prod", "var", "var_mean", "std", "mean", "cumsum", "cumprod", "logsumexp", "softmax"),
    *("log_softmax", "layer_norm", "batch_norm", "group_norm", "rms_norm", "cross_entropy", "nll_loss"),
    *("matmul", "linear", "mm", "bmm", "addmm", "baddbmm", "einsum", "convolution", "_grouped_mm"),
}


# Fusion executors that compute every element of an element-wise op (ELEMENTWISE_ROUNDING_OPS too) by one
# function, whatever else the fusion holds, so that a fusion rebuilt with fewer ops, or one of a few of them,
# gives those ops the same bits. None is known to: Thunder's torch.compile executor on CPU computes cos, exp or
# pow with SLEEF's vector functions in a loop Inductor vectorizes and with the C library's in one it does not
# (a short loop, a value constant along the vectorized dimension), which depends on the kernel around the op,
# and the two differ in the last bit (cos: 908 of 16,384 values of a rotary table, x86-64); nvFuser, taken to
# emit one CUDA math call per op (cosf, sinf, pow in its generated kernels), gave a float32 rotary block other bits
# once its tables were taken out of the region (H100, nvFuser 0.2.36; tests/test_hoist_rotary.py, -m cuda): the
# tables had the same bits, the rebuilt rest contracted a product with an addition (see CONTRACTING). It stays out
# until a rebuilt nvFuser region is shown to keep every element's code.
PER_ELEMENT_EXECUTORS: frozenset[str] = frozenset()


def known_to_round(name: str) -> bool:
    """Whether the op named ``name`` is known to round differently outside a fusion (:data:`ROUNDING_OPS`);
    False for an op that is merely not known to be exact."""
    return name in ROUNDING_OPS


def exactness_reason(inexact: list[str]) -> str:
    """What :func:`inexact_ops` found, worded by what is known: ops that round, and the roundings a fusion
    may skip, "could round differently"; ``abs`` gives zeros another sign on nvFuser; any other op is only
    "not known to give the same bits" (nobody showed that it does, which is not the same as rounding)."""
    ops = [n for n in inexact if " " not in n]  # the other items describe roundings (rounding_hazards)
    rounding = [n for n in inexact if n not in ops or known_to_round(n)]
    unknown = [n for n in ops if not known_to_round(n) and n != "abs"]
    parts = []
    if rounding:
        parts.append(f"ops {rounding} could round differently outside the fusion, op by op")
    if "abs" in ops:
        parts.append("ops ['abs'] could give zeros another sign outside the fusion (nvFuser's abs gives -0.0 for +0.0)")
    if unknown:
        parts.append(f"ops {unknown} are not known to give the same bits outside the fusion")
    return "; ".join(parts)


def _leaves(bsym: th.BoundSymbol, metadata_ops: Iterable[str]) -> list[th.BoundSymbol]:
    """The ops exactness judges ``bsym`` by: none for a view, itself when it is exact by name or has no
    decomposition, else what it decomposes into, recursively."""
    if is_metadata(bsym, metadata_ops):
        return []
    subs = th.subsymbols(bsym)
    name = th.op_name(bsym)
    if name in EXACT_OPS or name in EXACT_ALONE or not subs:
        return [bsym]
    return [leaf for s in subs for leaf in _leaves(s, metadata_ops)]


def _leaf_names(bsym: th.BoundSymbol, metadata_ops: Iterable[str]) -> list[str]:
    return [th.op_name(leaf) for leaf in _leaves(bsym, metadata_ops)]


def _exact_leaf(leaf: th.BoundSymbol, alone: bool) -> bool:
    """Whether one op gives the same bits whoever runs it: exact by name (:data:`EXACT_OPS`, a lone
    :data:`EXACT_ALONE` op), a gather (:data:`GATHER_OPS`: it copies elements), or arithmetic on integers and
    booleans only (``iota``, an integer ``cumsum`` or ``sum``, index arithmetic: integers modulo 2**n add and
    multiply alike in any order). A float ``cumsum`` or ``sum`` is not: its order of additions rounds."""
    name = th.op_name(leaf)
    return name in EXACT_OPS or (alone and name in EXACT_ALONE) or name in GATHER_OPS or _integers_only(leaf)


def inexact_ops(region: HasBody, metadata_ops: Iterable[str] = ()) -> list[str]:
    """Why the region's bits could change if PyTorch ran its ops one by one instead of the fusion: ops
    that round differently even alone, then roundings the fusion and the op-by-op run place differently
    (:func:`rounding_hazards`). Empty when rejecting the region keeps every bit."""
    leaves = [leaf for b in region.body for leaf in _leaves(b, metadata_ops)]
    alone = len(leaves) == 1
    inexact = sorted({th.op_name(leaf) for leaf in leaves if not _exact_leaf(leaf, alone)})
    return inexact + rounding_hazards(region.body, metadata_ops)


def rebuild_keeps_bits(body: list[th.BoundSymbol], metadata_ops: Iterable[str] = ()) -> bool:
    """Whether a fusion rebuilt from ``body`` plus or minus views still computes the same bits.

    Only element-wise exact arithmetic qualifies: a reduction's order, and so its rounding, follows the
    schedule the fusion compiler picks, and a different fusion definition may get a different one (a
    nanoGPT block's backward on nvFuser did). Roundings a fusion may skip (:func:`rounding_hazards`)
    count too: a rebuilt fusion may skip them differently.
    """
    body = [b for b in body if not th.is_comment_or_del(b)]
    names = {n for b in body for n in _leaf_names(b, metadata_ops)}
    return names <= REBUILD_SAFE and not rounding_hazards(body, metadata_ops)


# --- Contraction: products a compiler may fuse with an addition, and what a split must not hand across ------

# Ops that hand a product on unchanged, so that an addition reading their output may still be contracted with it.
_KEEPS_A_PRODUCT: frozenset[str] = DATA_MOVEMENT_OPS | {"neg", "where"}

# (executor, device type) pairs whose compiler contracts a product and the addition reading it into one fused
# multiply-add where both sit in one kernel: nvFuser (nvrtc's default), Inductor's Triton kernels on CUDA (its C++
# on CPU compiles with -ffp-contract=off). How the executor segments a fusion decides which pairs share a kernel,
# and a rebuilt fusion may be segmented otherwise: a float32 rotary block split for hoisting gave 190 of its 512
# outputs other bits on an H100 (nvFuser 0.2.36), ``q * cos`` rounded between two kernels of Thunder's fusion and
# contracted with the addition in the one kernel of the rebuilt rest (the cos and sin tables had the same bits).
CONTRACTING: frozenset[tuple[str, str]] = frozenset({("nvfuser", "cuda"), ("torchcompile", "cuda")})


def contracts(executor: str, device_type: str | None) -> bool:
    """Whether ``executor``'s fusions on ``device_type`` may contract a product with an addition (:data:`CONTRACTING`;
    an unknown device counts as one that does)."""
    if device_type is None:
        return any(executor == ex for ex, _ in CONTRACTING)
    return (executor, device_type) in CONTRACTING


def contractible_products(body: Iterable[th.BoundSymbol]) -> list[str]:
    """The floating-point products of ``body`` (:func:`_products`) that an addition or subtraction of ``body``
    reads: pairs a contracting compiler (:func:`contracts`) may fuse into one multiply-add in one segmentation of a
    rebuilt fusion and round apart in another."""
    body = list(body)
    products = _products(body)
    found = []
    for b in body:
        for leaf in th.leaves(b):
            if th.op_name(leaf) in ("add", "sub") and not th.is_comment_or_del(leaf):
                found.extend(p.name for p in leaf.flat_proxy_args if p.name in products)
    return sorted(set(found))


def _products(body: Iterable[th.BoundSymbol]) -> set[str]:
    """The floating-point values of ``body`` that are a product (``mul``), directly or through views, data movement
    and ``neg``."""
    found: set[str] = set()
    for b in body:
        for leaf in th.leaves(b):
            if th.is_comment_or_del(leaf):
                continue
            name = th.op_name(leaf)
            passes = is_metadata(leaf) or name in _KEEPS_A_PRODUCT
            if name == "mul" or (passes and any(p.name in found for p in leaf.flat_proxy_args)):
                found.update(p.name for p in leaf.flat_proxy_outs if _floating(p))
    return found


def _floating(p: Any) -> bool:
    dtype = th.torch_dtype(p) if isinstance(p, th.TensorProxy) else None
    return dtype is not None and dtype.is_floating_point


def cut_can_move(executor: str) -> bool:
    """Whether a split of a fusion of ``executor`` may leave some input-independent ops with the rest of the region
    (reading what they read from the hoisted call) and still have them compute the same bits there: yes for
    :data:`PER_ELEMENT_EXECUTORS`, whose conversions and products are explicit per element. Not Inductor: it
    converts an index expression (an arange) to bfloat16 from the first element of each vector, a loaded tensor
    element by element (300 relative positions cast to bfloat16: the whole fusion's bits and the split's differ)."""
    return executor in PER_ELEMENT_EXECUTORS


def cut_hazards(body: Iterable[th.BoundSymbol], crossing: Iterable[th.Proxy]) -> dict[str, str]:
    """The values of ``crossing`` that ``body`` (one piece of a split region) must not hand across the cut, each
    with why: a value it rounds to a narrower dtype (:func:`rounding_at_cut`: the whole fusion may have kept it
    unrounded), and a product, which the whole fusion may have contracted with the addition that reads it into
    one fused multiply-add (nvFuser compiles with contraction on); a stored value is rounded first. Handing
    across the values such a value is computed from instead keeps the fusion's bits."""
    body = list(body)
    names = {p.name for p in crossing}
    hazards = {name: f"{how}, a rounding the whole fusion may skip" for name, how in rounded_values(body).items()}
    for name in _products(body):
        hazards.setdefault(name, "a product, which the whole fusion may contract with an addition")
    return {name: why for name, why in hazards.items() if name in names}


def _integers_only(bsym: th.BoundSymbol) -> bool:
    tensors = [p for p in (*bsym.flat_proxy_args, *bsym.flat_proxy_outs) if isinstance(p, th.TensorProxy)]
    return bool(tensors) and all(is_integer_or_bool(p) for p in tensors)


def hoist_keeps_bits(
    body: Iterable[th.BoundSymbol], metadata_ops: Iterable[str] = (), executor: str | None = None
) -> bool:
    """Whether the ops of ``body`` give the same bits in a fusion rebuilt to hoist part of a region:
    :func:`rebuild_keeps_bits` ops, ops that only move data (setitem, cat, pad, gathers), ops that compute on integers
    and booleans only (``arange``, index arithmetic, comparisons: no rounding) and, where ``executor`` is one
    of :data:`PER_ELEMENT_EXECUTORS`, element-wise ops that round (cos, pow, division)."""
    return not hoist_inexact_ops(body, metadata_ops, executor)


def hoist_inexact_ops(
    body: Iterable[th.BoundSymbol], metadata_ops: Iterable[str] = (), executor: str | None = None
) -> list[str]:
    """The names of the innermost ops of ``body`` that could round differently in a fusion of ``executor`` rebuilt
    to hoist part of a region (empty: :func:`hoist_keeps_bits`)."""
    metadata_ops = tuple(metadata_ops)
    per_element = executor in PER_ELEMENT_EXECUTORS
    found: list[str] = []
    for b in body:
        if not th.is_comment_or_del(b):
            found.extend(_failing(b, lambda op: _op_keeps_bits(op, metadata_ops, per_element)))
    return sorted(set(found))


def _op_keeps_bits(bsym: th.BoundSymbol, metadata_ops: tuple[str, ...], per_element: bool = False) -> bool:
    name = th.op_name(bsym)
    if per_element and name in ELEMENTWISE_ROUNDING_OPS:
        return True
    moves = name in DATA_MOVEMENT_OPS or name in GATHER_OPS
    return moves or _integers_only(bsym) or rebuild_keeps_bits([bsym], metadata_ops)


def _failing(bsym: th.BoundSymbol, ok: Callable[[th.BoundSymbol], bool]) -> list[str]:
    """The names of the innermost ops of ``bsym`` for which ``ok`` fails where ``ok`` fails for every op above them."""
    if ok(bsym):
        return []
    subs = th.fusion_body(bsym)
    return [n for s in subs for n in _failing(s, ok)] if subs else [th.op_name(bsym)]


def _all_the_way_down(bsym: th.BoundSymbol, ok: Callable[[th.BoundSymbol], bool]) -> bool:
    """Whether ``ok`` holds for ``bsym`` or, where it does not, for every op it decomposes into, recursively."""
    return not _failing(bsym, ok)


def switch_keeps_bits(body: Iterable[th.BoundSymbol], metadata_ops: Iterable[str] = ()) -> bool:
    """Whether another fusion compiler gives ``body`` the same bits: every op exact whoever runs it
    (:data:`EXACT_OPS`, a lone :data:`EXACT_ALONE` op, data movement, integer and boolean arithmetic) and no
    rounding a compiler may skip. Stricter than :func:`rebuild_keeps_bits`: two compilers need not divide,
    or take ``abs`` of a zero, alike; broader than :func:`inexact_ops`: moving data never rounds."""
    body = [b for b in body if not th.is_comment_or_del(b)]
    metadata_ops = tuple(metadata_ops)
    alone = len([n for b in body for n in _leaf_names(b, metadata_ops)]) == 1
    exact = EXACT_OPS | EXACT_ALONE if alone else EXACT_OPS

    def exact_anywhere(b: th.BoundSymbol) -> bool:
        name = th.op_name(b)
        moves = name in DATA_MOVEMENT_OPS or name in GATHER_OPS
        return is_metadata(b, metadata_ops) or name in exact or moves or _integers_only(b)

    return all(_all_the_way_down(b, exact_anywhere) for b in body) and not rounding_hazards(body, metadata_ops)
