"""A first call's phases: present, non-negative, adding up to its wall time; the guard's own exact under an injected
clock; nothing added by a later call."""

import time

import pytest
import thunder
import thunder.executors.torch_compile as torch_compile
import torch
from thunder.dynamo import thunderfx
from thunder.executors.torch_compile import torch_compile_ex

from thunder_fusion_guard import Costs, FirstCall, FusionGuard, first_call
from thunder_fusion_guard import _thunder as th
from thunder_fusion_guard.examine import first_call as first_call_module
from thunder_fusion_guard.measure import calibrate
from thunder_fusion_guard.phases import (
    CAPTURE,
    DYNAMO,
    EXECUTION,
    FUSION_COMPILE,
    GUARD_MEASUREMENTS,
    GUARD_PASSES,
    OTHER,
    PHASES,
    PhaseLedger,
    active,
)

pytestmark = pytest.mark.usefixtures("no_inductor_module")

S = 1_000_000_000  # ns


class FakeClock:
    """Nanoseconds that move 1 ns at each read, and by whole seconds where a test says (``jump``)."""

    def __init__(self) -> None:
        self.now = 10 * S

    def __call__(self) -> int:
        self.now += 1
        return self.now

    def jump(self, seconds: float) -> None:
        self.now += int(seconds * S)


def _fn(x, w):
    return torch.tanh(x @ w).exp() * 2.0 + 1.0


def _inputs():
    torch.manual_seed(0)
    return torch.randn(4, 8, requires_grad=True), torch.randn(8, 8, requires_grad=True)


def _step(fn, x, w):
    fn(x, w).sum().backward()


def _adds_up(first: FirstCall) -> None:
    assert list(first.phases_s) == list(PHASES)
    assert all(s >= 0 for s in first.phases_s.values()), first.phases_s
    assert sum(first.phases_s.values()) == pytest.approx(first.wall_s, abs=1e-9)


@pytest.fixture
def clock(monkeypatch):
    """One fake clock for Thunder's timestamps and the guard's alike (both read ``time.perf_counter_ns``)."""
    fake = FakeClock()
    monkeypatch.setattr(time, "perf_counter_ns", fake)
    return fake


@pytest.fixture
def slow_compiles(monkeypatch, clock):
    """Each torch.compile region takes 2 s (of the fake clock) at its first call, as a compile would; the count of
    first calls is returned."""
    made = torch_compile.make_compiled
    first_calls = []

    def make(*args, **kwargs):
        fn = made(*args, **kwargs)
        called = []

        def region(*a):
            if not called:
                called.append(True)
                first_calls.append(True)
                clock.jump(2)
            return fn(*a)

        return region

    monkeypatch.setattr(torch_compile, "make_compiled", make)
    return first_calls


def test_phases_of_a_jit_first_call_are_exact_where_the_guard_times(monkeypatch, clock, slow_compiles):
    def calibration(device, executor, budget_s, spent=None):  # 5 s of calibration, constants none
        clock.jump(5)
        return None, "not calibrated (test)", 5.0

    monkeypatch.setattr(calibrate, "cached", lambda device, executor: None)
    monkeypatch.setattr(calibrate, "auto_calibrate", calibration)
    guard = FusionGuard(costs=Costs(cost_model=False, calibration="measure"))
    jitted = thunder.jit(_fn, executors=[torch_compile_ex], transforms=[guard])
    x, w = _inputs()
    with first_call(jitted) as first:
        _step(jitted, x, w)
    assert active() is None
    _adds_up(first)
    regions = len(slow_compiles)
    assert regions >= 2  # forward and backward
    assert len(first.regions_s) == regions
    assert all(s == pytest.approx(2, abs=1e-6) for s in first.regions_s.values())
    assert {name.split()[0] for name in first.regions_s} == {"forward", "backward"}
    assert first.phases_s[FUSION_COMPILE] == pytest.approx(2 * regions, abs=1e-6)
    assert first.phases_s[GUARD_MEASUREMENTS] == pytest.approx(5, abs=1e-6)
    assert 0 < first.phases_s[GUARD_PASSES] < 1e-3
    # the 2 s of the forward region's first call are its own, not the execution's, nor anyone else's
    assert first.phases_s[EXECUTION] < 1e-3
    assert first.phases_s[OTHER] < 1e-3
    assert first.phases_s[DYNAMO] == first.phases_s[CAPTURE] == 0
    assert first.wall_s == pytest.approx(5 + 2 * regions, abs=1e-3)
    assert guard.report.first_call == first.to_dict()
    assert guard.report.to_dict()["first_call"]["phases_s"][FUSION_COMPILE] == pytest.approx(2 * regions)
    line = f"first call {first.wall_s:.3f} s: guard measurements 5.000 s, fusion compile {2 * regions:.3f} s"
    assert line in guard.report.to_text()


