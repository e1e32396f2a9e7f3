"""The guard's Inductor compiles outside Dynamo (whole graphs, Inductor rescues, timed backends) are kept by Inductor's
caches, and compute what ``torch._inductor.compile`` computes, bit for bit."""

from __future__ import annotations

import torch
from torch._dynamo.utils import counters
from torch._inductor.utils import fresh_cache

from thunder_fusion_guard import _thunder as th
from thunder_fusion_guard.fx_rescue import compile_fx_module, copy_input
from thunder_fusion_guard.whole_graph import forward_backward_step


class _Block(torch.nn.Module):
    def forward(self, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return (torch.tanh(x @ w + b) * x[:, :8]).sum(dim=1)


def _graph_and_inputs(dtype: torch.dtype) -> tuple[torch.fx.GraphModule, list[torch.Tensor]]:
    torch.manual_seed(0)
    x = (torch.randn(33, 16) * 3).to(dtype).requires_grad_()  # values whose sums round in bf16
    w = torch.randn(16, 8).to(dtype).requires_grad_()
    b = torch.randn(8).to(dtype).requires_grad_()
    return torch.fx.symbolic_trace(_Block()), [x, w, b]


def _step(fn, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    copies = [copy_input(t) for t in inputs]
    out = fn(*copies)
    out = out[0] if isinstance(out, (tuple, list)) else out
    return [out.detach(), *torch.autograd.grad(out.sum(), copies)]


def _inductor_counts() -> dict[str, int]:
    return {k: v for k, v in counters["inductor"].items() if k.startswith("fxgraph_cache")}


def test_a_compile_outside_dynamo_is_written_to_and_read_from_inductors_caches() -> None:
    gm, inputs = _graph_and_inputs(torch.float32)
    with fresh_cache():
        counters.clear()
        torch._inductor.compile(torch.fx.symbolic_trace(_Block()), list(inputs))
        assert _inductor_counts().get("fxgraph_cache_bypass", 0) > 0  # why: torch's own call bypasses them
        counters.clear()
        first = compile_fx_module(gm, inputs, "inductor")
        forward_backward_step(first, inputs)()  # the backward compiles at its first call
        assert _inductor_counts().get("fxgraph_cache_bypass", 0) == 0
        assert _inductor_counts().get("fxgraph_cache_miss", 0) >= 1
        counters.clear()
        again = compile_fx_module(gm, inputs, "inductor")
        forward_backward_step(again, inputs)()
        counts = _inductor_counts()
    assert counts.get("fxgraph_cache_hit", 0) >= 1 and counts.get("fxgraph_cache_miss", 0) == 0, counts


def test_the_cached_compile_computes_torchs_compile_bit_for_bit_in_bf16() -> None:
    inputs = _graph_and_inputs(torch.bfloat16)[1]
    with fresh_cache():
        theirs = _step(torch._inductor.compile(torch.fx.symbolic_trace(_Block()), list(inputs)), inputs)
        ours = _step(th.inductor_compile(torch.fx.symbolic_trace(_Block()), list(inputs)), inputs)
    assert all(torch.equal(a, b) for a, b in zip(theirs, ours, strict=True))
    exact = _Block()(*[t.detach().double() for t in inputs])
    assert ours[0].dtype == torch.bfloat16 and not torch.equal(ours[0].double(), exact)  # values that round


def test_a_graph_taking_a_number_is_compiled_as_torch_compiles_it() -> None:
    class Scaled(torch.nn.Module):
        def forward(self, x: torch.Tensor, k: int) -> torch.Tensor:
            return x * k

    x = torch.randn(4)
    compiled = th.inductor_compile(torch.fx.symbolic_trace(Scaled()), [x, 3])
    out = compiled(x, 3)
    assert torch.equal(out[0] if isinstance(out, (tuple, list)) else out, x * 3)


def test_inputs_fake_tensors_cannot_stand_for_are_compiled_as_torch_compiles_them(monkeypatch) -> None:
    from thunder_fusion_guard._thunder import cached_compile

    class Refusing(torch._subclasses.fake_tensor.FakeTensorMode):
        def from_tensor(self, *args, **kwargs):
            raise RuntimeError("no fake tensor for this input")

    monkeypatch.setattr(cached_compile, "FakeTensorMode", Refusing)  # the guard's own fake tensors only
    inputs = _graph_and_inputs(torch.float32)[1]
    with fresh_cache():
        counters.clear()
        ours = _step(th.inductor_compile(torch.fx.symbolic_trace(_Block()), list(inputs)), inputs)
        assert _inductor_counts().get("fxgraph_cache_bypass", 0) > 0  # the plain compile: torch's own call
    exact = _Block()(*[t.detach() for t in inputs])
    assert torch.allclose(ours[0], exact, rtol=1e-5, atol=1e-5)
