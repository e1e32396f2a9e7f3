"""Identical fusions compiled once: nvFuser regions whose definitions nvFuser itself calls the same run one
compiled definition.

``nvfuser_direct`` has no fusion cache: each region of a trace gets a ``FusionExecutorCache`` of its own, which
segments the fusion and compiles its kernels at the region's first call, even where an earlier region (the same
layer, one layer up) has the same definition. A definition made for a new input layout is looked up among those
this process made before by its printed form, and taken only where nvFuser's own ``Fusion`` equality
(``sameDefinition``: every op and attribute, constant, dtype, contiguity, stride order and output alias) holds and
the enable and disable options and the device are the same. The region then runs that definition: the same
``FusionExecutorCache``, the same kernels, the same bits. Entries are held weakly: a definition lives as long as
a compiled program that runs it, and printed forms whose definitions are all gone are swept out as new ones come.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from typing import Any

__all__ = ["SHARED_FUSIONS", "SharedFusions"]


class SharedFusions:
    """The fusion definitions made so far in this process, each with the label of the region it was made for."""

    def __init__(self) -> None:
        self._by_text: dict[tuple, list[tuple[weakref.ref, str]]] = {}
        self._lock = threading.Lock()
        self._sweep_above = _SWEEP_FROM  # printed forms held before the next sweep

    def share(self, fd: Any, label: str, options: tuple) -> tuple[Any, str | None]:
        """The definition to run in place of ``fd`` (just made for region ``label``, not yet run, with enable and
        disable ``options``): an equal one made before, with the label of its region, or ``fd`` itself and None
        (it is then kept for the regions after it). A definition that cannot be printed or compared is not
        shared."""
        try:
            key = (repr(fd), options, getattr(fd, "_selected_device", None))
        except Exception:  # printing is nvFuser's C++, which may raise any type: such a definition is just not shared
            return fd, None
        with self._lock:
            entries = self._by_text.setdefault(key, [])
            entries[:] = [(ref, first) for ref, first in entries if ref() is not None]
            for ref, first in entries:
                other = ref()
                if other is fd:  # made for this region before: its own
                    return fd, None
                if other is not None and _same_definition(fd, other):
                    return other, first
            with contextlib.suppress(TypeError):  # not weakly referable: not kept
                entries.append((weakref.ref(fd), label))
            if len(self._by_text) > self._sweep_above:
                self._sweep()
        return fd, None

    def _sweep(self) -> None:
        """Drop every printed form whose definitions are all gone; the next sweep comes once the forms held
        double (so a process that keeps making new programs holds its live forms and at most as many dead ones)."""
        for key in list(self._by_text):
            live = [(ref, first) for ref, first in self._by_text[key] if ref() is not None]
            if live:
                self._by_text[key] = live
            else:
                del self._by_text[key]
        self._sweep_above = max(_SWEEP_FROM, 2 * len(self._by_text))

    def forms(self) -> int:
        """How many printed forms the table holds (live definitions' and, until the next sweep, dead ones')."""
        with self._lock:
            return len(self._by_text)

    def __len__(self) -> int:
        with self._lock:
            return sum(1 for entries in self._by_text.values() for ref, _ in entries if ref() is not None)

    def clear(self) -> None:
        with self._lock:
            self._by_text.clear()


_SWEEP_FROM = 64


def _same_definition(fd: Any, other: Any) -> bool:
    """nvFuser's ``Fusion`` equality of the two definitions; False where either cannot say."""
    try:
        return bool(fd.fusion == other.fusion)
    except Exception:  # nvFuser's equality may raise any type: not known to be equal means not shared
        return False


# One table per process: regions of every program the guard compiles share their compiled definitions.
SHARED_FUSIONS = SharedFusions()
