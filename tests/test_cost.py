"""The cost model on CPU (torch.compile executor): small exact regions go eager, big fused chains stay."""

import contextlib

import pytest
import torch
from helpers import assert_same, jit_cpu, regions, run_with_grads

from thunder_fusion_guard import Costs, FusionGuard
from thunder_fusion_guard.cost import CostConstants
from thunder_fusion_guard.measure.calibrate import lookup, shipped
from thunder_fusion_guard.ops import EXACT_OPS, ROUNDING_OPS, exactness_reason, known_to_round

CPU = shipped("cpu", "torchcompile")


def lone_add(a, b):
    return a + b


def pointwise_chain(x):
    y = x + 1.0
    y = y * 0.5
    y = y - 3.0
    y = torch.abs(y)
    return torch.maximum(y, x)


def test_shipped_cpu_constants_exist():
    assert CPU is not None and CPU.source.startswith("shipped")
    assert lookup("cpu", "torchcompile") is not None


def test_lone_small_add_is_rejected():
    a, b = torch.randn(16, 16, requires_grad=True), torch.randn(16, 16, requires_grad=True)
    guard = FusionGuard(strict=True, costs=Costs(calibration=CPU))
    guarded, plain = jit_cpu(lone_add, guard), jit_cpu(lone_add)
    assert_same(*[run_with_grads(guarded, [a, b])[0], run_with_grads(plain, [a, b])[0]])
    assert regions(guarded) == []
    (d,) = guard.report.filter(trace="forward")
    assert d.action == "reject" and d.details["decided_by"] == "model" and d.details["model_action"] == "reject"
    assert d.estimates["est_eager_us"] < d.estimates["est_region_us"]


def test_big_pointwise_chain_is_kept():
    x = torch.randn(2048, 2048)
    guard = FusionGuard(strict=True, costs=Costs(calibration=CPU))
    guarded = jit_cpu(pointwise_chain, guard)
    assert torch.equal(guarded(x), jit_cpu(pointwise_chain)(x))
    assert len(regions(guarded)) == 1
    (d,) = guard.report
    assert d.action == "keep" and d.details["model_action"] == "keep" and d.details["decided_by"] == "model"
    assert d.estimates["est_region_us"] < d.estimates["est_eager_us"]
    # the cost model decided (its code), exactness (abs, mul) is the aside
    assert d.code == "cost_model" and d.details["inexact"] == ["abs", "mul"]


# Eager ops cost a third of the CPU's: small regions lose to eager by far, whatever is measured.
CHEAP_EAGER = dict(CPU.to_dict(), eager_op_us=CPU.eager_op_us / 3)


def test_small_chain_with_mul_and_add_stays_fused_when_exact_only():
    x = torch.randn(8, 8)
    guard = FusionGuard(costs=Costs(calibration=CHEAP_EAGER))
    jit_cpu(pointwise_chain, guard)(x)
    (d,) = guard.report
    assert d.action == "keep" and d.code == "exactness" and d.details["decided_by"] == "exactness"
    assert d.details["model_action"] == "reject" and d.details["inexact"] == ["abs", "mul"]
    # exactness decided it (its code); the numbers, an aside, say eager looks cheaper
    assert d.estimates["est_eager_us"] < d.estimates["est_region_us"]


def set_row_from(x, y):
    z = x + 1
    z[0] = y[0]  # a tensor value: Thunder's copy_with_setitem stays (the fold takes Python numbers only)
    return z


def test_exactness_reason_tells_ops_that_round_from_ops_not_known_to_be_exact():
    """copy_with_setitem only moves data, but nobody showed it gives a fusion's bits outside it: the reason
    must not say that it rounds. Ops known to round still 'could round differently'."""
    guard = FusionGuard(costs=Costs(calibration=CHEAP_EAGER, measure_budget_s=0))
    x, y = torch.randn(4, 4), torch.randn(4, 4)
    assert torch.equal(jit_cpu(set_row_from, guard)(x, y), set_row_from(x, y))
    (d,) = guard.report
    assert d.action == "keep" and d.details["decided_by"] == "exactness"
    assert d.code == "exactness" and d.facts["inexact"] == ["copy_with_setitem"]  # its words: test_reasons.py
    assert exactness_reason(["exp", "sum"]) == "ops ['exp', 'sum'] could round differently outside the fusion, op by op"
    hazard = "t1: float32 rounded to bfloat16 and read again inside the region (by add), a rounding the fusion may skip"
    both = exactness_reason(["copy_with_setitem", "div", hazard])
    assert both.startswith(f"ops ['div', '{hazard}'] could round differently outside the fusion, op by op; ")
    assert both.endswith("; ops ['copy_with_setitem'] are not known to give the same bits outside the fusion")
    assert "-0.0 for +0.0" in exactness_reason(["abs"]) and "round" not in exactness_reason(["abs"])
    assert known_to_round("exp") and known_to_round("mul") and not known_to_round("copy_with_setitem")
    assert not set(ROUNDING_OPS) & set(EXACT_OPS)


