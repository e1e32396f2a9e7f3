"""Reading traces: what a bound symbol is and runs, what its values are, what a trace takes and returns."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import thunder.core.devices as devices
import thunder.core.dtypes as dtypes
import torch
from thunder.core import prims
from thunder.core.prims import OpTags
from thunder.core.proxies import NumberProxy, Proxy, TensorProxy
from thunder.core.symbol import BoundSymbol
from thunder.core.trace import TraceCtx, TraceTag
from torch.utils._pytree import tree_flatten

from .executors import torch_executor

try:
    from thunder.distributed.prims import PrimIDs as _DistributedPrimIDs
except ImportError:  # torch built without torch.distributed
    _DistributedPrimIDs = None

__all__ = [
    "BoundSymbol",
    "Proxy",
    "TensorProxy",
    "TraceCtx",
    "canonical_ops",
    "conversion",
    "executed_by",
    "executor_name",
    "fusion_body",
    "has_symbolic_shape",
    "is_automatic_gradient",
    "is_backward",
    "is_comment_or_del",
    "is_distributed_prim",
    "is_fusion",
    "is_number_like",
    "is_plumbing",
    "is_prim",
    "is_torch_op",
    "leaves",
    "number_args",
    "number_value",
    "op_id",
    "op_name",
    "op_names_deep",
    "proxy_device",
    "reinterpreted_itemsizes",
    "returned_names",
    "returned_proxies",
    "runs_distributed_prim",
    "subsymbols",
    "tag_names",
    "tensor_nbytes",
    "tensor_proxies",
    "tensor_spec",
    "tensor_text",
    "torch_dtype",
    "trace_inputs",
    "unbound_reads",
]


# Values that can flow through shape arithmetic: numbers and the constants ops on numbers take.
_NUMBER_LEAVES = (NumberProxy, int, float, complex, bool, str, type, type(None), slice, type(Ellipsis))
_NUMBER_LEAVES += (dtypes.dtype, devices.Device, torch.dtype, torch.device)


def is_number_like(value: Any) -> bool:
    """True for a number (a Python one or a number proxy) or a constant that ops on numbers take (a dtype,
    a device, a slice, a string, None)."""
    return isinstance(value, _NUMBER_LEAVES)


def is_fusion(bsym: BoundSymbol) -> bool:
    """True for a bound symbol that calls a fusion executor's region."""
    return bool(getattr(bsym.sym, "is_fusion", False)) and bsym.sym.executor is not None


def executor_name(bsym: BoundSymbol) -> str:
    """The name of the executor that runs ``bsym`` (a fusion call's executor, for a region)."""
    ex = bsym.sym.executor
    return getattr(ex, "name", type(ex).__name__)


def executed_by(bsym: BoundSymbol) -> str | None:
    """The name of the executor ``bsym`` was claimed by; None before one claimed it."""
    ex = bsym.sym.executor
    return None if ex is None else getattr(ex, "name", None)


def op_id(bsym: BoundSymbol) -> str:
    """A stable string id for an operation: the prim's name for prims, the torch-level id otherwise."""
    sym_id = bsym.sym.id
    if isinstance(sym_id, prims.PrimIDs):
        return bsym.sym.name
    return str(sym_id)


def op_name(bsym: BoundSymbol) -> str:
    """The op's name as traces print it (``add``, ``torch_prims_reshape_impl``, ``nvFusion0``)."""
    return bsym.sym.name


def subsymbols(bsym: BoundSymbol) -> Sequence[BoundSymbol]:
    """The ops ``bsym`` is made of, one level down (a region's body, a composite op's decomposition)."""
    return bsym.subsymbols


def leaves(bsym: BoundSymbol) -> list[BoundSymbol]:
    """The innermost operations ``bsym`` decomposes into (itself when it has none)."""
    if not bsym.subsymbols:
        return [bsym]
    return [leaf for s in bsym.subsymbols for leaf in leaves(s)]


