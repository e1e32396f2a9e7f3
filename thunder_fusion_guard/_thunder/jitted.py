"""Inspecting what ``thunder.jit`` and ThunderFX made: transforms, traces, subgraphs, compiled callables, and
recording the arguments of the fusion calls of a run."""

from __future__ import annotations

import itertools
import linecache
import operator
import re
import sys
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import thunder
import torch
from thunder.core.symbol import BoundSymbol
from thunder.core.trace import TraceCtx

from .compiling import _THUNDERFX_OPTION, function_name
from .executors import executor_names
from .lowering import GUARD_PROVENANCE, new_trace_like
from .traces import fx_node_source, is_fusion, source_line

__all__ = [
    "FailedRegion",
    "FxSplitOp",
    "FxSubgraph",
    "call_targets",
    "compiled_module",
    "executors_of",
    "failed_region",
    "fx_module_source",
    "fx_output_examples",
    "instrumenting_program",
    "is_jitted",
    "is_thunderfx",
    "jit_again_without",
    "jitted_function_name",
    "jitted_transforms",
    "last_prologue_ns",
    "last_traces",
    "module_call",
    "nvfuser_scheduled_ir",
    "recompile_reasons",
    "recording_fusion_calls",
    "region_callable",
    "replace_subgraph",
    "set_module_call",
    "split_graph_readers",
    "split_reason_words",
    "thunderfx_function_name",
    "thunderfx_split_ops",
    "thunderfx_subgraph_module",
    "thunderfx_subgraphs",
    "thunderfx_transforms",
    "traces_before_guard",
    "transform_classes",
    "with_region_callable",
]


def executors_of(jitted: Any) -> list[tuple[str, bool]]:
    """(name, is a fusion executor) of each executor a ``thunder.jit`` result compiles with."""
    cd = thunder.compile_data(jitted)
    return executor_names(getattr(cd, "executors_list", None) or ()) if cd is not None else []


def transform_classes(transform: Any) -> list[type]:
    """The class of ``transform`` and its bases down to Thunder's ``Transform`` (which every transform shares)."""
    classes = []
    for cls in type(transform).__mro__:
        if cls in (thunder.Transform, object):
            break
        classes.append(cls)
    return classes


def jitted_transforms(jitted: Any) -> list[Any]:
    """The transforms a ``thunder.jit`` result was built with ([] if it is not one)."""
    return list(getattr(jitted, "_lc_transforms", None) or [])


def jitted_function_name(jitted: Any) -> str | None:
    """The function name the guard records for ``jitted`` (what :func:`compile_function_name` gave)."""
    cd = thunder.compile_data(jitted)
    return None if cd is None else function_name(getattr(cd, "fn", None))


def is_jitted(obj: Any) -> bool:
    """True for a ``thunder.jit`` function or module."""
    try:
        return thunder.compile_stats(obj) is not None
    except Exception:
        return False


def last_prologue_ns(jitted: Any) -> int:
    """How long the prologue (Thunder's input checks) of the last call of ``jitted`` took, in ns (0: not known)."""
    cs = thunder.compile_stats(jitted)
    start, stop = getattr(cs, "last_prologue_execution_start", -1), getattr(cs, "last_prologue_execution_stop", -1)
    return stop - start if start > 0 and stop > start else 0


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


@dataclass(frozen=True)
class FailedRegion:
    """The fusion region whose call raised an error: the trace it is in (``forward`` or ``backward``), its name
    there, its ops, the user's source line, and its ops that are (or are the gradients of) torch ops Thunder only
    registered automatically, as (op, the torch op, its source line)."""

    trace: str
    name: str
    ops: list[str]
    source: str | None
    fallbacks: list[tuple[str, str, str | None]]


_CALLED = re.compile(r"([A-Za-z_]\w*)\(")


def failed_region(obj: Any, error: BaseException) -> FailedRegion | None:
    """The fusion region of a program of ``obj`` (a ``thunder.jit`` function or a ThunderFX object) whose call
    raised ``error``: read from the innermost frame of ``error``'s traceback that runs one of Thunder's programs,
    the line it ran and the program's last traces. None where the error came from elsewhere (Thunder's
    interpreter, the user's code)."""
    frames = [frame for frame, _ in traceback.walk_tb(error.__traceback__)]
    programs = [sub.jitted for sub in thunderfx_subgraphs(obj)] if is_thunderfx(obj) else [obj]
    for frame in reversed(frames):
        filename = frame.f_code.co_filename
        if not filename.startswith("thunder."):
            continue
        kind = "backward" if "backward" in frame.f_code.co_name else "forward"
        called = _CALLED.findall(linecache.getline(filename, frame.f_lineno))
        for jitted in programs:
            trace = last_traces(jitted)[kind == "backward"]
            fusions = {b.sym.name: b for b in (trace.bound_symbols if trace is not None else ()) if is_fusion(b)}
            found = next((fusions[name] for name in called if name in fusions), None)
            if found is not None:
                return _failed(jitted, kind, found)
    return None


