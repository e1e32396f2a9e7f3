"""Deciding on the user's machine: calibration on first need, regions near break-even timed, the caches,
the budgets, and reasons that match their numbers. Timings are injected (conftest ``inject_timings``; every
other test of the suite decides untimed, conftest ``_no_real_timings``): no verdict depends on the clock."""

from __future__ import annotations

import itertools
import json
import logging
from collections import Counter

import pytest
import thunder
import torch
from conftest import pin_cpu
from helpers import NEAR_BREAK_EVEN, assert_same, fragmenting_executor, jit_cpu, regions, run_with_grads

import thunder_fusion_guard.measure.breakeven as breakeven
import thunder_fusion_guard.measure.cache as cache
import thunder_fusion_guard.measure.calibrate as calibrate
from thunder_fusion_guard import Costs, FusionGuard
from thunder_fusion_guard.bench import decisions as bench_decisions
from thunder_fusion_guard.bench.decisions_measure import Row, choice_verdict_of, truth_of, verdict_of
from thunder_fusion_guard.bench.decisions_summary import VERDICTS, format_summary, summarize
from thunder_fusion_guard.cost import CostConstants
from thunder_fusion_guard.measure.cache import device_name
from thunder_fusion_guard.shipped_constants import SHIPPED

_REAL_REMEMBER = breakeven.remember  # conftest turns it off in every test; the test of it turns it back on


FAKE = CostConstants(**NEAR_BREAK_EVEN, source="fake calibration")


def lone_add(a, b):
    return a + b


def add_then_sub(x):
    return (x + 1.0) - 2.0


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch):
    """A fresh, empty cache for each test, and nothing measured in this process yet."""
    monkeypatch.setenv("TFG_CACHE_DIR", str(tmp_path))
    breakeven.clear_memory_cache()
    yield tmp_path
    breakeven.clear_memory_cache()


@pytest.fixture
def no_shipped(monkeypatch):
    monkeypatch.setattr(calibrate, "SHIPPED", [])


@pytest.fixture
def fake_calibration(monkeypatch, no_shipped):
    """calibrate.measure replaced by a call counter returning FAKE."""
    calls = []

    def measure(device, executor, budget_s=None, **_):
        calls.append((device, executor, budget_s))
        return FAKE

    monkeypatch.setattr(calibrate, "measure", measure)
    return calls


def _inputs():
    return torch.randn(16, 16), torch.randn(16, 16)


# --- 1. calibration on first need ----------------------------------------------------------------------


@pytest.mark.usefixtures("no_inductor")
def test_auto_calibration_happens_once_and_is_cached(fake_calibration, cache_dir, caplog):
    guard = FusionGuard(costs=Costs(calibration_budget_s=0.5, measure_budget_s=0))
    with caplog.at_level(logging.INFO, logger="thunder_fusion_guard"):
        jit_cpu(lone_add, guard)(*_inputs())
        jit_cpu(add_then_sub, guard)(torch.randn(4))
    assert fake_calibration == [("cpu", "torchcompile", 0.5)]
    assert "calibrating (budget 0.5 s)" in caplog.text
    assert "calibrated executor 'torchcompile' on cpu" in caplog.text
    (event,) = guard.report.calibrations
    assert event["executor"] == "torchcompile" and event["result"].startswith("calibrated here")
    assert "calibration of torchcompile on cpu: calibrated here" in str(guard.report)
    cached = json.loads((cache_dir / "calibration.json").read_text())
    assert list(cached.values()) == [FAKE.to_dict()]
    assert all(d.details["decided_by"] != "no constants" for d in guard.report)

    again = FusionGuard(costs=Costs(measure_budget_s=0))
    jit_cpu(lone_add, again)(*_inputs())
    assert len(fake_calibration) == 1, "a fresh guard reads the cached calibration"
    assert again.constants_for("cpu", "torchcompile") == FAKE and not again.report.calibrations


def test_auto_calibration_never_runs_in_a_run_of_several_ranks(fake_calibration, cache_dir, monkeypatch):
    """Every rank measuring its own constants could decide differently: with no cached or shipped constants,
    a run of several ranks keeps compute regions fused (the model has nothing to decide with) and says why."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    guard = FusionGuard(costs=Costs(measure_budget_s=0))
    jit_cpu(lone_add, guard)(*_inputs())
    assert fake_calibration == []
    (event,) = guard.report.calibrations
    assert event["result"].startswith("not calibrated: a run of 2 ranks calibrates nowhere")
    assert all(d.action == "keep" for d in guard.report)

    measured = FusionGuard(costs=Costs(calibration="measure", measure_budget_s=0))
    jit_cpu(lone_add, measured)(*_inputs())
    assert fake_calibration == [("cpu", "torchcompile", 5.0)], "calibration='measure' is the user's explicit ask"


@pytest.mark.real_timings  # calibrates for real; its verdict holds whatever the timings are
def test_auto_calibration_for_real_inside_the_transform(no_shipped, cache_dir):
    """The real probes (thunder.jit of their own, in a fresh context) run inside Thunder's compilation."""
    guard = FusionGuard(strict=True, costs=Costs(calibration_budget_s=0.05, measure_budget_s=0))
    a, b = torch.randn(16, 16, requires_grad=True), torch.randn(16, 16, requires_grad=True)
    assert_same(*[run_with_grads(jit_cpu(lone_add, guard), [a, b])[0], run_with_grads(jit_cpu(lone_add), [a, b])[0]])
    constants = guard.constants_for("cpu", "torchcompile")
    assert constants is not None and constants.source.startswith(f"measured: {cache.cpu_identity()}|torchcompile")
    assert [b for b, _ in constants.bandwidth_curve] == [3 * 4 * n for n in calibrate.CURVE_CPU]
    assert set(dict(constants.op_ns)) == set(calibrate.OP_PROBES) and constants.matmul_gflops > 0
    assert calibrate.cached("cpu", "torchcompile") == constants
    (d,) = guard.report.filter(trace="forward")
    assert d.details["decided_by"] == "model" and d.estimates["est_region_us"] > 0


