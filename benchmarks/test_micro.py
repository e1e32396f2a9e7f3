"""Lone-op programs per op kind, small and large: thunder vs guarded vs eager."""

import pytest
from cases import bench_params, run_benchmark


@pytest.mark.parametrize("case,variant", bench_params("micro"))
def test_micro(benchmark, case, variant, device):
    run_benchmark(benchmark, case, variant, device)
