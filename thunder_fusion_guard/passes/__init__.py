"""The guard's passes: plain functions over a Thunder trace, run find → decide → rewrite → fold → remove →
rehome → hoist → record by :func:`guard_trace`."""

from .pipeline import CommunicationChanged, FusionGuardError, TraceContext, guard_trace

__all__ = ["CommunicationChanged", "FusionGuardError", "TraceContext", "guard_trace"]
