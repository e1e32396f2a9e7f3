"""A shim's patch that is in place only while a guarded compilation (or a call of a guarded program) holds it:
built once, installed and removed by setting attributes or dict entries (a few µs a call), and its wrappers pass
straight through to Thunder's own in any compilation that is not guarded (:func:`_compiling_guarded`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .. import shims
from .compiling import compiling_transforms

_MISSING = object()  # a _Patch's original where the key it sets was not in its dict


def _get(owner: Any, name: Any) -> Any:
    return owner.get(name, _MISSING) if isinstance(owner, dict) else getattr(owner, name)


def _set(owner: Any, name: Any, value: Any) -> None:
    if not isinstance(owner, dict):
        setattr(owner, name, value)
    elif value is _MISSING:
        owner.pop(name, None)
    else:
        owner[name] = value


@dataclass
class _Patch:
    """One shim's wrappers: ``shim`` (its name in :mod:`..shims`) and each ``(owner, attribute, original,
    wrapper)`` it sets (an owner may be a dict, the attribute its key); built once, installed and removed by setting
    them (a few µs a call)."""

    shim: str
    sets: list[tuple[Any, Any, Any, Any]]

    def current(self) -> bool:
        """Whether each attribute is still the original it was built over (or this patch's own wrapper)."""
        return all(_get(o, n) in (orig, w) for o, n, orig, w in self.sets)

    def install(self) -> Callable[[], None]:
        for owner, name, _, wrapper in self.sets:
            _set(owner, name, wrapper)
        shims.record(self.shim, self.remove)
        return self.remove

    def remove(self) -> None:
        for owner, name, original, wrapper in self.sets:
            if _get(owner, name) is wrapper:
                _set(owner, name, original)
        shims.forget(self.shim, self.remove)


def compiling_transform(flag: str) -> Any:
    """The transform of the compilation Thunder runs now in this thread whose attribute ``flag`` is true; None
    where there is none, or no compilation."""
    return next((t for t in compiling_transforms() if getattr(t, flag, False)), None)


def _compiling_guarded() -> bool:
    """Whether the compilation Thunder runs now in this thread is one of a transform that reads the user's lines
    (``reads_user_lines``: FusionGuard); the wrappers pass straight through to Thunder's own for any other."""
    return compiling_transform("reads_user_lines") is not None
