"""Hoisting: input-independent work (litgpt Mistral's sliding-window mask) computed once per compiled
program. Checked against eager and unguarded thunder bit for bit, on the traces, the decisions recorded
and the number of ops left per call; and what must never be hoisted."""

import pytest
import thunder
import torch
from helpers import assert_close_all, assert_same, regions, run_with_grads
from thunder.core import prims
from thunder.executors.torch_compile import TorchCompileExecutor, torch_compile_ex

from thunder_fusion_guard import Costs, FusionGuard, Runtime
from thunder_fusion_guard import _thunder as th
from thunder_fusion_guard.passes.hoist import check_backward
from thunder_fusion_guard.passes.hoist_runtime import HOISTED_NAME, HoistedValues, hoisted_values


def setitem_outside_executor() -> TorchCompileExecutor:
    """torch.compile that, like nvFuser, takes neither setitem nor alias updates: the mask loop runs
    outside fusions, as in the GPU trace of litgpt's Mistral."""
    ex = TorchCompileExecutor("tc_like_nvfuser")
    skip = (prims.PrimIDs.COPY_WITH_SETITEM, prims.PrimIDs.UPDATE_ALIASES)
    ex._implmap = {k: v for k, v in torch_compile_ex._implmap.items() if k not in skip}
    return ex


EXECUTORS = {"torch": [], "like-nvfuser": [setitem_outside_executor()], "torchcompile": [torch_compile_ex]}


def jit(fn, guard=None, executor="torchcompile"):
    return thunder.jit(fn, executors=EXECUTORS[executor], transforms=[] if guard is None else [guard])


def three_ways(fn, args, guard, executor, exact_eager=False):
    """Outputs and gradients: guarded == unguarded thunder to the bit, == or close to eager."""
    guarded, plain = jit(fn, guard, executor), jit(fn, None, executor)
    got, want = run_with_grads(guarded, args), run_with_grads(plain, args)
    assert_same(got[0], want[0])
    assert_same(got[1], want[1])
    eager = run_with_grads(fn, args)
    check = assert_same if exact_eager else assert_close_all
    check(got[0], eager[0])
    check(got[1], eager[1])
    return guarded, plain


def mask_loop(x):
    """litgpt's Mistral sliding-window mask, in small: full, one in-place setitem per row, then an add."""
    t = x.shape[-1]
    mask = torch.full((t, t), float("-inf"), dtype=x.dtype, device=x.device)
    for i in range(t):
        mask[i, max(0, i - 2) : i + 1] = 0.0
    return x + mask.view(1, t, t)


def mask_softmax(x):
    return torch.softmax(mask_loop(x), dim=-1)


def hoists(guard, trace="forward", action="hoist"):
    return [d for d in guard.report.decisions if d.region == HOISTED_NAME and d.trace == trace and d.action == action]


def ops_per_call(jitted, backward=False):
    """Top-level ops one call runs (the trace's plumbing aside)."""
    traces = thunder.last_backward_traces(jitted) if backward else thunder.last_traces(jitted)
    return len([b for b in traces[-1].bound_symbols if not th.is_plumbing(b)])


def cache_of(jitted, backward=False):
    traces = thunder.last_backward_traces(jitted) if backward else thunder.last_traces(jitted)
    (values,) = hoisted_values(traces[-1])
    return values


@pytest.mark.parametrize(
    "executor, fn", [("torch", mask_softmax), ("like-nvfuser", mask_softmax), ("torchcompile", mask_loop)]
)
def test_mask_loop_is_hoisted_and_exact(executor, fn):
    x = torch.randn(2, 6, 6, requires_grad=True)
    guard = FusionGuard(strict=True)
    guarded, plain = three_ways(fn, [x], guard, executor, exact_eager=fn is mask_loop)
    (decision,) = hoists(guard)
    assert decision.ops.count("full") == 1 and decision.applied
    # the 6x6 mask; a fusion may hand it out broadcast to the batch of 2, and is then counted so
    assert decision.details["bytes"] in (6 * 6 * 4, 2 * 6 * 6 * 4) and decision.details["ops_saved_per_call"] >= 6
    for _ in range(3):
        (out_g, grad_g), (out_p, grad_p) = run_with_grads(guarded, [x]), run_with_grads(plain, [x])
        assert_same(out_g, out_p)
        assert_same(grad_g, grad_p)
    assert (cache_of(guarded).computed, cache_of(guarded).reused) == (1, 3)
    unhoisted = jit(fn, FusionGuard(hoist=False), executor)
    unhoisted(x)
    if executor == "torchcompile":  # the mask was made inside the one region: it leaves the region
        assert decision.details["split"] == ["TorchCompile0"] and decision.details["fused_ops_saved_per_call"] > 6
    else:
        assert ops_per_call(guarded) <= ops_per_call(unhoisted) - 6