def test_calibration_cached_mode_never_measures(fake_calibration):
    for mode in ("cached", None):
        guard = FusionGuard(costs=Costs(calibration=mode))
        jit_cpu(lone_add, guard)(*_inputs())
        (d,) = guard.report
        assert d.action == "keep" and d.details["decided_by"] == "no constants"
        assert d.code == "no_constants" and guard.options.costs.calibration == "cached"
    assert fake_calibration == []


def test_calibration_shipped_mode_ignores_the_cache(cache_dir):
    calibrate.save_constants("cpu", "torchcompile", FAKE)
    assert FusionGuard().constants_for("cpu", "torchcompile") == FAKE
    assert FusionGuard(costs=Costs(calibration="shipped")).constants_for("cpu", "torchcompile") == calibrate.shipped(
        "cpu", "torchcompile"
    )


def test_calibration_measure_mode_ignores_shipped(fake_calibration, monkeypatch):
    monkeypatch.setattr(calibrate, "SHIPPED", [("cpu", "torchcompile", dict(NEAR_BREAK_EVEN, fusion_call_us=99.0))])
    assert FusionGuard(costs=Costs(calibration="measure")).constants_for("cpu", "torchcompile") == FAKE
    assert len(fake_calibration) == 1


def test_failed_calibration_is_recorded_never_raised(monkeypatch, no_shipped, caplog):
    def broken(device, executor, budget_s=None, **_):
        raise RuntimeError("planted calibration failure")

    monkeypatch.setattr(calibrate, "measure", broken)
    guard = FusionGuard()
    x = _inputs()
    with caplog.at_level(logging.WARNING, logger="thunder_fusion_guard"):
        assert torch.equal(jit_cpu(lone_add, guard)(*x), lone_add(*x))
    (d,) = guard.report
    assert d.action == "keep" and d.details["decided_by"] == "no constants"
    assert d.code == "no_constants" and guard.options.costs.calibration == "auto"
    assert "planted calibration failure" in guard.report.calibrations[0]["result"]
    assert "planted calibration failure" in caplog.text


def test_auto_calibrates_on_a_cpu_the_shipped_constants_do_not_name_and_caches_per_cpu(fake_calibration, monkeypatch):
    """The shipped CPU constants name no CPU: on any CPU ``auto`` calibrates, and its cache entry serves only a
    CPU of the same model, cores and torch threads."""
    monkeypatch.setattr(calibrate, "SHIPPED", SHIPPED)  # as shipped, not pinned to the tests' CPU
    cpus = [("Other CPU 9000", 8, 4), ("Other CPU 9001", 8, 4), ("Other CPU 9000", 16, 4), ("Other CPU 9000", 8, 2)]
    keys = []
    for n, cpu in enumerate(cpus, start=1):
        pin_cpu(monkeypatch, *cpu)
        guard = FusionGuard(costs=Costs(measure_budget_s=0))
        assert guard.constants_for("cpu", "torchcompile") == FAKE
        assert len(fake_calibration) == n, f"{cpu} reused another CPU's calibration"
        (event,) = guard.report.calibrations
        assert event["result"].startswith("calibrated here")
        keys.append(calibrate.cache_key("cpu", "torchcompile"))
    assert len(set(keys)) == len(cpus)
    assert set(json.loads((cache.cache_path()).read_text())) == set(keys)
    pin_cpu(monkeypatch, *cpus[0])
    again = FusionGuard(costs=Costs(measure_budget_s=0))
    assert again.constants_for("cpu", "torchcompile") == FAKE and not again.report.calibrations
    assert len(fake_calibration) == len(cpus), "the same CPU reads its cached calibration"


def test_shipped_constants_stand_in_on_the_cpu_they_were_measured_on(fake_calibration, monkeypatch):
    identity = pin_cpu(monkeypatch, "Shipped CPU", 2, 1)
    here = dict(NEAR_BREAK_EVEN, fusion_call_us=42.0)
    monkeypatch.setattr(
        calibrate, "SHIPPED", [(identity, "torchcompile", here), ("cpu", "torchcompile", NEAR_BREAK_EVEN)]
    )
    guard = FusionGuard()
    jit_cpu(lone_add, guard)(*_inputs())
    assert guard.constants_for("cpu", "torchcompile") == CostConstants.from_dict(here)
    assert fake_calibration == [] and not guard.report.calibrations
    assert all("model_doubted" not in d.details for d in guard.report)

    pin_cpu(monkeypatch, "Shipped CPU", 2, 2)  # the same CPU with other threads is another machine kind
    assert FusionGuard().constants_for("cpu", "torchcompile") == FAKE and len(fake_calibration) == 1


# Far from break-even in the fusion's favour: 10 ops of 30 µs eagerly against one call of 3 µs.
FUSION_FAR_CHEAPER = dict(NEAR_BREAK_EVEN, eager_op_us=30.0)


def five_ops(x):
    return ((((x + 1.0) - 2.0) + 3.0) - 4.0) + 5.0


