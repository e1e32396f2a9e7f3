"""Compatibility fixes for the Thunder / nvFuser combinations supported, applied only where needed (each a shim of
:mod:`..shims`: named, version-checked, undoable, and off with ``TFG_SHIMS_OFF``)."""

from __future__ import annotations

import functools
import importlib.util
import logging
import sys
from types import ModuleType

from .. import shims

logger = logging.getLogger("thunder_fusion_guard")
SHIM = "nvfuser-direct-contiguity"  # its name in the registry of shims

_applied: list[str] = []


def applied_fixes() -> list[str]:
    """Descriptions of the compatibility fixes applied in this process."""
    return list(_applied)


def _references_legacy_nvfuser(fn: object) -> bool:
    code = getattr(getattr(fn, "__wrapped__", fn), "__code__", None)
    return code is not None and "nvfuser" in code.co_names and "compute_tensor_descriptor" in code.co_names


def ensure_nvfuser_compat(
    impl: ModuleType | None = None, direct: ModuleType | None = None, legacy_present: bool | None = None
) -> bool:
    """Let thunder 0.2.6 run on nvFuser builds that ship only ``nvfuser_direct`` (0.2.36 for torch 2.10).

    Thunder's ``compute_contiguity`` imports ``compute_tensor_descriptor`` from the legacy ``nvfuser``
    module, which those builds lack, so the first nvFusion call fails. ``nvfuser_direct`` has the same
    function; this points Thunder at it. Applied only when Thunder's nvFuser executor is loaded, the
    legacy module is absent, Thunder's function still imports from it and ``nvfuser_direct`` has the
    replacement, on the Thunder version the shim ``nvfuser-direct-contiguity`` (:mod:`..shims`) was written for and
    unless turned off. Returns whether the fix was applied now.
    """
    impl = impl if impl is not None else sys.modules.get("thunder.executors.nvfuserex_impl")
    if impl is None or getattr(impl, "_fusion_guard_compat", False) or not shims.applies(SHIM):
        return False
    if legacy_present is None:
        legacy_present = importlib.util.find_spec("nvfuser") is not None
    original = getattr(impl, "compute_contiguity", None)
    if legacy_present or not _references_legacy_nvfuser(original):
        return False
    if direct is None:
        try:
            import nvfuser_direct as direct
        except ImportError:
            return False
    descriptor = getattr(direct, "compute_tensor_descriptor", None)
    if descriptor is None:
        return False

    @functools.lru_cache(maxsize=2048)
    def compute_contiguity(shape, stride) -> tuple[tuple[bool, ...], tuple[int, ...]]:
        return tuple(tuple(x) for x in descriptor(shape, stride))

    compute_contiguity.__doc__ = original.__doc__
    impl.compute_contiguity = compute_contiguity
    impl._fusion_guard_compat = True
    message = (
        "thunder-fusion-guard: thunder's nvFuser executor imports compute_tensor_descriptor from the legacy "
        "'nvfuser' module, which this nvFuser build lacks; using nvfuser_direct.compute_tensor_descriptor instead"
    )
    _applied.append(message)

    def undo() -> None:
        impl.compute_contiguity = original
        del impl._fusion_guard_compat
        _applied.remove(message)

    shims.record(SHIM, undo)
    logger.info(message)
    return True
