"""The interleaved benchmark run behind ``fusion-guard bench run`` and ``bench compare``.

Each case's variants (thunder, guarded, eager, torch.compile's ``inductor`` and ``inductor-ro``) are timed in
one process, round after round in a balanced order, so that drift of the machine falls on all variants
alike; the results are written as pytest-benchmark compatible JSON. :func:`compare` reads two such files'
medians and names the cases that got slower than a threshold allows.
"""

from __future__ import annotations

import contextlib
import gc
import json
import math
import shutil
import statistics
import sys
import tempfile
import time
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ..measure.timing import Timing, interleaved_rounds, quartiles
from ..render.table import markdown_table, text_table, wrapped
from ..wording import WIDTH, error_line
from .cases import (
    VARIANT_BUILDS,
    VARIANTS,
    BenchCase,
    fresh_compile_state,
    make_step,
    variant_build,
)
from .machine import commit_info, machine_info

TARGET_SAMPLE_S = 100e-6
MAX_INNER = 1000


@dataclass
class CaseResult:
    """Per-call times (seconds) of each variant of one case, or the error that stopped it; a variant that
    failed alone is in ``variant_errors`` and the others are timed."""

    case: BenchCase
    samples: dict[str, list[float]] = field(default_factory=dict)
    inner: int = 1
    first_call_s: dict[str, float] = field(default_factory=dict)
    error: str | None = None
    recompiled_while_timing: bool = False
    variant_errors: dict[str, str] = field(default_factory=dict)

    def median_us(self, variant: str) -> float | None:
        s = self.samples.get(variant)
        return statistics.median(s) * 1e6 if s else None


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _time_once(step: Callable[[], None]) -> float:
    start = time.perf_counter()
    step()
    return time.perf_counter() - start


# How each variant's first call is compiled, so that the order of variants favours none: said with the results.
FIRST_CALLS = (
    "each variant's first call compiles with empty Inductor caches (a fresh cache directory, in-memory caches "
    "cleared: no variant reuses another's kernels), after the process's start-up was paid on a tiny function; "
    "nvFuser's fusion cache is process-wide and kept"
)


@contextlib.contextmanager
def empty_compile_caches(parent: str) -> Iterator[None]:
    """Inductor's (and Triton's) caches empty for what runs inside: a fresh cache directory under ``parent`` and the
    in-memory caches cleared, so that a variant compiled later cannot reuse an earlier variant's kernels."""
    from torch._inductor.utils import fresh_cache

    with fresh_cache(dir=parent, delete=False):
        yield


_WARMED: set[str] = set()


def warm_process(device: str, caches: str) -> None:
    """Pay the process's one-time start-up (imports, Inductor's compiler checks, Thunder's first jit) on a tiny
    function, before any variant's first call is timed: else the first variant pays it alone. Once a device."""
    if device in _WARMED:
        return
    _WARMED.add(device)
    import thunder
    import torch

    from .._thunder import fusion_executors

    def tiny(x):
        return (x.sin() * 2).sum()

    x = torch.ones(8, device=device, requires_grad=True)
    with empty_compile_caches(caches):
        for fn in (torch.compile(tiny), thunder.jit(tiny, executors=fusion_executors(device))):
            fn(x).backward()
    torch._dynamo.reset()


def _dynamo_graphs() -> int:
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"]


def measure_case(
    case: BenchCase, device: str, reps: int, warmup: int, variants: Sequence[str] = VARIANTS
) -> CaseResult:
    """Time each variant of ``case``: first calls, warmup, then ``reps`` rounds in a balanced order.

    torch.compile's state is reset first, so each case compiles as in a fresh process; a graph compiled
    during the timed rounds (a recompilation) is logged and recorded.
    """
    fresh_compile_state()
    result = CaseResult(case)
    workload = case.build(device)
    steps = {}
    caches = tempfile.mkdtemp(prefix="tfg-first-calls-")
    warm_process(device, caches)
    for variant in variants:
        try:
            step = make_step(workload, variant, device)
            with empty_compile_caches(caches):
                result.first_call_s[variant] = _time_once(step)
        except Exception as e:  # one variant failing must not lose the others' numbers
            error = result.variant_errors[variant] = error_line(e)
            earlier = [v for v, said in result.variant_errors.items() if said == error and v != variant]
            _log(f"    {case.group}: {variant} FAILED: " + (f"as {earlier[0]}" if earlier else error))
            continue
        steps[variant] = step
        _log(f"    {case.group}: {variant} first call {result.first_call_s[variant]:.1f} s")
    shutil.rmtree(caches, ignore_errors=True)  # what the first calls compiled is loaded by now
    if not steps:
        raise AllVariantsFailed(f"every variant failed: {errors_by_variant(result.variant_errors)}")
    for _ in range(warmup):
        for step in steps.values():
            step()
    fastest = min(_time_once(step) for step in steps.values())
    result.inner = max(1, min(MAX_INNER, math.ceil(TARGET_SAMPLE_S / max(fastest, 1e-9))))
    graphs = _dynamo_graphs()
    result.samples = interleaved_rounds(steps, reps, inner=result.inner).samples
    if _dynamo_graphs() != graphs:
        result.recompiled_while_timing = True
        _log(f"    {case.group}: WARNING torch.compile compiled a graph during the timed rounds (a recompilation)")
    return result


