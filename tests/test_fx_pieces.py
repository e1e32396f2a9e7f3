"""Pieces ThunderFX splits off to Inductor, run eagerly where that gives the same bits (``runtime.eager_pieces``): views
and constants by construction, a contraction once checked on a call; each recorded, the rest left to Inductor."""

from __future__ import annotations

import pytest
import torch
from thunder.dynamo import thunderfx

from thunder_fusion_guard import Costs, FusionGuard, Runtime, fusion_executors, fx_pieces, why_not_fused
from thunder_fusion_guard import _thunder as th
from thunder_fusion_guard.cost import Measured
from thunder_fusion_guard.fx_pieces import piece_kind
from thunder_fusion_guard.measure import breakeven
from thunder_fusion_guard.measure.breakeven import RegionMeasurer


class Pieces(torch.nn.Module):
    """Two disjoint narrows (a views piece), a tensordot (a contraction piece), a sinc (a computing piece) and, with
    ``overlap``, two narrows of one input that overlap."""

    def __init__(self, dtype: torch.dtype, overlap: bool = False) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(8, 6, generator=torch.Generator().manual_seed(2)).to(dtype))
        self.overlap = overlap

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = x.narrow(1, 0, 4)
        b = x.narrow(1, 2 if self.overlap else 4, 4)
        y = torch.tanh(a) * b + 0.3
        y = torch.sinc(y) * y
        z = torch.tensordot(y, self.w[:4], dims=([1], [0]))
        return (z.exp() * z).float().sum()


def _steps(compiled, model: torch.nn.Module, x: torch.Tensor, n: int = 3) -> list[torch.Tensor]:
    seen = []
    for i in range(n):
        model.w.grad = None
        xi = x.detach().mul(1 + i).requires_grad_()
        loss = compiled(xi)
        loss.backward()
        seen += [loss.detach(), xi.grad.clone(), model.w.grad.clone()]
    return seen


def _run(dtype: torch.dtype, guard: FusionGuard | None, overlap: bool = False, device: str = "cpu"):
    torch._dynamo.reset()  # each run's compiles within Dynamo's recompile limit (beyond it, eager runs)
    model = Pieces(dtype, overlap).to(device)
    x = torch.randn(16, 8, generator=torch.Generator().manual_seed(1)).to(device, dtype)
    transforms = [guard] if guard is not None else []
    compiled = thunderfx(model, executors=fusion_executors(device), transforms=transforms)
    return compiled, _steps(compiled, model, x)


def _assert_bitwise(guarded: list[torch.Tensor], unguarded: list[torch.Tensor]) -> None:
    """Each step's values equal unguarded ThunderFX's to the bit, dtypes included."""
    assert len(guarded) == len(unguarded)
    for got, want in zip(guarded, unguarded, strict=True):
        assert got.dtype == want.dtype and torch.equal(got, want)


def _children(compiled) -> dict[str, str]:
    """Each Inductor piece's name and what runs it: ``eager`` (a fx GraphModule) or ``inductor``."""
    return {
        name: "eager" if isinstance(child, torch.fx.GraphModule) else "inductor"
        for info in compiled._backend.subgraph_infos
        for name, child in info.split_graph_module.named_children()
        if name.startswith("inductor_")
    }


def _pieces(guard: FusionGuard) -> list[tuple[str, str, str]]:
    """The Inductor pieces decided: (action, code, kind)."""
    found = [d for d in guard.report if d.code in ("piece_eager", "piece_kept") and d.executor == "inductor"]
    return [(d.action, d.code, d.facts["name"]) for d in found]