def _failed(jitted: Any, kind: str, fusion: BoundSymbol) -> FailedRegion:
    try:
        auto = {name.rsplit(".", 1)[-1]: name for name in thunder.get_auto_registered_torch_op_names(jitted) or ()}
    except Exception:  # not known for this program
        auto = {}
    forward = last_traces(jitted)[0]
    made = [b for top in (forward.bound_symbols if forward is not None else ()) for b in (top, *top.subsymbols)]
    fallbacks = []
    for op in fusion.subsymbols:
        base = op.sym.name.removesuffix("_vjp")
        torch_op = auto.get(base)
        if torch_op is not None:  # a gradient's line is its forward op's
            line = source_line(op) or next((source_line(b) for b in made if b.sym.name == base), None)
            fallbacks.append((op.sym.name, torch_op, line))
    ops = [op.sym.name for op in fusion.subsymbols]
    return FailedRegion(kind, fusion.sym.name, ops, source_line(*fusion.subsymbols), fallbacks)


def thunderfx_transforms(obj: Any) -> list[Any]:
    """The transforms passed to a ThunderFX object (``thunderfx(...)`` or a ``ThunderCompiler``)."""
    backend = getattr(obj, "_backend", obj)
    options = getattr(backend, "thunder_options", None)
    if not isinstance(options, dict):
        return []
    return list(options.get("transforms") or [])


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
    owner: Any = None  # the split GraphModule that calls it, as its attribute ``name``

    @property
    def label(self) -> str:
        return f"dynamo graph {self.graph}, {self.name}"


def is_thunderfx(obj: Any) -> bool:
    """True for a ``thunderfx(...)`` result or a ``ThunderCompiler`` backend."""
    from thunder.dynamo import ThunderCompiler  # loads torch._dynamo: only when asked

    return isinstance(getattr(obj, "_backend", obj), ThunderCompiler)


def thunderfx_subgraphs(obj: Any) -> list[FxSubgraph]:
    """Every Thunder-compiled subgraph of a ThunderFX object so far, in the order the backend made them."""
    if not is_thunderfx(obj):
        raise TypeError(f"{type(obj).__name__} is not a thunderfx object or a ThunderCompiler")
    found = []
    for index, info in enumerate(getattr(obj, "_backend", obj).subgraph_infos):
        nodes = {n.name: n for n in info.original_graph_module.graph.nodes}
        reasons = tuple(dict.fromkeys(_split_reason_text(r, nodes) for r in info.split_reasons or ()))
        compiled = list(info.thunder_compiled_fns or ())
        for name, child in info.split_graph_module.named_children():
            if any(child is fn for fn in compiled):
                found.append(FxSubgraph(index, name, compiled_module(child), child, reasons, info.split_graph_module))
    return found


@dataclass(frozen=True)
class FxSplitOp:
    """One node of a Dynamo graph that ThunderFX kept out of Thunder (it runs through Inductor between the
    Thunder subgraphs): its name and target, the splitter's reason (``kind`` is the ``SplitReasonType``
    name), the user's source line and the bytes of its tensor inputs and outputs."""

    graph: int
    node: str
    target: str
    kind: str
    info: str
    exception: str | None
    source: str | None
    nbytes: int | None


_SPLIT_NODE = re.compile(r"node with name: (\S+) and target: ")


def thunderfx_split_ops(obj: Any) -> list[FxSplitOp]:
    """The nodes ThunderFX's splitter kept out of Thunder in every Dynamo graph of ``obj`` so far, in order."""
    found = []
    for index, info in enumerate(getattr(obj, "_backend", obj).subgraph_infos):
        nodes = {n.name: n for n in info.original_graph_module.graph.nodes}
        for reason in info.split_reasons or ():
            text = getattr(reason, "info", None) or ""
            match = _SPLIT_NODE.search(text)
            node = nodes.get(match.group(1)) if match else None
            found.append(
                FxSplitOp(
                    index,
                    node.name if node is not None else (match.group(1) if match else "?"),
                    _target_name(node) if node is not None else "?",
                    _split_kind(reason),
                    text,
                    getattr(reason, "exception", None),
                    fx_node_source(node),
                    _node_bytes(node),
                )
            )
    return found


