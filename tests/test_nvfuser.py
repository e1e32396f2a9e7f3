"""The guard with nvFuser on a CUDA GPU (skipped elsewhere)."""

import importlib.util

import pytest
import thunder
import torch
from helpers import assert_same, run_with_grads
from test_guard import metadata_chain, mixed, rearrange_heads

from thunder_fusion_guard import FusionGuard
from thunder_fusion_guard._thunder.compat import applied_fixes
from thunder_fusion_guard.ops import region_is_metadata_only
from thunder_fusion_guard.regions import find_regions

pytestmark = pytest.mark.cuda


def jit_nv(fn, guard=None):
    """nvFuser with shape-only regions asked for, so lone views reach it (guards here override the request)."""
    return thunder.jit(fn, transforms=[] if guard is None else [guard], nv_enable_shape_only_fusion=True)


def nv_regions(jitted, backward=False):
    traces = thunder.last_backward_traces(jitted) if backward else thunder.last_traces(jitted)
    return find_regions(traces[-1], executors=["nvfuser"])


def test_compat_fix_makes_nvfuser_run():
    def f(x):
        return torch.tanh(x * 2.0 + 1.0)

    x = torch.randn(64, 64, device="cuda")
    jitted = thunder.jit(f)
    torch.testing.assert_close(jitted(x), f(x))
    assert len(nv_regions(jitted)) == 1
    if importlib.util.find_spec("nvfuser") is None:
        assert applied_fixes(), "nvfuser_direct-only build: the compat fix must have been applied"


@pytest.mark.parametrize("fn,shape", [(rearrange_heads, (2, 3, 4, 5)), (metadata_chain, (3, 4, 6, 5))])
def test_no_metadata_only_nvfusion_region_remains(fn, shape):
    x = torch.randn(shape, device="cuda", requires_grad=True)
    guard = FusionGuard(strict=True, override_compile_options=True)
    guarded, plain = jit_nv(fn, guard), jit_nv(fn)
    out_g, grad_g = run_with_grads(guarded, [x])
    out_p, grad_p = run_with_grads(plain, [x])
    assert_same(out_g, out_p)
    assert_same(grad_g, grad_p)
    assert any(region_is_metadata_only(r.body) for r in nv_regions(plain))
    for backward in (False, True):
        assert not [r for r in nv_regions(guarded, backward) if region_is_metadata_only(r.body)]
    assert all(d.executor == "nvfuser" for d in guard.report.filter(action="reject"))


def test_mixed_program_keeps_compute_regions():
    x = torch.randn(2, 3, 4, 5, device="cuda", requires_grad=True)
    w = torch.randn(5, device="cuda", requires_grad=True)
    guard = FusionGuard(strict=True)
    guarded, plain = jit_nv(mixed, guard), jit_nv(mixed)
    out_g, grad_g = run_with_grads(guarded, [x, w])
    out_p, grad_p = run_with_grads(plain, [x, w])
    assert_same(out_g, out_p)
    assert_same(grad_g, grad_p)
    kept = [r for r in nv_regions(guarded) if not region_is_metadata_only(r.body)]
    assert kept and len(kept) == len([r for r in nv_regions(plain) if not region_is_metadata_only(r.body)])
