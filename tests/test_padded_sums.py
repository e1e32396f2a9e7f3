"""A sum of zero-padded pieces that tile their result (the gradient of slices), spread over fusion regions, computed
as one concatenation: the same bits as unguarded Thunder, in bf16 with values that round and a -0.0; left alone
inside one region, where the pieces overlap or leave a gap, and where the option or exactness says so."""

import pytest
import thunder
import torch
from helpers import fragmenting_executor, nvfuser_shaped_executor

from thunder_fusion_guard import Costs, FusionGuard, fusion_executors


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16) if t.element_size() == 2 else t.view(torch.int32)


def _slices(ranges, through_matmuls=True):
    """Slices of ``w`` at ``ranges``; all but the first go through a matmul, which no region holds (as on nvFuser),
    so that ``w``'s gradient is a sum of pads cut into regions at the matmuls."""

    def f(w, x):
        total = 0
        for k, (lo, hi) in enumerate(ranges):
            piece, n = w[:, lo:hi], hi - lo
            if k == 0:
                total = total + (piece * x[:, :n]).sum()
            elif through_matmuls:
                total = total + ((piece @ x[:n, :n]) * (k + 1.5)).sin().sum()
            else:
                total = total + (piece * (k + 1.5)).sin().sum()
        return total

    return f


def _run(f, guard=None, executors=None):
    torch.manual_seed(0)
    w = torch.randn(8, 12, dtype=torch.bfloat16, requires_grad=True)
    x = torch.randn(8, 12, dtype=torch.bfloat16)
    x[0, 0] = -0.0  # the first piece's gradient holds a -0.0: the sum of pads makes it +0.0
    executors = executors or [nvfuser_shaped_executor()]
    jitted = thunder.jit(f, executors=executors, transforms=[guard] if guard else [])
    out = jitted(w, x)
    out.backward()
    return jitted, out, w.grad


def _folds(guard):
    return [d for d in guard.report if d.code == "padded_sum_concatenated"]


def test_a_sum_of_pads_that_tile_is_one_concatenation_with_thunders_bits():
    f = _slices([(0, 4), (4, 6), (6, 12)])
    guard = FusionGuard(exact_only=False, costs=Costs(cost_model=False))
    jitted, out, grad = _run(f, guard)
    _, expected_out, expected = _run(f)
    assert torch.equal(_bits(out), _bits(expected_out)) and torch.equal(_bits(grad), _bits(expected))
    assert _bits(grad)[0, 0] == 0, "+0.0, as the sum of pads gives"
    (d,) = _folds(guard)
    assert (d.action, d.trace, d.applied) == ("fold", "backward", True)
    assert sorted(d.ops) == ["add", "add", "pad", "pad", "pad"] and d.details["ops_saved_per_call"] == 1
    assert d.region == d.details["regions"][-1] and len(d.details["regions"]) >= 2 and d.details["output"]
    backward = thunder.last_backward_traces(jitted)[-1]
    assert "ltorch.cat(" in str(backward) and "prims.pad(" not in str(backward)
    (cat,) = [op for b in backward.bound_symbols for op in b.subsymbols if op.sym.name == "cat"]
    made_by = {p.name: op for b in backward.bound_symbols for op in b.subsymbols for p in op.flat_proxy_outs}
    pieces = [made_by[p.name] for p in cat.flat_proxy_args]
    assert [(op.sym.name, op.args[1]) for op in pieces] == [("add", 0.0)] * 3, "+0.0 where each piece is made"


def test_a_sum_of_pads_inside_one_region_stays_as_it_is():
    """Its partial sums never leave the fuser: there is nothing to save, and a rebuilt region to risk."""
    f = _slices([(0, 4), (4, 6), (6, 12)], through_matmuls=False)
    guard = FusionGuard(exact_only=False, costs=Costs(cost_model=False))
    jitted, _, grad = _run(f, guard, fusion_executors("cpu"))
    assert not _folds(guard)
    assert "prims.pad(" in str(thunder.last_backward_traces(jitted)[-1])
    assert torch.equal(_bits(grad), _bits(_run(f, executors=fusion_executors("cpu"))[2]))


