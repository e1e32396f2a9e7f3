"""Which Thunder fusion executor runs where: the executors to hand ``thunder.jit`` on a device, and why
nvFuser is missing when it is."""

from __future__ import annotations

from typing import Any

from . import _thunder as th

NVFUSER_INSTALL = "pip install 'thunder-fusion-guard[nvfuser]' installs a torch and nvFuser built for each other"


def nvfuser_problem() -> str | None:
    """Why nvFuser cannot be used here (no CUDA device, not installed, fails to load, too old); None if it can."""
    return th.nvfuser_problem()


def fusion_executors(device: Any = None) -> list[Any]:
    """The executors to pass as ``thunder.jit(..., executors=...)`` (or ``thunderfx``) so that Thunder fuses on
    ``device``: Thunder's defaults (nvFuser first) on CUDA with nvFuser, else Thunder's torch.compile executor.

    Thunder's defaults contain no fusion executor on CPU: without this, Thunder makes no fusion region there
    and the guard has nothing to decide. ``device`` is 'cpu', 'cuda', a ``torch.device`` or None (CUDA when
    a device is visible).
    """
    import torch

    kind = torch.device(device).type if device is not None else ("cuda" if torch.cuda.is_available() else "cpu")
    if kind == "cuda" and nvfuser_problem() is None:
        return th.default_executors()
    return [th.torch_compile_executor()]


# Fusion executors that take general programs; Thunder's others fuse one pattern (torchcompile_cat: cat,
# torchcompile_xentropy: cross-entropy) and are among its CPU defaults.
GENERAL_FUSERS = ("nvfuser", "torchcompile")


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
