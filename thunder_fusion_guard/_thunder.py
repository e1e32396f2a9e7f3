"""The one place that touches Thunder's private APIs (checked against lightning-thunder 0.2.6).

Thunder's internals move between releases; everything the guard needs from them goes through the
small functions here, so a new release means reading and fixing this file only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import thunder
import thunder.core.devices as devices
import thunder.core.dtypes as dtypes
import torch
from thunder.core import prims
from thunder.core.prims import OpTags
from thunder.core.proxies import NumberProxy, Proxy, TensorProxy, variableify
from thunder.core.symbol import BoundSymbol
from thunder.core.trace import TraceCtx, TraceProvenance, TraceTag, from_trace, tracectx
from thunder.extend import FusionExecutor, get_all_executors, get_always_executors

try:
    from thunder.distributed.prims import PrimIDs as _DistributedPrimIDs
except ImportError:  # torch built without torch.distributed
    _DistributedPrimIDs = None

__all__ = [
    "BoundSymbol",
    "FusionExecutor",
    "FxSubgraph",
    "Proxy",
    "TensorProxy",
    "TraceCtx",
    "compile_function_name",
    "compiling_executors",
    "compiling_fx_subgraph",
    "default_executors",
    "effects",
    "executors_of",
    "fusion_executor_names",
    "fx_graph_ops",
    "is_backward",
    "is_distributed_prim",
    "is_fusion",
    "jitted_transforms",
    "last_traces",
    "lower_to_torch",
    "lowering_executor_names",
    "new_trace_like",
    "nvfuser_problem",
    "nvfuser_scheduled_ir",
    "only_numbers",
    "op_id",
    "refresh_dels",
    "reinterpreted_itemsizes",
    "set_provenance",
    "thunderfx_subgraphs",
    "torch_compile_executor",
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


# Values that can flow through shape arithmetic: numbers and the constants ops on numbers take.
_NUMBER_LEAVES = (NumberProxy, int, float, complex, bool, str, type, type(None), slice, type(Ellipsis))
_NUMBER_LEAVES += (dtypes.dtype, devices.Device, torch.dtype, torch.device)
# Tags of ops that may do more than compute their outputs (random state, device sync, mutation, or an
# unknown torch function); DONT_DCE ("never remove") is handled apart: checks carry it too.
_EFFECT_TAGS = frozenset({OpTags.RANDOM_OP, OpTags.DEVICE_SYNC_OP, OpTags.IN_PLACE, OpTags.AUTO_REGISTERED})


def only_numbers(bsym: BoundSymbol) -> bool:
    """True when ``bsym`` and every op it decomposes into take and give numbers only, with no effect but
    their outputs (no random state, sync, mutation; checks excepted, they only raise on a bad value)."""
    tags = set(bsym.sym.tags or ())
    if tags & _EFFECT_TAGS:
        return False
    is_check = bsym.sym.name.startswith("check_")
    if OpTags.DONT_DCE in tags and not is_check:
        return False
    if not bsym.flat_outs and not is_check:
        return False
    if not all(isinstance(x, _NUMBER_LEAVES) for x in (*bsym.flat_args, *bsym.flat_outs)):
        return False
    return all(only_numbers(s) for s in bsym.subsymbols)


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


def leaves(bsym: BoundSymbol) -> list[BoundSymbol]:
    """The innermost operations ``bsym`` decomposes into (itself when it has none)."""
    if not bsym.subsymbols:
        return [bsym]
    return [leaf for s in bsym.subsymbols for leaf in leaves(s)]


def executor_claims(fusion: BoundSymbol, bsym: BoundSymbol) -> bool:
    """Whether the executor of the fusion call ``fusion`` can run ``bsym`` inside it (Thunder's own check,
    the one its partitioner asks before fusing an op)."""
    try:
        return bool(fusion.sym.executor.can_fuse(bsym))
    except Exception:
        return False


def explicit_compile_options() -> dict[str, Any]:
    """The options the program being compiled passed to ``thunder.jit`` by name (empty outside a compilation)."""
    from thunder.core.compile_data import get_compile_data

    try:
        cd = get_compile_data()
    except LookupError:
        return {}
    return dict(getattr(cd, "compile_options", None) or {})


def is_distributed_prim(bsym: BoundSymbol) -> bool:
    """True for a bound symbol of one of Thunder's distributed prims (``thunder.distributed.prims``)."""
    return _DistributedPrimIDs is not None and isinstance(bsym.sym.id, _DistributedPrimIDs)


