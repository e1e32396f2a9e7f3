"""Whose each Dynamo compile of a first call is: the user's frame, or a torch.compile region Thunder runs (its
fusion compile, forward or backward), told apart by Dynamo's own compile callbacks. Real Dynamo compiles, with
Dynamo's ``eager`` backend (no C++)."""

import time

import pytest
import thunder.executors.torch_compile as torch_compile
import torch
from thunder.dynamo import thunderfx
from thunder.executors.torch_compile import torch_compile_ex

from thunder_fusion_guard import _thunder as th
from thunder_fusion_guard import first_call
from thunder_fusion_guard.phases import DYNAMO, FUSION_COMPILE


def _eager_backend_regions(monkeypatch):
    """Thunder's torch.compile regions compiled by Dynamo with its ``eager`` backend: real Dynamo compiles of Thunder's
    (each region's frame, at its first call), no C++."""
    made, real = torch_compile.make_compiled, torch.compile

    def make(*args, **kwargs):
        monkeypatch.setattr(torch, "compile", lambda fn, **options: real(fn, backend="eager", fullgraph=True))
        try:
            return made(*args, **kwargs)
        finally:
            monkeypatch.setattr(torch, "compile", real)

    monkeypatch.setattr(torch_compile, "make_compiled", make)


def _cummax_exp(x):
    y = torch.tanh(x * 2.0)
    return torch.cummax(y, 0)[0].exp() + 1.0  # cummax is not Thunder's: a graph piece of its own


def test_dynamo_compiles_of_thunders_regions_are_told_from_the_users_frame(monkeypatch):
    _eager_backend_regions(monkeypatch)
    compiled = thunderfx(_cummax_exp, executors=[torch_compile_ex])  # unguarded: no timer of the guard's
    x = torch.randn(4, 3, requires_grad=True)
    with th.watching_dynamo_compiles(time.perf_counter_ns, lambda: False) as compiles:
        compiled(x).sum().backward()
    users = [c for c in compiles if c.users and c.frame]
    regions = [c for c in compiles if c.in_run]
    assert len(users) == 1  # the user's frame, once
    assert [c.forward for c in regions] == [True, True, False, False]  # two pieces of Thunder's, forward and back
    assert not any(c.timed for c in compiles)
    # each region's frame record falls in its own count range, so that the user's frame keeps only its own
    frames = [c.after[th.DYNAMO_FRAME] - c.before[th.DYNAMO_FRAME] for c in compiles]
    assert frames == [1 if c.frame else 0 for c in compiles]
    assert _callbacks_removed()


def _callbacks_removed() -> bool:
    from torch._dynamo.callback import callback_handler

    return not any("watching_dynamo_compiles" in f.__qualname__ for f in callback_handler.start_callbacks)


def test_an_unguarded_first_call_counts_each_region_compile_once(monkeypatch):
    """Without a guard no timer of its own wraps the regions: their Dynamo compiles are the fusion compile, and Dynamo's
    phase and the split are the user's frame's records alone (before, they were counted there too)."""
    _eager_backend_regions(monkeypatch)
    compiled = thunderfx(_cummax_exp, executors=[torch_compile_ex])
    x = torch.randn(4, 3, requires_grad=True)
    metrics = torch._dynamo.utils.compilation_time_metrics
    frames_before = len(metrics.get(th.DYNAMO_FRAME, []))
    backends_before = len(metrics.get(th.DYNAMO_BACKEND, []))
    with first_call(compiled) as first:
        compiled(x).sum().backward()
    frame, backend = metrics[th.DYNAMO_FRAME][frames_before], metrics[th.DYNAMO_BACKEND][backends_before]
    assert len(metrics[th.DYNAMO_FRAME]) == frames_before + 5  # the user's frame, then 4 regions'
    assert first.phases_s[DYNAMO] == pytest.approx(frame - backend, abs=1e-9)
    assert first.phases_s[FUSION_COMPILE] > 0
    assert first.regions_s == {}  # named regions are the guard's timers'


def test_a_failing_record_never_breaks_the_users_compile(monkeypatch):
    """The window's Dynamo callbacks run inside every compile: where reading a record fails, the compile goes on."""
    _eager_backend_regions(monkeypatch)
    compiled = thunderfx(_cummax_exp, executors=[torch_compile_ex])
    x = torch.randn(4, 3, requires_grad=True)

    def broken() -> dict:
        raise RuntimeError("a record that cannot be read")

    monkeypatch.setattr(th.timestamps, "dynamo_counts", broken)
    with th.watching_dynamo_compiles(time.perf_counter_ns, lambda: False) as compiles:
        out = compiled(x)
    torch.testing.assert_close(out, _cummax_exp(x))
    assert compiles == []
