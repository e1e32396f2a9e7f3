"""The on-disk cache of calibrations and region measurements: where it lives, how entries are keyed, and
reading and updating its JSON files safely from several processes."""

from __future__ import annotations

import contextlib
import json
import os
import platform
import threading
from collections.abc import Iterator
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


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``'s, else the platform's): part of what decides its costs."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_cores() -> int:
    """The CPUs this machine has (``os.cpu_count()``): part of what decides its costs."""
    return os.cpu_count() or 1


def cpu_threads() -> int:
    """The intra-op threads torch uses now: a calibration made with other threads costs other µs."""
    return torch.get_num_threads()


def cpu_identity() -> str:
    """This CPU as what decides its costs: model, cores and torch's threads now, e.g.
    ``cpu: AMD EPYC, 2 cores, 1 threads``; cached calibrations and timings are keyed by it."""
    return f"cpu: {cpu_model()}, {cpu_cores()} cores, {cpu_threads()} threads"


def device_name(device: str) -> str:
    """The device as its costs tell it apart: the GPU's name, or :func:`cpu_identity`."""
    return torch.cuda.get_device_name() if device == "cuda" else cpu_identity()


def cache_key(device: str, executor: str) -> str:
    """A calibration's key: the device as :func:`device_name` names it, the executor and the software versions."""
    v = th.software_versions()
    return f"{device_name(device)}|{executor}|torch {v['torch']}|thunder {v['thunder']}|nvfuser {v['nvfuser']}"


def read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def update_json(path: Path, entries: dict[str, Any]) -> None:
    """Add ``entries`` to the JSON object in ``path``: re-read and written under a lock (other processes updating
    it wait, so none of their entries is lost), through a file of its own replaced atomically (a reader never
    sees half a file, an interrupted write leaves the old one). An unreadable or corrupt file is started anew."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with _locked(path):
        data = {**read_json(path), **entries}
        tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        try:
            tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
            os.replace(tmp, path)
        finally:
            with contextlib.suppress(OSError):
                tmp.unlink()


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive lock on ``path`` (its file ``PATH.lock``) while it is held; without ``fcntl`` (not POSIX),
    none: updates are still atomic, and two at once may lose one's entries."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    with open(path.with_name(f"{path.name}.lock"), "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
