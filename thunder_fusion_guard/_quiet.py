"""Thunder (and the torch module that looks for CUDA_HOME) imported with their optional-dependency notices sent to
the ``thunder_fusion_guard`` logger at DEBUG instead of the user's console.

Thunder 0.2.6 warns ``transformer_engine module not found!`` on import, and torch logs ``No CUDA runtime is
found, using CUDA_HOME=...`` when ``torch.utils.cpp_extension`` first loads (on CPU at the first torch.compile).
Neither is about the user's program. The rule: once this package is imported, Thunder's first import is quiet,
whoever makes it (this package's own modules, or the user's ``import thunder`` after ``import thunder_fusion_guard``);
``import thunder_fusion_guard`` itself imports neither torch nor Thunder, so it stays light. Only those two
notices, and only while Thunder first imports, are redirected: any other warning is re-emitted as it was, and a
process that imports Thunder before this package sees Thunder as it is. No torch or Thunder import here.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import logging
import sys
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from types import ModuleType

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


class _QuietLoader(importlib.abc.Loader):
    """Thunder's own loader, its module run within :func:`_notices_to_debug`, then torch's cpp_extension loaded."""

    def __init__(self, loader: importlib.abc.Loader) -> None:
        self.loader = loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        module.__loader__ = self.loader  # Thunder's module names its own loader, as imported without this package
        if module.__spec__ is not None:
            module.__spec__.loader = self.loader
        with _notices_to_debug():
            self.loader.exec_module(module)
            import torch.utils.cpp_extension  # noqa: F401


class _QuietFirstThunderImport(importlib.abc.MetaPathFinder):
    """Finds nothing but Thunder's first import, which it hands to :class:`_QuietLoader`; then leaves
    ``sys.meta_path``."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != "thunder":
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        spec = importlib.util.find_spec("thunder")
        if spec is None or spec.loader is None:
            return spec
        spec.loader = _QuietLoader(spec.loader)
        return spec


def quiet_first_thunder_import() -> None:
    """Make Thunder's first import quiet (see the module's docstring) where Thunder is not imported yet: the shim
    ``quiet-import`` (:mod:`.shims`), undone by taking the finder off ``sys.meta_path``."""
    if "thunder" in sys.modules or any(isinstance(f, _QuietFirstThunderImport) for f in sys.meta_path):
        return
    if not shims.applies("quiet-import"):
        return
    finder = _QuietFirstThunderImport()
    sys.meta_path.insert(0, finder)

    def undo() -> None:
        if finder in sys.meta_path:
            sys.meta_path.remove(finder)

    shims.record("quiet-import", undo)
