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

Here: the run (:func:`run`); the corpus is in :mod:`.decisions_corpus`, measuring one program into rows in
:mod:`.decisions_measure`, the summary and its text in :mod:`.decisions_summary`.
"""

from __future__ import annotations

import gc
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from typing import Any

import torch

from ..wording import error_line
from .decisions_corpus import GROUPS, corpus
from .decisions_measure import NOISE, Row, measure_program
from .decisions_summary import _n, summarize
from .machine import machine_info


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
        except Exception as e:  # one program failing in any way must not lose the other programs' rows
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
