"""Thunder's automatic gradients without their forward (``passes/exact_vjps.py``, ``_thunder/exact_vjps.py``):
Thunder 0.2.6 computes the gradient of an op it registered automatically (``tensordot``, ``torch.mm`` as ``spmm``,
``narrow``, ``sinc``) by ``torch.autograd.functional.vjp``, running the op again. Guarded, the ops autograd runs for
that gradient are recorded once per argument layout and called without the forward: the same bits as unguarded
Thunder (forward and gradients, fp32 and bf16, column-major inputs too), one decision per op, and a layout whose
recording differs runs Thunder's call, recorded."""

from __future__ import annotations

import pytest
import thunder
import torch

from thunder_fusion_guard import FusionGuard, Runtime, fusion_executors
from thunder_fusion_guard._thunder import exact_vjps
from thunder_fusion_guard._thunder.exact_vjps import ExactVjp


def library_ops(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    y = torch.tensordot(x, w, dims=((1,), (0,)))
    z = torch.tensordot(y.reshape(2, 3, 6), w.reshape(4, 6), dims=([-1], [1]))
    m = torch.mm(x, w) + torch.mm(x, w.t().contiguous().t())  # a column-major right side
    head = torch.narrow(y, 1, 2, 3) + x.narrow(-1, -3, 3)
    return (head.sin() * 2).sum() + z.sum() + (m * m).sum() + torch.sinc(x).sum()


def inputs(dtype: torch.dtype, device: str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, 4, generator=g).to(dtype)
    x[0, 0] = 0  # sinc's gradient at 0
    return x.to(device), torch.randn(4, 6, generator=g).to(dtype).to(device)


def step(fn, x: torch.Tensor, w: torch.Tensor, steps: int = 2) -> tuple[torch.Tensor, ...]:
    """The last of ``steps`` calls (the first records, the others run the recordings): output and gradients."""
    for _ in range(steps):
        x, w = x.detach().requires_grad_(True), w.detach().requires_grad_(True)
        out = fn(x, w)
        grads = torch.autograd.grad(out.float(), (x, w))
    return (out.detach(), *grads)


def bitwise(a: tuple[torch.Tensor, ...], b: tuple[torch.Tensor, ...]) -> bool:
    def raw(t: torch.Tensor) -> torch.Tensor:
        return t.reshape(-1).contiguous().view(torch.uint8)

    return all(torch.equal(raw(x), raw(y)) for x, y in zip(a, b, strict=True))


def removed(guard: FusionGuard) -> dict[str, int]:
    return {d.facts["name"]: d.facts["count"] for d in guard.report.decisions if d.code == "vjp_forward_removed"}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_bits_are_unguarded_thunders(dtype):
    x, w = inputs(dtype)
    guard = FusionGuard()
    got = step(thunder.jit(library_ops, transforms=[guard]), x, w)
    assert bitwise(got, step(thunder.jit(library_ops), x, w))
    assert removed(guard) == {"tensordot_vjp": 2, "spmm_vjp": 2, "narrow_vjp": 2, "sinc_vjp": 1}
    assert not guard.report.filter(code="vjp_forward_kept")
    off = FusionGuard(runtime=Runtime(exact_vjps=False))
    assert bitwise(step(thunder.jit(library_ops, transforms=[off]), x, w), got)
    assert removed(off) == {}


def test_the_recording_leaves_the_forward_out_and_matches_autograd_for_each_layout():
    calls = []
    vjp = ExactVjp(torch.mm, calls.append)
    a, b, g = torch.randn(7, 5), torch.randn(5, 3), torch.randn(7, 3)
    for left, right in ((a, b), (a.t().contiguous().t(), b), (a, b.t().contiguous().t())):  # row- and column-major
        saved = ((left, right), {})
        want = exact_vjps._vjp_impl(torch.mm, saved, g)
        for _ in range(2):
            got = vjp(saved, g)
            assert bitwise(tuple(got), tuple(want))
    assert calls == [None, None, None]  # one recording a layout, each equal to Thunder's at its first call
    graphs = [graph for graph, _, _ in vjp._recorded.values()]
    assert all(sum(n.target is torch.ops.aten.mm.default for n in gm.graph.nodes) == 2 for gm in graphs)


def test_a_layout_whose_recording_differs_runs_thunders_call(monkeypatch):
    def wrong(self, flat, spec):
        return lambda *tensors: [torch.zeros_like(t) for t in tensors[:2]]

    monkeypatch.setattr(ExactVjp, "_record", wrong)
    x, w = inputs(torch.float32)
    guard = FusionGuard()
    got = step(thunder.jit(lambda x, w: torch.mm(x, w).sum(), transforms=[guard]), x, w, steps=3)
    assert bitwise(got, step(thunder.jit(lambda x, w: torch.mm(x, w).sum()), x, w))
    kept = guard.report.filter(code="vjp_forward_kept")
    assert [d.facts["name"] for d in kept] == ["spmm_vjp"] and "differs" in kept[0].facts["error"]


def test_inside_a_torch_compile_region_nothing_changes():
    """With torch.compile's executor the automatic gradients get Thunder's ops before Thunder differentiates
    (``gradient_traced``): none is left for this pass."""
    x, w = inputs(torch.float32)
    guard = FusionGuard()
    step(thunder.jit(library_ops, executors=fusion_executors("cpu"), transforms=[guard]), x, w)
    assert removed(guard) == {}


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_bits_are_unguarded_thunders_on_cuda(dtype):
    x, w = inputs(dtype, "cuda")
    guard = FusionGuard()
    got = step(thunder.jit(library_ops, executors=fusion_executors("cuda"), transforms=[guard]), x, w)
    assert bitwise(got, step(thunder.jit(library_ops, executors=fusion_executors("cuda")), x, w))
    assert removed(guard) == {"tensordot_vjp": 2, "spmm_vjp": 2, "narrow_vjp": 2, "sinc_vjp": 1}
