"""Matmuls and linears over a few terms computed inside the region that reads them first (``rewrites.small_matmuls``,
opt-in): the matmul leaves the trace, the region computes products and a sum (and outputs the result where the
return or the backward reads it too; through the views left outside regions on the way, which move in with it), the
values stay unguarded Thunder's within rounding, forward and backward; over more than 8 terms only where
launch-bound (a few million products, a short sum); left alone by default, outside float32, where an op outside
regions reads the result first, and in ``report_only`` mode (recorded, not applied)."""

import pytest
import thunder
import torch
from helpers import nvfuser_shaped_executor, views_outside_executor

from thunder_fusion_guard import Costs, FusionGuard, Rewrites


def product_then_pointwise(a, b, x):
    """A batched matmul over ``a.shape[-1]`` terms whose result one region alone reads (transposed, as e3nn's
    weight gradients are)."""
    return (torch.matmul(a, b).transpose(1, 2) * x).sin()


def _inputs(inner=3, dtype=torch.float32, grad=False):
    torch.manual_seed(0)
    a = torch.randn(6, 4, inner, dtype=dtype, requires_grad=grad)
    b = torch.randn(6, inner, 5, dtype=dtype, requires_grad=grad)
    return a, b, torch.randn(6, 5, 4, dtype=dtype)


def _guard(**rewrites):
    return FusionGuard(strict=True, costs=Costs(cost_model=False), rewrites=Rewrites(**rewrites))


def _top_ops(jitted, backward=False):
    traces = thunder.last_backward_traces(jitted) if backward else thunder.last_traces(jitted)
    return [b.sym.name for b in traces[-1].bound_symbols]


def _region_ops(jitted, backward=False):
    traces = thunder.last_backward_traces(jitted) if backward else thunder.last_traces(jitted)
    return [s.sym.name for b in traces[-1].bound_symbols if b.sym.is_fusion for s in b.subsymbols]


def _moves(guard):
    return [d for d in guard.report if d.code in ("matmul_moved", "matmul_kept")]


def test_a_matmul_over_three_terms_is_computed_in_the_region_that_reads_it():
    ex = nvfuser_shaped_executor()
    args = _inputs()
    guard = _guard(small_matmuls=True)
    guarded = thunder.jit(product_then_pointwise, executors=[ex], transforms=[guard])
    plain = thunder.jit(product_then_pointwise, executors=[ex])
    torch.testing.assert_close(guarded(*args), plain(*args), rtol=1e-6, atol=1e-6)
    assert "matmul" in _top_ops(plain)
    assert "matmul" not in _top_ops(guarded)
    assert _region_ops(guarded)[:4] == ["broadcast_in_dim", "broadcast_in_dim", "mul", "sum"]
    (d,) = _moves(guard)
    assert (d.action, d.code, d.trace, d.applied, d.ops) == ("rehome", "matmul_moved", "forward", True, ["matmul"])
    assert d.facts == {"into": d.region, "inner": 3}
    line = product_then_pointwise.__code__.co_firstlineno + 3  # the user's line of the matmul
    assert d.details["source"].endswith(f"test_small_matmuls.py:{line}")


def test_off_by_default_the_matmul_stays_and_the_bits_are_unguarded_thunders():
    ex = nvfuser_shaped_executor()
    args = _inputs()
    guard = FusionGuard(strict=True, costs=Costs(cost_model=False))
    guarded = thunder.jit(product_then_pointwise, executors=[ex], transforms=[guard])
    plain = thunder.jit(product_then_pointwise, executors=[ex])
    assert torch.equal(guarded(*args), plain(*args))
    assert "matmul" in _top_ops(guarded)
    assert not _moves(guard)


def test_a_backward_matmul_read_by_one_region_moves_and_gradients_match():
    def f(a, b, x):
        return (torch.matmul(a.sin(), b) * x.transpose(1, 2)).sum()

    ex = nvfuser_shaped_executor()
    guard = _guard(small_matmuls=True)
    grads = []
    for transforms in ([guard], []):
        a, b, x = _inputs(inner=5, grad=True)
        jitted = thunder.jit(f, executors=[ex], transforms=transforms)
        jitted(a, b, x).backward()
        grads.append((a.grad, b.grad))
    for got, expected in zip(*grads, strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)
    moved = [d for d in _moves(guard) if d.trace == "backward"]
    # a's gradient: the cotangent @ b.T (over 5 terms) is read by the region multiplying it by cos(a) alone
    assert [(d.code, d.facts["inner"]) for d in moved] == [("matmul_moved", 5)]


