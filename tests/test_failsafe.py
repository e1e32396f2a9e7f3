"""A region the guard cannot rewrite is kept, the reason recorded, and the program still runs."""

import dataclasses

import pytest
import torch
from helpers import assert_same, jit_cpu, regions, run_with_grads
from opinfo_harness import EAGER_CHEAP
from test_guard import metadata_chain, rearrange_heads
from test_inplace import copy_into_input
from thunder.extend import OperatorExecutor

import thunder_fusion_guard._thunder as th
import thunder_fusion_guard.passes.decide as passes
from thunder_fusion_guard import Costs, FusionGuard, FusionGuardError
from thunder_fusion_guard.ops import effect_count


def _broken(trace, region):
    raise RuntimeError("planted failure")


@pytest.mark.guard_failure_expected
def test_failed_rewrite_keeps_region_and_records_error(monkeypatch):
    monkeypatch.setattr(passes, "lower_region", _broken)
    guard = FusionGuard()
    jitted = jit_cpu(rearrange_heads, guard)
    x = torch.randn(2, 3, 4, 5)
    assert torch.equal(jitted(x), rearrange_heads(x))
    assert len(regions(jitted)) == 1
    (d,) = guard.report
    # a reject (metadata-only) kept, its rewrite failed
    assert d.action == "keep" and d.details["decided_by"] == "metadata" and "switched_to" not in d.details
    assert d.error == "RuntimeError: planted failure"
    assert "planted failure" in str(guard.report)


@pytest.mark.guard_failure_expected
def test_failed_trace_rebuild_keeps_everything(monkeypatch):
    def broken_replace(*a, **k):
        raise RuntimeError("planted rebuild failure")

    monkeypatch.setattr(passes, "replace_regions", broken_replace)
    guard = FusionGuard()
    jitted = jit_cpu(rearrange_heads, guard)
    x = torch.randn(2, 3, 4, 5)
    assert torch.equal(jitted(x), rearrange_heads(x))
    assert len(regions(jitted)) == 1
    assert guard.report.decisions[0].error == "RuntimeError: planted rebuild failure"


def test_strict_mode_raises(monkeypatch):
    monkeypatch.setattr(passes, "lower_region", _broken)
    jitted = jit_cpu(rearrange_heads, FusionGuard(strict=True))
    with pytest.raises(FusionGuardError, match="could not rewrite TorchCompile0"):
        jitted(torch.randn(2, 3, 4, 5))


def _lowering_without_reshape(monkeypatch):
    """Thunder's real lowering, run while the torch executor has no implementation of reshape."""
    torchex = th.torch_executor()
    reshape_ids = [k for k in torchex.implmap if "reshape" in str(k).lower()]
    assert reshape_ids
    real = th.lower_to_torch

    def lower(*args):
        with monkeypatch.context() as m:
            for k in reshape_ids:
                m.delitem(torchex.implmap, k)
            return real(*args)

    monkeypatch.setattr(th, "lower_to_torch", lower)


def _lowering_to_another_executor(monkeypatch):
    """Thunder's real lowering with its first op handed to an operator executor that is not torch."""
    real = th.lower_to_torch
    other = OperatorExecutor("tfg_not_torch")

    def lower(*args):
        first, *rest = real(*args)
        return [first.from_bsym(sym=dataclasses.replace(first.sym, executor=other)), *rest]

    monkeypatch.setattr(th, "lower_to_torch", lower)


def _lowering_dropping_last(monkeypatch):
    """Thunder's real lowering with its last bound symbol dropped: a region output is never defined."""
    real = th.lower_to_torch
    monkeypatch.setattr(th, "lower_to_torch", lambda *args: real(*args)[:-1])