@pytest.mark.parametrize("mode", ["auto", "shipped"])
def test_constants_not_calibrated_here_do_not_decide_alone(inject_timings, monkeypatch, mode):
    """Another CPU's shipped constants (auto: the calibration failed) put the estimates far apart for the
    fusion; the region is timed anyway, and the timing, fused slower, sends it to torch."""
    monkeypatch.setattr(calibrate, "SHIPPED", [("cpu", "torchcompile", FUSION_FAR_CHEAPER)])
    timings = inject_timings(10.0, 2.0)
    guard = FusionGuard(strict=True, costs=Costs(calibration=mode))
    x = torch.randn(16, 16)
    guarded = jit_cpu(five_ops, guard)
    assert torch.equal(guarded(x), five_ops(x))
    (d,) = guard.report
    assert (d.action, d.details["decided_by"], d.details["model_action"]) == ("reject", "measured", "keep")
    assert d.estimates["est_eager_us"] > 3 * d.estimates["est_region_us"]
    assert d.facts["doubt"] == {"by": "shipped_elsewhere", "device": device_name("cpu")}  # another CPU's constants
    assert timings == [2] and regions(guarded) == []
    if mode == "auto":
        (event,) = guard.report.calibrations
        assert not event["result"].startswith("calibrated")


def test_constants_not_calibrated_here_are_timed_within_the_budget(inject_timings, monkeypatch):
    monkeypatch.setattr(calibrate, "SHIPPED", [("cpu", "torchcompile", FUSION_FAR_CHEAPER)])
    timings = inject_timings(10.0, 2.0)
    guard = FusionGuard(costs=Costs(calibration="shipped", measure_budget_s=0))
    jit_cpu(five_ops, guard)(torch.randn(16, 16))
    (d,) = guard.report
    assert (d.action, d.details["decided_by"]) == ("keep", "model") and "model_doubted" in d.details
    assert timings == []


def test_a_timing_far_off_the_estimates_puts_the_model_in_doubt(inject_timings):
    """Constants given by hand are trusted until a timing of the guard's own finds the estimated eager/fused
    ratio off by more than the band: from then on its regions far from break-even are timed too."""
    timings = inject_timings(10.0, 2.0)
    guard = FusionGuard(
        strict=True, costs=Costs(calibration=NEAR_BREAK_EVEN)
    )  # five ops about 4.5x dearer eagerly, one add not
    x = torch.randn(16, 16)
    jit_cpu(five_ops, guard)(x)
    (far,) = guard.report
    assert (far.action, far.details["decided_by"]) == ("keep", "model") and timings == []

    jit_cpu(lone_add, guard)(x, x)  # near break-even: timed, and 10 µs fused vs 2 eager is far off the estimate
    near = guard.report.decisions[-1]
    assert (near.action, near.details["decided_by"]) == ("reject", "measured") and timings == [2]

    jit_cpu(lambda y: five_ops(y) + 6.0, guard)(x)
    doubted = guard.report.decisions[-1]
    assert (doubted.action, doubted.details["decided_by"], doubted.details["model_action"]) == (
        "reject",
        "measured",
        "keep",
    )
    assert (doubted.facts["doubt"]["by"], doubted.facts["doubt"]["region"]) == ("timing", near.region)
    assert doubted.facts["doubt"]["off"] > doubted.facts["doubt"]["band"] and timings == [2, 2]


# --- 2. measured decisions near break-even -------------------------------------------------------------


@pytest.mark.parametrize("fused_us,eager_us,action", [(10.0, 2.0, "reject"), (2.0, 10.0, "keep")])
def test_near_break_even_the_measurement_decides(inject_timings, fused_us, eager_us, action):
    timings = inject_timings(fused_us, eager_us)
    guard = FusionGuard(strict=True, costs=Costs(calibration=NEAR_BREAK_EVEN))
    a, b = torch.randn(16, 16, requires_grad=True), torch.randn(16, 16)
    guarded = jit_cpu(lone_add, guard)
    assert_same(*[run_with_grads(guarded, [a, b])[0], run_with_grads(jit_cpu(lone_add), [a, b])[0]])
    assert timings == [2]
    (d,) = guard.report.filter(trace="forward")
    assert d.action == action and d.details["decided_by"] == "measured"
    assert d.details["measured_region_us"] == fused_us and d.details["measured_eager_us"] == eager_us
    assert d.details["model_action"] == "keep"  # 3.5 µs fused vs 3.2 eager: within the margin
    assert len(regions(guarded)) == (action == "keep")
    assert f"measured {fused_us:.1f} / {eager_us:.1f}" in str(guard.report)
    assert guard.report.measuring["timed"] == 1 and guard.report.to_dict()["measuring"]["seconds"] >= 0


def test_far_from_break_even_nothing_is_measured(inject_timings):
    timings = inject_timings(1.0, 1.0)
    far = dict(NEAR_BREAK_EVEN, fusion_call_us=100.0)
    guard = FusionGuard(costs=Costs(calibration=far))
    jit_cpu(lone_add, guard)(*_inputs())
    (d,) = guard.report
    assert d.action == "reject" and d.details["decided_by"] == "model" and timings == []


def test_inexact_regions_are_not_measured(inject_timings):
    timings = inject_timings(10.0, 1.0)
    guard = FusionGuard(costs=Costs(calibration=dict(NEAR_BREAK_EVEN, eager_op_us=0.9)))

    def chain(x):
        return torch.exp(x) * 2.0

    jit_cpu(chain, guard)(torch.randn(16, 16))
    (d,) = guard.report
    assert d.action == "keep" and d.details["decided_by"] == "exactness" and timings == []


