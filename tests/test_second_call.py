"""A second call with other inputs (dtype, shape, requires_grad, strides, device): Thunder recompiles or raises, and
the guard changes neither, nor does anything it keeps per compiled program (hoisted tensors, direct calls, captured
graphs) serve a call made with another layout."""

from __future__ import annotations

import pytest
import thunder
import torch
from helpers import assert_same, jit_cpu

from thunder_fusion_guard import FusionGuard

pytestmark = pytest.mark.usefixtures("no_inductor_module")


def fn(x: torch.Tensor) -> torch.Tensor:
    """A region kept (exp), an input-independent tensor hoisted (arange), a view."""
    return (torch.exp(x) * 2.0 + torch.arange(4.0)).transpose(0, -1)


def first() -> torch.Tensor:
    return torch.randn(3, 4, generator=torch.Generator().manual_seed(0))


SECOND = {
    "dtype": lambda: first().double(),
    "shape": lambda: torch.randn(5, 4, generator=torch.Generator().manual_seed(1)),
    "requires_grad": lambda: first().requires_grad_(),
    "non-contiguous": lambda: torch.randn(4, 6, generator=torch.Generator().manual_seed(2)).t()[::2],
    "integer dtype": lambda: torch.arange(12).reshape(3, 4),
    "shape that cannot broadcast": lambda: torch.randn(3, 5, generator=torch.Generator().manual_seed(3)),
}


def outcome(jitted, x: torch.Tensor) -> tuple:
    """What a call gives: its output and, for a tensor that requires grad, the input's gradient; or its error."""
    x = x.detach().clone().requires_grad_(x.requires_grad)
    try:
        out = jitted(x)
    except Exception as e:
        return ("raised", type(e), str(e))
    grads = list(torch.autograd.grad(out.sum(), [x])) if x.requires_grad else []
    return ("returned", [out.detach(), *grads])


def same(a: tuple, b: tuple) -> None:
    assert a[0] == b[0], (a, b)
    if a[0] == "raised":
        assert a[1:] == b[1:]
    else:
        assert_same(a[1], b[1])


def jit_torch(fn, guard: FusionGuard | None = None):
    return thunder.jit(fn, executors=[], transforms=[] if guard is None else [guard])


@pytest.mark.parametrize("jit", [jit_torch, jit_cpu], ids=["torch-executor", "torchcompile"])
@pytest.mark.parametrize("change", list(SECOND))
def test_a_second_call_with_other_inputs_is_what_thunder_makes_of_it(change, jit):
    x, y = first(), SECOND[change]()
    guard = FusionGuard()
    guarded, plain = jit(fn, guard), jit(fn)
    calls = [x, y, x, y]  # back and forth: each compiled program serves only its own inputs
    for z in calls:
        same(outcome(guarded, z), outcome(plain, z))
    assert thunder.cache_misses(guarded) == thunder.cache_misses(plain)
    assert thunder.cache_hits(guarded) == thunder.cache_hits(plain)
    if jit is jit_torch:
        assert any(d.action == "hoist" for d in guard.report), "the test needs a hoisted tensor"
    else:
        assert any(d.about_region and d.action == "keep" for d in guard.report), "the test needs a region kept"


@pytest.mark.cuda
def test_a_second_call_on_another_device_is_what_thunder_makes_of_it():
    x = first()
    guard = FusionGuard()
    guarded, plain = thunder.jit(fn, transforms=[guard]), thunder.jit(fn)
    for z in [x, x.cuda(), x, x.cuda()]:
        same(outcome(guarded, z), outcome(plain, z))
    # Thunder refuses the CUDA input while tracing (the arange stays on the CPU), so it caches nothing for it and
    # each CUDA call is a miss: the guard changes neither the error nor the count.
    assert thunder.cache_misses(guarded) == thunder.cache_misses(plain) == 3
    assert thunder.cache_hits(guarded) == thunder.cache_hits(plain) == 1
