"""FusionGuard, the Thunder transform: a thin shell that runs the guard pass on each optimized trace."""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any

import thunder

from . import _thunder as th
from .options import make_options
from .passes import TraceContext, guard_trace
from .report import Report


class FusionGuard(thunder.Transform):
    """Reject fusion regions that cost more than plain PyTorch, and record every decision.

    Use as ``thunder.jit(fn, transforms=[FusionGuard()])``. Options are keyword-only:

    - ``executors``: names (or objects) of the fusion executors to guard; default all of them.
    - ``metadata_ops``: extra operation names to count as metadata-only.
    - ``report_only``: decide and record, change nothing.
    - ``strict``: raise instead of keeping a region the guard could not rewrite (for tests).
    """

    def __init__(
        self,
        *,
        executors: Iterable[str | th.FusionExecutor] | None = None,
        metadata_ops: Iterable[str] = (),
        report_only: bool = False,
        strict: bool = False,
    ) -> None:
        self.options = make_options(
            executors=executors, metadata_ops=metadata_ops, report_only=report_only, strict=strict
        )
        self.report = Report()
        self._lock = threading.Lock()
        self._compiles = 0
        self._subgraph: str | None = None

    def transform_trace_post_optimization(self, computation_trace: th.TraceCtx, **kwargs: Any) -> th.TraceCtx:
        with self._lock:
            backward = th.is_backward(computation_trace)
            if not backward:
                self._compiles += 1
            where = TraceContext(
                trace="backward" if backward else "forward",
                function=th.compile_function_name(),
                compile_index=self._compiles,
                subgraph=self._subgraph,
            )
            return guard_trace(computation_trace, self.options, self.report, where)

    def __repr__(self) -> str:
        return f"FusionGuard({self.options})"