def is_backward(trace: TraceCtx) -> bool:
    return TraceTag.BACKWARD in trace.tags or trace.siginfo().name == "backward_fn"


def fusion_executor_names() -> list[str]:
    """Names of every registered fusion executor (nvfuser only where nvFuser is importable)."""
    return sorted(ex.name for ex in get_all_executors() if isinstance(ex, FusionExecutor))


def default_executors() -> list[Any]:
    """Thunder's default executors (nvFuser first where it loads; none that fuses on CPU)."""
    return list(thunder.get_default_executors())


def torch_compile_executor() -> Any:
    """Thunder's torch.compile executor: the fusion executor that runs on any device."""
    from thunder.executors.torch_compile import torch_compile_ex

    return torch_compile_ex


def _executor_names(executors: Iterable[Any]) -> list[tuple[str, bool]]:
    return [(getattr(ex, "name", str(ex)), isinstance(ex, FusionExecutor)) for ex in executors]


def compiling_executors() -> list[tuple[str, bool]]:
    """(name, is a fusion executor) of each executor of the compilation Thunder runs right now."""
    from thunder.core.compile_data import get_compile_data

    try:
        executors = getattr(get_compile_data(), "executors_list", None) or ()
    except LookupError:
        return []
    return _executor_names(executors)


def executors_of(jitted: Any) -> list[tuple[str, bool]]:
    """(name, is a fusion executor) of each executor a ``thunder.jit`` result compiles with."""
    cd = thunder.compile_data(jitted)
    return _executor_names(getattr(cd, "executors_list", None) or ()) if cd is not None else []


def nvfuser_problem() -> str | None:
    """Why Thunder has no nvFuser executor here (no CUDA, not installed, fails to load, too old); None if it has."""
    if any(ex.name == "nvfuser" for ex in get_all_executors()):
        return None
    if torch.version.cuda is None:
        return f"torch {torch.__version__} is built without CUDA"
    if not torch.cuda.is_available():
        return "no CUDA device is visible to torch"
    import importlib

    from thunder.executors.nvfuserex import nvfuser_version, required_nvfuser_version

    errors = []
    for module in ("nvfuser_direct", "nvfuser"):
        try:
            importlib.import_module(module)
            break
        except ModuleNotFoundError as e:
            if e.name != module:
                errors.append(f"{module} fails to load: {e}")
        except (ImportError, OSError) as e:
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            errors.append(f"{module} fails to load: {first}")
    else:
        if not errors:
            return "no nvFuser package is installed"
        text = "; ".join(errors)
        if "undefined symbol" in text:
            text += f" (an nvFuser build made for another torch than this {torch.__version__})"
        return text
    version = nvfuser_version()
    if version is not None and version < required_nvfuser_version():
        return f"nvFuser {version} is older than the {required_nvfuser_version()} thunder needs"
    return f"thunder did not register nvFuser {version}"


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


GUARD_PROVENANCE = "FusionGuard"


def set_provenance(trace: TraceCtx, text: str) -> None:
    trace.set_provenance(TraceProvenance(text))


def traces_before_guard(jitted: Any) -> tuple[TraceCtx | None, TraceCtx | None]:
    """The forward and backward traces as the guard received them: in Thunder's list of the last call's
    traces, the one before the guard's output (the final one where the guard changed nothing)."""
    try:
        forward = list(thunder.last_traces(jitted))
        backward = list(thunder.last_backward_traces(jitted) or [])
    except (TypeError, IndexError):
        return None, None
    return _before_guard(forward), _before_guard(backward)