class AllVariantsFailed(RuntimeError):
    """Every variant of a case failed (each error logged as it happened)."""


def errors_by_variant(errors: dict[str, str]) -> str:
    """Each distinct error once, with the variants that gave it: ``E (thunder, guarded); F (eager)``."""
    grouped: dict[str, list[str]] = {}
    for variant, error in errors.items():
        grouped.setdefault(error, []).append(variant)
    return "; ".join(f"{error} ({', '.join(variants)})" for error, variants in grouped.items())


def run_cases(
    cases: Sequence[BenchCase],
    device: str,
    reps: int,
    warmup: int,
    after_each: Callable[[list[CaseResult]], None] | None = None,
    variants: Sequence[str] = VARIANTS,
) -> list[CaseResult]:
    """Measure each case in turn, logging progress to stderr; a failing case is recorded, not fatal.

    ``after_each`` gets the results so far after every case, so a run cut short keeps what it measured.
    """
    results = []
    for i, case in enumerate(cases, 1):
        _log(f"[{i}/{len(cases)}] {case.group} on {device} ...")
        began = time.perf_counter()
        try:
            result = measure_case(case, device, reps, warmup, variants)
        except Exception as e:  # one case failing in any way must not lose the other cases' numbers
            result = CaseResult(case, error=f"{type(e).__name__}: {e}")
            said = "every variant failed (above)" if isinstance(e, AllVariantsFailed) else result.error
            _log(f"[{i}/{len(cases)}] {case.group} FAILED: {said}")
        else:
            times = ", ".join(f"{v} {result.median_us(v):.1f} µs" for v in result.samples)
            _log(f"[{i}/{len(cases)}] {case.group}: {times} ({time.perf_counter() - began:.1f} s)")
        results.append(result)
        if after_each is not None:
            after_each(results)
        if device == "cuda":
            import torch

            gc.collect()  # jitted functions hold reference cycles; free the case's memory before the next
            torch.cuda.empty_cache()
    return results


def sample_stats(data: Sequence[float]) -> dict[str, Any]:
    """The statistics pytest-benchmark stores for one benchmark (seconds)."""
    ordered = sorted(data)
    n = len(ordered)
    mean = statistics.mean(ordered)
    stddev = statistics.stdev(ordered) if n > 1 else 0.0
    q1, median, q3 = quartiles(ordered)
    iqr = q3 - q1
    iqr_outliers = sum(1 for v in ordered if v < q1 - 1.5 * iqr or v > q3 + 1.5 * iqr)
    stddev_outliers = sum(1 for v in ordered if abs(v - mean) > stddev)
    return {
        "min": ordered[0],
        "max": ordered[-1],
        "mean": mean,
        "stddev": stddev,
        "rounds": n,
        "median": median,
        "iqr": iqr,
        "q1": q1,
        "q3": q3,
        "iqr_outliers": iqr_outliers,
        "stddev_outliers": stddev_outliers,
        "outliers": f"{stddev_outliers};{iqr_outliers}",
        "ld15iqr": ordered[bisect_left(ordered, q1 - 1.5 * iqr)],
        "hd15iqr": ordered[bisect_right(ordered, q3 + 1.5 * iqr) - 1],
        "ops": 1 / mean if mean > 0 else 0.0,
        "total": sum(ordered),
    }


def benchmark_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("pytest-benchmark")
    except PackageNotFoundError:
        from .._version import __version__

        return f"thunder-fusion-guard {__version__}"