def _target_name(node: Any) -> str:
    target = node.target
    if isinstance(target, str):
        return f"Tensor.{target}" if node.op == "call_method" else target
    name = getattr(target, "__name__", None) or str(target)
    module = getattr(target, "__module__", None)
    return f"{module}.{name}" if module and module not in ("builtins", "_operator") else name


def _node_bytes(node: Any) -> int | None:
    """Bytes of the tensors ``node`` reads and writes, from Dynamo's fake example values (None if unknown)."""
    if node is None:
        return None
    values = [node.meta.get("example_value")] + [a.meta.get("example_value") for a in node.all_input_nodes]
    tensors = {id(v): v for v in values if isinstance(v, torch.Tensor)}
    try:
        return sum(int(v.numel()) * v.element_size() for v in tensors.values())
    except Exception:  # symbolic sizes
        return None


def replace_subgraph(sub: FxSubgraph, runner: torch.nn.Module) -> None:
    """From the next call on, the split GraphModule that called ``sub``'s Thunder program calls ``runner``."""
    setattr(sub.owner, sub.name, runner)


# What the prologue's cache checks test, by the name Thunder gives the checked value.
_CACHE_INFO_TEXT = {
    "cache_info_alias_tensor_indices": "inputs sharing memory",
    "cache_info_is_grad_enabled": "grad enabled",
    "cache_info_is_autocast_enabled": "autocast enabled",
    "cache_info_default_dtype": "default dtype",
    "cache_info_default_device": "default device",
    "cache_info_no_grad_sync": "no_grad_sync",
}
_TENSOR_CHECKS = {"check_tensor_metadata", "check_tensor_shape_and_metadata"}
_TENSOR_FIELDS = ("shape", "device", "dtype", "requires_grad")


def recompile_reasons(jitted: Any) -> list[str]:
    """Why Thunder compiled ``jitted`` (a ``thunder.jit`` result, or a ThunderFX subgraph's) again: one line
    per compilation after the first, naming the checks of the compilation before it that differ
    ('inputs sharing memory: 0,1,2 -> none', 'input x shape (4, 4) -> (2, 4), input x dtype float32 ->
    float64'); '' where none differ."""
    try:
        entries = list(getattr(thunder.compile_stats(jitted), "interpreter_cache", None) or [])
    except Exception:
        return []
    checks = [_prologue_checks(entry) for entry in entries]
    return [_changed_checks(before, after) for before, after in itertools.pairwise(checks)]


def _prologue_checks(entry: Any) -> dict[tuple[str, str], tuple]:
    """The checks of a cache entry's prologue: (check, checked value's name) -> the values it checks against."""
    traces = getattr(entry, "prologue_traces", None) or []
    found = {}
    for bsym in traces[-1].bound_symbols if traces else []:
        if bsym.sym.name.startswith("check") and bsym.args:
            name = getattr(bsym.args[0], "name", None)
            if name is not None:
                found[(bsym.sym.name, name)] = tuple(bsym.args[1:])
    return found


def _changed_checks(before: dict[tuple[str, str], tuple], after: dict[tuple[str, str], tuple]) -> str:
    changes = []
    for (check, name), values in after.items():
        old = before.get((check, name))
        if old is None or old == values:
            continue
        if check in _TENSOR_CHECKS:
            fields = zip(_TENSOR_FIELDS, old, values, strict=False)
            changes += [f"input {name} {field} {_value(a)} -> {_value(b)}" for field, a, b in fields if a != b]
        else:
            label = _CACHE_INFO_TEXT.get(name, name)
            changes.append(f"{label}: {_value(old[0]) or 'none'} -> {_value(values[0]) or 'none'}")
    if {key[1] for key in before} != {key[1] for key in after}:
        changes.append("the inputs differ in number or structure")
    return ", ".join(changes)


def _value(value: Any) -> str:
    return str(value).removeprefix("torch.") if not isinstance(value, tuple) else str(tuple(value))


# What each of ThunderFX's split reasons (``SplitReasonType``) means, in the user's words.
_SPLIT_WORDS = {
    "MISSING_OP_SUPPORT": "Thunder has no mapping for it",
    "UNSUPPORTED_NODE": "it is in a context Thunder does not support",
    "EXCEPTION_PROXY_THUNDER_OP": "Thunder failed to trace it",
    "EXCEPTION_META_THUNDER_OP": "Thunder failed to trace it",
}
# A callable's repr as ThunderFX's splitter quotes it: ``<built-in method cat of type object at 0x7f...>``.
_CALLABLE_REPR = re.compile(r"<(?:built-in )?(?:method|function) ([\w.]+)[^>]*>")