def test_a_second_call_adds_nothing(clock, slow_compiles):
    guard = FusionGuard(costs=Costs(cost_model=False))
    jitted = thunder.jit(_fn, executors=[torch_compile_ex], transforms=[guard])
    x, w = _inputs()
    with first_call(jitted) as first:
        out = jitted(x, w)  # the forward alone: the backward's regions first run after the block
    kept = first.to_dict()
    assert len(first.regions_s) == len(slow_compiles) == 1
    out.sum().backward()
    _step(jitted, x, w)
    assert len(slow_compiles) == 2  # the backward's region did compile, after the block
    assert first.to_dict() == kept
    assert guard.report.first_call == kept
    _adds_up(first)


def test_thunderfx_first_call_names_dynamo_and_the_subgraphs():
    def with_unsupported(x):
        y = torch.tanh(x.reshape(4, 3).t() * 2.0)
        return torch.cummax(y, 0)[0].reshape(-1).exp() + 1.0

    guard = FusionGuard(costs=Costs(cost_model=False))
    compiled = thunderfx(with_unsupported, transforms=[guard], executors=[torch_compile_ex])
    x = torch.randn(3, 4)
    with first_call(compiled) as first:
        compiled(x)
    _adds_up(first)
    assert first.phases_s[DYNAMO] > 0  # Dynamo traced a frame, and says for how long
    assert first.phases_s["thunder_tracing"] > 0
    assert first.regions_s and all(name.startswith("subgraph ") for name in first.regions_s)
    kept = first.to_dict()
    compiled(x)
    assert first.to_dict() == kept == guard.report.first_call


def test_nested_sections_count_for_their_own_phase_once():
    clock = FakeClock()
    ledger = PhaseLedger(clock)
    with ledger.timed(GUARD_PASSES):
        clock.jump(1)
        with ledger.timed(GUARD_MEASUREMENTS):
            clock.jump(3)
    with ledger.timed(FUSION_COMPILE, region="forward r"):
        clock.jump(2)
        with ledger.timed(FUSION_COMPILE, region="forward s"):
            clock.jump(4)
    ledger.open = False
    with ledger.timed(FUSION_COMPILE, region="late"):
        clock.jump(7)
    assert ledger.seconds(GUARD_PASSES) == pytest.approx(1, abs=1e-6)
    assert ledger.seconds(GUARD_MEASUREMENTS) == pytest.approx(3, abs=1e-6)
    assert ledger.seconds(FUSION_COMPILE) == pytest.approx(6, abs=1e-6)
    assert ledger.regions_ns["forward r"] == pytest.approx(6 * S, abs=10)
    assert "late" not in ledger.regions_ns
    assert ledger.compiling_ns == pytest.approx(4 * S, abs=10)
    assert ledger.executing_ns == pytest.approx(6 * S, abs=10)


def test_dynamo_records_inside_a_region_first_call_are_left_out(monkeypatch):
    metrics = {th.DYNAMO_FRAME: [1.0, 10.0, 2.0], th.DYNAMO_BACKEND: [0.5], th.INDUCTOR_COMPILE: []}
    monkeypatch.setattr(torch._dynamo.utils, "compilation_time_metrics", metrics)
    before = {th.DYNAMO_FRAME: 0, th.DYNAMO_BACKEND: 0, th.INDUCTOR_COMPILE: 0}
    after = th.dynamo_counts()
    apart = [({th.DYNAMO_FRAME: 1}, {th.DYNAMO_FRAME: 2})]  # the 10 s frame: a region's torch.compile
    seconds = th.dynamo_seconds(before, after, apart)
    assert seconds == {th.DYNAMO_FRAME: 3.0, th.DYNAMO_BACKEND: 0.5, th.INDUCTOR_COMPILE: 0, th.INDUCTOR_LOAD: 0}