def _before_guard(traces: list[TraceCtx]) -> TraceCtx | None:
    for i in range(len(traces) - 1, 0, -1):
        provenance = traces[i].get_provenance()
        if provenance is not None and str(getattr(provenance, "pss", "")).startswith(GUARD_PROVENANCE):
            return traces[i - 1]
    return traces[-1] if traces else None


def is_structural(bsym: BoundSymbol) -> bool:
    """True for bound symbols that only unpack arguments, return, delete or comment (no operation)."""
    sym_id = bsym.sym.id
    return isinstance(sym_id, prims.PrimIDs) and (
        sym_id.name.startswith("UNPACK_") or sym_id in (prims.PrimIDs.RETURN, prims.PrimIDs.DEL, prims.PrimIDs.COMMENT)
    )


def returned_proxies(trace: TraceCtx) -> list[Proxy]:
    """Every proxy the trace returns, in order (outputs and, in a forward trace, saved tensors)."""
    for bsym in reversed(trace.bound_symbols):
        if bsym.sym.id == prims.PrimIDs.RETURN:
            return list(bsym.flat_proxy_args)
    return []


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


def lower_to_torch(outer: TraceCtx, bsyms: Sequence[BoundSymbol], outputs: Sequence[Proxy]) -> list[BoundSymbol]:
    """The given bound symbols re-expressed as calls of Thunder's torch executor.

    The region trace shares the outer trace's name set, so any proxy the lowering creates gets a
    name that is free in the outer trace.
    """
    from thunder.core.transform_common import dce
    from thunder.executors.passes import _transform_for_operator_executor_execution

    # Outputs that are the region's own inputs (passthroughs) are already defined outside it.
    produced = {o.name for b in bsyms for o in b.flat_proxy_outs}
    outputs = [o for o in outputs if o.name in produced]
    region = from_trace(outer)
    region.bound_symbols = [b for b in bsyms if not is_comment_or_del(b)]
    with tracectx(region):
        region.bound_symbols.append(prims.python_return.bind(list(outputs), output=None))
    lowered = dce(_transform_for_operator_executor_execution(region, _lowering_executors()))
    body = [b for b in lowered.bound_symbols if b.sym.id != prims.PrimIDs.RETURN]
    (returned,) = [b for b in lowered.bound_symbols if b.sym.id == prims.PrimIDs.RETURN]
    # The lowering gives re-created outputs fresh names; give them back the names the trace uses.
    renames = [
        (new, old)
        for new, old in zip(returned.args[0], outputs, strict=True)
        if isinstance(new, Proxy) and new.name != old.name
    ]
    if renames:
        body = [swap_proxies(b, renames) for b in body]
    return [b.from_bsym(source_filename=None, source_positions=None) for b in body]


def swap_proxies(bsym: BoundSymbol, renames: Iterable[tuple[Proxy, Proxy]]) -> BoundSymbol:
    """``bsym`` (and its subsymbols) with each ``old`` proxy of the ``(old, new)`` pairs replaced."""
    swap = {variableify(old): new for old, new in renames}
    return bsym.from_bsym_swap_proxies(swap) if swap else bsym


def refuse(fusion: BoundSymbol, body: Sequence[BoundSymbol], inputs: Sequence[Proxy], outputs: Sequence[Proxy]):
    """A new call of ``fusion``'s executor running ``body`` from ``inputs`` to ``outputs``, same region name.

    Built the way Thunder itself rebuilds a fusion after editing it (``passes._update_fusion_call_ctx``).
    """
    from dataclasses import dataclass

    @dataclass
    class _Region:
        inputs: tuple
        outputs: tuple
        bound_symbols: tuple

    name = fusion.sym.name
    counter = int(name[len(name.rstrip("0123456789")) :] or 0)
    region = _Region(tuple(variableify(p) for p in inputs), tuple(variableify(p) for p in outputs), tuple(body))
    return fusion.sym.executor.fuse(region, counter)


def is_torch_op(bsym: BoundSymbol, name: str) -> bool:
    """True for a bound symbol that Thunder's torch executor runs as the operator ``name``."""
    return bsym.sym.name == name and bsym.sym.executor is torch_executor()


