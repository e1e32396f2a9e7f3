"""Library ops Thunder 0.2.6 registered automatically, rebound to operators of this package that call the same
torch function forward and have a gradient written in Thunder's ops (:mod:`..passes.traceable_grads`).

Thunder's automatic registration differentiates such an op with ``<op>_vjp``, which reruns the forward under
``torch.autograd.functional.vjp``; Dynamo cannot trace that (optree's pytree), so a torch.compile region holding it
fails at its first backward. The operators here have Thunder's own meta and call the torch function Thunder's torch
executor calls for the op (``torch.mm`` is registered as ``spmm`` and runs ``torch.spmm``; ``sinc`` runs
``torch.special.sinc``). Their gradient rules compute the forward by Thunder's op itself, so the forward trace
holds what unguarded Thunder's holds, fused where Thunder fuses it (the same bits: torch.compile's ``sinc`` and
eager's differ in the last bit on some CPUs), and the gradients by Thunder's ops (a matmul per side, a pad, sinc's
derivative, none for ``new_zeros``), which any executor traces and fuses. Operators of the guard's own executor;
nothing of Thunder's is replaced.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from thunder import torch as ltorch
from thunder.core import dtypes, prims
from thunder.core.proxies import IntegerProxy, TensorProxy
from thunder.core.symbol import BoundSymbol
from thunder.core.transforms import get_grad, put_grad, put_grads, register_grad

from .executors import guard_executor, torch_executor

__all__ = ["narrow_args", "rebound_traceable", "static_int", "tensordot_dims", "traceable_op"]

_OPS: dict[str, Any] = {}  # Thunder's symbol id -> this package's operator


def traceable_op(bsym: BoundSymbol) -> str | None:
    """Thunder's name of the op (``tensordot``, ``narrow``, ``spmm``, ``sinc``, ``new_zeros``) where ``bsym`` is its
    automatic registration called with arguments this module gives a gradient for; None for any other op."""
    found = _GRADS.get(bsym.sym.id)
    if found is None or prims.OpTags.AUTO_REGISTERED not in (bsym.sym.tags or ()):
        return None
    accepts, _ = found
    first = bsym.args[0] if bsym.args else None
    if not isinstance(first, TensorProxy) or not dtypes.is_float_dtype(first.dtype):
        return None
    try:
        accepted = accepts(*bsym.args, **bsym.kwargs)
    except TypeError:  # arguments torch would refuse: Thunder's registration runs it, and raises what torch raises
        return None
    return bsym.sym.name if accepted and bsym.sym.name in torch_executor().opmap else None


def rebound_traceable(bsym: BoundSymbol) -> BoundSymbol:
    """``bsym`` (one :func:`traceable_op` names) calling this package's operator: the same arguments, output and
    user line."""
    return bsym.from_bsym(sym=_op(bsym.sym), subsymbols=())


def _op(sym: Any) -> Any:
    """This package's operator for Thunder's automatically registered ``sym``, registered (with its gradient) on
    first use: Thunder's meta, the torch function Thunder's torch executor calls."""
    op = _OPS.get(sym.id)
    if op is None:
        torch_op = torch_executor().opmap[sym.name]
        fn = getattr(torch_op.module, torch_op.name)
        op = guard_executor().register_operator(f"{sym.name}_traceable_grad", meta=sym.meta, fn=fn)
        _, grad = _GRADS[sym.id]
        register_grad(op, _forward_then(sym, grad))
        _OPS[sym.id] = op
    return op


def _forward_then(forward: Any, grad: Callable) -> Callable:
    """A gradient rule: ``forward`` (Thunder's own symbol, as unguarded Thunder's forward calls it), then
    ``grad(g, *args, **kwargs)`` puts the gradients of its inputs."""

    def rule(*args: Any, **kwargs: Any) -> Any:
        fwd = forward(*args, **kwargs)
        grad(get_grad(fwd), *args, **kwargs)
        return fwd

    return rule


def static_int(value: Any) -> int | None:
    """``value`` as an int, where it is one or a proxy Thunder holds fixed (ThunderFX checks ops with such proxies;
    under the "symbolic values" cache, an int the program branched on), else None: then the op runs as Thunder
    registered it, for a proxy whose value may change would be built into the trace unchecked."""
    if isinstance(value, IntegerProxy):
        value = value.value if value.is_static_constrained() else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _static_shape(*tensors: Any) -> bool:
    return all(isinstance(t, TensorProxy) and all(isinstance(n, int) for n in t.shape) for t in tensors)


def tensordot_dims(a: Any, b: Any, dims: Any = 2, out: Any = None) -> tuple[list[int], list[int]] | None:
    """The dims of ``a`` and ``b`` that ``tensordot`` contracts (torch's reading of ``dims``), where each pair has
    one size (torch sums a dim of size 1 against a longer one first) and nothing is symbolic; else None."""
    if out is not None or not _static_shape(a, b):
        return None
    if isinstance(dims, (int, IntegerProxy)):
        count = static_int(dims)
        if count is None or not 0 <= count <= min(a.ndim, b.ndim):
            return None
        da, db = list(range(a.ndim - count, a.ndim)), list(range(count))
    else:
        if isinstance(dims, torch.Tensor):
            dims = dims.tolist()
        if not isinstance(dims, (list, tuple)) or len(dims) != 2:
            return None
        sides = [[static_int(d) for d in (s if isinstance(s, (list, tuple)) else [s])] for s in dims]
        if any(d is None for s in sides for d in s) or len(sides[0]) != len(sides[1]):
            return None
        if any(not -t.ndim <= d < t.ndim for t, s in zip((a, b), sides, strict=True) for d in s):
            return None
        da, db = [d % a.ndim for d in sides[0]], [d % b.ndim for d in sides[1]]
    if len(set(da)) != len(da) or len(set(db)) != len(db):
        return None
    if any(a.shape[i] != b.shape[j] for i, j in zip(da, db, strict=True)):
        return None
    return da, db


def _inverse(order: list[int]) -> list[int]:
    inv = [0] * len(order)
    for i, p in enumerate(order):
        inv[p] = i
    return inv


def _tensordot_grad(g: TensorProxy, a: TensorProxy, b: TensorProxy, dims: Any = 2, out: Any = None) -> None:
    """Each side's gradient: a matmul of the other side laid out as tensordot lays it out."""
    da, db = tensordot_dims(a, b, dims, out)
    order_a = [i for i in range(a.ndim) if i not in da] + da
    order_b = db + [j for j in range(b.ndim) if j not in db]
    k = math.prod(a.shape[i] for i in da)
    left = ltorch.reshape(ltorch.permute(a, order_a), (-1, k))
    right = ltorch.reshape(ltorch.permute(b, order_b), (k, -1))
    g2 = ltorch.reshape(g, (left.shape[0], right.shape[1]))
    ga = ltorch.reshape(ltorch.matmul(g2, ltorch.transpose(right, 0, 1)), [a.shape[i] for i in order_a])
    gb = ltorch.reshape(ltorch.matmul(ltorch.transpose(left, 0, 1), g2), [b.shape[j] for j in order_b])
    put_grads((a, b), (ltorch.permute(ga, _inverse(order_a)), ltorch.permute(gb, _inverse(order_b))))


def narrow_args(a: TensorProxy, dim: int, start: int, length: int) -> tuple[int, int, int]:
    """``(dim, start, length)`` of a narrow of ``a`` as torch reads them (negative ones counted from the end); where
    torch's narrow raises, the same error with torch's type and message, in torch's order (a slice would clamp the
    request)."""
    if a.ndim == 0:
        raise RuntimeError("narrow() cannot be applied to a 0-dim tensor.")
    if length < 0:
        raise RuntimeError("narrow(): length must be non-negative.")
    if not -a.ndim <= dim < a.ndim:
        expected = f"[{-a.ndim}, {a.ndim - 1}]"
        raise IndexError(f"Dimension out of range (expected to be in range of {expected}, but got {dim})")
    dim %= a.ndim
    size = a.shape[dim]
    if not -size <= start <= size:
        raise IndexError(f"start out of range (expected to be in range of [{-size}, {size}], but got {start})")
    start = start + size if start < 0 else start
    if start + length > size:
        raise RuntimeError(f"start ({start}) + length ({length}) exceeds dimension size ({size}).")
    return dim, start, length


def _narrowed(a: Any, dim: Any, start: Any, length: Any) -> tuple[int, int, int] | None:
    """:func:`narrow_args` where all are static and in range; else None (then Thunder's registration runs it, and
    raises what torch raises)."""
    ints = [static_int(v) for v in (dim, start, length)]
    if not _static_shape(a) or None in ints:
        return None
    try:
        return narrow_args(a, *ints)
    except (IndexError, RuntimeError):
        return None


def _narrow_grad(g: TensorProxy, a: TensorProxy, dim: Any, start: Any, length: Any) -> None:
    """The gradient in place in zeros of ``a``'s shape (a pad: its values unchanged)."""
    d, s, n = _narrowed(a, dim, start, length)
    config = [(s, a.shape[i] - s - n, 0) if i == d else (0, 0, 0) for i in range(a.ndim)]
    put_grad(a, prims.pad(g, 0.0, config))


def _is_matrix_pair(a: Any, b: Any, *rest: Any, **kwargs: Any) -> bool:
    return not rest and not kwargs and _static_shape(a, b) and a.ndim == b.ndim == 2 and a.shape[1] == b.shape[0]


def _mm_grad(g: TensorProxy, a: TensorProxy, b: TensorProxy) -> None:
    put_grads((a, b), (ltorch.matmul(g, ltorch.transpose(b, 0, 1)), ltorch.matmul(ltorch.transpose(a, 0, 1), g)))


def _is_one_tensor(a: Any, *rest: Any, **kwargs: Any) -> bool:
    return not rest and not kwargs.get("out") and isinstance(a, TensorProxy)


def _sinc_grad(g: TensorProxy, a: TensorProxy, **kwargs: Any) -> None:
    """torch's derivative of sinc: ``(pi x cos(pi x) - sin(pi x)) / (pi x^2)``, 0 at 0."""
    pix = a * math.pi
    slope = (pix * ltorch.cos(pix) - ltorch.sin(pix)) / (pix * a)
    put_grad(a, ltorch.where(a == 0, 0.0, slope) * g)


def _new_zeros_grad(g: TensorProxy, *args: Any, **kwargs: Any) -> None:
    """None: the zeros do not depend on the tensor's values."""


# Thunder's id of each op -> (whether this call's arguments have a gradient here, the gradient).
_GRADS: dict[str, tuple[Callable[..., bool], Callable[..., None]]] = {
    "torch.tensordot": (lambda *a, **k: tensordot_dims(*a, **k) is not None, _tensordot_grad),
    "torch.narrow": (lambda *a, **k: not k and _narrowed(*a) is not None, _narrow_grad),
    "torch.spmm": (_is_matrix_pair, _mm_grad),
    "torch.sinc": (_is_one_tensor, _sinc_grad),
    "Tensor.new_zeros": (lambda a, *_, **__: isinstance(a, TensorProxy), _new_zeros_grad),
}
