"""Thunder (and the torch module that looks for CUDA_HOME) imported with their optional-dependency notices sent to
the ``thunder_fusion_guard`` logger at DEBUG instead of the user's console.

Thunder 0.2.6 warns ``transformer_engine module not found!`` on import, and torch logs ``No CUDA runtime is
found, using CUDA_HOME=...`` when ``torch.utils.cpp_extension`` first loads (on CPU at the first torch.compile).
Neither is about the user's program. When this package's own modules first import Thunder, both go to the
logger at DEBUG; any other warning is re-emitted as it was, and nothing stays changed after: the user's own
``import thunder`` (before or after ``import thunder_fusion_guard``, which imports neither torch nor Thunder) is
Thunder's as without this package. No torch or Thunder import here.
"""

from __future__ import annotations

import logging
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

from . import shims

logger = logging.getLogger("thunder_fusion_guard")

NOTICES = ("transformer_engine module not found", "CUDA_HOME")


def _is_notice(text: str) -> bool:
    """Whether ``text`` is one of the optional-dependency notices this module quiets."""
    return any(n in text for n in NOTICES)


class _ToDebug(logging.Filter):
    """Moves torch's CUDA_HOME record to our logger at DEBUG (and drops it where it was)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if _is_notice(message):
            logger.debug("while importing torch/Thunder: %s: %s", record.name, message)
            return False
        return True


@contextmanager
def _notices_to_debug() -> Iterator[None]:
    """Within: the notices go to our logger at DEBUG; any other warning is re-emitted after, as it was."""
    cpp_logger = logging.getLogger("torch.utils.cpp_extension")
    to_debug = _ToDebug()
    cpp_logger.addFilter(to_debug)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield
    finally:
        cpp_logger.removeFilter(to_debug)
    for w in caught:
        if _is_notice(str(w.message)):
            logger.debug("while importing torch/Thunder: %s: %s", w.category.__name__, w.message)
        else:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno, source=w.source)


def import_quietly() -> None:
    """Import thunder and torch.utils.cpp_extension, their optional-dependency notices on the logger (as they are
    where the shim ``quiet-import`` does not apply)."""
    if "thunder" in sys.modules and "torch.utils.cpp_extension" in sys.modules:
        return
    if not shims.applies("quiet-import"):
        import thunder
        import torch.utils.cpp_extension

        return
    with _notices_to_debug():
        import thunder  # noqa: F401
        import torch.utils.cpp_extension  # noqa: F401
