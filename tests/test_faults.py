"""Faults users meet: Ctrl-C during a first call, a cache that cannot be read or written or that several processes
write at once, and a compiled program called from two threads at once. The guard never breaks the program,
the user's own interrupt reaches them unchanged, and what it records is what a clean run records."""

from __future__ import annotations

import threading

import thunder
import torch
from helpers import assert_same

import thunder_fusion_guard._thunder as th
import thunder_fusion_guard.passes.pipeline as pipeline
from thunder_fusion_guard import FusionGuard
from thunder_fusion_guard.passes.hoist_runtime import hoisted_values


class Scaled(torch.nn.Module):
    """A parameter times an input-independent tensor: the tensor is hoisted and saved for the backward."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.linspace(0.5, 2.0, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x + torch.full((4,), 2.0) * self.w).transpose(0, 1) * 3.0


def facts(guard: FusionGuard) -> list[tuple]:
    """The guard's decisions as facts (no wording), in order."""
    return [
        (d.function, d.compile_index, d.trace, d.region, d.action, d.details.get("decided_by"), d.applied)
        for d in guard.report
    ]


def by_compile(guard: FusionGuard) -> dict[int, list[tuple]]:
    """Each compilation's decisions as facts, without the compile index."""
    out: dict[int, list[tuple]] = {}
    for f in facts(guard):
        out.setdefault(f[1], []).append(f[:1] + f[2:])
    return out


def jit_torch(model: torch.nn.Module, guard: FusionGuard | None = None):
    return thunder.jit(model, executors=[], transforms=[] if guard is None else [guard])


def step(jitted, model: Scaled, x: torch.Tensor) -> list[torch.Tensor]:
    """Output and the gradients of x and the parameter (not accumulated into ``.grad``)."""
    x = x.detach().clone().requires_grad_()
    out = jitted(x)
    return [out.detach(), *torch.autograd.grad(out.sum(), [x, model.w])]


# --- a compiled function called from two threads at once --------------------------------------------------------


class ForwardsFirst(FusionGuard):
    """The guard, with the forward traces of two threads' compilations both guarded before either backward trace:
    the interleaving that mixes up two compilations' records if the guard does not tell them apart."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.both_forwards = threading.Barrier(2, timeout=120)
        self.forward_caches: dict[int, set[int]] = {}

    def transform_trace_post_optimization(self, computation_trace, **kwargs):
        new = super().transform_trace_post_optimization(computation_trace, **kwargs)
        if not th.is_backward(computation_trace):
            self.forward_caches[threading.get_ident()] = {id(v) for v in hoisted_values(new)}
            self.both_forwards.wait()
        return new


def test_two_threads_compiling_at_once_record_each_compilation_as_one_thread_does(monkeypatch):
    torch.manual_seed(0)
    model, x = Scaled(), torch.randn(2, 4)
    alone = FusionGuard()
    want = step(jit_torch(model, alone), model, x)
    assert any(d.action == "hoist" for d in alone.report), "the test needs a hoisted tensor saved for the backward"
    assert_same(want, step(jit_torch(model), model, x))

    checked: dict[int, set[int]] = {}
    real_check = pipeline.check_backward

    def check_backward(trace, saved, metadata_ops=frozenset()):
        checked[threading.get_ident()] = {id(v) for v in saved.values()}
        return real_check(trace, saved, metadata_ops)

    monkeypatch.setattr(pipeline, "check_backward", check_backward)
    guard = ForwardsFirst()
    jitted = jit_torch(model, guard)
    got: dict[int, list[torch.Tensor]] = {}
    errors: list[BaseException] = []

    def call(i: int) -> None:
        try:
            got[i] = step(jitted, model, x)
        except BaseException as e:  # reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=call, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert thunder.cache_misses(jitted) == 2, "both threads compiled"
    for i in range(2):
        assert_same(got[i], want)
    # each backward checked the hoisted tensors of its own forward, not the other thread's
    assert checked == guard.forward_caches and all(checked.values())
    # each compilation recorded exactly what one thread alone records: no decision twice, none lost
    (reference,) = by_compile(alone).values()
    assert by_compile(guard) == {1: reference, 2: reference}
    # and the compiled programs still agree, called one after the other
    for _ in range(2):
        assert_same(step(jitted, model, x), want)
