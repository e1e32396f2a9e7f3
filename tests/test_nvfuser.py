"""The guard with nvFuser on a CUDA GPU (skipped elsewhere)."""

import importlib.util

import pytest
import thunder
import torch
from helpers import assert_same, run_with_grads
from test_guard import metadata_chain, mixed, rearrange_heads

from thunder_fusion_guard import Costs, FusionGuard, Rewrites, Runtime
from thunder_fusion_guard._thunder import DirectNvFuserCall, executor_name, is_fusion, region_callable
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
        assert applied_fixes(), "nvfuser_direct-only build: the suite's opt-in (conftest) must have applied"


_WITHOUT_OPT_IN = """
import json, thunder, torch
from thunder_fusion_guard import FusionGuard, shims
f = lambda x: torch.tanh(torch.sigmoid(torch.sin(x * 2.0 + 1.0) * x - 3.0).exp() + x.cos())  # one region kept
x = torch.randn(256, 256, device="cuda")
guarded = thunder.jit(f, transforms=[FusionGuard(costs={"cost_model": False})])  # its region kept
ok = bool(torch.allclose(guarded(x), f(x)))
regions = [b.sym.name for b in thunder.last_traces(guarded)[-1].bound_symbols if b.sym.name.startswith("nvFusion")]
try:
    thunder.jit(f)(x)
    plain = "ran"
except Exception as e:
    plain = type(e).__name__
print(json.dumps({"guarded": ok, "regions": regions, "plain": plain, "applied": shims.applied_shims()}))
"""


def test_guarded_regions_run_on_nvfuser_direct_without_the_opt_in(tmp_path):
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    if importlib.util.find_spec("nvfuser") is not None:
        pytest.skip("the legacy nvfuser module is installed: nothing to fix")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            p for p in (str(Path(__file__).resolve().parents[1]), os.environ.get("PYTHONPATH")) if p
        ),
    }
    env.pop("TFG_SHIMS_OFF", None)
    done = subprocess.run([sys.executable, "-c", _WITHOUT_OPT_IN], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["guarded"] and result["regions"], result  # a guarded nvFuser region ran
    assert result["plain"] == "ModuleNotFoundError", result  # unguarded Thunder as shipped
    assert result["applied"] == [], result  # nothing left changed


@pytest.mark.parametrize("fn,shape", [(rearrange_heads, (2, 3, 4, 5)), (metadata_chain, (3, 4, 6, 5))])
def test_no_metadata_only_nvfusion_region_remains(fn, shape):
    x = torch.randn(shape, device="cuda", requires_grad=True)
    guard = FusionGuard(strict=True, rewrites=Rewrites(override_compile_options=True))
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


def norm_rotate_gate(x, w, cos, sin):
    """bf16 work that rounds: an RMS norm, a rotary-style mix in float32, a SiLU gate."""
    xf = x.float()
    y = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-5)).to(x.dtype) * w
    a, b = y.chunk(2, dim=-1)
    z = (y.float() * cos + torch.cat((-b, a), dim=-1).float() * sin).to(x.dtype)
    return torch.nn.functional.silu(z) * y


def test_direct_calls_keep_thunders_bits():
    torch.manual_seed(0)
    bf16 = dict(device="cuda", dtype=torch.bfloat16)
    w = torch.randn(64, **bf16, requires_grad=True)
    cos, sin = torch.randn(16, 64, device="cuda"), torch.randn(16, 64, device="cuda")
    direct, thunders_call = FusionGuard(strict=True), FusionGuard(strict=True, runtime=Runtime(direct_calls=False))
    guarded = thunder.jit(norm_rotate_gate, transforms=[direct])
    kept = thunder.jit(norm_rotate_gate, transforms=[thunders_call])
    plain = thunder.jit(norm_rotate_gate)
    contiguous = torch.randn(4, 16, 64, **bf16, requires_grad=True)
    transposed = torch.randn(4, 64, 16, **bf16).transpose(1, 2).requires_grad_()  # other strides, same shape
    for x in (contiguous, transposed, contiguous):
        inputs = [x, w, cos, sin]
        out_d, grad_d = run_with_grads(guarded, inputs)
        out_k, grad_k = run_with_grads(kept, inputs)
        out_p, grad_p = run_with_grads(plain, inputs)
        assert_same(out_d, out_p)
        assert_same(grad_d, grad_p)
        assert_same(out_k, out_p)
        assert_same(grad_k, grad_p)
        eager = norm_rotate_gate(*[t.detach() for t in inputs])
        torch.testing.assert_close(out_d[0].float(), eager.float(), atol=0.05, rtol=0.02)
    assert thunder.cache_misses(guarded) == 1  # one program: the prologue does not check strides
    layouts = []
    for trace in (thunder.last_traces(guarded)[-1], thunder.last_backward_traces(guarded)[-1]):
        fusions = [b for b in trace.bound_symbols if is_fusion(b) and executor_name(b) == "nvfuser"]
        assert fusions
        assert all(isinstance(region_callable(b), DirectNvFuserCall) for b in fusions)
        layouts += [len(region_callable(b)._by_layout) for b in fusions]
    assert max(layouts) == 2  # the transposed input is a second layout, looked up once
    called = [d.details.get("call") for d in direct.report if d.about_region and d.executor == "nvfuser"]
    assert called and set(called) == {"direct"}
    assert all("call" not in d.details for d in thunders_call.report)
    for trace in (thunder.last_traces(kept)[-1], thunder.last_backward_traces(kept)[-1]):
        fusions = [b for b in trace.bound_symbols if is_fusion(b)]
        assert not any(isinstance(region_callable(b), DirectNvFuserCall) for b in fusions)


