"""pytest-benchmark suites, opt-in: not under the project's testpaths, so ``python3 -m pytest`` skips them.

Run from the repo root: ``python3 -m pytest benchmarks/ [--benchmark-json OUT.json]``. The device is
``TFG_BENCH_DEVICE`` (default: cuda when available); heavy cases (litgpt models) need ``TFG_BENCH_HEAVY=1``;
``TFG_BENCH_VARIANTS=thunder,guarded,eager,inductor,inductor-ro`` adds torch.compile (as ``bench run --variants``).
"""

import os
import warnings

import pytest

from thunder_fusion_guard.bench.cases import default_device

warnings.filterwarnings("ignore")
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")


@pytest.fixture(scope="session")
def device() -> str:
    return os.environ.get("TFG_BENCH_DEVICE") or default_device()
