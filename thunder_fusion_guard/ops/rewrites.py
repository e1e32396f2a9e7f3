"""Ops the rewriting passes recognise: identities (ops that hand back their input unchanged) and Thunder's
functional setitem, which the fold pass turns back into an in-place one."""

from __future__ import annotations

from typing import Any

from .. import _thunder as th
from .communication import is_communication

__all__ = ["SETITEM", "identity_reason", "is_basic_index"]

# The torch executor's functional setitem: ``t = copy_with_setitem(a, key, value)``, a clone of ``a`` with the
# slice set.
SETITEM = "copy_with_setitem_impl"


def _same_shape(a, b) -> bool:
    return all(type(x) is int for x in (*a, *b)) and tuple(a) == tuple(b)


def _prim_identity(bsym: th.BoundSymbol) -> str | None:
    name = th.op_name(bsym)
    if not th.is_prim(bsym):
        return None
    a = bsym.args[0] if bsym.args else None
    out = bsym.output
    if not (isinstance(a, th.TensorProxy) and isinstance(out, th.TensorProxy)):
        return None
    if name == "shallow_copy":
        return "a shallow copy"
    if name == "convert_element_type" and a.dtype == out.dtype:
        return "a conversion to the same dtype"
    if name in ("reshape", "view") and _same_shape(a.shape, out.shape):
        return "a reshape to the same shape"
    if name == "transpose" and tuple(bsym.args[1]) == tuple(range(a.ndim)):
        return "an identity permutation"
    if name == "broadcast_in_dim" and _same_shape(a.shape, out.shape) and tuple(bsym.args[2]) == tuple(range(a.ndim)):
        return "a broadcast to the same shape"
    return None


def identity_reason(bsym: th.BoundSymbol) -> str | None:
    """Why ``bsym`` returns its first input unchanged, or None when it may change something (or communicates)."""
    if is_communication(bsym):
        return None
    reason = _prim_identity(bsym)
    if reason is not None:
        return reason
    subs = th.fusion_body(bsym)
    if len(subs) != 1 or not bsym.args or not isinstance(bsym.args[0], th.TensorProxy):
        return None
    (sub,) = subs
    outs, sub_outs = bsym.flat_proxy_outs, sub.flat_proxy_outs
    if len(outs) != 1 or len(sub_outs) != 1 or outs[0].name != sub_outs[0].name:
        return None
    if not sub.args or not isinstance(sub.args[0], th.Proxy) or sub.args[0].name != bsym.args[0].name:
        return None
    return identity_reason(sub)


def is_basic_index(key: Any) -> bool:
    """True for basic indexing (ints, slices of ints, None, Ellipsis, tuples of them): nothing it reads can
    alias what a setitem with it writes."""
    if isinstance(key, tuple):
        return all(is_basic_index(k) for k in key)
    if isinstance(key, slice):
        return all(v is None or type(v) is int for v in (key.start, key.stop, key.step))
    return key is None or key is Ellipsis or type(key) is int
