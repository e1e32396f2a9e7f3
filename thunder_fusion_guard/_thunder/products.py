"""Thunder's matmuls as the guard reads them, and the products and sum that compute a matmul over a few terms
inside a fusion region (:mod:`..passes.small_matmuls`)."""

from __future__ import annotations

from typing import Any, NamedTuple

from thunder.core import dtypes, prims
from thunder.core.proxies import TensorProxy
from thunder.core.symbol import BoundSymbol
from thunder.core.trace import TraceCtx, from_trace, reset_tracectx, set_tracectx

from .lowering import swap_proxies

__all__ = ["Matmul", "matmul_of", "matmul_products"]


class Matmul(NamedTuple):
    """A matmul ``out = a @ b`` of float32 tensors of two dims or more: ``a`` is [..., M, K], ``b`` [..., K, N]."""

    a: TensorProxy
    b: TensorProxy
    out: TensorProxy

    @property
    def inner(self) -> int:
        """K, the number of terms each output element sums."""
        return int(self.a.shape[-1])


def matmul_of(bsym: BoundSymbol) -> Matmul | None:
    """``bsym`` as a :class:`Matmul` where it is one (torch's, Thunder's or its prim, on two float32 tensors of two
    dims or more); None for any other op."""
    if bsym.sym.name != "matmul" or len(bsym.args) != 2 or bsym.kwargs:
        return None
    a, b = bsym.args
    out = bsym.output
    tensors = (a, b, out)
    if not all(isinstance(t, TensorProxy) and t.dtype == dtypes.float32 for t in tensors):
        return None
    if a.ndim < 2 or b.ndim < 2 or a.shape[-1] != b.shape[-2]:
        return None
    return Matmul(a, b, out)


def matmul_products(trace: TraceCtx, mm: Matmul) -> list[BoundSymbol]:
    """The prims computing ``mm.out`` as ``sum(a[..., :, :, None] * b[..., None, :, :], -2)``: both operands
    broadcast to [..., M, K, N], multiplied, summed over K; their other results named fresh in ``trace``."""
    a, b = mm.a, mm.b
    batch = _broadcast(tuple(a.shape[:-2]), tuple(b.shape[:-2]))
    full = (*batch, a.shape[-2], a.shape[-1], b.shape[-1])
    last = len(full) - 1
    scratch = from_trace(trace)
    token = set_tracectx(scratch)
    try:
        wide_a = prims.broadcast_in_dim(a, full, [*_batch_dims(a, batch), last - 2, last - 1])
        wide_b = prims.broadcast_in_dim(b, full, [*_batch_dims(b, batch), last - 1, last])
        summed: Any = prims.sum(prims.mul(wide_a, wide_b), (last - 1,))
    finally:
        reset_tracectx(token)
    return [swap_proxies(x, [(summed, mm.out)]) for x in scratch.bound_symbols]


def _broadcast(x: tuple[int, ...], y: tuple[int, ...]) -> tuple[int, ...]:
    """The batch shape two operands' batch shapes broadcast to (right-aligned, a 1 takes the other's size)."""
    n = max(len(x), len(y))
    x, y = (1,) * (n - len(x)) + x, (1,) * (n - len(y)) + y
    return tuple(max(i, j) for i, j in zip(x, y, strict=True))


def _batch_dims(operand: TensorProxy, batch: tuple[int, ...]) -> list[int]:
    """Where an operand's batch dims go in the broadcast [..., M, K, N]: right-aligned with the batch shape."""
    return list(range(len(batch) - (operand.ndim - 2), len(batch)))
