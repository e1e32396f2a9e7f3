"""Gradients autograd will not use (``runtime.unused_grads``): at ``autograd.grad(energy, positions)`` the guarded
backward leaves out the parameters' gradients, its forces bit for bit unguarded Thunder's; at ``.backward()`` it runs
the whole program; each set of unused gradients is recorded once; a copy that fails or differs is not run again."""

import pytest
import thunder
import torch

from thunder_fusion_guard import FusionGuard, Runtime, fusion_executors
from thunder_fusion_guard import _thunder as th


class Potential(torch.nn.Module):
    """An energy of positions through two layers; its forces are the positions' gradient."""

    def __init__(self, dtype: torch.dtype) -> None:
        super().__init__()
        self.a = torch.nn.Linear(3, 32, dtype=dtype)
        self.b = torch.nn.Linear(32, 1, dtype=dtype)

    def forward(self, positions: torch.Tensor) -> torch.Tensor:
        return self.b(torch.tanh(self.a(positions))).sum()


def _model(dtype: torch.dtype = torch.bfloat16) -> tuple[Potential, torch.Tensor]:
    torch.manual_seed(0)
    model = Potential(dtype)
    positions = (torch.randn(40, 3) * 3).to(dtype).requires_grad_()
    return model, positions


def _forces(fn, model, positions, also=()):
    """``autograd.grad(energy, [positions, *also])``, parameters' ``.grad`` left as they were."""
    energy = fn(positions)
    return torch.autograd.grad(energy, [positions, *also])


def _all_grads(fn, model, positions):
    model.zero_grad(set_to_none=True)
    positions.grad = None
    fn(positions).backward()
    return [positions.grad, *(p.grad for p in model.parameters())]


def _decisions(guard, code):
    return [d for d in guard.report.decisions if d.code == code]


def _bits_equal(xs, ys):
    return len(xs) == len(ys) and all(
        x.dtype == y.dtype and x.shape == y.shape and torch.equal(x.view(torch.int16), y.view(torch.int16))
        for x, y in zip(xs, ys, strict=True)
    )


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_forces_alone_leave_out_the_parameters_work_with_unguarded_bits(dtype):
    model, positions = _model(dtype)
    guard = FusionGuard()
    guarded, unguarded = thunder.jit(model, transforms=[guard]), thunder.jit(model)
    for _ in range(3):
        assert _bits_equal(_forces(guarded, model, positions), _forces(unguarded, model, positions))
    assert all(p.grad is None for p in model.parameters())
    assert isinstance(thunder.last_backward_traces(guarded)[-1], th.UnusedGradsBackward)
    (done,) = _decisions(guard, "unused_grads_skipped")  # once for this set of unused gradients, not at each call
    assert done.action == "remove" and done.facts["unused"] == 4 and done.facts["bitwise"]
    # the weights' matmuls and the biases' sums are left out; the positions' matmuls are not
    assert done.facts["left_out"].count("matmul") == 2 and done.facts["left_out"].count("sum") == 2
    assert done.facts["left_out_regions"] == [] and done.facts["pruned"] == []
    assert done.details["source"].endswith(f"test_unused_grads.py:{Potential.forward.__code__.co_firstlineno + 1}")


def test_backward_runs_the_whole_program_and_other_sets_get_their_own_copy():
    model, positions = _model()
    guard = FusionGuard()
    guarded, unguarded = thunder.jit(model, transforms=[guard]), thunder.jit(model)
    _forces(guarded, model, positions)
    assert _bits_equal(_all_grads(guarded, model, positions), _all_grads(unguarded, model, positions))
    assert len(_decisions(guard, "unused_grads_skipped")) == 1  # every gradient used: no copy
    with_weight = _forces(guarded, model, positions, also=[model.a.weight])
    assert _bits_equal(with_weight, _forces(unguarded, model, positions, also=[model.a.weight]))
    first, second = _decisions(guard, "unused_grads_skipped")
    assert (first.facts["unused"], second.facts["unused"]) == (4, 3)
    assert second.facts["left_out"].count("matmul") == 1  # the second layer's weight gradient


def test_compute_runs_every_gradient_as_thunder_does():
    model, positions = _model()
    guard = FusionGuard(runtime=Runtime(unused_grads="compute"))
    guarded, unguarded = thunder.jit(model, transforms=[guard]), thunder.jit(model)
    assert _bits_equal(_forces(guarded, model, positions), _forces(unguarded, model, positions))
    assert not isinstance(thunder.last_backward_traces(guarded)[-1], th.UnusedGradsBackward)
    assert not [d for d in guard.report.decisions if (d.code or "").startswith("unused_grads")]