@pytest.mark.usefixtures("no_inductor")
def test_the_headline_is_what_decided_a_region_the_fusion_wins_anyway():
    """An inexact region the cost model keeps (the fusion is cheaper) is kept by the cost model, not "for
    exactness": the reason leads with the numbers, exactness is the aside."""
    x = torch.randn(256, 1024)  # big enough for the shipped CPU constants to favour the fusion
    guard = FusionGuard(costs=Costs(calibration=CPU.to_dict(), measure_budget_s=0))
    jit_cpu(lambda t: torch.softmax(t * 2.0, dim=-1), guard)(x)
    (d,) = guard.report
    assert d.estimates["est_region_us"] < d.estimates["est_eager_us"]
    assert d.details["decided_by"] == "model" and d.action == "keep"
    assert d.code == "cost_model" and d.details["inexact"] == ["amax", "div", "exp", "mul", "sum"]


def test_exact_only_off_rejects_small_inexact_regions():
    x = torch.randn(8, 8)
    guard = FusionGuard(exact_only=False, costs=Costs(calibration=CHEAP_EAGER, measure_budget_s=0))
    guarded = jit_cpu(pointwise_chain, guard)
    torch.testing.assert_close(guarded(x), pointwise_chain(x))
    assert regions(guarded) == []


@pytest.mark.usefixtures("no_inductor")
def test_cost_model_off_keeps_compute():
    guard = FusionGuard(costs=Costs(calibration=CPU, cost_model=False))
    jit_cpu(lone_add, guard)(torch.randn(4), torch.randn(4))
    assert {d.action for d in guard.report} == {"keep"}


@pytest.mark.usefixtures("no_inductor")
def test_hand_set_constants_and_estimates_in_report():
    slow_eager = dict(CPU.to_dict(), eager_op_us=1000.0)
    slow_eager.pop("source")
    guard = FusionGuard(costs=Costs(calibration=slow_eager))
    jit_cpu(lone_add, guard)(torch.randn(4), torch.randn(4))
    (d,) = guard.report
    assert d.action == "keep" and d.estimates["est_eager_us"] >= 1000
    (row,) = [line for line in str(guard.report).splitlines() if line.startswith("lone_add#")]
    assert "/" in row


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"costs": {"margin": 1.5}}, "'costs.margin' must be a number in \\[0, 1\\)"),
        ({"costs": {"calibration": "fast"}}, "'costs.calibration' must be one of"),
        ({"costs": {"calibration": {"fusion_call_us": 1.0}}}, "missing fields"),
        ({"costs": {"calibration": dict(CPU.to_dict(), eager_gbps=-1)}}, "'eager_gbps' must be a positive number"),
        (
            {"costs": {"calibration": dict(CPU.to_dict(), bandwidth_curve=[[100, 1.0], [50, 2.0]])}},
            "'bandwidth_curve' must",
        ),
        ({"costs": {"calibration": dict(CPU.to_dict(), bandwidth_curve=[[100, -1.0]])}}, "'bandwidth_curve' must"),
        ({"costs": {"calibration": dict(CPU.to_dict(), bandwidth_curve="fast")}}, "'bandwidth_curve' must"),
        ({"costs": {"calibration": dict(CPU.to_dict(), op_ns={"tanh": -1})}}, "'op_ns' must map op names to numbers"),
        ({"costs": {"calibration": dict(CPU.to_dict(), matmul_gflops=True)}}, "'matmul_gflops' must be a number"),
        ({"exact_only": "no"}, "'exact_only'"),
    ],
)
def test_bad_cost_options(kwargs, match):
    with pytest.raises(ValueError, match=match):
        FusionGuard(**kwargs)


def test_constants_round_trip():
    assert CostConstants.from_dict(CPU.to_dict()) == CPU


# --- bandwidth by size and compute beyond bytes (CPU constants) -----------------------------------------

PLAIN = dict(
    fusion_call_us=10.0, fusion_gbps=20.0, eager_op_us=1.0, eager_meta_us=0.5, eager_gbps=10.0, overlapped=False
)


