"""The cost model on CPU (torch.compile executor): small exact regions go eager, big fused chains stay."""

import pytest
import torch
from helpers import assert_same, jit_cpu, regions, run_with_grads

from thunder_fusion_guard import FusionGuard
from thunder_fusion_guard.cost import CostConstants
from thunder_fusion_guard.measure.calibrate import lookup, shipped

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
    guard = FusionGuard(calibration=CPU, strict=True)
    guarded, plain = jit_cpu(lone_add, guard), jit_cpu(lone_add)
    assert_same(*[run_with_grads(guarded, [a, b])[0], run_with_grads(plain, [a, b])[0]])
    assert regions(guarded) == []
    (d,) = guard.report.filter(trace="forward")
    assert d.action == "reject" and d.reason.startswith("eager is cheaper")
    assert d.estimates["est_eager_us"] < d.estimates["est_region_us"]


def test_big_pointwise_chain_is_kept():
    x = torch.randn(2048, 2048)
    guard = FusionGuard(calibration=CPU, strict=True)
    guarded = jit_cpu(pointwise_chain, guard)
    assert torch.equal(guarded(x), jit_cpu(pointwise_chain)(x))
    assert len(regions(guarded)) == 1
    (d,) = guard.report
    assert d.action == "keep" and "worth it" in d.reason
    assert d.estimates["est_region_us"] < d.estimates["est_eager_us"]


# Eager ops cost a third of the CPU's: small regions lose to eager by far, whatever is measured.
CHEAP_EAGER = dict(CPU.to_dict(), eager_op_us=CPU.eager_op_us / 3)


def test_small_chain_with_mul_and_add_stays_fused_when_exact_only():
    x = torch.randn(8, 8)
    guard = FusionGuard(calibration=CHEAP_EAGER)
    jit_cpu(pointwise_chain, guard)(x)
    (d,) = guard.report
    assert d.action == "keep" and "exact_only" in d.reason and d.details["decided_by"] == "exactness"
    assert d.details["model_action"] == "reject"


def test_exact_only_off_rejects_small_inexact_regions():
    x = torch.randn(8, 8)
    guard = FusionGuard(calibration=CHEAP_EAGER, exact_only=False, measure_budget_s=0)
    guarded = jit_cpu(pointwise_chain, guard)
    torch.testing.assert_close(guarded(x), pointwise_chain(x))
    assert regions(guarded) == []


def test_cost_model_off_keeps_compute():
    guard = FusionGuard(calibration=CPU, cost_model=False)
    jit_cpu(lone_add, guard)(torch.randn(4), torch.randn(4))
    assert {d.action for d in guard.report} == {"keep"}


def test_hand_set_constants_and_estimates_in_report():
    slow_eager = dict(CPU.to_dict(), eager_op_us=1000.0)
    slow_eager.pop("source")
    guard = FusionGuard(calibration=slow_eager)
    jit_cpu(lone_add, guard)(torch.randn(4), torch.randn(4))
    (d,) = guard.report
    assert d.action == "keep" and d.estimates["est_eager_us"] > 1000
    assert "/" in str(guard.report).splitlines()[2]


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"margin": 1.5}, "'margin' must be a number in \\[0, 1\\)"),
        ({"calibration": "fast"}, "'calibration' must be one of"),
        ({"calibration": {"fusion_call_us": 1.0}}, "missing fields"),
        ({"calibration": dict(CPU.to_dict(), eager_gbps=-1)}, "'eager_gbps' must be a positive number"),
        ({"exact_only": "no"}, "'exact_only'"),
    ],
)
def test_bad_cost_options(kwargs, match):
    with pytest.raises(ValueError, match=match):
        FusionGuard(**kwargs)


def test_constants_round_trip():
    assert CostConstants.from_dict(CPU.to_dict()) == CPU