def test_second_compilation_measures_nothing(inject_timings, cache_dir):
    timings = inject_timings(10.0, 2.0)
    guard = FusionGuard(costs=Costs(calibration=NEAR_BREAK_EVEN))
    jit_cpu(lone_add, guard)(*_inputs())
    jit_cpu(lone_add, guard)(*_inputs())
    assert timings == [2]
    first, second = guard.report
    assert first.details["measured_from"] == "timed" and second.details["measured_from"] == "cache"
    assert first.action == second.action == "reject"
    assert guard.report.measuring["timed"] == 1 and guard.report.measuring["from_cache"] == 1
    assert len(json.loads((cache_dir / "measurements.json").read_text())) == 1

    breakeven.clear_memory_cache()
    fresh = FusionGuard(costs=Costs(calibration=NEAR_BREAK_EVEN))
    jit_cpu(lone_add, fresh)(*_inputs())
    assert timings == [2], "a fresh guard in a fresh process reads the disk cache"
    (d,) = fresh.report
    assert d.details["measured_from"] == "cache" and d.details["measured_region_us"] == 10.0


def test_other_shapes_are_measured_again(inject_timings):
    timings = inject_timings(10.0, 2.0)
    guard = FusionGuard(costs=Costs(calibration=NEAR_BREAK_EVEN))
    jit_cpu(lone_add, guard)(*_inputs())
    jit_cpu(lone_add, guard)(torch.randn(16, 17), torch.randn(16, 17))
    assert timings == [2, 2]


@pytest.mark.usefixtures("no_inductor")
def test_measuring_budget_caps_the_time(inject_timings):
    timings = inject_timings(10.0, 2.0)
    guard = FusionGuard(costs=Costs(calibration=NEAR_BREAK_EVEN, measure_budget_s=0.5))
    ticks = iter(range(0, 10**12, 10**9))  # every reading of the clock is one second later
    guard.measurer.clock = lambda: next(ticks)
    thunder.jit(add_then_sub, executors=[fragmenting_executor()], transforms=[guard])(torch.randn(16, 16))
    first, second = guard.report
    assert timings == [2]
    assert first.details["decided_by"] == "measured"
    assert second.details["decided_by"] == "model"
    assert "measuring budget (0.5 s, option 'costs.measure_budget_s') is spent" in second.details["not_measured"]
    assert guard.report.measuring["timed"] == 1 and guard.report.measuring["not_timed"] == 1
    assert guard.report.measuring["seconds"] >= 1.0


def test_measuring_and_calibrating_inside_thunderfx_subgraphs(inject_timings, fake_calibration):
    from thunder.dynamo import thunderfx
    from thunder.executors.torch_compile import torch_compile_ex

    timings = inject_timings(10.0, 2.0)

    def two_subgraphs(a, b):
        y = a + b
        torch._dynamo.graph_break()
        return y - b

    guard = FusionGuard()
    guard.measurer.clock = lambda: 0  # no time passes: the measuring budget never decides (compiles may be slow)
    compiled = thunderfx(two_subgraphs, transforms=[guard], executors=[torch_compile_ex])
    a, b = _inputs()
    assert torch.equal(compiled(a, b), two_subgraphs(a, b))
    assert len(fake_calibration) == 1 and timings == [2, 2]
    decisions = [d for d in guard.report if d.about_region]
    assert [d.subgraph for d in decisions] == ["subgraph 0", "subgraph 1"]
    assert all(d.action == "reject" and d.details["decided_by"] == "measured" for d in decisions)


def test_measuring_off(inject_timings):
    timings = inject_timings(10.0, 2.0)
    guard = FusionGuard(costs=Costs(calibration=NEAR_BREAK_EVEN, measure_budget_s=0))
    jit_cpu(lone_add, guard)(*_inputs())
    (d,) = guard.report
    assert timings == [] and d.details["decided_by"] == "model" and "measuring" not in guard.report.to_dict()


def test_measurement_failure_falls_back_to_the_model(monkeypatch, inject_timings):
    inject_timings(1.0, 1.0)  # the measurer's own path, its timing then replaced by a failing one

    def broken(*args, **kwargs):
        raise RuntimeError("planted timing failure")

    monkeypatch.setattr(breakeven, "interleaved_us", broken)
    guard = FusionGuard(costs=Costs(calibration=NEAR_BREAK_EVEN))
    x = _inputs()
    assert torch.equal(jit_cpu(lone_add, guard)(*x), lone_add(*x))
    (d,) = guard.report
    assert d.details["decided_by"] == "model" and "planted timing failure" in d.details["not_measured"]


def test_several_ranks_decide_by_the_model_alone(monkeypatch, inject_timings):
    """Timings differ from rank to rank; a region near break-even must not be rejected on one rank only."""
    timings = inject_timings(10.0, 2.0)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    guard = FusionGuard(costs=Costs(calibration=NEAR_BREAK_EVEN))
    x = _inputs()
    assert torch.equal(jit_cpu(lone_add, guard)(*x), lone_add(*x))
    (d,) = guard.report
    assert timings == [] and d.details["decided_by"] == "model" and d.action == "keep"
    assert "a run of 2 ranks decides by the model alone" in d.details["not_measured"]


def test_in_place_regions_are_measured_on_fresh_tensors(inject_timings):
    inject_timings(2.0, 10.0)

    def copy_into(dst, src):
        return dst.copy_(src)

    dst, src = torch.zeros(16, 16), torch.ones(16, 16)
    guard = FusionGuard(costs=Costs(calibration=NEAR_BREAK_EVEN))
    jit_cpu(copy_into, guard)(dst, src)
    (d,) = guard.report
    assert d.details["decided_by"] == "measured" and d.action == "keep"
    assert torch.equal(dst, src)  # written once, by the program's own call