def _eager_subgraphs(guard: FusionGuard) -> list[str]:
    return [d.region for d in guard.report if d.code == "piece_eager" and d.executor == "thunder"]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_view_and_contraction_pieces_run_eagerly_with_unguarded_bits(dtype):
    _, unguarded = _run(dtype, None)
    guard = FusionGuard()
    compiled, guarded = _run(dtype, guard)
    _assert_bitwise(guarded, unguarded)
    # the narrows and the tensordot run eagerly now; the sinc computes: Inductor's
    assert sorted(_children(compiled).values()) == ["eager", "eager", "inductor"]
    assert sorted(_pieces(guard)) == [("reject", "piece_eager", "contraction"), ("reject", "piece_eager", "views")]
    views = next(d for d in guard.report if d.code == "piece_eager" and d.facts["name"] == "views")
    assert views.ops == ["narrow", "narrow"] and views.executor == "inductor"
    assert views.region.startswith("inductor_") and "beside subgraph" in views.region
    assert views.details["source"].endswith(f"test_fx_pieces.py:{Pieces.forward.__code__.co_firstlineno + 1}")
    entered = [d for d in guard.report if d.action == "enter"]  # recorded after the pieces beside subgraph 0
    assert entered and all(d.function is not None for d in entered)  # each names the compilation it is about


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_pieces_run_eagerly_beside_nvfuser_with_unguarded_bits(dtype):
    _, unguarded = _run(dtype, None, device="cuda")
    guard = FusionGuard()
    compiled, guarded = _run(dtype, guard, device="cuda")
    _assert_bitwise(guarded, unguarded)
    assert ("reject", "piece_eager", "views") in _pieces(guard)
    assert sorted(_children(compiled).values()).count("eager") == len([p for p in _pieces(guard) if p[0] == "reject"])


def test_with_the_option_off_every_piece_stays_with_inductor():
    guard = FusionGuard(runtime=Runtime(eager_pieces=False))
    compiled, guarded = _run(torch.bfloat16, guard)
    _, unguarded = _run(torch.bfloat16, None)
    _assert_bitwise(guarded, unguarded)
    assert set(_children(compiled).values()) == {"inductor"} and not _pieces(guard)


def test_overlapping_views_of_an_input_with_a_gradient_stay_with_inductor():
    guard = FusionGuard()
    compiled, guarded = _run(torch.bfloat16, guard, overlap=True)
    _, unguarded = _run(torch.bfloat16, None, overlap=True)
    _assert_bitwise(guarded, unguarded)
    assert sorted(_children(compiled).values()) == ["eager", "inductor", "inductor"]  # the tensordot only
    assert _pieces(guard) == [("reject", "piece_eager", "contraction")]


def test_a_contraction_whose_eager_bits_differ_stays_with_inductor(monkeypatch):
    monkeypatch.setattr(fx_pieces, "same_bits", lambda *args: False)
    guard = FusionGuard()
    compiled, guarded = _run(torch.float16, guard)
    _, unguarded = _run(torch.float16, None)
    _assert_bitwise(guarded, unguarded)
    assert sorted(_children(compiled).values()) == ["eager", "inductor", "inductor"]  # the narrows only
    kept = [d for d in guard.report if d.code == "piece_kept"]
    assert [(d.action, d.facts["name"], d.ops) for d in kept] == [("keep", "contraction", ["tensordot"])]
    assert not any(
        type(c).__name__ == "_CheckedPiece"
        for i in compiled._backend.subgraph_infos
        for c in i.split_graph_module.children()
    )


def test_same_bits_compares_outputs_and_gradients():
    x = torch.randn(4, 3, requires_grad=True)
    w = torch.randn(3, 2)
    assert fx_pieces.same_bits(torch.mm, lambda a, b: a @ b, (x, w))
    assert not fx_pieces.same_bits(torch.mm, lambda a, b: (a * 1.0001) @ b, (x, w))
    # same forward, other gradient: x.grad differs
    assert not fx_pieces.same_bits(
        lambda a, b: a.mm(b), lambda a, b: a.detach().mm(b) + (a - a.detach()).mm(b) * 2, (x, w)
    )
    assert x.grad is None  # the inputs are only read


def _graph(build, requires_grad: bool = True) -> torch.fx.Graph:
    gm = torch.fx.symbolic_trace(build)
    for node in gm.graph.find_nodes(op="placeholder"):
        node.meta["example_value"] = torch.empty(4, 6, requires_grad=requires_grad)
    return gm.graph


