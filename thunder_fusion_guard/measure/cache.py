"""The on-disk cache of calibrations and region measurements: where it lives, how entries are keyed, and
reading and updating its JSON files safely from several processes."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

import torch

from .. import _thunder as th


def cache_dir() -> Path:
    """Where calibrations and region measurements are cached (``TFG_CACHE_DIR`` overrides)."""
    root = os.environ.get("TFG_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "thunder-fusion-guard")
    return Path(root)


def cache_path() -> Path:
    return cache_dir() / "calibration.json"


def device_name(device: str) -> str:
    return torch.cuda.get_device_name() if device == "cuda" else "cpu"


def cache_key(device: str, executor: str) -> str:
    v = th.software_versions()
    return f"{device_name(device)}|{executor}|torch {v['torch']}|thunder {v['thunder']}|nvfuser {v['nvfuser']}"


def read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def update_json(path: Path, entries: dict[str, Any]) -> None:
    """Add ``entries`` to the JSON object in ``path``, re-read just before writing, replaced atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {**read_json(path), **entries}
    tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
    os.replace(tmp, path)