def test_setitems_leave_the_per_call_trace():
    x = torch.randn(2, 6, 6)
    guarded = jit(mask_softmax, FusionGuard(), "torch")
    plain = jit(mask_softmax, FusionGuard(hoist=False), "torch")
    assert_same([guarded(x)], [plain(x)])
    names = [b.sym.name for b in thunder.last_traces(guarded)[-1].bound_symbols]
    assert "inplace_setitem" not in names and names.count(HOISTED_NAME) == 1
    assert [b.sym.name for b in thunder.last_traces(plain)[-1].bound_symbols].count("inplace_setitem") == 6
    # full, 6 setitems, 8 alias updates and a view become one call
    assert ops_per_call(guarded) == ops_per_call(plain) - 16 + 1


def test_torch_compile_region_with_a_reduction_is_split_only_without_exact_only():
    x = torch.randn(2, 6, 6, requires_grad=True)
    exact = FusionGuard()
    three_ways(mask_softmax, [x], exact, "torchcompile")
    assert not hoists(exact)  # the softmax region could round differently once rebuilt
    # exact_only=False lets other passes rebuild regions too (bits may change): compare with hoisting off.
    # No cost decisions: the softmax regions stay fused on both (never rejected, never timed), so the
    # split is the only difference.
    loose = FusionGuard(exact_only=False, costs=Costs(cost_model=False))
    guarded = jit(mask_softmax, loose, "torchcompile")
    unhoisted = jit(
        mask_softmax, FusionGuard(exact_only=False, hoist=False, costs=Costs(cost_model=False)), "torchcompile"
    )
    for _ in range(2):
        (out_g, grad_g), (out_u, grad_u) = run_with_grads(guarded, [x]), run_with_grads(unhoisted, [x])
        assert_same(out_g, out_u)
        assert_same(grad_g, grad_u)
    (decision,) = hoists(loose)
    assert decision.details["split"] == ["TorchCompile0"]
    assert (cache_of(guarded).computed, cache_of(guarded).reused) == (1, 1)
    assert {d.action for d in loose.report if d.about_region and d.region != "TorchCompile0"} == {"keep"}


def add_ones_(x):
    x.add_(torch.ones(x.shape, device=x.device))
    return x * 2


def copy_zeros_(x):
    x.copy_(torch.zeros(x.shape, device=x.device))
    return x + 1


@pytest.mark.parametrize("executor", ["torch", "torchcompile"])
@pytest.mark.parametrize("fn", [add_ones_, copy_zeros_])
def test_factory_feeding_an_in_place_update_of_an_input_is_not_hoisted(executor, fn):
    guard = FusionGuard()
    jitted = jit(fn, guard, executor)
    x = torch.randn(3, 4)
    expected = x.clone()
    for _ in range(3):
        assert_same([jitted(x)], [fn(expected)])
        assert_same([x], [expected])
    assert not hoists(guard)
    assert not hoisted_values(thunder.last_traces(jitted)[-1])


@pytest.mark.parametrize("executor", ["torch", "torchcompile"])
def test_random_op_is_not_hoisted(executor):
    def noisy(x):
        return x + torch.rand(x.shape, device=x.device)

    guard = FusionGuard()
    jitted = jit(noisy, guard, executor)
    x = torch.zeros(4, 4)
    assert not torch.equal(jitted(x), jitted(x))
    assert not hoists(guard)


class Scaled(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(4))

    def forward(self, x):
        return x + torch.full((4,), 2.0) * self.w


@pytest.mark.parametrize("executor", ["torch", "like-nvfuser"])
def test_op_reading_a_parameter_is_not_hoisted(executor):
    model = Scaled()
    guard = FusionGuard()
    jitted = jit(model, guard, executor)
    x = torch.randn(3, 4, requires_grad=True)
    assert_same(run_with_grads(jitted, [x])[0], run_with_grads(model, [x])[0])
    for d in hoists(guard):
        assert "mul" not in d.ops and d.ops == ["full"]
    with torch.no_grad():
        model.w.mul_(3.0)
    assert_same(run_with_grads(jitted, [x])[0], run_with_grads(model, [x])[0])