def test_bandwidth_curve_is_interpolated_in_log_bytes_and_held_past_its_ends():
    c = CostConstants.from_dict(dict(PLAIN, bandwidth_curve=[[1000, 100.0], [100000, 10.0]]))
    assert c.gbps(10, fused=False) == 100.0 and c.gbps(10**9, fused=False) == 10.0
    assert c.gbps(10000, fused=False) == pytest.approx(55.0)  # half-way in log(bytes)
    assert c.gbps(10000, fused=True) == pytest.approx(110.0), "scaled by fusion_gbps / eager_gbps"
    flat = CostConstants(**PLAIN)
    assert flat.gbps(10, fused=False) == flat.gbps(10**9, fused=False) == 10.0


def tanh_add(x, y):
    return torch.tanh(x) + y


def select(c, x, y):
    return torch.where(c, x, y)


def project(x, w):
    return x @ w


def _decision(fn, args, constants):
    guard = FusionGuard(costs=Costs(calibration=constants, measure_budget_s=0))
    jit_cpu(fn, guard)(*args)
    (d,) = guard.report
    return d.estimates


@pytest.mark.usefixtures("no_inductor")
def test_op_costs_add_per_element_on_both_sides_and_where_only_eagerly():
    x, y = torch.randn(64, 64), torch.randn(64, 64)
    base = _decision(tanh_add, [x, y], PLAIN)
    costed = _decision(tanh_add, [x, y], dict(PLAIN, op_ns={"tanh": 2.0}))
    extra = 2.0 * x.numel() / 1e3
    assert costed["est_eager_us"] == pytest.approx(base["est_eager_us"] + extra, abs=1e-3)
    assert costed["est_region_us"] == pytest.approx(base["est_region_us"] + extra, abs=1e-3)

    c = torch.rand(64, 64) < 0.5
    base = _decision(select, [c, x, y], PLAIN)
    costed = _decision(select, [c, x, y], dict(PLAIN, op_ns={"where": 2.0}))
    assert costed["est_eager_us"] == pytest.approx(base["est_eager_us"] + extra, abs=1e-3)
    assert costed["est_region_us"] == base["est_region_us"], "a fusion selects without branching"


@pytest.mark.usefixtures("no_inductor")
def test_matmul_costs_its_flops():
    x, w = torch.randn(32, 48), torch.randn(48, 16)
    base = _decision(project, [x, w], PLAIN)
    costed = _decision(project, [x, w], dict(PLAIN, matmul_gflops=2.0))
    flops_us = 2 * 32 * 16 * 48 / 2e3
    assert costed["est_eager_us"] == pytest.approx(base["est_eager_us"] + flops_us, abs=1e-3)
    assert costed["est_region_us"] == pytest.approx(base["est_region_us"] + flops_us, abs=1e-3)


def test_shipped_cpu_constants_have_the_curve_and_op_costs():
    assert len(CPU.bandwidth_curve) >= 2 and dict(CPU.op_ns)["tanh"] > 0 and CPU.matmul_gflops > 0
    assert CostConstants.from_dict(CPU.to_dict()) == CPU


def test_an_executor_that_fuses_only_some_ops_is_not_calibrated_and_says_so_quietly(monkeypatch, caplog):
    """ThunderFX's torchcompile_xentropy fuses only cross-entropy: the probe finds no region to time, and
    auto-calibration says why at INFO (no warning on every ThunderFX compile)."""
    import logging

    import thunder_fusion_guard.measure.calibrate as calibrate

    with pytest.raises(calibrate.NotCalibratable, match="0 fusion regions of the probe"):
        calibrate._probe("torchcompile_xentropy", calibrate._add, [torch.randn(4), torch.randn(4)])

    def fuses_nothing(device, executor, budget_s=None, **_):
        calibrate._probe(executor, calibrate._add, [torch.randn(4), torch.randn(4)])

    monkeypatch.setattr(calibrate, "measure", fuses_nothing)
    with caplog.at_level(logging.INFO, logger="thunder_fusion_guard"):
        constants, note, _ = calibrate.auto_calibrate("cpu", "torchcompile_xentropy", 1.0)
    assert constants is None and note.startswith("not calibrated: it makes 0 fusion regions"), note
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text


def convolutions(fn, *args, backward: bool = False) -> list:
    """The ``convolution`` ops of unguarded Thunder's regions of ``fn(*args)`` (with ``backward``, of its backward)."""
    from thunder_fusion_guard import _thunder as th

    jitted = jit_cpu(fn)
    out = jitted(*args)
    if backward:
        out.sum().backward()
    found = []
    for region in regions(jitted, backward=backward):
        for bsym in region.body:
            found.extend(s for s in [bsym, *th.subsymbols(bsym)] if th.op_name(s) == "convolution")
    return found


