"""Awkward programs and settings: the guarded function must agree with unguarded Thunder and eager."""

import html

import pytest
import thunder
import torch
from helpers import (
    ALWAYS_EAGER,
    assert_close_all,
    assert_same,
    check_three_ways,
    decision_text,
    flat,
    jit_cpu,
    region_actions,
    regions,
    run_with_grads,
    shares_storage,
)
from test_guard import rearrange_heads
from thunder.executors.torch_compile import torch_compile_ex
from torch.utils._pytree import tree_flatten

from thunder_fusion_guard import Costs, FusionGuard, explain


def check(fn, args, **jit_options):
    """check_three_ways with a strict guard; returns the guard and the guarded function."""
    guard = FusionGuard(strict=True)
    guarded, _ = check_three_ways(fn, args, guard, **jit_options)
    return guard, guarded


def test_function_without_fusion_region():
    def passthrough(x, n):
        return x, n * 2, x.shape

    guard = FusionGuard(strict=True)
    jitted = jit_cpu(passthrough, guard)
    x = torch.randn(3, 4)
    out = jitted(x, 3)
    assert out[0] is x and out[1:] == (6, (3, 4))
    assert regions(jitted) == [] and len(guard.report) == 0
    assert "torchcompile found nothing to fuse here" in explain(jitted)


def nested(x):
    return {"flat": x.view(-1), "pair": [x.t(), (x.shape[0], "label", None)], "total": (x * 2).sum(), "n": 7}


def test_non_tensor_and_nested_outputs():
    x = torch.randn(3, 4, requires_grad=True)
    guard = FusionGuard(strict=True)
    out_g, out_p, out_e = jit_cpu(nested, guard)(x), jit_cpu(nested)(x), nested(x)
    leaves_g, spec_g = tree_flatten(out_g)
    leaves_p, spec_p = tree_flatten(out_p)
    leaves_e, spec_e = tree_flatten(out_e)
    assert spec_g == spec_p == spec_e
    assert_same([t.detach() if isinstance(t, torch.Tensor) else t for t in leaves_g], leaves_p)
    assert_close_all(leaves_g, leaves_e)
    assert shares_storage(out_g["flat"], x) and shares_storage(out_g["pair"][0], x)
    check(nested, [x])


def zero_size(x):
    return x.reshape(-1, 2).t(), x.sum(0), x.unsqueeze(0).expand(3, -1, -1), x[:, 1:] * 2


def zero_size_views(x):
    return x.reshape(-1, 2).t(), x.unsqueeze(0).expand(3, -1, -1), x[:, 1:]


def test_zero_size_tensors():
    _, guarded = check(zero_size, [torch.randn(0, 4, requires_grad=True)])
    assert [tuple(t.shape) for t in guarded(torch.randn(0, 4))] == [(2, 0), (4,), (3, 0, 4), (0, 3)]
    guard, guarded = check(zero_size_views, [torch.randn(0, 4, requires_grad=True)])
    assert guard.report.filter(trace="forward", action="reject"), "a metadata-only region goes to torch"
    assert regions(guarded) == []


def strided(x):
    return x.reshape(-1), x.transpose(0, 1), x[:, ::2] * 2, x.unsqueeze(1).expand(-1, 2, -1)


# Both paths of a region mixing views and a mul, chosen without timings: kept (no cost decisions) or
# rejected (a model under which eager always wins).
PATHS = {
    "kept": ("keep", {"costs": {"cost_model": False}}),
    "rejected": ("reject", {"costs": {"calibration": ALWAYS_EAGER}}),
}


@pytest.mark.parametrize("path", sorted(PATHS))
@pytest.mark.parametrize(
    "make",
    [
        lambda: torch.randn(4, 6)[:, ::2],
        pytest.param(lambda: torch.randn(6, 4).t(), marks=pytest.mark.slow),  # strides as 'sliced': --run-slow
        lambda: torch.randn(1, 3).expand(4, 3),
    ],
    ids=["sliced", "transposed", "expanded"],
)
def test_non_contiguous_inputs_keep_eager_aliasing(make, path):
    action, options = PATHS[path]
    x = make()
    guard = FusionGuard(strict=True, **options)
    out_g, out_e = jit_cpu(strided, guard)(x), strided(x)
    assert_same(list(out_g), list(out_e))
    assert [shares_storage(o, x) for o in out_g] == [shares_storage(o, x) for o in out_e]
    assert {a for a, _ in region_actions(guard).values()} == {action}, guard.report
    check(strided, [x.clone().requires_grad_()])


