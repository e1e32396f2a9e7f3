"""A region the guard cannot rewrite is kept, the reason recorded, and the program still runs."""

import pytest
import torch
from helpers import jit_cpu, regions
from test_guard import rearrange_heads

import thunder_fusion_guard.passes as passes
from thunder_fusion_guard import FusionGuard, FusionGuardError


def _broken(trace, region):
    raise RuntimeError("planted failure")


def test_failed_rewrite_keeps_region_and_records_error(monkeypatch):
    monkeypatch.setattr(passes, "lower_region", _broken)
    guard = FusionGuard()
    jitted = jit_cpu(rearrange_heads, guard)
    x = torch.randn(2, 3, 4, 5)
    assert torch.equal(jitted(x), rearrange_heads(x))
    assert len(regions(jitted)) == 1
    (d,) = guard.report
    assert d.action == "keep" and "rewriting failed" in d.reason
    assert d.error == "RuntimeError: planted failure"
    assert "planted failure" in str(guard.report)


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
