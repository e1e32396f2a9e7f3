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


def _event(name, parent=None, kernels=(), start=0.0, end=None, thread=1, id=0, device=False, annotation=False):
    from torch.autograd import DeviceType

    return SimpleNamespace(
        name=name,
        id=id,
        is_user_annotation=annotation,
        device_type=DeviceType.CUDA if device else DeviceType.CPU,
        cpu_parent=parent,
        kernels=[SimpleNamespace(name=k, duration=us) for k, us in kernels],
        time_range=SimpleNamespace(start=start, end=start if end is None else end),
        thread=thread,
    )


def test_launches_take_their_phase_region_line_and_op_from_the_call_that_launched_them():
    forward = _event(PHASE + "forward", start=0.0, end=10.0)
    region = _event(REGION + "forward nvFusion0", forward, start=1.0, end=3.0)
    fused = _event("cuLaunchKernelEx", region, start=2.0, id=7)
    backward = _event(PHASE + "backward", start=10.0, end=20.0)
    mm = _event("aten::mm", start=12.0, end=13.0, thread=2)  # autograd's thread: no phase among its parents
    gemm = _event("cudaLaunchKernel", mm, start=12.5, thread=2, id=8)
    kernels = [
        _event("nvjet_tst_64x8", start=30.0, end=35.0, id=8, device=True),
        _event("nvfuser_pointwise_f0_c1_r0_g1", start=20.0, end=23.0, id=7, device=True),
        _event("Memset (Device)", start=36.0, end=36.5, id=9, device=True),  # its call was not recorded
        _event(PHASE + "forward", start=20.0, end=40.0, id=3, device=True),  # the range on the device's timeline
        # another library's range (Inductor's, say) mirrored on the device's timeline: no launch either
        _event("## Call CompiledFxGraph fabc ##", start=19.0, end=41.0, id=4, device=True, annotation=True),
    ]
    found = launches([forward, region, fused, backward, mm, gemm, *kernels], {"forward nvFusion0": "model.py:12"})
    assert [(x.phase, x.source, x.line, x.kind, x.device_us) for x in found] == [
        ("forward", "forward nvFusion0", "model.py:12", "nvFuser", 3.0),
        ("backward", "aten::mm", None, "GEMM", 5.0),
        (None, None, None, "memset/fill", 0.5),
    ]


def test_without_launch_calls_each_events_kernels_are_read_with_the_ranges_above_it():
    forward = _event(PHASE + "forward", start=0.0, end=10.0)
    region = _event(REGION + "forward nvFusion0", forward, start=1.0, end=4.0)
    owner = _event("aten::zero_", region, kernels=[("Memset (Device)", 0.5)], start=3.0)
    outside = _event("aten::mm", kernels=[("nvjet_tst", 2.0)], start=2.0)  # no parents: the ranges around it
    (first, second) = launches([forward, region, owner, outside], {"forward nvFusion0": "model.py:3"})
    assert (first.phase, first.source, first.line, first.kind) == ("forward", "forward nvFusion0", "model.py:3", "GEMM")
    assert (second.source, second.kind) == ("forward nvFusion0", "memset/fill")


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