def mixed_dtypes(a, b, c, m):
    flat = a.view(-1).to(torch.float32) + b.reshape(-1)
    return (
        flat,
        c.t(),
        (c.float() * 2).to(torch.bfloat16),
        m.t().reshape(-1),
        a.t().to(torch.float64),
        torch.where(m, a[:, :2], 0.0),
    )


def test_dtype_mixes():
    args = [
        torch.randn(2, 3, dtype=torch.bfloat16, requires_grad=True),
        torch.randn(6, requires_grad=True),
        torch.arange(6).reshape(2, 3),
        torch.tensor([[True, False], [False, True]]),
    ]
    check(mixed_dtypes, args)


def view_and_tanh(x):
    return x.reshape(-1).tanh(), x.t(), x.unsqueeze(0)


def test_no_grad_then_grad():
    """The fused tanh is compared bit for bit with unguarded thunder, and only closely with eager:
    torch.compile's tanh and ATen's may differ in the last bit, depending on the CPU."""
    guard = FusionGuard(strict=True)
    jitted, plain = jit_cpu(view_and_tanh, guard), jit_cpu(view_and_tanh)
    x = torch.randn(3, 4, requires_grad=True)
    with torch.no_grad():
        out, out_p, out_e = jitted(x), plain(x), view_and_tanh(x)
    assert [t.requires_grad for t in out] == [t.requires_grad for t in out_e]  # views of x keep requires_grad
    assert_same([t.detach() for t in out], [t.detach() for t in out_p])
    assert_close_all([t.detach() for t in out], [t.detach() for t in out_e])
    assert {d.trace for d in guard.report} == {"forward"}
    out_g, grad_g = run_with_grads(jitted, [x])
    out_p, grad_p = run_with_grads(plain, [x])
    out_e, grad_e = run_with_grads(view_and_tanh, [x])
    assert_same(out_g, out_p)
    assert_same(grad_g, grad_p)
    assert_close_all(out_g, out_e)
    assert_close_all(grad_g, grad_e)
    assert {d.trace for d in guard.report.filter(compile_index=2)} == {"forward", "backward"}


def projection(x, w):
    return (x.reshape(-1, 4) @ w).t(), x.transpose(0, 1), (x * 2).sum()


def test_autocast_cpu_bf16():
    x, w = torch.randn(2, 3, 4), torch.randn(4, 5)
    guard = FusionGuard(strict=True)
    guarded, plain = jit_cpu(projection, guard), jit_cpu(projection)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out_g, out_p, out_e = guarded(x, w), plain(x, w), projection(x, w)
    assert [t.dtype for t in out_g] == [t.dtype for t in out_e] == [torch.bfloat16, torch.float32, torch.float32]
    assert_same(list(out_g), list(out_p))
    torch.testing.assert_close(list(out_g), list(out_e), atol=1e-2, rtol=1e-2)
    assert shares_storage(out_g[1], x)
    assert guard.report


def permute_slice(x):
    return x.permute(2, 0, 1)[1:]


def reshape_sum(x):
    return x.reshape(x.shape[0], -1).t(), x.sum(0)


SHAPES = [(2, 3, 4), (3, 3, 4), (5, 2, 2)]


# With grad, thunder 0.2.6 fails on these programs under symbolic values without the guard too
# ("Failed to find an executor for bound symbol prims.mul(1, i0)"), so only the forward is run.
@pytest.mark.parametrize("fn", [permute_slice, reshape_sum], ids=lambda f: f.__name__)
def test_symbolic_values_cache_across_shapes(fn):
    guard = FusionGuard(strict=True)
    guarded = jit_cpu(fn, guard, cache="symbolic values")
    plain = jit_cpu(fn, cache="symbolic values")
    for shape in SHAPES:
        x = torch.randn(shape)
        out_g, out_p, out_e = (flat(f(x)) for f in (guarded, plain, fn))
        assert_same(out_g, out_p)
        assert_close_all(out_g, out_e)
    assert thunder.cache_misses(guarded) == 1 and thunder.cache_hits(guarded) == len(SHAPES) - 1
    assert {d.compile_index for d in guard.report} == {1}


def select_last_column(x):
    return x.view(-1, x.shape[-1]).select(1, 0).unsqueeze(-1)


