"""Reading traces: what a bound symbol is and runs, what its values are, what a trace takes and returns."""

from __future__ import annotations

import dis
import functools
import importlib.util
import itertools
import os
import re
import sysconfig
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import thunder
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
    "fx_node_source",
    "has_symbolic_shape",
    "is_backward",
    "is_comment_or_del",
    "is_distributed_prim",
    "is_fusion",
    "is_library_file",
    "is_number_like",
    "is_plumbing",
    "is_prim",
    "is_torch_op",
    "leaves",
    "module_path",
    "number_args",
    "number_value",
    "op_id",
    "op_name",
    "op_names_deep",
    "proxy_device",
    "record_user_frames",
    "reinterpreted_itemsizes",
    "returned_names",
    "returned_proxies",
    "source_finder",
    "source_line",
    "stack_trace_source",
    "subsymbols",
    "tag_names",
    "tensor_nbytes",
    "tensor_proxies",
    "tensor_spec",
    "tensor_text",
    "torch_dtype",
    "trace_inputs",
    "user_frame",
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


def is_prim(bsym: BoundSymbol) -> bool:
    """True for a bound symbol of one of Thunder's primitives (``prims.reshape``, ``prims.add``, ...)."""
    return isinstance(bsym.sym.id, prims.PrimIDs)


def is_comment_or_del(bsym: BoundSymbol) -> bool:
    """True for a ``del`` or a comment: trace statements that compute nothing."""
    return bsym.sym.id in (prims.PrimIDs.DEL, prims.PrimIDs.COMMENT)


def fusion_body(bsym: BoundSymbol) -> list[BoundSymbol]:
    """The ops a fusion region (or a composite op) runs, one level down: its subsymbols without comments and dels."""
    return [b for b in bsym.subsymbols if not is_comment_or_del(b)]


def is_torch_op(bsym: BoundSymbol, name: str) -> bool:
    """True for a bound symbol that Thunder's torch executor runs as the operator ``name``."""
    return bsym.sym.name == name and bsym.sym.executor is torch_executor()


def is_distributed_prim(bsym: BoundSymbol) -> bool:
    """True for a bound symbol of one of Thunder's distributed prims (``thunder.distributed.prims``)."""
    return _DistributedPrimIDs is not None and isinstance(bsym.sym.id, _DistributedPrimIDs)


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


def source_line(*bsyms: BoundSymbol) -> str | None:
    """Where the user wrote the first of ``bsyms`` (or of their subsymbols, breadth first) that knows it: the
    user's frame that made it (the first outside torch, Thunder, this package and Python's own library, or where
    the user wrote no frame, the module of their model: :func:`record_user_frames`), else the innermost frame
    Thunder recorded where that is the user's; never a line of torch, Thunder or a program torch.fx generated."""
    for bsym in bsyms:
        stack = [bsym]
        while stack:
            b = stack.pop(0)
            positions, filename = getattr(b, "source_positions", None), getattr(b, "source_filename", None)
            if filename and positions is not None and positions.lineno is not None:
                user = getattr(positions, "user", None)
                if user or not is_library_file(filename):
                    return user or f"{filename}:{positions.lineno}"
            stack.extend(b.subsymbols)
    return None


def source_finder(trace: TraceCtx) -> Callable[[Iterable[str]], str | None]:
    """A function of names giving :func:`source_line` of the first that names a fusion region of ``trace`` or a
    value one of its ops (or an op in one of its regions) makes; None where none is known."""
    made: dict[str, BoundSymbol] = {}
    for bsym in trace.bound_symbols:
        if is_fusion(bsym):
            made.setdefault(bsym.sym.name, bsym)
        for b in (bsym, *bsym.subsymbols):
            for out in b.flat_outs:
                if isinstance(out, Proxy):
                    made.setdefault(out.name, b)

    def source_of(names: Iterable[str]) -> str | None:
        for name in names:
            line = source_line(made[name]) if name in made else None
            if line:
                return line
        return None

    return source_of


_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # this package: _thunder's parent
# Libraries whose frames are no user's line: torch, Thunder, this package, and the tensor-notation libraries that
# only hand their calls on to torch (einops' rearrange is the user's line that called it, not einops' own)
_NOTATION_LIBRARIES = ("einops", "opt_einsum")


def _package_dirs(names: Iterable[str]) -> list[str]:
    """The folders of the installed packages ``names`` (found without importing them)."""
    dirs = []
    for name in names:
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.origin:
            dirs.append(os.path.dirname(os.path.abspath(spec.origin)))
    return dirs


_LIBRARIES = tuple(
    path + os.sep
    for path in (
        os.path.dirname(os.path.abspath(torch.__file__)),
        os.path.dirname(os.path.abspath(thunder.__file__)),
        _PACKAGE,
        *_package_dirs(_NOTATION_LIBRARIES),
    )
)
# this package's example models (the demo's functions, the benchmark cases, the zoo's own models): a user's code
_EXAMPLES = frozenset(
    os.path.join(_PACKAGE, *parts)
    for parts in (("tools", "demo.py"), ("bench", "cases.py"), ("bench", "zoo_models.py"))
)
_STDLIB = os.path.abspath(sysconfig.get_paths()["stdlib"]) + os.sep
_GENERATED = ("<eval_with_key>", "thunder.")  # torch.fx's and Thunder's generated programs
_STACK_FRAME = re.compile(r'File "([^"]+)", line (\d+)')


@functools.lru_cache(maxsize=4096)
def is_library_file(filename: str) -> bool:
    """True for a file of torch, Thunder, this package (its example models aside) or Python's own library, or a
    program torch.fx or Thunder generated: no frame a user wrote."""
    path = os.path.abspath(filename)
    if path in _EXAMPLES:
        return False
    if filename.startswith(_GENERATED) or path.startswith(_LIBRARIES):
        return True
    return path.startswith(_STDLIB) and not {"site-packages", "dist-packages"} & set(path.split(os.sep))


