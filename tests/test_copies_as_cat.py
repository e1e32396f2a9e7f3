"""Copies into slices of a new zero tensor (``passes/copies_as_cat.py``): unguarded, Thunder 0.2.6 traces them as
copies into views and returns eager's values with a wrong gradient, without an error. Guarded, before Thunder
differentiates the trace, the tensor is computed by ``cat`` of the values copied, zeros between them: the forward's
bits are unguarded Thunder's, the gradient eager's, and the decision names the tensor and the user's line. What the
pass cannot prove the same is left as it was."""

from __future__ import annotations

import inspect

import pytest
import thunder
import torch

from thunder_fusion_guard import FusionGuard, FusionGuardError, fusion_executors


def gapped(x: torch.Tensor) -> torch.Tensor:
    out = x.new_zeros(x.shape[0], 9)  # the line the decision names
    out.narrow(1, 0, 3).copy_(x[:, 2:5])
    out[:, 5:7].copy_(x[:, 0:2] * 3)  # a slice by getitem; zeros left at 3:5 and 7:9
    return (out * out.mean(0)).sum(1) + out[:, 1]


def whole(x: torch.Tensor) -> torch.Tensor:
    out = torch.zeros_like(x)
    out.narrow(1, 0, x.shape[1]).copy_(x.sin())
    return out * 2


def overlapping(x: torch.Tensor) -> torch.Tensor:
    out = x.new_zeros(x.shape[0], 6)
    out.narrow(1, 0, 4).copy_(x[:, :4])
    out.narrow(1, 2, 4).copy_(x[:, 4:8])
    return out.sum(1)


def read_between(x: torch.Tensor) -> torch.Tensor:
    out = x.new_zeros(x.shape[0], 6)
    out.narrow(1, 0, 3).copy_(x[:, :3])
    first = out.sum(1)
    out.narrow(1, 3, 3).copy_(x[:, 3:6])
    return first + out.sum(1)


def twice(x: torch.Tensor) -> torch.Tensor:
    out = x.new_zeros(x.shape[0], 6)
    view = out.narrow(1, 0, 4)
    view.copy_(x[:, :4])
    view.copy_(x[:, 4:8])
    return out.sum(1)


def written_after_a_read(x: torch.Tensor) -> torch.Tensor:
    out = x.new_zeros(x.shape[0], 6)
    out.narrow(1, 0, 3).copy_(x[:, :3])
    flat = out.reshape(-1)  # a view Thunder ties to out
    total = out.sum()
    flat.mul_(2)  # written after out was read
    return total + out.sum()


def source_written_between(x: torch.Tensor) -> torch.Tensor:
    y = x * 1
    out = x.new_zeros(x.shape[0], 18)
    out.narrow(1, 0, 9).copy_(y)
    y.add_(1)  # after its copy: cat at the last copy would read the new values
    out.narrow(1, 9, 9).copy_(x)
    return out.sum(1)


def jit(fn, guard: FusionGuard | None = None, fused: bool = False):
    """``thunder.jit`` of ``fn`` with Thunder's default executors or (``fused``) torch.compile's beside them;
    unguarded, Thunder's trace check off (the suite's default would refuse the backward before anything runs)."""
    executors = fusion_executors("cpu") if fused else None
    if guard is None:
        return thunder.jit(fn, executors=executors, debug_options=thunder.DebugOptions(check_traces=False))
    return thunder.jit(fn, executors=executors, transforms=[guard])


