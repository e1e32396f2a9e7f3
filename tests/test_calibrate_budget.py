"""The calibration's budget covers compiling its probes, and its bandwidth probes hold still on a busy machine:
injected compile times and samples, no real timing."""

import pytest
import torch

from thunder_fusion_guard import Costs, FusionGuard
from thunder_fusion_guard.cost import CostConstants
from thunder_fusion_guard.measure import calibrate
from thunder_fusion_guard.measure.timing import Timing

N_TIMINGS = calibrate.TIMINGS + calibrate.CPU_TIMINGS
# The real one, taken before the suite's fixture replaces it (tests/conftest.py): here its probes and timings are fakes.
MEASURE = calibrate.measure


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def probes(monkeypatch):
    """Probes that take ``compile_s`` each to compile on a fake clock, and timings that record their budget."""
    clock, budgets = FakeClock(), []
    state = {"compile_s": 0.0}

    def probe(executor, fn, args):
        clock.now += state["compile_s"]
        return fn, fn, args

    def timed(fn, args, inner, budget_s, *, bandwidth=False):
        budgets.append(budget_s)
        return 50.0 if bandwidth else 5.0

    monkeypatch.setattr(calibrate, "_probe", probe)
    monkeypatch.setattr(calibrate, "_time", timed)
    return clock, budgets, state


@pytest.mark.parametrize("compile_s, share", [(0.5, (10.0 - 2.0) / N_TIMINGS), (10.0, 2.5 / N_TIMINGS)])
def test_compiling_the_probes_counts_against_the_budget(probes, compile_s, share):
    """Four probes compiled for 0.5 s each leave 8 of 10 s to the timings; 40 s of compiling leaves them their
    floor, a quarter of the budget, and says how long compiling took."""
    clock, budgets, state = probes
    state["compile_s"] = compile_s
    spent: dict[str, float] = {}
    constants = MEASURE("cpu", "torchcompile", 10.0, spent=spent, clock=clock)
    assert isinstance(constants, CostConstants)
    assert spent == {"compile_s": 4 * compile_s, "timing_s": 0.0}
    assert len(budgets) == N_TIMINGS and budgets == pytest.approx([share] * N_TIMINGS)
    assert calibrate.timing_budget(10.0, 4 * compile_s) == pytest.approx(share * N_TIMINGS)


def test_without_a_budget_the_timings_take_their_fixed_samples(probes):
    clock, budgets, state = probes
    state["compile_s"] = 3.0
    MEASURE("cpu", "torchcompile", spent=(spent := {}), clock=clock)
    assert budgets == [None] * N_TIMINGS and spent["compile_s"] == 12.0


def test_a_bandwidth_probe_takes_the_first_quartile_of_more_samples(monkeypatch):
    """Half the samples slowed fourfold by other work: the median lands between the two, the first quartile
    on the undisturbed time; host-cost probes keep the median."""
    calls = []

    def fake_time_us(fn, *args, reps, warmup, inner):
        calls.append(reps)
        samples = [10.0] * (reps - reps // 2) + [40.0] * (reps // 2)
        return Timing.of(samples)

    monkeypatch.setattr(calibrate, "time_us", fake_time_us)
    args = [torch.zeros(2)]
    assert calibrate._time(torch.neg, args, 1, None, bandwidth=True) == 10.0
    assert calibrate._time(torch.neg, args, 1, None) == 25.0
    assert calls == [calibrate.BANDWIDTH_REPS, 30]


def test_the_guard_records_what_its_calibration_spent(monkeypatch, tmp_path):
    monkeypatch.setenv("TFG_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(calibrate, "SHIPPED", [])
    fake = calibrate.shipped("cpu", "torchcompile") or CostConstants(20.0, 20.0, 4.0, 3.0, 20.0, False)

    def measure(device, executor, budget_s=None, *, spent=None):
        spent.update(compile_s=33.0, timing_s=1.25)
        return fake

    monkeypatch.setattr(calibrate, "measure", measure)
    guard = FusionGuard(costs=Costs(calibration="measure", calibration_budget_s=5.0))
    assert guard.constants_for("cpu", "torchcompile") == fake
    (event,) = guard.report.calibrations
    assert event["compile_s"] == 33.0 and event["timing_s"] == 1.25 and event["result"].startswith("calibrated here")


def test_the_allocator_is_settled_before_any_probe_is_timed(probes, monkeypatch):
    """Memory as large as the large add's output is allocated and freed first, as in a program that has run a step."""
    clock = probes[0]
    order = []
    monkeypatch.setattr(calibrate, "settle_allocator", lambda nbytes: order.append(("settle", nbytes)))
    timed = calibrate._time

    def time_in_order(*args, **kwargs):
        order.append(("time", kwargs.get("bandwidth")))
        return timed(*args, **kwargs)

    monkeypatch.setattr(calibrate, "_time", time_in_order)
    MEASURE("cpu", "torchcompile", 5.0, clock=clock)
    (settle,) = [i for i, (what, _) in enumerate(order) if what == "settle"]
    assert settle == 0 and order[0][1] >= 2048 * 2048 * 4 and len(order) == 1 + N_TIMINGS