def test_region_inputs_follow_the_proxies():
    from thunder_fusion_guard.regions import find_regions

    def mixed(x, i, m):
        return torch.where(m, x, 0.0) + i

    jitted = jit_cpu(mixed, FusionGuard(costs=Costs(cost_model=False)))
    jitted(torch.randn(3, 4, dtype=torch.float64), torch.ones(3, 4, dtype=torch.int64), torch.ones(3, 4) > 0)
    trace = thunder.last_traces(jitted)[-1]
    (region,) = find_regions(trace)
    args = breakeven.region_inputs(trace, region)
    kinds = {(tuple(a.shape), a.dtype) for a in args}
    assert kinds == {((3, 4), torch.float64), ((3, 4), torch.int64), ((3, 4), torch.bool)}
    assert all(not a.requires_grad for a in args)


# --- 4. reasons that match their numbers ---------------------------------------------------------------


def test_reason_within_the_margin_says_eager_was_cheaper():
    guard = FusionGuard(costs=Costs(calibration=NEAR_BREAK_EVEN, measure_budget_s=0))
    jit_cpu(lone_add, guard)(*_inputs())
    (d,) = guard.report
    region, eager = d.estimates["est_region_us"], d.estimates["est_eager_us"]
    assert eager < region and d.action == "keep"
    assert (d.code, d.details["decided_by"], d.details["model_action"]) == ("cost_model", "model", "keep")
    assert d.details["margin"] == 0.2 and eager > region * (1 - 0.2)  # eager cheaper, by less than the margin
    assert (d.facts["outcome"], d.facts["margin"]) == ("under_margin", 0.2), d.facts  # the numbers it is worded from
    assert (d.facts["est_eager_us"], d.facts["est_region_us"]) == pytest.approx((eager, region), abs=5e-4)  # 3 places


def test_reason_when_fusion_wins_and_when_measured_within_margin(inject_timings):
    guard = FusionGuard(costs=Costs(calibration=dict(NEAR_BREAK_EVEN, eager_op_us=30.0), measure_budget_s=0))
    jit_cpu(lone_add, guard)(*_inputs())
    (d,) = guard.report
    assert (d.code, d.action, d.details["decided_by"]) == ("cost_model", "keep", "model")
    assert d.estimates["est_region_us"] < d.estimates["est_eager_us"]

    inject_timings(10.0, 9.7)
    guard = FusionGuard(costs=Costs(calibration=NEAR_BREAK_EVEN))
    jit_cpu(lone_add, guard)(*_inputs())
    (d,) = guard.report
    assert d.action == "keep"
    assert (d.code, d.details["decided_by"], "model_doubted" in d.details) == ("measured", "measured", False)
    assert (d.details["measured_eager_us"], d.details["measured_region_us"]) == (9.7, 10.0)  # eager 3% cheaper
    assert (d.details["margin"], d.details["margin_narrowed"]) == (0.05, "synchronous")  # narrowed from 20%
    assert (d.facts["measured"].eager_us, d.facts["measured"].region_us) == (9.7, 10.0)  # the numbers it is worded from
    assert (d.facts["outcome"], d.facts["margin"], d.facts["margin_from"]) == ("under_margin", 0.05, 0.2)
    assert d.facts["narrowed"] == "synchronous"


@pytest.mark.parametrize(
    "spread,overlapped,margin,action,used",
    [
        (0.0, False, 0.2, "reject", 0.05),  # eager 12% faster, clearer than the 5% floor
        (0.08, False, 0.2, "reject", 0.08),
        (0.15, False, 0.2, "keep", 0.15),  # eager 12% faster, inside the timing's own spread
        (0.0, True, 0.2, "keep", 0.2),  # CUDA-like, host and device not timed apart: the option's margin holds
        (0.0, False, 0.02, "reject", 0.02),  # the option caps the narrowed margin
    ],
)
def test_measured_margin_follows_the_timings_spread(inject_timings, spread, overlapped, margin, action, used):
    """On a synchronous device a timed region is rejected once eager wins by more than the timing's spread
    (at least 5%, at most the option 'margin'); where the host runs ahead of the device, 'margin' holds."""
    inject_timings(10.0, 8.8, spread)
    guard = FusionGuard(
        strict=True, costs=Costs(calibration=dict(NEAR_BREAK_EVEN, overlapped=overlapped), margin=margin)
    )
    a, b = _inputs()
    assert_same([jit_cpu(lone_add, guard)(a, b)], [jit_cpu(lone_add)(a, b)])
    (d,) = guard.report
    assert (d.action, d.details["decided_by"]) == (action, "measured")
    assert d.details["margin"] == pytest.approx(used)
    assert d.details["measured_spread"] == pytest.approx(spread, abs=1e-3)
    assert d.details.get("margin_narrowed") == ("synchronous" if used != margin else None)


@pytest.mark.parametrize(
    "host,device,action,used",
    [
        ((6.0, 3.0), (9.0, 8.6), "reject", 0.05),  # eager cheaper on both: cheaper whatever bounds the program
        ((6.0, 3.0), (9.0, 9.4), "reject", 0.05),  # dearer on the device by less than the spread floor
        ((6.0, 3.0), (4.0, 8.8), "keep", 0.2),  # dearer on the device: a device-bound program would lose
        ((3.0, 6.0), (9.0, 8.8), "keep", 0.2),  # dearer on the host: a host-bound program would lose
    ],
)
def test_on_cuda_the_margin_narrows_where_eager_is_no_dearer_on_host_and_device(
    inject_timings, host, device, action, used
):
    """Where the host runs ahead of the device, a timed region is rejected by the narrow margin only when
    eager, timed apart on the host and on the device, is no dearer on either (within the timing's spread):
    then it is cheaper in the program whichever of the two bounds it. Otherwise the option 'margin' holds."""
    inject_timings(10.0, 8.8, 0.0, host=host, device=device)
    guard = FusionGuard(strict=True, costs=Costs(calibration=dict(NEAR_BREAK_EVEN, overlapped=True)))
    a, b = _inputs()
    assert_same([jit_cpu(lone_add, guard)(a, b)], [jit_cpu(lone_add)(a, b)])
    (d,) = guard.report
    assert (d.action, d.details["decided_by"]) == (action, "measured")
    assert d.details["margin"] == pytest.approx(used)
    assert (d.details["measured_region_host_us"], d.details["measured_eager_host_us"]) == host
    assert (d.details["measured_region_device_us"], d.details["measured_eager_device_us"]) == device
    assert d.details.get("margin_narrowed") == ("host_and_device" if action == "reject" else None)


