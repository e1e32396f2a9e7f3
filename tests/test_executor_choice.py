"""Choosing a region's fusion executor by measurement (option ``choose_executor``): a region of one fusion
executor is timed with another that can run it too, and switched to it when that is faster by the margin.

On CUDA the pair is nvFuser and Thunder's torch.compile executor. CI has no nvFuser, so here the region's own
executor is ``tc_nvfuser_shaped`` (torch.compile grouped the way nvFuser groups, ``helpers``), registered as
having Thunder's torch.compile executor for its alternative. Timings are injected (conftest ``inject_timings``):
no verdict depends on the clock. Outputs are compared bit for bit with unguarded Thunder.
"""

from __future__ import annotations

import contextlib

import pytest
import thunder
import torch
from helpers import (
    NEAR_BREAK_EVEN,
    NO_SCATTER,
    assert_same,
    no_scatter_executor,
    nvfuser_shaped_executor,
    regions,
    run_with_grads,
)
from thunder.core.symbol import BoundSymbol, Symbol

from thunder_fusion_guard import Costs, FusionGuard, Rewrites
from thunder_fusion_guard import _thunder as th
from thunder_fusion_guard.ops import switch_keeps_bits
from thunder_fusion_guard.replays import warming_up_for_capture

SHAPED = "tc_nvfuser_shaped"


@pytest.fixture(autouse=True)
def shaped_has_an_alternative(monkeypatch):
    monkeypatch.setitem(th.ALTERNATIVE_FUSERS, SHAPED, "torchcompile")


def jit(fn, guard=None):
    return thunder.jit(fn, executors=[nvfuser_shaped_executor()], transforms=[guard] if guard else [])


def guard(costs=None, **options):
    return FusionGuard(choose_executor=True, costs=costs or Costs(calibration=NEAR_BREAK_EVEN), **options)


def exact_sum(a, b):
    return a + b


def exact_chain(x):
    return torch.where(x > 0, x, -x) + 1.0  # f32: compare, neg, where, add, all exact whoever computes them


def two_regions(x, w):
    y = torch.where(x > 0, x, -x) + 1.0
    z = y @ w  # left to torch by tc_nvfuser_shaped: two regions either side
    return torch.where(z > 0, z, -z) - 1.0


def inexact(x):
    return torch.exp(x) * 2.0


def rounding_inputs(dtype):
    """Values on a 0.1 grid whose sums do not fit the dtype: the sum really rounds."""
    g = torch.Generator().manual_seed(0)
    a = (torch.randint(-400, 400, (64, 64), generator=g) * 0.1 + 1 / 3).to(dtype)
    b = (torch.randint(-400, 400, (64, 64), generator=g) * 0.1 + 1 / 7).to(dtype)
    return a.requires_grad_(), b.requires_grad_()


def guarded_sum_as_unguarded(dtype):
    """``exact_sum`` guarded (``choose_executor``), run forward and backward on values that really round, and
    asserted bit for bit equal to unguarded Thunder's: the guard and the guarded function."""
    g = guard()
    args = rounding_inputs(dtype)
    guarded = jit(exact_sum, g)
    got, expected = run_with_grads(guarded, args), run_with_grads(jit(exact_sum), args)
    assert_same(got[0], expected[0])
    assert_same(got[1], expected[1])
    return g, guarded


def region_decisions(g, trace="forward"):
    return [d for d in g.report if d.about_region and d.trace == trace]


@pytest.mark.parametrize("dtype", [torch.bfloat16, pytest.param(torch.float16, marks=pytest.mark.slow), torch.float32])
def test_an_exact_region_switches_when_the_other_executor_is_faster(inject_timings, dtype):
    calls = inject_timings(10.0, 12.0, other_us=4.0)
    args = rounding_inputs(dtype)
    if dtype != torch.float32:  # the sum really rounds
        exact = args[0].float() + args[1].float()
        assert not torch.equal(exact.to(dtype).float(), exact)
    g = guard()
    guarded = jit(exact_sum, g)
    got = run_with_grads(guarded, args)
    assert_same(got[0], run_with_grads(jit(exact_sum), args)[0])
    assert_same(got[1], run_with_grads(jit(exact_sum), args)[1])
    (d,) = region_decisions(g)
    assert d.action == "switch" and d.applied and d.executor == SHAPED
    assert d.details["decided_by"] == "measured"
    assert d.details["measured_other_executor"] == "torchcompile" and d.details["measured_other_us"] == 4.0
    assert (d.details["measured_region_us"], d.details["measured_eager_us"]) == (10.0, 12.0)  # beaten: its own call
    assert 3 in calls
    (now,) = regions(guarded)
    assert now.executor == "torchcompile" and now.name == d.details["switched_to"]


def test_the_dataflow_picture_shows_the_switched_region_with_its_decision(inject_timings):
    from thunder_fusion_guard.examine.dataflow import trace_graphs

    inject_timings(10.0, 12.0, other_us=4.0)
    g = guard()
    guarded = jit(exact_sum, g)
    guarded(*(t.detach() for t in rounding_inputs(torch.float32)))
    (d,) = region_decisions(g)
    (pair,) = [p for p in trace_graphs(guarded) if p.trace == "forward"]
    before = {n.id: n.action for n in pair.before.nodes if n.kind == "region"}
    after = {n.id: n.action for n in pair.after.nodes if n.kind == "region"}
    assert before == {d.region: "switch"} and after == {d.details["switched_to"]: "switch"}


