"""Inspecting what ``thunder.jit`` made: transforms, traces, compiled callables, the region a failure came from,
recompilations; running its program with wrapped fusion calls (recording the arguments of a run's calls), and a
ThunderModule's call wrapped and put back. What ThunderFX made is :mod:`.thunderfx`'s."""

from __future__ import annotations

import itertools
import linecache
import re
import traceback
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import thunder
from thunder.core.symbol import BoundSymbol
from thunder.core.trace import TraceCtx

from .compiling import function_name
from .executors import executor_names
from .lowering import GUARD_PROVENANCE, new_trace_like, with_call
from .sources import calls_with_user_lines, source_line
from .thunderfx import is_thunderfx, thunderfx_subgraphs
from .traces import is_fusion

__all__ = [
    "FailedRegion",
    "call_targets",
    "executors_of",
    "failed_region",
    "instrumenting_program",
    "is_jitted",
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
    "traced_again_without",
    "traces_before_guard",
    "transform_classes",
    "unwrap_module_call",
    "with_region_callable",
    "wrap_module_call",
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
    except Exception:  # any object may be asked: whatever its attribute lookup raises means "not a thunder.jit result"
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
    except Exception:  # Thunder's private cache may change between versions: absent or different means no reasons
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
    except Exception:  # nvFuser's C++ errors come through as any type: the IR is extra, so an error means "not exposed"
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
    return with_call(bsym, fn)


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


def traced_again_without(
    jitted: Any, dropped: Any, instead: Any, args: Sequence[Any]
) -> tuple[Any, tuple[TraceCtx | None, TraceCtx | None]]:
    """:func:`jit_again_without`, compiled for ``args`` but not run: the new module (its cache holds the compile, so
    a call on such arguments runs it) and its final forward and backward execution traces. No fusion is compiled
    yet: executors such as torch.compile's compile a region at its first call. The user's lines are held as a call
    of the module holds them (:func:`.sources.calls_with_user_lines`)."""
    again = jit_again_without(jitted, dropped, instead)
    entry, _, _ = calls_with_user_lines(again._lc_cd._get_computation_and_inputs)(*args)
    backward = entry.backward_traces[-1] if entry.backward_traces else None
    return again, (entry.computation_traces[-1], backward)


def module_call(jitted: Any) -> Callable:
    """The compiled function a ``thunder.jit`` module (a ThunderModule) calls in its ``forward``."""
    return jitted._forward_fn


_WRAPPED: weakref.WeakKeyDictionary[Any, list[tuple[Callable, Callable]]] = weakref.WeakKeyDictionary()


def wrap_module_call(jitted: Any, wrap: Callable[[Callable], Callable]) -> Callable:
    """Make the ThunderModule ``jitted`` call ``wrap(call)`` in its ``forward``, ``call`` being the function it calls
    now, kept here (:func:`unwrap_module_call` puts it back). Thunder's ``transform_module`` hands a transform the
    ThunderModule to change; the compiled function itself is not changed."""
    call = jitted._forward_fn
    wrapper = wrap(call)
    _WRAPPED.setdefault(jitted, []).append((wrapper, call))
    jitted._forward_fn = wrapper
    return wrapper


def unwrap_module_call(jitted: Any) -> bool:
    """Undo the last :func:`wrap_module_call` of ``jitted``: it calls the function it called before. False where its
    call is not the last wrapper made so (nothing wrapped, or replaced since by someone else)."""
    stack = _WRAPPED.get(jitted)
    if not stack or stack[-1][0] is not jitted._forward_fn:
        return False
    jitted._forward_fn = stack.pop()[1]
    return True