def two_layers(x, w1, w2):
    """Two layers alike: a matmul (outside nvFuser) and the same gated activation after each."""
    h = torch.nn.functional.silu(x @ w1) * 1.5
    return torch.nn.functional.silu(h @ w2) * 1.5


def test_equal_regions_run_one_compiled_definition_with_thunders_bits():
    from thunder_fusion_guard._thunder import SHARED_FUSIONS

    SHARED_FUSIONS.clear()  # regions of earlier tests do not stand in for these
    torch.manual_seed(0)
    bf16 = dict(device="cuda", dtype=torch.bfloat16)
    x = torch.randn(32, 64, **bf16, requires_grad=True)
    w1, w2 = (torch.randn(64, 64, **bf16, requires_grad=True) for _ in range(2))
    sharing, apart = FusionGuard(strict=True), FusionGuard(strict=True, runtime=Runtime(share_fusions=False))
    guarded, unshared = thunder.jit(two_layers, transforms=[sharing]), thunder.jit(two_layers, transforms=[apart])
    plain = thunder.jit(two_layers)
    for _ in range(2):
        out, grads = run_with_grads(guarded, [x, w1, w2])
        assert_same(out, run_with_grads(plain, [x, w1, w2])[0])
        assert_same(grads, run_with_grads(plain, [x, w1, w2])[1])
        assert_same(out, run_with_grads(unshared, [x, w1, w2])[0])
    shares = sharing.report.filter(action="share")
    assert [(d.trace, d.code) for d in shares if d.trace == "forward"] == [("forward", "shared_fusion")]
    (first, second) = [b for b in thunder.last_traces(guarded)[-1].bound_symbols if executor_name(b) == "nvfuser"]
    (layout0,), (layout1,) = region_callable(first)._by_layout.values(), region_callable(second)._by_layout.values()
    assert layout1 is layout0  # the second layer runs the first one's definition
    assert shares[0].region == second.sym.name and shares[0].details["shared_with"].endswith(first.sym.name)
    assert not apart.report.filter(action="share")
    regions = thunder.last_traces(unshared)[-1].bound_symbols
    apart_layouts = [list(region_callable(b)._by_layout.values()) for b in regions if executor_name(b) == "nvfuser"]
    assert apart_layouts[0][0] is not apart_layouts[1][0]


def slices_through_matmuls(w, x, m):
    """Slices of one weight, some read by matmuls (outside nvFuser): the weight's gradient is a sum of zero pads
    cut into regions at the matmuls."""
    a = (w[:, 0:16] @ m).sin()
    b = w[:, 16:48] * x[:, :32]
    c = (w[:, 48:64] @ m).cos()
    return a.sum() + b.sum() + c.sum()


def test_a_sum_of_padded_slice_gradients_across_regions_is_one_concatenation_with_thunders_bits():
    torch.manual_seed(0)
    bf16 = dict(device="cuda", dtype=torch.bfloat16)
    w = torch.randn(256, 64, **bf16, requires_grad=True)
    x, m = torch.randn(256, 64, **bf16), torch.randn(16, 16, **bf16)
    x[0, 0] = -0.0
    guard = FusionGuard(exact_only=False, costs=Costs(cost_model=False))
    guarded, plain = thunder.jit(slices_through_matmuls, transforms=[guard]), thunder.jit(slices_through_matmuls)
    for _ in range(2):
        (out,), grads = run_with_grads(guarded, [w, x, m])
        (expected_out,), expected = run_with_grads(plain, [w, x, m])
        assert torch.equal(out.view(torch.int16), expected_out.view(torch.int16))
        assert all(torch.equal(g.view(torch.int16), e.view(torch.int16)) for g, e in zip(grads, expected, strict=True))
    (d,) = [d for d in guard.report if d.code == "padded_sum_concatenated"]
    assert d.trace == "backward" and sorted(d.ops).count("pad") == 3 and d.details["ops_saved_per_call"] >= 3
    backward, unguarded = (str(thunder.last_backward_traces(j)[-1]) for j in (guarded, plain))
    assert "cat(" in backward and unguarded.count("prims.pad(") - backward.count("prims.pad(") == 3