def test_piece_kind_reads_the_graph():
    assert piece_kind(_graph(lambda x: (x.narrow(0, 0, 2), x.narrow(0, 2, 2))))[0] == "views"
    assert piece_kind(_graph(lambda x: (x.narrow(0, 0, 3), x.narrow(0, 2, 2))))[0] is None  # overlap
    assert piece_kind(_graph(lambda x: (x.narrow(0, 0, 3), x.narrow(0, 2, 2)), False))[0] == "views"  # no gradient
    assert piece_kind(_graph(lambda x: x.expand(2, 4, 6)))[0] is None  # its gradient is a sum
    assert piece_kind(_graph(lambda x: x.expand(2, 4, 6), False))[0] == "views"
    assert piece_kind(_graph(lambda x: x.new_zeros(3), True))[0] == "views"
    assert piece_kind(_graph(lambda x: torch.mm(x.t(), x.reshape(4, 6))))[0] is None  # x read twice
    assert piece_kind(_graph(lambda x: torch.mm(x.t(), x), False))[0] == "contraction"
    assert piece_kind(_graph(lambda x: torch.sinc(x)))[1] == "it computes (sinc)"
    assert piece_kind(_graph(lambda x: x[x > 0]))[0] is None


def test_inductor_pieces_give_the_graph_returning_what_the_call_reads():
    owner = torch.fx.symbolic_trace(lambda x: x + 1)
    one = torch.fx.symbolic_trace(lambda x: [x.t()])

    class Compiled(torch.nn.Module):
        graph = one.graph

        def forward(self, x):
            return one(x)[0]

    owner.add_submodule("inductor_0", Compiled())
    with owner.graph.inserting_before(next(iter(owner.graph.find_nodes(op="output")))):
        call = owner.graph.call_module("inductor_0", (next(iter(owner.graph.find_nodes(op="placeholder"))),))
    owner.graph.find_nodes(op="output")[0].args = (call,)
    ((name, _, graph),) = th.inductor_pieces(owner)
    assert name == "inductor_0"
    (output,) = graph.find_nodes(op="output")
    assert isinstance(output.args[0], torch.fx.Node)  # the value itself, as the call gives it


class Product(torch.nn.Module):
    """A narrow (split off to Inductor) between two ThunderFX subgraphs: a product, and a scaled sum."""

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        p = x * y
        return (p.narrow(1, 0, 4) * 3.0).sum()


def _product(dtype: torch.dtype, guard: FusionGuard | None, module: type = Product, **options):
    """Three steps of ``module`` (``Product``) under ThunderFX: the compiled module, each step's loss and gradient."""
    torch._dynamo.reset()
    g = torch.Generator().manual_seed(3)
    x, y = (torch.randn(8, 6, generator=g).to(dtype) for _ in range(2))
    compiled = thunderfx(module(), transforms=[guard] if guard is not None else [], **options)
    seen = []
    for i in range(3):
        xi = x.detach().mul(1 + i).requires_grad_()
        loss = compiled(xi, y)
        loss.backward()
        seen += [loss.detach(), xi.grad.clone()]
    return compiled, seen


def _runs(compiled) -> list[str]:
    """What runs each Thunder subgraph: ``eager`` (its fx module) or ``thunder``."""
    return [
        "eager" if isinstance(th.module_call(tm).run, torch.fx.GraphModule) else "thunder"
        for info in compiled._backend.subgraph_infos
        for tm in info.thunder_compiled_fns
    ]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_a_subgraph_thunder_fuses_none_of_runs_eagerly_with_its_bits(dtype):
    guard = FusionGuard()
    compiled, guarded = _product(dtype, guard)  # Thunder's CPU default: its torch executor, no fusion
    _, unguarded = _product(dtype, None)
    _assert_bitwise(guarded, unguarded)
    assert _runs(compiled) == ["eager", "eager"]
    assert _eager_subgraphs(guard) == ["subgraph 0", "subgraph 1"]
    first = next(d for d in guard.report if d.code == "piece_eager" and d.executor == "thunder")
    assert first.action == "reject" and first.ops == ["mul"] and first.details["decided_by"] == "checked"


