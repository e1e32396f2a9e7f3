"""The guard's passes: plain functions ``(trace, context) -> (new trace, new decisions)`` over a Thunder trace,
run in the order of the table ``pipeline.PASSES`` (decide and rewrite regions → fold → remove → rehome → merge →
hoist → dels → direct calls → rescue) by :func:`guard_trace`, which records their decisions once, after the last."""

from .context import CommunicationChanged, FusionGuardError, TraceContext
from .pipeline import guard_trace

__all__ = ["CommunicationChanged", "FusionGuardError", "TraceContext", "guard_trace"]