@pytest.mark.usefixtures("no_inductor")
@pytest.mark.parametrize(
    "shape, weight, options, flops",
    [
        # out (2, 6, 5, 5) = 300 elements, each 2 (channels per group) * 9 kernel elements
        ((2, 4, 9, 9), (6, 2, 3, 3), dict(stride=2, padding=1, groups=2), 2 * 300 * 18),
        # dilation 2: length 20 - 2 * 4 = 12, out (1, 8, 12)
        ((1, 3, 20), (8, 3, 5), dict(dilation=2), 2 * 96 * 15),
        # padding 2 on a 3x3x3 kernel: out (1, 4, 6, 6, 6), depthwise (1 channel per group)
        ((1, 4, 4, 4, 4), (4, 1, 3, 3, 3), dict(padding=2, groups=4), 2 * 864 * 27),
    ],
)
def test_convolution_flops_count_each_output_element_times_its_window(shape, weight, options, flops):
    from thunder_fusion_guard.cost import compute_us, convolution_flops

    gen = torch.Generator().manual_seed(4)
    x, w = torch.randn(shape, generator=gen), torch.randn(weight, generator=gen)
    conv = {3: torch.nn.functional.conv1d, 4: torch.nn.functional.conv2d, 5: torch.nn.functional.conv3d}[len(shape)]
    (op,) = convolutions(lambda a, b: conv(a, b, **options).neg(), x, w)
    assert convolution_flops(op) == flops
    one_gflops = CostConstants.from_dict({**CPU.to_dict(), "matmul_gflops": 1.0})  # 1e3 FLOPs a µs
    assert compute_us(op, one_gflops, fused=False) == compute_us(op, one_gflops, fused=True) == flops / 1e3


@pytest.mark.usefixtures("no_inductor")
@pytest.mark.parametrize(
    "stride, input_grad, weight_grad", [(1, 2 * 800 * 54, 2 * 216 * 128), (2, 2 * 648 * 54, 2 * 216 * 32)]
)
def test_a_convolutions_backward_is_counted_as_convolutions(stride, input_grad, weight_grad):
    """Thunder writes a convolution's backward as two convolutions, counted as it computes them: the input's
    gradient on the padded (at stride 2 also dilated) gradient with the flipped weight, (2, 4, 10, 10) outputs (stride
    2: (2, 4, 9, 9)) of 6 * 9 each, cropped after; the weight's, (4, 6, 3, 3) outputs, each over the batch and the
    output's positions (2 * 8 * 8; stride 2: 2 * 4 * 4)."""
    from thunder_fusion_guard.cost import convolution_flops

    gen = torch.Generator().manual_seed(6)
    x = torch.randn(2, 4, 8, 8, generator=gen, requires_grad=True)
    w = torch.randn(6, 4, 3, 3, generator=gen, requires_grad=True)

    def fn(a, b):
        return torch.nn.functional.conv2d(a, b, stride=stride, padding=1).neg()

    (forward,) = convolutions(fn, x, w)
    assert convolution_flops(forward) == 2 * (2 * 6 * (8 // stride) ** 2) * 36
    backward = sorted(convolution_flops(op) for op in convolutions(fn, x, w, backward=True))
    assert backward == sorted([input_grad, weight_grad])


# --- replayed in CUDA graphs: the device's estimates decide ------------------------------------------------------

# A fusion call costs 10 µs of host time, an eager op 1: a lone add's two small tensors are cheaper eagerly, on the
# host. On the device the fused add moves its bytes at twice eager's bandwidth.
HOST_BOUND = dict(PLAIN, overlapped=True)


def add_or_sub(x, y):
    return torch.where(x > y, x + y, x - y)


@pytest.mark.usefixtures("no_inductor")
@pytest.mark.parametrize("captured", [False, True])
def test_in_cuda_graphs_the_models_device_estimates_decide(captured):
    """The cost model rejects a small exact region for its fusion call's host time; replayed in CUDA graphs
    (compiled in ``capture_step``'s warm-up) the program spends none, and the device estimates keep the region:
    fewer kernels, and Thunder's own bits either way."""
    from thunder_fusion_guard.replays import warming_up_for_capture

    x, y = torch.randn(8, 8), torch.randn(8, 8)
    guard = FusionGuard(costs=Costs(calibration=HOST_BOUND, measure_budget_s=0))
    jitted = jit_cpu(add_or_sub, guard)
    with warming_up_for_capture() if captured else contextlib.nullcontext():
        got = jitted(x, y)
    assert torch.equal(got, jit_cpu(add_or_sub)(x, y))
    (d,) = guard.report
    assert d.code == "cost_model" and d.action == ("keep" if captured else "reject")
    assert d.facts.get("on_device", False) is captured
    assert len(regions(jitted)) == int(captured)
    if captured:  # the estimates recorded are the device's: no fusion call, no per-op host time
        assert d.estimates["est_region_us"] < d.estimates["est_eager_us"] < 1.0