def unique_proxies(proxies: Iterable[Proxy]) -> list[Proxy]:
    """``proxies`` in order, each name once (a value given twice is one argument of a call)."""
    return list({p.name: p for p in proxies}.values())


def is_prim(bsym: BoundSymbol) -> bool:
    """True for a bound symbol of one of Thunder's primitives (``prims.reshape``, ``prims.add``, ...)."""
    return isinstance(bsym.sym.id, prims.PrimIDs)


def is_comment_or_del(bsym: BoundSymbol) -> bool:
    """True for a ``del`` or a comment: trace statements that compute nothing."""
    return bsym.sym.id in (prims.PrimIDs.DEL, prims.PrimIDs.COMMENT)


def is_automatic_gradient(bsym: BoundSymbol) -> bool:
    """True for a gradient Thunder registered automatically for a torch op it has no rule for (``scatter_reduce_vjp``):
    Thunder's torch executor runs it through ``torch.autograd.grad`` on pytrees, which Dynamo cannot trace."""
    import thunder.torch as ltorch

    call = (bsym._call_ctx or {}).get(bsym.sym.name)
    return getattr(call, "func", None) is getattr(ltorch, "_vjp_impl", object())


def fusion_body(bsym: BoundSymbol) -> list[BoundSymbol]:
    """The ops a fusion region (or a composite op) runs, one level down: its subsymbols without comments and dels."""
    return [b for b in bsym.subsymbols if not is_comment_or_del(b)]


def is_torch_op(bsym: BoundSymbol, name: str) -> bool:
    """True for a bound symbol that Thunder's torch executor runs as the operator ``name``."""
    return bsym.sym.name == name and bsym.sym.executor is torch_executor()


def is_distributed_prim(bsym: BoundSymbol) -> bool:
    """True for a bound symbol of one of Thunder's distributed prims (``thunder.distributed.prims``)."""
    return _DistributedPrimIDs is not None and isinstance(bsym.sym.id, _DistributedPrimIDs)


def runs_distributed_prim(bsym: BoundSymbol) -> bool:
    """True for one of Thunder's distributed prims or the torch executor's call of one (``torch_wait_prim_impl``)."""
    return is_distributed_prim(bsym) or bsym.sym.name in _DISTRIBUTED_IMPLS


_DISTRIBUTED_IMPLS = frozenset(f"torch_{p.name.lower()}_prim_impl" for p in _DistributedPrimIDs or ())


def is_backward(trace: TraceCtx) -> bool:
    """True for a backward trace."""
    return TraceTag.BACKWARD in trace.tags or trace.siginfo().name == "backward_fn"


_PLUMBING_PREFIXES = ("unpack_", "check_", "pack_")
_PLUMBING = frozenset({"python_return", "del", "comment", "clear_mutable_collection", "python_print", "put_grad"})


def is_plumbing(bsym: BoundSymbol) -> bool:
    """True for the trace's own plumbing, no operation on values: unpacking inputs, checks, returns, ``del``s,
    comments, collections, printing, context managers."""
    name = bsym.sym.name
    if name in _PLUMBING or name.startswith(_PLUMBING_PREFIXES) or is_comment_or_del(bsym):
        return True
    return OpTags.CTX_MANAGER_ENTER_EXIT_OP in (bsym.sym.tags or ())


def tag_names(bsym: BoundSymbol, deep: bool = True) -> set[str]:
    """Names of the op tags (``RANDOM_OP``, ``DONT_DCE``, ``IN_PLACE``, ...) of ``bsym`` and, with ``deep``,
    of every op inside it."""
    found = {t.name for t in (bsym.sym.tags or ()) if isinstance(t, OpTags)}
    if deep:
        for s in bsym.subsymbols:
            found |= tag_names(s)
    return found


def op_names_deep(bsym: BoundSymbol) -> set[str]:
    """The names of ``bsym`` and of every op it is made of, at every level."""
    found = {bsym.sym.name}
    for s in bsym.subsymbols:
        found |= op_names_deep(s)
    return found


