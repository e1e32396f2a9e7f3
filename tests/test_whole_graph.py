"""A Dynamo graph unguarded Thunder fails on runs whole by Inductor where timed faster than its split (runtime
``whole_graphs``): unguarded, the program raises, so no Thunder bits are there to keep. Timings are injected."""

from __future__ import annotations

import pytest
import torch
from helpers import jit_cpu, regions, steps_against_eager
from thunder.dynamo import thunderfx

import thunder_fusion_guard.transform as transform_module
import thunder_fusion_guard.whole_graph as whole_graph
from thunder_fusion_guard import FusionGuard, Runtime, explain, fusion_executors
from thunder_fusion_guard._thunder import combo, matmul_sums
from thunder_fusion_guard.cost import Measured
from thunder_fusion_guard.measure.breakeven import RegionMeasurer
from thunder_fusion_guard.whole_graph import WholeGraphRun

REAL_PAIR = RegionMeasurer.pair  # before the suite's fixture stands in for it (conftest _no_real_timings)


def broadcast_then_sine(x: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    y = (x.broadcast_to(s.shape) * s).sin()  # Thunder 0.2.6 has no Tensor.broadcast_to when it runs (MACE's)
    return y.cos() * 2


def _timed(split_us: float, whole_us: float, calls: list[int], spread: float | None = None, **apart):
    """A timer giving the split ``split_us`` and Inductor's whole graph ``whole_us``; ``apart``: ``host`` and
    ``device`` pairs (split's, whole's), where the call asks for them."""

    def pair(split, whole, args, **allowance):
        calls.append(allowance.get("apart"))
        split(), whole()  # run as a timing would, on the copies
        return Measured(split_us, whole_us, "timed", spread, **(apart if allowance.get("apart") else {}))

    return pair


def broadcast_then_matmul(x: torch.Tensor, s: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return ((x.broadcast_to(s.shape) * s) @ w).sin()  # a small matmul (8 terms) Inductor may decompose


def _run(guard: FusionGuard, steps: int = 3, device: str = "cpu", matmul: bool = False):
    """``steps`` calls of the guarded program (``matmul``: :func:`broadcast_then_matmul`), each against eager:
    outputs and gradients; its split graph."""
    torch._dynamo.reset()  # each test compiles this function again: Dynamo's recompile limit must not be reached
    x, s = torch.randn(1, 8, device=device, requires_grad=True), torch.randn(4, 8, device=device)
    fn, args = broadcast_then_sine, (x, s)
    if matmul:
        fn, args = broadcast_then_matmul, (x, s, torch.randn(8, 8, device=device))
    compiled = thunderfx(fn, executors=fusion_executors(device), transforms=[guard])
    steps_against_eager(compiled, fn, lambda: args, x, steps, atol=1e-5 if matmul else 1e-6)
    (info,) = compiled._backend.subgraph_infos
    return compiled, info.split_graph_module


def test_a_graph_unguarded_thunder_fails_on_runs_whole_by_inductor_where_timed_faster():
    guard, calls = FusionGuard(), []
    guard.measurer.pair = _timed(100.0, 10.0, calls)
    compiled, split = _run(guard)
    assert len(calls) == 1  # timed once, at the call after the failure
    assert "inductor: Dynamo graphs" not in explain(compiled)  # its one graph's whole graph was timed
    assert isinstance(vars(split)["forward"], WholeGraphRun)
    (rescue,) = guard.report.filter(action="rescue")
    (whole,) = guard.report.filter(code="whole_graph")
    assert whole.action == "switch" and whole.executor == "inductor" and whole.region == "dynamo graph 0"
    assert whole.subgraph == rescue.subgraph and "broadcast_to" in whole.facts["error"]
    assert (whole.details["split_us"], whole.details["inductor_us"]) == (100.0, 10.0)
    line = broadcast_then_sine.__code__.co_firstlineno + 1
    assert whole.details["source"].endswith(f"test_whole_graph.py:{line}")
    assert "combo_kernels" not in whole.facts  # a CPU graph: Inductor's combo kernels are not tried


def _timed_in_turn(*timings: tuple[float, float] | Measured):
    """A timer giving ``timings`` in turn: (the split's µs, the whole graph's), then (Inductor's default compile's
    µs, its compile with combo kernels'); a :class:`Measured` given as it is (host and device apart, say)."""
    left = list(timings)

    def pair(first, second, args, **allowance):
        first(), second()
        timing = left.pop(0)
        return timing if isinstance(timing, Measured) else Measured(*timing, "timed")

    return pair


def _compiles_seen(
    monkeypatch, fail_with_options: bool = False, realized: bool = False
) -> list[tuple[dict | None, object]]:
    """Inductor's whole-graph compiles, each with its options and what it returned; combo kernels tried on CPU, and
    fewer buffers realized after them only where ``realized``."""
    monkeypatch.setattr(combo, "COMBO_KERNEL_DEVICES", ("cpu",))
    if not realized:
        monkeypatch.setattr(whole_graph, "_with_fewer_realized", lambda found, *a: found)
    seen, real = [], whole_graph.compile_fx_module

    def compiling(module, inputs, backend, options=None):
        if options and fail_with_options:
            raise RuntimeError("planted combo kernel failure")
        compiled = real(module, inputs, backend, options)
        seen.append((options, compiled))
        return compiled

    monkeypatch.setattr(whole_graph, "compile_fx_module", compiling)
    return seen


@pytest.mark.parametrize("combo_us", [8.0, 12.0])
def test_inductors_compile_with_combo_kernels_runs_the_graph_only_where_timed_faster_than_its_default(
    monkeypatch, combo_us
):
    seen = _compiles_seen(monkeypatch)
    guard = FusionGuard()
    guard.measurer.pair = _timed_in_turn((100.0, 10.0), (10.0, combo_us))
    _, split = _run(guard)
    assert [options for options, _ in seen] == [None, whole_graph.COMBO_KERNELS]
    (whole,) = guard.report.filter(code="whole_graph")
    faster = combo_us < 10.0
    assert whole.facts["combo_kernels"] is faster and whole.details["combo_kernels"] is faster
    assert whole.details["combo_us"] == combo_us and whole.details["inductor_us"] == 10.0
    assert "combo_why" not in whole.facts  # timed both ways: the timings say why
    assert vars(split)["forward"].whole is seen[1 if faster else 0][1]


@pytest.mark.parametrize("decomposed_us", [8.0, 12.0])
def test_inductors_compile_with_small_matmuls_decomposed_runs_the_graph_only_where_timed_faster(
    monkeypatch, decomposed_us
):
    seen = _compiles_seen(monkeypatch)
    monkeypatch.setattr(combo, "COMBO_KERNEL_DEVICES", ())  # combo kernels not tried: the decomposition alone
    guard = FusionGuard()
    best = min(10.0, decomposed_us)  # then the summed matmuls, slower
    # all the options together first, slower: then each alone
    guard.measurer.pair = _timed_in_turn((100.0, 10.0), (10.0, 11.0), (10.0, decomposed_us), (best, best + 1.0))
    _, split = _run(guard, matmul=True)  # each step within 1e-5 of eager, gradients too
    faster = decomposed_us < 10.0
    summed = {**(whole_graph.DECOMPOSED_MATMULS if faster else {}), **whole_graph.SUMMED_MATMULS}
    stacked = {**whole_graph.DECOMPOSED_MATMULS, **whole_graph.WIDE_SUMMED_MATMULS}
    assert [options for options, _ in seen] == [None, stacked, whole_graph.DECOMPOSED_MATMULS, summed]
    (whole,) = guard.report.filter(code="whole_graph")
    assert whole.facts["summed_matmuls"] is False and whole.facts["summed"].eager_us == best + 1.0
    assert whole.facts["decomposed_matmuls"] is faster and whole.details["decomposed_matmuls"] is faster
    assert whole.details["decomposed_us"] == decomposed_us and "combo_kernels" not in whole.facts
    assert whole.facts["all_options"] is False and whole.facts["stacked"].eager_us == 11.0
    assert vars(split)["forward"].whole is seen[2 if faster else 0][1]


def test_the_decomposition_rewrites_the_graphs_matmuls_and_leaves_torchs_thresholds_as_they_were():
    from torch._dynamo.utils import counters
    from torch._inductor.fx_passes import decompose_mem_bound_mm as decompose

    before = {name: getattr(decompose, name) for name in vars(decompose) if name.endswith("_decomposition")}
    counters.clear()
    guard = FusionGuard()
    guard.measurer.pair = _timed_in_turn((100.0, 10.0), (10.0, 11.0), (10.0, 8.0), (8.0, 9.0))
    with torch._inductor.config.patch(fx_graph_cache=False):  # compiled here, not read from a cache
        _run(guard, matmul=True)
    assert counters["inductor"]["decompose_mm"] >= 1  # torch's pass ran with the guard's thresholds
    assert {name: getattr(decompose, name) for name in before} == before  # and torch's are back


def test_a_graph_without_matmuls_is_not_compiled_with_them_decomposed(monkeypatch):
    seen = _compiles_seen(monkeypatch)
    monkeypatch.setattr(combo, "COMBO_KERNEL_DEVICES", ())
    guard = FusionGuard()
    guard.measurer.pair = _timed_in_turn((100.0, 10.0))
    _run(guard)
    assert [options for options, _ in seen] == [None]
    (whole,) = guard.report.filter(code="whole_graph")
    assert "decomposed_matmuls" not in whole.facts


@pytest.mark.parametrize("again_us", [50.0, 95.0])
def test_where_inductors_defaults_lose_its_faster_option_is_timed_against_the_split_again(monkeypatch, again_us):
    seen = _compiles_seen(monkeypatch)
    monkeypatch.setattr(combo, "COMBO_KERNEL_DEVICES", ())  # the small-matmul rewrites alone
    guard = FusionGuard()
    # the split 100 µs against Inductor's default whole graph 95 (not by the margin); the rewrites 50 against 95;
    # then the split again against the rewritten compile: ``again_us``
    # (all the options together 96 against 95 and the summed matmuls 60 against 50, not faster)
    timings = (100.0, 95.0), (95.0, 96.0), (95.0, 50.0), (50.0, 60.0), (100.0, again_us)
    guard.measurer.pair = _timed_in_turn(*timings)
    _, split = _run(guard, matmul=True)  # each step within 1e-5 of eager, gradients too
    summed = {**whole_graph.DECOMPOSED_MATMULS, **whole_graph.SUMMED_MATMULS}
    stacked = {**whole_graph.DECOMPOSED_MATMULS, **whole_graph.WIDE_SUMMED_MATMULS}
    assert [options for options, _ in seen] == [None, stacked, whole_graph.DECOMPOSED_MATMULS, summed]
    wins = again_us == 50.0
    (decision,) = guard.report.filter(code="whole_graph" if wins else "whole_graph_kept")
    assert (decision.details["split_us"], decision.details["inductor_us"]) == (100.0, again_us)
    assert decision.facts["decomposed"].eager_us == 50.0  # the rewrites' own timing, recorded either way
    assert decision.facts["decomposed_matmuls"] is wins and decision.details["decomposed_matmuls"] is wins
    if wins:
        assert vars(split)["forward"].whole is seen[2][1]
    else:
        assert "forward" not in vars(split)  # ThunderFX's split runs it, as before


def test_where_inductors_defaults_lose_and_no_option_is_faster_the_split_is_not_timed_again(monkeypatch):
    seen = _compiles_seen(monkeypatch)
    monkeypatch.setattr(combo, "COMBO_KERNEL_DEVICES", ())
    guard = FusionGuard()
    # the split, all the options, the decomposition, the summed matmuls: a fifth timing would raise IndexError
    guard.measurer.pair = _timed_in_turn((100.0, 95.0), (95.0, 98.0), (95.0, 97.0), (95.0, 96.0))
    _, split = _run(guard, matmul=True)
    stacked = {**whole_graph.DECOMPOSED_MATMULS, **whole_graph.WIDE_SUMMED_MATMULS}
    options = [None, stacked, whole_graph.DECOMPOSED_MATMULS, whole_graph.SUMMED_MATMULS]
    assert [options for options, _ in seen] == options
    (kept,) = guard.report.filter(code="whole_graph_kept")
    assert (kept.details["split_us"], kept.details["inductor_us"]) == (100.0, 95.0)
    assert kept.facts["decomposed_matmuls"] is False and kept.facts["decomposed"].eager_us == 97.0
    assert kept.facts["summed_matmuls"] is False and kept.facts["summed"].eager_us == 96.0
    assert "forward" not in vars(split)


@pytest.mark.parametrize("summed_us", [6.0, 9.0])
def test_the_summed_matmuls_run_the_graph_only_where_timed_faster_with_the_options_before_them(monkeypatch, summed_us):
    seen = _compiles_seen(monkeypatch)  # combo kernels tried on CPU here
    guard = FusionGuard()
    # split 100 against whole 20; all options 21; combo kernels 10; decomposed 8 against 10; summed ``summed_us``
    # against 8; where faster, larger results summed too, 7 against it (slower)
    timings = (100.0, 20.0), (20.0, 21.0), (20.0, 10.0), (10.0, 8.0), (8.0, summed_us), (6.0, 7.0)
    guard.measurer.pair = _timed_in_turn(*timings)
    _, split = _run(guard, matmul=True)  # each step within 1e-5 of eager, gradients too
    faster = summed_us < 8.0
    options = [whole_graph.COMBO_KERNELS, whole_graph.DECOMPOSED_MATMULS, whole_graph.SUMMED_MATMULS]
    summed_at = -2 if faster else -1  # the wider compile after it where it runs the graph, else nothing
    assert [o for o, _ in seen][summed_at] == {key: value for o in options for key, value in o.items()}
    (whole,) = guard.report.filter(code="whole_graph")
    assert whole.facts["summed_matmuls"] is faster and whole.details["summed_matmuls"] is faster
    assert whole.details["summed_us"] == summed_us and whole.facts["decomposed_matmuls"] is True
    assert ("wide" in whole.facts) is faster and whole.facts.get("wide_matmuls", False) is False
    assert vars(split)["forward"].whole is seen[summed_at if faster else -2][1]


@pytest.mark.parametrize("wide_us", [5.0, 7.0])
def test_larger_results_summed_run_the_graph_only_where_timed_faster_than_the_small_ones(monkeypatch, wide_us):
    seen = _compiles_seen(monkeypatch)  # combo kernels tried on CPU here
    guard = FusionGuard()
    # split 100 against whole 20; all options 21; combo kernels 10; decomposed 8; summed 6; larger results summed
    # ``wide_us``
    timings = (100.0, 20.0), (20.0, 21.0), (20.0, 10.0), (10.0, 8.0), (8.0, 6.0), (6.0, wide_us)
    guard.measurer.pair = _timed_in_turn(*timings)
    _, split = _run(guard, matmul=True)  # each step within 1e-5 of eager, gradients too
    options = [whole_graph.COMBO_KERNELS, whole_graph.DECOMPOSED_MATMULS, whole_graph.WIDE_SUMMED_MATMULS]
    assert [o for o, _ in seen][-1] == {key: value for o in options for key, value in o.items()}
    assert seen[-1][0]["post_grad_custom_post_pass"].most == matmul_sums.WIDE_RESULT > matmul_sums.SMALL_RESULT
    (whole,) = guard.report.filter(code="whole_graph")
    faster = wide_us < 6.0
    assert whole.facts["wide_matmuls"] is faster and whole.details["wide_matmuls"] is faster
    assert whole.details["wide_us"] == wide_us and whole.facts["summed_matmuls"] is True
    assert vars(split)["forward"].whole is seen[-1 if faster else -2][1]


def test_a_failing_summed_compile_keeps_the_compile_before_it_and_says_why(monkeypatch):
    seen = _compiles_seen(monkeypatch)
    monkeypatch.setattr(combo, "COMBO_KERNEL_DEVICES", ())
    real = whole_graph.compile_fx_module

    def failing(module, inputs, backend, options=None):
        if options and "post_grad_custom_post_pass" in options:
            raise RuntimeError("planted failure of the summed matmuls")
        return real(module, inputs, backend, options)

    monkeypatch.setattr(whole_graph, "compile_fx_module", failing)
    guard = FusionGuard()
    guard.measurer.pair = _timed_in_turn((100.0, 10.0), (10.0, 8.0))
    _, split = _run(guard, matmul=True)
    (whole,) = guard.report.filter(code="whole_graph")
    assert whole.facts["summed_matmuls"] is False and "planted failure" in whole.facts["summed_why"]
    assert "summed" not in whole.facts and whole.facts["decomposed_matmuls"] is True
    assert whole.facts["all_options"] is False and "planted failure" in whole.facts["stacked_why"]
    assert vars(split)["forward"].whole is seen[-1][1]  # the decomposed compile


@pytest.mark.parametrize("stacked_us", [5.0, 25.0])
def test_all_options_compiled_together_run_the_graph_where_faster_with_no_option_compiled_alone(
    monkeypatch, stacked_us
):
    seen = _compiles_seen(monkeypatch)  # combo kernels tried on CPU here
    guard = FusionGuard()
    # split 100 against whole 20; all options together ``stacked_us``; where slower, each alone: combo kernels 30,
    # decomposed 30, summed 30 (none faster)
    guard.measurer.pair = _timed_in_turn((100.0, 20.0), (20.0, stacked_us), (20.0, 30.0), (20.0, 30.0), (20.0, 30.0))
    _, split = _run(guard, matmul=True)  # each step within 1e-5 of eager, gradients too
    options = [whole_graph.COMBO_KERNELS, whole_graph.DECOMPOSED_MATMULS, whole_graph.WIDE_SUMMED_MATMULS]
    assert seen[1][0] == {key: value for o in options for key, value in o.items()}
    (whole,) = guard.report.filter(code="whole_graph")
    faster = stacked_us < 20.0
    assert whole.facts["all_options"] is faster and whole.facts["stacked"].eager_us == stacked_us
    flags = ("combo_kernels", "decomposed_matmuls", "summed_matmuls", "wide_matmuls")
    assert [whole.facts.get(flag, False) for flag in flags] == [faster] * 4
    if faster:  # one compile with the options: none timed alone
        assert len(seen) == 2 and not {"combo", "decomposed", "summed", "wide"} & whole.facts.keys()
    else:
        assert len(seen) == 5 and whole.facts["combo"].eager_us == 30.0  # the default, then each option alone
    assert vars(split)["forward"].whole is seen[1 if faster else 0][1]


@pytest.mark.parametrize(
    ("budget_s", "compiled", "over_budget"),
    [
        (0.0, 0, ["all_options", "combo_kernels", "decomposed_matmuls", "summed_matmuls"]),
        (120.0, 3, ["summed_matmuls"]),
        (1000.0, 4, []),
    ],
)
def test_inductors_options_stop_compiling_once_their_compiles_have_taken_the_budget(
    monkeypatch, budget_s, compiled, over_budget
):
    seen = _compiles_seen(monkeypatch)  # combo kernels tried on CPU here
    now = [0.0]
    real = whole_graph.compile_fx_module

    def compiling(module, inputs, backend, options=None):  # each compile with options takes 50 s by this clock
        now[0] += 50.0 if options else 0.0
        return real(module, inputs, backend, options)

    monkeypatch.setattr(whole_graph, "compile_fx_module", compiling)
    monkeypatch.setattr(whole_graph, "clock", lambda: now[0])
    guard = FusionGuard(runtime=Runtime(option_compiles_s=budget_s))
    # split 100 against whole 20; all options together 25 (slower), then each alone 30 (none faster)
    guard.measurer.pair = _timed_in_turn((100.0, 20.0), (20.0, 25.0), *[(20.0, 30.0)] * 3)
    _, split = _run(guard, matmul=True)  # each step within 1e-5 of eager, gradients too
    assert len(seen) == 1 + compiled  # the default compile, then the options' until the budget is spent
    (whole,) = guard.report.filter(code="whole_graph")
    assert whole.action == "switch" and vars(split)["forward"].whole is seen[0][1]
    assert whole.facts.get("over_budget", []) == over_budget
    assert whole.details.get("option_compiles_s", 0.0) == 50.0 * compiled
    if over_budget:
        assert whole.facts["option_budget_s"] == budget_s and whole.facts["option_compiles_s"] == 50.0 * compiled
        assert "not compiled" in whole.reason
    for flag in over_budget:  # not compiled, so not timed: why recorded
        option = next(o for o in whole_graph.WHOLE_GRAPH_OPTIONS if o.runs == flag)
        assert option.timed not in whole.facts and whole.facts[option.why].startswith("not compiled")


def test_a_bad_option_compiles_budget_is_named():
    with pytest.raises(ValueError, match=r"'runtime.option_compiles_s' must be a finite number of seconds >= 0"):
        FusionGuard(runtime=Runtime(option_compiles_s=-1))


@pytest.mark.parametrize(("device_us", "kept"), [((20.0, 20.9), True), ((20.0, 23.0), False)])
def test_an_option_faster_on_the_stream_runs_the_graph_only_where_no_dearer_on_the_device(monkeypatch, device_us, kept):
    seen = _compiles_seen(monkeypatch)  # combo kernels tried on CPU here
    guard = FusionGuard()
    # split 100 against whole 20; all options together 5 on the stream, ``device_us`` on the device (the default
    # compile's, theirs); where not kept, each alone: combo kernels, decomposed, summed 30 (none faster)
    guard.measurer.pair = _timed_in_turn(
        Measured(100.0, 20.0), Measured(20.0, 5.0, device=device_us), *[Measured(20.0, 30.0)] * 3
    )
    _, split = _run(guard, matmul=True)
    (whole,) = guard.report.filter(code="whole_graph")
    assert whole.facts["all_options"] is kept and whole.details["stacked_device_us"] == list(device_us)
    assert whole.facts.get("stacked_dearer_on_device", False) is not kept
    assert ("dearer on the device" in whole.reason) is not kept
    assert len(seen) == (2 if kept else 5) and vars(split)["forward"].whole is seen[1 if kept else 0][1]


@pytest.mark.parametrize(
    ("realized_us", "device_us", "kept"), [(8.0, None, True), (12.0, None, False), (8.0, (5.0, 6.0), False)]
)
def test_fewer_buffers_realized_run_the_graph_only_where_faster_than_the_options_before_and_no_dearer_on_device(
    monkeypatch, realized_us, device_us, kept
):
    seen = _compiles_seen(monkeypatch, realized=True)  # combo kernels tried on CPU here
    guard = FusionGuard()
    # split 100 against whole 20; all options together 10; they against fewer buffers realized too ``realized_us``
    # (on the device ``device_us``: 20% dearer)
    guard.measurer.pair = _timed_in_turn(
        Measured(100.0, 20.0), Measured(20.0, 10.0), Measured(10.0, realized_us, device=device_us)
    )
    _, split = _run(guard, matmul=True)  # each step within 1e-5 of eager, gradients too
    assert len(seen) == 3 and seen[2][0] == {**seen[1][0], **whole_graph.FEWER_REALIZED}
    assert seen[2][0]["realize_opcount_threshold"] > torch._inductor.config.realize_opcount_threshold
    (whole,) = guard.report.filter(code="whole_graph")
    assert whole.facts["all_options"] is True and whole.facts["fewer_realized"] is kept
    assert whole.details["realized_us"] == realized_us
    assert whole.facts.get("realized_dearer_on_device", False) is (device_us is not None)
    assert ("with fewer buffers realized, 8 µs against 10" in whole.reason) is kept
    assert vars(split)["forward"].whole is seen[2 if kept else 1][1]


def test_fewer_buffers_realized_are_not_tried_without_combo_kernels(monkeypatch):
    seen = _compiles_seen(monkeypatch, realized=True)
    monkeypatch.setattr(combo, "COMBO_KERNEL_DEVICES", ())  # Inductor's C++ kernels: no combo kernels
    guard = FusionGuard()
    guard.measurer.pair = _timed_in_turn((100.0, 20.0))
    _run(guard)  # no matmul: no option applies
    (whole,) = guard.report.filter(code="whole_graph")
    assert len(seen) == 1 and "fewer_realized" not in whole.facts and "realized" not in whole.facts


def test_has_matmuls_finds_matmul_functions_methods_operators_and_linears():
    assert whole_graph.has_matmuls(torch.fx.symbolic_trace(lambda a, b: (a @ b).sin()))
    assert whole_graph.has_matmuls(torch.fx.symbolic_trace(lambda a, b: torch.einsum("ij,jk->ik", a, b)))
    assert whole_graph.has_matmuls(torch.fx.symbolic_trace(lambda a, b: a.matmul(b)))
    assert whole_graph.has_matmuls(torch.fx.symbolic_trace(torch.nn.Sequential(torch.nn.Linear(2, 2))))
    assert not whole_graph.has_matmuls(torch.fx.symbolic_trace(lambda a, b: (a * b).sum(-1)))


@pytest.mark.cuda
def test_on_cuda_inductors_compile_with_combo_kernels_is_tried_and_runs_within_eagers_rounding():
    guard = FusionGuard()
    # then fewer buffers realized, tried where combo kernels run the graph: level, so not kept
    guard.measurer.pair = _timed_in_turn((100.0, 10.0), (10.0, 8.0), (8.0, 8.0))
    _, split = _run(guard, device="cuda")  # each step within 1e-6 of eager, gradients too
    (whole,) = guard.report.filter(code="whole_graph")
    assert whole.facts["combo_kernels"] is True and isinstance(vars(split)["forward"], WholeGraphRun)
    assert whole.facts["fewer_realized"] is False


def test_a_failing_compile_with_combo_kernels_keeps_inductors_default_compile(monkeypatch):
    seen = _compiles_seen(monkeypatch, fail_with_options=True)
    guard = FusionGuard()
    guard.measurer.pair = _timed_in_turn((100.0, 10.0))  # timed once: the combo compile never ran
    _, split = _run(guard)
    (whole,) = guard.report.filter(code="whole_graph")
    assert whole.facts["combo_kernels"] is False and "planted combo kernel failure" in whole.facts["combo_why"]
    assert "combo_us" not in whole.details and vars(split)["forward"].whole is seen[0][1]


def test_the_split_stays_where_inductors_whole_graph_is_not_faster_by_the_margin():
    guard, calls = FusionGuard(), []
    guard.measurer.pair = _timed(100.0, 95.0, calls)  # 5% faster: under the margin
    compiled, split = _run(guard)
    assert len(calls) == 1 and "forward" not in vars(split)
    assert "inductor: Dynamo graphs" not in explain(compiled)  # the split kept, timed against the whole graph
    (kept,) = guard.report.filter(code="whole_graph_kept")
    assert kept.action == "keep" and kept.details["decided_by"] == "measured"


@pytest.mark.parametrize(
    ("whole_us", "spread", "margin", "runs_whole"),
    [
        (85.0, 0.03, 0.05, True),  # 15% faster, the timing within 3%: beyond the 5% floor
        (96.0, 0.03, 0.05, False),  # 4% faster: within the floor
        (85.0, 0.18, 0.18, False),  # 15% faster, the timing within 18%: within its spread
        (81.0, 0.25, 0.20, False),  # 19% faster, a spread wider than the option: the option's 20% caps it
        (85.0, None, 0.20, False),  # a timing without a spread: the option's 20%
    ],
)
def test_with_no_thunder_bits_to_keep_the_margin_narrows_to_the_timings_spread(whole_us, spread, margin, runs_whole):
    """On CPU calls are synchronous: the timing is what the program sees, as for a measured keep or reject."""
    guard, calls = FusionGuard(), []
    guard.measurer.pair = _timed(100.0, whole_us, calls, spread)
    _, split = _run(guard)
    assert calls == [False]  # host and device apart are not asked for off CUDA
    (found,) = guard.report.filter(code="whole_graph" if runs_whole else "whole_graph_kept")
    assert isinstance(vars(split).get("forward"), WholeGraphRun) is runs_whole
    assert found.details["margin"] == margin and found.facts["margin"] == margin
    narrowed = margin != 0.20
    assert ("margin_from" in found.facts) is narrowed and found.facts.get("margin_from", 0.20) == 0.20
    assert found.details.get("margin_narrowed") == ("synchronous" if narrowed else None)


@pytest.mark.cuda
@pytest.mark.parametrize(
    ("device_us", "runs_whole"),
    [((10.0, 9.0), True), ((10.0, 11.0), False)],  # the whole graph no dearer on the device, or 10% dearer
)
def test_on_cuda_the_margin_narrows_only_where_the_whole_graph_is_no_dearer_on_host_nor_device(device_us, runs_whole):
    guard, calls = FusionGuard(), []
    timer = _timed(100.0, 85.0, calls, 0.03, host=(100.0, 60.0), device=device_us)
    guard.measurer.pair = lambda *a, **k: timer(*a, **k) if len(calls) == 0 else Measured(10.0, 12.0, "timed")
    _, split = _run(guard, device="cuda")
    assert calls == [True]  # the whole graph timed with host and device apart
    (found,) = guard.report.filter(code="whole_graph" if runs_whole else "whole_graph_kept")
    assert found.details.get("margin_narrowed") == ("host_and_device" if runs_whole else None)
    assert isinstance(vars(split).get("forward"), WholeGraphRun) is runs_whole


def test_off_by_option_and_on_several_ranks_nothing_is_timed(monkeypatch):
    guard, calls = FusionGuard(runtime=Runtime(whole_graphs=False)), []
    guard.measurer.pair = _timed(100.0, 10.0, calls)
    _, split = _run(guard)
    assert calls == [] and "forward" not in vars(split) and not guard.report.filter(code="whole_graph_kept")
    monkeypatch.setattr(transform_module, "world_size", lambda: 2)
    guard = FusionGuard()
    guard.measurer.pair = _timed(100.0, 10.0, calls)
    _, split = _run(guard)
    assert calls == [] and "forward" not in vars(split)
    (kept,) = guard.report.filter(code="whole_graph_kept")
    assert "2 ranks" in kept.facts["why"] and kept.details["decided_by"] == "rule"


class FailingGuard(FusionGuard):
    """A guard whose own compile fails (a stand-in for a guard's failure where Thunder's runs)."""

    def transform_traces_pre_prologue(self, *args, **kwargs):
        raise RuntimeError("the guard failed here")


def test_a_failure_of_the_guards_own_where_unguarded_thunder_runs_keeps_the_split_untimed():
    def scaled(x: torch.Tensor) -> torch.Tensor:
        return (x * 2).sin()

    guard, calls = FailingGuard(), []
    guard.measurer.pair = _timed(100.0, 10.0, calls)
    compiled = thunderfx(scaled, executors=fusion_executors("cpu"), transforms=[guard])
    x = torch.randn(4, requires_grad=True)
    steps_against_eager(compiled, scaled, lambda: (x,), x, steps=2)
    assert guard.report.filter(action="rescue") and calls == []
    assert not guard.report.filter(code="whole_graph") and not guard.report.filter(code="whole_graph_kept")


def test_inductor_failing_on_a_later_call_hands_the_graph_back_to_its_split():
    guard, calls = FusionGuard(), []
    guard.measurer.pair = _timed(100.0, 10.0, calls)
    compiled, split = _run(guard, steps=2)
    run = vars(split)["forward"]

    def failing(*args):
        raise RuntimeError("Inductor's call failed")

    run.whole = failing
    x, s = torch.randn(1, 8, requires_grad=True), torch.randn(4, 8)
    with pytest.warns(RuntimeWarning, match="Inductor failed on dynamo graph 0"):
        out = compiled(x, s)
    torch.testing.assert_close(out, broadcast_then_sine(x, s), rtol=0, atol=1e-6)
    assert "forward" not in vars(split) and any("dynamo graph 0" in w for w in guard.report.warnings)


def copy_into_input(buf: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    buf.copy_(x * 2)  # Thunder would write buf outside autograd's record: the guard runs this subgraph eagerly
    return buf.sin()


@pytest.mark.parametrize("unguarded", ["runs", "fails"])
def test_a_subgraph_run_eagerly_to_keep_a_gradient_counts_only_where_unguarded_thunder_fails(monkeypatch, unguarded):
    """A subgraph the guard runs eagerly before Thunder compiles it (a gradient Thunder would lose): unguarded Thunder
    runs it here (losing the gradient without an error), so the graph keeps its split, untimed; where the check finds
    unguarded Thunder failing (NequIP's copies into views of a buffer), the graph is a candidate, and this one is kept
    split because it updates its input in place."""
    import thunder_fusion_guard.whole_graph as whole_graph

    seen: list[str | None] = []
    checked = whole_graph.unguarded_failure

    def check(*args):
        leaf = whole_graph.UnguardedFailure("RuntimeError: a leaf Variable that requires grad")
        seen.append(checked(*args) if unguarded == "runs" else leaf)
        return seen[-1]

    monkeypatch.setattr(transform_module, "unguarded_failure", check)
    guard, calls = FusionGuard(), []
    guard.measurer.pair = _timed(100.0, 10.0, calls)
    compiled = thunderfx(copy_into_input, executors=fusion_executors("cpu"), transforms=[guard])
    x = torch.randn(4, requires_grad=True)
    steps_against_eager(compiled, copy_into_input, lambda: (torch.zeros(4), x), x, steps=2, atol=0)  # eager's bits
    assert len(seen) == 1 and guard.report.filter(code="grad_update_rescued") and calls == []
    kept = guard.report.filter(code="whole_graph_kept")
    if unguarded == "runs":
        assert seen == [None] and not kept
    else:
        (kept,) = kept
        assert "updates its inputs 0 in place" in kept.facts["why"] and kept.details["decided_by"] == "rule"


def test_a_spent_measuring_budget_still_times_the_graph_within_its_own_allowance(monkeypatch):
    """Region timings may spend all of ``costs.measure_budget_s`` (MACE's 37 on an H200); the one timing of a graph
    against its whole has an allowance of its own, and its seconds are still counted."""
    import thunder_fusion_guard.measure.breakeven as breakeven

    deadlines: list[int | None] = []

    def samples(fns, args, **kwargs):
        deadlines.append(kwargs.get("deadline_ns"))
        for fn in fns:
            fn(*args)
        return [[100.0] * 3, [10.0] * 3]  # the split's µs, then Inductor's whole graph's

    monkeypatch.setattr(breakeven, "interleaved_us", samples)  # the timings injected, the pair's own logic kept
    monkeypatch.setattr(RegionMeasurer, "pair", REAL_PAIR)
    guard = FusionGuard()
    guard.measurer.seconds = guard.measurer.budget_s  # spent before the graph's next call
    _, split = _run(guard)
    assert len(deadlines) == 1 and isinstance(vars(split)["forward"], WholeGraphRun)
    (whole,) = guard.report.filter(code="whole_graph")
    assert (whole.details["split_us"], whole.details["inductor_us"]) == (100.0, 10.0)
    assert guard.measurer.seconds > guard.measurer.budget_s and guard.measurer.timed == 1


def test_a_failing_check_never_fails_the_call(monkeypatch):
    def broken(*args):
        raise RuntimeError("the check itself failed")

    monkeypatch.setattr(transform_module, "unguarded_failure", broken)
    guard, calls = FusionGuard(), []
    guard.measurer.pair = _timed(100.0, 10.0, calls)
    _, split = _run(guard)  # each call's values against eager's
    assert calls == [] and "forward" not in vars(split) and guard.report.filter(action="rescue")


@pytest.mark.parametrize("unguarded", ["fails", "fails, its region changed by the guard", "runs"])
def test_a_region_failing_in_backward_where_unguarded_thunder_fails_too_lets_the_graph_run_whole(
    monkeypatch, unguarded
):
    """A torch.compile region that fails in the backward (Inductor's C++ compile of NequIP's at l_max 3 on a CPU) runs
    its ops one by one; unguarded Thunder fails there too, so at the call after, the split is timed against Inductor's
    whole graph. The check at the graph's next call compiles the subgraph without the guard: where that trace holds
    the failed region op for op, it is not run (the region's failure is unguarded Thunder's); where the guard changed
    the region, it runs forward and backward and fails itself. Where the check finds unguarded Thunder running, the
    split stays, untimed."""
    from test_rescue import failing_executor, inputs, program

    seen: list[whole_graph.UnguardedFailure | None] = []
    checked = whole_graph.unguarded_failure

    def check(*args):
        seen.append(checked(*args) if unguarded != "runs" else None)
        return seen[-1]

    monkeypatch.setattr(transform_module, "unguarded_failure", check)
    changed = unguarded == "fails, its region changed by the guard"
    if changed:  # no region of unguarded Thunder's trace is the guard's
        monkeypatch.setattr(whole_graph, "same_program", lambda a, b: False)
    torch._dynamo.reset()
    guard, calls, failed = FusionGuard(), [], []
    guard.measurer.pair = _timed(100.0, 10.0, calls)
    compiled = thunderfx(program, executors=[failing_executor("cos", failed)], transforms=[guard])
    x, w = inputs()
    steps_against_eager(compiled, program, lambda: (x, w), x, steps=4, atol=1e-6)
    (split,) = [info.split_graph_module for info in compiled._backend.subgraph_infos]
    (rescue,) = guard.report.filter(action="rescue")
    assert rescue.trace == "backward" and rescue.details["rescued_by"] == "Thunder's torch executor"
    assert len(seen) == 1  # checked once, at the call after the failure
    if unguarded == "runs":
        assert seen == [None] and False not in calls and "forward" not in vars(split)  # no graph timed (on CPU)
        assert not guard.report.filter(code="whole_graph") and not guard.report.filter(code="whole_graph_kept")
        return
    (found,) = seen
    assert found is not None and "cannot be scheduled" in found.error
    # the guarded run's failure; the check's own in backward only where the region is not the same program
    assert failed == ["TorchCompile1"] * (2 if changed else 1)
    assert found.same_region == (None if changed else "TorchCompile1")
    assert calls.count(False) == 1 and isinstance(vars(split)["forward"], WholeGraphRun)  # the graph timed once
    (whole,) = guard.report.filter(code="whole_graph")
    assert whole.executor == "inductor" and whole.subgraph == rescue.subgraph == "subgraph 0"
    assert "cannot be scheduled" in whole.facts["error"]
    assert whole.facts.get("same_region") == found.same_region


def _regions(fn, *args):
    jitted = jit_cpu(fn)
    jitted(*args)
    return regions(jitted)


def test_same_program_holds_for_one_region_compiled_twice_and_not_for_another_op_or_shape():
    def sine(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return (torch.sin(x) * w + 1).sum(-1)

    def cosine(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return (torch.cos(x) * w + 1).sum(-1)

    x, w = torch.randn(4, 8), torch.randn(8)
    (one,), (again,) = _regions(sine, x, w), _regions(sine, x, w)
    (other_op,), (other_shape,) = _regions(cosine, x, w), _regions(sine, torch.randn(2, 8), w)
    assert whole_graph.same_program(one, again)
    assert not whole_graph.same_program(one, other_op) and not whole_graph.same_program(one, other_shape)
