"""Where running ops one by one rounds differently from one fusion of them, and where splitting a fusion rounds."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from .. import _thunder as th
from .metadata import is_metadata

__all__ = [
    "holds_every_value",
    "integer_bounds",
    "is_integer_or_bool",
    "rounded_values",
    "rounding_at_cut",
    "rounding_hazards",
]

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


def rounding_hazards(body: Iterable[th.BoundSymbol], metadata_ops: Iterable[str] = ()) -> list[str]:
    """Roundings that running ``body`` op by op would place differently from one fusion of it: a
    narrowing conversion (float32 -> bf16, ...) whose result another op of the body reads, and a number
    that is not a value of the bf16/fp16 tensor it meets. Each item says which and where."""
    metadata_ops = frozenset(metadata_ops)
    body = [b for b in body if not th.is_comment_or_del(b)]
    found: list[str] = []
    leaves = [leaf for b in body for leaf in th.leaves(b) if not th.is_comment_or_del(leaf)]
    read_by: dict[str, list[str]] = {}
    for leaf in leaves:
        for p in leaf.flat_proxy_args:
            read_by.setdefault(p.name, []).append(th.op_name(leaf))
    bounds = integer_bounds(leaves)
    for leaf in leaves:
        conv = th.conversion(leaf)
        if conv is None:
            continue
        source, target = conv
        source_dtype = th.torch_dtype(source)
        readers = read_by.get(leaf.output.name, []) if isinstance(leaf.output, th.Proxy) else []
        if source.name in bounds and _holds_integers(target, bounds[source.name]):
            continue  # an arange's values, each one a value of the target dtype: converting never rounds
        if source_dtype is not None and readers and not holds_every_value(target, source_dtype):
            found.append(
                f"{leaf.output.name}: {_short(source_dtype)} rounded to {_short(target)} and read again inside "
                f"the region (by {readers[0]}), a rounding the fusion may skip"
            )
    for b in body:
        for op in (b, *th.leaves(b)):
            if is_metadata(op, metadata_ops):
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


def integer_bounds(leaves: Iterable[th.BoundSymbol]) -> dict[str, tuple[int, int]]:
    """(lowest, highest) value of each integer tensor of ``leaves`` (innermost ops, in order) whose values are
    known from the program alone: an ``iota`` of Python numbers (what ``arange`` becomes, a float one too) and
    what views, negation, and additions and products with Python integers make of it."""
    bounds: dict[str, tuple[int, int]] = {}
    for leaf in leaves:
        out = leaf.output if isinstance(leaf.output, th.TensorProxy) else None
        if out is None or th.is_comment_or_del(leaf) or not is_integer_or_bool(out):
            continue
        name = th.op_name(leaf)
        tensors = [p for p in leaf.flat_proxy_args if isinstance(p, th.TensorProxy)]
        numbers = th.number_args(leaf)
        found: tuple[int, int] | None = None
        if name == "iota":
            found = _iota_bounds(leaf)
        elif len(tensors) == 1 and tensors[0].name in bounds:
            lo, hi = bounds[tensors[0].name]
            if is_metadata(leaf):
                found = (lo, hi)
            elif name == "neg":
                found = (-hi, -lo)
            elif name in ("add", "sub", "mul") and len(numbers) == 1 and type(numbers[0]) is int:
                found = _with_number(name, lo, hi, numbers[0], number_first=not isinstance(leaf.flat_args[0], th.Proxy))
        if found is not None:
            bounds[out.name] = found
    return bounds


def _iota_bounds(leaf: th.BoundSymbol) -> tuple[int, int] | None:
    """(lowest, highest) value of ``prims.iota(length, start=, step=)`` when all three are Python integers."""
    length = leaf.args[0] if leaf.args else leaf.kwargs.get("length")
    start, step = leaf.kwargs.get("start"), leaf.kwargs.get("step")
    if not all(type(v) is int for v in (length, start, step)) or length <= 0:
        return None
    last = start + (length - 1) * step
    return min(start, last), max(start, last)


def _with_number(name: str, lo: int, hi: int, number: int, number_first: bool) -> tuple[int, int]:
    if name == "add":
        return lo + number, hi + number
    if name == "sub":
        return (number - hi, number - lo) if number_first else (lo - number, hi - number)
    ends = (lo * number, hi * number)
    return min(ends), max(ends)


def _holds_integers(target: torch.dtype, bounds: tuple[int, int]) -> bool:
    """Whether every integer from ``bounds[0]`` to ``bounds[1]`` is a value of ``target`` (an integer or boolean
    target counts, as in :func:`holds_every_value`)."""
    if target not in _FLOAT_BITS:
        return True
    return max(abs(bounds[0]), abs(bounds[1])) <= 2 ** _FLOAT_BITS[target][1]


def rounding_at_cut(body: Iterable[th.BoundSymbol], crossing: Iterable[th.Proxy]) -> dict[str, str]:
    """Values of ``crossing`` (what one piece of a split region hands the other) that ``body`` computes by a
    narrowing conversion, directly or through ops that keep them in reduced precision (views, cat, where), by
    name, with how each was rounded (``int64 rounded to bfloat16``).

    Splitting stores a crossing value at its dtype; the whole fusion may have skipped that rounding
    (:func:`rounding_hazards`), so such a value changes the bits. Roundings on one side of the cut are
    made alike by the piece's own fusion, and values that never cross are stored as before.
    """
    rounded = rounded_values(body)
    return {name: rounded[name] for name in sorted({p.name for p in crossing} & rounded.keys())}


def rounded_values(body: Iterable[th.BoundSymbol]) -> dict[str, str]:
    """Each value of ``body`` made by a narrowing conversion, directly or through ops that keep it in reduced
    precision, with how it was rounded."""
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
    return rounded


def _short(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def is_integer_or_bool(p: Any) -> bool:
    """True for a tensor proxy of an integer or boolean dtype (arithmetic on them never rounds)."""
    dtype = th.torch_dtype(p) if isinstance(p, th.TensorProxy) else None
    return dtype is not None and not (dtype.is_floating_point or dtype.is_complex)