def test_no_switch_when_the_other_executor_does_not_beat_the_choice_by_the_margin(inject_timings):
    # 3% faster: inside the margin (on CPU the timing's spread, at least 5%; README "Measured decisions")
    inject_timings(10.0, 12.0, other_us=9.7)
    g = guard()
    a, b = rounding_inputs(torch.float32)
    guarded = jit(exact_sum, g)
    guarded(a, b)
    (d,) = region_decisions(g)
    assert d.action == "keep" and d.details["measured_other_us"] == 9.7
    assert [r.executor for r in regions(guarded)] == [SHAPED]


@pytest.mark.parametrize(("eager_us", "other_us", "action"), [(5.0, 4.9, "reject"), (7.0, 3.0, "switch")])
def test_the_other_executor_must_beat_eager_where_eager_wins(inject_timings, eager_us, other_us, action):
    inject_timings(10.0, eager_us, other_us=other_us)
    g = guard()
    a, b = rounding_inputs(torch.float32)
    guarded = jit(exact_sum, g)
    assert torch.equal(guarded(a, b), jit(exact_sum)(a, b))
    (d,) = region_decisions(g)
    assert d.action == action
    executors = [r.executor for r in regions(guarded)]
    assert executors == ([] if action == "reject" else ["torchcompile"])


def test_two_regions_switched_in_one_trace_get_distinct_names(inject_timings):
    inject_timings(10.0, 12.0, other_us=2.0)
    g = guard()
    x = torch.randn(16, 16, requires_grad=True)
    w = torch.randn(16, 16, requires_grad=True)
    guarded = jit(two_regions, g)
    got = run_with_grads(guarded, (x, w))
    expected = run_with_grads(jit(two_regions), (x, w))
    assert_same(got[0], expected[0])
    assert_same(got[1], expected[1])
    switched = [d for d in region_decisions(g) if d.action == "switch"]
    assert len(switched) == 2
    names = [r.name for r in regions(guarded)]
    assert len(set(names)) == len(names) == 2 and all(r.executor == "torchcompile" for r in regions(guarded))
    assert {d.details["switched_to"] for d in switched} == set(names)


def test_an_inexact_region_is_not_timed_with_the_other_executor_by_default(inject_timings):
    calls = inject_timings(10.0, 12.0, other_us=1.0)
    g = guard()
    x = torch.randn(16, 16)
    assert torch.equal(jit(inexact, g)(x), jit(inexact)(x))
    (d,) = region_decisions(g)
    # kept by the cost model or, where the model would reject it, for exactness: never timed either way
    assert d.action == "keep" and d.details["decided_by"] in {"model", "exactness"}
    assert 3 not in calls


def test_exact_only_off_lets_an_inexact_region_switch(inject_timings):
    calls = inject_timings(10.0, 12.0, other_us=1.0)
    g = guard(exact_only=False)
    x = torch.randn(16, 16, dtype=torch.bfloat16)
    out = jit(inexact, g)(x)
    torch.testing.assert_close(out, inexact(x))
    (d,) = region_decisions(g)
    assert d.action == "switch" and 3 in calls
    assert d.details["measured_other_executor"] == "torchcompile"
    assert d.details["switched_to"].startswith("TorchCompile")  # the fusion call that replaced the region


def test_a_rounding_chain_in_bf16_is_not_switched_under_exact_only(inject_timings):
    inject_timings(10.0, 12.0, other_us=1.0)
    g = guard()
    x = rounding_inputs(torch.bfloat16)[0].detach()
    assert torch.equal(jit(exact_chain, g)(x), jit(exact_chain)(x))
    (d,) = region_decisions(g)
    assert d.action != "switch"
    assert "alternative_not_timed" in d.details or d.details["decided_by"] == "exactness"


def cat_pair(x, y):
    return torch.cat([x, y], dim=0)


def test_a_data_movement_region_kept_for_exactness_may_still_switch(inject_timings):
    """cat is not known to give eager the fusion's bits (so the region is never rejected), but moving data
    never rounds: another compiler gives the same bits, so it may switch."""
    inject_timings(10.0, 12.0, other_us=1.0)
    g = guard()
    x, y = (t.detach() for t in rounding_inputs(torch.bfloat16))
    guarded = jit(cat_pair, g)
    assert torch.equal(guarded(x, y), jit(cat_pair)(x, y))
    (d,) = region_decisions(g)
    assert d.action == "switch" and d.details["inexact"] == ["cat"]  # exactness would keep it: timed faster fused
    assert [r.executor for r in regions(guarded)] == ["torchcompile"]