@pytest.mark.parametrize(
    "break_lowering,error",
    [
        (_lowering_without_reshape, "RuntimeError: Failed to find an executor for bound symbol"),
        (_lowering_dropping_last, "RewriteError: lowering TorchCompile0 does not define its outputs"),
        (_lowering_to_another_executor, "RewriteError: lowering TorchCompile0 left "),
    ],
    ids=["torch-executor-cannot-lower", "incomplete-lowering", "not-the-torch-executor"],
)
@pytest.mark.guard_failure_expected
def test_failure_in_the_real_lowering_path(monkeypatch, break_lowering, error):
    break_lowering(monkeypatch)
    x = torch.randn(3, 4, 6, 5, requires_grad=True)
    guard = FusionGuard()
    jitted = jit_cpu(metadata_chain, guard)
    out, grads = run_with_grads(jitted, [x])
    out_e, grads_e = run_with_grads(metadata_chain, [x])
    assert_same(out, out_e)
    assert_same(grads, grads_e)
    assert len(regions(jitted)) == 1, "the region is kept as it was"
    failed = [d for d in guard.report if d.error]
    assert failed and all(d.action == "keep" and d.applied and "switched_to" not in d.details for d in failed)
    assert all(d.error.startswith(error) for d in failed), [d.error for d in failed]
    assert error.split(": ")[1] in str(guard.report)
    with pytest.raises(FusionGuardError, match="could not rewrite TorchCompile0"):
        jit_cpu(metadata_chain, FusionGuard(strict=True))(x)


@pytest.mark.guard_failure_expected
def test_lowering_that_loses_an_in_place_write_is_kept(monkeypatch):
    """A lowering without the region's copy_ into an input would lose the write: the region is kept."""
    real = th.lower_to_torch
    monkeypatch.setattr(th, "lower_to_torch", lambda *args: [b for b in real(*args) if not effect_count(b)])
    guard = FusionGuard(costs=Costs(calibration=EAGER_CHEAP, margin=0.0))
    jitted = jit_cpu(copy_into_input, guard)
    x, buf, buf_e = torch.randn(3, 3), torch.randn(3, 3), torch.empty(3, 3)
    assert_same(list(jitted(x, buf)), list(copy_into_input(x, buf_e)))
    assert torch.equal(buf, buf_e), "the input is still written"
    assert len(regions(jitted)) == 1
    (d,) = guard.report
    assert d.action == "keep" and d.details["decided_by"] == "model" and d.details["model_action"] == "reject"
    assert d.error == "RewriteError: lowering TorchCompile0 changes its in-place writes: 1 in the region, 0 lowered"
    with pytest.raises(FusionGuardError, match="changes its in-place writes"):
        jit_cpu(copy_into_input, FusionGuard(strict=True, costs=Costs(calibration=EAGER_CHEAP, margin=0.0)))(x, buf)


def test_region_that_also_returns_its_input_is_lowered():
    """Regression (seen on nvFuser in a nanoGPT backward): a region whose outputs include an input."""
    import thunder

    from thunder_fusion_guard import _thunder as th
    from thunder_fusion_guard.passes.rewrite import lower_region
    from thunder_fusion_guard.regions import Region

    jitted = jit_cpu(rearrange_heads)
    jitted(torch.randn(2, 3, 4, 5))
    trace = thunder.last_traces(jitted)[-1]
    (region,) = regions(jitted)
    passthrough = region.bsym.from_bsym(output=[*region.bsym.output, *region.bsym.flat_proxy_args])
    lowered = lower_region(trace, Region(region.position, region.name, region.executor, passthrough))
    assert [(b.sym.name, th.executed_by(b)) for b in lowered] == [("reshape", "torch")]


def test_region_built_without_one_of_its_inputs_is_not_lowered():
    """Thunder 0.2.6's torch.compile executor made, in an e3nn model's backward with narrow translated, a region
    called with no arguments whose ops read values: lowering it would hand the rescue a program that cannot run."""
    import thunder

    from thunder_fusion_guard.passes.rewrite import RewriteError, lower_region
    from thunder_fusion_guard.regions import Region

    jitted = jit_cpu(rearrange_heads)
    jitted(torch.randn(2, 3, 4, 5))
    trace = thunder.last_traces(jitted)[-1]
    (region,) = regions(jitted)
    given = [p.name for p in region.bsym.flat_proxy_args]
    argless = region.bsym.from_bsym(args=())
    with pytest.raises(RewriteError, match=f"{region.name} reads {given[0]}, which it is not given"):
        lower_region(trace, Region(region.position, region.name, region.executor, argless))
