"""How the measured rows bear out the guard's decisions: confusion counts, estimates against timings, as text."""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Sequence
from typing import Any

from ..render.table import text_table
from .decisions_measure import NOISE, Row

VERDICTS = ("right", "wrong reject", "wrong keep", "within noise")
CHOICE_VERDICTS = ("right", "wrong switch", "wrong stay", "within noise")
# Decisions the guard could have made either way; the others are fixed by a rule (exactness, random ops,
# unknown sizes) or by missing constants.
CHOICES = ("metadata", "model", "measured")
MARGIN = 0.2  # the default option: keeps where eager wins by less are the guard's contract, counted apart


def _within(est: float | None, measured: float | None, factor: float = 2.0) -> bool | None:
    if est is None or measured is None or est <= 0 or measured <= 0:
        return None
    return 1 / factor <= est / measured <= factor


def summarize(rows: Sequence[Row]) -> dict[str, Any]:
    """Confusion counts (all regions, by decided_by, by split), agreement where the truth is clear,
    the worst wrong reject, and how close the estimates come to the measurements."""
    timed = [r for r in rows if r.verdict is not None]

    def confusion(subset: Sequence[Row], key: str = "verdict") -> dict[str, Any]:
        counts = Counter(getattr(r, key) for r in subset if getattr(r, key))
        clear = sum(counts[v] for v in ("right", "wrong reject", "wrong keep"))
        out: dict[str, Any] = {v: counts[v] for v in VERDICTS}
        out["agree_where_clear"] = round(counts["right"] / clear, 3) if clear else None
        return out

    chosen = [r for r in timed if r.decided_by in CHOICES]
    choice_counts = Counter(r.choice_verdict for r in rows if r.choice_verdict)
    choice_clear = sum(choice_counts[v] for v in ("right", "wrong switch", "wrong stay"))
    executor_choice: dict[str, Any] = {v: choice_counts[v] for v in CHOICE_VERDICTS}
    executor_choice["agree_where_clear"] = round(choice_counts["right"] / choice_clear, 3) if choice_clear else None
    executor_choice["eligible"] = sum(1 for r in rows if r.other_executor)
    executor_choice["timed_by_guard"] = sum(1 for r in rows if r.other_timed_by_guard)
    executor_choice["other_faster"] = sum(1 for r in rows if r.choice_truth == "other")
    margin_keeps = [r for r in timed if r.verdict == "wrong keep" and r.eager_us >= r.fused_us * (1 - MARGIN)]
    device_keeps = [r for r in timed if r.verdict == "wrong keep" and _eager_dearer_on_device(r)]
    where_chose = confusion(chosen)
    chose_clear = sum(where_chose[v] for v in ("right", "wrong reject", "wrong keep"))
    pooled_clear = chose_clear + choice_clear
    wrong_rejects = [r for r in timed if r.verdict == "wrong reject"]
    worst = max(((r.eager_us - r.fused_us) / r.fused_us for r in wrong_rejects), default=0.0)
    ratio_rows = [(r.est_region_us / r.fused_us, r.est_eager_us / r.eager_us) for r in timed if r.est_region_us]
    both = [_within(r.est_region_us, r.fused_us) and _within(r.est_eager_us, r.eager_us) for r in timed]
    both = [b for b in both if b is not None]
    decided_by = sorted({r.decided_by or "-" for r in timed})
    return {
        "regions": len(rows),
        "timed": len(timed),
        "errors": sum(1 for r in rows if r.error),
        "confusion": confusion(timed),
        "where_the_guard_chose": where_chose,
        "with_executor_choices": (
            round((where_chose["right"] + choice_counts["right"]) / pooled_clear, 3) if pooled_clear else None
        ),
        "wrong_keeps_within_margin": len(margin_keeps),
        "wrong_keeps_eager_dearer_on_device": len(device_keeps),
        "by_decided_by": {k: confusion([r for r in timed if (r.decided_by or "-") == k]) for k in decided_by},
        "by_split": {s: confusion([r for r in timed if r.split == s]) for s in ("tune", "holdout")},
        "model_only": confusion([r for r in timed if r.model_verdict], "model_verdict"),
        "worst_wrong_reject": round(worst, 3),
        "executor_choice": executor_choice,
        "estimates": {
            "with_estimates": len(ratio_rows),
            "fused_within_2x": _fraction([_within(r.est_region_us, r.fused_us) for r in timed]),
            "eager_within_2x": _fraction([_within(r.est_eager_us, r.eager_us) for r in timed]),
            "both_within_2x": round(sum(both) / len(both), 3) if both else None,
            "fused_ratio_quartiles": _deciles([a for a, _ in ratio_rows]),
            "eager_ratio_quartiles": _deciles([b for _, b in ratio_rows]),
        },
    }