def test_a_region_kept_for_exactness_is_never_rejected_by_the_timing(inject_timings):
    inject_timings(10.0, 1.0, other_us=9.9)  # eager far faster, the other executor not by the margin
    g = guard()
    x, y = (t.detach() for t in rounding_inputs(torch.bfloat16))
    jit(cat_pair, g)(x, y)
    (d,) = region_decisions(g)
    assert d.action == "keep" and d.details["measured_eager_us"] == 1.0 and "switched_to" not in d.details
    assert d.details["decided_by"] == "exactness" and d.details["measured_other_us"] == 9.9  # timed, kept by the rule


def test_by_default_no_other_executor_is_timed(inject_timings):
    calls = inject_timings(10.0, 12.0, other_us=1.0)
    g = FusionGuard(costs=Costs(calibration=NEAR_BREAK_EVEN))
    a, b = rounding_inputs(torch.float32)
    jit(exact_sum, g)(a, b)
    (d,) = region_decisions(g)
    assert d.action == "keep" and "measured_other_us" not in d.details
    assert calls and 3 not in calls


def test_report_only_records_the_switch_and_changes_nothing(inject_timings):
    inject_timings(10.0, 12.0, other_us=1.0)
    g = guard(report_only=True)
    a, b = rounding_inputs(torch.float32)
    guarded = jit(exact_sum, g)
    guarded(a, b)
    (d,) = region_decisions(g)
    assert d.action == "switch" and not d.applied
    assert [r.executor for r in regions(guarded)] == [SHAPED]


def test_a_failing_other_executor_leaves_the_choice_to_fusion_and_eager(inject_timings, monkeypatch):
    calls = inject_timings(10.0, 12.0, other_us=1.0)

    def broken(executor, fusion, counter):
        raise RuntimeError("cannot fuse this")

    monkeypatch.setattr(th, "fuse_with", broken)
    g = guard()
    a, b = rounding_inputs(torch.float32)
    assert torch.equal(jit(exact_sum, g)(a, b), jit(exact_sum)(a, b))
    (d,) = region_decisions(g)
    assert d.action == "keep"
    assert d.details["measured_other_problem"] == "torchcompile failed on it: RuntimeError: cannot fuse this"
    assert 3 not in calls


def test_switch_keeps_bits_rule():
    x = torch.randn(8, 8)
    cases = [
        (exact_chain, True),
        (inexact, False),
        (lambda x: x / 3.0, False),
        (lambda x: x.abs(), False),
        (lambda x: x * 3.0, True),  # a lone product is rounded once by any compiler
        (lambda x: x * 3.0 + 1.0, False),  # which a compiler may contract into one FMA
    ]
    for fn, keeps in cases:
        trace = thunder.last_traces(_traced(fn, x))[-1]
        (region,) = th_regions(trace)
        assert switch_keeps_bits(region.body) is keeps, fn


def test_fuse_with_gives_a_symbol_without_meta_the_outputs_as_meta():
    x = torch.randn(8, 8)
    (region,) = th_regions(thunder.last_traces(_traced(exact_chain, x))[-1])

    class NoMeta:
        name = "nometa"

        def fuse(self, fused, counter):
            sym = Symbol(f"NoMeta{counter}", meta=None, is_fusion=True, executor=None)
            outs = [o.proxy for o in fused.outputs]
            return BoundSymbol(sym, [i.proxy for i in fused.inputs], {}, outs, fused.bound_symbols)

    bsym = th.fuse_with(NoMeta(), region.bsym, 7)
    assert bsym.sym.name == "NoMeta7" and bsym.sym.meta is not None
    assert bsym.sym.meta() == bsym.output


def _traced(fn, *args):
    jitted = jit(fn)
    jitted(*args)
    return jitted


def th_regions(trace):
    from thunder_fusion_guard.regions import find_regions

    return find_regions(trace)


# --- on CUDA: nvFuser's regions and Thunder's torch.compile executor, the pair the option is for ------------


def jit_nv(fn, guard=None):
    return thunder.jit(fn, transforms=[guard] if guard else [])


@pytest.mark.cuda
@pytest.mark.parametrize("fn", [exact_sum, cat_pair])
def test_an_exact_nvfuser_region_switches_to_torch_compile_with_the_same_bits(inject_timings, fn):
    inject_timings(10.0, 12.0, other_us=4.0)
    args = [t.detach().cuda().requires_grad_() for t in rounding_inputs(torch.bfloat16)]
    g = guard()
    guarded = jit_nv(fn, g)
    got, expected = run_with_grads(guarded, args), run_with_grads(jit_nv(fn), args)
    assert_same(got[0], expected[0])
    assert_same(got[1], expected[1])
    switched = [d for d in g.report if d.action == "switch"]
    assert switched and all(d.executor == "nvfuser" for d in switched)
    assert "torchcompile" in {r.executor for r in regions(guarded)}