def return_names(trace: TraceCtx) -> set[str]:
    """Names of every proxy the trace returns (outputs and, in a forward trace, saved tensors)."""
    for bsym in reversed(trace.bound_symbols):
        if bsym.sym.id == prims.PrimIDs.RETURN:
            return {p.name for p in bsym.flat_proxy_args}
    return set()


def is_prim(bsym: BoundSymbol) -> bool:
    """True for a bound symbol of one of Thunder's primitives (``prims.reshape``, ``prims.add``, ...)."""
    return isinstance(bsym.sym.id, prims.PrimIDs)


_INPLACE_SETITEM = None
_GUARD_EXECUTOR = None


def guard_executor() -> Any:
    """The operator executor that runs this package's own operators (not registered with Thunder)."""
    global _GUARD_EXECUTOR
    if _GUARD_EXECUTOR is None:
        from thunder.extend import OperatorExecutor

        _GUARD_EXECUTOR = OperatorExecutor("fusion_guard", version="0.1")
    return _GUARD_EXECUTOR


def inplace_setitem() -> Any:
    """Our operator ``a[key] = value; return a``: a setitem and the ``copy_`` back into ``a``, folded."""
    global _INPLACE_SETITEM
    if _INPLACE_SETITEM is None:

        def meta(a, key, value, grad_enabled):
            return TensorProxy(like=a)

        def setitem_(a, key, value, grad_enabled):
            if grad_enabled and a.is_leaf and a.requires_grad:
                raise RuntimeError("a leaf Variable that requires grad is being used in an in-place operation.")
            a[key] = value
            return a

        _INPLACE_SETITEM = guard_executor().register_operator("inplace_setitem", meta=meta, fn=setitem_)
    return _INPLACE_SETITEM


def _lowering_executors() -> list[Any]:
    return [torch_executor(), *[ex for ex in get_always_executors() if ex is not torch_executor()]]


def lowering_executor_names() -> frozenset[str]:
    """Names of the executors :func:`lower_to_torch` may hand operations to (torch, and Python for numbers)."""
    return frozenset(ex.name for ex in _lowering_executors())


def effects(bsym: BoundSymbol) -> int:
    """How many operations with an effect beyond their outputs (``copy_`` into a tensor, any op Thunder
    must never remove) ``bsym`` performs, counted at the innermost level that has them."""
    inner = sum(effects(s) for s in bsym.subsymbols)
    if inner:
        return inner
    return int(OpTags.DONT_DCE in (bsym.sym.tags or ()))


def executed_by(bsym: BoundSymbol) -> str | None:
    ex = bsym.sym.executor
    return None if ex is None else getattr(ex, "name", None)


def refresh_dels(trace: TraceCtx) -> TraceCtx:
    """Re-derive the ``del`` statements after bound symbols moved (Thunder's own last-use pass)."""
    from thunder.executors.passes import del_last_used

    backward = is_backward(trace)
    if backward:
        # del_last_used adds the collection clears again; without this they would be doubled, and
        # positional readers of the backward trace (CUDAGraphTransform) would break.
        trace = new_trace_like(trace, [b for b in trace.bound_symbols if b.sym.name != "clear_mutable_collection"])
    return del_last_used(trace, clear_mutable_collections=backward)


def compile_function_name() -> str | None:
    """Name of the function or module Thunder is compiling right now, if known."""
    from thunder.core.compile_data import get_compile_data

    try:
        fn = getattr(get_compile_data(), "fn", None)
    except LookupError:
        return None
    return _function_name(fn)


def jitted_function_name(jitted: Any) -> str | None:
    """The function name the guard records for ``jitted`` (what :func:`compile_function_name` gave)."""
    cd = thunder.compile_data(jitted)
    return None if cd is None else _function_name(getattr(cd, "fn", None))


def _function_name(fn: Any) -> str | None:
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


# ThunderCompiler always sets this option on the thunder.jit calls of the subgraphs it splits off.
_THUNDERFX_OPTION = "thunderfx_disable_split_autograd"