def test_a_launch_bound_matmul_over_more_terms_moves_and_its_values_stay_within_rounding():
    """Over 32 terms, 3840 products (e3nn's linears on nodes: a few million): the GEMM launch costs more."""
    ex = nvfuser_shaped_executor()
    args = _inputs(inner=32)
    guard = _guard(small_matmuls=True)
    guarded = thunder.jit(product_then_pointwise, executors=[ex], transforms=[guard])
    torch.testing.assert_close(guarded(*args), product_then_pointwise(*args), rtol=1e-5, atol=1e-5)
    assert "matmul" not in _top_ops(guarded)
    assert [(d.code, d.facts["inner"]) for d in _moves(guard)] == [("matmul_moved", 32)]


def _wide(dtype=torch.float32):
    """[64, 64, 32] @ [64, 32, 64]: 32 terms, 8.4 million products, a GEMM's work."""
    torch.manual_seed(0)
    a, b = torch.randn(64, 64, 32, dtype=dtype), torch.randn(64, 32, 64, dtype=dtype)
    return a, b, torch.randn(64, 64, 64, dtype=dtype)


@pytest.mark.parametrize(
    "args",
    [lambda: _inputs(257), _wide, lambda: _inputs(3, torch.bfloat16), lambda: _inputs(3, torch.float64)],
    ids=["257 terms", "8.4M products", "bf16", "fp64"],
)
def test_more_terms_than_a_short_sum_more_products_or_another_dtype_stays_outside(args):
    ex = nvfuser_shaped_executor()
    guard = _guard(small_matmuls=True)
    guarded = thunder.jit(product_then_pointwise, executors=[ex], transforms=[guard])
    guarded(*args())
    assert "matmul" in _top_ops(guarded)
    assert not _moves(guard)


def test_a_result_the_return_reads_too_is_computed_in_the_region_and_output_by_it():
    def read_twice(a, b, x):
        p = torch.matmul(a, b)
        return (p.transpose(1, 2) * x).sin(), p

    ex = nvfuser_shaped_executor()
    guard = _guard(small_matmuls=True)
    guarded = thunder.jit(read_twice, executors=[ex], transforms=[guard])
    a, b, x = _inputs()
    torch.testing.assert_close(guarded(a, b, x), thunder.jit(read_twice, executors=[ex])(a, b, x))
    assert "matmul" not in _top_ops(guarded)
    (d,) = _moves(guard)
    assert (d.code, d.facts) == ("matmul_moved", {"into": d.region, "inner": 3, "also_output": True})


def test_a_result_an_op_outside_regions_reads_stays_outside():
    def softmaxed(a, b, x):
        return (torch.softmax(torch.matmul(a, b), -1).transpose(1, 2) * x).sin()

    ex = nvfuser_shaped_executor()  # softmax runs outside its regions
    guard = _guard(small_matmuls=True)
    guarded = thunder.jit(softmaxed, executors=[ex], transforms=[guard])
    a, b, x = _inputs()
    torch.testing.assert_close(guarded(a, b, x), softmaxed(a, b, x), rtol=1e-6, atol=1e-6)
    assert "matmul" in _top_ops(guarded)
    assert not _moves(guard)


def test_the_views_left_outside_between_a_matmul_and_its_region_move_in_with_it():
    """nvFuser leaves the views between e3nn's backward matmuls outside its regions (a region of shape ops alone):
    the matmul goes into the region through them, the torch executor's own reshape as Thunder's prim."""

    def viewed(a, b, x):
        return (torch.matmul(a.sin().transpose(1, 2).unsqueeze(1).reshape(6, 4, 3), b) * x).sum()

    guard = _guard(small_matmuls=True)
    grads, backward_ops = [], []
    for transforms in ([], [guard]):
        torch.manual_seed(0)
        a, b = torch.randn(6, 3, 4, requires_grad=True), torch.randn(6, 3, 5, requires_grad=True)
        jitted = thunder.jit(viewed, executors=[views_outside_executor()], transforms=transforms)
        jitted(a, b, torch.randn(6, 4, 5)).backward()
        grads.append((a.grad, b.grad))
        backward_ops.append(_top_ops(jitted, backward=True))
    for got, expected in zip(*grads, strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)
    # unguarded: a's gradient (over 5 terms) is reshaped by the torch executor outside any region
    assert "torch_prims_reshape_impl" in backward_ops[0]
    assert backward_ops[1].count("matmul") == backward_ops[0].count("matmul") - 1
    assert "torch_prims_reshape_impl" not in backward_ops[1]
    moved = [(d.facts["inner"], d.facts.get("views")) for d in _moves(guard) if d.trace == "backward"]
    assert moved == [(5, ["reshape"])]


