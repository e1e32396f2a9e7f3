"""The side-by-side profile (examine/versus.py, ``fusion-guard bench versus``): kinds of work from names, the
attribution of Thunder's fusion calls to their regions' kinds, the host parts of a Thunder program, the findings
from given numbers, and the command's argument checks. No timing is asserted: only structure, and findings
computed from numbers the test gives."""

import json

import pytest
import torch
from helpers import jit_cpu

from thunder_fusion_guard import FusionGuard
from thunder_fusion_guard.examine.versus import SideBySide, VariantProfile, Work, side_by_side
from thunder_fusion_guard.ops import WORK_KINDS, work_kind
from thunder_fusion_guard.tools.cli import main


@pytest.mark.parametrize(
    "names,kind",
    [
        (["aten::mm"], "matmul"),
        (["nvjet_sm90_tst_128x128_64x6_2x1_v_bz_NNT"], "matmul"),
        (["void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128>>"], "attention"),
        (["cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16"], "attention"),
        (["aten::_efficient_attention_forward"], "attention"),
        (["triton_poi_fused__to_copy_add_cat_mul_neg_slice_split_with_sizes_transpose_unsqueeze_view_1"], "rope"),
        (["triton_red_fused__to_copy_mean_mul_pow_rsqrt_0"], "norm"),
        (["triton_red_fused_add_native_layer_norm_view_4"], "norm"),
        (["triton_poi_fused__unsafe_view_mul_silu_3"], "activation"),
        (["triton_poi_fused_gelu_view_3"], "activation"),
        (["triton_poi_fused_embedding_dense_backward_12"], "embedding"),
        (["triton_red_fused__to_copy_mul_sum_view_1"], "reduction"),
        (["void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda>"], "copy"),
        (["Memset (Device)"], "copy"),
        (["prims.mul", "prims.sum", "prims.rsqrt", "prims.convert_element_type"], "norm"),
        (["prims.neg", "prims.exp", "prims.add", "prims.reciprocal", "prims.mul"], "elementwise"),
        (["prims.broadcast_in_dim", "prims.reshape"], "copy"),
        (["aten::nll_loss_forward"], "loss"),
        (["python_return"], "other"),
    ],
)
def test_work_kind_from_names(names, kind):
    assert kind in WORK_KINDS
    assert work_kind(names) == kind


def _norm_then_scale(x, w):
    y = x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-5)
    return (y * w).sin()


def test_thunder_fusion_calls_are_attributed_to_their_regions_kinds():
    """The guarded program's forward region (a norm: rsqrt, mean) gets its kind; its host time
    is split into prologue, traces and fusion calls; the eager variant's aten ops get theirs."""
    x = torch.randn(8, 32, requires_grad=True)
    w = torch.randn(32, requires_grad=True)
    guarded = jit_cpu(_norm_then_scale, FusionGuard())

    def step(fn):
        return lambda: fn(x, w).sum().backward()

    result = side_by_side(
        "norm",
        {"guarded": step(guarded), "eager": step(_norm_then_scale)},
        {"guarded": guarded},
        rounds=2,
        profiled_rounds=2,
        warmup=1,
    )
    mine, eager = result.profiles
    assert mine.variant == "guarded" and eager.variant == "eager"
    assert mine.work["forward norm"].host_us > 0, mine.work  # the region's call, timed on the host
    assert any(k.startswith("backward") and w.host_us > 0 for k, w in mine.work.items()), mine.work
    assert mine.fusion_calls == pytest.approx(2.0)  # one region forward, one backward, per step
    assert set(mine.host_parts) == {"prologue", "forward trace", "backward trace", "fusion calls"}
    assert all(v >= 0 for v in mine.host_parts.values())
    assert eager.host_parts == {} and eager.fusion_calls == 0
    assert any(k.startswith("forward") for k in eager.work) and any(k.startswith("backward") for k in eager.work)
    assert eager.launches > mine.launches  # op by op against one fusion call per pass (and a few torch ops)
    table = result.table()
    assert "forward norm" in table and "host of guarded: prologue" in table
    assert json.loads(json.dumps(result.to_dict()))["case"] == "norm"
    # the program runs as before once profiled: same outputs as unguarded after the instrumentation is gone
    assert torch.equal(guarded(x, w), jit_cpu(_norm_then_scale)(x, w))