def test_host_and_device_times_are_cached_with_the_measurement(inject_timings):
    inject_timings(10.0, 8.8, 0.0, host=(6.0, 3.0), device=(9.0, 8.6))
    a, b = _inputs()
    jit_cpu(lone_add, FusionGuard(costs=Costs(calibration=dict(NEAR_BREAK_EVEN, overlapped=True))))(a, b)
    breakeven.clear_memory_cache()
    again = FusionGuard(costs=Costs(calibration=dict(NEAR_BREAK_EVEN, overlapped=True)))
    jit_cpu(lone_add, again)(a, b)
    (d,) = again.report
    assert d.action == "reject" and d.details["measured_from"] == "cache"
    assert d.details["measured_region_device_us"] == 9.0 and d.details["measured_eager_host_us"] == 3.0


def test_a_failing_host_and_device_timing_leaves_the_measurement(inject_timings, monkeypatch):
    inject_timings(10.0, 8.8, 0.0)

    def broken(*args, **kwargs):
        raise RuntimeError("no sleeping kernel here")

    monkeypatch.setattr(breakeven, "host_device_us", broken)
    guard = FusionGuard(costs=Costs(calibration=dict(NEAR_BREAK_EVEN, overlapped=True)))
    jit_cpu(lone_add, guard)(*_inputs())
    (d,) = guard.report
    assert d.details["decided_by"] == "measured" and "measured_region_host_us" not in d.details
    assert d.action == "keep" and d.details["margin"] == 0.2 and "margin_narrowed" not in d.details


def test_host_device_us_is_none_off_cuda():
    from thunder_fusion_guard.measure.timing import host_device_us

    assert host_device_us([torch.neg], [torch.ones(4)]) is None


@pytest.mark.parametrize("slow_samples", [1, 4])
def test_a_host_slowed_down_past_the_sleep_gets_a_longer_sleep_before_giving_up(monkeypatch, slow_samples):
    """Stand-ins for the CUDA calls and the clock: the first ``slow_samples`` samples issue their calls slower than
    the sleep lasts (a host shared with other processes). The sample is taken again under a sleep twice as long, at
    most LONGER_SLEEPS times; only calls that outlast every sleep count as waiting for the device (None)."""
    from thunder_fusion_guard.measure import timing

    now, sleeps, issued = [0], [], []

    class Event:
        def __init__(self, enable_timing):
            self.at = 0

        def record(self):
            self.at = now[0]

        def synchronize(self):
            pass

        def elapsed_time(self, other):
            return (other.at - self.at) / 1e6

    def call(x):
        issued.append(1)
        slow = len(issued) > 1 and len(sleeps) <= slow_samples  # the first call (alone, unslept) is not slowed
        now[0] += 10_000_000 if slow else 1_000  # ns: 10 ms slowed down, 1 µs otherwise

    monkeypatch.setattr(timing.torch.cuda, "Event", Event)
    monkeypatch.setattr(timing.torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(timing.torch.cuda, "_sleep", lambda cycles: sleeps.append(cycles))
    monkeypatch.setattr(timing, "_sleep_cycles_per_us", lambda: 1.0)
    monkeypatch.setattr(timing, "MAX_INNER", 1)
    got = timing.host_device_us([call], [None], reps=3, clock=lambda: now[0], cuda=True)
    if slow_samples > timing.LONGER_SLEEPS:
        assert got is None and len(sleeps) == timing.LONGER_SLEEPS + 1
        return
    assert got is not None and got[0].host_us == pytest.approx(1.0)
    assert sleeps[1] == 2 * sleeps[0] and sleeps[-1] == 2 * sleeps[0] and len(sleeps) == 3 + slow_samples


@pytest.mark.cuda
@pytest.mark.real_timings
def test_host_device_us_tells_device_time_from_host_time():
    """A call that only keeps the device busy (~1 ms) and one that only keeps the host busy (~0.5 ms): each
    side's time is the other's a hundred times over, far beyond any noise."""
    import time

    from thunder_fusion_guard.measure.timing import host_device_us

    def device_bound(x):
        torch.cuda._sleep(2_000_000)

    def host_bound(x):
        time.sleep(0.0005)

    x = torch.ones(4, device="cuda")
    for fn in (device_bound, host_bound):
        fn(x)
    on_device, on_host = host_device_us([device_bound, host_bound], [x], reps=3)
    assert on_device.device_us > 10 * on_device.host_us
    assert on_host.host_us > 10 * on_host.device_us


# --- options -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (
            {"costs": {"calibration": "sometimes"}},
            r"'costs.calibration' must be one of \['auto', 'cached', 'shipped', 'measure'\]",
        ),
        ({"costs": {"calibration_budget_s": 0}}, "'costs.calibration_budget_s' must be a finite number of seconds > 0"),
        ({"costs": {"measure_budget_s": -1}}, "'costs.measure_budget_s' must be a finite number of seconds >= 0"),
        ({"costs": {"measure_budget_s": float("inf")}}, "'costs.measure_budget_s'"),
        ({"costs": {"measure_budget_s": "5"}}, "'costs.measure_budget_s'"),
        ({"costs": {"measure_budget_s": True}}, "'costs.measure_budget_s'"),
    ],
)
def test_bad_measuring_options(kwargs, match):
    with pytest.raises(ValueError, match=match):
        FusionGuard(**kwargs)


