"""Op-level rewrites: setitem copies folded in place, identity ops removed. Checked against traces,
outputs and gradients of unguarded thunder and eager."""

import pytest
import thunder
import torch
from helpers import (
    assert_same,
    check_three_ways,
    fragmenting_executor,
    jit_cpu,
    region_actions,
    regions,
    run_with_grads,
    shares_storage,
)
from thunder.core import prims
from thunder.executors.torch_compile import TorchCompileExecutor, torch_compile_ex

from thunder_fusion_guard import Costs, FusionGuard, Rewrites
from thunder_fusion_guard.ops import identity_reason, is_metadata

# Cost constants by hand for the test executor below, so that its small copy_ regions are rejected.
SMALL_CALLS_LOSE = dict(
    fusion_call_us=20.0, fusion_gbps=10.0, eager_op_us=2.0, eager_meta_us=1.0, eager_gbps=10.0, overlapped=False
)


def nvfuser_like_executor() -> TorchCompileExecutor:
    """torch.compile that, like nvFuser, cannot take setitem: each copy_ back lands alone in a region."""
    ex = TorchCompileExecutor("tc_no_setitem")
    ex._implmap = {k: v for k, v in torch_compile_ex._implmap.items() if k != prims.PrimIDs.COPY_WITH_SETITEM}
    return ex


def sliding_window_mask(x):
    """litgpt's Mistral mask loop, in small."""
    t = x.shape[-1]
    mask = torch.full((t, t), float("-inf"), dtype=x.dtype, device=x.device)
    for i in range(t):
        mask[i, max(0, i - 2) : i + 1] = 0.0
    return torch.softmax(x + mask.view(1, 1, t, t), dim=-1)


def trace_ops(jitted, backward=False):
    """Op names of the final trace, with those the guard hoisted (run once per compilation) in place."""
    traces = thunder.last_backward_traces(jitted) if backward else thunder.last_traces(jitted)
    hoisted = "hoisted_constants"
    return [s.sym.name for b in traces[-1].bound_symbols for s in (b.subsymbols if b.sym.name == hoisted else [b])]


def test_setitem_loop_folds_on_the_torch_executor():
    x = torch.randn(1, 2, 6, 6, requires_grad=True)
    guard = FusionGuard(strict=True)
    guarded = thunder.jit(sliding_window_mask, executors=[], transforms=[guard])
    plain = thunder.jit(sliding_window_mask, executors=[])
    out_g, grad_g = run_with_grads(guarded, [x])
    out_p, grad_p = run_with_grads(plain, [x])
    assert_same(out_g, out_p)
    assert_same(grad_g, grad_p)
    assert_same(out_g, run_with_grads(sliding_window_mask, [x])[0])
    ops = trace_ops(guarded)
    assert ops.count("inplace_setitem") == 6
    assert "copy_with_setitem_impl" not in ops and "copy_" not in ops
    folds = guard.report.filter(action="fold")
    assert len(folds) == 6 and all(d.ops == ["copy_with_setitem_impl", "copy_"] for d in folds)


def test_lone_copy_regions_are_folded_like_mistral_on_nvfuser():
    ex = nvfuser_like_executor()
    x = torch.randn(1, 2, 6, 6, requires_grad=True)
    guard = FusionGuard(strict=True, costs=Costs(calibration=SMALL_CALLS_LOSE))
    plain = thunder.jit(sliding_window_mask, executors=[ex])
    guarded = thunder.jit(sliding_window_mask, executors=[ex], transforms=[guard])
    out_g, grad_g = run_with_grads(guarded, [x])
    out_p, grad_p = run_with_grads(plain, [x])
    assert_same(out_g, out_p)
    assert_same(grad_g, grad_p)
    lone_copies = [r for r in regions(plain) if r.ops == ["copy_", "update_aliases"]]
    assert len(lone_copies) == 5
    assert not [r for r in regions(guarded) if r.ops == ["copy_", "update_aliases"]]
    assert trace_ops(guarded).count("inplace_setitem") == 5
    by_region = {d.region: d for d in guard.report if d.trace == "forward"}
    assert all(by_region[r.name].action in ("reject", "fold") for r in lone_copies)


