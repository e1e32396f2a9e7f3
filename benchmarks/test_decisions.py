"""Decision accuracy per corpus program (``fusion-guard bench decisions`` under pytest-benchmark).

Each test measures one program's regions (the guard's decision against an interleaved A/B of the fusion
call and its eager lowering) and stores the rows and the confusion counts in ``extra_info``; what it
times is one guarded call of the program, so the JSON also tracks the guarded program's speed.
``TFG_BENCH_DEVICE`` picks the device (default: cuda when available).
"""

import os
from dataclasses import asdict

import pytest

from thunder_fusion_guard.bench import decisions
from thunder_fusion_guard.bench.cases import default_device

PROGRAMS = decisions.corpus(os.environ.get("TFG_BENCH_DEVICE") or default_device())


@pytest.mark.parametrize("program", PROGRAMS, ids=[f"{p.group}-{p.name}" for p in PROGRAMS])
def test_decisions(benchmark, program, device):
    rows, info = decisions.measure_program(program, device, reps=25, region_s=0.5)
    benchmark.group = f"decisions:{program.group}"
    benchmark.extra_info.update(
        device=device, split=program.split, summary=decisions.summarize(rows), rows=[asdict(r) for r in rows], **info
    )
    step = decisions.guarded_step(program, device)
    step()
    benchmark(step)
