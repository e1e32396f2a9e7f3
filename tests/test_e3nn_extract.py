"""e3nn's ``Extract`` (inside ``nn.Gate``) under ``thunder.jit``: unguarded, Thunder 0.2.6 traces its copies into
slices of zero tensors and returns eager's values with a wrong gradient, without an error. Guarded, the trace of
that compilation computes each of those tensors by ``cat`` (``passes/copies_as_cat.py``): the forward's bits are
unguarded Thunder's, the gradient eager's, and the decision is recorded. Another compilation in the same process,
and eager, are as before; ``report_only`` changes nothing, ``strict=True`` raises, and ThunderFX is left to its own
rescue."""

from __future__ import annotations

import pytest
import thunder
import torch

from thunder_fusion_guard import FusionGuard, FusionGuardError, fusion_executors

e3nn_nn = pytest.importorskip("e3nn.nn")


class Gated(torch.nn.Module):
    """A linear layer and e3nn's Gate of 4 scalars gating 2 vectors (12 features in, 10 out)."""

    def __init__(self, dtype: torch.dtype) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lin = torch.nn.Linear(12, 12, dtype=dtype)
        self.gate = e3nn_nn.Gate("4x0e", [torch.tanh], "2x0e", [torch.sigmoid], "2x1o")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.gate(self.lin(x))


def compiled(model: torch.nn.Module, guard: FusionGuard | None, fused: bool) -> torch.nn.Module:
    """``thunder.jit`` of ``model``, with Thunder's default executors or (``fused``) torch.compile's beside them;
    unguarded, Thunder's trace check (the suite's default) off: it refuses the backward before anything runs."""
    executors = fusion_executors("cpu") if fused else None
    if guard is None:
        return thunder.jit(model, executors=executors, debug_options=thunder.DebugOptions(check_traces=False))
    return thunder.jit(model, executors=executors, transforms=[guard])


def run(model: torch.nn.Module, x: torch.Tensor, call: torch.nn.Module | None = None) -> tuple[torch.Tensor, ...]:
    """The output of ``call`` (``model`` itself: eager) and the gradient of its squares' sum for the weight."""
    out = (call or model)(x)
    (grad,) = torch.autograd.grad(out.float().pow(2).sum(), [model.lin.weight])
    return out.detach(), grad


def decisions(guard: FusionGuard) -> list:
    return [d for d in guard.report.decisions if d.code == "copies_joined"]


def off_by(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.double() - want.double()).norm() / want.double().norm()).item()


def inputs(dtype: torch.dtype) -> tuple[Gated, torch.Tensor]:
    return Gated(dtype), (torch.randn(6, 12, generator=torch.Generator().manual_seed(1)) * 3).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_guarded_the_gradient_is_eagers_and_the_forward_unguarded_thunders(dtype: torch.dtype) -> None:
    """Thunder's default executors: unguarded, a wrong gradient without an error."""
    model, x = inputs(dtype)
    _, eager_grad = run(model, x)
    thunder_out, thunder_grad = run(model, x, compiled(model, None, fused=False))
    assert off_by(thunder_grad, eager_grad) > 0.1
    guard = FusionGuard()
    out, grad = run(model, x, compiled(model, guard, fused=False))
    assert torch.equal(out, thunder_out) and out.dtype == dtype
    assert off_by(grad, eager_grad) < (2e-2 if dtype == torch.bfloat16 else 1e-5)
    made = decisions(guard)  # one for each of Extract's three outputs: scalars, gates, gated
    assert [(d.action, d.applied, d.about_region, d.facts["count"]) for d in made] == [("rescue", True, False, 1)] * 3
    assert all("e3nn/nn/_extract.py" in d.details["source"] for d in made)


def test_with_torch_compile_regions_the_backward_runs_where_unguarded_fails() -> None:
    """With torch.compile's executor, unguarded Thunder's backward fails (a value its fusion pass left out)."""
    model, x = inputs(torch.bfloat16)
    _, eager_grad = run(model, x)
    with pytest.raises(Exception, match=r"`t[0-9]+`"):
        run(model, x, compiled(model, None, fused=True))
    _, grad = run(model, x, compiled(model, FusionGuard(), fused=True))
    assert off_by(grad, eager_grad) < 2e-2


def test_only_the_guarded_compilation_traces_it_out_of_place() -> None:
    """After a guarded compilation, an unguarded one of the same model, and eager, are as in a process without it."""
    model, x = inputs(torch.float32)
    before = run(model, x, compiled(model, None, fused=False))
    eager = run(model, x)
    run(model, x, compiled(model, FusionGuard(), fused=False))
    after = run(model, x, compiled(model, None, fused=False))
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))
    assert all(torch.equal(a, b) for a, b in zip(eager, run(model, x), strict=True))
    assert type(model.gate.sc.cut).forward.__module__.startswith("e3nn")
    assert "_tfg_extract_plan" not in vars(model.gate.sc.cut)


def test_report_only_and_rescue_off_change_nothing_and_strict_raises() -> None:
    model, x = inputs(torch.float32)
    want = run(model, x, compiled(model, None, fused=False))
    for options in ({"report_only": True}, {"rescue": False}):
        guard = FusionGuard(**options)
        got = run(model, x, compiled(model, guard, fused=False))
        assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
        assert [d.applied for d in decisions(guard)] == ([False] * 3 if "report_only" in options else [])
    with pytest.raises(FusionGuardError, match="copies into slices"):
        run(model, x, compiled(model, FusionGuard(strict=True), fused=False))


def test_thunderfx_is_left_to_its_own_rescue() -> None:
    from thunder.dynamo import thunderfx

    model, x = inputs(torch.float32)
    _, eager_grad = run(model, x)
    guard = FusionGuard()
    _, grad = run(model, x, thunderfx(model, transforms=[guard]))
    assert not decisions(guard)
    assert off_by(grad, eager_grad) < 1e-5


def test_translated_it_is_out_of_place_already_and_nothing_is_recorded() -> None:
    from thunder_fusion_guard import translate_library_ops, untranslate_library_ops

    model, x = inputs(torch.float32)
    _, eager_grad = run(model, x)
    translate_library_ops()
    try:
        guard = FusionGuard()
        _, grad = run(model, x, compiled(model, guard, fused=False))
    finally:
        untranslate_library_ops()
    assert not decisions(guard) and off_by(grad, eager_grad) < 1e-5