def _split_kind(reason: Any) -> str:
    """The ``SplitReasonType`` name of one of ThunderFX's split reasons (``split`` where it has none)."""
    return getattr(getattr(reason, "reason_type", None), "name", "split")


def split_reason_words(kind: str, info: str) -> str:
    """Why ThunderFX kept a node out of Thunder, in words: its ``SplitReasonType`` name ``kind`` and the splitter's
    ``info`` read (one wording for the split notes of reports and the rows of ``why_not_fused``)."""
    if "automatic torch fallback" in info:
        return "Thunder has only an automatic torch fallback for it"
    return _SPLIT_WORDS.get(kind, "ThunderFX split the graph here")


def _split_reason_text(reason: Any, nodes: dict[str, Any]) -> str:
    """One split note as a user reads it: the function as they write it (``torch.cat``, no object address), why
    it left Thunder and the first line of the error; the same for every node of that function that left for the
    same reason, so that a report lists it once."""
    info = getattr(reason, "info", None) or ""
    match = _SPLIT_NODE.search(info)
    node = nodes.get(match.group(1)) if match else None
    if node is not None:
        target = _target_name(node)
    else:
        target = _CALLABLE_REPR.sub(r"\1", info.split(" and target: ", 1)[-1].split(" ", 1)[0]) or "?"
    text = f"{target}: {split_reason_words(_split_kind(reason), info)}"
    exception = (getattr(reason, "exception", None) or "").strip()
    return f"{text} ({exception.splitlines()[0]})" if exception else text


def thunderfx_function_name(obj: Any) -> str | None:
    """The name of the function or module a ``thunderfx(...)`` result compiles."""
    fn = getattr(obj, "_func", None)
    return function_name(getattr(fn, "_orig_mod", fn))


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


def call_targets(bsym: BoundSymbol) -> list[Any]:
    """The Python objects ``bsym`` calls when its trace runs (none for an op Thunder runs by itself)."""
    return list((bsym._call_ctx or {}).values())


def region_callable(bsym: BoundSymbol) -> Callable:
    """The Python callable a fusion bound symbol runs (its fusion definition or compiled function)."""
    return bsym._call_ctx[bsym.sym.name]


# Wraps one fusion call: (trace kind, region name, the region's callable) -> the callable to run instead.
WrapCall = Callable[[str, str, Callable], Callable]
# Wraps a whole trace's callable: (trace kind, callable) -> the callable to run instead.
WrapTrace = Callable[[str, Callable], Callable]


def with_region_callable(bsym: BoundSymbol, fn: Callable) -> BoundSymbol:
    """A copy of fusion bound symbol ``bsym`` that runs ``fn`` instead of its region callable."""
    new = bsym.from_bsym()
    # Set after from_bsym: nvFuser's symbols re-set their call context when bound.
    new._call_ctx = {bsym.sym.name: fn}
    return new


def _instrumented_callable(trace: TraceCtx, kind: str, wrap_call: WrapCall) -> Callable:
    def wrapped(bsym: BoundSymbol) -> BoundSymbol:
        return with_region_callable(bsym, wrap_call(kind, bsym.sym.name, region_callable(bsym)))

    bsyms = [wrapped(b) if is_fusion(b) else b for b in trace.bound_symbols]
    return new_trace_like(trace, bsyms).python_callable()


@contextmanager
def instrumenting_program(jitted: Any, wrap_call: WrapCall, wrap_trace: WrapTrace | None = None) -> Iterator[None]:
    """While open, calls of ``jitted`` run its last compiled program rebuilt from the same final forward and
    backward traces, each fusion callable wrapped by ``wrap_call`` (and each trace's callable by ``wrap_trace``);
    ``kind`` is 'forward' or 'backward'. The program is restored on exit."""
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
    whole = wrap_trace or (lambda kind, fn: fn)
    forward = whole(
        "forward", _instrumented_callable(transform_to_torch_types(entry.computation_traces[-1]), "forward", wrap_call)
    )
    backward = None
    if entry.backward_fn is not None:
        backward = whole("backward", _instrumented_callable(entry.backward_traces[-1], "backward", wrap_call))
    cache[index] = entry._replace(computation_fn=forward, backward_fn=backward)
    try:
        yield
    finally:
        cache[index] = entry


