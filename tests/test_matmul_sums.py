"""The post-grad pass the guard hands Inductor for a whole graph: each matmul with a small result summed in a kernel
instead of a GEMM, as near the exact product as the GEMM, and nothing of torch's config changed."""

from __future__ import annotations

import pytest
import torch
from torch._inductor.utils import run_and_get_code

from thunder_fusion_guard._thunder import matmul_sums
from thunder_fusion_guard._thunder.matmul_sums import SMALL_RESULT, SUMMED_MATMULS, SummedMatmuls, summed_shape


def weight_gradient(x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """A weight's gradient as e3nn's and MACE's linears have it: a small result summed over many rows, its operands
    made by pointwise ops (the kernel the sum joins)."""
    return x.cos().t() @ g.exp()


def _compiled(x: torch.Tensor, g: torch.Tensor, options: dict | None) -> tuple[torch.Tensor, str]:
    module = torch.fx.symbolic_trace(weight_gradient)
    with torch._inductor.config.patch(fx_graph_cache=False):  # compiled here, not read from a cache
        out, code = run_and_get_code(lambda: torch._inductor.compile(module, [x, g], options)(x, g))
    return out, "\n".join(code)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_small_weight_gradient_is_summed_in_a_kernel_as_near_the_exact_product_as_the_gemm(dtype):
    torch.manual_seed(0)
    x, g = torch.randn(512, 8, dtype=dtype), torch.randn(512, 8, dtype=dtype)
    summed, code = _compiled(x, g, SUMMED_MATMULS)
    gemm, gemm_code = _compiled(x, g, None)
    assert "extern_kernels.mm" in gemm_code and "extern_kernels.mm" not in code
    exact = x.double().cos().t() @ g.double().exp()
    summed_error, gemm_error = ((r.double() - exact).abs().max().item() for r in (summed, gemm))
    # float32: another order of the same sums; bf16: both accumulate in float32 and round once
    ulp = torch.finfo(dtype).eps * exact.abs().max().item()
    assert summed_error <= gemm_error + ulp
    assert summed.dtype == dtype and summed.shape == (8, 8)


def test_a_matmul_with_a_larger_result_stays_a_gemm():
    x, g = torch.randn(512, 64), torch.randn(512, 128)  # 8192 values
    out, code = _compiled(x, g, SUMMED_MATMULS)
    assert "extern_kernels.mm" in code
    torch.testing.assert_close(out, weight_gradient(x, g))


def test_a_larger_threshold_sums_a_larger_result_under_its_own_cache_key():
    x, g = torch.randn(512, 64), torch.randn(512, 128)  # 8192 values
    out, code = _compiled(x, g, {"post_grad_custom_post_pass": SummedMatmuls(8192)})
    assert "extern_kernels.mm" not in code
    torch.testing.assert_close(out, weight_gradient(x, g))
    assert SummedMatmuls(8192).uuid() != SummedMatmuls().uuid()
    assert summed_shape(torch.empty(64, 2), torch.empty(2, 128), most=8192)


def test_the_shape_rule():
    t = torch.empty
    assert summed_shape(t(8, 512), t(512, 8))
    assert summed_shape(t(64, 2), t(2, 64))  # 4096 values
    assert not summed_shape(t(64, 2), t(2, 65))  # 4160
    assert not summed_shape(t(8, 1), t(1, 8))  # an outer product: nothing to sum
    assert not summed_shape(t(8, 4), t(4, 8, dtype=torch.float64))  # mixed dtypes
    assert not summed_shape(t(8, 4, dtype=torch.int64), t(4, 8, dtype=torch.int64))
    assert not summed_shape(t(2, 8, 4), t(4, 8))
    assert SMALL_RESULT == 4096


def test_the_pass_sorts_a_graph_left_out_of_order_before_it_inserts():
    """Inductor's matmul batching can leave a node after its user until Inductor's own sort, after this pass: the sum
    must still come after its operands."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    aten_module = torch.fx.experimental.proxy_tensor.make_fx(weight_gradient)(torch.randn(64, 8), torch.randn(64, 8))
    FakeTensorProp(aten_module, FakeTensorMode()).propagate(torch.randn(64, 8), torch.randn(64, 8))
    graph = aten_module.graph
    (mm,) = [n for n in graph.nodes if n.target is torch.ops.aten.mm.default]
    exp = mm.args[1]
    mm.append(exp)  # the exp now after the mm that reads it
    with pytest.raises(RuntimeError):
        graph.lint()
    SummedMatmuls()(graph)
    graph.lint()  # in order again
    assert not [n for n in graph.nodes if n.target is torch.ops.aten.mm.default]
    aten_module.recompile()
    x, g = torch.randn(64, 8), torch.randn(64, 8)
    torch.testing.assert_close(aten_module(x, g), weight_gradient(x, g))


def test_torchs_config_is_untouched_and_the_pass_has_a_stable_cache_key():
    x, g = torch.randn(128, 8), torch.randn(128, 8)
    _compiled(x, g, SUMMED_MATMULS)
    assert torch._inductor.config.post_grad_custom_post_pass is None
    assert SummedMatmuls().uuid() == SUMMED_MATMULS["post_grad_custom_post_pass"].uuid()
    assert isinstance(SummedMatmuls().uuid(), str)


def test_importing_the_pass_does_not_import_inductors_pattern_matcher():
    import subprocess
    import sys

    code = (
        "import sys, thunder_fusion_guard._thunder.matmul_sums as m; "
        "print('torch._inductor.pattern_matcher' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip().splitlines()[-1] == "False", done.stderr[-2000:]
    assert matmul_sums._stable_topological_sort() is not None
