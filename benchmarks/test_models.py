"""A nanoGPT block (forward, forward+backward) and litgpt models at 2 layers (heavy: opt in)."""

import pytest
from cases import bench_params, run_benchmark


@pytest.mark.parametrize("case,variant", bench_params("models"))
def test_models(benchmark, case, variant, device):
    run_benchmark(benchmark, case, variant, device)