def test_a_forward_chain_of_views_moves_in_whole_and_one_read_twice_stays_outside():
    def viewed(a, b, x):
        return (torch.matmul(a, b).transpose(1, 2).unsqueeze(1).reshape(6, 5, 4) * x).sin()

    def view_returned(a, b, x):
        v = torch.matmul(a, b).transpose(1, 2)
        return (v * x).sin(), v

    a, b, x = _inputs()
    for fn, moved in ((viewed, True), (view_returned, False)):
        guard = _guard(small_matmuls=True)
        guarded = thunder.jit(fn, executors=[views_outside_executor()], transforms=[guard])
        torch.testing.assert_close(guarded(a, b, x), fn(a, b, x), rtol=1e-6, atol=1e-6)
        assert ("matmul" in _top_ops(guarded)) is not moved
        assert [d.facts.get("views") for d in _moves(guard)] == (
            [["transpose", "unsqueeze", "reshape"]] if moved else []
        )


def test_a_linear_over_eight_terms_saved_for_backward_is_computed_in_its_region_which_outputs_it():
    """e3nn's radial networks open with a [edges, 8] -> [edges, 32] linear whose result the activation reads and the
    backward saves: cuBLAS runs it as four kernels."""

    def radial(x, w, bias):
        return torch.nn.functional.silu(torch.nn.functional.linear(x, w, bias)).sum()

    ex = nvfuser_shaped_executor()
    guard = _guard(small_matmuls=True)
    results, forward_ops = [], []
    for transforms in ([], [guard]):
        torch.manual_seed(0)
        x, w = torch.randn(64, 8, requires_grad=True), torch.randn(32, 8, requires_grad=True)
        bias = torch.randn(32, requires_grad=True)
        jitted = thunder.jit(radial, executors=[ex], transforms=transforms)
        out = jitted(x, w, bias)
        out.backward()
        results.append((out, x.grad, w.grad, bias.grad))
        forward_ops.append(_top_ops(jitted))
    for got, expected in zip(*results, strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    assert "linear" in forward_ops[0] and "linear" not in forward_ops[1]
    (d,) = [d for d in _moves(guard) if d.trace == "forward"]
    assert (d.ops, d.facts) == (["linear"], {"into": d.region, "inner": 8, "also_output": True})


def test_report_only_records_the_move_and_changes_nothing():
    ex = nvfuser_shaped_executor()
    args = _inputs()
    guard = FusionGuard(report_only=True, costs=Costs(cost_model=False), rewrites=Rewrites(small_matmuls=True))
    guarded = thunder.jit(product_then_pointwise, executors=[ex], transforms=[guard])
    plain = thunder.jit(product_then_pointwise, executors=[ex])
    assert torch.equal(guarded(*args), plain(*args))
    assert "matmul" in _top_ops(guarded)
    (d,) = _moves(guard)
    assert (d.code, d.applied) == ("matmul_moved", False)


@pytest.mark.cuda
def test_on_nvfuser_the_products_run_in_the_region_and_the_values_stay_within_rounding(inject_timings):
    """On CUDA nvFuser's regions leave matmuls outside: e3nn's outer products over 3 and 5 terms move in."""
    inject_timings(10.0, 40.0, other_us=30.0)  # fused wins, the other executor loses: the region stays nvFuser's

    def f(a, b, c, d, x):
        return (torch.matmul(a, b).transpose(1, 2) * x + torch.matmul(c, d).transpose(1, 2)).sin()

    torch.manual_seed(0)
    args = [torch.randn(*s, device="cuda") for s in ((64, 32, 3), (64, 3, 32), (64, 32, 5), (64, 5, 32), (64, 32, 32))]
    guard = FusionGuard(strict=True, choose_executor=True, exact_only=False, rewrites=Rewrites(small_matmuls=True))
    guarded = thunder.jit(f, transforms=[guard])
    torch.testing.assert_close(guarded(*args), thunder.jit(f)(*args), rtol=1e-5, atol=1e-5)
    assert "matmul" not in _top_ops(guarded)
    assert sorted(d.facts["inner"] for d in _moves(guard) if d.code == "matmul_moved") == [3, 5]


def test_a_region_that_cannot_be_rebuilt_keeps_its_matmul_and_strict_raises(failing_rebuild):
    from thunder_fusion_guard import FusionGuardError

    ex = nvfuser_shaped_executor()
    args = _inputs()
    guard = FusionGuard(costs=Costs(cost_model=False), rewrites=Rewrites(small_matmuls=True))
    guarded = thunder.jit(product_then_pointwise, executors=[ex], transforms=[guard])
    assert torch.equal(guarded(*args), thunder.jit(product_then_pointwise, executors=[ex])(*args))
    assert "matmul" in _top_ops(guarded)
    (d,) = _moves(guard)
    assert (d.action, d.code, d.facts["skipped"]) == ("keep", "matmul_kept", "rebuilding it failed")
    assert d.error == "RuntimeError: planted rebuild failure"
    strict = thunder.jit(product_then_pointwise, executors=[ex], transforms=[_guard(small_matmuls=True)])
    with pytest.raises(
        FusionGuardError, match=r"could not compute the matmul .* \(forward\): RuntimeError: planted rebuild failure"
    ):
        strict(*args)


def test_the_options_one_line_help_names_the_limits_the_pass_applies():
    """The help (and README's options table, which repeats it) says what moves: the pass's own limits."""
    import dataclasses

    from thunder_fusion_guard.passes.small_matmuls import LAUNCH_BOUND_PRODUCTS, SHORT_INNER, SMALL_INNER

    doc = {f.name: f for f in dataclasses.fields(Rewrites)}["small_matmuls"].metadata["doc"]
    assert f"at most {SMALL_INNER} terms" in doc and f"at most {SHORT_INNER} terms" in doc
    assert f"{LAUNCH_BOUND_PRODUCTS >> 20}M products" in doc


def test_linears_shared_results_and_views_move_after_regions_are_decided_and_not_into_nvfusers(monkeypatch):
    """Before regions are decided a matmul moves only into the region that alone reads it; the linears, the results
    read later too and those behind views move afterwards, and not into nvFuser's regions (nvFuser 0.2.36 asserts on
    some e3nn regions given them). Here the test executor stands for nvFuser."""
    from thunder_fusion_guard.passes import small_matmuls

    def viewed(a, b, x):
        return (torch.matmul(a, b).transpose(1, 2).unsqueeze(1).reshape(6, 5, 4) * x).sin()

    a, b, x = _inputs()
    behind_views, alone = views_outside_executor(), nvfuser_shaped_executor()
    monkeypatch.setattr(small_matmuls, "NOT_INTO", frozenset({behind_views.name, alone.name}))
    for fn, ex, moved in ((viewed, behind_views, False), (product_then_pointwise, alone, True)):
        guard = _guard(small_matmuls=True)
        guarded = thunder.jit(fn, executors=[ex], transforms=[guard])
        torch.testing.assert_close(guarded(a, b, x), fn(a, b, x), rtol=1e-6, atol=1e-6)
        assert ("matmul" in _top_ops(guarded)) is not moved
        assert len(_moves(guard)) == int(moved)


def linear_between(x, w):
    y = torch.where(x > 0, x, -x) + 1.0
    z = torch.nn.functional.linear(y, w)  # a linear: moved after regions are decided, into the region reading it
    return torch.where(z > 0, z, -z) - 1.0


def test_regions_a_late_move_leaves_side_by_side_stay_apart():
    """The linear between two regions moves into the second after regions are decided; with ``merge_regions`` the
    two regions stay two calls (merged into one torch.compile call, Inductor's kernels for the e3nn steps took more
    device time than the two calls' did)."""
    torch.manual_seed(0)
    x, w = torch.randn(4, 8), torch.randn(8, 8)
    ex = nvfuser_shaped_executor()
    guard = _guard(small_matmuls=True, merge_regions=True)
    guarded = thunder.jit(linear_between, executors=[ex], transforms=[guard])
    plain = thunder.jit(linear_between, executors=[ex])
    torch.testing.assert_close(guarded(x, w), plain(x, w), rtol=1e-6, atol=1e-6)
    fusions = [b.sym.name for b in thunder.last_traces(guarded)[-1].bound_symbols if b.sym.is_fusion]
    assert "linear" in _top_ops(plain) and "linear" not in _top_ops(guarded)
    assert len(fusions) == 2 and not [d for d in guard.report if d.code == "merged" and d.trace == "forward"]