def test_setitem_with_a_tensor_value_is_not_folded():
    def tensor_value(x, v):
        y = x.clone()
        y[0, :2] = v
        return y

    guard = FusionGuard(strict=True)
    j = thunder.jit(tensor_value, executors=[], transforms=[guard])
    args = [torch.randn(3, 4), torch.randn(2)]
    assert_same([j(*args)], [tensor_value(*args)])
    assert "inplace_setitem" not in trace_ops(j)
    assert not guard.report.filter(action="fold")


def test_folded_setitem_then_read_again():
    def set_then_use(x):
        y = x.clone()
        y[1] = 0.0
        return y * 2, y

    guard = FusionGuard(strict=True)
    j = thunder.jit(set_then_use, executors=[], transforms=[guard])
    x = torch.randn(3, 4)
    assert_same(list(j(x)), list(set_then_use(x)))
    assert len(guard.report.filter(action="fold")) == 1


def test_folded_setitem_into_an_input_mutates_it_as_eager_does():
    def fill_row(x):
        x[1, 1:3] = 5.0
        return x.sum()

    x_eager, x_guarded = torch.randn(3, 4), torch.randn(3, 4)
    x_guarded.copy_(x_eager)
    guard = FusionGuard(strict=True)
    j = thunder.jit(fill_row, executors=[], transforms=[guard])
    assert torch.equal(j(x_guarded), fill_row(x_eager))
    assert torch.equal(x_guarded, x_eager)


def identities(x, y):
    a = x.reshape(x.shape).permute(0, 1)
    b = a.to(torch.float32).view(4, 4).transpose(0, 0)
    return b.contiguous() * y, x.view(x.shape), (b + 1).view(4, 4)


def view_then_compute(x, w):
    a = x.reshape(4, 8).t()
    return (a * w).exp() + 1


def test_identity_ops_disappear_inside_and_outside_regions():
    x, y = torch.randn(4, 4, requires_grad=True), torch.randn(4, 4, requires_grad=True)
    guard = FusionGuard(strict=True)
    guarded, plain = check_three_ways(identities, [x, y], guard, exact_eager=True)
    assert len(guard.report.filter(action="remove", trace="forward")) == 5
    (region,) = regions(guarded)
    (plain_region,) = regions(plain)
    remaining = [b for b in region.body if identity_reason(b)]
    assert len(remaining) == 2, "the identities whose results are returned stay"
    assert len([b for b in plain_region.body if identity_reason(b)]) == 7
    torch_only = thunder.jit(identities, executors=[], transforms=[FusionGuard(strict=True)])
    assert_same(torch_only(x, y), identities(x, y))
    assert "permute" not in trace_ops(torch_only) and "reshape" not in trace_ops(torch_only)


def test_identity_removal_keeps_aliasing():
    def write_through_identity(x):
        v = x.view(x.shape)
        v.add_(1.0)
        return x * 2

    x_eager = torch.randn(3, 3)
    x_guarded = x_eager.clone()
    guard = FusionGuard(strict=True)
    out = jit_cpu(write_through_identity, guard)(x_guarded)
    assert torch.equal(out, write_through_identity(x_eager))
    assert torch.equal(x_guarded, x_eager)
    assert guard.report.filter(action="remove")


def test_returned_identity_is_still_a_view_of_its_input():
    x = torch.randn(2, 3)
    out = jit_cpu(lambda t: t.view(t.shape), FusionGuard(strict=True))(x)
    assert out is not x and shares_storage(out, x)


SWITCHES = {
    "fold_setitem": (sliding_window_mask, lambda: [torch.randn(1, 1, 5, 5)], [], "fold"),
    "remove_identities": (identities, lambda: [torch.randn(4, 4), torch.randn(4, 4)], [], "remove"),
    "rehome": (view_then_compute, lambda: [torch.randn(32), torch.randn(8, 4)], [fragmenting_executor()], "rehome"),
}


