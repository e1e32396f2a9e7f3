"""One corpus program measured: each region's decision beside its fused and eager timings (a ``Row`` each)."""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ..measure.timing import quartiles
from ..wording import error_line
from .decisions_corpus import Program

# Truth "within noise" when fused and eager medians differ by less than this, or the per-round ratios'
# interquartile range straddles 1.
NOISE = 0.05


@dataclass
class Row:
    """One region: the guard's decision, the model's estimate, and the measured truth (µs per call)."""

    group: str
    program: str
    split: str
    trace: str
    region: str
    ops: list[str]
    action: str
    decided_by: str | None
    model_action: str | None
    est_region_us: float | None = None
    est_eager_us: float | None = None
    fused_us: float | None = None
    eager_us: float | None = None
    ratio_q1: float | None = None
    ratio_q3: float | None = None
    truth: str | None = None
    verdict: str | None = None
    model_verdict: str | None = None
    error: str | None = None
    # where another fusion executor can run the region without changing its bits (the guard may switch it)
    other_executor: str | None = None
    other_us: float | None = None
    choice_truth: str | None = None  # 'other' (faster than fused and eager), 'own', or 'noise'
    choice_verdict: str | None = None  # right, wrong switch, wrong stay, within noise
    other_timed_by_guard: bool = False  # the guard timed the other executor (option choose_executor)
    guard_measured: dict[str, Any] | None = None  # what the guard itself timed while compiling (measured_*)


def truth_of(fused: list[float], eager: list[float], noise: float = NOISE) -> tuple[str, float, float]:
    """'fusion' (fused faster), 'eager' or 'noise', and the quartiles of the per-round eager/fused ratios."""
    ratios = sorted(e / f for f, e in zip(fused, eager, strict=False) if f > 0)
    q1, _, q3 = quartiles(ratios) if ratios else (math.nan, math.nan, math.nan)
    ratio = statistics.median(eager) / statistics.median(fused)
    if abs(ratio - 1) < noise or q1 <= 1 <= q3:
        return "noise", q1, q3
    return ("fusion" if ratio > 1 else "eager"), q1, q3


def verdict_of(action: str | None, truth: str | None) -> str | None:
    """right, wrong reject, wrong keep, or within noise."""
    if action is None or truth is None:
        return None
    if truth == "noise":
        return "within noise"
    if action == "reject":
        return "right" if truth == "eager" else "wrong reject"
    return "right" if truth == "fusion" else "wrong keep"


def choice_verdict_of(switched: bool, truth: str | None) -> str | None:
    """right, wrong switch, wrong stay, or within noise, of the guard's executor choice."""
    if truth is None:
        return None
    if truth == "noise":
        return "within noise"
    if switched:
        return "right" if truth == "other" else "wrong switch"
    return "right" if truth == "own" else "wrong stay"


def measure_program(program: Program, device: str, reps: int, region_s: float) -> tuple[list[Row], dict[str, Any]]:
    """Jit ``program`` with a default report-only guard, then time each region fused vs eager (and, where the
    guard could hand it to another fusion executor, fused by that executor)."""
    import thunder

    from .. import _thunder as th
    from ..cost import UnknownSize, estimate
    from ..examine.calls import program_calls
    from ..measure.breakeven import region_pair
    from ..measure.timing import interleaved_us
    from ..ops import switch_keeps_bits
    from ..transform import FusionGuard

    fn, args, backward, options = program.build(device)
    if device != "cuda":
        from thunder.executors.torch_compile import torch_compile_ex

        options = {**options, "executors": [torch_compile_ex]}
    guard = FusionGuard(report_only=True)
    jitted = thunder.jit(fn, transforms=[guard], **options)
    began = time.perf_counter()
    (calls,) = program_calls(jitted, args, {}, backward)
    compile_s = time.perf_counter() - began
    rows = []
    for call in calls.calls:
        d = call.decision
        row = Row(
            program.group,
            program.name,
            program.split,
            call.trace,
            call.region.name,
            call.region.ops,
            d.action if d else "keep",
            d.details.get("decided_by") if d else None,
            d.details.get("model_action") if d else None,
        )
        if d is not None and "measured_region_us" in d.details:
            row.guard_measured = {k: v for k, v in d.details.items() if k.startswith("measured_")}
        if d is not None and "est_region_us" in d.estimates:
            row.est_region_us, row.est_eager_us = d.estimates["est_region_us"], d.estimates["est_eager_us"]
        else:
            constants = guard.constants_for(device, call.region.executor)
            if constants is not None:
                try:
                    r = call.region
                    est = estimate(r.body, r.inputs, r.outputs, constants)
                    row.est_region_us, row.est_eager_us = round(est.region_us, 3), round(est.eager_us, 3)
                except UnknownSize:
                    pass
        rows.append(row)
        replay = call.replay_args()
        if replay is None:
            row.error = "region was not called"
            continue
        other = th.alternative_fuser(call.region.bsym)
        if other is not None and switch_keeps_bits(call.region.body):
            row.other_executor = other.name
        try:
            fns = list(region_pair(calls.traces[call.trace], call.region))
            if row.other_executor:
                fns.append(th.region_callable(th.fuse_with(other, call.region.bsym, 0)))
            deadline = time.perf_counter_ns() + int(region_s * 1e9)
            with torch.no_grad():
                fused_s, eager_s, *other_s = interleaved_us(
                    fns, replay, reps=reps, warmup=3, deadline_ns=deadline, min_reps=5, cuda=device == "cuda"
                )
        except Exception as e:  # one region failing in any way must not lose the other regions' rows
            row.error = error_line(e)
            continue
        if other_s:
            row.other_us = round(statistics.median(other_s[0]), 3)
            best = fused_s if statistics.median(fused_s) <= statistics.median(eager_s) else eager_s
            truth, _, _ = truth_of(other_s[0], best)  # 'fusion' here: the other executor is the faster
            row.choice_truth = {"fusion": "other", "eager": "own"}.get(truth, "noise")
            row.choice_verdict = choice_verdict_of(row.action == "switch", row.choice_truth)
            row.other_timed_by_guard = d is not None and "measured_other_us" in d.details
        row.fused_us, row.eager_us = round(statistics.median(fused_s), 3), round(statistics.median(eager_s), 3)
        row.truth, row.ratio_q1, row.ratio_q3 = truth_of(fused_s, eager_s)
        row.ratio_q1, row.ratio_q3 = round(row.ratio_q1, 3), round(row.ratio_q3, 3)
        row.verdict = verdict_of(row.action, row.truth)
        row.model_verdict = verdict_of(row.model_action, row.truth) if row.model_action else None
    info = {"compile_and_run_s": round(compile_s, 2), "measuring": dict(guard.report.measuring)}
    info["calibrations"] = list(guard.report.calibrations)
    return rows, info


def guarded_step(program: Program, device: str) -> Callable[[], None]:
    """One call of ``program`` (and its backward) jitted with a default, applied ``FusionGuard``."""
    import thunder

    from ..examine.calls import step
    from ..transform import FusionGuard

    fn, args, backward, options = program.build(device)
    if device != "cuda":
        from thunder.executors.torch_compile import torch_compile_ex

        options = {**options, "executors": [torch_compile_ex]}
    jitted = thunder.jit(fn, transforms=[FusionGuard()], **options)

    def run_once() -> None:
        step(jitted, args, {}, backward)
        if device == "cuda":
            torch.cuda.synchronize()

    return run_once
