"""``fusion-guard kernels``'s counting: kernel kinds from real kernel names, launches read off profiler events (the
phase, the region and its user line, the ATen op), the table, and the region ranges a Thunder program runs in."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import thunder
import torch

from thunder_fusion_guard import FusionGuard, fusion_executors
from thunder_fusion_guard.examine.kernel_histogram import (
    PHASE,
    REGION,
    KernelHistogram,
    Launch,
    format_histograms,
    kernel_kind,
    labeled_regions,
    launches,
)


@pytest.mark.parametrize(
    ("name", "op", "kind"),
    [
        ("nvfuser_pointwise_f0_c1_r0_g1", None, "nvFuser"),
        ("triton_poi_fused_add_mul_0", None, "Triton"),
        ("triton_red_fused_sum_1", None, "Triton"),
        ("Memset (Device)", None, "memset/fill"),
        (
            "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, ...>",
            "aten::fill_",
            "memset/fill",
        ),
        ("Memcpy DtoD (Device -> Device)", None, "copy"),
        ("void at::native::elementwise_kernel<128, 4, ...>", "aten::copy_", "copy"),
        ("void at::native::(anonymous namespace)::CatArrayBatchedCopy<...>", "aten::cat", "copy"),
        ("sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x32", None, "GEMM"),
        ("nvjet_tst_64x8_64x16_4x1_v_bz_TNN", "aten::mm", "GEMM"),
        ("void cutlass::Kernel2<cutlass_80_simt_sgemm_128x64_8x5_nn_align1>(...)", "aten::bmm", "GEMM"),
        (
            "void at::native::indexFuncLargeIndex<float, long, unsigned int, 2, 2, -2, true, ...>",
            "aten::index_add_",
            "index/scatter",
        ),
        ("void at::native::_scatter_gather_elementwise_kernel<128, 8, ...>", "aten::scatter_add_", "index/scatter"),
        ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, ...>>", "aten::sum", "reduction"),
        (
            "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, ...>",
            "aten::add",
            "elementwise",
        ),
        ("nvf::nvfuser_reduction_f0_c1_r0_g12(nvf::Tensor<float, 2, 2>)", None, "nvFuser"),
        ("CUDAGeneratedKernel", None, "nvFuser"),
        ("void cublasLt::splitKreduce_kernel<32, 16, int, float>", None, "GEMM"),
        ("std::enable_if<!(false), void>::type internal::gemvx::kernel<int, int, float>", None, "GEMM"),
        ("void some_library_kernel<float>(...)", None, "other"),
    ],
)
def test_kernel_kinds(name, op, kind):
    assert kernel_kind(name, op) == kind


def _event(name, parent=None, kernels=(), start=0.0, end=None, thread=1):
    return SimpleNamespace(
        name=name,
        cpu_parent=parent,
        kernels=[SimpleNamespace(name=k, duration=us) for k, us in kernels],
        time_range=SimpleNamespace(start=start, end=start if end is None else end),
        thread=thread,
    )


def test_launches_take_their_phase_region_line_and_op_from_the_ranges_above_them():
    forward = _event(PHASE + "forward")
    region = _event(REGION + "forward nvFusion0", forward)
    launch = _event("cuLaunchKernel", region, [("nvfuser_pointwise_f0_c1_r0_g1", 3.0)], start=2.0)
    backward = _event(PHASE + "backward")
    mm = _event("aten::mm", backward)
    gemm = _event("cudaLaunchKernel", mm, [("nvjet_tst_64x8", 5.0), ("splitKreduce_kernel", 1.0)], start=5.0)
    zero = _event("aten::zero_", _event("aten::zeros", backward))
    memset = _event("cudaMemsetAsync", zero, [("Memset (Device)", 0.5)], start=1.0)
    found = launches([forward, region, launch, backward, mm, gemm, zero, memset], {"forward nvFusion0": "model.py:12"})
    assert [(x.phase, x.source, x.line, x.kind) for x in found] == [
        ("backward", "aten::zero_", None, "memset/fill"),  # launched first
        ("forward", "forward nvFusion0", "model.py:12", "nvFuser"),
        ("backward", "aten::mm", None, "GEMM"),
        ("backward", "aten::mm", None, "GEMM"),
    ]
    assert sum(x.device_us for x in found) == 9.5


def test_a_launch_without_parents_takes_the_ranges_around_it_on_its_thread():
    backward = _event(PHASE + "backward", start=10.0, end=20.0)
    region = _event(REGION + "backward nvFusion3", start=11.0, end=12.0)
    elsewhere = _event(REGION + "backward nvFusion4", start=11.0, end=12.0, thread=2)
    launch = _event("cuLaunchKernelEx", kernels=[("nvfuser_reduction_f0_c1_r0_g1", 2.0)], start=11.5)
    (found,) = launches([backward, region, elsewhere, launch], {"backward nvFusion3": "model.py:7"})
    assert (found.phase, found.source, found.line, found.kind) == (
        "backward",
        "backward nvFusion3",
        "model.py:7",
        "nvFuser",
    )


def test_the_table_counts_each_kind_per_path_and_fits_120_columns():
    guarded = KernelHistogram(
        "guarded",
        [
            Launch("nvfuser_pointwise_f0_c1_r0_g1", "nvFuser", 2.0, "forward", "forward nvFusion0", "model.py:12"),
            Launch("nvjet_tst", "GEMM", 4.0, "forward", "aten::mm"),
            Launch("nvjet_tst", "GEMM", 4.0, "backward", "aten::mm"),
        ],
    )
    inductor = KernelHistogram("inductor", [Launch("triton_poi_fused_0", "Triton", 3.0, "forward", None)])
    text = format_histograms([guarded, inductor])
    assert all(len(line) <= 120 for line in text.splitlines())
    rows = {line.split()[0]: line.split()[1:] for line in text.splitlines() if line.split()}
    assert rows["GEMM"] == ["2", "8", "-", "-"] and rows["Triton"] == ["-", "-", "1", "3"]
    assert rows["total"] == ["3", "10", "1", "3"]
    assert "forward nvFusion0 (model.py:12)" in text
    assert guarded.to_dict()["by_kind"]["GEMM"] == {"kernels": 2, "device_us": 8.0}


def _gelu_ish(x, w):
    return torch.tanh(x @ w) * 0.5 + x


def test_each_region_call_runs_in_a_range_naming_it_and_its_user_line():
    """On CPU there are no kernels, but the ranges are the ones a CUDA step's launches are read under."""
    from torch.profiler import ProfilerActivity, profile

    x, w = torch.randn(8, 8, requires_grad=True), torch.randn(8, 8, requires_grad=True)
    guard = FusionGuard()
    jitted = thunder.jit(_gelu_ish, executors=fusion_executors("cpu"), transforms=[guard])
    jitted(x, w).sum().backward()
    with labeled_regions(jitted) as lines, profile(activities=[ProfilerActivity.CPU]) as prof:
        jitted(x, w).sum().backward()
    ranges = {e.name[len(REGION) :] for e in prof.events() if e.name.startswith(REGION)}
    kept = {f"{d.trace} {d.region}" for d in guard.report if d.about_region and d.action == "keep"}
    assert kept and kept <= ranges
    assert all(line.startswith("test_kernel_histogram.py:") for line in lines.values()) and lines
    torch.testing.assert_close(jitted(x, w), _gelu_ish(x, w))  # the program is Thunder's own again
