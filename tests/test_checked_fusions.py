"""A region Inductor compiles has its first call checked against its ops one by one: where its values are further
apart than rounding (Inductor's compile of NequIP's backward region at l_max 3 on CUDA gave forces 0.025 to 7.4 off),
its ops run it from then on and the rescue is recorded; where they are not, the fusion's own bits stay."""

from __future__ import annotations

import warnings

import pytest
import thunder
import torch
from helpers import assert_same, flat
from test_rescue import inputs, program
from thunder.executors.torch_compile import TorchCompileExecutor, torch_compile_ex

from thunder_fusion_guard import FusionGuard, Runtime
from thunder_fusion_guard.passes.rescue import _how_far


def wrong_executor(op: str) -> TorchCompileExecutor:
    """torch.compile, but each region holding ``op`` returns its floating outputs times 1.5, without an error (a
    compile that computes something else)."""

    class Wrong(TorchCompileExecutor):
        def fuse(self, region, fusion_counter):
            bsym = super().fuse(region, fusion_counter)
            if op not in {b.sym.name for b in region.bound_symbols}:
                return bsym
            right = bsym._call_ctx[bsym.sym.name]

            def wrong(*args):
                out = right(*args)
                scaled = [o * 1.5 if isinstance(o, torch.Tensor) and o.is_floating_point() else o for o in out]
                return type(out)(scaled)

            bsym._call_ctx = {bsym.sym.name: wrong}
            return bsym

    ex = Wrong(f"tc_wrong_{op}")
    ex._implmap = dict(torch_compile_ex._implmap)
    return ex


def step(fn, *args):
    out = fn(*args)
    return [out, *torch.autograd.grad(out.sum(), args)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_region_computing_other_values_runs_its_ops_from_its_first_call(dtype):
    guard = FusionGuard()
    jitted = thunder.jit(program, executors=[wrong_executor("sin")], transforms=[guard])
    x, w = inputs(dtype)
    want = step(program, x, w)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        first = step(jitted, x, w)
    for got in (first, step(jitted, x, w)):
        for a, b in zip(got, want, strict=True):
            torch.testing.assert_close(a, b, atol=1e-2, rtol=3e-2)
    (rescued,) = [d for d in guard.report.filter(action="rescue") if d.trace == "forward"]
    assert rescued.executor == "tc_wrong_sin" and rescued.details["error_type"] == "FusionDiffers"
    assert "apart" in rescued.error and any("apart" in str(w.message) for w in said)
    # unguarded, and with the check off, the region's values are its own: 1.5 times the ops'
    plain = step(thunder.jit(program, executors=[wrong_executor("sin")]), x, w)
    unchecked = FusionGuard(runtime=Runtime(check_fusions=False))
    off = step(thunder.jit(program, executors=[wrong_executor("sin")], transforms=[unchecked]), x, w)
    assert_same(flat(off), flat(plain))
    assert not torch.allclose(off[0].float(), want[0].float(), rtol=0.1)
    assert unchecked.report.filter(action="rescue") == []


def test_regions_that_compute_the_ops_values_keep_the_fusions_bits_in_fp16():
    guard = FusionGuard()
    jitted = thunder.jit(program, executors=[torch_compile_ex], transforms=[guard])
    plain = thunder.jit(program, executors=[torch_compile_ex])
    x, w = inputs(torch.float16)
    got, want = step(jitted, x, w), step(plain, x, w)
    assert not torch.equal(got[0], got[0].float().round().half())
    assert_same(flat(got), flat(want))
    assert guard.report.filter(action="rescue") == []


def dropped(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return (torch.nn.functional.dropout(torch.sin(x), 0.5, training=True) * w).sum(-1)


def test_a_region_drawing_random_numbers_is_not_checked():
    """Its ops would draw other numbers: the forward region runs as unguarded, its values its own (the backward
    region, which reads the saved mask and draws none, is checked)."""
    guard = FusionGuard()
    jitted = thunder.jit(dropped, executors=[wrong_executor("sin")], transforms=[guard])
    plain = thunder.jit(dropped, executors=[wrong_executor("sin")])
    x, w = inputs()
    torch.manual_seed(1)
    got = step(jitted, x, w)
    torch.manual_seed(1)
    want = step(plain, x, w)
    assert_same([got[0]], [want[0]])
    assert [d for d in guard.report.filter(action="rescue") if d.trace == "forward"] == []


def test_a_sum_that_cancels_is_compared_at_the_inputs_size():
    """Rounding of a sum that cancels is the inputs' size, not its own: within that share of it, equal."""
    out, want = torch.tensor([3e-7, -1e-7]), torch.tensor([0.0, 1e-7])
    assert _how_far(out, want) is not None
    assert _how_far(out, want, scale=1.0) is None
    assert _how_far(torch.tensor([0.5, 1.0]), torch.tensor([1.0, 1.0]), scale=1.0) is not None
    # a float32 output of bf16 inputs: their rounding, not float32's
    near = torch.tensor([1.004, 1.0]), torch.tensor([1.0, 1.0])
    assert _how_far(*near) is not None and _how_far(*near, loosest=5e-2) is None


def test_a_backward_region_computing_other_values_runs_its_ops_from_its_first_call():
    """As NequIP's at l_max 3 on CUDA: the region computing other values is a backward one (sin's gradient, ``cos``);
    its first call is checked when autograd calls it, and the gradients are the ops' from then on."""
    guard = FusionGuard()
    jitted = thunder.jit(program, executors=[wrong_executor("cos")], transforms=[guard])
    x, w = inputs(torch.float32)
    want = step(program, x, w)
    plain = step(thunder.jit(program, executors=[wrong_executor("cos")]), x, w)
    assert not torch.allclose(plain[1], want[1], rtol=0.1)  # unguarded, the gradient is the region's own
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        first = step(jitted, x, w)
    for got in (first, step(jitted, x, w)):
        for a, b in zip(got, want, strict=True):
            torch.testing.assert_close(a, b)
    assert_same(first[0], plain[0])  # the forward, whose regions compute right, keeps unguarded Thunder's bits
    (rescued,) = guard.report.filter(action="rescue")
    assert rescued.trace == "backward" and rescued.details["error_type"] == "FusionDiffers"