@pytest.mark.parametrize("fn", [permute_slice, select_last_column], ids=lambda f: f.__name__)
def test_symbolic_values_metadata_only_region_is_rejected(fn):
    """Shape arithmetic on integers (prims.shape, mul, lt, ... under symbolic values) is no compute: a
    region of views and that arithmetic is rejected, and its torch lowering holds for every new shape."""
    guard = FusionGuard(strict=True)
    jitted = jit_cpu(fn, guard, cache="symbolic values")
    plain = jit_cpu(fn, cache="symbolic values")
    for shape in [*SHAPES, (7, 1, 3)]:
        x = torch.randn(shape)
        out, out_p, out_e = jitted(x), plain(x), fn(x)
        assert torch.equal(out, out_p) and torch.equal(out, out_e) and out.stride() == out_e.stride()
        assert shares_storage(out, x), "a view in eager stays a view"
    assert thunder.cache_misses(jitted) == 1
    assert regions(plain), "unguarded thunder makes a region here"
    assert regions(jitted) == []
    (d,) = guard.report
    assert (d.action, d.applied, d.error) == ("reject", True, None) and d.details["decided_by"] == "metadata"


def test_recompiled_entries_stay_correct():
    """Each cache entry keeps its own guarded trace: going back to an earlier shape reuses it correctly."""
    guard = FusionGuard(strict=True)
    jitted = jit_cpu(rearrange_heads, guard)
    inputs = [torch.randn(2, 3, 4, 5), torch.randn(2, 3, 6, 5), torch.randn(2, 3, 4, 5, dtype=torch.float64)]
    for x in [*inputs, inputs[0], inputs[1]]:
        out = jitted(x)
        assert torch.equal(out, rearrange_heads(x)) and shares_storage(out, x)
    assert thunder.cache_misses(jitted) == 3 and thunder.cache_hits(jitted) == 2
    assert [d.compile_index for d in guard.report] == [1, 2, 3]
    assert {d.action for d in guard.report} == {"reject"}
    # the report says why there are three rows: Thunder compiled the function three times, and for what
    text = explain(jitted, wide=True)  # the note on one line
    note = (
        "rearrange_heads: compiled 3 times (rearrange_heads#1, #2, #3), each time for inputs the compilation "
        "before did not accept: #2 input t shape (2, 3, 4, 5) -> (2, 3, 6, 5); #3 input t shape (2, 3, 6, 5) -> "
        "(2, 3, 4, 5), input t dtype float32 -> float64; each compilation made the same decisions, listed for each"
    )
    assert note in text.splitlines(), text
    assert f"- {note}" in guard.report.to_markdown() and html.escape(note) in guard.report.to_html()
    assert guard.report.to_dict()["recompiles"]["rearrange_heads"][0] == "input t shape (2, 3, 4, 5) -> (2, 3, 6, 5)"