def test_defaults():
    options = FusionGuard().options
    assert (
        options.costs.calibration == "auto"
        and options.costs.measure_budget_s > 0
        and options.costs.calibration_budget_s > 0
    )
    assert FusionGuard(costs=Costs(calibration=None)).options.costs.calibration == "cached"


def test_constants_without_io_cost_still_load():
    assert CostConstants.from_dict(NEAR_BREAK_EVEN).fusion_io_us == 0.0
    with pytest.raises(ValueError, match="'fusion_io_us' must be a number >= 0"):
        CostConstants.from_dict(dict(NEAR_BREAK_EVEN, fusion_io_us=-1.0))


# --- 3. the decision benchmark's bookkeeping -----------------------------------------------------------


def test_truth_and_verdicts():
    assert truth_of([10.0] * 5, [20.0] * 5)[0] == "fusion"
    assert truth_of([20.0] * 5, [10.0] * 5)[0] == "eager"
    assert truth_of([10.0] * 5, [10.2] * 5)[0] == "noise"
    assert truth_of([10, 10, 10, 10], [8, 9, 11, 12])[0] == "noise"  # ratios straddle 1
    assert verdict_of("reject", "eager") == "right"
    assert verdict_of("reject", "fusion") == "wrong reject"
    assert verdict_of("keep", "eager") == "wrong keep"
    assert verdict_of("keep", "noise") == "within noise"


def test_summary_counts():
    def row(action, truth, fused, eager, est=(1.0, 1.0), by="model"):
        r = Row("ops", "p", "tune", "forward", "R", ["add"], action, by, action)
        r.est_region_us, r.est_eager_us, r.fused_us, r.eager_us = *est, fused, eager
        r.truth, r.verdict = truth, verdict_of(action, truth)
        r.model_verdict = r.verdict
        return r

    rows = [
        row("reject", "eager", 2.0, 1.0, (2.5, 1.5)),
        row("reject", "fusion", 1.0, 1.5, (3.0, 1.0)),
        row("keep", "noise", 1.0, 1.0),
        row("keep", "fusion", 1.0, 4.0, (1.0, 9.0), by="measured"),
    ]
    s = summarize(rows)
    assert s["confusion"] == {
        "right": 2,
        "wrong reject": 1,
        "wrong keep": 0,
        "within noise": 1,
        "agree_where_clear": round(2 / 3, 3),
    }
    assert s["worst_wrong_reject"] == 0.5
    assert s["where_the_guard_chose"]["right"] == 2 and s["wrong_keeps_within_margin"] == 0
    assert s["by_decided_by"]["measured"]["right"] == 1
    assert s["estimates"]["fused_within_2x"] == 0.75 and s["estimates"]["eager_within_2x"] == 0.75
    assert "decisions" in format_summary(s, "cpu")


def test_summary_counts_keeps_where_the_guard_timed_eager_dearer_on_the_device():
    def row(device_us):
        r = Row("ops", "p", "tune", "forward", "R", ["add"], "keep", "measured", "keep")
        r.fused_us, r.eager_us, r.truth, r.verdict = 10.0, 9.0, "eager", "wrong keep"
        if device_us is not None:
            r.guard_measured = {"measured_region_device_us": device_us[0], "measured_eager_device_us": device_us[1]}
        return r

    s = summarize([row((8.0, 9.0)), row((8.0, 8.2)), row(None)])
    assert s["wrong_keeps_eager_dearer_on_device"] == 1 and s["wrong_keeps_within_margin"] == 3
    assert "1 have eager dearer on the device as the guard timed it" in format_summary(s, "cuda")


def test_executor_choice_verdicts_and_summary():
    assert choice_verdict_of(True, "other") == "right"
    assert choice_verdict_of(True, "own") == "wrong switch"
    assert choice_verdict_of(False, "other") == "wrong stay"
    assert choice_verdict_of(False, "own") == "right"
    assert choice_verdict_of(False, "noise") == "within noise"

    def row(action, choice_truth, timed_by_guard=True):
        r = Row("ops", "p", "tune", "forward", "R", ["add"], action, "measured", "keep")
        r.other_executor, r.choice_truth, r.other_timed_by_guard = "torchcompile", choice_truth, timed_by_guard
        r.choice_verdict = choice_verdict_of(action == "switch", choice_truth)
        return r

    rows = [row("switch", "other"), row("keep", "own"), row("keep", "other"), row("keep", "other", False)]
    choice = summarize(rows)["executor_choice"]
    assert choice == {
        "right": 2,
        "wrong switch": 0,
        "wrong stay": 2,
        "within noise": 0,
        "agree_where_clear": 0.5,
        "eligible": 4,
        "timed_by_guard": 3,
        "other_faster": 3,
    }
    text = format_summary(summarize(rows), "cuda")
    assert "executor choice (regions another fusion executor could run with the same bits: 4, faster there: 3" in text
    assert "2 right, 0 wrong switch, 2 wrong stay, 0 within noise; agree where clear 50.0%" in text
    # the region decisions (all four 'measured', no fused/eager truth) and the executor choices, pooled
    assert "where it had a choice, executor choices included: agree where clear 50.0%" in text


@pytest.mark.usefixtures("no_inductor")
def test_bench_decisions_quick_runs_on_cpu():
    doc = bench_decisions.run("cpu", quick=True, reps=5, region_s=0.01, log=lambda m: None)
    assert {r["program"] for r in doc["rows"]} == {"add-4KiB", "softmax-4KiB"}
    assert all(r["verdict"] in VERDICTS for r in doc["rows"])
    assert doc["summary"]["timed"] == len(doc["rows"]) == 2
    json.dumps(doc, default=str)


