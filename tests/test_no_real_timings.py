"""The suite decides without real timings (conftest ``_no_real_timings``): regions near break-even are not
timed, ``calibration="auto"`` uses the shipped constants and never falls back to calibrating, and a test
that means to exercise measured decisions injects fixed timings (conftest ``inject_timings``)."""

from __future__ import annotations

import torch
from conftest import NOT_CALIBRATED_IN_TESTS, NOT_TIMED_IN_TESTS
from helpers import NEAR_BREAK_EVEN, jit_cpu

import thunder_fusion_guard.measure.calibrate as calibrate
from thunder_fusion_guard import Costs, FusionGuard


def lone_add(a, b):
    return a + b


def _inputs():
    return torch.randn(16, 16), torch.randn(16, 16)


def test_a_region_near_break_even_is_not_timed():
    guard = FusionGuard(costs=Costs(calibration=NEAR_BREAK_EVEN))
    assert guard.options.costs.measure_budget_s > 0  # measuring is on: the fixture, not the option, stops it
    jit_cpu(lone_add, guard)(*_inputs())
    (d,) = guard.report
    assert d.details["decided_by"] == "model" and d.details["not_measured"] == NOT_TIMED_IN_TESTS
    assert guard.report.measuring["timed"] == 0 and guard.report.measuring["from_cache"] == 0


def test_auto_calibration_uses_the_shipped_constants_here():
    guard = FusionGuard()
    assert calibrate.cached("cpu", "torchcompile") is None, "the tests' private cache holds no calibration"
    assert guard.constants_for("cpu", "torchcompile") == calibrate.shipped("cpu", "torchcompile") is not None
    assert not guard.report.calibrations


def test_auto_calibration_never_measures(monkeypatch):
    monkeypatch.setattr(calibrate, "SHIPPED", [])
    probed, timed = [], []
    real_probe, real_time = calibrate._probe, calibrate.time_us
    monkeypatch.setattr(calibrate, "_probe", lambda *a, **k: probed.append(a[0]) or real_probe(*a, **k))
    monkeypatch.setattr(calibrate, "time_us", lambda *a, **k: timed.append(1) or real_time(*a, **k))
    guard = FusionGuard()
    x = _inputs()
    assert torch.equal(jit_cpu(lone_add, guard)(*x), lone_add(*x))
    (event,) = guard.report.calibrations
    assert NOT_CALIBRATED_IN_TESTS in event["result"]
    assert probed == [] and timed == [], "a probe was built or timed: the calibration ran for real"
    (d,) = guard.report
    assert d.action == "keep" and d.details["decided_by"] == "no constants"
    assert calibrate.cached("cpu", "torchcompile") is None


def test_injected_timings_decide(inject_timings):
    timings = inject_timings(10.0, 2.0)
    guard = FusionGuard(costs=Costs(calibration=NEAR_BREAK_EVEN))
    jit_cpu(lone_add, guard)(*_inputs())
    (d,) = guard.report
    assert timings == [2] and (d.action, d.details["decided_by"]) == ("reject", "measured")
