"""Library ops Thunder 0.2.6 registers automatically (``passes/traceable_grads.py``): their gradient
(``tensordot_vjp``, ``narrow_vjp``, ...) reruns the op under ``torch.autograd.functional.vjp``, which Dynamo cannot
trace, so unguarded Thunder with the torch.compile executor fails in backward. Guarded, each such op calls the same
torch function forward (unguarded Thunder's forward bits) and gets a gradient of Thunder's ops: the backward runs
fused, with eager's gradient to rounding, and one decision per op names it, its calls and the user's line."""

from __future__ import annotations

import inspect

import pytest
import thunder
import torch

from thunder_fusion_guard import FusionGuard, FusionGuardError, fusion_executors


def contractions(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    y = torch.tensordot(x, w, dims=((1,), (0,)))  # the line the tensordot decision names
    z = torch.tensordot(y.reshape(2, 3, 6), w.reshape(4, 6), dims=([-1], [1]))  # negative dims
    m = torch.mm(x, w)  # Thunder registers torch.mm as spmm
    head = torch.narrow(y, 1, 2, 3) + x.narrow(-1, -3, 3)  # negative dim and start
    return (head.sin() * 2).sum() + z.sum() + (m * m).sum() + torch.tensordot(x, w[:, :4], dims=1).mean()


def elementwise(x: torch.Tensor) -> torch.Tensor:
    s = torch.sinc(x)
    zeros = x.new_zeros(x.shape)
    return (s * s + zeros).sum()


def jit(fn, guard: FusionGuard | None = None, executors=None):
    """``thunder.jit`` of ``fn`` with torch.compile's executor (or ``executors``); unguarded, Thunder's trace
    check off (the suite's default would refuse the backward before anything runs)."""
    executors = fusion_executors("cpu") if executors is None else executors
    if guard is None:
        return thunder.jit(fn, executors=executors, debug_options=thunder.DebugOptions(check_traces=False))
    return thunder.jit(fn, executors=executors, transforms=[guard])


def inputs(dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, 4, generator=g).to(dtype)
    x[0, 0] = 0  # sinc's gradient at 0
    return x, torch.randn(4, 6, generator=g).to(dtype)


def grads(fn, *args: torch.Tensor) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
    args = [a.detach().requires_grad_(True) for a in args]
    out = fn(*args)
    return out.detach(), torch.autograd.grad(out.float(), args)


def traced(guard: FusionGuard) -> dict[str, int]:
    return {d.facts["name"]: d.facts["count"] for d in guard.report.decisions if d.code == "gradient_traced"}


def rescues(guard: FusionGuard) -> list:
    """The rescues of regions that failed (not the decisions of this pass)."""
    return [d for d in guard.report.filter(action="rescue") if d.code != "gradient_traced"]


def test_unguarded_thunder_fails_in_backward_on_an_automatic_gradient():
    x, w = inputs(torch.float32)
    with pytest.raises(Exception, match=r"sourceless builder|Unsupported"):
        grads(jit(contractions), x, w)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_forward_is_unguarded_thunders_and_the_gradient_eagers(dtype):
    x, w = inputs(dtype)
    guard = FusionGuard()
    got, got_grads = grads(jit(contractions, guard), x, w)
    unguarded = jit(contractions)(x, w)  # its forward runs: only its backward fails
    assert torch.equal(got, unguarded)
    _, want = grads(contractions, x, w)
    tol = {"atol": 1e-5, "rtol": 1e-5} if dtype == torch.float32 else {"atol": 0.1, "rtol": 0.02}
    for g, e in zip(got_grads, want, strict=True):
        torch.testing.assert_close(g, e, **tol)
    assert traced(guard) == {"tensordot": 3, "narrow": 2, "spmm": 1}
    assert not rescues(guard)
    decision = next(d for d in guard.report.decisions if d.facts.get("name") == "tensordot")
    assert decision.action == "rescue" and decision.applied and decision.trace == "forward"
    line = inspect.getsourcelines(contractions)[1] + 1
    assert decision.details["source"].endswith(f"test_traceable_grads.py:{line}")


def test_sinc_and_new_zeros():
    x, _ = inputs(torch.float64)
    guard = FusionGuard()
    got, (got_grad,) = grads(jit(elementwise, guard), x)
    assert torch.equal(got, jit(elementwise)(x))
    _, (want,) = grads(elementwise, x)
    torch.testing.assert_close(got_grad, want, atol=1e-12, rtol=1e-12)
    assert traced(guard) == {"sinc": 1, "new_zeros": 1}
    assert not rescues(guard)  # nothing left for the rescue: the backward ran fused


def test_without_torch_compile_nothing_changes():
    """With Thunder's torch executor alone its automatic gradients run, unguarded too: the guard keeps them."""
    x, w = inputs(torch.float32)
    guard = FusionGuard()
    got, got_grads = grads(jit(contractions, guard, executors=[]), x, w)
    want, want_grads = grads(jit(contractions, executors=[]), x, w)
    assert torch.equal(got, want) and all(torch.equal(g, e) for g, e in zip(got_grads, want_grads, strict=True))
    assert traced(guard) == {}


def test_without_grad_nothing_changes():
    x, w = inputs(torch.float32)
    guard = FusionGuard()
    assert torch.equal(jit(contractions, guard)(x, w), jit(contractions)(x, w))
    assert traced(guard) == {}


def test_report_only_records_without_applying_and_rescue_false_leaves_it():
    x, w = inputs(torch.float32)
    guard = FusionGuard(report_only=True)
    compiled = jit(contractions, guard)
    compiled(x.requires_grad_(True), w)
    assert traced(guard) == {"tensordot": 3, "narrow": 2, "spmm": 1}
    assert not any(d.applied for d in guard.report.decisions if d.code == "gradient_traced")
    names = {b.sym.name for b in thunder.last_traces(compiled)[-1].bound_symbols}
    assert "tensordot_traceable_grad" not in names
    off = FusionGuard(rescue=False)
    jit(contractions, off)(x, w)
    assert traced(off) == {}


def test_strict_raises_before_running():
    x, w = inputs(torch.float32)
    with pytest.raises(FusionGuardError, match="tensordot"):
        jit(contractions, FusionGuard(strict=True))(x.requires_grad_(True), w)


def test_calls_it_cannot_prove_are_left_to_thunder():
    """A tensordot contracting a dim of size 1 against a longer one (torch sums it first) keeps Thunder's automatic
    gradient: the rescue runs that gradient apart, eager's values."""

    def unusual(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        y = torch.tensordot(x, w[:1, :3], dims=([0], [0]))  # 6 against 1
        return y.sum() + torch.tensordot(x, w, dims=([0, 1], [1, 0]))  # every dim contracted: a scalar

    x, w = inputs(torch.float32)
    guard = FusionGuard()
    _, got = grads(jit(unusual, guard), x, w)
    _, want = grads(unusual, x, w)
    for g, e in zip(got, want, strict=True):
        torch.testing.assert_close(g, e)
    assert traced(guard) == {"tensordot": 1}
    assert [d.trace for d in rescues(guard)] == ["backward"]
