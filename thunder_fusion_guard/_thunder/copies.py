"""Copies into slices of a new zero tensor as the guard reads them in a computation trace before Thunder
differentiates it, and the concatenation that computes the same tensor out of place
(:mod:`..passes.copies_as_cat`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import thunder.torch as ltorch
from thunder.core.proxies import Proxy, TensorProxy
from thunder.core.symbol import BoundSymbol
from thunder.core.trace import TraceCtx, from_trace, reset_tracectx, set_tracectx

from .padded import slice_range
from .traces import has_symbolic_shape

__all__ = ["Span", "copy_into", "joined_copies", "new_zeros_of", "scratch_trace", "span_of"]

# The ops making a tensor of zeros that nothing else holds (Thunder's names for them before its grad transform).
_ZEROS = frozenset({ltorch.zeros.id, ltorch.new_zeros.id, ltorch.zeros_like.id})


class Span(NamedTuple):
    """A view of ``base`` from ``start`` to ``stop`` along ``dim`` (non-negative), whole along every other dim."""

    base: TensorProxy
    dim: int
    start: int
    stop: int


def new_zeros_of(bsym: BoundSymbol) -> TensorProxy | None:
    """The tensor ``bsym`` makes when it is ``zeros``, ``new_zeros`` or ``zeros_like`` of a static shape (a
    tensor of zeros no other tensor shares); None for any other op."""
    out = bsym.output
    if bsym.sym.id not in _ZEROS or not isinstance(out, TensorProxy) or has_symbolic_shape(out):
        return None
    return out


def span_of(bsym: BoundSymbol) -> Span | None:
    """The view ``ltorch.narrow`` (static arguments) or a unit-step slicing ``ltorch.getitem`` takes of one
    tensor along one dim; None for any other op."""
    out = bsym.output
    if not isinstance(out, TensorProxy) or not bsym.args or not isinstance(bsym.args[0], TensorProxy):
        return None
    base = bsym.args[0]
    if bsym.sym.id == ltorch.narrow.id:
        args = [*bsym.args[1:], *bsym.kwargs.values()]
        if len(args) != 3 or not all(isinstance(a, int) and not isinstance(a, bool) for a in args):
            return None
        dim, start, length = args
        dim = dim % base.ndim if base.ndim else 0
        start = start % base.shape[dim] if start < 0 else start
        return Span(base, dim, start, start + length)
    if bsym.sym.id == ltorch.getitem.id:
        inner = [s for s in bsym.subsymbols if isinstance(s.output, Proxy) and s.output.name == out.name]
        found = slice_range(inner[0]) if len(inner) == 1 else None
        if found is None or found.source.name != base.name or tuple(out.shape) != _cut(base, found):
            return None
        return Span(base, found.dim, found.start, found.stop)
    return None


def _cut(base: TensorProxy, r: Any) -> tuple[int, ...]:
    return tuple(r.stop - r.start if d == r.dim else n for d, n in enumerate(base.shape))


def copy_into(bsym: BoundSymbol) -> tuple[TensorProxy, TensorProxy] | None:
    """``(destination, source)`` of ``ltorch.copy_`` where both are tensors of one shape, dtype and device (no
    broadcast, no conversion); None for any other op."""
    if bsym.sym.id != ltorch.copy_.id or len(bsym.args) < 2:
        return None
    dst, src = bsym.args[:2]
    if not isinstance(dst, TensorProxy) or not isinstance(src, TensorProxy):
        return None
    if tuple(dst.shape) != tuple(src.shape) or dst.dtype != src.dtype or dst.device != src.device:
        return None
    return dst, src


def scratch_trace(trace: TraceCtx) -> TraceCtx:
    """An empty trace naming its results apart from ``trace``'s, for :func:`joined_copies` to record into."""
    return from_trace(trace)


def joined_copies(
    scratch: TraceCtx, base: TensorProxy, dim: int, pieces: Sequence[tuple[int, TensorProxy]]
) -> tuple[list[BoundSymbol], TensorProxy]:
    """The ops computing a tensor of ``base``'s shape, the ``(start, source)`` pieces laid along ``dim`` in order
    and zeros in the gaps between them (``ltorch.cat``; a clone where one piece covers it all), recorded in
    ``scratch``, and that tensor. Each element is the value copied there, or zero: the bits the copies wrote."""
    first = len(scratch.bound_symbols)
    token = set_tracectx(scratch)
    try:
        parts: list[Any] = []
        at = 0
        for start, source in [*pieces, (base.shape[dim], None)]:
            if start > at:
                shape = [start - at if d == dim else n for d, n in enumerate(base.shape)]
                parts.append(ltorch.new_zeros(source if source is not None else parts[-1], shape))
            if source is not None:
                parts.append(source)
                at = start + source.shape[dim]
        result: Any = ltorch.clone(parts[0]) if len(parts) == 1 else ltorch.cat(parts, dim)
    finally:
        reset_tracectx(token)
    return list(scratch.bound_symbols[first:]), result