def _profile(variant, step, host, device_us, work, parts=None, calls=0.0):
    return VariantProfile(variant, "cuda", step, host, device_us, 10.0, work, parts or {}, calls)


def test_findings_name_the_step_gap_the_kinds_behind_it_and_host_bound():
    guarded = _profile(
        "guarded",
        5760.0,
        5700.0,
        3150.0,
        {"forward norm": Work(200.0, 4), "backward matmul": Work(2000.0, 20)},
        {"prologue": 130.0, "forward trace": 1200.0, "backward trace": 2300.0, "fusion calls": 1600.0},
        calls=20.0,
    )
    inductor = _profile(
        "inductor", 5160.0, 4000.0, 3220.0, {"forward norm": Work(100.0, 2), "backward matmul": Work(2005.0, 20)}
    )
    found = SideBySide("llama", [guarded, inductor]).findings()
    assert found[0].startswith("guarded is behind inductor by 600 µs a step")
    assert "host-bound (its host time is 99% of the step)" in found[0]
    assert found[1].strip().startswith("forward norm: 200 vs 100 µs (+100)")
    assert not any("backward matmul" in f for f in found)  # 5 µs apart: within the gap thresholds
    assert "a fusion call costs 80 µs on the host" in found[-1]


def test_picture_has_one_bar_per_variant_and_row():
    a = _profile("guarded", 100.0, 90.0, 80.0, {"forward norm": Work(50.0, 1), "backward matmul": Work(30.0, 2)})
    b = _profile("inductor", 120.0, 60.0, 90.0, {"forward norm": Work(40.0, 1)})
    result = SideBySide("x<y", [a, b])
    svg = result.svg()
    assert svg.count("<title>") == 2 * 4  # step, host, forward norm, backward matmul; two variants each
    assert "<title>inductor: backward matmul 0.0 µs</title>" in svg
    page = result.html()
    assert page.count("<svg") == 1 and "x&lt;y" in page and "guarded is at or ahead of inductor" in page


def test_findings_when_ahead():
    a = _profile("guarded", 100.0, 50.0, 80.0, {})
    b = _profile("inductor", 120.0, 60.0, 90.0, {})
    assert SideBySide("x", [a, b]).findings() == ["guarded is at or ahead of inductor: 100 vs 120 µs"]


@pytest.mark.parametrize(
    "argv,message",
    [
        (
            ["bench", "versus", "no-such-case"],
            "case 'no-such-case' must name exactly one benchmark case; it matches: none",
        ),
        (["bench", "versus", "micro"], "case 'micro' must name exactly one benchmark case"),
        (["bench", "versus", "nanogpt-block-fwdbwd", "--variants", "fast"], "--variants"),
        (["bench", "versus", "nanogpt-block-fwdbwd", "--rounds", "0"], "--rounds"),
    ],
)
def test_versus_bad_arguments_are_one_line_before_any_work(capsys, monkeypatch, argv, message):
    import thunder_fusion_guard.examine.versus as versus

    monkeypatch.setattr(versus, "side_by_side", lambda *a, **k: pytest.fail("worked before checking arguments"))
    try:
        status = main([*argv, "--device", "cpu"])
    except SystemExit as e:
        status = e.code
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and len(err) == 1 and message in err[0], err


def test_versus_output_folder_is_checked_before_any_work(capsys, tmp_path, monkeypatch):
    import thunder_fusion_guard.bench.versus as bench_versus

    monkeypatch.setattr(bench_versus, "compile_variant", lambda *a, **k: pytest.fail("compiled before checking"))
    status = main(
        ["bench", "versus", "nanogpt-block-fwdbwd", "--device", "cpu", "--json", str(tmp_path / "no" / "x.json")]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and len(err) == 1 and "--json" in err[0], err
