"""How often the guard's decisions agree with what is measured.

Each program of the corpus is jitted with a default ``FusionGuard(report_only=True)`` (it decides and
records, the traces keep every region), run once more recording every fusion call's real arguments
(:mod:`..examine.calls`), and each region is then timed as its own fusion call against its eager
lowering, interleaved (:func:`..measure.timing.interleaved_us`). The truth is the side that is faster
by more than the noise band; each decision is then right, a wrong reject, a wrong keep, or within noise.

The corpus: lone ops and short chains across sizes from 4 KiB to 32 MiB per tensor, every sixth op of
Thunder's OpInfo corpus (first float32 sample), the regions of a nanoGPT block (forward and backward)
and, on CUDA, litgpt training steps (one layer). Rows are split into ``tune`` and ``holdout`` halves by
a hash of the program's name: a change to the cost model should be tuned on one and judged on both.
"""

from __future__ import annotations

import gc
import hashlib
import math
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch

from ..measure.timing import quartiles
from ..render.table import text_table
from ..wording import error_line
from .machine import machine_info

GROUPS = ("ops", "nanogpt", "litgpt", "opinfo")
# Truth "within noise" when fused and eager medians differ by less than this, or the per-round ratios'
# interquartile range straddles 1.
NOISE = 0.05
LITGPT_CONFIGS = ("Llama-2-7b-hf", "phi-2")


@dataclass(frozen=True)
class Program:
    """One program of the corpus: ``build(device)`` gives (callable, args, backward, jit options)."""

    group: str
    name: str
    build: Callable[[str], tuple[Callable, tuple, bool, dict]]

    @property
    def split(self) -> str:
        digest = hashlib.sha256(f"{self.group}:{self.name}".encode()).digest()
        return "tune" if digest[0] % 2 == 0 else "holdout"


# --- the corpus ----------------------------------------------------------------------------------------

SIZES_KIB = (4, 256, 4096, 32768)


def _shape(kib: int) -> tuple[int, int]:
    numel = kib * 256
    cols = min(1024, numel)
    return numel // cols, cols


def _tail(x, b, r):
    return r + torch.nn.functional.gelu(x + b)


def _layer_norm(x):
    return torch.nn.functional.layer_norm(x, x.shape[-1:])


def _view_permute_softmax(x):
    return torch.softmax(x.view(x.shape[0], -1, 8).permute(0, 2, 1), dim=-1)


def _chain(x, y):
    return torch.where(x > 0, x + y, x - y).abs()


# name -> (function, how many (rows, cols) float inputs, extra inputs builder)
OPS: dict[str, tuple[Callable, Callable[[tuple[int, int], str], tuple]]] = {
    "add": (lambda x, y: x + y, lambda s, d: (torch.randn(s, device=d), torch.randn(s, device=d))),
    "mul": (lambda x, y: x * y, lambda s, d: (torch.randn(s, device=d), torch.randn(s, device=d))),
    "cast": (lambda x: x.to(torch.bfloat16), lambda s, d: (torch.randn(s, device=d),)),
    "copy_": (lambda dst, src: dst.copy_(src), lambda s, d: (torch.randn(s, device=d), torch.randn(s, device=d))),
    "where": (
        lambda c, x, y: torch.where(c, x, y),
        lambda s, d: (torch.rand(s, device=d) < 0.5, torch.randn(s, device=d), torch.randn(s, device=d)),
    ),
    "softmax": (lambda x: torch.softmax(x, -1), lambda s, d: (torch.randn(s, device=d),)),
    "layer_norm": (_layer_norm, lambda s, d: (torch.randn(s, device=d),)),
    "sum": (lambda x: x.sum(-1), lambda s, d: (torch.randn(s, device=d),)),
    "gelu-tail": (
        _tail,
        lambda s, d: (torch.randn(s, device=d), torch.randn(s[-1], device=d), torch.randn(s, device=d)),
    ),
    "add-where-abs": (_chain, lambda s, d: (torch.randn(s, device=d), torch.randn(s, device=d))),
    "view-permute-softmax": (_view_permute_softmax, lambda s, d: (torch.randn(s, device=d),)),
}


def _op_program(op: str, kib: int) -> Program:
    fn, make = OPS[op]

    def build(device: str):
        torch.manual_seed(0)
        options = {"nv_enable_shape_only_fusion": True} if device == "cuda" else {}
        return fn, make(_shape(kib), device), False, options

    return Program("ops", f"{op}-{kib}KiB", build)


