"""Where a benchmark ran: the machine, its device and software versions, and the checked-out commit."""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path
from typing import Any


def machine_info(device: str) -> dict[str, Any]:
    """The machine, Python, device and software versions, as pytest-benchmark records its ``machine_info``."""
    import torch

    from .._thunder import software_versions

    info: dict[str, Any] = {
        "node": platform.node(),
        "processor": platform.processor(),
        "machine": platform.machine(),
        "python_compiler": platform.python_compiler(),
        "python_implementation": platform.python_implementation(),
        "python_implementation_version": platform.python_version(),
        "python_version": platform.python_version(),
        "python_build": list(platform.python_build()),
        "release": platform.release(),
        "system": platform.system(),
        "cpu": {"count": os.cpu_count(), "brand_raw": cpu_brand()},
        "device": device,
        "device_name": torch.cuda.get_device_name() if device == "cuda" else cpu_brand(),
        "torch_threads": torch.get_num_threads(),
    }
    info.update(software_versions())
    return info


def cpu_brand() -> str:
    """The CPU's model name, as the guard's calibration cache names it."""
    from ..measure.cache import cpu_model

    return cpu_model()


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], capture_output=True, text=True, check=True, timeout=10).stdout.strip()


def commit_info() -> dict[str, Any]:
    """The checked-out commit, as pytest-benchmark records it (read-only git calls); ``TFG_COMMIT`` names it
    instead where set (a copy of the tree on another machine may carry no, or an old, ``.git``)."""
    project = Path.cwd().name
    if os.environ.get("TFG_COMMIT"):
        return {"id": os.environ["TFG_COMMIT"], "source": "TFG_COMMIT", "project": project}
    try:
        return {
            "id": _git("rev-parse", "HEAD"),
            "time": _git("show", "-s", "--format=%cI", "HEAD"),
            "author_time": _git("show", "-s", "--format=%aI", "HEAD"),
            "dirty": bool(_git("status", "--porcelain", "--untracked-files=no")),
            "project": project,
            "branch": _git("rev-parse", "--abbrev-ref", "HEAD"),
        }
    except (OSError, subprocess.SubprocessError) as e:
        return {
            "id": "unknown",
            "time": None,
            "author_time": None,
            "dirty": False,
            "project": project,
            "error": repr(e),
        }
