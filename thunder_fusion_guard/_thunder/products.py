"""Thunder's matmuls and linears as the guard reads them, the products and sum that compute one over a few terms
inside a fusion region (:mod:`..passes.small_matmuls`), and the prims behind the torch executor's own views (what
a region runs for a view left outside it)."""

from __future__ import annotations

from typing import Any, NamedTuple

from thunder.core import dtypes, prims
from thunder.core.proxies import TensorProxy
from thunder.core.symbol import BoundSymbol
from thunder.core.trace import TraceCtx, from_trace, reset_tracectx, set_tracectx

from .lowering import swap_proxies

__all__ = ["Matmul", "matmul_of", "matmul_products", "view_as_prim"]


class Matmul(NamedTuple):
    """A matmul ``out = a @ b`` of float32 tensors of two dims or more (``a`` [..., M, K], ``b`` [..., K, N]), or a
    linear ``out = a @ b.T + bias`` (``a`` [..., K], ``b`` [N, K], ``bias`` [N] or None)."""

    a: TensorProxy
    b: TensorProxy
    out: TensorProxy
    linear: bool = False
    bias: TensorProxy | None = None

    @property
    def inner(self) -> int:
        """K, the number of terms each output element sums."""
        return int(self.a.shape[-1])

    @property
    def operands(self) -> tuple[TensorProxy, ...]:
        """The tensors it reads."""
        return (self.a, self.b) if self.bias is None else (self.a, self.b, self.bias)


def matmul_of(bsym: BoundSymbol) -> Matmul | None:
    """``bsym`` as a :class:`Matmul` where it is one (torch's, Thunder's or its prim, on two float32 tensors of two
    dims or more; a linear on float32 tensors); None for any other op."""
    if bsym.sym.name == "linear":
        return _linear_of(bsym)
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


def _linear_of(bsym: BoundSymbol) -> Matmul | None:
    """A linear on float32 tensors (a weight of two dims, a bias of one or none) as a :class:`Matmul`."""
    args = [*bsym.args, *bsym.kwargs.values()]
    if len(args) not in (2, 3) or (len(bsym.kwargs) and set(bsym.kwargs) != {"bias"}):
        return None
    a, w, bias = (*args, None)[:3]
    out = bsym.output
    tensors = (a, w, out) if bias is None else (a, w, bias, out)
    if not all(isinstance(t, TensorProxy) and t.dtype == dtypes.float32 for t in tensors):
        return None
    if a.ndim < 1 or w.ndim != 2 or a.shape[-1] != w.shape[-1] or (bias is not None and bias.ndim != 1):
        return None
    return Matmul(a, w, out, linear=True, bias=bias)


def matmul_products(trace: TraceCtx, mm: Matmul) -> list[BoundSymbol]:
    """The prims computing ``mm.out`` as ``sum(a[..., :, :, None] * b[..., None, :, :], -2)``: both operands
    broadcast to [..., M, K, N], multiplied, summed over K (a linear: ``sum(a[..., None, :] * w, -1) + bias``);
    their other results named fresh in ``trace``."""
    if mm.linear:
        return _linear_products(trace, mm)
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


def _linear_products(trace: TraceCtx, mm: Matmul) -> list[BoundSymbol]:
    """The prims computing a linear: ``a`` and the weight broadcast to [..., N, K], multiplied, summed over K, the
    bias added after the sum (where cuBLAS's epilogue adds it)."""
    a, w = mm.a, mm.b
    full = (*a.shape[:-1], w.shape[0], a.shape[-1])
    last = len(full) - 1
    scratch = from_trace(trace)
    token = set_tracectx(scratch)
    try:
        wide_a = prims.broadcast_in_dim(a, full, [*range(last - 1), last])
        wide_w = prims.broadcast_in_dim(w, full, [last - 1, last])
        summed: Any = prims.sum(prims.mul(wide_a, wide_w), (last,))
        if mm.bias is not None:
            summed = prims.add(summed, prims.broadcast_in_dim(mm.bias, tuple(summed.shape), [last - 1]))
    finally:
        reset_tracectx(token)
    return [swap_proxies(x, [(summed, mm.out)]) for x in scratch.bound_symbols]


# The torch executor's own implementations of view prims, and the prims they implement.
_TORCH_VIEW_PRIMS = {"torch_prims_reshape_impl": prims.reshape, "torch_slice_prim_impl": prims.slice_prim}


def view_as_prim(bsym: BoundSymbol) -> BoundSymbol:
    """``bsym`` as a fusion region runs it: the torch executor's implementation of ``prims.reshape`` or
    ``prims.slice_prim`` (an op no fusion executor claims) bound as that prim, the same arguments and output;
    any other op as it is (a torch op the torch executor runs keeps Thunder's decomposition as its subsymbols)."""
    prim = _TORCH_VIEW_PRIMS.get(bsym.sym.name)
    return bsym if prim is None else prim.bind(*bsym.args, **bsym.kwargs, output=bsym.output)


def _broadcast(x: tuple[int, ...], y: tuple[int, ...]) -> tuple[int, ...]:
    """The batch shape two operands' batch shapes broadcast to (right-aligned, a 1 takes the other's size)."""
    n = max(len(x), len(y))
    x, y = (1,) * (n - len(x)) + x, (1,) * (n - len(y)) + y
    return tuple(max(i, j) for i, j in zip(x, y, strict=True))


def _batch_dims(operand: TensorProxy, batch: tuple[int, ...]) -> list[int]:
    """Where an operand's batch dims go in the broadcast [..., M, K, N]: right-aligned with the batch shape."""
    return list(range(len(batch) - (operand.ndim - 2), len(batch)))