@pytest.mark.cuda
@pytest.mark.real_timings
def test_real_timings_on_cuda_keep_the_bits_whatever_they_say(tmp_path, monkeypatch):
    """Timed for real: whichever executor wins, the outputs are unguarded Thunder's and the times recorded."""
    monkeypatch.setenv("TFG_CACHE_DIR", str(tmp_path))
    args = [t.detach().cuda() for t in rounding_inputs(torch.bfloat16)]
    g = guard()
    assert torch.equal(jit_nv(cat_pair, g)(*args), jit_nv(cat_pair)(*args))
    (d,) = region_decisions(g)
    # cat is kept for exactness unless the switch wins: timed either way, decided by the rule or the timing
    assert (d.action, d.details["decided_by"]) in {("keep", "exactness"), ("switch", "measured")}
    assert d.details["measured_other_executor"] == "torchcompile" and d.details["measured_other_us"] > 0


def test_the_symbol_timed_is_the_one_switched_in(inject_timings, monkeypatch):
    """The other executor's fusion is built once: the timing's callable is the trace's, compiled once."""
    inject_timings(10.0, 12.0, other_us=1.0)
    fuse_with, built = th.fuse_with, []

    def counting(executor, fusion, counter):
        built.append(fuse_with(executor, fusion, counter))
        return built[-1]

    monkeypatch.setattr(th, "fuse_with", counting)
    g = guard()
    a, b = rounding_inputs(torch.float32)
    guarded = jit(exact_sum, g)
    assert torch.equal(guarded(a, b), jit(exact_sum)(a, b))
    (d,) = region_decisions(g)
    assert d.action == "switch" and len(built) == 1
    (switched,) = regions(guarded)
    assert switched.bsym.sym.name == built[0].sym.name == d.details["switched_to"]
    # the trace calls it through the guard's rescuing call, which runs exactly that callable
    assert th.region_callable(switched.bsym).fused is th.region_callable(built[0])


@pytest.mark.parametrize("strict", [False, True])
@pytest.mark.guard_failure_expected
def test_a_switch_that_cannot_be_built_keeps_the_region(inject_timings, monkeypatch, strict):
    from thunder_fusion_guard import FusionGuardError

    inject_timings(10.0, 12.0, other_us=1.0)
    a, b = rounding_inputs(torch.float32)
    jit(exact_sum, guard())(a, b)  # timed and cached: the next guard reads the timing and builds only the switch

    def fails_in_the_trace(executor, fusion, counter):
        raise RuntimeError("no room")

    monkeypatch.setattr(th, "fuse_with", fails_in_the_trace)
    g = guard(strict=strict)
    if strict:
        with pytest.raises(FusionGuardError, match="could not switch TorchCompile0 to torchcompile"):
            jit(exact_sum, g)(a, b)
        return
    guarded = jit(exact_sum, g)
    assert torch.equal(guarded(a, b), jit(exact_sum)(a, b))
    (d,) = region_decisions(g)
    assert d.details["measured_from"] == "cache"
    assert d.action == "keep" and d.error == "RuntimeError: no room"
    assert d.details["decided_by"] == "measured" and "switched_to" not in d.details  # the switch was not built
    assert d.details["measured_other_executor"] == "torchcompile" and d.details["measured_other_us"] == 1.0
    assert [r.executor for r in regions(guarded)] == [SHAPED]


@pytest.mark.parametrize("how", [None, "CUDAGraphTransform", "capture_step"])
def test_in_cuda_graphs_the_device_times_decide(inject_timings, monkeypatch, how):
    """Replayed in CUDA graphs a program spends no host time: the other executor, 2.5x faster on the stream but
    2x slower on the device, takes the region only where the program is not captured, by a ``CUDAGraphTransform``
    or whole, compiled during ``capture_step``'s warm-up."""
    captured = how is not None
    monkeypatch.setattr(th, "compiling_with_cuda_graphs", lambda: how == "CUDAGraphTransform")
    inject_timings(10.0, 12.0, other_us=4.0, host=(9.0, 11.0, 3.0), device=(3.0, 12.0, 6.0))
    g = guard()
    a, b = rounding_inputs(torch.float32)
    guarded = jit(exact_sum, g)
    with warming_up_for_capture() if how == "capture_step" else contextlib.nullcontext():
        got = run_with_grads(guarded, [a, b])[0]
    assert_same(got, run_with_grads(jit(exact_sum), [a, b])[0])
    (d,) = region_decisions(g)
    assert d.action == ("keep" if captured else "switch")
    assert d.details["measured_other_device_us"] == 6.0 and d.details["measured_other_us"] == 4.0
    assert d.details.get("decided_on") == ("device" if captured else None)


def test_in_cuda_graphs_a_region_dearer_on_the_device_than_eager_is_rejected(inject_timings, monkeypatch):
    monkeypatch.setattr(th, "compiling_with_cuda_graphs", lambda: True)
    inject_timings(10.0, 12.0, host=(9.0, 11.0), device=(8.0, 2.0))  # the stream keeps it; the device does not
    g = FusionGuard(costs=Costs(calibration=NEAR_BREAK_EVEN))
    a, b = rounding_inputs(torch.float32)
    guarded = jit(exact_sum, g)
    assert_same(run_with_grads(guarded, [a, b])[0], run_with_grads(jit(exact_sum), [a, b])[0])
    (d,) = region_decisions(g)
    assert (d.action, d.details["decided_on"]) == ("reject", "device")
    assert (d.details["measured_region_us"], d.details["measured_region_device_us"]) == (10.0, 8.0)


