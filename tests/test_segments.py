"""nvFuser segments on CPU: kernel-name and scheduled-IR parsing, and how kernel details reach the report."""

import pytest
import torch
from helpers import jit_cpu, regions
from test_thunderfx import Heads
from thunder.dynamo import thunderfx
from thunder.executors.torch_compile import torch_compile_ex

from thunder_fusion_guard import Costs, FusionGuard, collect_segments, explain
from thunder_fusion_guard.examine import segments
from thunder_fusion_guard.render.table import kernels_text

# The subject is not the code Inductor generates: regions run uncompiled (helpers.without_inductor).
pytestmark = pytest.mark.usefixtures("no_inductor_module")

POINTWISE = "nvf::nvfuser_pointwise_f0_c1_r0_g0(nvf::Tensor<float, 2, 2>, nvf::Tensor<float, 2, 2>)"
REDUCTION = "<unnamed>::nvfuser_reduction_f3_c1_r0_g2(nvf::Tensor<float, 2, 2>, nvf::Tensor<float, 1, 1>)"
PERSISTENT = "nvf::nvfuser_inner_outer_persistent_f12_c1_r0_g1(nvf::Tensor<__bfloat, 3, 3>)"
GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1"


@pytest.mark.parametrize(
    "name,scheduler,short",
    [
        (POINTWISE, "pointwise", "nvfuser_pointwise_f0_c1_r0_g0"),
        (REDUCTION, "reduction", "nvfuser_reduction_f3_c1_r0_g2"),
        (PERSISTENT, "inner_outer_persistent", "nvfuser_inner_outer_persistent_f12_c1_r0_g1"),
        ("nvfuser_transpose_f1_c2_r3_g4", "transpose", "nvfuser_transpose_f1_c2_r3_g4"),
        ("nvf::nvfuser_7(nvf::Tensor<float, 1, 1>)", "nvfuser", "nvf::nvfuser_7"),
        (GEMM, "aten", GEMM),
        (
            "void at::native::vectorized_elementwise_kernel<4>(int, float)",
            "aten",
            "void at::native::vectorized_elementwise_kernel<4>",
        ),
    ],
)
def test_kernel_names(name, scheduler, short):
    assert segments.scheduler_of(name) == scheduler
    assert segments.short_name(name) == short


SEGMENTED_IR = """Segmented_Fusion Dump: -- Re-written complete fusion:{
Inputs:
  T0_g_float[iS0{i0}, iS1{i2}]
Outputs:
  T3_g_float[iS6{i0}]

%kernel {
T1_l_float[iS2{i0}, iS3{i2}]
   = tanhf(T0_g_float[iS0{i0}, iS1{i2}]);
T2_l_float[iS4{i0}, rS5{i2}]
   = reduction( T1_l_float[iS2{i0}, iS3{i2}], op = add, initial value = float(0), allreduce = false )
T3_g_float[iS6{i0}]
   = T2_l_float[iS4{i0}, rS5{i2}]
   * double(2);
} // %kernel
} // {Re-written complete fusion}
Segmented_Fusion Dump: -- fusion segments:
Segmented_Fusion{
groups:
  g{(pointwise) ...}
  g{(reduction) ...}
} //Segmented_Fusion
Inputs:
  T0_g_float[iS0{i0}, iS1{i2}]
Outputs:
  T1_g_float[iS2{i0}, iS3{i2}]

%kernel {
T1_g_float[iblockIdx.x7{( ceilDiv(( i0 * i2 ), 128) )}, ithreadIdx.x8{128}] ca_pos( 2 )
   = tanhf(T0_g_float[iS0{i0}, iS1{i2}]);
} // %kernel
Inputs:
  T1_g_float[iS2{i0}, iS3{i2}]
Outputs:
  T3_g_float[iS6{i0}]

%kernel {
i5 = i0 * i2;
T2_l_float[iblockIdx.x9{i0}, rthreadIdx.x10{i2}] ca_pos( 1 ) produce_pos( 1 )
   = reduction( T1_g_float[iS2{i0}, iS3{i2}], op = add, initial value = float(0), allreduce = false )
T4_l_float[iS11{i0}] = Set( T2_l_float[iblockIdx.x9{i0}, rthreadIdx.x10{i2}], cache_op=Streaming )
T3_g_float[iS6{i0}]
   = T4_l_float[iS11{i0}]
   * double(2);
} // %kernel
"""

SINGLE_IR = """Inputs:
  T0_g_float[iS0{i0}]
Outputs:
  T2_g_float[iS4{i0}]

%kernel {
T1_l_float[iS2{i0}]
   = broadcast( T0_g_float[iS0{i0}], flags = {false} )
T2_g_float[iS4{i0}]
   = T1_l_float[iS2{i0}]
   + T1_l_float[iS2{i0}];
} // %kernel
"""


def test_ops_per_kernel_from_scheduled_ir():
    assert segments.ops_per_kernel(SEGMENTED_IR) == [["tanhf"], ["reduction", "Set", "*"]]
    assert segments.ops_per_kernel(SINGLE_IR) == [["broadcast", "+"]]
    assert segments.ops_per_kernel("") == []


