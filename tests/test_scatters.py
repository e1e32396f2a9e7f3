"""Scatters into the region that makes their values (``rewrites.merge_regions``): an ``index_add`` or an
embedding's gradient left to torch after a region switched to torch.compile runs at that region's end.

As on CUDA, the regions' own executor (``tc_no_scatter``: torch.compile grouped as nvFuser groups) claims no
scatter, and Thunder's torch.compile executor, its alternative, does; timings are injected so that every region
switches. Values are halves on a small grid: their sums are exact in any order, so the guarded results equal
unguarded Thunder's bit for bit.
"""

from __future__ import annotations

import pytest
import thunder
import torch
from helpers import NEAR_BREAK_EVEN, NO_SCATTER, assert_same, no_scatter_executor, regions, run_with_grads

from thunder_fusion_guard import Costs, FusionGuard, Rewrites, library_ops_translated
from thunder_fusion_guard import _thunder as th


@pytest.fixture(autouse=True)
def switches_to_torch_compile(monkeypatch, inject_timings):
    monkeypatch.setitem(th.ALTERNATIVE_FUSERS, NO_SCATTER, "torchcompile")
    inject_timings(10.0, 12.0, other_us=4.0)
    with library_ops_translated():  # index_add's gradient, for this test only (translations are process-wide)
        yield


def message_sum(x, idx, base):
    y = torch.where(x > 0, x, -x) + 1.0  # only the index_add reads it
    return base.index_add(0, idx, y)


def embedded(w, tok):
    return torch.nn.functional.embedding(tok, w) * 2.0  # its gradient: embedding_backward of a region's value


def _inputs():
    g = torch.Generator().manual_seed(0)
    x = (torch.randint(-8, 8, (16, 4), generator=g) * 0.5).requires_grad_()
    idx = torch.randint(0, 8, (16,), generator=g)
    w = (torch.randint(-8, 8, (10, 4), generator=g) * 0.5).requires_grad_()
    tok = torch.randint(0, 10, (12,), generator=g)
    return (x, idx, torch.zeros(8, 4)), (w, tok)


def _guard(merge: bool, **options) -> FusionGuard:
    costs = Costs(calibration=NEAR_BREAK_EVEN, measure_budget_s=60)
    rewrites = Rewrites(merge_regions=merge)
    return FusionGuard(choose_executor=True, exact_only=False, costs=costs, rewrites=rewrites, **options)


def _outside(jitted, backward=False) -> list[str]:
    trace = (thunder.last_backward_traces if backward else thunder.last_traces)(jitted)[-1]
    return [th.op_name(b) for b in trace.bound_symbols if not th.is_fusion(b) and not th.is_comment_or_del(b)]


def _scatter_decisions(guard: FusionGuard):
    return [d for d in guard.report if d.code in ("scatter_moved", "scatter_kept")]


def _both(fn, args, guard):
    guarded = thunder.jit(fn, executors=[no_scatter_executor()], transforms=[guard])
    plain = thunder.jit(fn, executors=[no_scatter_executor()])
    got, want = run_with_grads(guarded, args), run_with_grads(plain, args)
    assert_same(got[0], want[0])
    assert_same(got[1], want[1])
    return guarded, plain


@pytest.mark.parametrize("merge", [False, True])
def test_index_add_runs_in_the_region_that_makes_its_values(merge):
    """With ``merge_regions`` the ``index_add`` runs at the end of the switched region computing what it sums,
    whose value only it read is no longer an output; results and gradients stay unguarded Thunder's, bit for bit."""
    g = _guard(merge)
    guarded, plain = _both(message_sum, _inputs()[0], g)
    assert "index_add" in _outside(plain)
    moved = _scatter_decisions(g)
    if not merge:
        assert not moved and "index_add" in _outside(guarded)
        return
    assert "index_add" not in _outside(guarded)
    (d,) = moved
    assert (d.trace, d.action, d.code, d.ops, d.applied) == ("forward", "rehome", "scatter_moved", ["index_add"], True)
    assert d.facts == {"into": d.region, "dropped": 1}  # where(...) + 1 was written for the scatter alone
    (region,) = regions(guarded)
    assert (region.name, region.executor) == (d.region, "torchcompile") and "index_add" in region.ops