def returns_the_factory(x):
    m = torch.arange(x.shape[-1], dtype=x.dtype)
    return x + m, m


def returns_a_view_of_it(x):
    m = torch.arange(x.shape[-1], dtype=x.dtype)
    return x + m, m.view(1, -1)


@pytest.mark.parametrize("executor", ["torch", "torchcompile"])
@pytest.mark.parametrize("fn", [returns_the_factory, returns_a_view_of_it])
def test_returned_tensor_is_not_hoisted(executor, fn):
    guard = FusionGuard()
    jitted = jit(fn, guard, executor)
    x = torch.randn(3, 4)
    first = jitted(x)
    first[1].fill_(7.0)  # the caller owns what it gets
    assert_same(list(jitted(x)), list(fn(x)))
    assert not hoists(guard)


def test_a_new_shape_recompiles_and_recomputes():
    guard = FusionGuard()
    jitted = jit(mask_softmax, guard, "torch")
    small, large = torch.randn(2, 6, 6), torch.randn(2, 9, 9)
    assert_same([jitted(small)], [mask_softmax(small)])
    first = cache_of(jitted)
    assert_same([jitted(large)], [mask_softmax(large)])
    second = cache_of(jitted)
    assert second is not first and second.computed == 1 and second.values[0].shape[-1] == 9
    assert_same([jitted(small)], [mask_softmax(small)])
    assert (first.computed, first.reused) == (1, 1)
    assert [d.compile_index for d in hoists(guard)] == [1, 2]


def two_masks(x):
    """A 6x6 mask made in 13 ops and a table of 64 floats made in 2: two separate pieces."""
    t = x.shape[-1]
    mask = torch.full((t, t), float("-inf"), dtype=x.dtype)
    for i in range(t):
        mask[i, max(0, i - 2) : i + 1] = 0.0
    table = torch.arange(64, dtype=x.dtype) * 0.5
    return x + mask, x.sum() + table


@pytest.mark.parametrize("cap, hoisted", [(10**6, 2), (200, 1), (0, 0)])
def test_memory_cap_is_honoured(cap, hoisted):
    guard = FusionGuard(runtime=Runtime(hoist_max_bytes=cap))
    jitted = jit(two_masks, guard, "torch")
    x = torch.randn(6, 6)
    for _ in range(2):
        assert_same(list(jitted(x)), list(two_masks(x)))
    done = hoists(guard)
    kept = hoists(guard, action="keep")
    assert len(done) == hoisted and len(done) + len(kept) == 2
    assert sum(d.details["bytes"] for d in done) <= cap
    for d in kept:  # over what the hoisted pieces left of the cap
        assert d.details["bytes"] > cap - sum(x.details["bytes"] for x in done) and "would_hoist_with" not in d.details
    if hoisted == 1:
        assert done[0].details["bytes"] == 6 * 6 * 4  # the piece saving the most ops goes first
    assert len(hoisted_values(thunder.last_traces(jitted)[-1])) == (1 if hoisted else 0)


def two_layers(x):
    """One mask per layer, as litgpt builds them: the second piece shares the first one's tensor."""
    return mask_softmax(mask_softmax(x) * 2.0)


def test_identical_pieces_share_their_tensors():
    guard = FusionGuard()
    x = torch.randn(2, 6, 6, requires_grad=True)
    guarded, _ = three_ways(two_layers, [x], guard, "torch")
    first, second = hoists(guard)
    assert first.details["same_as"] is None and second.details["same_as"] == first.details["piece"] == 0
    assert second.details["bytes"] == 0 and second.ops == first.ops
    values = cache_of(guarded)
    assert len(values.values) == 2 and values.values[0] is values.values[1]
    (call,) = [b for b in thunder.last_traces(guarded)[-1].bound_symbols if b.sym.name == HOISTED_NAME]
    assert [s.sym.name for s in call.subsymbols].count("full") == 1  # one mask computed, handed out twice


