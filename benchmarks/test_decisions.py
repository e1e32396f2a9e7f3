"""Decision accuracy per corpus program (``fusion-guard bench decisions`` under pytest-benchmark).

Each test measures one program's regions (the guard's decision against an interleaved A/B of the fusion
call and its eager lowering) and stores the rows and the confusion counts in ``extra_info``; what it
times is one guarded call of the program, so the JSON also tracks the guarded program's speed.
``TFG_BENCH_DEVICE`` picks the device (default: cuda when available).
"""

import os
from dataclasses import asdict

import pytest

from thunder_fusion_guard.bench.cases import default_device
from thunder_fusion_guard.bench.decisions_corpus import corpus
from thunder_fusion_guard.bench.decisions_measure import guarded_step, measure_program
from thunder_fusion_guard.bench.decisions_summary import summarize

PROGRAMS = corpus(os.environ.get("TFG_BENCH_DEVICE") or default_device())


@pytest.mark.parametrize("program", PROGRAMS, ids=[f"{p.group}-{p.name}" for p in PROGRAMS])
def test_decisions(benchmark, program, device):
    rows, info = measure_program(program, device, reps=25, region_s=0.5)
    benchmark.group = f"decisions:{program.group}"
    benchmark.extra_info.update(
        device=device, split=program.split, summary=summarize(rows), rows=[asdict(r) for r in rows], **info
    )
    step = guarded_step(program, device)
    step()
    benchmark(step)