def test_in_cuda_graphs_a_timing_without_device_times_is_not_said_to_be_on_device(inject_timings, monkeypatch):
    """Captured, a timing that has no device times apart (as off CUDA) decides on the stream's times, and its
    reason does not say device times decided."""
    monkeypatch.setattr(th, "compiling_with_cuda_graphs", lambda: True)
    inject_timings(10.0, 12.0)
    g = FusionGuard(costs=Costs(calibration=NEAR_BREAK_EVEN))
    a, b = rounding_inputs(torch.float32)
    guarded = jit(exact_sum, g)
    assert_same(run_with_grads(guarded, [a, b])[0], run_with_grads(jit(exact_sum), [a, b])[0])
    (d,) = region_decisions(g)
    assert (d.code, d.action) == ("measured", "keep") and "decided_on" not in d.details
    assert not d.facts.get("on_device") and "device times" not in d.details["explanation"]


def test_a_compilation_with_a_cudagraph_transform_is_captured(monkeypatch):
    """What tells the guard a program replays in CUDA graphs: a ``CUDAGraphTransform`` (or a subclass, as
    ``GuardedCUDAGraphs`` is) among the compilation's transforms."""
    from thunder.transforms.cudagraph import CUDAGraphTransform

    from thunder_fusion_guard._thunder import cudagraphs

    class Mine(CUDAGraphTransform):
        pass

    for transforms, captured in (
        ([], False),
        ([FusionGuard()], False),
        ([CUDAGraphTransform()], True),
        ([Mine()], True),
    ):
        monkeypatch.setattr(cudagraphs, "compiling_transforms", lambda t=transforms: list(t))
        assert th.compiling_with_cuda_graphs() is captured


def scatter_between(x, idx, base):
    y = torch.where(x > 0, x, -x) + 1.0
    z = base.index_add(0, idx, y)  # left to torch by no_scatter_executor (nvFuser 0.2.36 has no accumulating scatter)
    return torch.where(z > 2.0, z, -z) * 2.0


def merged_around_a_scatter(fn, merge, monkeypatch, inject_timings):
    """The guard, ``fn(x, idx, base)`` guarded and unguarded under the no-scatter executor, whose regions switch to
    torch.compile on injected timings (``merge_regions=merge``); run once on halves of small integers (sums exact in
    any order) and asserted bit-equal."""
    monkeypatch.setitem(th.ALTERNATIVE_FUSERS, NO_SCATTER, "torchcompile")
    inject_timings(10.0, 12.0, other_us=4.0)
    g = guard(
        Costs(calibration=NEAR_BREAK_EVEN, measure_budget_s=60),
        exact_only=False,
        rewrites=Rewrites(merge_regions=merge),
    )
    x = torch.randint(-8, 8, (16, 4), generator=torch.Generator().manual_seed(0)) * 0.5
    idx = torch.randint(0, 8, (16,), generator=torch.Generator().manual_seed(1))
    guarded = thunder.jit(fn, executors=[no_scatter_executor()], transforms=[g])
    plain = thunder.jit(fn, executors=[no_scatter_executor()])
    assert_same([guarded(x, idx, torch.zeros(8, 4))], [plain(x, idx, torch.zeros(8, 4))])
    return g, guarded, plain


@pytest.mark.parametrize("merge", [False, True])
def test_two_switched_regions_merge_across_the_index_add_between_them(inject_timings, monkeypatch, merge):
    """Both regions switched to torch.compile, which can run ``index_add`` too: with ``merge_regions`` the two
    regions and the scatter between them become one compiled call (Inductor fuses the scatter with what feeds it);
    the values stay unguarded Thunder's (sums of halves: exact in any order)."""
    g, guarded, plain = merged_around_a_scatter(scatter_between, merge, monkeypatch, inject_timings)
    assert [r.executor for r in regions(plain)] == [NO_SCATTER] * 2
    assert [d.action for d in region_decisions(g)] == ["switch", "switch"]
    now = regions(guarded)
    outside = [b.sym.name for b in thunder.last_traces(guarded)[-1].bound_symbols if not b.sym.is_fusion]
    merged = [d for d in g.report.filter(action="rehome", trace="forward") if d.details.get("across")]
    if not merge:
        assert len(now) == 2 and "index_add" in outside and not merged
        return
    (region,) = now
    assert region.executor == "torchcompile" and "index_add" in region.ops and "index_add" not in outside
    (d,) = merged
    assert d.code == "merged" and d.details["across"] == d.ops and any("index_add" in op for op in d.ops)
    assert d.details["into"] == d.facts["into"] == region.name and d.facts["across"] == d.ops  # merged across index_add


def test_no_merge_across_a_matrix_product(inject_timings):
    """A matmul between two switched regions stays where it is: only ops that cost memory traffic are bridged (merged
    into a torch.compile region a matmul stays a GEMM of its own, and Inductor fuses no more around it)."""
    inject_timings(10.0, 12.0, other_us=4.0)
    g = guard(rewrites=Rewrites(merge_regions=True))
    x, w = torch.randn(8, 8), torch.randn(8, 8)
    guarded = jit(two_regions, g)
    assert_same([guarded(x, w)], [jit(two_regions)(x, w)])
    assert [r.executor for r in regions(guarded)] == ["torchcompile"] * 2
    assert not [d for d in g.report.filter(action="rehome") if d.details.get("across")]


