"""What the program asked Thunder for is respected: explicit shape-only nvFuser regions are kept unless
``override_compile_options``, and ops are moved into a region only when its executor can run them."""

from __future__ import annotations

import dataclasses

import pytest
import thunder
import torch
from helpers import assert_same, fragmenting_executor, jit_cpu, regions
from thunder.core import prims

from thunder_fusion_guard import FusionGuard, Rewrites
from thunder_fusion_guard.options import make_options
from thunder_fusion_guard.policy import decide


def view_transpose(x):
    return x.view(4, -1).transpose(0, 1)


def _shape_only_region():
    jitted = jit_cpu(view_transpose)
    jitted(torch.randn(4, 6))
    (region,) = regions(jitted)
    return dataclasses.replace(region, executor="nvfuser")  # decide() only reads the name


@pytest.mark.parametrize(
    "compile_options,override,action",
    [
        ({"nv_enable_shape_only_fusion": True}, False, "keep"),
        ({"nv_enable_shape_only_fusion": True}, True, "reject"),
        ({"nv_enable_shape_only_fusion": False}, False, "reject"),
        ({}, False, "reject"),
    ],
)
def test_explicit_shape_only_fusion_is_honoured(compile_options, override, action):
    options = make_options(rewrites=Rewrites(override_compile_options=override))
    verdict = decide(_shape_only_region(), options, None, compile_options=compile_options)
    assert verdict.action == action
    if action == "keep":
        assert verdict.code == "shape_only_asked" and verdict.facts == {"option": "nv_enable_shape_only_fusion"}


def test_shape_only_request_concerns_nvfuser_only():
    jitted = jit_cpu(view_transpose)
    jitted(torch.randn(4, 6))
    (region,) = regions(jitted)  # a torch.compile region: the nvFuser option does not ask for it
    verdict = decide(region, make_options(), None, compile_options={"nv_enable_shape_only_fusion": True})
    assert verdict.action == "reject"


def test_override_takes_only_booleans():
    with pytest.raises(ValueError, match="override_compile_options"):
        FusionGuard(rewrites=Rewrites(override_compile_options="yes"))


def test_the_guard_sees_the_options_the_program_passed():
    seen = []

    class Spy(FusionGuard):
        def transform_trace_post_optimization(self, trace, **kwargs):
            from thunder_fusion_guard import _thunder as th

            seen.append(th.explicit_compile_options())
            return super().transform_trace_post_optimization(trace, **kwargs)

    jit_cpu(view_transpose, Spy(), nv_enable_shape_only_fusion=True)(torch.randn(4, 6))
    assert seen and seen[0].get("nv_enable_shape_only_fusion") is True


def view_then_compute(x, w):
    a = x.reshape(4, 8).t()
    return (a * w).exp() + 1


def test_ops_the_region_executor_cannot_run_are_not_moved_into_it():
    ex = fragmenting_executor()
    cannot = {prims.PrimIDs.TRANSPOSE, "torch.permute", "torch.Tensor.permute"}
    ex._implmap = {k: v for k, v in ex._implmap.items() if k not in cannot}
    x, w = torch.randn(32), torch.randn(8, 4)
    guard = FusionGuard(strict=True)
    guarded = thunder.jit(view_then_compute, executors=[ex], transforms=[guard])
    plain = thunder.jit(view_then_compute, executors=[ex])
    assert_same([guarded(x, w)], [plain(x, w)])
    assert not [d for d in guard.report if d.error], guard.report
    (skipped,) = [d for d in guard.report if d.action == "keep" and d.details.get("scope") == "op"]
    assert skipped.ops == ["permute"]
    assert skipped.code == "rehome_skipped"  # not tried: the executor does not claim permute
    assert not guard.report.filter(action="rehome")


@pytest.mark.cuda
def test_explicit_shape_only_fusion_on_nvfuser():
    x = torch.randn(4, 6, device="cuda")
    guard = FusionGuard(strict=True)
    jitted = thunder.jit(view_transpose, transforms=[guard], nv_enable_shape_only_fusion=True)
    assert torch.equal(jitted(x), view_transpose(x))
    (decision,) = [d for d in guard.report if d.about_region]
    assert decision.action == "keep" and decision.code == "shape_only_asked"
    overriding = FusionGuard(strict=True, rewrites=Rewrites(override_compile_options=True))
    jitted = thunder.jit(view_transpose, transforms=[overriding], nv_enable_shape_only_fusion=True)
    assert torch.equal(jitted(x), view_transpose(x))
    assert [d.action for d in overriding.report if d.about_region] == ["reject"]


@pytest.mark.cuda
def test_copy_into_destination_then_return_it_records_no_error():
    """The issue's program: update_aliases is metadata but nvFuser cannot run it, so it is not re-homed."""

    def copy_then_return(src, dst):
        dst.copy_(src * 2)
        return dst

    src, dst = torch.randn(64, device="cuda"), torch.randn(64, device="cuda")
    guard = FusionGuard()
    out = thunder.jit(copy_then_return, transforms=[guard])(src, dst.clone())
    assert torch.equal(out, copy_then_return(src, dst.clone()))
    assert not [d for d in guard.report if d.error], guard.report