def to_json(results: Sequence[CaseResult], device: str, reps: int, warmup: int) -> dict[str, Any]:
    """The results as a pytest-benchmark JSON document (one benchmark per case and variant)."""
    benchmarks = []
    for r in results:
        for variant, samples in r.samples.items():
            benchmarks.append(
                {
                    "group": r.case.group,
                    "name": r.case.bench_name(variant),
                    "fullname": r.case.fullname(variant),
                    "params": {"case": r.case.name, "variant": variant},
                    "param": f"{r.case.name}-{variant}",
                    "extra_info": {
                        "device": device,
                        "suite": r.case.suite,
                        "variant_build": VARIANT_BUILDS[variant],
                        "first_call_s": round(r.first_call_s[variant], 3),
                        "compile_order": list(r.first_call_s).index(variant),
                        "interleaved": True,
                        **({"recompiled_while_timing": True} if r.recompiled_while_timing else {}),
                    },
                    "options": {
                        "disable_gc": False,
                        "timer": "perf_counter_ns",
                        "min_rounds": reps,
                        "warmup": warmup,
                        "iterations": r.inner,
                    },
                    "stats": {**sample_stats(samples), "iterations": r.inner},
                }
            )
    doc: dict[str, Any] = {
        "machine_info": machine_info(device),
        "commit_info": commit_info(),
        "benchmarks": benchmarks,
        "datetime": datetime.now(timezone.utc).isoformat(),
        "version": benchmark_version(),
        "first_calls": FIRST_CALLS,
    }
    errors = [{"group": r.case.group, "error": r.error} for r in results if r.error]
    errors += [{"group": r.case.group, "variant": v, "error": e} for r in results for v, e in r.variant_errors.items()]
    if errors:
        doc["errors"] = errors
    return doc