def test_interleaved_us_alternates_the_order_and_times_each_call_on_the_given_clock():
    """A fake clock that each call advances by its function's cost: the samples are those costs, the calls per
    sample follow the fastest single call, rounds alternate their order, and a deadline stops after min_reps."""
    from thunder_fusion_guard.measure.timing import interleaved_us

    now, calls = [0], []

    def costing(name: str, us: int):
        def fn():
            now[0] += us * 1000
            calls.append(name)

        return fn

    fns = [costing("a", 10), costing("b", 30)]
    samples = interleaved_us(fns, [], reps=6, warmup=1, target_sample_us=100, clock=lambda: now[0])
    assert samples == [[10.0] * 6, [30.0] * 6]
    timed = calls[6:]  # two untimed calls each (first and warm-up), then one single call each to size samples
    rounds = [timed[i : i + 20] for i in range(0, len(timed), 20)]
    assert [(r[0], r[-1]) for r in rounds] == [("a", "b"), ("b", "a")] * 3
    assert all(r.count("a") == r.count("b") == 10 for r in rounds)  # 100 µs / 10 µs, the fastest call

    now[0], calls[:] = 0, []
    stopped = interleaved_us(fns, [], reps=6, warmup=0, min_reps=2, deadline_ns=1, clock=lambda: now[0])
    assert [len(s) for s in stopped] == [2, 2]


def test_interleaved_rounds_warms_up_alternates_syncs_each_sample_and_stops_when_asked():
    """The one timing loop of the benchmarks, on a fake clock: warm-up rounds untimed, samples are the calls'
    costs per call (``inner`` calls each), a sync on each side of every sample, two steps' order reversed in odd
    rounds, three steps' balanced (each first, and right after each other, equally often: reversing alone ran the
    last step twice in a row and never after the first), and ``stop`` ends the rounds at the round it names."""
    from thunder_fusion_guard.measure.timing import interleaved_rounds

    now, calls = [0.0], []

    def costing(name: str, cost: float):
        def step():
            now[0] += cost
            calls.append(name)

        return step

    def sync():
        calls.append("sync")

    steps = {"a": costing("a", 1.0), "b": costing("b", 3.0)}
    timed = interleaved_rounds(steps, 4, warmup=2, inner=2, sync=sync, clock=lambda: now[0])
    assert timed.samples == {"a": [1.0] * 4, "b": [3.0] * 4} and timed.cut_at is None
    assert calls[:4] == ["a", "b", "a", "b"]  # the warm-up rounds, neither timed nor synced
    samples = [calls[i : i + 4] for i in range(4, len(calls), 4)]
    assert all(s[0] == s[-1] == "sync" and s[1] == s[2] for s in samples)
    assert [s[1] for s in samples] == ["a", "b", "b", "a", "a", "b", "b", "a"]

    three = {name: costing(name, 1.0) for name in ("eager", "guarded", "inductor")}
    calls[:] = []
    interleaved_rounds(three, 6, clock=lambda: now[0])
    rounds = [tuple(calls[i : i + 3]) for i in range(0, 18, 3)]
    assert all(sorted(r) == ["eager", "guarded", "inductor"] for r in rounds)
    follows = Counter(pair for r in rounds for pair in itertools.pairwise(r))
    assert len(follows) == 6 and set(follows.values()) == {2}  # each step right after each other one twice
    assert set(Counter(r[0] for r in rounds).values()) == {2}  # and first twice

    cut = interleaved_rounds(steps, 10, stop=lambda r: r >= 3, clock=lambda: now[0])
    assert cut.cut_at == 3 and [len(s) for s in cut.samples.values()] == [3, 3]
    with pytest.raises(ValueError, match="inner >= 1"):
        interleaved_rounds(steps, 1, inner=0)


def pointwise_chain(x):
    for k in range(12):  # exact ops only (adds), far cheaper fused by the model's estimate
        x = x + float(k)
    return x


def test_a_region_its_profile_times_slower_is_decided_by_that_timing_next_time(monkeypatch):
    """A region the model keeps, estimates far apart (not timed while compiling), that a profile times slower
    fused than eager: the profile caches its timing, and the next compilation of it decides by that timing
    (rejected, code ``measured``, ``cached_only``) instead of keeping it for want of one. Timings injected."""
    import thunder_fusion_guard.examine.profile_rows as profile_rows
    from thunder_fusion_guard import profile_regions

    monkeypatch.setattr(breakeven, "remember", _REAL_REMEMBER)
    x = torch.randn(64, 1024)
    first = FusionGuard()
    jitted = jit_cpu(pointwise_chain, first)
    jitted(x)
    (kept,) = [d for d in first.report.decisions if d.action == "keep"]
    assert kept.code == "cost_model" and kept.details["decided_by"] == "model"
    times = iter([(50.0, (49.0, 51.0)), (10.0, (9.0, 11.0))] * 4)  # fused, then eager, per region
    monkeypatch.setattr(profile_rows, "_timed", lambda fn, args, reps, warmup: next(times))
    profile = profile_regions(jitted, x, reps=2, warmup=1)
    (row,) = [r for r in profile.rows if r.region == kept.region]
    assert row.decided_by == "model" and "cached" in row.disagreement
    again = FusionGuard()
    jit_cpu(pointwise_chain, again)(x)
    (decided,) = [d for d in again.report.decisions if d.region == kept.region]
    assert decided.action == "reject" and decided.code == "measured"
    assert decided.details["cached_only"] and decided.details["measured_from"] == "cache"
    assert (decided.details["measured_region_us"], decided.details["measured_eager_us"]) == (50.0, 10.0)