def _eager_dearer_on_device(row: Row) -> bool:
    """The guard timed the region's device time apart, and eager's was dearer by more than the spread floor:
    a device-bound program would lose by rejecting it, so the guard keeps it on purpose."""
    from ..policy import MEASURED_MARGIN_FLOOR

    g = row.guard_measured or {}
    fused, eager = g.get("measured_region_device_us"), g.get("measured_eager_device_us")
    return fused is not None and eager is not None and eager > fused * (1 + MEASURED_MARGIN_FLOOR)


def _fraction(flags: list[bool | None]) -> float | None:
    known = [f for f in flags if f is not None]
    return round(sum(known) / len(known), 3) if known else None


def _deciles(values: list[float]) -> list[float] | None:
    """The 10, 25, 50, 75 and 90% points of ``values`` (linear interpolation), rounded; None for none."""
    if not values:
        return None
    if len(values) == 1:
        return [round(values[0], 3)] * 5
    points = statistics.quantiles(values, n=20, method="inclusive")
    return [round(points[i], 3) for i in (1, 4, 9, 14, 17)]


def format_summary(summary: dict[str, Any], device: str) -> str:
    """The confusion tables and the estimate/measured distribution as text."""
    header = ["decisions", *VERDICTS, "agree where clear"]

    def line(label: str, c: dict[str, Any]) -> list[str]:
        agree = c["agree_where_clear"]
        return [label, *(str(c[v]) for v in VERDICTS), "-" if agree is None else f"{agree:.1%}"]

    table = [header, line("guard (default options)", summary["confusion"])]
    table.append(line("  where it had a choice", summary["where_the_guard_chose"]))
    table += [line(f"  decided by {k}", c) for k, c in summary["by_decided_by"].items()]
    table += [line(f"  {k} split", c) for k, c in summary["by_split"].items()]
    table.append(line("cost model alone (compute)", summary["model_only"]))
    est = summary["estimates"]
    lines = [
        f"decision accuracy on {device}: {_n(summary['timed'], 'region')} timed of {summary['regions']} "
        f"({summary['errors']} could not be timed); truth = interleaved A/B, noise band {NOISE:.0%}",
        *text_table(table),
        f"worst wrong reject: eager {summary['worst_wrong_reject']:.0%} slower than the fusion call; "
        f"{_n(summary['wrong_keeps_within_margin'], 'wrong keep')} within the {MARGIN:.0%} margin"
        + _device_keeps_text(summary.get("wrong_keeps_eager_dearer_on_device", 0)),
        f"estimates within 2x of measured: fused {_pct(est['fused_within_2x'])}, eager {_pct(est['eager_within_2x'])}, "
        f"both {_pct(est['both_within_2x'])} (of {_n(est['with_estimates'], 'region')} with estimates)",
        f"est/measured quantiles 10/25/50/75/90%: fused {est['fused_ratio_quartiles']}, "
        f"eager {est['eager_ratio_quartiles']}",
    ]
    choice = summary.get("executor_choice") or {}
    if choice.get("eligible"):
        agree = choice["agree_where_clear"]
        lines.append(
            f"executor choice (regions another fusion executor could run with the same bits: {choice['eligible']}, "
            f"faster there: {choice['other_faster']}; timed by the guard: {choice['timed_by_guard']}): "
            + ", ".join(f"{choice[v]} {v}" for v in CHOICE_VERDICTS)
            + f"; agree where clear {'-' if agree is None else f'{agree:.1%}'}"
        )
        pooled = summary.get("with_executor_choices")
        if pooled is not None:
            lines.append(f"where it had a choice, executor choices included: agree where clear {pooled:.1%}")
    return "\n".join(lines)


def _device_keeps_text(count: int) -> str:
    if not count:
        return ""
    return (
        f", {count} have eager dearer on the device as the guard timed it "
        "(kept on purpose: a device-bound program would lose)"
    )


def _n(count: int, word: str) -> str:
    """'1 region', '2 regions'."""
    return f"{count} {word}{'' if count == 1 else 's'}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def rows_table(rows: Sequence[Row]) -> str:
    table = [["program", "trace", "region", "ops", "action", "by", "est fused/eager", "meas fused/eager", "verdict"]]
    for r in rows:
        ops = ", ".join(r.ops)
        est = "-" if r.est_region_us is None else f"{r.est_region_us:.1f}/{r.est_eager_us:.1f}"
        meas = "-" if r.fused_us is None else f"{r.fused_us:.1f}/{r.eager_us:.1f}"
        verdict = r.verdict or (r.error or "-")[:60]
        table.append([r.program, r.trace, r.region, ops[:40], r.action, r.decided_by or "-", est, meas, verdict])
    return "\n".join(text_table(table))