def compiling_fx_subgraph() -> torch.fx.GraphModule | None:
    """The ThunderFX split subgraph (an fx GraphModule) Thunder is compiling right now; None outside ThunderFX."""
    from thunder.core.compile_data import get_compile_data

    try:
        cd = get_compile_data()
    except LookupError:
        return None
    fn = getattr(cd, "fn", None)
    options = getattr(cd, "compile_options", None) or {}
    if isinstance(fn, torch.fx.GraphModule) and _THUNDERFX_OPTION in options:
        return fn
    return None


def fx_graph_ops(gm: torch.fx.GraphModule) -> list[str]:
    """The operations of an fx graph in order: function, method or module-type names."""
    ops = []
    for node in gm.graph.nodes:
        if node.op == "call_function":
            target = node.target
            ops.append(getattr(target, "__name__", None) or getattr(target, "name", None) or str(target))
        elif node.op == "call_method":
            ops.append(str(node.target))
        elif node.op == "call_module":
            ops.append(type(gm.get_submodule(node.target)).__name__)
    return ops


@dataclass(frozen=True)
class FxSubgraph:
    """One subgraph ThunderFX split off and compiled with Thunder.

    ``graph`` indexes the Dynamo graphs the backend received, ``name`` is Thunder's name for the split
    submodule (``thunder_0``), ``module`` the fx GraphModule Thunder compiled and ``jitted`` its
    ``thunder.jit`` result; ``split_reasons`` says why Thunder split the Dynamo graph (empty when it did not).
    """

    graph: int
    name: str
    module: torch.fx.GraphModule
    jitted: Any
    split_reasons: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        return f"dynamo graph {self.graph}, {self.name}"


def is_thunderfx(obj: Any) -> bool:
    """True for a ``thunderfx(...)`` result or a ``ThunderCompiler`` backend."""
    from thunder.dynamo import ThunderCompiler

    return isinstance(getattr(obj, "_backend", obj), ThunderCompiler)


def thunderfx_subgraphs(obj: Any) -> list[FxSubgraph]:
    """Every Thunder-compiled subgraph of a ThunderFX object so far, in the order the backend made them."""
    if not is_thunderfx(obj):
        raise TypeError(f"{type(obj).__name__} is not a thunderfx object or a ThunderCompiler")
    found = []
    for index, info in enumerate(getattr(obj, "_backend", obj).subgraph_infos):
        reasons = tuple(_split_reason_text(r) for r in info.split_reasons or ())
        compiled = list(info.thunder_compiled_fns or ())
        for name, child in info.split_graph_module.named_children():
            if any(child is fn for fn in compiled):
                found.append(FxSubgraph(index, name, compiled_module(child), child, reasons))
    return found


def _split_reason_text(reason: Any) -> str:
    kind = getattr(getattr(reason, "reason_type", None), "name", "split")
    text = f"{kind}: {getattr(reason, 'info', None) or ''}".strip()
    exception = getattr(reason, "exception", None)
    return f"{text} ({exception})" if exception else text


def thunderfx_function_name(obj: Any) -> str | None:
    """The name of the function or module a ``thunderfx(...)`` result compiles."""
    fn = getattr(obj, "_func", None)
    return _function_name(getattr(fn, "_orig_mod", fn))


def compiled_module(jitted: Any) -> Any:
    """The function or module a ``thunder.jit`` result compiles (None if it is not one)."""
    cd = thunder.compile_data(jitted)
    return None if cd is None else getattr(cd, "fn", None)


def nvfuser_scheduled_ir(region_fn: Callable) -> str | None:
    """nvFuser's scheduled IR of the last run of a fusion region's callable; None where nvFuser does not expose it.

    Thunder's ``FusionDefinitionWrapper`` keeps the fusion definition it last ran in ``last_used``;
    ``nvfuser_direct`` gives its executor cache as ``fec`` with ``get_most_recent_scheduled_ir``.
    """
    fec = getattr(getattr(region_fn, "last_used", None), "fec", None)
    get_ir = getattr(fec, "get_most_recent_scheduled_ir", None)
    if get_ir is None:
        return None
    try:
        text = get_ir()
    except Exception:
        return None
    return text if isinstance(text, str) else None


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