def shared_abs(x, idx, base):
    a = x.abs()  # Thunder's rematerialization computes it in both regions, under one name
    s = base.index_add(0, idx, a * 2.0)
    return (s.sum(0) + a) * 0.5


def test_a_value_both_regions_compute_is_computed_once_in_the_merged_call(inject_timings, monkeypatch):
    """Thunder copies a cheap op into each region that reads its value, keeping its name; merging the two regions
    runs it once (run twice, the rebuilt trace would name one value twice and the merge would fail)."""
    g, guarded, plain = merged_around_a_scatter(shared_abs, True, monkeypatch, inject_timings)
    assert [sum("abs" in op for op in r.ops) for r in regions(plain)] == [1, 1]  # computed in both
    assert not [d for d in g.report if d.code == "merge_failed"]
    (region,) = regions(guarded)
    assert sum("abs" in op for op in region.ops) == 1 and "index_add" in region.ops
    (d,) = [d for d in g.report.filter(action="rehome") if d.code == "merged"]
    assert d.facts["across"] == ["index_add"] and d.facts["into"] == region.name


# --- Inductor's combo kernels: on Triton's devices torch.compile is timed, and runs, with them ----------------------


@pytest.fixture
def combo_kernels_on_cpu(monkeypatch):
    """The CPU counted among the devices where torch.compile is timed with Inductor's combo kernels (Inductor's C++
    kernels have none: the option changes nothing there), so the choice and its records are tested without a GPU.
    Returns the options of each region compiled by the combo executor."""
    from thunder_fusion_guard._thunder import combo

    monkeypatch.setattr(combo, "COMBO_KERNEL_DEVICES", ("cpu",))
    compiled_with: list[dict] = []
    real = combo._compiled

    def recorded(bsyms, inputs, outputs, options):
        compiled_with.append(dict(options))
        return real(bsyms, inputs, outputs, options)

    monkeypatch.setattr(combo, "_compiled", recorded)
    return compiled_with


def test_torch_compile_gets_combo_kernels_on_tritons_devices_only():
    plain = th.torch_compile_executor()
    assert th.combo_kernels_fuser(plain, "cpu") is plain and th.combo_kernels_fuser(None, "cuda") is None
    combo = th.combo_kernels_fuser(plain, "cuda")
    assert combo == plain and combo is not plain  # Thunder's executor by name and ops; not registered
    assert th.inductor_options(combo) == {"combo_kernels": True} and th.inductor_options(plain) == {}
    assert combo.implmap is plain.implmap
    # the one device rule, for a region and for a whole Dynamo graph: some devices, all of them Triton's
    assert th.combo_kernels_on(["cuda"]) and not th.combo_kernels_on([]) and not th.combo_kernels_on(["cuda", "cpu"])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_a_region_switched_to_torch_compile_runs_with_combo_kernels_and_the_same_bits(
    inject_timings, combo_kernels_on_cpu, dtype
):
    inject_timings(10.0, 12.0, other_us=4.0)
    g, guarded = guarded_sum_as_unguarded(dtype)
    (d,) = region_decisions(g)
    assert d.action == "switch" and d.facts["inductor_options"] == {"combo_kernels": True}
    assert "combo_kernels=True" in d.reason
    (now,) = regions(guarded)
    assert now.executor == "torchcompile" and th.inductor_options(now.bsym.sym.executor) == {"combo_kernels": True}
    assert combo_kernels_on_cpu and all(o == {"combo_kernels": True} for o in combo_kernels_on_cpu)
    # a rebuild of the region (rehome, merge_regions) keeps its executor and so its options
    rebuilt = th.rebuild_fusion(now.bsym, now.body, now.bsym.flat_proxy_args, now.bsym.flat_proxy_outs)
    assert th.inductor_options(rebuilt.sym.executor) == {"combo_kernels": True}


def test_where_inductor_fails_with_combo_kernels_torch_compile_is_timed_with_its_defaults(
    inject_timings, combo_kernels_on_cpu, monkeypatch
):
    from thunder_fusion_guard._thunder import combo

    calls = inject_timings(10.0, 12.0, other_us=4.0)

    def planted(*args):
        raise RuntimeError("planted combo kernel failure")

    monkeypatch.setattr(combo, "_compiled", planted)
    g = guard()
    args = rounding_inputs(torch.bfloat16)
    guarded = jit(exact_sum, g)
    assert_same([guarded(*args)], [jit(exact_sum)(*args)])
    (d,) = region_decisions(g)
    assert d.action == "switch" and "inductor_options" not in d.facts
    assert "planted combo kernel failure" in d.details["inductor_options_failed"]
    (now,) = regions(guarded)
    assert now.executor == "torchcompile" and th.inductor_options(now.bsym.sym.executor) == {}
    assert calls[-1] == 3  # timed again with the other executor, by Inductor's defaults


