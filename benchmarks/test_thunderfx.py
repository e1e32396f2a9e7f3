"""ThunderFX: einops rearranges between graph breaks, through thunderfx with and without the guard."""

import pytest
from cases import bench_params, run_benchmark


@pytest.mark.parametrize("case,variant", bench_params("thunderfx"))
def test_thunderfx(benchmark, case, variant, device):
    run_benchmark(benchmark, case, variant, device)
