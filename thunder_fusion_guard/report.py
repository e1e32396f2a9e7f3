"""Decision records and the report that collects them: what was seen, what was done, and why."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

ACTIONS = ("keep", "reject", "rehome", "remove", "fold")


@dataclass
class Decision:
    """The fate of one fusion region (or one op, for re-homing and removal) in one trace."""

    trace: str
    region: str
    executor: str
    ops: list[str]
    action: str
    reason: str
    function: str | None = None
    compile_index: int = 0
    applied: bool = True
    error: str | None = None
    estimates: dict[str, float] = field(default_factory=dict)
    subgraph: str | None = None
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class Report:
    """Every decision one :class:`FusionGuard` has made, across all the traces it has seen."""

    def __init__(self) -> None:
        self.decisions: list[Decision] = []

    def add(self, decision: Decision) -> None:
        if decision.action not in ACTIONS:
            raise ValueError(f"unknown action {decision.action!r}; allowed: {ACTIONS}")
        self.decisions.append(decision)

    def __len__(self) -> int:
        return len(self.decisions)

    def __iter__(self):
        return iter(self.decisions)

    def filter(self, **match: Any) -> list[Decision]:
        """Decisions whose fields equal every ``field=value`` given."""
        return [d for d in self.decisions if all(getattr(d, k) == v for k, v in match.items())]

    def counts(self) -> dict[str, int]:
        return dict(Counter(d.action for d in self.decisions))

    def to_dict(self) -> dict[str, Any]:
        return {"counts": self.counts(), "decisions": [d.to_dict() for d in self.decisions]}

    def to_json(self, **kwargs: Any) -> str:
        return json.dumps(self.to_dict(), **kwargs)

    def __str__(self) -> str:
        return format_table(self.decisions)

    def __repr__(self) -> str:
        return f"Report({self.counts()})"


def _ops_text(ops: list[str], limit: int = 48) -> str:
    text = ", ".join(ops)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _estimate_text(d: Decision) -> str:
    region, eager = d.estimates.get("est_region_us"), d.estimates.get("est_eager_us")
    if region is None or eager is None:
        return ""
    return f"{region:.1f} / {eager:.1f}"


def format_table(decisions: list[Decision]) -> str:
    """A fixed-width table, one row per decision, grouped by function, compilation and trace."""
    if not decisions:
        return "FusionGuard: no fusion regions seen yet (call the jitted function first)."
    header = ("trace", "region", "executor", "ops", "action", "est µs region/eager", "reason")
    rows = []
    for d in decisions:
        where = d.trace if d.subgraph is None else f"{d.subgraph}/{d.trace}"
        if d.function:
            where = f"{d.function}#{d.compile_index}:{where}"
        action = d.action if d.applied else f"{d.action} (not applied)"
        reason = d.reason if d.error is None else f"{d.reason} [{d.error}]"
        rows.append((where, d.region, d.executor, _ops_text(d.ops), action, _estimate_text(d), reason))
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header) - 1)]
    lines = []
    for r in [header, *rows]:
        lines.append("  ".join(str(c).ljust(w) for c, w in zip(r[:-1], widths, strict=True)) + "  " + r[-1])
    counts = Counter(d.action for d in decisions)
    summary = ", ".join(f"{counts[a]} {a}" for a in ACTIONS if counts[a])
    lines.insert(1, "-" * min(160, sum(widths) + 2 * len(widths) + 20))
    lines.append(f"FusionGuard: {len(decisions)} decisions ({summary})")
    return "\n".join(lines)


def text_table(rows: list[list[str]]) -> list[str]:
    """Rows of cells as fixed-width lines, columns two spaces apart."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