def test_unguarded_region_compiles_are_fusion_compile_not_dynamo_nor_execution(monkeypatch):
    """Phases from Dynamo's records and the compiles' windows as given: the user's frame's seconds stay Dynamo's and
    the backend's; a region's Dynamo compile is its fusion compile, out of the forward's execution."""
    metrics = {th.DYNAMO_FRAME: [4.0, 1.5, 0.5], th.DYNAMO_BACKEND: [3.0, 1.0, 0.25], th.INDUCTOR_COMPILE: [2.0]}
    monkeypatch.setattr(torch._dynamo.utils, "compilation_time_metrics", metrics)
    zero = dict.fromkeys((th.DYNAMO_FRAME, th.DYNAMO_BACKEND, th.INDUCTOR_COMPILE, th.INDUCTOR_LOAD), 0)

    def counts(frame, backend):
        return {**zero, th.DYNAMO_FRAME: frame, th.DYNAMO_BACKEND: backend, th.INDUCTOR_COMPILE: 1}

    compiles = [
        th.DynamoCompile(zero, {**counts(1, 1), th.INDUCTOR_COMPILE: 1}, 0, 4 * S, False, False, True, False),
        th.DynamoCompile(counts(1, 1), counts(2, 2), 5 * S, 6 * S + S // 2, True, False, True, False),  # forward
        th.DynamoCompile(counts(2, 2), counts(3, 3), 8 * S, 8 * S + S // 2, True, False, False, False),  # backward
        # a split piece's backward Inductor compiled at run time (1 s), and a CUDA graph recorded (not a compile)
        th.DynamoCompile(counts(3, 3), counts(3, 3), 9 * S, 10 * S, False, False, False, False, "LAZY_BACKWARD"),
        th.DynamoCompile(counts(3, 3), counts(3, 3), 9 * S, 9 * S + 1, *[False] * 4, "CUDAGRAPH_RECORDING"),
    ]
    record = FirstCall()
    ledger = PhaseLedger(FakeClock())
    ledger.open = False
    compiled = object()
    monkeypatch.setattr(th, "is_thunderfx", lambda obj: obj is compiled)
    monkeypatch.setattr(first_call_module, "_thunder_functions", lambda obj: [])
    first_call_module._fill(record, compiled, ledger, 10.0, {}, zero, compiles)
    phases = record.phases_s
    assert phases[DYNAMO] == pytest.approx(1.0)  # 4 - 3: the user's frame only
    assert phases["thunderfx_split"] == pytest.approx(1.0)  # 3 - 2 of Inductor
    assert phases["inductor"] == pytest.approx(3.0)  # 2 s of its records, 1 s of a backward it compiled later
    assert phases[FUSION_COMPILE] == pytest.approx(2.0)  # 1.5 forward, 0.5 in backward
    assert phases[OTHER] == pytest.approx(3.0)


def test_one_window_at_a_time():
    jitted = thunder.jit(_fn)
    with first_call(jitted), pytest.raises(RuntimeError, match="one window at a time"), first_call(jitted):
        pass


def test_thunders_transforms_end_where_the_program_first_runs(monkeypatch):
    """A later call that runs the prologue without Thunder's cache search (the guard's direct entry) moves Thunder's
    prologue timestamp past the first execution: the transforms still end where the compiled program first ran."""
    from types import SimpleNamespace

    stats = SimpleNamespace(
        calls=2,
        cache_misses=1,
        last_trace_tracing_start=100,
        last_trace_tracing_stop=200,
        last_prologue_transformation_start=201,
        last_trace_host_execution_start=300,
        last_trace_host_execution_stop=400,
        last_prologue_execution_start=450,  # the second call's prologue, after the first call's execution
    )
    monkeypatch.setattr(thunder, "compile_stats", lambda fn: stats)
    times = th.thunder_times(object())
    assert (times.tracing_ns, times.transforms_ns, times.execution_ns) == (100, 100, 100)
    stats.last_prologue_execution_start = 250  # one call: its prologue, then its computation
    assert th.thunder_times(object()).transforms_ns == 50
    stats.last_prologue_transformation_start = 0  # the last call found its program in Thunder's cache
    assert th.thunder_times(object()).transforms_ns == 0