def test_a_region_left_unguarded_keeps_its_mask_and_a_decision_names_the_option():
    guard = FusionGuard(executors=["torchcompile_cat"])  # not the torch.compile region: not the guard's to rebuild
    x = torch.randn(2, 6, 6)
    jitted = jit(mask_loop, guard)
    assert_same([jitted(x)], [mask_loop(x)])
    assert not hoists(guard)
    (row,) = hoists(guard, action="keep")
    assert row.details["would_hoist_with"] == "executors=None" and "full" in row.ops
    assert row.details["split"] == ["TorchCompile0"] and row.details["ops_saved_per_call"] > 0
    assert [b.sym.name for b in thunder.last_traces(jitted)[-1].bound_symbols].count(HOISTED_NAME) == 0


def test_hoist_false_turns_it_off():
    guard = FusionGuard(hoist=False)
    jitted = jit(mask_softmax, guard, "torch")
    jitted(torch.randn(2, 6, 6))
    assert not [d for d in guard.report.decisions if d.region == HOISTED_NAME]
    assert HOISTED_NAME not in [b.sym.name for b in thunder.last_traces(jitted)[-1].bound_symbols]


def test_report_only_records_and_changes_nothing():
    guard = FusionGuard(report_only=True)
    jitted = jit(mask_softmax, guard, "torch")
    jitted(torch.randn(2, 6, 6))
    (decision,) = hoists(guard)
    assert not decision.applied
    assert HOISTED_NAME not in [b.sym.name for b in thunder.last_traces(jitted)[-1].bound_symbols]


@pytest.mark.parametrize(
    "options, error",
    [
        (dict(hoist="yes"), "'hoist'"),
        (dict(runtime=dict(hoist_max_bytes=-1)), "'runtime.hoist_max_bytes'"),
        (dict(runtime=dict(hoist_max_bytes=1.5)), "'runtime.hoist_max_bytes'"),
        (dict(runtime=dict(hoist_max_bytes=True)), "'runtime.hoist_max_bytes'"),
        (dict(runtime=dict(hoist_max_bytes="64MiB")), "'runtime.hoist_max_bytes'"),
    ],
)
def test_bad_options(options, error):
    with pytest.raises(ValueError, match=error):
        FusionGuard(**options)


def test_backward_trace_is_hoisted_too():
    idx = torch.tensor([0, 2, 2])

    def pick(x):
        return x[idx] * 2

    guard = FusionGuard()
    x = torch.randn(3, 4, requires_grad=True)
    guarded, _ = three_ways(pick, [x], guard, "torch", exact_eager=True)
    (decision,) = hoists(guard, trace="backward")
    assert decision.ops == ["full"]
    run_with_grads(guarded, [x])
    values = cache_of(guarded, backward=True)
    assert (values.computed, values.reused) == (1, 1)


def test_saved_for_backward_is_hoisted_and_gradients_stay_exact():
    model = Scaled()
    guard = FusionGuard()
    jitted = jit(model, guard, "torch")
    x = torch.randn(3, 4, requires_grad=True)
    for _ in range(3):
        model.zero_grad()
        out = jitted(x)
        out.sum().backward()
        got = model.w.grad.clone()
        model.zero_grad()
        model(x).sum().backward()
        assert torch.equal(got, model.w.grad)
    (decision,) = hoists(guard)
    assert decision.details["saved_for_backward"] == decision.details["outputs"]


def test_backward_that_writes_a_saved_hoisted_tensor_turns_its_cache_off():
    def writes(x):
        x.mul_(2.0)
        return x

    jitted = thunder.jit(writes, executors=[])
    jitted(torch.randn(3))
    trace = thunder.last_traces(jitted)[-1]
    values = HoistedValues("probe", lambda: (torch.zeros(3),), ["x"])
    assert check_backward(trace, {"x": values}) == ["x"]
    assert not values.enabled
    values()
    values()
    assert (values.computed, values.reused) == (2, 0)


def table_selected(x):
    """A table of 0.1 steps in the input's dtype, selected in that dtype and then computed with: a split
    would hand it across rounded, where the whole torch.compile fusion keeps it in float32 (splitting
    anyway changes about 40 of the 148 elements of the output, bf16 or fp16)."""
    table = torch.arange(x.shape[-1], device=x.device, dtype=x.dtype) * 0.1
    return torch.where(x > 0, x, table) * 3