def python_callable_from_symbols(
    name: str, bsyms: Sequence[BoundSymbol], inputs: Sequence[Proxy], outputs: Sequence[Proxy]
) -> Callable:
    """A Python function running ``bsyms`` from ``inputs`` to ``outputs``.

    Built the way Thunder's CUDA-graph transform builds its region functions
    (``CUDAGraphRunner.make_python_callable_from_symbols``).
    """
    from inspect import Parameter, Signature

    def region_fn():
        pass

    region_fn.__signature__ = Signature([Parameter(p.name, Parameter.POSITIONAL_ONLY) for p in inputs])
    region_fn.__name__ = name
    trace = TraceCtx(region_fn)
    trace.args = list(inputs)
    trace.kwargs = {}
    trace.bound_symbols = [*bsyms, prims.python_return.bind(list(outputs), output=None)]
    return trace.python_callable()


def _recording_callable(trace: TraceCtx, kind: str, calls: dict[tuple[str, str], tuple]) -> Callable:
    def recorder(name: str, fn: Callable) -> Callable:
        def record(*args):
            calls[(kind, name)] = args
            return fn(*args)

        return record

    def wrapped(bsym: BoundSymbol) -> BoundSymbol:
        new = bsym.from_bsym()
        # Set after from_bsym: nvFuser's symbols re-set their call context when bound.
        new._call_ctx = {bsym.sym.name: recorder(bsym.sym.name, region_callable(bsym))}
        return new

    bsyms = [wrapped(b) if is_fusion(b) else b for b in trace.bound_symbols]
    return new_trace_like(trace, bsyms).python_callable()


@contextmanager
def recording_fusion_calls(jitted: Any) -> Iterator[dict[tuple[str, str], tuple]]:
    """While open, calls of ``jitted`` record the real arguments of every fusion call.

    The compiled program of the last call is swapped for one rebuilt from the same final forward and
    backward traces with each fusion callable wrapped; arguments are recorded under
    ``(trace, region name)``, ``trace`` being 'forward' or 'backward'. The program is restored on exit.
    """
    from thunder.common import transform_to_torch_types

    cs = thunder.compile_stats(jitted)
    if cs is None:
        raise TypeError(f"{type(jitted).__name__} is not a thunder.jit function or module")
    cache = cs.interpreter_cache
    found = [i for i, entry in enumerate(cache) if entry.computation_traces is cs.last_traces]
    if not found:
        raise RuntimeError(
            "no compiled program to instrument: call the jitted function first (and keep Thunder's caching on)"
        )
    index = found[0]
    entry = cache[index]
    calls: dict[tuple[str, str], tuple] = {}
    forward = _recording_callable(transform_to_torch_types(entry.computation_traces[-1]), "forward", calls)
    backward = None
    if entry.backward_fn is not None:
        backward = _recording_callable(entry.backward_traces[-1], "backward", calls)
    cache[index] = entry._replace(computation_fn=forward, backward_fn=backward)
    try:
        yield calls
    finally:
        cache[index] = entry


def tensor_spec(p: Any) -> tuple[tuple[int, ...], torch.dtype, torch.device, bool] | None:
    """(shape, dtype, device, requires_grad) of a tensor proxy with a known shape; None for anything else."""
    if not isinstance(p, TensorProxy):
        return None
    try:
        shape = tuple(int(d) for d in p.shape)
    except (TypeError, ValueError):
        return None
    return shape, dtypes.to_torch_dtype(p.dtype), devices.to_torch_device(p.device), bool(p.requires_grad)


def number_value(p: Any) -> Any:
    """The value a number proxy was traced with (None when it has none, or ``p`` is not one)."""
    return p.value if isinstance(p, NumberProxy) else None


