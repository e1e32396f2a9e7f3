"""TorchScript functions a module's forward calls: Thunder 0.2.6's interpreter aborts the whole process on one
(``std::runtime_error``, ``UNEXPECTED CALL OF function_record_PyTypeObject_methods::tp_new_impl``: no Python
exception, nothing to catch), as on e3nn 0.4.4's spherical harmonics in MACE. Found before Thunder interprets."""

from __future__ import annotations

import types
from typing import Any

import torch

__all__ = ["scripted_calls"]

# How deep into the plain functions a forward calls the search goes.
_DEPTH = 3


def scripted_calls(model: torch.nn.Module) -> list[str]:
    """Each TorchScript function or module ``model``'s forwards reach (a global their code names, through the plain
    functions of the same libraries they call, a few calls deep), as ``qualified name (called from where)``."""
    found: dict[str, str] = {}
    seen: set[int] = set()
    for path, module in model.named_modules():
        if isinstance(module, torch.jit.ScriptModule):
            found.setdefault(
                f"{path} ({getattr(module, 'original_name', type(module).__name__)})", "a scripted submodule"
            )
            continue
        forward = getattr(type(module), "forward", None)
        if isinstance(forward, types.FunctionType):
            _search(forward, f"{type(module).__name__}.forward", found, seen, _DEPTH)
    return [f"{name} (called from {where})" for name, where in found.items()]


def _search(fn: types.FunctionType, where: str, found: dict[str, str], seen: set[int], depth: int) -> None:
    if id(fn) in seen or depth == 0:
        return
    seen.add(id(fn))
    names = _names(fn.__code__)
    for name in names:
        value = fn.__globals__.get(name)
        if isinstance(value, (torch.jit.ScriptFunction, torch.jit.ScriptModule)):
            found.setdefault(f"{fn.__module__}.{name}", where)
        elif isinstance(value, types.FunctionType) and _same_library(value, fn):
            _search(value, where, found, seen, depth - 1)


def _names(code: types.CodeType) -> set[str]:
    """The global names ``code`` and the functions nested in it read."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _names(const)
    return names


def _same_library(a: Any, b: Any) -> bool:
    """Whether two functions come from the same top-level package (torch's own are never searched)."""
    top = (getattr(a, "__module__", "") or "").split(".")[0]
    return top not in ("", "torch", "thunder") and top == (getattr(b, "__module__", "") or "").split(".")[0]