def rounded_table(x):
    """A table of 0.1 steps in the input's dtype, widened before the input's ops read it: the value handed
    across a split is float32, so the region may be split and the table hoisted. (Eager rounds the steps
    to the dtype; torch.compile's fusion, the whole region's or the hoisted piece's alike, keeps them in
    float32: the hoisted table is what the region computed.)"""
    table = (torch.arange(x.shape[-1], device=x.device, dtype=x.dtype) * 0.1).float()
    return (x * 3 + table).to(x.dtype)


def broken_in_three(x):
    y = mask_loop(x)
    torch._dynamo.graph_break()
    z = rounded_table(y)
    torch._dynamo.graph_break()
    return z, table_selected(z)


# On the torch executor (no fusion region to split, so both dtypes hoist alike) and in float32 (nothing rounds
# at the split): with --run-slow.
@pytest.mark.parametrize("executor", [pytest.param("torch", marks=pytest.mark.slow), "torchcompile"])
@pytest.mark.parametrize("dtype", [pytest.param(torch.float32, marks=pytest.mark.slow), torch.bfloat16])
def test_thunderfx_subgraphs_are_hoisted_and_keep_unguarded_thunderfx_bits(executor, dtype):
    from thunder.dynamo import thunderfx

    guard = FusionGuard(strict=True)
    compiled = thunderfx(broken_in_three, transforms=[guard], executors=EXECUTORS[executor])
    plain = thunderfx(broken_in_three, executors=EXECUTORS[executor])
    x = grid(dtype, 2, 6, 6)
    for _ in range(2):
        (out, grads), (out_p, grads_p) = run_with_grads(compiled, [x]), run_with_grads(plain, [x])
        assert_same(out, out_p)
        assert_same(grads, grads_p)
    # eager rounds after every op in bf16 (the fusions do not): close only, as in same_bits_as_unguarded
    expected, expected_grads = run_with_grads(broken_in_three, [x])
    for got, eager in zip([*out, *grads], [*expected, *expected_grads], strict=True):
        torch.testing.assert_close(got, eager, atol=0.05, rtol=0.02)
    subgraphs = {d.subgraph: d.ops for d in hoists(guard)}
    assert "full" in subgraphs["subgraph 0"] and "arange" in subgraphs["subgraph 1"]
    # the third's bf16 table would cross a torch.compile region's split rounded: it stays in the region
    assert ("subgraph 2" in subgraphs) == (dtype == torch.float32 or executor == "torch")


@pytest.mark.parametrize("graphs", ["CUDAGraphTransform", "GuardedCUDAGraphs"])
def test_cuda_graph_regions_take_the_hoisted_call_inside(graphs):
    """CUDAGraphTransform (Thunder's, or the package's) needs CUDA to replay; on CPU check the shape of its trace
    and run the region's own Python function (what it captures)."""
    from thunder.transforms.cudagraph import CUDAGraphTransform

    from thunder_fusion_guard import GuardedCUDAGraphs

    x = torch.randn(2, 6, 6)
    jitted = jit(mask_softmax, FusionGuard(), "torch")
    expected = jitted(x)
    transform = CUDAGraphTransform() if graphs == "CUDAGraphTransform" else GuardedCUDAGraphs()
    trace = transform.transform_trace_post_optimization(thunder.last_traces(jitted)[-1])
    (region,) = [b for b in trace.bound_symbols if b.sym.name.startswith("CUDAGraph")]
    assert HOISTED_NAME in [s.sym.name for s in region.subsymbols]
    fn, _ = transform.cuda_graph_runner.python_callables[region.sym.name]
    (out,) = fn(*[x for p in region.flat_proxy_args])
    assert_same([out], [expected])
    assert cache_of(jitted).computed == 1  # the region reuses the trace's cache


@pytest.mark.cuda
def test_mask_loop_is_hoisted_on_nvfuser():
    x = torch.randn(2, 64, 64, device="cuda", requires_grad=True)
    guard = FusionGuard()
    guarded, plain = thunder.jit(mask_softmax, transforms=[guard]), thunder.jit(mask_softmax)
    for _ in range(3):
        (out_g, grad_g), (out_p, grad_p) = run_with_grads(guarded, [x]), run_with_grads(plain, [x])
        assert_same(out_g, out_p)
        assert_same(grad_g, grad_p)
    (decision,) = hoists(guard)
    assert decision.ops.count("inplace_setitem") == 64
    assert (cache_of(guarded).computed, cache_of(guarded).reused) == (1, 2)
    assert cache_of(guarded).values[0].device.type == "cuda"