def test_threads_compiling_at_once_are_reported_as_that():
    """Two threads calling a jitted function at once each compile it (both miss the cache): the report says
    that two threads compiled it at once for the same inputs, not that the second compilation was for inputs the
    first did not accept."""
    import threading

    guard = FusionGuard()
    jitted = jit_cpu(rearrange_heads, guard)
    start = threading.Barrier(2)

    def call():
        start.wait()
        jitted(torch.randn(2, 3, 4, 5))

    threads = [threading.Thread(target=call) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert thunder.cache_misses(jitted) == 2, "the two calls did not compile at once"
    note = next(line for line in explain(jitted, wide=True).splitlines() if "compiled 2 times" in line)
    assert "by 2 threads at once, for the same inputs" in note and "did not accept" not in note, note


class Scale(torch.nn.Module):
    def forward(self, x):
        return x.flatten(1) * 3.0


def swap(x):
    return x.transpose(-1, -2)


def test_one_guard_shared_by_several_functions():
    guard = FusionGuard(strict=True, costs=Costs(calibration=ALWAYS_EAGER))  # every region rejected, none timed
    x = torch.randn(2, 3, 4, 5, requires_grad=True)
    for fn in (rearrange_heads, swap, Scale()):
        jitted = jit_cpu(fn, guard)
        out, grads = run_with_grads(jitted, [x])
        out_e, grads_e = run_with_grads(fn, [x])
        assert_same(out, out_e)
        assert_close_all(grads, grads_e)
        assert decision_text(explain(jitted)) == str(guard.report)
    by_function = {}
    for d in guard.report:
        by_function.setdefault(d.function, set()).add((d.compile_index, d.trace))
    assert set(by_function) == {"rearrange_heads", "swap", "Scale"}
    for function, seen in by_function.items():
        assert {trace for _, trace in seen} == {"forward", "backward"}, function
        assert len({index for index, _ in seen}) == 1, f"{function}: one compilation, one compile_index"
    assert all(f"{name}#" in str(guard.report) for name in by_function)
    decided = {(d.function, d.trace): (d.action, d.details["decided_by"]) for d in guard.report if d.about_region}
    assert decided == {
        **{(f, t): ("reject", "metadata") for f in ("rearrange_heads", "swap") for t in ("forward", "backward")},
        **{("Scale", t): ("reject", "model") for t in ("forward", "backward")},
    }


def test_compile_index_counts_per_function():
    """One guard, two functions, each recompiled for a new shape (default cache): each function's
    compilations are numbered 1, 2, ... on their own, forward and backward of one compilation alike."""
    guard = FusionGuard(strict=True)
    heads, swapped = jit_cpu(rearrange_heads, guard), jit_cpu(swap, guard)
    small, large = torch.randn(2, 3, 4, 5, requires_grad=True), torch.randn(2, 3, 6, 5, requires_grad=True)
    for jitted, fn, x in [
        (heads, rearrange_heads, small),
        (swapped, swap, small),
        (heads, rearrange_heads, large),
        (swapped, swap, small),
        (swapped, swap, large),
        (heads, rearrange_heads, small),
    ]:
        out, grads = run_with_grads(jitted, [x])
        out_e, grads_e = run_with_grads(fn, [x])
        assert_same(out, out_e)
        assert_same(grads, grads_e)
    assert thunder.cache_misses(heads) == thunder.cache_misses(swapped) == 2
    seen = [(d.function, d.compile_index, d.trace) for d in guard.report]
    assert seen == [
        ("rearrange_heads", 1, "forward"),
        ("rearrange_heads", 1, "backward"),
        ("swap", 1, "forward"),
        ("swap", 1, "backward"),
        ("rearrange_heads", 2, "forward"),
        ("rearrange_heads", 2, "backward"),
        ("swap", 2, "forward"),
        ("swap", 2, "backward"),
    ]
    assert "rearrange_heads#2:forward" in explain(heads) and "swap#2:backward" in explain(swapped)


def graph_break(x, w):
    y = x.reshape(x.shape[0], -1).t()
    z = torch.tanh(y @ w)
    torch._dynamo.graph_break()
    return z.transpose(0, 1), y.unsqueeze(0), y[1:].sum()


def test_thunderfx_with_the_guard_matches_eager():
    from thunder.dynamo import thunderfx

    guard = FusionGuard(strict=True)
    compiled = thunderfx(graph_break, transforms=[guard], executors=[torch_compile_ex])
    x, w = torch.randn(4, 2, 3, requires_grad=True), torch.randn(4, 5, requires_grad=True)
    out, grads = run_with_grads(compiled, [x, w])
    out_e, grads_e = run_with_grads(graph_break, [x, w])
    assert_close_all(out, out_e)
    assert_close_all(grads, grads_e)
    x2 = x.detach().clone()
    assert shares_storage(compiled(x2, w)[1], x2) == shares_storage(graph_break(x2, w)[1], x2)
    assert len({d.compile_index for d in guard.report}) >= 2, "both subgraphs went through the guard"
    assert {"forward", "backward"} <= {d.trace for d in guard.report}
    assert decision_text(explain(compiled)) == str(guard.report)
    assert guard.report.filter(action="reject"), "the metadata-only region of the second subgraph goes to torch"


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"executors": 5}, "'executors' must be a list"),
        ({"executors": [""]}, "'executors' must be a list .*got the item ''"),
        ({"rewrites": {"metadata_ops": "reshape"}}, "'rewrites.metadata_ops' must be a list"),
        ({"rewrites": {"metadata_ops": None}}, "'rewrites.metadata_ops' must be a list"),
        ({"report_only": None}, "'report_only' must be True or False"),
        ({"report_only": 1}, "'report_only' must be True or False"),
        ({"costs": {"cost_model": "on"}}, "'costs.cost_model' must be True or False"),
        ({"costs": {"margin": True}}, "'costs.margin' must be a number"),
        ({"costs": {"margin": -0.1}}, "'costs.margin' must be a number"),
        ({"costs": {"margin": "0.2"}}, "'costs.margin' must be a number"),
        ({"costs": {"calibration": {"bogus": 1.0}}}, "unknown fields \\['bogus'\\]"),
    ],
)
def test_more_bad_options(kwargs, match):
    with pytest.raises(ValueError, match=match):
        FusionGuard(**kwargs)


def test_executor_objects_are_accepted_as_names():
    assert FusionGuard(executors=[torch_compile_ex]).options.executors == {"torchcompile"}
