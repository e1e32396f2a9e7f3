"""The demo: an embedded example jitted with and without the guard, its decisions and per-call times.

Runs on CPU with Thunder's torch.compile executor, on CUDA with nvFuser (torch.compile where nvFuser is missing).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from einops import rearrange

from ..measure.timing import Timing, interleaved_rounds, quartiles, sync
from ..render.table import plural, text_table, wrapped
from ..wording import WIDTH


def rearrange_heads(scores: torch.Tensor) -> torch.Tensor:
    """The original report: an einops rearrange alone in a region."""
    return rearrange(scores, "b np sq sk -> (b np) sq sk")


def view_chain(x: torch.Tensor) -> torch.Tensor:
    """A chain of metadata ops: reshape, permute, slice, unsqueeze, expand."""
    y = x.reshape(x.shape[0], -1, x.shape[-1]).permute(0, 2, 1)[:, 1:, :]
    return y.unsqueeze(1).expand(-1, 2, -1, -1)


def banded_mask(scores: torch.Tensor) -> torch.Tensor:
    """A sliding-window mask built row by row in forward (litgpt's Mistral, in small): the guard folds the
    setitems and hoists the mask, computed once per compiled program."""
    t = scores.shape[-1]
    mask = torch.full((t, t), float("-inf"), device=scores.device)
    for i in range(t):
        mask[i, max(0, i - 3) : i + 1] = 0.0
    return scores + mask


def identity(x: torch.Tensor) -> torch.Tensor:
    """Nothing to do: a jitted call of it costs Thunder's own per-call work alone."""
    return x


def scaled_softmax(x: torch.Tensor) -> torch.Tensor:
    """Compute worth a fusion: the guard keeps it."""
    return torch.softmax(x * 0.125 + 1.0, dim=-1)


def _speedup(plain: list[float], guarded: list[float]) -> str:
    """Guarded against unguarded from their paired samples (one pair a round, so a slow moment of the machine
    weighs on both): the median ratio, or ``level`` where the middle half of the ratios holds 1 (no difference
    the rounds can tell apart from their own spread)."""
    ratios = [p / g if g > 0 else float("inf") for p, g in zip(plain, guarded, strict=True)]
    low, ratio, high = quartiles(ratios)
    if low <= 1.0 <= high and len(ratios) > 1:
        return f"level ({ratio:.2f}x)"
    return f"{ratio:.2f}x faster" if ratio >= 1 else f"{1 / ratio:.2f}x slower"


@dataclass
class Case:
    name: str
    fn: Callable[..., torch.Tensor]
    shape: tuple[int, ...]


CASES = [
    Case("mask built in forward", banded_mask, (4, 64, 64)),
    Case("einops rearrange", rearrange_heads, (2, 8, 128, 128)),
    Case("view chain", view_chain, (4, 16, 32, 64)),
    Case("scaled softmax", scaled_softmax, (64, 1024)),
]


ROUNDS = 20  # interleaved rounds a timing takes (fewer where fewer calls are asked for)


def _rounds(reps: int) -> int:
    return min(reps, ROUNDS)


def _timings(fns: list[Callable], x: torch.Tensor, reps: int) -> list[list[float]]:
    """Per-call µs of each of ``fns`` on ``x``, a sample a round: ``reps`` calls each (rounded down to whole
    rounds), in interleaved rounds (each function in turn, in a balanced order), so that a slow
    moment of the machine weighs on every variant alike."""
    rounds = interleaved_rounds(
        {i: (lambda fn=fn: fn(x)) for i, fn in enumerate(fns)},
        _rounds(reps),
        warmup=2,
        inner=reps // _rounds(reps),
        sync=lambda: sync(x.is_cuda),
    )
    return [[s * 1e6 for s in rounds.samples[i]] for i in range(len(fns))]


def _jit(fn, guard, executors: list, nvfuser: bool):
    import thunder

    transforms = [] if guard is None else [guard]
    # Thunder keeps nvFuser from forming shape-only regions by default; ask for them so the guard has work
    # (and let the guard override that request: the point of the demo is to show what it does with them).
    options = {"nv_enable_shape_only_fusion": True} if nvfuser else {}
    return thunder.jit(fn, executors=executors, transforms=transforms, **options)


def run_demo(
    *,
    device: str | None = None,
    reps: int = 200,
    progress: Callable[[str], None] | None = None,
    note: str = "",
    wide: bool = False,
) -> str:
    """Run every case unguarded, guarded and eager; return the decisions and timing table as text, in lines of at
    most 120 characters (``wide``: the tables one line a row, however long).

    ``progress`` gets a line as each case compiles and is timed; ``note`` ends the table (how it was timed).
    """
    from .._thunder import applied_fixes, enable_nvfuser_direct, fusion_executors
    from ..options import Rewrites
    from ..transform import FusionGuard

    if reps < 1:
        raise ValueError(f"run_demo: reps must be >= 1, got {reps}")
    say = progress or (lambda message: None)
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    cuda = device == "cuda"
    executors = fusion_executors(device)
    nvfuser = any(getattr(ex, "name", "") == "nvfuser" for ex in executors)
    guard = FusionGuard(rewrites=Rewrites(override_compile_options=nvfuser))
    where = torch.cuda.get_device_name() if cuda else "CPU"
    lines = [f"thunder-fusion-guard demo on {where} ({'nvFuser' if nvfuser else 'torch.compile executor'})"]
    if nvfuser:
        lines.append(
            "  (nvFuser: compiled with nv_enable_shape_only_fusion=True so lone views form regions, and "
            "FusionGuard(rewrites=Rewrites(override_compile_options=True)) so the guard may undo them; "
            "Thunder's defaults form none)"
        )
    if cuda:  # unguarded Thunder runs beside the guard: on nvfuser_direct-only builds it needs the opt-in
        enable_nvfuser_direct()
    lines += [f"  compat: {fix}" for fix in applied_fixes()]
    rows = []
    for i, case in enumerate(CASES, 1):
        say(f"[{i}/{len(CASES)}] {case.name}: compiling unguarded and guarded ...")
        began = time.perf_counter()
        x = torch.randn(case.shape, device=device)
        plain, guarded = _jit(case.fn, None, executors, nvfuser), _jit(case.fn, guard, executors, nvfuser)
        if not torch.equal(plain(x), guarded(x)):
            raise AssertionError(f"{case.name}: guarded output differs from unguarded thunder")
        compiled = time.perf_counter() - began
        say(f"[{i}/{len(CASES)}] {case.name}: compiled in {compiled:.1f} s; timing {plural(reps, 'call')} x 3 ...")
        rows.append((case.name, *_timings([plain, guarded, case.fn], x, reps)))
    say("Thunder's own per-call cost: timing an identity function, jitted ...")
    x = torch.randn(CASES[0].shape, device=device)
    floor = Timing.of(_timings([_jit(identity, None, executors, nvfuser)], x, reps)[0])
    width = None if wide else WIDTH
    table = [["case", "thunder µs", "guarded µs", "eager µs", "guarded vs thunder"]]
    table += [
        [name, *(Timing.of(t).text() for t in (plain, guarded, eager)), _speedup(plain, guarded)]
        for name, plain, guarded, eager in rows
    ]
    after = [
        f"(µs per call: median (first-third quartile) of {plural(_rounds(reps), 'round')} of "
        f"{plural(reps // _rounds(reps), 'call')} each, the variants in turn in every round; one process; "
        "outputs of guarded and unguarded are identical; guarded vs thunder: the median of the rounds' ratios, "
        "level where the middle half of them holds 1)",
        f"Thunder's per-call cost (prologue checks of the inputs, cache lookup, Python call): {floor.text()} µs, "
        "timed on a jitted identity function. Every jitted call pays it and no trace rewrite removes it: it is "
        "most of what separates guarded from eager above.",
        *([f"({note})"] if note else []),
    ]
    text = [part for line in lines for part in wrapped(line, width, "  ")]
    text += ["", guard.report.to_text(wide=wide), "", *text_table(table, width=width, wrap=(0,))]
    return "\n".join(text + [part for line in after for part in wrapped(line, width, "  ")])