@pytest.mark.cuda
def test_guard_and_cuda_graphs_on_the_gpu():
    from thunder.transforms.cudagraph import CUDAGraphTransform

    from thunder_fusion_guard import GuardedCUDAGraphs

    x = torch.randn(2, 64, 64, device="cuda", requires_grad=True)
    guard = FusionGuard()
    guarded = thunder.jit(mask_softmax, transforms=[guard, GuardedCUDAGraphs()])
    plain = thunder.jit(mask_softmax, transforms=[CUDAGraphTransform()])
    for _ in range(3):
        out_g, grad_g = run_with_grads(guarded, [x])
        out_p, grad_p = run_with_grads(plain, [x])
        assert_same(out_g, out_p)
        assert_same(grad_g, grad_p)
    assert hoists(guard)
    assert cache_of(guarded).computed == 1


def test_nothing_is_hoisted_across_a_communication_op(one_rank):
    from thunder.distributed import prims as dist_prims

    from thunder_fusion_guard.options import make_options
    from thunder_fusion_guard.passes import TraceContext, guard_trace
    from thunder_fusion_guard.passes.collectives import communication_changes
    from thunder_fusion_guard.report import Report

    def masks_and_a_collective(x, w):
        y = dist_prims.wait(dist_prims.all_reduce(w, dist_prims.DistributedReduceOps.SUM, one_rank, True))
        return mask_loop(x) + mask_loop(x * y.sum())

    def expected(x, w):
        return mask_loop(x) + mask_loop(x * w.sum())

    x, w = torch.randn(2, 6, 6), torch.randn(3)
    jitted = jit(masks_and_a_collective, FusionGuard(hoist=False), "torch")
    assert_same([jitted(x, w)], [expected(x, w)])
    # Thunder builds both masks between the all_reduce and its wait: one call, the second mask shared
    guard = FusionGuard(strict=True)
    assert_same([jit(masks_and_a_collective, guard, "torch")(x, w)], [expected(x, w)])
    assert [d.details["same_as"] for d in hoists(guard)] == [None, 0]
    # With the wait between the two masks, each side gets a call of its own and nothing is shared
    bsyms = list(th.traces_before_guard(jitted)[0].bound_symbols)
    wait = next(i for i, b in enumerate(bsyms) if b.sym.name == "torch_wait_prim_impl")
    second = [i for i, b in enumerate(bsyms) if b.sym.name == "full"][1]
    bsyms.insert(second, bsyms.pop(wait))
    trace = th.new_trace_like(th.traces_before_guard(jitted)[0], bsyms)
    report = Report()
    new = guard_trace(trace, make_options(strict=True), report, TraceContext("forward"))
    assert communication_changes(trace, new) is None
    done = [d for d in report if d.action == "hoist"]
    assert [d.region for d in done] == [HOISTED_NAME, f"{HOISTED_NAME}_1"]
    assert [d.details["same_as"] for d in done] == [None, None]
    names = [b.sym.name for b in new.bound_symbols]
    assert names.index(HOISTED_NAME) < names.index("torch_wait_prim_impl") < names.index(f"{HOISTED_NAME}_1")
    (out,) = new.python_callable()(x, w)["output"]
    assert_same([out], [expected(x, w)])


def bf16_table_then_input(x):
    table = torch.arange(x.shape[-1], device=x.device, dtype=torch.bfloat16) * 0.5 + 1.5  # rounds to bf16
    return x + table + table


def test_a_region_with_a_skipped_rounding_is_not_split_to_hoist():
    """Hoisting the table out of one torch.compile region would store it in bf16 where the fusion kept it
    in float32: the region stays whole and the bits stay Thunder's."""
    x = torch.randn(4, 37, dtype=torch.bfloat16)
    guard = FusionGuard(strict=True)
    got = jit(bf16_table_then_input, guard)(x)
    assert torch.equal(got, jit(bf16_table_then_input)(x))
    assert not hoists(guard)


# fp16 behaves as bf16 here (a narrower significand): its forms run with --run-slow.
LOW = [torch.bfloat16, pytest.param(torch.float16, marks=pytest.mark.slow)]


def grid(dtype, *shape):
    """Values on a 0.1 grid (they round in bf16 and fp16), the same on every run."""
    values = torch.randn(*shape, generator=torch.Generator().manual_seed(0))
    return (values * 10).round().div(10).to(dtype).requires_grad_()


