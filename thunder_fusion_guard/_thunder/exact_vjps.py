"""Thunder's automatic gradients (``tensordot_vjp``, ``spmm_vjp``, ...) run without their forward
(:mod:`..passes.exact_vjps`).

Thunder 0.2.6 computes the gradient of an op it registered automatically by ``torch.autograd.functional.vjp`` over
the op: each backward call runs the op forward again and hands autograd's engine a graph of one op. The ops autograd
runs for that gradient do not read the forward's result (a matmul's gradient reads its inputs), so the same ops
without the forward give the same values. :class:`ExactVjp` records them once per argument layout (shapes, strides,
dtypes: what autograd's formulas branch on) with ``make_fx`` tracing Thunder's own call, drops what nothing returned
reads, and checks the recording's first result against Thunder's own call bit for bit; a layout that cannot be
recorded or differs runs Thunder's call from then on.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from thunder.torch import _vjp_impl
from torch.fx.experimental.proxy_tensor import make_fx
from torch.utils._pytree import tree_flatten, tree_unflatten

from .traces import BoundSymbol

__all__ = ["ExactVjp", "automatic_vjp_of", "bitwise_equal"]


def automatic_vjp_of(bsym: BoundSymbol) -> Callable | None:
    """The torch function whose automatic gradient ``bsym`` computes (Thunder's torch executor calling its
    ``torch.autograd.functional.vjp`` wrapper); None for any other op."""
    call = (bsym._call_ctx or {}).get(bsym.sym.name)
    if isinstance(call, functools.partial) and call.func is _vjp_impl and len(call.args) == 1:
        return call.args[0]
    return None


def _layout(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return (tuple(value.shape), value.stride(), value.dtype, value.device, value.layout)
    if value is None or isinstance(value, (bool, int, float, str, torch.dtype, torch.device)):
        return (type(value), value)
    return None  # not recorded by value: such a call runs Thunder's own


class ExactVjp:
    """Thunder's ``_vjp_impl`` of ``torchfn`` with the forward left out: recorded per argument layout, the first
    result of each recording checked equal to Thunder's. ``on_first`` is told, per layout, whether the recording
    runs (None) or why Thunder's call does."""

    def __init__(self, torchfn: Callable, on_first: Callable[[str | None], None] | None = None) -> None:
        self.torchfn = torchfn
        self.on_first = on_first
        self._recorded: dict[Any, Any] = {}  # layout -> (GraphModule, result's spec), or None: Thunder's call runs

    def __call__(self, saved: Any, *grads: Any) -> Any:
        flat, spec = tree_flatten((saved, grads))
        key = tuple(_layout(v) for v in flat)
        recorded = self._recorded.get(key, False) if None not in key else None
        if recorded is False:
            return self._first(key, flat, spec, saved, grads)
        if recorded is None:
            return _vjp_impl(self.torchfn, saved, *grads)
        graph, out_spec, is_tensor = recorded
        return tree_unflatten(_placed(graph(*[v for v in flat if isinstance(v, torch.Tensor)]), is_tensor), out_spec)

    def _first(self, key: Any, flat: list, spec: Any, saved: Any, grads: tuple) -> Any:
        want = _vjp_impl(self.torchfn, saved, *grads)
        leaves, out_spec = tree_flatten(want)
        is_tensor = [isinstance(v, torch.Tensor) for v in leaves]
        why = None
        if not all(t or v is None for t, v in zip(is_tensor, leaves, strict=True)):
            why = "its result holds values other than tensors"
        else:
            try:
                graph = self._record(flat, spec)
                got = list(graph(*[v for v in flat if isinstance(v, torch.Tensor)]))
                if not bitwise_equal(got, [v for v in leaves if v is not None]):
                    why = "its recording's result differs from Thunder's"
            except Exception as e:  # any failure to record keeps Thunder's call
                why = f"it could not be recorded ({type(e).__name__})"
        self._recorded[key] = None if why else (graph, out_spec, is_tensor)
        if self.on_first is not None:
            self.on_first(why)
        return want

    def _record(self, flat: list, spec: Any) -> Any:
        positions = [i for i, v in enumerate(flat) if isinstance(v, torch.Tensor)]

        def vjp(*tensors: torch.Tensor) -> list:
            values = list(flat)
            for i, t in zip(positions, tensors, strict=True):
                values[i] = t
            saved, grads = tree_unflatten(values, spec)
            return [v for v in tree_flatten(_vjp_impl(self.torchfn, saved, *grads))[0] if v is not None]

        graph = make_fx(vjp)(*[flat[i] for i in positions])
        graph.graph.eliminate_dead_code()
        graph.recompile()
        return graph


def _placed(tensors: list, is_tensor: list[bool]) -> list:
    """The result's leaves: ``tensors`` in order where a tensor stood, None elsewhere."""
    given = iter(tensors)
    return [next(given) if t else None for t in is_tensor]


def bitwise_equal(got: list, want: list) -> bool:
    """The same tensors, bit for bit: shapes, strides, dtypes and bytes (NaNs and signed zeros too)."""
    if len(got) != len(want):
        return False
    for x, y in zip(got, want, strict=True):
        if (x.shape, x.stride(), x.dtype, x.device) != (y.shape, y.stride(), y.dtype, y.device):
            return False
        if not torch.equal(_bytes(x), _bytes(y)):
            return False
    return True


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.detach().reshape(-1).contiguous().view(torch.uint8)
