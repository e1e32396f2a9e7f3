"""Alias updates nothing reads, pruned before Thunder's grad transform (passes/alias_updates.py): e3nn's gates copy a
tensor into ``new_zeros`` and take slices of it; unguarded Thunder 0.2.6's backward then reads a zero gradient it
never defines and fails. Guarded, the program runs with eager's gradients; writes into views that no ``cat`` computes
(whose gradient Thunder gets wrong) are left alone and fail as unguarded."""

from __future__ import annotations

import pytest
import thunder
import torch
import torch.nn.functional as F
from helpers import leaf_pair

from thunder_fusion_guard import FusionGuard, fusion_executors

# A name Thunder's backward reads but never defines: its trace check says "unknown proxy" (the suite checks traces),
# torch.compile that it cannot find the name.
UNDEFINED = "unknown proxy|frame builtins"


def gate(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """e3nn's ``Extract`` in ``nn.Gate``: the features copied into a new tensor, then its slices activated."""
    features = x.new_zeros(x.shape[0], 4)
    features.copy_(x @ w)
    scalars, gates = features[:, 0:2], features[:, 2:4]
    return (F.silu(scalars) * torch.sigmoid(gates)).sum()


def write_into_view(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Copies into overlapping slices of a new tensor: Thunder's gradient of them is wrong (none reaches ``x @ w``),
    and no ``cat`` computes the tensor (passes/copies_as_cat.py leaves it as it was)."""
    out = torch.zeros(x.shape[0], 8, dtype=x.dtype)
    out[:, 0:4].copy_(x @ w)
    out[:, 2:6].copy_(x @ w * 2)
    return out.sin().sum()


def compiled(fn, guard: FusionGuard | None = None):
    return thunder.jit(fn, executors=fusion_executors("cpu"), transforms=[guard] if guard else [])


def pruned(guard: FusionGuard) -> list:
    return [d for d in guard.report.decisions if d.code == "alias_update_pruned"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gate_runs_guarded_with_eagers_gradients(dtype: torch.dtype) -> None:
    x, w = leaf_pair(dtype)
    with pytest.raises(Exception, match=UNDEFINED):
        torch.autograd.grad(compiled(gate)(x, w), (x, w))
    guard = FusionGuard()
    got = torch.autograd.grad(compiled(gate, guard)(x, w), (x, w))
    want = torch.autograd.grad(gate(x, w), (x, w))  # eager's, within the fusion's rounding
    bound = 2e-2 if dtype == torch.bfloat16 else 1e-5  # the fusion's rounding against eager's, by norm
    for g, e in zip(got, want, strict=True):
        assert g.dtype == dtype
        assert ((g.double() - e.double()).norm() / e.double().norm()).item() < bound
    made = pruned(guard)
    assert made
    for decision in made:
        assert decision.action == "remove" and decision.applied and decision.trace == "forward"
        assert decision.details["after_op"] in ("getitem", "silu") and decision.details["unread"]
        assert decision.ops == ["update_aliases"]


def test_a_write_into_a_view_is_left_failing_as_unguarded() -> None:
    x, w = leaf_pair(torch.float32)
    with pytest.raises(Exception, match=UNDEFINED) as unguarded:
        torch.autograd.grad(compiled(write_into_view)(x, w), (x, w))
    guard = FusionGuard()
    with pytest.raises(type(unguarded.value), match=UNDEFINED):
        torch.autograd.grad(compiled(write_into_view, guard)(x, w), (x, w))
    assert not pruned(guard)


def test_nothing_pruned_without_grad_or_with_rescue_off() -> None:
    x, w = (t.detach() for t in leaf_pair(torch.float32))
    guard = FusionGuard()
    assert torch.allclose(compiled(gate, guard)(x, w), gate(x, w))
    assert not pruned(guard)
    x, w = leaf_pair(torch.float32)
    off = FusionGuard(rescue=False)
    with pytest.raises(Exception, match=UNDEFINED):
        torch.autograd.grad(compiled(gate, off)(x, w), (x, w))
    assert not pruned(off)


def test_report_only_records_and_changes_nothing() -> None:
    x, w = leaf_pair(torch.float32)
    guard = FusionGuard(report_only=True)
    with pytest.raises(Exception, match=UNDEFINED):
        torch.autograd.grad(compiled(gate, guard)(x, w), (x, w))
    made = pruned(guard)
    assert made and not any(d.applied for d in made)