@pytest.mark.parametrize("spelling", ["record", "dict"])
@pytest.mark.parametrize("option", sorted(SWITCHES))
def test_rewrites_can_be_switched_off(option, spelling):
    fn, make, executors, action = SWITCHES[option]
    rewrites = Rewrites(**{option: False}) if spelling == "record" else {option: False}
    on, off = FusionGuard(strict=True), FusionGuard(strict=True, rewrites=rewrites)
    for guard in (on, off):
        thunder.jit(fn, executors=executors, transforms=[guard])(*make())
    assert on.report.filter(action=action)
    assert not off.report.filter(action=action)


@pytest.mark.parametrize("option", [*SWITCHES, "merge_regions", "small_matmuls"])
def test_rewrite_switches_take_only_booleans(option):
    with pytest.raises(ValueError, match=f"'rewrites.{option}' must be True or False"):
        FusionGuard(rewrites={option: "yes"})


def test_report_only_records_rewrites_and_changes_nothing():
    guard = FusionGuard(report_only=True)
    j = thunder.jit(sliding_window_mask, executors=[], transforms=[guard])
    j(torch.randn(1, 1, 5, 5))
    assert "inplace_setitem" not in trace_ops(j)
    folds = guard.report.filter(action="fold")
    assert len(folds) == 5 and not any(d.applied for d in folds)


def test_metadata_op_feeding_a_compute_region_is_absorbed_into_it():
    ex = fragmenting_executor()
    x, w = torch.randn(32), torch.randn(8, 4)
    guard = FusionGuard(strict=True)
    guarded = thunder.jit(view_then_compute, executors=[ex], transforms=[guard])
    plain = thunder.jit(view_then_compute, executors=[ex])
    assert_same([guarded(x, w)], [plain(x, w)])
    view, perm, mul = (r.ops for r in regions(plain)[:3])
    assert len(view) == len(perm) == 1 and mul == ["mul"]
    first = regions(guarded)[0]
    assert len(first.ops) == 3 and first.ops[-1] == "mul", "the views moved into the region that reads them"
    outside = [b for b in thunder.last_traces(guarded)[-1].bound_symbols if not b.sym.is_fusion]
    assert not [b for b in outside if is_metadata(b)]
    moved = guard.report.filter(action="rehome", trace="forward")
    assert len(moved) == 2 and all(d.details["into"] == first.name for d in moved)


def test_a_region_that_cannot_be_rebuilt_keeps_its_views_outside_and_strict_raises(failing_rebuild):
    from thunder_fusion_guard import FusionGuardError

    ex = fragmenting_executor()
    x, w = torch.randn(32), torch.randn(8, 4)
    guard = FusionGuard()
    guarded = thunder.jit(view_then_compute, executors=[ex], transforms=[guard])
    assert_same([guarded(x, w)], [thunder.jit(view_then_compute, executors=[ex])(x, w)])
    failed = [d for d in guard.report if d.code == "rehome_failed"]
    assert failed and all(d.action == "keep" for d in failed)
    assert {d.error for d in failed} == {"RuntimeError: planted rebuild failure"}
    assert not guard.report.filter(action="rehome")
    strict = thunder.jit(view_then_compute, executors=[ex], transforms=[FusionGuard(strict=True)])
    with pytest.raises(
        FusionGuardError, match=r"could not move .* \((forward|backward)\): RuntimeError: planted rebuild failure"
    ):
        strict(x, w)


def test_views_saved_for_backward_stay_outside_and_gradients_match():
    ex = fragmenting_executor()
    x, w = torch.randn(32, requires_grad=True), torch.randn(8, 4, requires_grad=True)
    guard = FusionGuard(strict=True)
    guarded = thunder.jit(view_then_compute, executors=[ex], transforms=[guard])
    plain = thunder.jit(view_then_compute, executors=[ex])
    out_g, grad_g = run_with_grads(guarded, [x, w])
    out_p, grad_p = run_with_grads(plain, [x, w])
    assert_same(out_g, out_p)
    assert_same(grad_g, grad_p)