def test_where_inductor_fails_with_combo_kernels_and_its_defaults_are_not_timed_both_are_recorded(
    inject_timings, combo_kernels_on_cpu, monkeypatch
):
    from thunder_fusion_guard._thunder import combo
    from thunder_fusion_guard.measure import breakeven

    inject_timings(10.0, 12.0, other_us=4.0)
    timed = breakeven.interleaved_us

    def first_only(fns, args, **kwargs):  # the timing with combo kernels runs; every timing after it fails
        seen.append(len(fns))
        if len(seen) > 1:
            raise RuntimeError("planted timing failure")
        return timed(fns, args, **kwargs)

    seen: list[int] = []
    monkeypatch.setattr(breakeven, "interleaved_us", first_only)
    monkeypatch.setattr(combo, "_compiled", lambda *args: (_ for _ in ()).throw(RuntimeError("planted combo failure")))
    g = guard()
    args = rounding_inputs(torch.bfloat16)
    guarded = jit(exact_sum, g)
    assert_same([guarded(*args)], [jit(exact_sum)(*args)])
    (d,) = region_decisions(g)
    assert d.action != "switch" and "inductor_options" not in d.facts
    assert "planted combo failure" in d.details["inductor_options_failed"]
    assert "planted timing failure" in d.details["not_measured"]


def _combo_then_plain(monkeypatch, combo_us, plain_us):
    """The timings after ``inject_timings``: torch.compile with combo kernels timed at ``combo_us``, then, where it is
    timed again with Inductor's defaults, at ``plain_us``. Returns the other executor's times handed out, in order."""
    from thunder_fusion_guard.measure import breakeven

    timed, handed = breakeven.interleaved_us, []

    def combo_first(fns, args, **kwargs):
        got = timed(fns, args, **kwargs)
        if len(fns) == 3:
            handed.append(combo_us if not handed else plain_us)
            got[2] = [handed[-1]] * len(got[2])
        return got

    monkeypatch.setattr(breakeven, "interleaved_us", combo_first)
    return handed


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_where_combo_kernels_lose_torch_compile_with_its_defaults_is_timed_and_takes_the_region_it_wins(
    inject_timings, combo_kernels_on_cpu, monkeypatch, dtype
):
    inject_timings(10.0, 12.0)
    handed = _combo_then_plain(monkeypatch, combo_us=40.0, plain_us=4.0)
    g, guarded = guarded_sum_as_unguarded(dtype)
    (d,) = region_decisions(g)
    assert handed[:2] == [40.0, 4.0]  # the forward region (the backward's is timed after it)
    assert d.action == "switch" and "inductor_options" not in d.facts and "combo_kernels=True" not in d.reason
    assert d.details["combo_kernels_timed"] == {"other_us": 40.0} and d.details["measured_other_us"] == 4.0
    (now,) = regions(guarded)
    assert now.executor == "torchcompile" and th.inductor_options(now.bsym.sym.executor) == {}


def test_where_combo_kernels_and_torch_compiles_defaults_both_lose_the_region_stays(
    inject_timings, combo_kernels_on_cpu, monkeypatch
):
    inject_timings(10.0, 12.0)
    handed = _combo_then_plain(monkeypatch, combo_us=40.0, plain_us=30.0)
    g = guard()
    guarded = jit(exact_sum, g)
    guarded(*(t.detach() for t in rounding_inputs(torch.float32)))
    (d,) = region_decisions(g)
    assert handed == [40.0, 30.0] and d.action == "keep"
    assert d.details["measured_other_us"] == 40.0 and "combo_kernels_timed" not in d.details  # combo's timing kept
    assert d.details["plain_timed"] == {"other_us": 30.0}  # the defaults' losing timing, for the audit
    assert [r.executor for r in regions(guarded)] == [SHAPED]


def test_where_torch_compiles_defaults_cannot_be_timed_after_combo_kernels_lost_the_region_stays_and_why_is_recorded(
    inject_timings, combo_kernels_on_cpu, monkeypatch
):
    from thunder_fusion_guard.measure import breakeven

    inject_timings(10.0, 12.0)
    handed = _combo_then_plain(monkeypatch, combo_us=40.0, plain_us=4.0)
    timed = breakeven.interleaved_us

    def plain_fails(fns, args, **kwargs):  # combo kernels timed (and lose); the timing with the defaults fails
        if len(fns) == 3 and handed:
            raise RuntimeError("planted plain timing failure")
        return timed(fns, args, **kwargs)

    monkeypatch.setattr(breakeven, "interleaved_us", plain_fails)
    g = guard()
    guarded = jit(exact_sum, g)
    guarded(*(t.detach() for t in rounding_inputs(torch.float32)))
    (d,) = region_decisions(g)
    assert d.action == "keep" and d.details["measured_other_us"] == 40.0
    assert "planted plain timing failure" in d.details["plain_timed"]["problem"]
    assert [r.executor for r in regions(guarded)] == [SHAPED]


