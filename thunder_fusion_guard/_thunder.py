"""The one place that touches Thunder's private APIs (checked against lightning-thunder 0.2.6).

Thunder's internals move between releases; everything the guard needs from them goes through the
small functions here, so a new release means reading and fixing this file only.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import thunder
import torch
from thunder.core import prims
from thunder.core.proxies import Proxy, TensorProxy, variableify
from thunder.core.symbol import BoundSymbol
from thunder.core.trace import TraceCtx, TraceProvenance, TraceTag, from_trace, tracectx
from thunder.extend import FusionExecutor, get_all_executors, get_always_executors

__all__ = [
    "BoundSymbol",
    "FusionExecutor",
    "Proxy",
    "TensorProxy",
    "TraceCtx",
    "compile_function_name",
    "fusion_executor_names",
    "is_backward",
    "is_fusion",
    "jitted_transforms",
    "last_traces",
    "lower_to_torch",
    "new_trace_like",
    "op_id",
    "refresh_dels",
    "set_provenance",
    "torch_executor",
]


def is_fusion(bsym: BoundSymbol) -> bool:
    """True for a bound symbol that calls a fusion executor's region."""
    return bool(getattr(bsym.sym, "is_fusion", False)) and bsym.sym.executor is not None


def executor_name(bsym: BoundSymbol) -> str:
    ex = bsym.sym.executor
    return getattr(ex, "name", type(ex).__name__)


def op_id(bsym: BoundSymbol) -> str:
    """A stable string id for an operation: the prim's name for prims, the torch-level id otherwise."""
    sym_id = bsym.sym.id
    if isinstance(sym_id, prims.PrimIDs):
        return bsym.sym.name
    return str(sym_id)


def op_name(bsym: BoundSymbol) -> str:
    return bsym.sym.name


def subsymbols(bsym: BoundSymbol) -> Sequence[BoundSymbol]:
    return bsym.subsymbols


def is_backward(trace: TraceCtx) -> bool:
    return TraceTag.BACKWARD in trace.tags or trace.siginfo().name == "backward_fn"


def fusion_executor_names() -> list[str]:
    """Names of every registered fusion executor (nvfuser only where nvFuser is importable)."""
    return sorted(ex.name for ex in get_all_executors() if isinstance(ex, FusionExecutor))


def torch_executor():
    from thunder.executors.torchex import ex

    return ex


def is_comment_or_del(bsym: BoundSymbol) -> bool:
    return bsym.sym.id in (prims.PrimIDs.DEL, prims.PrimIDs.COMMENT)


def new_trace_like(trace: TraceCtx, bound_symbols: list[BoundSymbol]) -> TraceCtx:
    """A trace with the signature, names and tags of ``trace`` and the given bound symbols."""
    new = from_trace(trace)
    new.bound_symbols = bound_symbols
    return new


def set_provenance(trace: TraceCtx, text: str) -> None:
    trace.set_provenance(TraceProvenance(text))


def lower_to_torch(outer: TraceCtx, bsyms: Sequence[BoundSymbol], outputs: Sequence[Proxy]) -> list[BoundSymbol]:
    """The given bound symbols re-expressed as calls of Thunder's torch executor.

    The region trace shares the outer trace's name set, so any proxy the lowering creates gets a
    name that is free in the outer trace.
    """
    from thunder.core.transform_common import dce
    from thunder.executors.passes import _transform_for_operator_executor_execution

    region = from_trace(outer)
    region.bound_symbols = [b for b in bsyms if not is_comment_or_del(b)]
    with tracectx(region):
        region.bound_symbols.append(prims.python_return.bind(list(outputs), output=None))
    executors = [torch_executor(), *[ex for ex in get_always_executors() if ex is not torch_executor()]]
    lowered = dce(_transform_for_operator_executor_execution(region, executors))
    body = [b for b in lowered.bound_symbols if b.sym.id != prims.PrimIDs.RETURN]
    (returned,) = [b for b in lowered.bound_symbols if b.sym.id == prims.PrimIDs.RETURN]
    # The lowering gives re-created outputs fresh names; give them back the names the trace uses.
    renames = {
        variableify(new): old
        for new, old in zip(returned.args[0], outputs, strict=True)
        if isinstance(new, Proxy) and new.name != old.name
    }
    if renames:
        body = [b.from_bsym_swap_proxies(renames) for b in body]
    return [b.from_bsym(source_filename=None, source_positions=None) for b in body]


def executed_by(bsym: BoundSymbol) -> str | None:
    ex = bsym.sym.executor
    return None if ex is None else getattr(ex, "name", None)


def refresh_dels(trace: TraceCtx) -> TraceCtx:
    """Re-derive the ``del`` statements after bound symbols moved (Thunder's own last-use pass)."""
    from thunder.executors.passes import del_last_used

    return del_last_used(trace, clear_mutable_collections=is_backward(trace))


def compile_function_name() -> str | None:
    """Name of the function or module Thunder is compiling right now, if known."""
    from thunder.core.compile_data import get_compile_data

    try:
        fn = getattr(get_compile_data(), "fn", None)
    except LookupError:
        return None
    if fn is None:
        return None
    fn = getattr(fn, "_model", fn)
    if isinstance(fn, torch.nn.Module):
        return type(fn).__name__
    return getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or type(fn).__name__


def jitted_transforms(jitted: Any) -> list[Any]:
    """The transforms a ``thunder.jit`` result was built with ([] if it is not one)."""
    return list(getattr(jitted, "_lc_transforms", None) or [])


def last_traces(jitted: Any) -> tuple[TraceCtx | None, TraceCtx | None]:
    """The final forward and backward execution traces of the last call of a jitted function."""
    try:
        fwd = thunder.last_traces(jitted)[-1]
    except (TypeError, IndexError):
        fwd = None
    try:
        bwd_list = thunder.last_backward_traces(jitted)
        bwd = bwd_list[-1] if bwd_list else None
    except (TypeError, IndexError):
        bwd = None
    return fwd, bwd


def flat_tensor_proxies(items: Iterable[Any]) -> list[TensorProxy]:
    return [x for x in items if isinstance(x, TensorProxy)]


def thunderfx_transforms(obj: Any) -> list[Any]:
    """The transforms passed to a ThunderFX object (``thunderfx(...)`` or a ``ThunderCompiler``)."""
    backend = getattr(obj, "_backend", obj)
    options = getattr(backend, "thunder_options", None)
    if not isinstance(options, dict):
        return []
    return list(options.get("transforms") or [])


def region_callable(bsym: BoundSymbol):
    """The Python callable a fusion bound symbol runs (its fusion definition or compiled function)."""
    return bsym._call_ctx[bsym.sym.name]


def trace_arg_names(trace: TraceCtx) -> list[str]:
    return [a.name for a in trace.args if isinstance(a, Proxy)]


def software_versions() -> dict[str, str | None]:
    """torch, thunder and nvFuser versions, for cache keys and result tables."""
    try:
        import nvfuser_direct

        nvf = str(nvfuser_direct.version())
    except ImportError:
        nvf = None
    return {"torch": torch.__version__, "thunder": getattr(thunder, "__version__", "?"), "nvfuser": nvf}


def proxy_device(proxies: Iterable[Any]) -> str | None:
    """'cpu' or 'cuda' (type only) of the first tensor proxy, None when there is none."""
    for p in flat_tensor_proxies(proxies):
        return p.device.type
    return None
