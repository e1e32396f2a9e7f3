"""Executors and environment: which executors exist, which fusion executor runs where, why nvFuser is
missing when it is, and the software versions."""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from typing import Any

import thunder
import torch
from thunder.extend import FusionExecutor, OperatorExecutor, get_all_executors

from ..wording import error_line

__all__ = [
    "ALTERNATIVE_FUSERS",
    "GENERAL_FUSERS",
    "NARROW_FUSERS",
    "NVFUSER_INSTALL",
    "NVFUSER_REQUIREMENTS",
    "FusionExecutor",
    "default_executors",
    "executor_names",
    "fusion_executor_names",
    "fusion_executors",
    "guard_executor",
    "no_region_hint",
    "nvfuser_problem",
    "software_versions",
    "torch_compile_executor",
    "torch_executor",
]

# pyproject.toml's `nvfuser` extra (tests/test_executors.py compares): nvFuser's own package from PyPI and the torch it
# is built for. This package is installed from its source checkout, not PyPI, so the advice names these directly.
NVFUSER_REQUIREMENTS = ("torch>=2.10,<2.11", "nvfuser-cu128-torch210==0.2.36.dev20260301")
NVFUSER_INSTALL = (
    f"pip install {' '.join(repr(r) for r in NVFUSER_REQUIREMENTS)} installs a torch and nvFuser built for each other "
    "(from PyPI; in this project's source checkout, pip install '.[nvfuser]' does the same)"
)


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


def torch_executor() -> Any:
    """Thunder's torch executor: what a rejected region's ops run on."""
    from thunder.executors.torchex import ex

    return ex


def executor_names(executors: Iterable[Any]) -> list[tuple[str, bool]]:
    """(name, is a fusion executor) of each of ``executors``."""
    return [(getattr(ex, "name", str(ex)), isinstance(ex, FusionExecutor)) for ex in executors]


def nvfuser_problem() -> str | None:
    """Why Thunder has no nvFuser executor here (no CUDA, not installed, fails to load, too old); None if it has."""
    if any(ex.name == "nvfuser" for ex in get_all_executors()):
        return None
    if torch.version.cuda is None:
        return f"torch {torch.__version__} is built without CUDA"
    if not torch.cuda.is_available():
        return "no CUDA device is visible to torch"
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
            errors.append(f"{module} fails to load: {error_line(e).split(': ', 1)[-1]}")
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


def software_versions() -> dict[str, str | None]:
    """torch, thunder and nvFuser versions, for cache keys and result tables."""
    try:
        import nvfuser_direct

        nvf = str(nvfuser_direct.version())
    except ImportError:
        nvf = None
    return {"torch": torch.__version__, "thunder": getattr(thunder, "__version__", "?"), "nvfuser": nvf}


_GUARD_EXECUTOR = None


def guard_executor() -> Any:
    """The operator executor that runs this package's own operators (not registered with Thunder)."""
    global _GUARD_EXECUTOR
    if _GUARD_EXECUTOR is None:
        _GUARD_EXECUTOR = OperatorExecutor("fusion_guard", version="0.1")
    return _GUARD_EXECUTOR


def fusion_executors(device: Any = None) -> list[Any]:
    """The executors to pass as ``thunder.jit(..., executors=...)`` (or ``thunderfx``) so that Thunder fuses on
    ``device``: Thunder's defaults (nvFuser first) on CUDA with nvFuser, else Thunder's torch.compile executor.

    Thunder's defaults contain no fusion executor on CPU: without this, Thunder makes no fusion region there
    and the guard has nothing to decide. ``device`` is 'cpu', 'cuda', a ``torch.device`` or None (CUDA when
    a device is visible).
    """
    kind = torch.device(device).type if device is not None else ("cuda" if torch.cuda.is_available() else "cpu")
    if kind == "cuda" and nvfuser_problem() is None:
        return default_executors()
    return [torch_compile_executor()]


# Fusion executors that take general programs; Thunder's others fuse one pattern (torchcompile_cat: cat,
# torchcompile_xentropy: cross-entropy) and are among its CPU defaults.
GENERAL_FUSERS = ("nvfuser", "torchcompile")
# Thunder's fusion executors that fuse only around a few ops (torch.cat, cross entropy): with no other, nothing else
# is fused.
NARROW_FUSERS = ("torchcompile_cat", "torchcompile_xentropy")


def no_region_hint(executors: list[tuple[str, bool]]) -> str:
    """Why Thunder made no fusion region and what to do, given the (name, is fusion) executors it compiled with."""
    names = ", ".join(name for name, _ in executors if not name.startswith("__")) or "unknown"
    general = [name for name, fusion in executors if fusion and name in GENERAL_FUSERS]
    if general == ["nvfuser"]:
        return (
            f"executors in use: {names}; nvfuser found nothing to fuse here, so nothing to decide (nvFuser fuses "
            "CUDA tensors only: for CPU tensors pass executors=fusion_executors('cpu'))"
        )
    if general:
        return f"executors in use: {names}; {', '.join(general)} found nothing to fuse here, so nothing to decide"
    return (
        f"executors in use: {names}, none of which fuses general programs (Thunder's defaults have none on CPU, "
        "nor on CUDA without nvFuser): pass executors=fusion_executors(device) (from thunder_fusion_guard) to "
        f"thunder.jit or thunderfx; for nvFuser on CUDA, {NVFUSER_INSTALL}"
    )


# The fusion executor a region of another is timed against, and handed to when it is faster: Thunder's
# torch.compile executor for nvFuser's regions (on CPU, torch.compile is the only general fuser: no choice).
ALTERNATIVE_FUSERS: dict[str, str] = {"nvfuser": "torchcompile"}
