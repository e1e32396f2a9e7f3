"""Every decision's reason is one short line (terminal tables show it); the long story is in
``details["explanation"]``."""

import pytest
import torch
import torch.nn.functional as F
from helpers import ALWAYS_EAGER, jit_cpu
from test_guard import metadata_chain, mixed
from test_hoist import mask_loop
from test_inplace import copy_into_input
from test_rewrites import sliding_window_mask

import thunder_fusion_guard.passes.pipeline as pipeline
from thunder_fusion_guard import FusionGuard


def noisy(x):
    return F.dropout(torch.tanh(x) * 2, p=0.5, training=True) + 1


def long_chain(x, y):
    return torch.exp(torch.tanh(x * y + 1.0) - y.abs()).sum(-1)


PROGRAMS = [
    (metadata_chain, lambda: [torch.randn(3, 4, 6, 5, requires_grad=True)], {}),
    (mixed, lambda: [torch.randn(2, 3, 4, 5, requires_grad=True), torch.randn(5)], {}),
    (sliding_window_mask, lambda: [torch.randn(1, 2, 8, 8)], {}),
    (mask_loop, lambda: [torch.randn(2, 8, 8)], {}),
    (copy_into_input, lambda: [torch.randn(4, 4), torch.zeros(4, 4)], {}),
    (noisy, lambda: [torch.randn(8, 8)], {}),
    (long_chain, lambda: [torch.randn(8, 8), torch.randn(8, 8)], {}),
    (long_chain, lambda: [torch.randn(8, 8), torch.randn(8, 8)], {"exact_only": False, "calibration": ALWAYS_EAGER}),
    (mixed, lambda: [torch.randn(2, 3, 4, 5), torch.randn(5)], {"report_only": True, "cost_model": False}),
    (mixed, lambda: [torch.randn(2, 3, 4, 5), torch.randn(5)], {"calibration": "shipped", "executors": []}),
]


def _check(guard: FusionGuard) -> None:
    assert guard.report.decisions
    for d in guard.report:
        assert len(d.reason) <= 100 and "\n" not in d.reason, d.reason
        explanation = d.details.get("explanation")
        assert explanation is None or (explanation != d.reason and "\n" not in explanation)


@pytest.mark.parametrize("fn,make,options", PROGRAMS, ids=[f"{p[0].__name__}-{i}" for i, p in enumerate(PROGRAMS)])
def test_reasons_are_short_single_lines(fn, make, options):
    guard = FusionGuard(**options)
    jit_cpu(fn, guard)(*make())
    _check(guard)


def test_failure_reasons_are_short_and_the_error_kept(monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("planted failure " + "x" * 200)

    monkeypatch.setattr(pipeline, "lower_region", broken)
    monkeypatch.setattr(pipeline, "fold_setitem_copies", broken)
    guard = FusionGuard()
    jit_cpu(metadata_chain, guard)(torch.randn(3, 4, 6, 5))
    jit_cpu(sliding_window_mask, guard)(torch.randn(1, 2, 8, 8))
    _check(guard)
    assert any(d.error and "planted failure" in d.error for d in guard.report)


def test_a_cut_reason_keeps_the_whole_text_in_the_explanation():
    guard = FusionGuard()
    jit_cpu(long_chain, guard)(torch.randn(8, 8), torch.randn(8, 8))
    (d,) = [d for d in guard.report if d.about_region and d.trace == "forward"]
    assert d.reason.startswith("kept for exactness: ")
    assert "cost aside: estimated" in d.details["explanation"] and "cost aside" not in d.reason