def trace_input_names(trace: TraceCtx) -> set[str]:
    """Names of every proxy the trace receives as an argument (nested collections included)."""
    from torch.utils._pytree import tree_flatten

    return {p.name for p in tree_flatten((trace.args, trace.kwargs))[0] if isinstance(p, Proxy)}


def canonical_ops(bsyms: Sequence[BoundSymbol]) -> str:
    """The ops of ``bsyms`` with their arguments as text, proxies renamed in order of appearance: equal for
    two regions that run the same ops on the same kinds of values, whatever their traces named them."""
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

    lines = []
    for b in bsyms:
        outs = text(b.flat_outs)
        lines.append(f"{outs}={op_id(b)}({text(b.args)},{text(b.kwargs)})")
    return "\n".join(lines)


# Every module that touches Thunder imports this one: the place to fix a broken Thunder/nvFuser pair.
from .compat import ensure_nvfuser_compat  # noqa: E402

ensure_nvfuser_compat()


# --- hoisting (passes/hoist.py) --------------------------------------------------------------------

_STRUCTURAL_PREFIXES = ("unpack_", "check_", "pack_")
_STRUCTURAL = frozenset({"python_return", "del", "comment", "clear_mutable_collection", "python_print", "put_grad"})


def is_plumbing(bsym: BoundSymbol) -> bool:
    """True for the trace's own plumbing, no operation on values: unpacking inputs, checks, returns, ``del``s,
    comments, collections, printing, context managers (wider than :func:`is_structural`)."""
    name = bsym.sym.name
    if name in _STRUCTURAL or name.startswith(_STRUCTURAL_PREFIXES) or is_comment_or_del(bsym):
        return True
    return OpTags.CTX_MANAGER_ENTER_EXIT_OP in (bsym.sym.tags or ())


def tag_names(bsym: BoundSymbol) -> set[str]:
    """Names of the op tags (``RANDOM_OP``, ``DONT_DCE``, ``IN_PLACE``, ...) of ``bsym`` and every op inside it."""
    found = {t.name for t in (bsym.sym.tags or ()) if isinstance(t, OpTags)}
    for s in bsym.subsymbols:
        found |= tag_names(s)
    return found


def op_names_deep(bsym: BoundSymbol) -> set[str]:
    """The names of ``bsym`` and of every op it is made of, at every level."""
    found = {bsym.sym.name}
    for s in bsym.subsymbols:
        found |= op_names_deep(s)
    return found


_PLAIN = (*_NUMBER_LEAVES, Proxy)


def plain_arguments(bsym: BoundSymbol) -> bool:
    """True when every argument is a proxy, a number or a plain constant (no process group, stream, callable)."""
    return all(isinstance(x, _PLAIN) for x in bsym.flat_args)


def has_symbolic_shape(p: Any) -> bool:
    """True for a tensor proxy whose shape holds a number proxy (``cache="symbolic values"``)."""
    return isinstance(p, TensorProxy) and any(not isinstance(d, int) for d in p.shape)


def returned_names(trace: TraceCtx) -> tuple[set[str], set[str]]:
    """(names the caller gets, names only saved for the backward) of the proxies ``trace`` returns.

    A forward trace made by Thunder's autodiff returns ``(outputs, saved_for_backward)``; the saved
    tensors reach only the backward trace. Any other trace hands everything it returns to its caller.
    """
    from torch.utils._pytree import tree_flatten

    ret = next((b for b in reversed(trace.bound_symbols) if b.sym.id == prims.PrimIDs.RETURN), None)
    if ret is None:
        return set(), set()
    value = ret.args[0] if len(ret.args) == 1 else ret.args
    if TraceTag.AUGMENTED_FORWARD in trace.tags and isinstance(value, (tuple, list)) and len(value) == 2:
        caller, saved = value
        names = {p.name for p in tree_flatten(caller)[0] if isinstance(p, Proxy)}
        return names, {p.name for p in tree_flatten(saved)[0] if isinstance(p, Proxy)} - names
    return {p.name for p in ret.flat_proxy_args}, set()


HOISTED_NAME = "hoisted_constants"