def test_pieces_that_overlap_or_leave_a_gap_stay_a_sum_of_pads():
    for ranges in ([(0, 6), (4, 12)], [(0, 4), (6, 12)]):
        guard = FusionGuard(exact_only=False, costs=Costs(cost_model=False))
        jitted, _, grad = _run(_slices(ranges), guard)
        assert not _folds(guard)
        assert "prims.pad(" in str(thunder.last_backward_traces(jitted)[-1])
        assert torch.equal(_bits(grad), _bits(_run(_slices(ranges))[2]))


@pytest.mark.parametrize(
    "options",
    [
        {"exact_only": False, "rewrites": {"concat_padded_sums": False}},
        {},  # exact_only: a bf16 region's rebuild may round otherwise, so it is not rebuilt
    ],
)
def test_the_option_and_exactness_leave_the_sum_as_it_is(options):
    guard = FusionGuard(**options, costs=Costs(cost_model=False))
    jitted, _, _ = _run(_slices([(0, 4), (4, 12)]), guard)
    assert not _folds(guard)
    assert "prims.pad(" in str(thunder.last_backward_traces(jitted)[-1])


def test_report_only_records_the_concatenation_without_making_it():
    guard = FusionGuard(exact_only=False, report_only=True, costs=Costs(cost_model=False))
    jitted, _, _ = _run(_slices([(0, 4), (4, 12)]), guard, [fragmenting_executor()])
    (d,) = _folds(guard)
    assert d.applied is False
    assert "prims.pad(" in str(thunder.last_backward_traces(jitted)[-1])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_cat_plus_zero_has_the_bits_of_a_sum_of_zero_pads(dtype):
    """The identity the rewrite rests on, on values that round, signed zeros, infinities and NaN."""
    torch.manual_seed(0)
    special = torch.tensor([-0.0, 0.0, float("inf"), -float("inf"), float("nan"), 1e-30, -3.5])
    pieces = [torch.randn(5, n).to(dtype) for n in (3, 7, 2)]
    pieces[1][:, :7] = special.to(dtype)
    total = torch.zeros(5, 12, dtype=dtype)
    start = 0
    for p in pieces:
        total = total + torch.nn.functional.pad(p, (start, 12 - start - p.shape[1]))
        start += p.shape[1]
    joined = torch.cat(pieces, 1) + 0.0
    assert torch.equal(_bits(joined), _bits(total))
    assert not torch.equal(_bits(torch.cat(pieces, 1)), _bits(total)), "without + 0.0 a -0.0 would stay -0.0"


def _widened_sum(g1, g2, g3):
    """A sum of pads as nvFuser's regions hold it in bf16: prims, each pad widened to fp32 before the adds."""
    from thunder.core import dtypes, prims

    f32 = dtypes.float32
    c1 = prims.convert_element_type(prims.pad(g1, 0.0, ((0, 0, 0), (0, 8, 0))), f32)
    c2 = prims.convert_element_type(prims.pad(g2, 0.0, ((0, 0, 0), (4, 6, 0))), f32)
    c3 = prims.convert_element_type(prims.pad(g3, 0.0, ((0, 0, 0), (6, 0, 0))), f32)
    return prims.convert_element_type(prims.add(prims.add(c1, c2), c3), dtypes.bfloat16)


def _rounded_partial_sum(g1, g2, g3, to=None):
    """As nvFuser's regions hand a bf16 partial sum on: rounded (to bf16, or ``to``) where one region ends, widened
    in the next."""
    from thunder.core import dtypes, prims

    f32, bf16 = dtypes.float32, dtypes.bfloat16
    c1 = prims.convert_element_type(prims.pad(g1, 0.0, ((0, 0, 0), (0, 8, 0))), f32)
    c2 = prims.convert_element_type(prims.pad(g2, 0.0, ((0, 0, 0), (4, 6, 0))), f32)
    handed_on = prims.convert_element_type(prims.convert_element_type(prims.add(c1, c2), to or bf16), f32)
    c3 = prims.convert_element_type(prims.pad(g3, 0.0, ((0, 0, 0), (6, 0, 0))), f32)
    return prims.convert_element_type(prims.add(handed_on, c3), bf16)


def _rounded_to_fp16(g1, g2, g3):
    from thunder.core import dtypes

    return _rounded_partial_sum(g1, g2, g3, to=dtypes.float16)