def _us(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def spread_us(result: CaseResult, variant: str) -> str:
    """'12.3 (11.9-13.0)': a variant's median per call and its first and third quartiles, in µs."""
    samples = result.samples.get(variant)
    return Timing.of([v * 1e6 for v in samples]).text() if samples else "-"


def summary_rows(results: Sequence[CaseResult]) -> list[list[str]]:
    """Per case: each variant's median (quartiles), guarded over thunder, and the first (compiling) calls."""
    variants = list(dict.fromkeys(v for r in results for v in r.samples)) or list(VARIANTS)
    compiled = [v for v in variants if v != "eager"]
    ratio = "thunder" in variants and "guarded" in variants
    rows = [
        [
            "case",
            *(f"{v} µs" for v in variants),
            *(["guarded/thunder"] if ratio else []),
            f"first call s {'/'.join(compiled)}",
        ]
    ]
    for r in results:
        if r.error:
            rows.append([r.case.group, *("-" for _ in variants), f"failed: {r.error[:80]}", "-"][: len(rows[0])])
            continue
        medians = {v: r.median_us(v) for v in variants}
        first = "/".join(f"{r.first_call_s[v]:.1f}" if v in r.first_call_s else "-" for v in compiled)
        cells = [r.case.group, *(spread_us(r, v) for v in variants)]
        if ratio:
            both = medians["thunder"] and medians["guarded"]
            cells.append(f"{medians['guarded'] / medians['thunder']:.2f}" if both else "-")
        rows.append([*cells, first])
    return rows


def format_rows(rows: list[list[str]], markdown: bool = False) -> str:
    """Rows as a fixed-width text table, or as a markdown table."""
    if markdown:
        return "\n".join(markdown_table(rows[0], rows[1:]))
    return "\n".join(text_table(rows))


class CompareError(ValueError):
    """A results file that cannot be compared."""


def load_medians(path: str | Path) -> dict[str, float]:
    """fullname -> median seconds of a pytest-benchmark JSON file."""
    try:
        doc = json.loads(Path(path).read_text())
        return {b.get("fullname") or b["name"]: float(b["stats"]["median"]) for b in doc["benchmarks"]}
    except OSError as e:
        raise CompareError(f"cannot read {path}: {e}") from e
    except (ValueError, KeyError, TypeError) as e:
        raise CompareError(f"{path} is not pytest-benchmark JSON ({type(e).__name__}: {e})") from e


def compare(
    base: dict[str, float], head: dict[str, float], threshold: float, width: int | None = WIDTH
) -> tuple[str, list[str]]:
    """A table of head/base median ratios, and the cases slower than ``1 + threshold`` times base; every line
    within ``width`` (long benchmark names broken onto further lines of their row; None: a line a row)."""
    rows = [["benchmark", "base µs", "head µs", "head/base", "status"]]
    regressed = []
    for name in sorted(base.keys() & head.keys()):
        ratio = head[name] / base[name] if base[name] > 0 else math.inf
        if ratio > 1 + threshold:
            status = "REGRESSED"
            regressed.append(name)
        elif ratio < 1 / (1 + threshold):
            status = "faster"
        else:
            status = "ok"
        rows.append([name, _us(base[name] * 1e6), _us(head[name] * 1e6), f"{ratio:.3f}", status])
    lines = text_table(rows, width=width, wrap=[0])
    for label, names in (("base", sorted(base.keys() - head.keys())), ("head", sorted(head.keys() - base.keys()))):
        if names:
            more = f", and {len(names) - 5} more" if len(names) > 5 else ""
            lines += wrapped(f"only in {label} ({len(names)}): {', '.join(names[:5])}{more}", width, "  ")
    lines += wrapped(verdict_line(regressed, base, head, len(rows) - 1, threshold), width, "  ")
    return "\n".join(lines), regressed


def verdict_line(
    regressed: list[str], base: dict[str, float], head: dict[str, float], total: int, threshold: float
) -> str:
    """The summary of a comparison; it names every regressed case with its slowdown."""
    if not regressed:
        return f"no regression in {total} (threshold {threshold:.1%})"
    named = ", ".join(
        f"{name.split('::')[-1]} ({head[name] / base[name]:.2f}x)" if base[name] > 0 else name.split("::")[-1]
        for name in regressed
    )
    return f"{len(regressed)} of {total} regressed (threshold {threshold:.1%}): {named}"


def variant_rows(result: CaseResult, frontend: str = "jit") -> list[list[str]]:
    """One case's variants, a row each (header first): median, quartiles, fastest and slowest round, rounds, the
    first (compiling) call and the ratio to unguarded Thunder; the spread and count a reader needs to trust a
    median. Per call, in ms when the slowest median reaches one, else µs."""
    medians = {v: statistics.median(s) for v, s in result.samples.items() if s}
    scale, unit = (1e3, "ms") if max(medians.values(), default=0.0) >= 1e-3 else (1e6, "µs")
    thunder = medians.get("thunder")
    header = ["variant", "built as", f"median {unit}", f"q1-q3 {unit}", f"min-max {unit}", "rounds", "first call s"]
    rows = [[*header, "x thunder"]]
    timings = {variant: Timing.of([v * scale for v in samples]) for variant, samples in result.samples.items()}
    base = timings["thunder"] if thunder else None
    for variant, timing in timings.items():
        ratio = f"{medians[variant] / thunder:.2f}" if thunder and variant in medians else "-"
        if base is not None and variant != "thunder" and variant in medians and _overlap(timing, base):
            ratio += ", quartiles overlap"  # no difference to read from this run
        first = result.first_call_s.get(variant)
        rows.append(
            [
                variant,
                variant_build(variant, frontend),
                f"{timing.median:.3g}",
                f"{timing.q1:.3g}-{timing.q3:.3g}",
                f"{timing.min:.3g}-{timing.max:.3g}",
                str(timing.samples),
                "-" if first is None else f"{first:.1f}",
                ratio,
            ]
        )
    for variant, error in result.variant_errors.items():
        rows.append([variant, variant_build(variant, frontend), f"failed: {error}", "", "", "", "", ""])
    return rows


def _overlap(a: Timing, b: Timing) -> bool:
    """Whether the first-to-third quartile spans of two timings overlap."""
    return a.q1 <= b.q3 and b.q1 <= a.q3


def guard_verdict(result: CaseResult, threshold: float) -> tuple[str, bool]:
    """Whether guarded Thunder ran slower than unguarded Thunder by more than ``threshold`` (a fraction), by their
    medians, with the quartiles saying whether the two overlap; the line that says so, and True on a slowdown."""
    guarded, thunder = result.samples.get("guarded"), result.samples.get("thunder")
    if not guarded or not thunder:
        missing = ", ".join(v for v in ("thunder", "guarded") if not result.samples.get(v))
        return f"no verdict: {missing} not timed", True
    g, t = Timing.of(guarded), Timing.of(thunder)
    ratio = g.median / t.median if t.median > 0 else math.inf
    overlap = _overlap(g, t)
    spread = "their quartiles overlap" if overlap else "their quartiles do not overlap"
    slower = ratio > 1 + threshold
    word = "slower" if slower else "faster" if ratio < 1 / (1 + threshold) else "no slower"
    if overlap and word != "no slower":  # a median apart, spreads that are not: noise can make it
        word = f"{word} by median, but their quartiles overlap: no difference this run can tell"
        return f"guarded is {ratio:.2f}x unguarded Thunder: {word} (threshold {threshold:.1%})", slower
    return f"guarded is {ratio:.2f}x unguarded Thunder: {word} (threshold {threshold:.1%}; {spread})", slower
