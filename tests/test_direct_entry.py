"""The direct entry (``direct_entry``): a ThunderFX subgraph's one compiled entry called without Thunder's search of
its cache computes what Thunder's call computes, keeps the prologue's checks, and is recorded."""

from __future__ import annotations

import pytest
import thunder
import torch
from thunder.dynamo import thunderfx

from thunder_fusion_guard import FusionGuard, Runtime
from thunder_fusion_guard import _thunder as th
from thunder_fusion_guard._thunder import entry as entry_module
from thunder_fusion_guard.fx_rescue import SubgraphRescue


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = torch.nn.Linear(16, 32), torch.nn.Linear(32, 16)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        h = torch.nn.functional.gelu(self.a(x)) * 1.5 + y.sum()
        return torch.tanh(self.b(h)).square().sum(-1)


def _model(dtype: torch.dtype) -> tuple[torch.nn.Module, list[torch.Tensor]]:
    torch._dynamo.reset()  # each test's compiles within Dynamo's recompile limit (beyond it, eager runs)
    torch.manual_seed(0)
    model = Block().to(dtype)
    g = torch.Generator().manual_seed(1)
    inputs = [torch.randn(8, 16, generator=g).to(dtype).requires_grad_(), torch.randn(4, generator=g).to(dtype)]
    return model, inputs


def _steps(fn, model: torch.nn.Module, inputs: list[torch.Tensor], n: int = 3) -> list[torch.Tensor]:
    seen = []
    for i in range(n):
        for p in model.parameters():
            p.grad = None
        inputs[0].grad = None
        x = inputs[0].detach().mul(1 + i).requires_grad_()
        out = fn(x, inputs[1])
        out.sum().backward()
        seen += [out.detach().clone(), x.grad.clone()] + [p.grad.clone() for p in model.parameters()]
    return seen


def _rescues(compiled) -> list[SubgraphRescue]:
    return [
        th.module_call(tm)
        for info in compiled._backend.subgraph_infos
        for tm in info.thunder_compiled_fns
        if isinstance(th.module_call(tm), SubgraphRescue)
    ]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_the_direct_entry_gives_thunders_bits_and_is_recorded(dtype):
    model, inputs = _model(dtype)
    unguarded = _steps(thunderfx(model), model, inputs)
    kept = FusionGuard(runtime=Runtime(direct_entry=False))
    without = _steps(thunderfx(model, transforms=[kept]), model, inputs)
    guard = FusionGuard(runtime=Runtime(eager_pieces=False))  # its check would call the entry once more
    compiled = thunderfx(model, transforms=[guard])
    direct = _steps(compiled, model, inputs)
    for a, b, c in zip(unguarded, without, direct, strict=True):
        assert torch.equal(a, b) and torch.equal(a, c)
    entered = guard.report.filter(action="enter")
    assert [d.details["entered"] for d in entered] == [True]
    assert not kept.report.filter(action="enter")
    (rescue,) = _rescues(compiled)
    assert rescue._entry is not None and rescue._entry.calls == 2  # the first call compiled; the next two entered
    assert not rescue.rescued


def test_the_cache_info_is_thunders_for_parameters_numbers_and_aliases():
    model, (x, _) = _model(torch.float32)
    jfn = thunder.jit(lambda *a: a[0] * 2)
    jfn(x)
    cd = jfn._lc_cd
    base = torch.randn(6)
    for args in (
        (x, model.a.weight, 3, 2.5, None, True),
        (base[:3], base[3:], x, base.view(2, 3), x),
        (model.a.weight, model.a.weight),
    ):
        theirs: dict = {}
        token = thunder._cache_info_ctx.set(theirs)
        try:
            cd.populate_cache_info(theirs, *args)
        finally:
            thunder._cache_info_ctx.reset(token)
        assert entry_module._cache_info(args, True) == theirs
        assert list(entry_module._cache_info(args, True)) == list(theirs)
    assert entry_module._cache_info(([x],), True) is None  # a container: Thunder flattens it, its own path


def test_a_call_the_prologue_refuses_goes_through_thunders_call():
    jfn = thunder.jit(lambda a, b: (a * b).sum(-1))
    a, b = torch.randn(4, 3), torch.randn(4, 3)
    expected = jfn(a, b)
    direct, why = th.direct_entry(None, jfn)
    assert why == "" and direct is not None
    left = []
    direct.on_leave = left.append
    assert torch.equal(direct(a, b), expected) and direct.calls == 1
    other = torch.randn(5, 2)
    assert torch.equal(direct(other, other), (other * other).sum(-1))  # another shape: Thunder compiles it
    assert direct.calls == 1 and len(jfn._lc_cs.interpreter_cache) == 2
    assert torch.equal(direct(a, b), expected) and direct.calls == 1  # two entries: Thunder chooses each time
    assert len(left) == 1 and left[0].startswith("2 cache entries")  # told once
    direct(a, b)
    assert len(left) == 1


def test_no_direct_entry_for_another_thunder_release(monkeypatch):
    jfn = thunder.jit(lambda a: a + 1)
    jfn(torch.ones(2))
    monkeypatch.setattr(entry_module, "THUNDER_VERSION", "0.0.1")
    direct, why = th.direct_entry(None, jfn)
    assert direct is None and "0.0.1" in why


def test_an_error_on_the_direct_entry_goes_to_the_rescue_as_thunders_would(monkeypatch):
    model, inputs = _model(torch.float32)
    compiled = thunderfx(model, transforms=[FusionGuard()])
    _steps(compiled, model, inputs, n=2)
    (rescue,) = _rescues(compiled)
    entry, cache = rescue._entry, rescue._entry.cs.interpreter_cache
    compiled_entry = cache[0]

    def failing(*args, **kwargs):
        raise RuntimeError("the compiled computation failed")

    def as_compiled() -> None:
        entry.entry = cache[0] = compiled_entry

    seen = []

    def rescued(error, args, kwargs, received):
        seen.append(str(error))
        as_compiled()
        return rescue.thunder_fn(*args, **kwargs)  # what Thunder's own call computes

    monkeypatch.setattr(rescue, "_rescue", rescued)
    entry.entry = cache[0] = compiled_entry._replace(computation_fn=failing)
    try:
        compiled(*inputs)
    finally:
        as_compiled()
    assert seen == ["the compiled computation failed"]