def test_embedding_gradient_runs_in_the_backward_region_that_makes_it():
    """The gradient of an embedding (a scatter by the token ids) runs in the backward region computing what it
    sums, bit for bit as unguarded Thunder's."""
    g = _guard(True)
    guarded, plain = _both(embedded, _inputs()[1], g)
    scatter = "torch.ops.aten.embedding_backward"
    assert scatter in _outside(plain, backward=True) and scatter not in _outside(guarded, backward=True)
    (d,) = _scatter_decisions(g)
    assert (d.trace, d.code, d.ops) == ("backward", "scatter_moved", [scatter])
    assert d.facts == {"into": d.region, "dropped": 1}
    assert [r.executor for r in regions(guarded, backward=True) if r.name == d.region] == ["torchcompile"]


def test_report_only_records_the_move_and_runs_unchanged():
    """``report_only``: the move is recorded as not applied, and the scatter still runs outside."""
    g = _guard(True, report_only=True)
    guarded = thunder.jit(message_sum, executors=[no_scatter_executor()], transforms=[g])
    run_with_grads(guarded, _inputs()[0])
    assert "index_add" in _outside(guarded)
    assert [(d.trace, d.code, d.applied) for d in _scatter_decisions(g)] == [("forward", "scatter_moved", False)]


def read_twice(x, idx, base):
    y = torch.where(x > 0, x, -x) + 1.0
    return base.index_add(0, idx, y), y @ base.T  # y is read after the scatter too, by a matmul left to torch


def test_a_value_read_elsewhere_stays_an_output():
    """The region keeps writing a value an op after the scatter reads; the scatter moves in all the same."""
    x, idx, base = _inputs()[0]
    g = _guard(True)
    guarded = thunder.jit(read_twice, executors=[no_scatter_executor()], transforms=[g])
    plain = thunder.jit(read_twice, executors=[no_scatter_executor()])
    assert_same(list(guarded(x.detach(), idx, base)), list(plain(x.detach(), idx, base)))
    (d,) = [d for d in _scatter_decisions(g) if d.trace == "forward"]
    assert d.code == "scatter_moved" and d.facts["dropped"] == 0


def test_a_scatter_that_cannot_be_rebuilt_in_stays_with_the_reason_and_strict_raises(failing_rebuild):
    """Rebuilding the region with the scatter fails: it stays outside, recorded as kept with the error, the values
    unguarded Thunder's; ``strict=True`` raises instead."""
    from thunder_fusion_guard import FusionGuardError

    g = _guard(True)
    guarded, _ = _both(message_sum, _inputs()[0], g)
    assert "index_add" in _outside(guarded)
    (d,) = _scatter_decisions(g)
    assert (d.code, d.action, d.error) == ("scatter_kept", "keep", "RuntimeError: planted rebuild failure")
    strict = thunder.jit(message_sum, executors=[no_scatter_executor()], transforms=[_guard(True, strict=True)])
    with pytest.raises(FusionGuardError, match=r"could not move .* \(forward\): RuntimeError: planted rebuild failure"):
        run_with_grads(strict, _inputs()[0])


def test_sums_by_index_are_the_scatters_into_new_tensors():
    """What the pass moves, by the ops Thunder traces: ``index_add`` and an embedding's gradient are sums by index;
    an in-place ``index_add_``, a gather and a plain add are not."""
    from thunder_fusion_guard.ops import sums_by_index

    def in_place(base, idx, y):
        return base.index_add_(0, idx, y) * 1.0

    def verdicts(trace):
        return {th.op_name(b): sums_by_index(b) for b in trace.bound_symbols}

    (x, idx, base), (w, tok) = _inputs()
    plain = thunder.jit(message_sum, executors=[])
    plain(x.detach(), idx, base)
    ops = verdicts(thunder.last_traces(plain)[0])
    assert ops.get("index_add") is True and ops.get("where") is False and ops.get("add") is False
    emb = thunder.jit(embedded, executors=[])
    run_with_grads(emb, (w, tok))
    backward = verdicts(thunder.last_backward_traces(emb)[0])
    assert any(k.endswith("embedding_backward") and v for k, v in backward.items()), backward
    writes = thunder.jit(in_place, executors=[])
    writes(torch.zeros(8, 4), idx, torch.ones(16, 4))
    found = verdicts(thunder.last_traces(writes)[0])
    assert not any(found.values()), found