def test_a_region_feeding_every_gradient_is_rebuilt_without_the_unused_outputs_where_the_bits_hold():
    """With torch.compile's executor the whole backward is one region: 'skip' has nothing to leave out; the default
    rebuilds the region without the parameters' outputs and keeps it only where the forces come out bit for bit the
    same; ``exact_only=False`` keeps it whatever, recording how far the forces moved."""
    model, positions = _model(torch.float32)
    options = dict(executors=fusion_executors("cpu"))
    unguarded = thunder.jit(model, **options)

    def bits(fs):
        return [f.view(torch.int32).view(torch.int16) for f in fs]

    skip = FusionGuard(costs={"cost_model": False}, runtime={"unused_grads": "skip"})
    skipped = thunder.jit(model, transforms=[skip], **options)
    assert _bits_equal(bits(_forces(skipped, model, positions)), bits(_forces(unguarded, model, positions)))
    assert not isinstance(thunder.last_backward_traces(skipped)[-1], th.UnusedGradsBackward)
    assert not [d for d in skip.report.decisions if (d.code or "").startswith("unused_grads")]
    guard = FusionGuard(costs={"cost_model": False})
    guarded = thunder.jit(model, transforms=[guard], **options)
    for _ in range(3):
        assert _bits_equal(bits(_forces(guarded, model, positions)), bits(_forces(unguarded, model, positions)))
    (first, *_) = [d for d in guard.report.decisions if d.code in ("unused_grads_skipped", "unused_grads_kept")]
    assert first.facts["pruned"] and first.facts["exact_only"]
    assert first.code == ("unused_grads_skipped" if first.facts["bitwise"] else "unused_grads_kept")
    loose = FusionGuard(costs={"cost_model": False}, exact_only=False)
    pruned = thunder.jit(model, transforms=[loose], **options)
    for _ in range(2):
        (got,), (want,) = _forces(pruned, model, positions), _forces(unguarded, model, positions)
        torch.testing.assert_close(got, want)
    (done,) = _decisions(loose, "unused_grads_skipped")
    assert done.facts["pruned"] and done.facts["max_abs_diff"] is not None
    assert done.facts["bitwise"] == (done.facts["max_abs_diff"] == 0)


def test_a_rebuilt_region_keeps_a_write_through_a_view_of_its_input_with_what_it_reads():
    """A region writing into a view of an input: rebuilt with only another output, the write (and the view and the
    aliases it reads) stays and still lands in the input; the sum only the left-out output needed goes."""
    from thunder_fusion_guard.ops.effects import writes_inputs

    def f(x, y):
        v = x[:2]
        v.mul_(2)
        return y * 3, x.sum()

    jf = thunder.jit(f, executors=fusion_executors("cpu"))
    jf(torch.ones(4, 3), torch.ones(3))
    (region,) = [b for b in thunder.last_traces(jf)[-1].bound_symbols if th.is_fusion(b)]
    (times_three,) = [b.output.name for b in region.subsymbols if b.sym.name == "mul"]
    rebuilt = th.prune_region(region, frozenset({times_three}), writes=writes_inputs)
    names = [b.sym.name for b in rebuilt.subsymbols]
    assert "mul_" in names and "getitem" in names and "sum" not in names
    assert [o.name for o in rebuilt.flat_proxy_outs] == [times_three]
    x, y = torch.ones(4, 3), torch.ones(3)
    (out,) = rebuilt._call_ctx[rebuilt.sym.name](x, y)
    assert torch.equal(out, torch.full((3,), 3.0))
    assert torch.equal(x, torch.tensor([[2.0] * 3] * 2 + [[1.0] * 3] * 2))
    unaware = th.prune_region(region, frozenset({times_three}))  # told of no write, the write goes with the sum
    assert "mul_" not in [b.sym.name for b in unaware.subsymbols]


def test_unused_gradients_outside_a_backward_call_are_none():
    assert th.unused_gradients([0, 1], 2) is None


def _program(unused, build, keep=lambda run: run.bitwise):
    told = []
    full_calls = []

    def full(saved, cotangents):
        full_calls.append(1)
        saved[0].clear()
        return (saved[1] * 2, saved[1] * 3)

    attempts = [(b, keep) for b in (build if isinstance(build, list) else [build])]
    program = th.SkippingBackward(full, lambda: unused, attempts, lambda run, kept: told.append((run, kept)))
    return program, told, full_calls