def reinterpreted_itemsizes(bsym: BoundSymbol) -> tuple[int, int] | None:
    """(source, target) item sizes in bytes when ``bsym`` views a tensor as another dtype
    (``prims.bitcast``, ``Tensor.view(dtype)``); None when it does not."""
    values = [*bsym.args, *bsym.kwargs.values()]
    source = next((v for v in values if isinstance(v, TensorProxy)), None)
    target = next((v for v in values if isinstance(v, (dtypes.dtype, torch.dtype))), None)
    if source is None or target is None:
        return None
    return source.dtype.bytes, dtypes.to_dtype(target).bytes


def torch_dtype(x: Any) -> torch.dtype | None:
    """The torch dtype of a tensor proxy or a Thunder/torch dtype; None for anything else."""
    if isinstance(x, TensorProxy):
        x = x.dtype
    if isinstance(x, torch.dtype):
        return x
    if isinstance(x, dtypes.dtype):
        return dtypes.to_torch_dtype(x)
    return None


def conversion(bsym: BoundSymbol) -> tuple[Proxy, torch.dtype] | None:
    """(source, target dtype) when ``bsym`` is ``prims.convert_element_type`` of a tensor; None otherwise."""
    if bsym.sym.id is not prims.PrimIDs.CONVERT_ELEMENT_TYPE:
        return None
    values = [*bsym.args, *bsym.kwargs.values()]
    source = next((v for v in values if isinstance(v, TensorProxy)), None)
    target = next((torch_dtype(v) for v in values if isinstance(v, (dtypes.dtype, torch.dtype))), None)
    return None if source is None or target is None else (source, target)


def number_args(bsym: BoundSymbol) -> list[Any]:
    """The numbers ``bsym`` takes (Python ints and floats, and number proxies), booleans aside."""
    return [x for x in bsym.flat_args if isinstance(x, (int, float, NumberProxy)) and not isinstance(x, bool)]


def number_value(p: Any) -> Any:
    """The value a number proxy was traced with (None when it has none, or ``p`` is not one)."""
    return p.value if isinstance(p, NumberProxy) else None


def tensor_spec(p: Any) -> tuple[tuple[int, ...], torch.dtype, torch.device, bool] | None:
    """(shape, dtype, device, requires_grad) of a tensor proxy with a known shape; None for anything else."""
    if not isinstance(p, TensorProxy):
        return None
    try:
        shape = tuple(int(d) for d in p.shape)
    except (TypeError, ValueError):
        return None
    return shape, dtypes.to_torch_dtype(p.dtype), devices.to_torch_device(p.device), bool(p.requires_grad)


def tensor_nbytes(proxy: Any) -> int | None:
    """Bytes of the tensor a proxy stands for; None when its shape is not known as numbers."""
    try:
        numel = 1
        for n in proxy.shape:
            numel *= int(n)
        return numel * proxy.dtype.bytes
    except (TypeError, ValueError, AttributeError):
        return None


def tensor_text(proxy: Any) -> str:
    """``f32[6, 4, 5]``: the dtype's short name and the shape of a tensor proxy."""
    dtype = getattr(proxy.dtype, "shortname", lambda: str(proxy.dtype))()
    return f"{dtype}[{', '.join(str(n) for n in proxy.shape)}]"


def has_symbolic_shape(p: Any) -> bool:
    """True for a tensor proxy whose shape holds a number proxy (``cache="symbolic values"``)."""
    return isinstance(p, TensorProxy) and any(not isinstance(d, int) for d in p.shape)


def tensor_proxies(items: Iterable[Any]) -> list[TensorProxy]:
    """The tensor proxies among ``items``, in order."""
    return [x for x in items if isinstance(x, TensorProxy)]


def proxy_device(proxies: Iterable[Any]) -> str | None:
    """'cpu' or 'cuda' (type only) of the first tensor proxy, None when there is none."""
    for p in tensor_proxies(proxies):
        return p.device.type
    return None


def _return(trace: TraceCtx) -> BoundSymbol | None:
    return next((b for b in reversed(trace.bound_symbols) if b.sym.id == prims.PrimIDs.RETURN), None)


