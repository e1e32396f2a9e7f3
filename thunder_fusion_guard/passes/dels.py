"""The ``del`` statements of a trace the passes before changed, derived again."""

from __future__ import annotations

from .. import _thunder as th
from ..decisions import Decision
from .context import PassContext


def dels_pass(trace: th.TraceCtx, context: PassContext) -> tuple[th.TraceCtx, list[Decision]]:
    """Re-derive the ``del`` statements of a trace the passes before changed."""
    return (trace if trace is context.original else th.refresh_dels(trace)), []