def test_a_subgraph_whose_eager_bits_differ_stays_thunders(monkeypatch):
    monkeypatch.setattr(fx_pieces, "same_bits", lambda *args: False)
    guard = FusionGuard()
    compiled, guarded = _product(torch.bfloat16, guard)
    _, unguarded = _product(torch.bfloat16, None)
    _assert_bitwise(guarded, unguarded)
    assert _runs(compiled) == ["thunder", "thunder"] and not _eager_subgraphs(guard)


def test_a_subgraph_with_a_kept_fusion_stays_thunders():
    guard = FusionGuard(costs=Costs(cost_model=False))  # compute regions kept
    compiled, guarded = _product(torch.float32, guard, executors=fusion_executors("cpu"))
    _, unguarded = _product(torch.float32, None, executors=fusion_executors("cpu"))
    _assert_bitwise(guarded, unguarded)
    kept = {d.subgraph for d in guard.report if d.about_region and d.action == "keep" and d.executor == "torchcompile"}
    runs = dict(zip(["subgraph 0", "subgraph 1"], _runs(compiled), strict=True))
    assert kept and all(runs[s] == "thunder" for s in kept)
    assert set(_eager_subgraphs(guard)) == {s for s in runs if s not in kept}


def test_with_the_option_off_subgraphs_stay_thunders():
    guard = FusionGuard(runtime=Runtime(eager_pieces=False))
    compiled, _ = _product(torch.float32, guard)
    assert _runs(compiled) == ["thunder", "thunder"] and not _eager_subgraphs(guard)


class Banded(torch.nn.Module):
    """A mask built row by row from the input's shape (hoisted by the guard) beside a narrow split off to Inductor."""

    def forward(self, scores: torch.Tensor) -> torch.Tensor:
        t = scores.shape[-1]
        mask = torch.full((t, t), float("-inf"))
        for i in range(t):
            mask[i, max(0, i - 3) : i + 1] = 0.0
        return (scores + mask).narrow(-1, 0, 4).exp().sum()


def test_a_subgraph_with_hoisted_work_stays_thunders():
    torch._dynamo.reset()
    guard = FusionGuard()
    compiled = thunderfx(Banded(), transforms=[guard])
    x = torch.randn(2, 8, 8, generator=torch.Generator().manual_seed(4), requires_grad=True)
    for _ in range(2):
        compiled(x).backward()
    assert {d.subgraph for d in guard.report if d.action == "hoist"} == {"subgraph 0"}  # the mask
    assert _eager_subgraphs(guard) == ["subgraph 1"]  # the exp and sum after the narrow