class HoistedValues:
    """The outputs of a hoisted sub-program: computed on the first call, then handed back on every call.

    One object per compiled trace (a recompilation builds a new trace and so a new cache). ``computed``
    counts runs of the sub-program, ``reused`` the calls served from the cache. A run during CUDA graph
    capture is not kept (its tensors are only filled when the graph replays).
    """

    def __init__(self, name: str, fn: Callable, outputs: Sequence[str]) -> None:
        self.name = name
        self.fn = fn
        self.outputs = tuple(outputs)
        self.values: Any = None
        self.computed = 0
        self.reused = 0
        self.enabled = True

    def __call__(self) -> Any:
        values = self.values
        if values is not None:
            self.reused += 1
            return values
        values = tuple(self.fn())
        self.computed += 1
        if self.enabled and not _capturing_cuda_graph():
            self.values = values
        return values

    def disable(self) -> None:
        """Compute on every call from now on (something writes a cached tensor)."""
        self.enabled = False
        self.values = None

    def __repr__(self) -> str:
        return (
            f"HoistedValues({self.name}: {len(self.outputs)} outputs, computed {self.computed}, reused {self.reused})"
        )


def _capturing_cuda_graph() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def hoisted_call(
    name: str, bsyms: Sequence[BoundSymbol], outputs: Sequence[Proxy], returns: Sequence[Proxy] | None = None
) -> tuple[BoundSymbol, HoistedValues]:
    """One call, taking no argument, that runs ``bsyms`` once and then returns the same ``outputs`` every call.

    ``returns`` (default ``outputs``) are the proxies of ``bsyms`` handed out as ``outputs``, in order
    (one may be handed out under several names). The bound symbols run exactly as the trace would
    have run them (same symbols, same executors), through a Python function built the way Thunder's
    CUDA-graph transform builds its regions.
    """
    from thunder.core.symbol import Symbol
    from thunder.executors.passes import _del_last_used

    returns = list(outputs if returns is None else returns)
    body = [b for b in bsyms if not is_comment_or_del(b)]
    fn = python_callable_from_symbols(f"{name}_body", _del_last_used(body, returns), [], returns)
    values = HoistedValues(name, fn, [p.name for p in outputs])
    outputs = tuple(outputs)

    def meta() -> tuple[Proxy, ...]:
        return outputs  # takes nothing, gives the same proxies, as Thunder's temporary fusion operations do

    sym = Symbol(name=name, meta=meta, executor=guard_executor())
    bsym = BoundSymbol(sym, (), {}, outputs, tuple(body), _call_ctx={name: values})
    return bsym, values


def hoisted_values(trace: TraceCtx) -> list[HoistedValues]:
    """The caches of the hoisted sub-programs of ``trace`` (empty when nothing was hoisted), also when
    a later transform moved the hoisted call into a region of its own (CUDA graphs)."""

    def walk(bsyms: Iterable[BoundSymbol]) -> Iterator[HoistedValues]:
        for bsym in bsyms:
            for fn in (bsym._call_ctx or {}).values():
                if isinstance(fn, HoistedValues):
                    yield fn
            if bsym.sym.name != HOISTED_NAME:
                yield from walk(bsym.subsymbols)

    return list({id(v): v for v in walk(trace.bound_symbols)}.values())


def is_integer_or_bool(p: Any) -> bool:
    """True for a tensor proxy of an integer or boolean dtype (arithmetic on them never rounds)."""
    return isinstance(p, TensorProxy) and (dtypes.is_integer_dtype(p.dtype) or dtypes.is_boolean_dtype(p.dtype))


def input_names(trace: TraceCtx) -> set[str]:
    """Names of the trace's inputs: its arguments and what its unpacking ops take out of them."""
    from torch.utils._pytree import tree_flatten

    names = {p.name for p in tree_flatten((trace.args, trace.kwargs))[0] if isinstance(p, Proxy)}
    for bsym in trace.bound_symbols:
        if bsym.sym.name.startswith("unpack_"):
            names.update(p.name for p in bsym.flat_proxy_outs)
    return names