def user_frame(frames: Iterable[tuple[str, int]]) -> str | None:
    """``file:line`` of the first of ``frames`` ((file, line), innermost first) outside the libraries of
    :func:`is_library_file`; None where all are inside."""
    return next((f"{file}:{line}" for file, line in frames if not is_library_file(file)), None)


def stack_trace_source(text: str | None) -> str | None:
    """The user's frame (:func:`user_frame`) of a formatted stack (a torch.fx node's ``stack_trace``, outermost
    first)."""
    return user_frame(reversed(_STACK_FRAME.findall(text or "")))


class _Located(dis.Positions):
    """Thunder's position of an op in its innermost frame, and ``user``: the user's frame that led there."""

    user: str | None = None


def record_user_frames() -> None:
    """Make each op Thunder traces remember the user's frame that led to it (the first outside torch, Thunder,
    this package and Python's library; under ThunderFX the one torch.fx recorded for its node), beside the
    innermost frame Thunder records and prints (``torch/nn/modules/linear.py`` for an ``nn.Linear``): read by
    :func:`source_line`. Applied once per process; what Thunder records and prints is unchanged."""
    from thunder.core.interpreter import InterpreterRuntimeCtx

    original = InterpreterRuntimeCtx.get_current_user_source_location
    if getattr(original, "_fusion_guard", False):
        return

    def located(self: Any) -> Any:
        filename, positions = original(self)
        if filename is None or positions is None or not is_library_file(filename):
            return filename, positions
        try:
            user = _user_frame_of(self.frame_stack)
        except Exception:  # a frame this reading does not know: Thunder's own position stays
            user = None
        if user is None:
            return filename, positions
        marked = _Located(*positions)
        marked.user = user
        return filename, marked

    located._fusion_guard = True  # type: ignore[attr-defined]
    located.__wrapped__ = original  # type: ignore[attr-defined]
    InterpreterRuntimeCtx.get_current_user_source_location = located


def _user_frame_of(frames: Sequence[Any]) -> str | None:
    """The user's frame among the interpreter's ``frames`` (outermost first); in a torch.fx program, what
    :func:`fx_node_source` says of the node of the line running; where the user wrote no frame (a model built of
    torch's modules alone, an ``nn.Sequential``), the module of their model that ran it (:func:`module_path`)."""
    for frame in reversed(frames):
        filename, positions = frame.code.co_filename, frame.positions
        if positions is None or positions.lineno is None:
            continue
        if filename.startswith("<eval_with_key>"):
            found = fx_node_source(_fx_node(frame, positions.lineno))
            if found:
                return found
        elif not is_library_file(filename):
            return f"{filename}:{positions.lineno}"
    modules = [m for m in (_frame_self(f) for f in frames) if isinstance(m, torch.nn.Module)]
    return module_path(modules[0], modules[-1]) if modules else None


def _frame_self(frame: Any) -> Any:
    """The first local of an interpreter frame (``self`` in a method), unwrapped; None where it has none."""
    first = frame.localsplus[0] if frame.localsplus else None
    return getattr(first, "value", first)  # the interpreter's wrapped value


def _fx_node(frame: Any, lineno: int) -> Any:
    """The torch.fx node whose generated line ``lineno`` the ``forward`` frame of a GraphModule runs; None where
    it is not known."""
    module = _frame_self(frame)
    index = (getattr(module, "_lineno_map", None) or {}).get(lineno - frame.code.co_firstlineno)  # body lines
    graph = getattr(module, "graph", None)
    if index is None or graph is None:
        return None
    return next(itertools.islice(graph.nodes, index, None), None)


def module_path(root: torch.nn.Module, module: torch.nn.Module) -> str:
    """``model.blocks.0.conv (Conv2d)``: where ``module`` sits in the user's model ``root`` (its name in
    ``root.named_modules()``) and its class, how a user finds a line of a model built of torch's modules alone."""
    if module is root:
        return f"model ({type(root).__name__})"
    name = next((n for n, m in root.named_modules() if m is module), None)
    return f"model.{name} ({type(module).__name__})" if name else f"model ({type(module).__name__})"


# Dynamo's name of a module in ``nn_module_stack``: ``L['self'].blocks[0]._modules['conv']``
_DYNAMO_ROOT = re.compile(r"^L\['(\w+)'\]")
_DYNAMO_MODEL = ("self", "fn")  # the compiled module itself: torch.compile's ``self``, ThunderFX's ``fn``
_DYNAMO_ITEM = re.compile(r"(?:\._modules)?\[['\"]?([^'\"\]]+)['\"]?\]")


def fx_node_source(node: Any) -> str | None:
    """Where the user wrote a torch.fx node Dynamo made: their frame in its recorded stack
    (:func:`stack_trace_source`), else, for a model built of torch's modules alone, the module of their model
    Dynamo recorded it ran in (``model.0 (Linear)``, as :func:`module_path` names it); None where neither is
    known."""
    if node is None:
        return None
    found = stack_trace_source(node.meta.get("stack_trace"))
    stack = node.meta.get("nn_module_stack") or {}
    if found or not stack:
        return found
    path, cls = list(stack.values())[-1]
    root = _DYNAMO_ROOT.match(path)
    name = _DYNAMO_ITEM.sub(r".\1", path[root.end() :] if root else path)
    base = "model" if root is None or root.group(1) in _DYNAMO_MODEL else root.group(1)
    kind = getattr(cls, "__name__", None) or str(cls).rsplit(".", 1)[-1]
    return f"{base}{name} ({kind})"