class Noisy(torch.nn.Module):
    """Dropout in training (a random draw) before a narrow split off to Inductor."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.dropout(x * 2.0, 0.5, training=True).narrow(1, 0, 4).sum()


def test_a_subgraph_that_draws_random_numbers_stays_thunders_and_the_draws_stay_unguardeds():
    def run(guard: FusionGuard | None) -> list[torch.Tensor]:
        torch._dynamo.reset()
        compiled = thunderfx(Noisy(), transforms=[guard] if guard is not None else [])
        torch.manual_seed(5)
        x = torch.randn(8, 6, requires_grad=True)
        seen = []
        for _ in range(3):
            x.grad = None
            loss = compiled(x)
            loss.backward()
            seen += [loss.detach(), x.grad.clone()]
        return [*seen, torch.rand(3)]  # the random state after the steps

    guard = FusionGuard()
    assert all(torch.equal(a, b) for a, b in zip(run(guard), run(None), strict=True))
    assert guard.report.subgraphs["subgraph 0"].ops == ["mul", "dropout"]
    assert _eager_subgraphs(guard) == ["subgraph 1"]  # the sum after the narrow; the dropout stays Thunder's


class Chain(torch.nn.Module):
    """A chain of products and sums Thunder's torch.compile executor fuses (the cost model keeps it), then a narrow
    split off to Inductor and a sum in a subgraph of its own."""

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        p = x * y
        for _ in range(6):
            p = p * 1.5 + y
        return (p.narrow(1, 0, 4) * 3.0).sum()


def _chain(dtype: torch.dtype, guard: FusionGuard | None, timed: tuple[float, float] | None = None):
    """Three steps of ``Chain`` under ThunderFX with torch.compile regions; ``timed``: the guard's timing of a subgraph
    (Thunder's µs, eager's µs) injected."""
    if guard is not None and timed is not None:
        guard.measurer.pair = lambda compiled, eager, args: Measured(*timed)
    return _product(dtype, guard, Chain, executors=fusion_executors("cpu"))


def test_a_fused_subgraph_timed_slower_than_eager_with_the_same_bits_runs_eagerly():
    _, unguarded = _chain(torch.float32, None)
    guard = FusionGuard()
    compiled, guarded = _chain(torch.float32, guard, timed=(100.0, 10.0))
    _assert_bitwise(guarded, unguarded)
    kept = [d for d in guard.report if d.subgraph == "subgraph 0" and d.about_region and d.action == "keep"]
    assert kept and all(d.executor == "torchcompile" for d in kept)  # Thunder fuses it: the timing decided
    assert _runs(compiled)[0] == "eager" and "subgraph 0" in _eager_subgraphs(guard)
    decision = next(d for d in guard.report if d.code == "piece_eager" and d.region == "subgraph 0")
    assert decision.details["decided_by"] == "measured" and decision.details["margin"] == 0.2
    assert (decision.facts["measured"].region_us, decision.facts["measured"].eager_us) == (100.0, 10.0)
    assert decision.details["measured_eager_us"] == 10.0


@pytest.mark.parametrize(
    ("dtype", "timed", "options"),
    [
        (torch.float32, (100.0, 85.0), {}),  # eager faster, but not by the margin
        (torch.float32, (100.0, 10.0), {"costs": Costs(measure_budget_s=0)}),  # no timing: the fusion stays
        (torch.bfloat16, (100.0, 10.0), {}),  # the fusion rounds once, eager after each op: other bits
        (torch.float16, (100.0, 10.0), {}),
    ],
)
def test_a_fused_subgraph_stays_thunders_unless_timed_faster_eagerly_with_its_bits(dtype, timed, options):
    _, unguarded = _chain(dtype, None)
    guard = FusionGuard(**options)
    compiled, guarded = _chain(dtype, guard, timed)
    _assert_bitwise(guarded, unguarded)
    assert _runs(compiled)[0] == "thunder" and "subgraph 0" not in _eager_subgraphs(guard)
    kept = [d for d in guard.report if d.code == "piece_kept" and d.region == "subgraph 0"]
    if dtype is torch.float32 and not options:  # timed, and the timing kept Thunder's run: recorded as such
        (decision,) = kept
        assert decision.action == "keep" and decision.details["decided_by"] == "measured"
        assert (decision.facts["measured"].region_us, decision.facts["measured"].eager_us) == timed
    else:  # not timed (no budget, or other bits): nothing to record
        assert not kept


@pytest.mark.real_timings  # its clock is fake: what it says holds whatever the real one says
def test_the_measurer_times_two_runs_within_its_budget_and_not_across_ranks(monkeypatch):
    ticks = iter(range(0, 10**12, 1000))  # every reading of the clock 1 µs later
    measurer = RegionMeasurer(budget_s=1.0, clock=lambda: next(ticks))
    x = torch.ones(3)
    measured = measurer.pair(torch.sin, torch.cos, (x,))
    assert isinstance(measured, Measured) and measurer.timed == 1
    assert RegionMeasurer(budget_s=0.0).pair(torch.sin, torch.cos, (x,)).startswith("not timed: the measuring budget")
    monkeypatch.setattr(breakeven, "world_size", lambda: 2)
    assert measurer.pair(torch.sin, torch.cos, (x,)).startswith("not timed: a run of 2 ranks")


@pytest.mark.real_timings  # its clock is fake: what it says holds whatever the real one says
def test_the_measurer_times_host_and_device_apart_only_where_asked_on_cuda(monkeypatch):
    asked = []
    monkeypatch.setattr(breakeven, "host_device_us", lambda fns, args, **k: asked.append(len(fns)))
    ticks = iter(range(0, 10**12, 1000))
    measurer = RegionMeasurer(budget_s=1.0, clock=lambda: next(ticks))
    x = torch.ones(3)
    plain = measurer.pair(torch.sin, torch.cos, (x,))
    apart = measurer.pair(torch.sin, torch.cos, (x,), apart=True)
    assert plain.host is None and plain.device is None and apart.host is None  # none found: the timing still decides
    assert asked == ([2] if torch.cuda.is_available() else [])  # asked once, on CUDA only, for the two programs


@pytest.mark.cuda
@pytest.mark.real_timings  # whatever the clock says, both programs get a host and a device time
def test_on_cuda_the_measurer_gives_both_programs_host_and_device_time_apart():
    x = torch.ones(256, device="cuda")
    measured = RegionMeasurer(budget_s=5.0).pair(torch.sin, torch.cos, (x,), allowance_s=1.0, apart=True)
    assert isinstance(measured, Measured), measured
    assert measured.host is not None and measured.device is not None and min(*measured.host, *measured.device) > 0


def test_a_subgraph_run_eagerly_is_no_rescue_and_why_not_fused_still_reads_its_traces():
    compiled, _ = _chain(torch.float32, FusionGuard(), timed=(100.0, 10.0))
    rescues = [th.module_call(tm) for info in compiled._backend.subgraph_infos for tm in info.thunder_compiled_fns]
    assert _runs(compiled)[0] == "eager" and not any(r.rescued for r in rescues)
    why = why_not_fused(compiled)
    assert why.regions == 4 and not why.of_kind("rescue")  # both subgraphs' regions, forward and backward; no rescue


class Normed(torch.nn.Module):
    """Reads its input twice (a norm): run eagerly, each read hands autograd a gradient of its own."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5)