@contextmanager
def recording_fusion_calls(jitted: Any) -> Iterator[dict[tuple[str, str], tuple]]:
    """While open, calls of ``jitted`` record the real arguments of every fusion call, under
    ``(trace, region name)``, ``trace`` being 'forward' or 'backward' (see :func:`instrumenting_program`)."""
    calls: dict[tuple[str, str], tuple] = {}

    def recorder(kind: str, name: str, fn: Callable) -> Callable:
        def record(*args):
            calls[(kind, name)] = args
            return fn(*args)

        return record

    with instrumenting_program(jitted, recorder):
        yield calls


def thunderfx_subgraph_module(jitted: Any) -> torch.fx.GraphModule | None:
    """The fx GraphModule of a ThunderFX split subgraph's ``thunder.jit`` result (a ThunderModule); None for any
    other jitted function or module."""
    cd = getattr(jitted, "_lc_cd", None)
    module = getattr(jitted, "_model", None)
    options = getattr(cd, "compile_options", None) or {}
    if isinstance(module, torch.fx.GraphModule) and _THUNDERFX_OPTION in options:
        return module
    return None


def jit_again_without(jitted: Any, dropped: Any, instead: Any = None) -> Any:
    """``jitted`` (a ``thunder.jit`` module) compiled anew from its module with the same executors and options,
    and its transforms but ``dropped`` (``instead`` in its place, where given)."""
    cd = jitted._lc_cd
    return thunder.jit(
        jitted._model,
        executors=cd.executors_list,
        sharp_edges=cd.sharp_edges,
        cache=cd.cache_option,
        disable_torch_autograd=cd.disable_torch_autograd_support,
        transforms=[u for t in jitted_transforms(jitted) for u in ([t] if t is not dropped else [instead]) if u],
        debug_options=cd.debug_options,
        **cd.compile_options,
    )


def fx_module_source(gm: torch.fx.GraphModule) -> str | None:
    """``file:line`` of the user's code of the first op of ``gm`` that Dynamo recorded a stack for."""
    for node in gm.graph.nodes:
        if node.op.startswith("call_") and (found := fx_node_source(node)):
            return found
    return None


def fx_output_examples(gm: torch.fx.GraphModule) -> list[Any]:
    """Dynamo's example value of each output of ``gm`` in order (None for one it has none of); a ``gm`` that returns
    one value, not a tuple, has one."""
    (output,) = gm.graph.find_nodes(op="output")
    returned = output.args[0]
    returned = returned if isinstance(returned, (tuple, list)) else [returned]
    return [getattr(n, "meta", {}).get("example_value") for n in returned]


def module_call(jitted: Any) -> Callable:
    """The compiled function a ``thunder.jit`` module (a ThunderModule) calls in its ``forward``."""
    return jitted._forward_fn


def set_module_call(jitted: Any, fn: Callable) -> None:
    """Make the ThunderModule ``jitted`` call ``fn`` in its ``forward`` instead."""
    jitted._forward_fn = fn


def split_graph_readers(jitted: Any) -> list[set[str]] | None:
    """For each output of the ThunderFX subgraph ``jitted`` (its ThunderModule), what reads it in the split graph
    calling it: ``thunder`` (another Thunder subgraph), ``other`` (a part ThunderFX compiled with Inductor or runs
    eagerly) or ``output`` (the graph's own output). Found on the call stack, so only while the split graph runs;
    None where no calling split graph is found."""
    frame = sys._getframe(1)
    while frame is not None:
        owner = frame.f_locals.get("self")
        if isinstance(owner, torch.fx.GraphModule):
            for node in owner.graph.nodes:
                if node.op == "call_module" and getattr(owner, str(node.target), None) is jitted:
                    return _readers(owner, node)
        frame = frame.f_back
    return None


def _readers(owner: torch.fx.GraphModule, node: torch.fx.Node) -> list[set[str]]:
    def kind(user: torch.fx.Node) -> str:
        if user.op == "output":
            return "output"
        if user.op == "call_module" and isinstance(getattr(owner, str(user.target), None), thunder.ThunderModule):
            return "thunder"
        return "other"

    getitems = [u for u in node.users if u.op == "call_function" and u.target is operator.getitem]
    if not getitems or len(getitems) != len(node.users):
        return [{kind(u) for u in node.users}]
    readers: dict[int, set[str]] = {}
    for g in getitems:
        readers.setdefault(int(g.args[1]), set()).update(kind(u) for u in g.users)
    return [readers.get(i, set()) for i in range(max(readers) + 1)]