def test_where_combo_kernels_win_torch_compiles_defaults_are_not_timed(
    inject_timings, combo_kernels_on_cpu, monkeypatch
):
    inject_timings(10.0, 12.0)
    handed = _combo_then_plain(monkeypatch, combo_us=4.0, plain_us=2.0)
    g = guard()
    jit(exact_sum, g)(*(t.detach() for t in rounding_inputs(torch.float32)))
    (d,) = region_decisions(g)
    assert handed == [4.0] and d.action == "switch" and d.facts["inductor_options"] == {"combo_kernels": True}


def _fragmenting_with_an_alternative(monkeypatch):
    """torch.compile with one region per op, the fragments merge_regions joins; torch.compile its alternative."""
    from helpers import fragmenting_executor

    ex = fragmenting_executor()
    monkeypatch.setitem(th.ALTERNATIVE_FUSERS, ex.name, "torchcompile")
    return ex


def test_a_merged_region_is_timed_whole_against_the_other_executor_and_switches_where_faster(
    inject_timings, monkeypatch
):
    """Regions kept on their executor (the other timed slower for each) and merged into one; the merged region,
    timed whole, is faster on torch.compile: it switches, its decision in its last part's place, and the values
    stay unguarded Thunder's (compare, negate, select and add of halves: exact whoever computes them)."""
    from thunder_fusion_guard.measure import breakeven

    ex = _fragmenting_with_an_alternative(monkeypatch)
    inject_timings(10.0, 12.0, other_us=40.0)
    timed, seen = breakeven.interleaved_us, []
    x = torch.randint(-8, 8, (16, 4), generator=torch.Generator().manual_seed(0)) * 0.5
    plain = thunder.jit(exact_chain, executors=[ex])
    expected = plain(x)
    parts = len(regions(plain))

    def other_faster_for_the_merged(fns, args, **kwargs):  # each part, then the merged region
        seen.append(len(fns))
        out = timed(fns, args, **kwargs)
        return out if len(seen) <= parts else [*out[:2], [4.0] * len(out[0])]

    monkeypatch.setattr(breakeven, "interleaved_us", other_faster_for_the_merged)
    g = guard(
        Costs(calibration=NEAR_BREAK_EVEN, measure_budget_s=60), exact_only=False, rewrites=Rewrites(merge_regions=True)
    )
    guarded = thunder.jit(exact_chain, executors=[ex], transforms=[g])
    assert_same([guarded(x)], [expected])
    assert parts > 1 and seen == [3] * (parts + 1)  # each part, then the merged region, against torch.compile
    (region,) = regions(guarded)
    assert region.executor == "torchcompile" and len(region.ops) >= parts
    merges = g.report.filter(code="merged", trace="forward")
    *parts_kept, merged = region_decisions(g)  # the merged region keeps its last part's name, and its decision's place
    assert len(merges) == parts - 1 and merged.region == merges[-1].facts["into"]
    assert merged.action == "switch" and merged.facts["switched_to"] == "torchcompile" and len(merged.ops) >= parts
    assert len(parts_kept) == parts - 1 and all(d.action == "keep" for d in parts_kept)
    assert merged.details["merged_from"] == [d.region for d in parts_kept] + [merged.region]


def test_a_merged_region_is_not_timed_again_without_choose_executor(inject_timings, monkeypatch):
    ex = _fragmenting_with_an_alternative(monkeypatch)
    calls = inject_timings(10.0, 12.0, other_us=40.0)
    g = FusionGuard(
        costs=Costs(calibration=NEAR_BREAK_EVEN, measure_budget_s=60), rewrites=Rewrites(merge_regions=True)
    )
    guarded = thunder.jit(exact_chain, executors=[ex], transforms=[g])
    guarded(torch.randn(16, 4))
    assert len(regions(guarded)) == 1 and set(calls) <= {2}  # the parts timed against eager only; the merge not


@pytest.mark.parametrize(("other_device_us", "switches"), [(9.0, True), (9.8, False)])
def test_in_cuda_graphs_another_executor_wins_by_the_timings_spread_not_the_margin(
    inject_timings, monkeypatch, other_device_us, switches
):
    """Captured, the other executor 10% faster on the device (both sides a region's kernels, no host time) takes the
    region, though the margin is 20%: it need only win by the timing's spread (at least 5%); 2% faster does not."""
    monkeypatch.setattr(th, "compiling_with_cuda_graphs", lambda: True)
    inject_timings(10.0, 12.0, other_us=40.0, host=(9.0, 11.0, 30.0), device=(10.0, 30.0, other_device_us))
    g = guard()
    a, b = rounding_inputs(torch.float32)
    guarded = jit(exact_sum, g)
    assert_same(run_with_grads(guarded, [a, b])[0], run_with_grads(jit(exact_sum), [a, b])[0])
    (d,) = region_decisions(g)
    assert d.details["decided_on"] == "device" and d.facts["margin"] == 0.2
    assert d.action == ("switch" if switches else "keep")
    if switches:
        assert d.facts["switch_margin"] == 0.05 and "the timing's spread on device times" in d.details["explanation"]
        assert [r.executor for r in regions(guarded)] == ["torchcompile"]
    else:
        assert "switch_margin" not in d.facts and [r.executor for r in regions(guarded)] == [SHAPED]