def returned_proxies(trace: TraceCtx) -> list[Proxy]:
    """Every proxy the trace returns, in order (outputs and, in a forward trace, saved tensors)."""
    ret = _return(trace)
    return [] if ret is None else list(ret.flat_proxy_args)


def returned_names(trace: TraceCtx) -> tuple[set[str], set[str]]:
    """(names the caller gets, names only saved for the backward) of the proxies ``trace`` returns.

    A forward trace made by Thunder's autodiff returns ``(outputs, saved_for_backward)``; the saved
    tensors reach only the backward trace. Any other trace hands everything it returns to its caller.
    """
    ret = _return(trace)
    if ret is None:
        return set(), set()
    value = ret.args[0] if len(ret.args) == 1 else ret.args
    if TraceTag.AUGMENTED_FORWARD in trace.tags and isinstance(value, (tuple, list)) and len(value) == 2:
        caller, saved = value
        names = {p.name for p in tree_flatten(caller)[0] if isinstance(p, Proxy)}
        return names, {p.name for p in tree_flatten(saved)[0] if isinstance(p, Proxy)} - names
    return {p.name for p in ret.flat_proxy_args}, set()


def trace_inputs(trace: TraceCtx, unpacked: bool = False) -> list[Proxy]:
    """The proxies ``trace`` receives as arguments, nested collections flattened, in order; with ``unpacked``,
    also what its unpacking ops take out of them."""
    found = {p.name: p for p in tree_flatten((trace.args, trace.kwargs))[0] if isinstance(p, Proxy)}
    if unpacked:
        for bsym in trace.bound_symbols:
            if bsym.sym.name.startswith("unpack_"):
                found.update((p.name, p) for p in bsym.flat_proxy_outs)
    return list(found.values())


def canonical_ops(bsyms: Sequence[BoundSymbol], inputs: Sequence[Any] = (), outputs: Sequence[Any] = ()) -> str:
    """The ops of ``bsyms`` with their arguments as text, proxies renamed in order of appearance: equal for
    two regions that run the same ops on the same kinds of values, whatever their traces named them. ``inputs``
    are named first, in their order; ``outputs``, where given, are returned on a last line."""
    names: dict[str, str] = {}

    def text(value: Any) -> str:
        if isinstance(value, Proxy):
            if value.name not in names:
                names[value.name] = f"p{len(names)}"
            return names[value.name]
        if isinstance(value, (list, tuple)):
            inner = ",".join(text(v) for v in value)
            return f"[{inner}]" if isinstance(value, list) else f"({inner})"
        if isinstance(value, dict):
            return "{" + ",".join(f"{k}:{text(v)}" for k, v in value.items()) + "}"
        return repr(value)

    lines = [f"({text(list(inputs))})"] if inputs else []
    for b in bsyms:
        outs = text(b.flat_outs)
        lines.append(f"{outs}={op_id(b)}({text(b.args)},{text(b.kwargs)})")
    if outputs:
        lines.append(f"return {text(list(outputs))}")
    return "\n".join(lines)


def unbound_reads(trace: TraceCtx) -> list[str]:
    """The names a top-level op of ``trace`` reads where they are unbound, in the order read: after a top-level
    deletion of them, or before the op that assigns them. Run as Python, such a trace fails with
    ``UnboundLocalError``."""
    assigned = {a.name for a in trace.args if isinstance(a, Proxy)}
    later = {o.name for b in trace.bound_symbols for o in b.flat_outs if isinstance(o, Proxy)}
    deleted: set[str] = set()
    unbound: list[str] = []
    for bsym in trace.bound_symbols:
        names = [a.name for a in bsym.flat_args if isinstance(a, Proxy)]
        if bsym.sym.id is prims.PrimIDs.DEL:
            deleted.update(names)
            continue
        unbound += [n for n in names if (n in deleted or (n in later and n not in assigned)) and n not in unbound]
        assigned.update(o.name for o in bsym.flat_outs if isinstance(o, Proxy))
    return unbound
