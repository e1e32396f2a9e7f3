"""Thunder's zero pads and plain adds as the guard reads them, and the concatenation that replaces a sum of pads
(:mod:`..passes.padded_sums`)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import thunder.torch as ltorch
from thunder.core import dtypes, prims
from thunder.core.proxies import Proxy, TensorProxy
from thunder.core.symbol import BoundSymbol
from thunder.core.trace import TraceCtx, from_trace, reset_tracectx, set_tracectx

from .lowering import swap_proxies

__all__ = [
    "PadPiece",
    "SliceRange",
    "concatenation",
    "float_conversion",
    "pad_piece",
    "plain_add",
    "slice_range",
    "widened",
]


class PadPiece(NamedTuple):
    """A zero pad along one dim: the padded ``tensor`` lying at ``start`` along ``dim``."""

    tensor: TensorProxy
    dim: int
    start: int


def pad_piece(bsym: BoundSymbol) -> PadPiece | None:
    """The piece a ``prims.pad`` by +0.0 along exactly one dim, without interior padding nor cropping, places
    into its output; None for any other op."""
    if bsym.sym.id is not prims.PrimIDs.PAD or len(bsym.args) < 3:
        return None
    a, value, config = bsym.args[:3]
    if not isinstance(a, TensorProxy) or not isinstance(value, (int, float)) or isinstance(value, bool):
        return None
    if value != 0 or math.copysign(1.0, float(value)) < 0:
        return None
    try:
        padded = [d for d, (lo, hi, interior) in enumerate(config) if (lo, hi, interior) != (0, 0, 0)]
        if len(padded) != 1 or any(lo < 0 or hi < 0 or interior != 0 for lo, hi, interior in config):
            return None
    except (TypeError, ValueError):
        return None
    return PadPiece(a, padded[0], int(config[padded[0]][0]))


class SliceRange(NamedTuple):
    """A slice of ``source`` along ``dim`` from ``start`` to ``stop``, unit step, whole along the other dims."""

    source: TensorProxy
    dim: int
    start: int
    stop: int


# Thunder's torch executor runs prims.slice_prim as this op, with the prim's arguments.
_TORCH_SLICE = "torch_slice_prim_impl"


def _is_slice(bsym: BoundSymbol) -> bool:
    return bsym.sym.id is prims.PrimIDs.SLICE or bsym.sym.name == _TORCH_SLICE


def slice_range(bsym: BoundSymbol) -> SliceRange | None:
    """The range a ``prims.slice_prim`` with unit steps (or an op that is one, as ``ltorch.getitem`` may be) takes
    along its one sliced dim; None for any other op."""
    while not _is_slice(bsym) and len(bsym.subsymbols) == 1:
        inner = bsym.subsymbols[0]
        if not isinstance(inner.output, Proxy) or not isinstance(bsym.output, Proxy):
            return None
        if inner.output.name != bsym.output.name:
            return None
        bsym = inner
    if not _is_slice(bsym) or len(bsym.args) < 3:
        return None
    a, starts, ends = bsym.args[:3]
    steps = bsym.args[3] if len(bsym.args) > 3 else bsym.kwargs.get("strides")
    if not isinstance(a, TensorProxy) or (steps is not None and any(s != 1 for s in steps)):
        return None
    try:
        cut = [d for d, (lo, hi, n) in enumerate(zip(starts, ends, a.shape, strict=True)) if (lo, hi) != (0, n)]
    except (TypeError, ValueError):
        return None
    if len(cut) != 1:
        return None
    return SliceRange(a, cut[0], int(starts[cut[0]]), int(ends[cut[0]]))


# (exponent bits, mantissa bits) of the floating dtypes a widening conversion may go between.
_FLOAT_BITS = {dtypes.bfloat16: (8, 7), dtypes.float16: (5, 10), dtypes.float32: (8, 23), dtypes.float64: (11, 52)}


def _float_bits(dtype: Any) -> tuple[int, int] | None:
    same = dtypes.are_same_dtypes
    return next((bits for d, bits in _FLOAT_BITS.items() if same(d, dtype, weak_and_strong_are_equivalent=True)), None)


def widened(bsym: BoundSymbol) -> TensorProxy | None:
    """The tensor a ``prims.convert_element_type`` converts to a floating dtype holding every value of its own
    exactly (bf16 or fp16 to fp32, fp32 to fp64: what nvFuser's regions do before adding); None for any other op."""
    if bsym.sym.id is not prims.PrimIDs.CONVERT_ELEMENT_TYPE or len(bsym.args) < 2:
        return None
    a, dtype = bsym.args[:2]
    if not isinstance(a, TensorProxy):
        return None
    source, target = _float_bits(a.dtype), _float_bits(dtype)
    if source is None or target is None or target[0] < source[0] or target[1] < source[1]:
        return None
    return a


def float_conversion(bsym: BoundSymbol) -> TensorProxy | None:
    """The tensor a ``prims.convert_element_type`` from one floating dtype to another converts; None for any other
    op."""
    if bsym.sym.id is not prims.PrimIDs.CONVERT_ELEMENT_TYPE or len(bsym.args) < 2:
        return None
    a, dtype = bsym.args[:2]
    if not isinstance(a, TensorProxy) or _float_bits(a.dtype) is None or _float_bits(dtype) is None:
        return None
    return a


def plain_add(bsym: BoundSymbol) -> tuple[TensorProxy, TensorProxy] | None:
    """The two tensors of ``a + b`` (``ltorch.add`` with alpha 1, or ``prims.add``) of one floating dtype and
    shape, that of the result; None for any other op."""
    if bsym.sym.id is prims.PrimIDs.ADD:
        args = bsym.args[:2]
    elif bsym.sym.id == ltorch.add.id:
        alpha = bsym.kwargs.get("alpha", bsym.args[2] if len(bsym.args) > 2 else None)
        if alpha not in (None, 1):
            return None
        args = bsym.args[:2]
    else:
        return None
    out = bsym.output
    if len(args) != 2 or not all(isinstance(a, TensorProxy) for a in (*args, out)):
        return None
    if not dtypes.is_float_dtype(out.dtype) or any(a.dtype != out.dtype or a.shape != out.shape for a in args):
        return None
    return args[0], args[1]


def concatenation(
    trace: TraceCtx, pieces: Sequence[Proxy | SliceRange], dim: int, out: TensorProxy
) -> list[BoundSymbol]:
    """The ops computing ``out = cat([piece + 0.0 for piece in pieces], dim)`` (a conversion to ``out``'s dtype
    where the pieces have another, ``ltorch.add``, ``ltorch.cat``), their other results named fresh in ``trace``; a
    :class:`SliceRange` piece is sliced here (a whole source is taken as it is), and one piece needs no ``cat``.
    Adding +0.0 turns a -0.0 into +0.0 and leaves every other value as it is, as a sum of the pieces zero-padded
    does. Added to each piece rather than to the joined tensor, it runs where the piece is made: an executor that
    writes each piece of a ``cat`` into its slice (Inductor) writes the tensor once, not once more for the add."""
    scratch = from_trace(trace)
    token = set_tracectx(scratch)
    try:
        parts = [_plus_zero(_sliced(p) if isinstance(p, SliceRange) else p, out.dtype) for p in pieces]
        joined: Any = parts[0] if len(parts) == 1 else ltorch.cat(parts, dim)
    finally:
        reset_tracectx(token)
    return [swap_proxies(b, [(joined, out)]) for b in scratch.bound_symbols]


def _plus_zero(piece: Any, dtype: Any) -> Any:
    """``piece`` converted to ``dtype`` where it has another, plus +0.0."""
    if piece.dtype != dtype:
        piece = prims.convert_element_type(piece, dtype)
    return ltorch.add(piece, 0.0)


def _sliced(piece: SliceRange) -> Any:
    """``piece`` as a tensor: its source where the range is all of it, else a ``prims.slice_prim``."""
    source, dim = piece.source, piece.dim
    if (piece.start, piece.stop) == (0, source.shape[dim]):
        return source
    starts = [piece.start if d == dim else 0 for d in range(source.ndim)]
    ends = [piece.stop if d == dim else n for d, n in enumerate(source.shape)]
    return prims.slice_prim(source, starts, ends)
