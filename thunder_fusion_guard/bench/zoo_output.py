"""The zoo's results for a reader: its table, the lines under it, and its JSON document."""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..wording import WIDTH, wrap
from .zoo_paths import EAGER, GUARDED, INDUCTOR, ZooPath
from .zoo_records import ModelResult, PathResult


def rescue_lines(results: Sequence[ModelResult]) -> list[str]:
    """One line per distinct rescue of each model's guarded paths: what failed and what runs it now, counted."""
    lines = []
    for result in results:
        for path, row in result.paths.items():
            seen = Counter(f"{r.rescued_by or 'restrided'}: {r.reason}" for r in row.rescues)
            lines += [f"{result.model} {path}: rescue x{n}: {what}" for what, n in seen.items()]
    return lines


HEADER = ("model", "path", "runs", "bits", "step ms", "x unguarded", "x eager", "x inductor", "first s",
          "guard actions")  # fmt: skip


@dataclass
class SummaryRow:
    """One line of the zoo's table: a path of a model, or what stopped a model's process (``path`` None). Every
    ratio is a median step time over another's, and each names what it is against: ``x_unguarded`` the path
    ``unguarded``, ``x_eager`` eager (of the same process where the paths were split), ``x_inductor`` Inductor."""

    model: str
    path: ZooPath | None = None
    runs: bool = False
    failure: str = ""  # why not: the error's kind and whether it is a known Thunder limitation; or what stopped
    bits: str = ""
    step_ms: float | None = None
    unguarded: ZooPath | None = None
    x_unguarded: float | None = None
    x_eager: float | None = None
    x_inductor: float | None = None
    first_call_s: float | None = None
    actions: str = ""

    def cells(self) -> list[str]:
        """The row's cells, in :data:`HEADER`'s order."""
        if self.path is None:
            return [self.model, "-", f"stopped: {self.failure}", *[""] * (len(HEADER) - 3)]

        def number(x: float | None, digits: int) -> str:
            return "-" if x is None else f"{x:.{digits}f}"

        x_unguarded = "-" if self.x_unguarded is None else f"{self.x_unguarded:.2f} ({self.unguarded})"
        return [
            self.model, self.path.name, "yes" if self.runs else f"no: {self.failure}", self.bits,
            number(self.step_ms, 2), x_unguarded, number(self.x_eager, 2), number(self.x_inductor, 2),
            number(self.first_call_s, 1), self.actions,
        ]  # fmt: skip


def _median(samples: Sequence[float] | None) -> float | None:
    return statistics.median(samples) if samples else None


def summary_rows(results: Sequence[ModelResult]) -> list[SummaryRow]:
    """One row per model and path: runs (else the kind of failure), bits against unguarded Thunder, median step
    ms, ratios (each naming what it is against), first call; one more per model whose process stopped."""
    rows = []
    for result in results:
        medians = {p: _median(r.samples_s) for p, r in result.paths.items()}

        def ratio(path: ZooPath, of: ZooPath | None, m: dict[ZooPath, float | None] = medians) -> float | None:
            a, b = m.get(path), m.get(of) if of else None
            return a / b if a and b else None

        for path, row in result.paths.items():
            unguarded = row.compared_with if row.compared_with and row.compared_with.is_thunder else path.baseline
            own = {**medians, EAGER: _median(row.eager_samples_s)} if row.eager_samples_s else medians
            actions = ", ".join(f"{n} {a}" for a, n in sorted((row.actions or {}).items()))
            if row.backends:
                actions += "; subgraphs to " + ", ".join(f"{b} {n}" for b, n in sorted(row.backends.items()))
            failure = "" if row.runs else row.error_kind
            if row.known_limitation:
                failure += " (known Thunder limitation)"
            x_unguarded = ratio(path, unguarded) if path.baseline else None
            rows.append(
                SummaryRow(
                    model=result.model,
                    path=path,
                    runs=row.runs,
                    failure=failure,
                    bits=_bits_text(path, row),
                    step_ms=None if medians.get(path) is None else medians[path] * 1e3,
                    unguarded=unguarded if x_unguarded is not None else None,
                    x_unguarded=x_unguarded,
                    x_eager=ratio(path, EAGER, own),
                    x_inductor=ratio(path, INDUCTOR),
                    first_call_s=row.first_call_s,
                    actions=actions,
                )
            )
        if result.problem:
            rows.append(SummaryRow(result.model, failure=result.problem))
    return rows


def table_rows(results: Sequence[ModelResult]) -> list[list[str]]:
    """The zoo's table as rows of cells, the header first."""
    return [list(HEADER), *(row.cells() for row in summary_rows(results))]


def failure_lines(results: Sequence[ModelResult]) -> list[str]:
    """One line per path that failed: the model, the path and the error's first line in full, labelled with its
    test where it is a known Thunder limitation (the JSON has the whole message)."""
    lines = []
    for result in results:
        for path, row in result.paths.items():
            if row.runs or not row.error:
                continue
            known = row.known_limitation
            label = f" [known Thunder limitation: {known}]" if known else ""
            more = " (the JSON has the whole message)" if row.error_detail else ""
            lines.append(f"{result.model} {path}: {row.error}{label}{more}")
    return lines


def notes(results: Sequence[ModelResult]) -> list[str]:
    """The lines under the table: each guarded path's why-not-fused summary, its rescues, every failure."""
    why = [f"{r.model} {p}: {r.paths[p].why[0]}" for r in results for p in GUARDED if p in r.paths and r.paths[p].why]
    return why + rescue_lines(results) + failure_lines(results)


def wrapped(lines: Sequence[str], width: int = WIDTH) -> list[str]:
    """``lines`` wrapped to ``width`` columns between words (never cut), each continuation indented."""
    return [part for line in lines for part in wrap(line, width)]


def _bits_text(path: ZooPath, row: PathResult) -> str:
    """The bits column: the comparison, and against which path where it is not the path's unguarded twin."""
    bits, against = row.bits or "", row.compared_with
    if not bits or against is None or against == path.baseline or against.name in bits:
        return bits
    return f"{bits} (vs {against})"


def to_json(results: Sequence[ModelResult], device: str) -> dict[str, Any]:
    """The zoo as a pytest-benchmark JSON document: one benchmark per model and path that was timed, and every
    model's full record (runs, bits, first calls, whole errors, guard actions, why-not-fused lines) under ``zoo``."""
    from datetime import datetime, timezone

    from .machine import commit_info, machine_info
    from .run import benchmark_version, sample_stats

    benchmarks = [
        {
            "group": f"zoo/{result.model}",
            "name": f"{result.model}[{path}]",
            "fullname": f"zoo/{result.model}[{path}]",
            "params": {"model": result.model, "path": path.name},
            "param": f"{result.model}-{path}",
            "extra_info": {k: v for k, v in row.to_dict().items() if k not in ("samples_s", "eager_samples_s")},
            "options": {"timer": "perf_counter", "interleaved": True},
            "stats": {**sample_stats(row.samples_s), "iterations": 1},
        }
        for result in results
        for path, row in result.paths.items()
        if row.samples_s
    ]
    records = [r.to_dict() for r in results]
    return {
        "machine_info": machine_info(device),
        "commit_info": commit_info(),
        "benchmarks": benchmarks,
        "datetime": datetime.now(timezone.utc).isoformat(),
        "version": benchmark_version(),
        "zoo": [
            {**r, "paths": {p: {k: v for k, v in row.items() if k != "samples_s"} for p, row in r["paths"].items()}}
            for r in records
        ],
    }
