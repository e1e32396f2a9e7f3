"""Compatibility fixes for the Thunder / nvFuser combinations supported, applied only where needed (each a shim of
:mod:`..shims`: named, version-checked, undoable, and off with ``TFG_SHIMS_OFF``).

On nvFuser builds that ship only ``nvfuser_direct`` (0.2.36 for torch 2.10), Thunder 0.2.6's nvFuser regions fail at
their first call: Thunder's ``compute_contiguity`` imports ``compute_tensor_descriptor`` from the legacy ``nvfuser``
module. Each region Thunder makes while a guarded compilation (or one of the package's own, :func:`package_compiling`)
runs carries descriptors computed by ``nvfuser_direct`` instead (:func:`direct_descriptors_patch`, held with the
user's lines), so it runs with nothing of Thunder's changed; :func:`ensure_nvfuser_compat` (public as
``enable_nvfuser_direct``) changes Thunder's function for the whole process, unguarded Thunder included, for those who
ask for it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib.util
import logging
import os
import sys
import threading
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

from .. import shims

logger = logging.getLogger("thunder_fusion_guard")
SHIM = "nvfuser-direct-contiguity"  # its name in the registry of shims
ENV_DIRECT = "TFG_NVFUSER_DIRECT"  # 1: enable_nvfuser_direct() at the package's import, for every process it reaches
IMPL = "thunder.executors.nvfuserex_impl"

_applied: list[str] = []
_found: tuple[ModuleType, Callable | None] | None = None  # Thunder's executor module, and what it needs (once)
_package = threading.local()  # .depth: how many package_compiling() blocks this thread is in


def applied_fixes() -> list[str]:
    """Descriptions of the compatibility fixes applied for the whole process (:func:`ensure_nvfuser_compat`)."""
    return list(_applied)


def _references_legacy_nvfuser(fn: object) -> bool:
    code = getattr(getattr(fn, "__wrapped__", fn), "__code__", None)
    return code is not None and "nvfuser" in code.co_names and "compute_tensor_descriptor" in code.co_names


def direct_descriptor(
    impl: ModuleType | None = None, direct: ModuleType | None = None, legacy_present: bool | None = None
) -> Callable | None:
    """``nvfuser_direct.compute_tensor_descriptor`` where Thunder's nvFuser executor (``impl``: loaded) needs it: the
    legacy ``nvfuser`` module is absent, Thunder's ``compute_contiguity`` imports from it (or was replaced by
    :func:`ensure_nvfuser_compat`) and ``nvfuser_direct`` has the function; else None. Found once a process for
    Thunder's own module (none of the arguments given); ``shims.applies`` is the caller's to ask."""
    global _found
    if impl is None and direct is None and legacy_present is None:
        impl = sys.modules.get(IMPL)
        if impl is None:
            return None
        if _found is None or _found[0] is not impl:
            _found = (impl, _find_descriptor(impl, None, None))
        return _found[1]
    impl = impl if impl is not None else sys.modules.get(IMPL)
    return None if impl is None else _find_descriptor(impl, direct, legacy_present)


def _find_descriptor(impl: ModuleType, direct: ModuleType | None, legacy_present: bool | None) -> Callable | None:
    if legacy_present is None:
        legacy_present = importlib.util.find_spec("nvfuser") is not None
    replaced = getattr(impl, "_fusion_guard_compat", False)
    if legacy_present or not (replaced or _references_legacy_nvfuser(getattr(impl, "compute_contiguity", None))):
        return None
    if direct is None:
        try:
            import nvfuser_direct as direct
        except ImportError:
            return None
    return getattr(direct, "compute_tensor_descriptor", None)


def fix_needed() -> bool:
    """Whether the regions of guarded compilations need ``nvfuser_direct``'s descriptors here (a few hundred ns)."""
    return direct_descriptor() is not None and shims.applies(SHIM)


@contextlib.contextmanager
def package_compiling() -> Iterator[None]:
    """Within, in this thread: nvFuser regions Thunder makes (in the package's own compilations, which are not
    guarded) carry ``nvfuser_direct``'s descriptors where they need them, as a guarded compilation's do; where the
    patch making them is held (:func:`.sources.package_compilations` holds it)."""
    _package.depth = getattr(_package, "depth", 0) + 1
    try:
        yield
    finally:
        _package.depth -= 1


def _compiling_for_package() -> bool:
    return getattr(_package, "depth", 0) > 0


def direct_runtime_descriptors(impl: ModuleType, descriptor: Callable) -> Callable[[Any], tuple]:
    """Thunder's ``to_runtime_descriptors`` (of ``impl``) with ``descriptor`` (``nvfuser_direct``'s
    ``compute_tensor_descriptor``) for each tensor's contiguity and stride order, cached per (shape, stride) as
    Thunder's is; a DTensor's key is Thunder's."""
    import torch

    make_key = impl.make_key_from_dtensor

    @functools.lru_cache(maxsize=2048)
    def contiguity(shape: Any, stride: Any) -> tuple[tuple[bool, ...], tuple[int, ...]]:
        return tuple(tuple(x) for x in descriptor(shape, stride))

    def to_descriptors(args: Any) -> tuple:
        return tuple(
            (*contiguity(arg.shape, arg.stride()), make_key(arg)) if isinstance(arg, torch.Tensor) else None
            for arg in args
        )

    to_descriptors.cache_info = contiguity.cache_info  # type: ignore[attr-defined]
    return to_descriptors


