"""The compilation Thunder runs right now: its options, executors, function and ThunderFX subgraph."""

from __future__ import annotations

from typing import Any

import torch
from thunder.core.compile_data import _compile_data, get_compile_data

from .executors import executor_names

__all__ = [
    "compile_function_name",
    "compiling_executors",
    "compiling_fx_subgraph",
    "compiling_traces",
    "compiling_transforms",
    "explicit_compile_options",
    "function_name",
    "fx_graph_ops",
]


def explicit_compile_options() -> dict[str, Any]:
    """The options the program being compiled passed to ``thunder.jit`` by name (empty outside a compilation)."""
    try:
        cd = get_compile_data()
    except LookupError:
        return {}
    return dict(getattr(cd, "compile_options", None) or {})


def compiling_executors() -> list[tuple[str, bool]]:
    """(name, is a fusion executor) of each executor of the compilation Thunder runs right now."""
    try:
        executors = getattr(get_compile_data(), "executors_list", None) or ()
    except LookupError:
        return []
    return executor_names(executors)


def compiling_transforms() -> list[Any]:
    """The transforms (``thunder.jit(..., transforms=...)``) of the compilation Thunder runs right now."""
    try:
        return list(getattr(get_compile_data(), "transforms", None) or ())
    except LookupError:
        return []


def compiling_traces() -> list[Any]:
    """The computation traces the compilation Thunder runs right now has made so far, oldest first (its
    ``CompileStats.last_traces``, filled while it compiles): the joint forward and backward trace among them. Empty
    outside a compilation."""
    _, stats = _compile_data.get()
    return list(getattr(stats, "last_traces", None) or ())


def compile_function_name() -> str | None:
    """Name of the function or module Thunder is compiling right now, if known."""
    try:
        fn = getattr(get_compile_data(), "fn", None)
    except LookupError:
        return None
    return function_name(fn)


def function_name(fn: Any) -> str | None:
    """The name the guard gives a compiled function or module (a module: its class name)."""
    if fn is None:
        return None
    fn = getattr(fn, "_model", fn)
    if isinstance(fn, torch.nn.Module):
        return type(fn).__name__
    return getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or type(fn).__name__


# ThunderCompiler always sets this option on the thunder.jit calls of the subgraphs it splits off.
_THUNDERFX_OPTION = "thunderfx_disable_split_autograd"


def compiling_fx_subgraph() -> torch.fx.GraphModule | None:
    """The ThunderFX split subgraph (an fx GraphModule) Thunder is compiling right now; None outside ThunderFX."""
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
