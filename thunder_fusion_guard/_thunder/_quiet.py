"""Import Thunder (and the torch module that looks for CUDA_HOME) with their optional-dependency notices sent
to the ``thunder_fusion_guard`` logger at DEBUG instead of the user's console.

Thunder 0.2.6 warns ``transformer_engine module not found!`` on import, and torch logs ``No CUDA runtime is
found, using CUDA_HOME=...`` when ``torch.utils.cpp_extension`` first loads (on CPU at the first torch.compile).
Neither is about the user's program. Only those two notices, and only while this package first imports them,
are redirected: any other warning is re-emitted as it was, and Thunder's behaviour elsewhere (a process that
imports Thunder before this package) is unchanged. Imported first by ``_thunder/__init__.py``.
"""

from __future__ import annotations

import logging
import sys
import warnings

logger = logging.getLogger("thunder_fusion_guard")

NOTICES = ("transformer_engine module not found", "CUDA_HOME")


def _is_notice(text: str) -> bool:
    return any(n in text for n in NOTICES)


class _ToDebug(logging.Filter):
    """Moves torch's CUDA_HOME record to our logger at DEBUG (and drops it where it was)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if _is_notice(message):
            logger.debug("while importing torch/Thunder: %s: %s", record.name, message)
            return False
        return True


def import_quietly() -> None:
    """Import thunder and torch.utils.cpp_extension, their optional-dependency notices on the logger."""
    if "thunder" in sys.modules and "torch.utils.cpp_extension" in sys.modules:
        return
    cpp_logger = logging.getLogger("torch.utils.cpp_extension")
    to_debug = _ToDebug()
    cpp_logger.addFilter(to_debug)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            import thunder  # noqa: F401
            import torch.utils.cpp_extension  # noqa: F401
    finally:
        cpp_logger.removeFilter(to_debug)
    for w in caught:
        if _is_notice(str(w.message)):
            logger.debug("while importing torch/Thunder: %s: %s", w.category.__name__, w.message)
        else:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno, source=w.source)


import_quietly()