def test_summarize_aligns_ops_with_the_kernels_nvfuser_generated():
    details = segments.summarize([POINTWISE, GEMM, REDUCTION], SEGMENTED_IR)
    assert details == {
        "kernels": 3,
        "kernel_names": ["nvfuser_pointwise_f0_c1_r0_g0", GEMM, "nvfuser_reduction_f3_c1_r0_g2"],
        "schedulers": ["pointwise", "aten", "reduction"],
        "segmented": True,
        "ops_per_kernel": [["tanhf"], [], ["reduction", "Set", "*"]],
    }
    single = segments.summarize([POINTWISE], SINGLE_IR)
    assert single["segmented"] is False and single["ops_per_kernel"] == [["broadcast", "+"]]
    assert "ops_per_kernel" not in segments.summarize([POINTWISE], SEGMENTED_IR), "2 blocks for 1 kernel: left out"
    assert "ops_per_kernel" not in segments.summarize([POINTWISE])
    assert segments.summarize([]) == {"kernels": 0, "kernel_names": [], "schedulers": [], "segmented": False}


def test_kernels_text():
    assert kernels_text({}) == ""
    assert kernels_text({"kernels": 1, "schedulers": ["pointwise"], "segmented": False}) == "1: pointwise"
    assert kernels_text(segments.summarize([POINTWISE, REDUCTION])) == "2 segmented: pointwise+reduction"
    assert kernels_text({"kernels": 0, "schedulers": []}) == "0"


def tanh_and_view(x):
    return torch.tanh(x * 2.0).sum(0), x.t()


def test_collect_segments_on_cpu_records_nothing():
    guard = FusionGuard()
    jitted = jit_cpu(tanh_and_view, guard)
    x = torch.randn(3, 4, requires_grad=True)
    assert collect_segments(jitted, x) == []
    assert collect_segments(jitted, x, executors=["torchcompile"]) == [], "no CUDA kernels on CPU"
    assert guard.report and all("kernels" not in d.details for d in guard.report)
    assert "kernels" not in explain(jitted).splitlines()[0].split()


def _fake_probe(seen):
    def probe(fn, args):
        seen.append((fn, args))
        return segments.summarize([POINTWISE, REDUCTION])

    return probe


def test_collected_kernels_reach_decisions_and_the_table(monkeypatch):
    seen = []
    monkeypatch.setattr(segments, "probe_region", _fake_probe(seen))
    guard = FusionGuard(costs=Costs(cost_model=False))
    jitted = jit_cpu(tanh_and_view, guard)
    x = torch.randn(3, 4, requires_grad=True)
    found = collect_segments(jitted, x, executors=["torchcompile"])
    kept = [*regions(jitted), *regions(jitted, backward=True)]
    assert [(k.trace, k.region) for k in found] == [("forward", r.name) for r in regions(jitted)] + [
        ("backward", r.name) for r in regions(jitted, backward=True)
    ]
    assert len(seen) == len(kept) and all(isinstance(args, tuple) and args for _, args in seen)
    assert all(k.subgraph is None and k.details["segmented"] for k in found)
    latest = max(d.compile_index for d in guard.report)
    region_decisions = [d for d in guard.report.filter(compile_index=latest) if d.details.get("scope") != "op"]
    for d in region_decisions:
        assert ("kernels" in d.details) == (d.action == "keep"), d
    header, *rest = explain(jitted, wide=True).splitlines()  # a row a line
    assert "kernels" in header.split()
    assert any("2 segmented: pointwise+reduction" in line for line in rest)
    assert region_decisions[-1].to_dict()["details"]["kernel_names"][0].startswith("nvfuser_pointwise")


def test_collect_segments_through_thunderfx(monkeypatch):
    monkeypatch.setattr(segments, "probe_region", _fake_probe([]))
    guard = FusionGuard(costs=Costs(cost_model=False))
    compiled = thunderfx(Heads(), transforms=[guard], executors=[torch_compile_ex])
    found = collect_segments(compiled, torch.randn(2, 3, 8, requires_grad=True), executors=["torchcompile"])
    assert found and {k.subgraph for k in found} <= set(guard.report.subgraphs)
    with_kernels = [d for d in guard.report if "kernels" in d.details]
    assert {(d.subgraph, d.trace, d.region) for d in with_kernels} == {(k.subgraph, k.trace, k.region) for k in found}
    assert "2 segmented" in explain(compiled)


@pytest.mark.parametrize("bad", ["nvfuser", [1]])
def test_collect_segments_bad_executors(bad):
    with pytest.raises(ValueError, match="'executors' must be a list of executor names"):
        collect_segments(jit_cpu(tanh_and_view), torch.randn(3, 4), executors=bad)


def test_device_kernels_keeps_kernel_launches_in_start_order():
    from types import SimpleNamespace

    from torch.autograd import DeviceType

    def event(name, start, device=DeviceType.CUDA):
        return SimpleNamespace(name=name, device_type=device, time_range=SimpleNamespace(start=start))

    events = [
        event(REDUCTION, 30),
        event("Memcpy HtoD (Pageable -> Device)", 5),
        event(POINTWISE, 10),
        event("aten::add", 1, DeviceType.CPU),
        event("Memset (Device)", 20),
    ]
    assert [e.name for e in segments.device_kernels(events)] == [POINTWISE, REDUCTION]