def run(fn, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    x = x.detach().requires_grad_(True)
    out = fn(x)
    (grad,) = torch.autograd.grad(out.float().pow(2).sum(), [x])
    return out.detach(), grad


def joined(guard: FusionGuard) -> list:
    return [d for d in guard.report.decisions if d.code == "copies_joined"]


def inputs(dtype: torch.dtype) -> torch.Tensor:
    return (torch.randn(5, 9, generator=torch.Generator().manual_seed(0)) * 3 + 0.1).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_the_forward_is_unguarded_thunders_and_the_gradient_eagers(dtype: torch.dtype) -> None:
    x = inputs(dtype)
    _, eager_grad = run(gapped, x)
    thunder_out, thunder_grad = run(jit(gapped), x)
    assert not torch.equal(thunder_grad, eager_grad)  # unguarded: a wrong gradient, no error
    guard = FusionGuard()
    out, grad = run(jit(gapped, guard), x)
    assert torch.equal(out, thunder_out) and out.dtype == dtype
    assert torch.equal(grad, eager_grad)  # copies and zeros: no value rounds differently
    (decision,) = joined(guard)
    assert decision.action == "rescue" and decision.applied
    assert decision.facts == {"name": "out", "count": 2}
    line = inspect.getsourcelines(gapped)[1] + 1
    assert decision.details["source"].endswith(f"test_copies_as_cat.py:{line}")


def test_a_copy_into_the_whole_tensor_and_torch_compiles_regions() -> None:
    x = inputs(torch.float32)
    _, eager_grad = run(whole, x)
    guard = FusionGuard()
    _, grad = run(jit(whole, guard, fused=True), x)
    torch.testing.assert_close(grad, eager_grad)
    assert len(joined(guard)) == 1


@pytest.mark.parametrize("fn", [overlapping, read_between, twice, written_after_a_read, source_written_between])
def test_what_it_cannot_prove_the_same_is_left_as_it_was(fn) -> None:
    """Overlapping slices, a read between copies, a view written twice, a write through another view after a read,
    a source written between the copies."""
    x = inputs(torch.float32)
    want = run(jit(fn), x)
    guard = FusionGuard()
    got = run(jit(fn, guard), x)
    assert not joined(guard)
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))


def test_a_source_written_between_the_copies_is_read_before_the_write() -> None:
    x = inputs(torch.float32)
    got = run(jit(source_written_between, FusionGuard()), x)
    assert torch.equal(got[0], source_written_between(x))  # the value copied before the write


def test_without_grad_nothing_is_done() -> None:
    guard = FusionGuard()
    with torch.no_grad():
        out = jit(gapped, guard)(inputs(torch.float32))
    assert torch.equal(out, gapped(inputs(torch.float32))) and not joined(guard)


def test_report_only_and_rescue_off_change_nothing_and_strict_raises() -> None:
    x = inputs(torch.float32)
    want = run(jit(gapped), x)
    for options in ({"report_only": True}, {"rescue": False}):
        guard = FusionGuard(**options)
        got = run(jit(gapped, guard), x)
        assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
        assert [d.applied for d in joined(guard)] == ([False] if "report_only" in options else [])
    with pytest.raises(FusionGuardError, match="copies into slices"):
        run(jit(gapped, FusionGuard(strict=True)), x)


def test_an_e3nn_gate_called_from_a_function() -> None:
    """e3nn's Extract (inside nn.Gate) copies slices of its input into new zero tensors, one per output."""
    e3nn_nn = pytest.importorskip("e3nn.nn")
    torch.manual_seed(0)
    lin = torch.nn.Linear(12, 12)
    gate = e3nn_nn.Gate("4x0e", [torch.tanh], "2x0e", [torch.sigmoid], "2x1o")

    def gated(x: torch.Tensor) -> torch.Tensor:
        return gate(lin(x))

    x = torch.randn(6, 12, generator=torch.Generator().manual_seed(1)) * 3
    eager = torch.autograd.grad(gated(x).pow(2).sum(), [lin.weight])[0]
    thunder_out = jit(gated)(x).detach()
    guard = FusionGuard()
    out = jit(gated, guard)(x)
    got = torch.autograd.grad(out.pow(2).sum(), [lin.weight])[0]
    assert torch.equal(out.detach(), thunder_out)
    torch.testing.assert_close(got, eager, rtol=1e-5, atol=1e-6)
    assert [d.facts["count"] for d in joined(guard)] == [1, 1, 1]


@pytest.mark.guard_failure_expected
def test_a_failing_pass_keeps_the_trace_warns_and_strict_raises(monkeypatch) -> None:
    import thunder_fusion_guard.transform as transform

    def broken(trace):
        raise RuntimeError("planted failure in the pass")

    monkeypatch.setattr(transform, "join_copies", broken)
    x = inputs(torch.float32)
    want = run(jit(gapped), x)  # unguarded Thunder's values, its wrong gradient too
    guard = FusionGuard()
    with pytest.warns(RuntimeWarning, match="copies_as_cat skipped: it failed: RuntimeError: planted failure"):
        got = run(jit(gapped, guard), x)
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
    (failed,) = guard.report.filter(code="pass_failed")
    assert failed.facts == {"step": "copies_as_cat", "moved": False} and not joined(guard)
    with pytest.raises(FusionGuardError, match="copies_as_cat failed"):
        run(jit(gapped, FusionGuard(strict=True)), x)
