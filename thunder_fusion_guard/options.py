"""FusionGuard's options: one frozen record, validated once, with errors that name the option."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from . import _thunder as th


@dataclass(frozen=True)
class GuardOptions:
    """What the guard may do. ``executors=None`` guards every fusion executor."""

    executors: frozenset[str] | None = None
    metadata_ops: frozenset[str] = field(default_factory=frozenset)
    report_only: bool = False
    strict: bool = False

    def guards(self, executor: str) -> bool:
        return self.executors is None or executor in self.executors


def _bool(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"FusionGuard option {name!r} must be True or False, got {value!r}")
    return value


def _names(name: str, value: Any, what: str) -> frozenset[str]:
    if isinstance(value, str) or not isinstance(value, Iterable):
        raise ValueError(f"FusionGuard option {name!r} must be a list of {what}, got {value!r}")
    out = []
    for item in value:
        if isinstance(item, th.FusionExecutor):
            item = item.name
        if not isinstance(item, str) or not item:
            raise ValueError(f"FusionGuard option {name!r} must be a list of {what}, got the item {item!r}")
        out.append(item)
    return frozenset(out)


def make_options(
    *,
    executors: Iterable[str | th.FusionExecutor] | None = None,
    metadata_ops: Iterable[str] = (),
    report_only: bool = False,
    strict: bool = False,
) -> GuardOptions:
    """Validate user options into a :class:`GuardOptions` (``ValueError`` names the bad option)."""
    chosen = None
    if executors is not None:
        chosen = _names("executors", executors, "fusion executor names or FusionExecutor objects")
        known = set(th.fusion_executor_names())
        unknown = sorted(chosen - known)
        if unknown:
            raise ValueError(
                f"FusionGuard option 'executors' names unknown fusion executors {unknown}; "
                f"allowed here: {sorted(known)}"
            )
    return GuardOptions(
        executors=chosen,
        metadata_ops=_names("metadata_ops", metadata_ops, "operation names (str)"),
        report_only=_bool("report_only", report_only),
        strict=_bool("strict", strict),
    )
