"""Splitting a region to hoist its input-independent part keeps Thunder's bits: only values handed across
the split are checked for a rounding the whole fusion skipped (``ops.rounding_at_cut``), not the whole region."""

import pytest
import thunder
import torch
from helpers import assert_same, nvfuser_shaped_executor, regions, run_with_grads

from thunder_fusion_guard import Costs, FusionGuard
from thunder_fusion_guard.ops import rounding_hazards
from thunder_fusion_guard.passes.hoist_runtime import HOISTED_NAME


def rope_attention(q, k, v, cos, sin):
    """A Mistral-like layer: rope on q and k (bf16 neg, cat, mul, add: narrowing casts read again), a causal
    mask built from constants, matmul attention."""
    t, d = q.shape[-2], q.shape[-1]

    def rope(x):
        return x * cos + torch.cat((-x[..., d // 2 :], x[..., : d // 2]), -1) * sin

    mask = torch.full((t, t), float("-inf"), dtype=q.dtype).triu(1)
    scores = rope(q) @ rope(k).transpose(-1, -2) + mask
    return scores.softmax(-1) @ v


def inputs(dtype):
    g = torch.Generator().manual_seed(0)
    qkv = [(torch.randn(1, 2, 16, 8, generator=g) * 10).round().div(10).to(dtype).requires_grad_() for _ in range(3)]
    return [*qkv, *(torch.randn(16, 8, generator=g).to(dtype) for _ in range(2))]


def jit(fn, guard=None):
    return thunder.jit(fn, executors=[nvfuser_shaped_executor()], transforms=[guard] if guard else [])


@pytest.mark.parametrize("dtype", [torch.bfloat16, pytest.param(torch.float16, marks=pytest.mark.slow)])
def test_mask_is_taken_out_of_a_region_with_narrowing_casts(dtype):
    args = inputs(dtype)
    plain = jit(rope_attention)
    expected = run_with_grads(plain, args)
    (layer,) = [r for r in regions(plain) if "full" in r.ops]
    assert rounding_hazards(layer.body), "the layout under test: the region rounds where a fusion may not"

    guard = FusionGuard(strict=True, costs=Costs(calibration="shipped"))
    guarded = jit(rope_attention, guard)
    got = run_with_grads(guarded, args)
    (hoisted,) = [d for d in guard.report.decisions if d.region == HOISTED_NAME and d.action == "hoist"]
    assert layer.name in hoisted.details["split"]
    assert "full" in hoisted.ops and "where" in hoisted.ops  # triu decomposes into where(arange comparisons)
    after = {r.name: r for r in regions(guarded)}
    assert layer.name in after and "full" not in after[layer.name].ops  # the rope stays fused, the mask is gone
    assert_same(got[0], expected[0])
    assert_same(got[1], expected[1])
    (eager,) = run_with_grads(rope_attention, args)[0]
    torch.testing.assert_close(got[0][0], eager, atol=0.05, rtol=0.05)  # eager rounds after every op