def test_a_copy_that_fails_is_recorded_and_the_whole_program_runs_from_then_on():
    def build(unused):
        raise RuntimeError("cannot build\nsecond line")

    program, told, full_calls = _program(frozenset({1}), build)
    x = torch.ones(2)
    for _ in range(2):
        saved = [[x], x]
        assert torch.equal(program(saved, [])[0], x * 2)
        assert saved[0] == []  # the saved values were read and cleared, as Thunder's backward asserts
    ((run, kept),) = told
    assert not kept and run.error == "RuntimeError: cannot build"
    assert len(full_calls) == 2


def test_a_copy_that_differs_is_not_run_again_and_says_by_how_much():
    def build(unused):
        def variant(saved, cotangents):
            saved[0].clear()
            return (saved[1] * 2 + 1e-3, None)

        return th.Variant(None, ("matmul",), (), ()), variant

    program, told, full_calls = _program(frozenset({1}), build)
    x = torch.ones(2)
    for _ in range(2):
        assert torch.equal(program([[x], x], [])[0], x * 2)
    ((run, kept),) = told
    assert not kept and not run.bitwise and run.max_abs_diff == pytest.approx(1e-3, rel=1e-3)
    assert len(full_calls) == 2


def test_after_a_copy_that_differs_the_next_call_tries_the_next_way():
    def variant_adding(delta):
        def build(unused):
            def variant(saved, cotangents):
                saved[0].clear()
                return (saved[1] * 2 + delta, None)

            return th.Variant(None, ("matmul",), (), ()), variant

        return build

    def nothing_left_out(unused):  # an attempt that would leave out nothing is passed over at its call, unrecorded
        return th.Variant(None, (), (), ()), None

    program, told, full_calls = _program(frozenset({1}), [variant_adding(1e-3), nothing_left_out, variant_adding(0.0)])
    x = torch.ones(2)
    for _ in range(4):
        assert torch.equal(program([[x], x], [])[0], x * 2)
    assert [kept for _, kept in told] == [False, True]
    # each attempt's call runs the whole program first (the one leaving out nothing too); then the kept copy alone
    assert len(full_calls) == 3


def test_strict_raises_where_a_copy_fails(monkeypatch):
    from thunder_fusion_guard import FusionGuardError

    def failing(*args, **kwargs):
        raise RuntimeError("planted")

    import thunder_fusion_guard._thunder.unused_grads as unused_grads

    monkeypatch.setattr(unused_grads, "backward_without", failing)
    model, positions = _model()
    lenient, strict = FusionGuard(), FusionGuard(strict=True)
    unguarded = thunder.jit(model)
    want = _forces(unguarded, model, positions)
    assert _bits_equal(_forces(thunder.jit(model, transforms=[lenient]), model, positions), want)
    (kept,) = _decisions(lenient, "unused_grads_kept")
    assert kept.facts["error"] == "RuntimeError: planted"
    with pytest.raises(FusionGuardError, match="planted"):
        _forces(thunder.jit(model, transforms=[strict]), model, positions)


def test_a_bad_value_names_the_option():
    with pytest.raises(ValueError, match=r"'runtime.unused_grads' must be one of \['prune', 'skip', 'compute'\]"):
        FusionGuard(runtime={"unused_grads": "never"})


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_on_cuda_nvfuser_regions_are_rebuilt_without_unused_outputs_with_unguarded_bits(dtype):
    """On nvFuser the parameters' gradients share regions with the forces': the default rebuilds those regions
    without the parameters' outputs (an nvFuser program of its own) and keeps the copy only where the forces come out
    bit for bit unguarded Thunder's; either way the forces are unguarded Thunder's."""
    model, positions = _model(dtype)
    model, positions = model.cuda(), positions.detach().cuda().requires_grad_()
    guard = FusionGuard(costs={"cost_model": False})
    guarded, unguarded = thunder.jit(model, transforms=[guard]), thunder.jit(model)
    for _ in range(3):
        assert _bits_equal(_forces(guarded, model, positions), _forces(unguarded, model, positions))
    assert all(p.grad is None for p in model.parameters())
    (first,) = [d for d in guard.report.decisions if d.code in ("unused_grads_skipped", "unused_grads_kept")][:1]
    assert first.facts["unused"] == 4 and not first.facts.get("error")
    assert first.code == ("unused_grads_skipped" if first.facts["bitwise"] else "unused_grads_kept")
    assert (
        any(name.startswith("nvFusion") for name in first.facts["left_out_regions"] + first.facts["pruned"])
        or (first.facts["left_out"])
    )
