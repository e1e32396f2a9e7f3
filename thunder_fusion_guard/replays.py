"""Whether the program being compiled now will replay in one CUDA graph: a step compiled during
:func:`~.step_graph.capture_step`'s warm-up is captured whole right after it, so the guard decides its regions on
device time, as it does for a program compiled with a ``CUDAGraphTransform``.

No torch or Thunder import, so that the lowest layers may ask.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar

__all__ = ["warming_up_for_capture", "will_be_captured"]

_WARMING_UP: ContextVar[bool] = ContextVar("thunder_fusion_guard_warming_up_for_capture", default=False)


@contextlib.contextmanager
def warming_up_for_capture() -> Iterator[None]:
    """While open, what compiles is a step about to be captured whole in a CUDA graph."""
    token = _WARMING_UP.set(True)
    try:
        yield
    finally:
        _WARMING_UP.reset(token)


def will_be_captured() -> bool:
    """Whether a :func:`warming_up_for_capture` window is open in this context."""
    return _WARMING_UP.get()