def same_bits_as_unguarded(fn, args, guard, executor, calls=3):
    """Outputs and gradients of ``calls`` calls: guarded == unguarded Thunder to the bit (eager rounds
    after every op in bf16 and fp16: only close). Returns the guarded function."""
    guarded, plain = jit(fn, guard, executor), jit(fn, None, executor)
    for _ in range(calls):
        (out_g, grad_g), (out_p, grad_p) = run_with_grads(guarded, args), run_with_grads(plain, args)
        assert_same(out_g, out_p)
        assert_same(grad_g, grad_p)
    out_e, grad_e = run_with_grads(fn, args)
    for got, eager in zip([*out_g, *grad_g], [*out_e, *grad_e], strict=True):
        torch.testing.assert_close(got, eager, atol=0.05, rtol=0.02)
    return guarded


@pytest.mark.parametrize("dtype", LOW)
def test_a_low_precision_table_widened_at_the_split_is_hoisted_bit_exact(dtype):
    """Written for the rounding check at the cut (ops.rounding_at_cut, main 7ab9125): the region holds a
    narrowing conversion, but what crosses the split is float32, so the table is taken out of it."""
    x = grid(dtype, 4, 37)
    guard = FusionGuard(strict=True)
    guarded = same_bits_as_unguarded(rounded_table, [x], guard, "torchcompile")
    (decision,) = hoists(guard)
    assert decision.details["split"] == ["TorchCompile0"] and "arange" in decision.ops
    table = cache_of(guarded).values[0]
    assert table.dtype == torch.float32 and (cache_of(guarded).computed, cache_of(guarded).reused) == (1, 2)
    (rest,) = regions(guarded)
    assert "arange" not in rest.ops and "convert_element_type" in rest.ops  # the final rounding stays


@pytest.mark.parametrize("dtype", LOW)
def test_a_low_precision_table_rounded_at_the_split_is_not_hoisted(dtype):
    x = grid(dtype, 4, 37)
    guard = FusionGuard(strict=True)
    same_bits_as_unguarded(table_selected, [x], guard, "torchcompile")
    assert not hoists(guard)
    (kept,) = [d for d in guard.report if d.about_region and d.trace == "forward"]
    assert "arange" in kept.ops  # the table is still made inside the region, on every call


def table_beside_a_reduction(x):
    """A table made in a region whose other work is a reduction (exact_only: the region cannot be rebuilt),
    and read outside any fusion too (setitem runs outside, as in nvFuser's traces)."""
    t = x.shape[-1]
    table = torch.arange(t, device=x.device, dtype=x.dtype) * 0.1
    total = (x + table).sum(-1)
    mask = torch.zeros(t, t, device=x.device, dtype=x.dtype)
    mask[0] = table
    return total, x @ mask


# float32 (nothing rounds: the bf16 form covers it) with --run-slow.
@pytest.mark.parametrize("dtype", [pytest.param(torch.float32, marks=pytest.mark.slow), *LOW])
def test_a_table_read_outside_a_region_that_cannot_be_rebuilt_is_computed_again(dtype):
    """The hoisted call computes the region's input-independent outputs once more (a fusion of the same
    executor); the region is left whole, reduction and all, so its bits cannot change."""
    x = grid(dtype, 4, 5)
    guard = FusionGuard(strict=True)
    guarded = same_bits_as_unguarded(table_beside_a_reduction, [x], guard, "like-nvfuser")
    (decision,) = hoists(guard)
    assert decision.details["duplicated"] == ["TorchCompile0"] and not decision.details["split"]
    assert decision.code == "hoisted" and "TorchCompile0" not in decision.details["regions"]  # left whole, in place
    assert "arange" in decision.ops and any("setitem" in op for op in decision.ops)
    assert (cache_of(guarded).computed, cache_of(guarded).reused) == (1, 2)
    (region,) = [r for r in thunder.last_traces(guarded)[-1].bound_symbols if r.sym.name == "TorchCompile0"]
    ops = [s.sym.name for s in region.subsymbols]
    assert "arange" in ops and "sum" in ops, "the region is left whole"
    names = [b.sym.name for b in thunder.last_traces(guarded)[-1].bound_symbols]
    assert not [n for n in names if "setitem" in n], "the mask is made in the hoisted call only"