def test_merge_regions_is_opt_in_and_merges_adjacent_regions():
    ex = fragmenting_executor()
    x, w = torch.randn(32), torch.randn(8, 4)
    default = thunder.jit(view_then_compute, executors=[ex], transforms=[FusionGuard(strict=True)])
    default(x, w)
    assert len(regions(default)) == 3
    guard = FusionGuard(strict=True, rewrites=Rewrites(merge_regions=True))
    merged = thunder.jit(view_then_compute, executors=[ex], transforms=[guard])
    torch.testing.assert_close(merged(x, w), view_then_compute(x, w))
    (region,) = regions(merged)
    assert region.ops == ["reshape", "permute", "mul", "exp", "add"]
    assert len([d for d in guard.report if d.details.get("into") and not d.ops]) == 2


def test_regions_that_cannot_be_merged_stay_apart_with_the_reason_and_strict_raises(failing_rebuild):
    from thunder_fusion_guard import FusionGuardError

    ex = fragmenting_executor()
    x, w = torch.randn(32), torch.randn(8, 4)
    guard = FusionGuard(rewrites=Rewrites(merge_regions=True))
    apart = thunder.jit(view_then_compute, executors=[ex], transforms=[guard])
    assert_same([apart(x, w)], [thunder.jit(view_then_compute, executors=[ex])(x, w)])
    assert len(regions(apart)) == 3
    failed = [d for d in guard.report if d.code == "merge_failed"]
    assert len(failed) == 2 and all(d.action == "keep" for d in failed)
    assert {d.error for d in failed} == {"RuntimeError: planted rebuild failure"}
    assert not [d for d in guard.report if d.code == "merged"]
    strict = FusionGuard(strict=True, rewrites=Rewrites(merge_regions=True, rehome=False))
    with pytest.raises(
        FusionGuardError, match=r"could not merge .* \((forward|backward)\): RuntimeError: planted rebuild failure"
    ):
        thunder.jit(view_then_compute, executors=[ex], transforms=[strict])(x, w)


def test_rewritten_backward_keeps_thunders_layout():
    """CUDAGraphTransform reads the backward trace by position; a rewrite must not double its
    collection clears (it did: identity removal in the backward broke guard + CUDA graphs)."""
    x, y = torch.randn(4, 4, requires_grad=True), torch.randn(4, 4, requires_grad=True)
    guard = FusionGuard(strict=True)
    guarded, plain = check_three_ways(identities, [x, y], guard, exact_eager=True)
    assert guard.report.filter(action="remove", trace="backward")

    def head(jitted):
        return [b.sym.name for b in thunder.last_backward_traces(jitted)[-1].bound_symbols[:10]]

    assert head(guarded) == head(plain)


def identity_beside_a_reduction(x):
    return x.view(x.shape).sum(0) * 2.0


def test_regions_with_reductions_are_not_rebuilt_unless_exact_only_is_off():
    x = torch.randn(64, 32)
    # no cost decisions: the region is kept on both guards (not rejected, nor timed), so the only
    # question is whether identity removal may rebuild it
    strict = FusionGuard(strict=True, costs=Costs(cost_model=False))
    loose = FusionGuard(strict=True, exact_only=False, costs=Costs(cost_model=False))
    assert_same([jit_cpu(identity_beside_a_reduction, strict)(x)], [jit_cpu(identity_beside_a_reduction)(x)])
    torch.testing.assert_close(jit_cpu(identity_beside_a_reduction, loose)(x), identity_beside_a_reduction(x))
    assert [a for a, _ in region_actions(strict).values()] == ["keep"]
    assert [a for a, _ in region_actions(loose).values()] == ["keep"]
    assert not strict.report.filter(action="remove"), "a sum's rounding follows the fusion's schedule"
    assert loose.report.filter(action="remove")