def _nanogpt(device: str):
    from thunder.tests.nanogpt_model import Block, GPTConfig

    cuda = device == "cuda"
    torch.manual_seed(0)
    config = GPTConfig(n_embd=768 if cuda else 64, n_head=12 if cuda else 4, block_size=512, dropout=0.0)
    batch, tokens = (4, 512) if cuda else (2, 32)
    dtype = torch.bfloat16 if cuda else torch.float32
    block = Block(config).to(device=device, dtype=dtype)
    x = torch.randn(batch, tokens, config.n_embd, device=device, dtype=dtype, requires_grad=True)
    return block, (x,), True, {}


def _litgpt(name: str) -> Callable[[str], tuple]:
    def build(device: str):
        import litgpt
        from litgpt.model import GPT

        torch.manual_seed(0)
        config = litgpt.Config.from_name(name, n_layer=1)
        with torch.device(device):
            model = GPT(config).to(torch.bfloat16)
        model.max_seq_length = 512
        x = torch.randint(0, config.padded_vocab_size, (1, 512), device=device)
        return model, (x,), True, {}

    return build


def _opinfo_programs(device: str, every: int = 6) -> list[Program]:
    import thunder.core.devices as devices
    import thunder.core.dtypes as dtypes
    from thunder.tests.opinfos import opinfos

    devicetype = devices.to_device(device).devicetype
    ops = [o for o in opinfos if devicetype in o.devicetypes() and dtypes.float32 in o.dtypes()]
    programs = []
    for op in ops[::every]:

        def build(device: str, op=op):
            torch.manual_seed(0)
            sample = next(iter(op.sample_inputs(device, dtypes.float32, requires_grad=False)))
            if sample.kwargs:
                kwargs = dict(sample.kwargs)
                return (lambda *a: op.op(*a, **kwargs)), tuple(sample.args), False, {}
            return op.op, tuple(sample.args), False, {}

        programs.append(Program("opinfo", op.name, build))
    return programs


def corpus(device: str, groups: Sequence[str] = GROUPS, quick: bool = False) -> list[Program]:
    """The programs of ``groups`` for ``device``; ``quick``: two small ops only (for tests)."""
    if quick:
        return [_op_program("add", 4), _op_program("softmax", 4)]
    programs: list[Program] = []
    if "ops" in groups:
        programs += [_op_program(op, kib) for op in OPS for kib in SIZES_KIB]
    if "nanogpt" in groups:
        programs.append(Program("nanogpt", "block-fwdbwd", _nanogpt))
    if "litgpt" in groups and device == "cuda":
        programs += [Program("litgpt", f"{name}-1layer-fwdbwd", _litgpt(name)) for name in LITGPT_CONFIGS]
    if "opinfo" in groups:
        programs += _opinfo_programs(device)
    return programs


# --- measuring one program -----------------------------------------------------------------------------


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
        except Exception as e:
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


# --- summarising ---------------------------------------------------------------------------------------

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


# --- the run ---------------------------------------------------------------------------------------


def run(
    device: str,
    groups: Sequence[str] = GROUPS,
    *,
    reps: int = 25,
    region_s: float = 0.5,
    time_limit_s: float | None = None,
    quick: bool = False,
    log: Callable[[str], None] = lambda m: print(m, file=sys.stderr, flush=True),
    after_each: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Measure the corpus on ``device``; the JSON document ``--json`` writes (rows, per-program info, summary).

    ``after_each`` gets the document so far after every program, so a run cut short keeps what it measured.
    """
    programs = corpus(device, groups, quick)
    began = time.perf_counter()
    rows: list[Row] = []
    info: dict[str, Any] = {}
    skipped: list[str] = []

    def document() -> dict[str, Any]:
        return {
            "machine_info": machine,
            "device": device,
            "noise": NOISE,
            "seconds": round(time.perf_counter() - began, 1),
            "skipped": skipped,
            "programs": info,
            "rows": [asdict(r) for r in rows],
            "summary": summarize(rows),
        }

    machine = machine_info(device)
    for i, program in enumerate(programs, 1):
        label = f"{program.group}:{program.name}"
        if time_limit_s is not None and time.perf_counter() - began > time_limit_s:
            skipped.append(label)
            continue
        log(f"[{i}/{len(programs)}] {label} ...")
        try:
            got, info[label] = measure_program(program, device, reps, region_s)
        except Exception as e:
            info[label] = {"error": error_line(e)}
            log(f"[{i}/{len(programs)}] {label} FAILED: {info[label]['error']}")
        else:
            rows += got
        if device == "cuda":
            gc.collect()
            torch.cuda.empty_cache()
        if after_each is not None:
            after_each(document())
    if skipped:
        log(f"time limit: {_n(len(skipped), 'program')} not run: {', '.join(skipped)}")
    return document()


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