def direct_descriptors_patch(
    impl: ModuleType | None = None, direct: ModuleType | None = None, legacy_present: bool | None = None
) -> Any:
    """The wrapper of ``nvfuserex_impl.create_fusion_definition_wrapper`` as a ``_Patch``, not installed: a region
    made in a guarded compilation (or within :func:`package_compiling`) gets ``nvfuser_direct``'s descriptors, one
    made in any other Thunder's own wrapper unchanged. None where the fix is not needed (:func:`direct_descriptor`)
    or the shim does not apply (turned off, or another Thunder)."""
    from .scoped import _compiling_guarded, _Patch

    impl = impl if impl is not None else sys.modules.get(IMPL)
    descriptor = direct_descriptor(impl, direct, legacy_present) if impl is not None else None
    if descriptor is None or not shims.applies(SHIM):
        return None
    original = impl.create_fusion_definition_wrapper
    if getattr(original, "_fusion_guard", False):
        return None
    to_descriptors = direct_runtime_descriptors(impl, descriptor)

    def create_fusion_definition_wrapper(*args: Any, **kwargs: Any) -> Any:
        fdw = original(*args, **kwargs)
        if (_compiling_for_package() or _compiling_guarded()) and fdw.to_descriptors is impl.to_runtime_descriptors:
            return dataclasses.replace(fdw, to_descriptors=to_descriptors)
        return fdw

    create_fusion_definition_wrapper._fusion_guard = True  # type: ignore[attr-defined]
    create_fusion_definition_wrapper.__wrapped__ = original  # type: ignore[attr-defined]
    return _Patch(SHIM, [(impl, "create_fusion_definition_wrapper", original, create_fusion_definition_wrapper)])


def ensure_nvfuser_compat(
    impl: ModuleType | None = None, direct: ModuleType | None = None, legacy_present: bool | None = None
) -> bool:
    """Let thunder 0.2.6 run on nvFuser builds that ship only ``nvfuser_direct`` (0.2.36 for torch 2.10), unguarded
    Thunder included: changes Thunder's ``nvfuserex_impl.compute_contiguity`` for the whole process.

    Thunder's ``compute_contiguity`` imports ``compute_tensor_descriptor`` from the legacy ``nvfuser``
    module, which those builds lack, so the first nvFusion call fails. ``nvfuser_direct`` has the same
    function; this points Thunder at it. Applied only when Thunder's nvFuser executor is loaded, the
    legacy module is absent, Thunder's function still imports from it and ``nvfuser_direct`` has the
    replacement (:func:`direct_descriptor`), on the Thunder version the shim ``nvfuser-direct-contiguity``
    (:mod:`..shims`) was written for and unless turned off. Returns whether the fix was applied now;
    ``shims.undo("nvfuser-direct-contiguity")`` puts Thunder's function back.
    """
    impl = impl if impl is not None else sys.modules.get(IMPL)
    if impl is None or getattr(impl, "_fusion_guard_compat", False) or not shims.applies(SHIM):
        return False
    descriptor = _find_descriptor(impl, direct, legacy_present)
    if descriptor is None:
        return False
    original = impl.compute_contiguity

    @functools.lru_cache(maxsize=2048)
    def compute_contiguity(shape, stride) -> tuple[tuple[bool, ...], tuple[int, ...]]:
        return tuple(tuple(x) for x in descriptor(shape, stride))

    compute_contiguity.__doc__ = original.__doc__
    impl.compute_contiguity = compute_contiguity
    impl._fusion_guard_compat = True
    message = (
        "thunder-fusion-guard: thunder's nvFuser executor imports compute_tensor_descriptor from the legacy "
        "'nvfuser' module, which this nvFuser build lacks; using nvfuser_direct.compute_tensor_descriptor instead "
        "(for the whole process)"
    )
    _applied.append(message)

    def undo() -> None:
        impl.compute_contiguity = original
        del impl._fusion_guard_compat
        _applied.remove(message)

    shims.record(SHIM, undo)
    logger.info(message)
    return True


def enable_nvfuser_direct() -> bool:
    """Let unguarded Thunder 0.2.6 run nvFuser regions on nvFuser builds that ship only ``nvfuser_direct``: replaces
    Thunder's ``nvfuserex_impl.compute_contiguity`` for the whole process (guarded compilations need none of it).
    Returns whether it applied now (not where it is not needed, was applied before, or is turned off);
    ``shims.undo("nvfuser-direct-contiguity")`` puts Thunder's function back."""
    return ensure_nvfuser_compat()


def nvfuser_direct_requested(environ: dict[str, str] | None = None) -> bool:
    """Whether ``TFG_NVFUSER_DIRECT`` asks for :func:`enable_nvfuser_direct` at the package's import (``1``; ``0`` or
    unset: not); any other value is a ValueError naming the variable and the values allowed."""
    text = (os.environ if environ is None else environ).get(ENV_DIRECT, "0").strip()
    if text not in ("0", "1", ""):
        raise ValueError(f"{ENV_DIRECT}: {text!r} is not allowed; allowed: 0, 1")
    return text == "1"


def enable_if_requested(environ: dict[str, str] | None = None) -> bool:
    """:func:`enable_nvfuser_direct` where ``TFG_NVFUSER_DIRECT=1`` (run at the import of the package's Thunder
    layer, after Thunder's executors loaded): the user's own process-wide opt-in, for scripts and their children."""
    return nvfuser_direct_requested(environ) and enable_nvfuser_direct()