class Once(torch.nn.Module):
    """Reads its input once."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 3.0


def _residual_stream(guard: FusionGuard | None, module: type = Normed) -> list[torch.Tensor]:
    """Three steps of a residual stream through a compiled norm, its input used outside the compiled graph too (as a
    block's residual add is): the input's gradient each step."""
    torch._dynamo.reset()
    compiled = thunderfx(module(), transforms=[guard] if guard is not None else [])
    g = torch.Generator().manual_seed(3)
    seen = []
    for _ in range(3):
        x = torch.randn(4, 8, 16, generator=g).requires_grad_()
        h = x * 1.5
        y = h + compiled(h)
        z = y + compiled(y)
        (z * torch.randn(z.shape, generator=g)).sum().backward()
        seen.append(x.grad.clone())
    return seen


def test_a_subgraph_reading_an_input_it_differentiates_twice_stays_thunders():
    """Alone, the norm's eager gradients equal Thunder's; beside the residual add they are summed in another order
    (each read's gradient reaches autograd on its own): it stays Thunder's, unguarded Thunder's bits."""
    guard = FusionGuard()
    _assert_bitwise(_residual_stream(guard), _residual_stream(None))
    assert not _eager_subgraphs(guard)


def test_a_subgraph_reading_its_input_once_still_runs_eagerly():
    """The same stream through a subgraph that reads its input once: eagerly, one gradient as Thunder's; it runs
    eagerly, with Thunder's bits."""
    guard = FusionGuard()
    _assert_bitwise(_residual_stream(guard, Once), _residual_stream(None, Once))
    assert _eager_subgraphs(guard) == ["subgraph 0"]