@pytest.mark.parametrize(
    "fn, converts",
    [(_widened_sum, 3), (_rounded_partial_sum, 5), (_rounded_to_fp16, None)],
    ids=["widened", "rounded-to-the-pieces-dtype", "rounded-to-another-dtype"],
)
def test_sums_as_nvfusers_regions_hold_them_are_concatenated_with_the_same_bits(fn, converts):
    """Pads widened to fp32 before the adds, and a partial sum rounded to the pieces' dtype between regions (exact:
    each element is one piece's value or zero), are part of the sum; one rounded to another dtype is not. Read in
    one region (``min_regions=1``): how the sum is found does not depend on where it is cut."""
    from thunder_fusion_guard.passes.padded_sums import concatenate_padded_sums

    torch.manual_seed(0)
    pieces = [torch.randn(8, n, dtype=torch.bfloat16) for n in (4, 2, 6)]
    pieces[0][0, 0], pieces[1][0, 0], pieces[2][0, 0] = -0.0, float("nan"), float("inf")
    jitted = thunder.jit(fn, executors=fusion_executors("cpu"))
    expected = jitted(*pieces)
    trace = thunder.last_traces(jitted)[-1]
    assert concatenate_padded_sums(trace, lambda fusion: True)[1] == [], "one region: left as it is"
    new, sums = concatenate_padded_sums(trace, lambda fusion: True, min_regions=1)
    if converts is None:
        assert sums == [] and "prims.pad(" in str(new)
        return
    (summed,) = sums
    assert summed.pieces == 3 and sorted(summed.ops).count("convert_element_type") == converts
    assert "ltorch.cat(" in str(new) and "prims.pad(" not in str(new)
    got = new.python_callable()(*pieces)
    got, expected = (t[0] if isinstance(t, (tuple, list)) else t for t in (got, expected))
    assert torch.equal(_bits(got), _bits(expected))


def _cat_of_slices(w, x):
    """A ``cat`` of side-by-side slices of ``w`` (e3nn's irreps do this): ``w``'s gradient is the sum of zero pads
    of side-by-side slices of the ``cat``'s gradient (run one region an op, so that the sum spans regions)."""
    joined = torch.cat([w[:, 0:4], w[:, 4:9], (w[:, 9:12] * 3.0).sin()], 1)
    return (joined * x).sum()


def test_side_by_side_slices_of_one_tensor_are_one_slice_not_a_concatenation():
    guard = FusionGuard(exact_only=False, costs=Costs(cost_model=False))
    jitted, out, grad = _run(_cat_of_slices, guard, [fragmenting_executor()])
    _, expected_out, expected = _run(_cat_of_slices, executors=[fragmenting_executor()])
    assert torch.equal(_bits(out), _bits(expected_out)) and torch.equal(_bits(grad), _bits(expected))
    (d,) = _folds(guard)
    assert sorted(d.ops).count("pad") == 3
    backward = str(thunder.last_backward_traces(jitted)[-1])
    assert "prims.pad(" not in backward
    # the first two pieces are one slice of the cat's gradient; the third is its own piece
    (cat,) = [line for line in backward.splitlines() if "ltorch.cat(" in line]
    assert cat.split("[", 1)[1].split("]", 1)[0].count(",") == 1, cat


def test_slices_that_cover_their_source_are_the_source_plus_zero():
    def f(w, x):
        return (torch.cat([w[:, 0:4], w[:, 4:12]], 1) * x).sum()

    guard = FusionGuard(exact_only=False, costs=Costs(cost_model=False))
    jitted, out, grad = _run(f, guard, [fragmenting_executor()])  # one region an op: the sum spans regions
    _, expected_out, expected = _run(f, executors=[fragmenting_executor()])
    assert torch.equal(_bits(out), _bits(expected_out)) and torch.equal(_bits(grad), _bits(expected))
    assert _bits(grad)[0, 0] == 0, "+0.0, as the sum of pads gives"
    (fold,) = _folds(guard)
    assert fold.applied and sorted(fold.ops) == ["add", "pad", "pad"]
    backward = str(thunder.last_backward_traces(jitted)[-1])
    assert "prims.pad(" not in backward and "ltorch.cat(" not in backward
