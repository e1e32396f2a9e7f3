"""The communication check: a pass may not add, drop, reorder or move anything across a communication op.

Every rank must reach each collective in the same order, and a wait must stay where the schedule put
it (Thunder's ``sort_waits`` placed it to overlap communication with compute). :func:`communication_changes`
compares a trace before and after a pass: the sequence of communication ops (``ops.is_communication``)
must be the same, and every value computed in both traces must be computed between the same two
communication ops.
"""

from __future__ import annotations

from enum import Enum
from typing import Any

from .. import _thunder as th
from ..ops import communication_segments, is_communication


def _describe(value: Any) -> Any:
    if isinstance(value, th.Proxy):
        shape = getattr(value, "shape", None)
        dtype = getattr(value, "dtype", None)
        return (type(value).__name__, None if shape is None else tuple(shape), str(dtype))
    if value is None or isinstance(value, (bool, int, float, str, Enum)):
        return repr(value)
    return type(value).__name__


def _signature(bsym: th.BoundSymbol) -> tuple:
    """One communication op as something comparable across traces: its name and its arguments' kinds,
    shapes and dtypes (proxy names may change when a pass renames, the op itself may not)."""
    if th.is_fusion(bsym):
        return ("fusion", tuple(_signature(s) for s in th.subsymbols(bsym) if is_communication(s)))
    return (th.op_name(bsym), tuple(_describe(a) for a in bsym.flat_args))


def communication_sequence(trace: th.TraceCtx) -> list[tuple]:
    """The communication ops of ``trace`` in order (a region holding one counts as one), as signatures."""
    return [_signature(b) for b in trace.bound_symbols if is_communication(b)]


def _segments(trace: th.TraceCtx) -> dict[str, int]:
    """For each name a non-communication op defines (inside regions too): how many communication ops precede it."""
    found: dict[str, int] = {}

    def visit(bsym: th.BoundSymbol, segment: int) -> None:
        for p in bsym.flat_proxy_outs:
            found.setdefault(p.name, segment)
        for sub in th.subsymbols(bsym):
            visit(sub, segment)

    bsyms = trace.bound_symbols
    for b, segment in zip(bsyms, communication_segments(bsyms), strict=True):
        if not is_communication(b) and not th.is_comment_or_del(b):
            visit(b, segment)
    return found


def communication_changes(before: th.TraceCtx, after: th.TraceCtx) -> str | None:
    """None when ``after`` runs the same communication ops as ``before``, in the same order, with nothing
    moved across one; otherwise what changed, in one line."""
    old, new = communication_sequence(before), communication_sequence(after)
    if old != new:
        first = next((i for i, (a, b) in enumerate(zip(old, new, strict=False)) if a != b), min(len(old), len(new)))
        seen = new[first][0] if first < len(new) else "nothing"
        wanted = old[first][0] if first < len(old) else "nothing"
        return (
            f"communication ops changed: {len(old)} before, {len(new)} after; "
            f"communication op {first} was {wanted}, is {seen}"
        )
    if not old:
        return None
    was, now = _segments(before), _segments(after)
    for name, segment in now.items():
        if name in was and was[name] != segment:
            return (
                f"{name} moved across a communication op (computed after {was[name]} communication ops, "
                f"now after {segment})"
            )
    return None
