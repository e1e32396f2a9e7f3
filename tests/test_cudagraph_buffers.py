"""CUDA graphs that share buffers: ``GuardedCUDAGraphs``, passed beside the guard, captures each run of
consecutive ops as one graph (Thunder groups by ``fusion_type``, which ThunderFX sets to "dataflow":
several graphs a trace, some of nothing but deletions, every input of each copied at each replay) and lets a
graph read an earlier graph's output in place. The same ops and values; fewer graphs and copies; recorded by the
guard. Thunder's own ``CUDAGraphTransform`` beside the guard runs as given; the guard recommends the package's.

On CPU a capture cannot be made: the fixture ``cpu_graphs`` (tests/conftest.py) stands in for one with the
semantics that matter here, so stale buffers or a wrongly shared one would change the values compared."""

from __future__ import annotations

import pytest
import thunder
import torch
from helpers import assert_same
from thunder.dynamo import thunderfx
from thunder.transforms.cudagraph import CUDAGraphTransform

from thunder_fusion_guard import FusionGuard, GuardedCUDAGraphs, explain
from thunder_fusion_guard import _thunder as th
from thunder_fusion_guard.reasons import words


def gated(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    h = torch.tanh(x @ w1)
    g = torch.sigmoid(x @ w2)
    return (h * g).sum() + (h.exp() * g.cos()).mean()


def _args(seed: int, device: str = "cpu") -> list[torch.Tensor]:
    torch.manual_seed(seed)
    shapes = [(8, 16), (16, 16), (16, 16)]
    return [torch.randn(shape, device=device, requires_grad=True) for shape in shapes]


def _steps(fn, seeds=(0, 1, 2), device: str = "cpu") -> list[torch.Tensor]:
    """Output and gradients of a few steps on other inputs each (a stale buffer would show)."""
    got = []
    for seed in seeds:
        args = _args(seed, device)
        out = fn(*args)
        got += [out.detach().clone(), *(g.clone() for g in torch.autograd.grad(out, args))]
    return got


def _graphs(graphs: CUDAGraphTransform) -> dict[str, int]:
    """Each graph the transform made, with its number of captured ops (deletions and the return not counted)."""
    return {
        name: sum(b.sym.name not in ("python_del", "python_return") for b in bsyms)
        for name, (bsyms, _, _) in graphs.cuda_graph_runner.trace_symbols.items()
    }


def test_thunderfx_gets_one_graph_a_trace_with_thunders_values(cpu_graphs):
    plain = CUDAGraphTransform()
    want = _steps(thunderfx(gated, transforms=[plain]))
    made_by_thunder = _graphs(plain)
    assert len(made_by_thunder) == 4 and sorted(made_by_thunder.values())[:2] == [0, 0]  # two of deletions alone

    guard, graphs = FusionGuard(), GuardedCUDAGraphs()
    compiled = thunderfx(gated, transforms=[guard, graphs])
    assert_same(_steps(compiled), want)
    assert not _held(guard)  # the gradients handed over were free again at each replay
    made = _graphs(graphs)
    assert len(made) == 2 and 0 not in made.values()  # one forward, one backward graph
    unshared = GuardedCUDAGraphs(share_buffers=False)
    assert_same(_steps(thunderfx(gated, transforms=[FusionGuard(), unshared])), want)
    assert sum(made.values()) == sum(_graphs(unshared).values())  # the same ops captured
    assert isinstance(graphs, CUDAGraphTransform)  # a CUDAGraphTransform, sharing buffers

    forward, backward = guard.report.filter(action="capture")
    assert (forward.trace, backward.trace) == ("forward", "backward")
    assert len(backward.details["captures"]) == 1  # where Thunder's grouping made 3, 2 of deletions alone
    assert backward.details["thunder_captures"] == 3 and backward.details["thunder_empty_captures"] == 2
    assert len(forward.details["captures"]) == 1  # as Thunder's grouping made them
    assert (forward.details["thunder_captures"], forward.details["thunder_empty_captures"]) == (1, 0)
    assert "capture" in explain(compiled)


def test_a_graphs_inputs_are_copied_in_one_batched_copy(cpu_graphs, monkeypatch):
    """At each replay the inputs a graph does not read in place are copied into its buffers by one
    ``torch._foreach_copy_`` (Thunder's runner: one ``copy_`` each): Thunder's values, and the capture decisions
    name those inputs."""
    batches: list[int] = []
    foreach_copy = torch._foreach_copy_

    def counting(buffers, given, **kwargs):
        batches.append(len(buffers))
        return foreach_copy(buffers, given, **kwargs)

    monkeypatch.setattr(torch, "_foreach_copy_", counting)
    want = _steps(thunderfx(gated, transforms=[CUDAGraphTransform()]))
    assert not batches  # unguarded: Thunder's copies
    guard = FusionGuard()
    assert_same(_steps(thunderfx(gated, transforms=[guard, GuardedCUDAGraphs()])), want)
    forward, backward = guard.report.filter(action="capture")
    assert forward.details["copied_in"] == ["l_x_", "l_w1_", "l_w2_"]  # plain tensors, not parameters
    assert backward.details["copied_in"] and backward.details["bytes_copied_in"] > 0
    # three steps, the first of each graph its capture (Thunder's own copies): two replays of each, one batch each
    assert batches == [3, len(backward.details["copied_in"])] * 2


def staged(x: torch.Tensor) -> torch.Tensor:
    y = torch.sin(x) * 2
    scale = y.sum().item()  # not captured (below): the trace's two graphs meet at it
    return (y * scale).cos()


def test_a_graph_reads_an_earlier_graphs_output_in_place(monkeypatch, cpu_graphs):
    # Thunder's transform leaves prims.item out of its graphs, but not the torch executor's Tensor.item that the
    # trace holds here: left out too, it splits the trace into two graphs as an op it does not capture does.
    captures = CUDAGraphTransform.can_fuse
    monkeypatch.setattr(
        CUDAGraphTransform, "can_fuse", lambda self, bsym: "item" not in bsym.sym.name and captures(self, bsym)
    )
    plain = CUDAGraphTransform()
    unguarded = thunder.jit(staged, transforms=[plain])
    guard, graphs = FusionGuard(), GuardedCUDAGraphs()
    jitted = thunder.jit(staged, transforms=[guard, graphs])
    for seed in range(3):
        torch.manual_seed(seed)
        x = torch.randn(64, 32)
        assert_same(jitted(x), unguarded(x))
        assert_same(jitted(x), staged(x))
    masks = [[mask for _, mask in t.cuda_graph_runner.python_callables.values()] for t in (plain, graphs)]
    # the second graph reads y, and the sum it only deletes, in the first graph's buffers; the item is a number
    assert masks == [[(False,), (False, False, False)], [(False,), (True, True, False)]]
    (capture,) = guard.report.filter(action="capture")
    assert len(capture.details["captures"]) == 2
    assert len(capture.details["read_in_place"]) == 2  # not copied at each replay: 8.0 KiB
    assert capture.details["bytes_not_copied"] == 64 * 32 * 4 + 4


@pytest.mark.parametrize(
    "graphs, options",
    [("unshared", {}), ("thunders", {}), ("thunders", {"report_only": True})],
)
def test_without_sharing_thunders_grouping_stays(cpu_graphs, graphs, options):
    """``GuardedCUDAGraphs(share_buffers=False)`` and Thunder's own transform beside the guard (report or not)
    capture with Thunder's grouping: the former recorded, a capture a trace; the latter only recommended."""
    transform = GuardedCUDAGraphs(share_buffers=False) if graphs == "unshared" else CUDAGraphTransform()
    guard = FusionGuard(**options)
    _steps(thunderfx(gated, transforms=[guard, transform]), seeds=(0,))
    assert len(_graphs(transform)) == 4  # Thunder's grouping (its copies too)
    codes = [d.code for d in guard.report.filter(action="capture")]
    assert codes == (["captured", "captured"] if graphs == "unshared" else ["cuda_graphs_recommended"])


def _state(transform: CUDAGraphTransform) -> dict[str, int]:
    """The identity of each attribute of ``transform``: what a change of its type or state would show."""
    return {name: id(value) for name, value in vars(transform).items()}


class _Lists(thunder.Transform):
    """Records, at each stage Thunder calls a transform at, which objects the compilation's transforms list holds
    (a substitution, even one put back before the end, would show there)."""

    def __init__(self) -> None:
        self.seen: list[tuple[int, list[int]]] = []

    def _record(self) -> None:
        transforms = thunder.core.compile_data.get_compile_data().transforms
        self.seen.append((id(transforms), [id(t) for t in transforms]))

    def transform_traces_pre_prologue(self, prologue_trc, computation_trc, epilogue_trc, **kwargs):
        self._record()
        return prologue_trc, computation_trc, epilogue_trc

    def transform_trace_post_optimization(self, computation_trace, **kwargs):
        self._record()
        return computation_trace


@pytest.mark.parametrize("frontend", ["jit", "thunderfx"])
def test_the_users_transform_runs_as_thunders_and_is_recommended_against(cpu_graphs, monkeypatch, frontend):
    """Thunder's own ``CUDAGraphTransform`` given beside the guard is what runs, with Thunder's grouping: the same
    object, of Thunder's class and state, in the compilation's transforms list from start to end (the guard never
    writes that list); the guard records one decision (not applied) recommending ``GuardedCUDAGraphs``."""
    compile_with = thunder.jit if frontend == "jit" else thunderfx
    torch._dynamo.reset()  # this file compiles ``gated`` often: past Dynamo's recompile limit it would run eagerly
    ran: list[int] = []
    capture = CUDAGraphTransform.transform_trace_post_optimization

    def recording(self, trace, **kwargs):
        ran.append(id(self))
        return capture(self, trace, **kwargs)

    monkeypatch.setattr(CUDAGraphTransform, "transform_trace_post_optimization", recording)
    graphs, guard, lists = CUDAGraphTransform(), FusionGuard(), _Lists()
    before = _state(graphs)
    transforms = [lists, guard, graphs, _Lists()]
    plain = CUDAGraphTransform()
    want = _steps(compile_with(gated, transforms=[plain]), seeds=(0,))
    ran.clear()
    compiled = compile_with(gated, transforms=transforms)
    assert_same(_steps(compiled, seeds=(0,)), want)
    assert ran and set(ran) == {id(graphs)}  # the user's object captured, forward and backward
    assert len(_graphs(graphs)) == len(_graphs(plain)) == (2 if frontend == "jit" else 4)  # Thunder's grouping
    assert type(graphs) is CUDAGraphTransform and _state(graphs) == before and graphs.outputs_from_forward is None
    assert transforms[:3] == [lists, guard, graphs]  # (ThunderFX appends a transform of its own)
    if frontend == "jit":
        held = thunder.compile_data(compiled).transforms
        assert any(t is graphs for t in held) and all(type(t) is not GuardedCUDAGraphs for t in held)
    for recorder in (lists, transforms[3]):  # before the guard and after it: one list, the same objects throughout
        assert len(recorder.seen) >= 3 and len(set(map(str, recorder.seen))) == 1
        assert id(graphs) in recorder.seen[0][1]
    (recommended,) = guard.report.filter(action="capture")
    assert (recommended.code, recommended.applied, recommended.trace) == ("cuda_graphs_recommended", False, "forward")
    assert recommended.details["captured_by"] == "CUDAGraphTransform"
    assert recommended.details["recommended"] == "GuardedCUDAGraphs"
    _steps(compile_with(gated, transforms=[guard, graphs]), seeds=(1,))  # recorded once for this transform
    assert len(guard.report.filter(code="cuda_graphs_recommended")) == 1


def test_the_packages_transform_captures_by_itself_and_adapts(cpu_graphs):
    """Unit: ``GuardedCUDAGraphs`` is a ``CUDAGraphTransform`` with its options; the capture adapted to the traces
    Thunder's checks refuse shares its runner, buffers and rule for writes; a subclass of it is not adapted;
    without a guard it captures the same, nothing recorded."""
    from thunder_fusion_guard.ops import writes_inputs

    graphs = GuardedCUDAGraphs(share_buffers=False)
    assert isinstance(graphs, CUDAGraphTransform) and not graphs.share_buffers and GuardedCUDAGraphs().share_buffers
    adapted = th.capture_for_any_trace(graphs)
    assert adapted is th.capture_for_any_trace(graphs) and adapted.cuda_graph_runner is graphs.cuda_graph_runner
    assert not adapted.share_buffers and adapted._writes is writes_inputs
    assert th.capture_for_any_trace(adapted) is None
    assert th.capture_for_any_trace(type("Mine", (GuardedCUDAGraphs,), {})()) is None
    assert not th.is_thunders_cudagraph_transform(graphs) and th.is_thunders_cudagraph_transform(CUDAGraphTransform())

    alone = GuardedCUDAGraphs()
    want = _steps(thunderfx(gated, transforms=[CUDAGraphTransform()]))
    assert_same(_steps(thunderfx(gated, transforms=[alone])), want)
    assert len(_graphs(alone)) == 2  # one forward, one backward graph, no guard needed


def test_a_compilation_that_fails_leaves_the_transforms_as_given(cpu_graphs):
    """A compilation that fails between the guard and the capture leaves the list and the user's transform as they
    were (nothing to put back)."""

    class Failing(thunder.Transform):
        def transform_trace_post_optimization(self, trace, **kwargs):
            raise RuntimeError("fails between the guard and the capture")

    graphs = CUDAGraphTransform()
    before = _state(graphs)
    transforms = [FusionGuard(), Failing(), graphs]
    given = list(transforms)
    with pytest.raises(RuntimeError, match="fails between"):
        thunder.jit(gated, transforms=transforms)(*_args(0))
    assert all(a is b for a, b in zip(transforms, given, strict=True))
    assert _state(graphs) == before and graphs.outputs_from_forward is None


def test_a_subclass_of_the_transform_is_left_as_it_is(cpu_graphs):
    class MyGraphs(CUDAGraphTransform):
        pass

    guard, graphs = FusionGuard(), MyGraphs()
    _steps(thunderfx(gated, transforms=[guard, graphs]), seeds=(0,))
    assert type(graphs) is MyGraphs and len(_graphs(graphs)) == 4
    assert not guard.report.filter(action="capture")  # neither captured by the package nor recommended against


def bump(z: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    z.add_(y)  # writes a tensor the caller made, inside what the transform captures
    return z * 2


def _bumps(fn, rounds: int = 3) -> list[torch.Tensor]:
    got = []
    for seed in range(rounds):
        torch.manual_seed(seed)
        z, y = torch.zeros(8, 4), torch.randn(8, 4)
        got += [fn(z, y).clone(), z.clone()]  # a graph's output is the same tensor at every replay
    return got


def test_thunders_graphs_leave_an_input_they_write_unwritten(cpu_graphs):
    """Thunder's runner replays a graph on its own copies of the inputs: ``z.add_(y)`` writes the copy; so it does
    beside the guard, which leaves Thunder's transform as given."""
    for transforms in ([CUDAGraphTransform()], [FusionGuard(), CUDAGraphTransform()]):
        got = _bumps(thunder.jit(bump, transforms=transforms))
        assert not torch.equal(got[1], _bumps(bump)[1]) and not got[1].any()  # the caller's z: still zeros


@pytest.mark.parametrize("share", [True, False])
def test_a_graph_that_writes_an_input_writes_the_callers_tensor(cpu_graphs, share):
    guard, graphs = FusionGuard(), GuardedCUDAGraphs(share_buffers=share)
    assert_same(_bumps(thunder.jit(bump, transforms=[guard, graphs])), _bumps(bump))
    if share:
        (capture,) = guard.report.filter(action="capture")
        assert capture.details["copied_back"] == ["z"]  # the one input the graph may write


def viewed(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    t = w.transpose(0, 1).reshape(4, 8)  # a view of an input the graph only reads, and returns
    return torch.tanh(x @ w) * 2, t


@pytest.mark.parametrize("share", [True, False])
def test_a_graph_that_returns_a_view_of_an_input_copies_nothing_back(cpu_graphs, monkeypatch, share):
    """Returning a view of an input writes nothing: the input is not copied back after each replay (the return
    Thunder's runner appends to a graph's ops is not one of its writes); the values stay Thunder's."""
    copies = []
    copy = torch.Tensor.copy_
    monkeypatch.setattr(torch.Tensor, "copy_", lambda self, src, *a, **k: copies.append(1) or copy(self, src, *a, **k))
    guard, graphs = FusionGuard(), GuardedCUDAGraphs(share_buffers=share)
    compiled = thunder.jit(viewed, transforms=[guard, graphs])
    for seed in range(3):
        torch.manual_seed(seed)
        x, w = torch.randn(4, 8), torch.randn(8, 4)
        copies.clear()
        assert_same(list(compiled(x, w)), list(viewed(x, w)))
        if seed:  # at a replay: GuardedCUDAGraphs' two outputs (its copies in are one batched copy); none back
            assert len(copies) == 2, copies
    if share:
        (capture,) = guard.report.filter(action="capture")
        assert capture.details["copied_back"] == []


def test_unknown_value_of_the_option_is_refused():
    with pytest.raises(ValueError, match="share_buffers"):
        GuardedCUDAGraphs(share_buffers="yes")
    with pytest.raises(TypeError, match="share_capture_buffers"):  # an option of the transform, not of the guard
        FusionGuard(share_capture_buffers=True)


@pytest.mark.cuda
def test_cuda_graphs_sharing_buffers_give_thunders_bits_on_cuda():
    """Real captures (nvFuser regions, cuBLAS matmuls) under ThunderFX: one graph a trace, unguarded Thunder's
    values at every step."""
    plain, graphs, guard = CUDAGraphTransform(), GuardedCUDAGraphs(), FusionGuard()
    want = _steps(thunderfx(gated, transforms=[plain]), device="cuda")
    assert_same(_steps(thunderfx(gated, transforms=[guard, graphs]), device="cuda"), want)
    assert len(_graphs(graphs)) == 2
    assert {d.trace for d in guard.report.filter(action="capture")} == {"forward", "backward"}


@pytest.mark.cuda
def test_thunders_transform_beside_the_guard_runs_as_given_on_cuda():
    """Real captures: Thunder's own transform beside the guard captures as unguarded (its grouping, its values),
    and the guard only recommends ``GuardedCUDAGraphs``."""
    plain, graphs, guard = CUDAGraphTransform(), CUDAGraphTransform(), FusionGuard()
    want = _steps(thunderfx(gated, transforms=[plain]), device="cuda")
    assert_same(_steps(thunderfx(gated, transforms=[guard, graphs]), device="cuda"), want)
    assert type(graphs) is CUDAGraphTransform and len(_graphs(graphs)) == len(_graphs(plain))
    assert [d.code for d in guard.report.filter(action="capture")] == ["cuda_graphs_recommended"]


@pytest.mark.cuda
def test_a_cuda_graph_that_writes_an_input_writes_the_callers_tensor_on_cuda():
    """A real capture: the graph's own copy of ``z`` is written, then copied back into the caller's ``z``."""
    guard, graphs = FusionGuard(), GuardedCUDAGraphs()
    compiled = thunder.jit(bump, transforms=[guard, graphs])
    for seed in range(3):
        torch.manual_seed(seed)
        z, y = torch.zeros(8, 4, device="cuda"), torch.randn(8, 4, device="cuda")
        out = compiled(z, y)
        assert torch.equal(z, y) and torch.equal(out, 2 * y)
    assert guard.report.filter(action="capture")[0].details["copied_back"] == ["z"]  # y is only read


class Mlp(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up, self.down = torch.nn.Linear(16, 32), torch.nn.Linear(32, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.tanh(self.up(x)))


def _train(compiled, model: torch.nn.Module, steps: int = 3, zero: bool = True, keep: list | None = None) -> list:
    """The parameters' gradients after each of ``steps`` backward passes (set to None before each where ``zero``,
    accumulated otherwise), cloned; ``keep`` gets a view of the first parameter's ``.grad`` at each step."""
    got = []
    device = next(model.parameters()).device
    for seed in range(steps):
        torch.manual_seed(seed)
        x = torch.randn(8, 16, device=device)
        if zero:
            model.zero_grad(set_to_none=True)
        compiled(x).square().sum().backward()
        if keep is not None:
            keep.append(next(model.parameters()).grad.view(-1))
        got += [p.grad.clone() for p in model.parameters()]
    return got


def _unguarded(steps: int = 3, zero: bool = True, device: str = "cpu") -> list:
    torch.manual_seed(0)
    model = Mlp().to(device)
    return _train(thunder.jit(model, transforms=[CUDAGraphTransform()]), model, steps, zero)


def _static_outputs(graphs: CUDAGraphTransform) -> set[int]:
    """The addresses of every static output of every graph the transform's runner holds now."""
    entries = graphs.cuda_graph_runner.cuda_graph_cache.values()
    return {t.data_ptr() for _, _, outs in entries for t in outs if isinstance(t, torch.Tensor)}


def test_gradients_are_handed_to_autograd_on_the_graphs_buffers(cpu_graphs):
    """Autograd copies a gradient another tensor holds (the runner holds its static outputs) before it becomes a
    ``.grad``: handed on a tensor of their own, the gradients are the graph's buffers themselves, Thunder's values."""
    torch.manual_seed(0)
    model = Mlp()
    guard, graphs = FusionGuard(), GuardedCUDAGraphs()
    compiled = thunder.jit(model, transforms=[guard, graphs])
    assert_same(_train(compiled, model), _unguarded())
    assert {p.grad.data_ptr() for p in model.parameters()} <= _static_outputs(graphs)
    (forward,) = guard.report.filter(action="capture", trace="forward")
    (backward,) = guard.report.filter(action="capture", trace="backward")
    assert len(backward.details["handed_over"]) == 4 and not forward.details["handed_over"]
    assert backward.details["bytes_handed_over"] == sum(p.numel() * p.element_size() for p in model.parameters())
    assert (backward.code, backward.facts["handed_over"]) == ("captured", 4) and not forward.facts["handed_over"]
    assert backward.facts["handed_over_bytes"] == backward.details["bytes_handed_over"]
    assert all(_reworded(d) for d in (forward, backward))

    plain = FusionGuard()
    graphs = GuardedCUDAGraphs(share_buffers=False)
    _train(thunder.jit(model, transforms=[plain, graphs]), model, steps=1)
    assert not {p.grad.data_ptr() for p in model.parameters()} & _static_outputs(graphs)  # copied, as in Thunder


def _reworded(d) -> bool:
    """``d``'s reason and explanation are what its code words its facts as."""
    reason, told = words(d.code, d.facts)
    return (reason, told.get("explanation")) == (d.reason, d.details.get("explanation"))


def _held(guard: FusionGuard) -> list:
    return [d for d in guard.report.filter(action="capture") if d.details.get("held")]


@pytest.mark.parametrize("steps", [4, 12])
def test_a_gradient_still_held_at_the_next_replay_is_not_overwritten(cpu_graphs, steps):
    """Accumulated into (no ``zero_grad``), a ``.grad`` handed over is still the graph's buffer when it would
    replay: the graph's ops run uncaptured while it is held, at most UNCAPTURED_WHILE_HELD calls in a row, then
    the graph is captured anew; the accumulation gives Thunder's values either way, and a decision says so."""
    torch.manual_seed(0)
    model = Mlp()
    guard, graphs = FusionGuard(), GuardedCUDAGraphs()
    compiled = thunder.jit(model, transforms=[guard, graphs])
    assert_same(_train(compiled, model, steps=steps, zero=False), _unguarded(steps=steps, zero=False))
    (held,) = _held(guard)
    assert held.trace == "backward" and len(held.details["held"]) == 4
    assert held.code == "capture_held" and held.facts["held"] == held.details["held"] and _reworded(held)
    assert held.details["captures"] == held.ops == [held.region] and held.region.startswith("CUDAGraph")
    grads = {p.grad.data_ptr() for p in model.parameters()}
    static = _static_outputs(graphs)
    # four steps: the first step's graph still holds the .grad (later calls ran uncaptured); twelve: captured anew
    assert (grads <= static) if steps - 1 <= th.UNCAPTURED_WHILE_HELD else not grads & static


def test_a_capture_that_runs_out_of_memory_leaves_that_graph_uncaptured_with_thunders_values(cpu_graphs, monkeypatch):
    """A capture (or its warm-up) that runs out of device memory: the step goes on with that graph's ops run
    uncaptured from then on (never captured again), the others captured as before; Thunder's values; a decision
    names the graph and the error."""
    _first_capture_out_of_memory(monkeypatch, "cpu")


@pytest.mark.cuda
def test_a_capture_that_runs_out_of_memory_on_cuda_leaves_that_graph_uncaptured(monkeypatch):
    """The same with real captures: the other graphs captured and replayed, Thunder's bits."""
    _first_capture_out_of_memory(monkeypatch, "cuda")


def _first_capture_out_of_memory(monkeypatch, device: str) -> None:
    from thunder.transforms.cudagraph import CUDAGraphRunner

    build, built, failed = CUDAGraphRunner.build_cuda_graph, [], []

    def first_build_out_of_memory(self, fn, args, static_args_mask):
        built.append(fn)
        if len(built) == 1:
            failed.append(fn)
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (a stand-in)")
        return build(self, fn, args, static_args_mask)

    monkeypatch.setattr(CUDAGraphRunner, "build_cuda_graph", first_build_out_of_memory)
    torch.manual_seed(0)
    model = Mlp().to(device)
    guard, graphs = FusionGuard(), GuardedCUDAGraphs()
    compiled = thunder.jit(model, transforms=[guard, graphs])
    got = _train(compiled, model, steps=3)
    monkeypatch.setattr(CUDAGraphRunner, "build_cuda_graph", build)
    assert_same(got, _unguarded(steps=3, device=device))
    (uncaptured,) = [d for d in guard.report.filter(action="capture") if d.details.get("uncaptured")]
    assert uncaptured.trace == "forward" and uncaptured.details["error_type"] == "OutOfMemoryError"
    assert uncaptured.region == uncaptured.details["uncaptured"] and uncaptured.region.startswith("CUDAGraph")
    assert uncaptured.code == "capture_uncaptured" and uncaptured.facts["name"] == uncaptured.region
    assert "Tried to allocate 2.00 GiB" in uncaptured.facts["error"] and _reworded(uncaptured)
    assert built.count(failed[0]) == 1, "the graph that ran out of memory is not captured again"
    assert len(set(map(id, built))) == len(_graphs(graphs)) >= 2, "every other graph is captured, once"


def test_strict_mode_raises_where_a_capture_runs_out_of_memory_and_never_falls_back(cpu_graphs, monkeypatch):
    """``strict=True``: the capture's memory error reaches the caller as ``FusionGuardError`` (the decision still
    records it) and the graph is not left to run uncaptured: the next call tries to capture it again."""
    from thunder.transforms.cudagraph import CUDAGraphRunner

    from thunder_fusion_guard.passes import FusionGuardError

    build, tried = CUDAGraphRunner.build_cuda_graph, []

    def out_of_memory(self, fn, args, static_args_mask):
        tried.append(fn)
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (a stand-in)")

    monkeypatch.setattr(CUDAGraphRunner, "build_cuda_graph", out_of_memory)
    model = Mlp()
    guard = FusionGuard(strict=True)
    compiled = thunder.jit(model, transforms=[guard, GuardedCUDAGraphs()])
    x = torch.randn(4, 16)
    for attempt in (1, 2):
        with pytest.raises(FusionGuardError, match="ran out of device memory") as raised:
            compiled(x)
        assert isinstance(raised.value.__cause__, torch.OutOfMemoryError)
        assert tried.count(tried[0]) == attempt, "captured anew at the next call, never run uncaptured"
    monkeypatch.setattr(CUDAGraphRunner, "build_cuda_graph", build)
    assert [d.details["error_type"] for d in guard.report.filter(action="capture") if d.details.get("uncaptured")]


def test_a_view_kept_of_a_gradient_keeps_its_values(cpu_graphs):
    """A view of a ``.grad`` kept across steps (its ``.grad`` set to None) holds the graph's buffer: the next calls
    run uncaptured and the view keeps the values it had."""
    torch.manual_seed(0)
    model = Mlp()
    kept: list[torch.Tensor] = []
    guard = FusionGuard()
    compiled = thunder.jit(model, transforms=[guard, GuardedCUDAGraphs()])
    got = _train(compiled, model, keep=kept)
    assert_same(got, _unguarded())
    assert_same([k.view_as(g) for k, g in zip(kept, got[::4], strict=True)], got[::4])
    assert len(_held(guard)) == 1


@pytest.mark.cuda
def test_gradients_handed_over_give_thunders_bits_on_cuda():
    """Real captures: the ``.grad`` of each parameter is the backward graph's buffer, with unguarded Thunder's bits
    whether set to None at each step or accumulated into (then run uncaptured while held)."""
    for zero in (True, False):
        torch.manual_seed(0)
        model = Mlp().cuda()
        guard, graphs = FusionGuard(), GuardedCUDAGraphs()
        compiled = thunder.jit(model, transforms=[guard, graphs])
        assert_same(_train(compiled, model, zero=zero), _unguarded(zero=zero, device="cuda"))
        handed = {p.grad.data_ptr() for p in model.parameters()} <= _static_outputs(graphs)
        assert (handed, len(_held(guard))) == ((True, 0) if zero else (True, 1))


def test_each_graph_is_warmed_up_apart_from_its_capture_stream(cpu_graphs, monkeypatch):
    """Each graph's calls before its capture run on a warm-up stream of GuardedCUDAGraphs' own, its capture on the
    runner's stream (so its matmuls take a cuBLAS workspace from the graph's own pool), and nothing else changes:
    Thunder's values, the capture decisions name the graphs, and a graph run uncaptured while its gradients are
    held runs on the caller's stream."""
    apart: list[str] = []

    def warm_up(fn, args):
        apart.append(fn.__name__)
        return fn(*args)

    monkeypatch.setattr(th.graph_calls, "_cuda", lambda: True)
    monkeypatch.setattr(th.graph_calls, "_on_warm_up_stream", warm_up)
    monkeypatch.setattr(th.graph_calls, "capturing_cuda_graph", lambda: False)
    torch.manual_seed(0)
    model = Mlp()
    guard = FusionGuard()
    compiled = thunder.jit(model, transforms=[guard, GuardedCUDAGraphs()])
    assert_same(_train(compiled, model, steps=3), _unguarded(steps=3))
    captures = guard.report.filter(action="capture")
    # GuardedCUDAGraphs replays by calling the graph's function, outside any capture: apart, as a warm-up is
    assert set(apart) == {name for d in captures for name in d.details["captures"]}
    for decision in captures:
        assert decision.details["own_workspace"] == decision.details["captures"]
    monkeypatch.setattr(th.graph_calls, "capturing_cuda_graph", lambda: True)
    apart.clear()
    assert_same(_train(thunder.jit(model, transforms=[FusionGuard(), GuardedCUDAGraphs()]), model), _unguarded())
    assert not apart  # captured calls stay on the capture stream


def test_a_runner_sharing_one_pool_is_left_as_it_was(monkeypatch):
    """A workspace allocated in a pool shared by several graphs could be another graph's too: the graph is left as
    Thunder made it; so it is without CUDA."""
    from types import SimpleNamespace

    def fn(x):
        return x

    runner = SimpleNamespace(mem_pool=[object()], python_callables={"CUDAGraph1": (fn, None)})
    monkeypatch.setattr(th.graph_calls, "_cuda", lambda: True)
    assert not th.own_blas_workspace(runner, "CUDAGraph1")
    assert runner.python_callables["CUDAGraph1"] == (fn, None)
    monkeypatch.setattr(th.graph_calls, "_cuda", lambda: False)
    runner.mem_pool = None
    assert not th.own_blas_workspace(runner, "CUDAGraph1")


def _runs_to_the_end(folder, script: str) -> None:
    """Run ``script`` in a Python process of its own (a CUDA error there ends only that process): it exits 0 and
    says it ran to the end."""
    import subprocess
    import sys

    path = folder / "script.py"
    path.write_text(script)
    done = subprocess.run([sys.executable, str(path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "ran to the end" in done.stdout


IN_TURN = """
import torch, thunder
from thunder.transforms.cudagraph import CUDAGraphTransform
from thunder_fusion_guard import FusionGuard, GuardedCUDAGraphs, enable_nvfuser_direct
enable_nvfuser_direct()  # unguarded Thunder's nvFuser regions on nvfuser_direct-only builds, as in the suite
torch.manual_seed(0)
model = torch.nn.Sequential(
    torch.nn.Linear(1024, 256), torch.nn.SiLU(), torch.nn.Linear(256, 1024), torch.nn.SiLU(), torch.nn.Linear(1024, 1)
).cuda()
first, second = {first}, {second}
def step(fn, x):
    model.zero_grad(set_to_none=True)
    loss = fn(x).square().mean()
    loss.backward()
    return [loss.detach().clone(), *(p.grad.clone() for p in model.parameters())]
for i in range(8):
    x = torch.randn(512, 1024, device="cuda", generator=torch.Generator("cuda").manual_seed(i))
    want = step({reference}, x)
    for fn in (first, second):
        torch.testing.assert_close(step(fn, x), want, {tolerance})
torch.cuda.synchronize()
print("ran to the end")
"""  # two compiled forms of one module stepped in turn, each against a reference, in a process of its own
GUARDED = "thunder.jit(model, transforms=[FusionGuard(), GuardedCUDAGraphs()])"


@pytest.mark.cuda
def test_inductors_cuda_graphs_and_the_guards_run_side_by_side_on_one_module(tmp_path):
    """torch.compile's reduce-overhead mode and guarded Thunder with CUDA graphs on one module in one process,
    Thunder's graphs captured first and then Inductor's (which clear cuBLAS's workspaces), stepped in turn: each
    gives eager's loss and gradients, to the end. Unguarded, the same script ends in an illegal memory access on
    an H200 (torch 2.11, thunder 0.2.6), so it runs in a process of its own."""
    inductor = 'torch.compile(model, mode="reduce-overhead")'
    script = IN_TURN.format(first=GUARDED, second=inductor, reference="model", tolerance="rtol=1e-3, atol=1e-4")
    _runs_to_the_end(tmp_path, script)


def test_an_input_in_another_layout_gets_a_capture_of_its_own(cpu_graphs):
    """The same shapes in other strides (a transposed copy): the graph is captured again for that layout, as
    Thunder's runner keys its captures, and each layout gets its own values at every later call."""

    def scaled(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x * 2) @ w

    graphs = GuardedCUDAGraphs()
    compiled = thunder.jit(scaled, transforms=[FusionGuard(), graphs])
    torch.manual_seed(0)
    w = torch.randn(8, 8)
    for _ in range(2):
        for x in (torch.randn(8, 8), torch.randn(8, 8).t()):
            assert_same([compiled(x, w)], [thunder.jit(scaled)(x, w)])
    assert len(graphs.cuda_graph_runner.cuda_graph_cache) == 2


@pytest.mark.cuda
def test_the_guards_graphs_leave_unguarded_thunders_graphs_in_the_same_process_alone(tmp_path):
    """Unguarded Thunder with CUDA graphs captured first, then guarded Thunder's on the same module, stepped in
    turn: the guard frees nothing the unguarded graphs use (clearing cuBLAS's workspaces did), and its values are
    the unguarded ones, to the end."""
    unguarded = "thunder.jit(model, transforms=[CUDAGraphTransform()])"
    script = IN_TURN.format(first=unguarded, second=GUARDED, reference="first", tolerance="rtol=0, atol=0")
    _runs_to_the_end(tmp_path, script)


def test_collectives_and_their_waits_run_between_graphs(cpu_graphs, one_rank):
    """A graph never holds a collective or its wait: one launched outside a graph that waits for it cannot be
    captured (an FSDP all-gather, then its wait in the next graph, fails the capture on CUDA). The ops around
    them are still captured, and the values are those of the same program without graphs."""
    import thunder.distributed.prims as dist_prims

    def f(x, w):
        y = dist_prims.wait(dist_prims.all_reduce(w * 2, dist_prims.DistributedReduceOps.SUM, one_rank, True))
        return (x.sin() * 2 + y.reshape(4, 4)).cos()

    args = (torch.randn(4, 4), torch.randn(2, 8))
    want = thunder.jit(f)(*args)
    for graphs in (GuardedCUDAGraphs(), GuardedCUDAGraphs(share_buffers=False)):
        jitted = thunder.jit(f, transforms=[FusionGuard(), graphs])
        assert_same([jitted(*args), jitted(*args)], [want, want])
        captured = [b for bsyms, _, _ in graphs.cuda_graph_runner.trace_symbols.values() for b in bsyms]
        assert {"mul", "sin", "cos"} <= {b.sym.name for b in captured}
        assert not [b.sym.name for b in captured if "prim_impl" in b.sym.name or th.is_distributed_prim(b)]
        top = [b.sym.name for b in thunder.last_traces(jitted)[-1].bound_symbols]
        assert "torch_all_reduce_prim_impl" in top and "torch_wait_prim_impl" in top


def test_thunders_fsdp_captures_each_graph_once_with_the_uncaptured_values(cpu_graphs, one_rank, monkeypatch):
    """Under Thunder's FSDP each parameter's all-gather returns a future that a wait ends and a deletion frees: a
    graph holding that deletion would take the future as an input, a new one at each call, so every step would
    capture its graphs again (and a backward graph would read the buffers of another capture: on CUDA the second
    step failed). The deletion runs between graphs: one capture per graph, the uncaptured steps' values."""
    import thunder.distributed

    monkeypatch.setenv("LOCAL_RANK", "0")

    def train(transforms):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 8))
        fn = thunder.distributed.fsdp(thunder.jit(model, transforms=transforms), device=torch.device("cpu"))
        opt = torch.optim.SGD(fn.parameters(), lr=0.1)
        got = []
        for seed in range(3):
            x = torch.randn(4, 16, generator=torch.Generator().manual_seed(seed))
            opt.zero_grad(set_to_none=True)
            loss = fn(x).square().mean()
            loss.backward()
            got += [loss.detach().clone(), *(p.grad.clone() for p in fn.parameters())]
            opt.step()
        return got

    want = train([FusionGuard()])
    graphs = GuardedCUDAGraphs()
    assert_same(train([FusionGuard(), graphs]), want)
    made = _graphs(graphs)
    assert made and len(graphs.cuda_graph_runner.cuda_graph_cache) == len(made)  # none captured twice
    inputs = [i for _, i, _ in graphs.cuda_graph_runner.trace_symbols.values()]
    assert not [p.name for i in inputs for p in i if "Future" in type(p).__name__]


def _a_deletion_moved_before_a_read(trace, merge):
    """A grouping as Thunder's dataflow grouping gave ThunderFX + DDP on CUDA: each op its own group, with one
    deletion of a single value moved up to right after the op that makes it, before an op that reads it."""
    from thunder.core import prims

    bsyms = list(trace.bound_symbols)
    made = {o.name: i for i, b in enumerate(bsyms) for o in b.flat_outs if isinstance(o, th.Proxy)}
    for i, b in enumerate(bsyms):
        names = [a.name for a in b.flat_args if isinstance(a, th.Proxy)]
        if b.sym.id is not prims.PrimIDs.DEL or len(names) != 1 or names[0] not in made:
            continue
        j = made[names[0]]
        if any(names[0] in {a.name for a in r.flat_args if isinstance(a, th.Proxy)} for r in bsyms[j + 1 : i]):
            bsyms.insert(j + 1, bsyms.pop(i))
            break
    return [[b] for b in bsyms]


def test_unshared_graphs_are_grouped_by_consecutive_runs_where_thunders_grouping_reads_a_deleted_value(
    cpu_graphs, monkeypatch
):
    """``share_buffers=False`` takes Thunder's grouping, which reorders the trace; where the order it gives reads a
    value after deleting it (UnboundLocalError: ThunderFX + DDP on CUDA, Thunder's own transform too), the trace
    is grouped by consecutive runs instead, with Thunder's copies, and the capture decision names the values."""
    import thunder.transforms.cudagraph as thunders

    torch._dynamo.reset()  # this file compiles ``gated`` often: past Dynamo's recompile limit it would run eagerly
    want = _steps(thunderfx(gated, transforms=[FusionGuard()]))
    monkeypatch.setattr(thunders, "fuse_bound_symbols", _a_deletion_moved_before_a_read)
    with pytest.raises(UnboundLocalError):  # Thunder's transform runs the trace its grouping gives
        _steps(thunderfx(gated, transforms=[CUDAGraphTransform()]))

    guard, graphs = FusionGuard(), GuardedCUDAGraphs(share_buffers=False)
    compiled = thunderfx(gated, transforms=[guard, graphs])
    assert_same(_steps(compiled), want)
    assert _graphs(graphs)  # captured, in consecutive runs
    regrouped = [d.details["regrouped"] for d in guard.report.filter(action="capture")]
    assert any(regrouped) and all(isinstance(names, list) for names in regrouped)
    assert not guard.report.filter(action="rescue")  # nothing fell back: the graphs run Thunder's values
    for fn in compiled._backend.subgraph_infos[0].thunder_compiled_fns:
        for trace in (thunder.last_traces(fn)[-1], thunder.last_backward_traces(fn)[-1]):
            assert not th.unbound_reads(trace)


def _moving(compiled, model: torch.nn.Module, steps: int = 3, device: str = "cpu") -> list:
    """Loss and gradients of ``steps`` steps; before each after the first, every parameter moves to new memory with
    new values (``.data`` anew, as FSDP2 allocates its unsharded parameters each step)."""
    got = []
    for seed in range(steps):
        if seed:
            for p in model.parameters():
                p.data = p.data * 1.5
        torch.manual_seed(seed)
        model.zero_grad(set_to_none=True)
        loss = compiled(torch.randn(8, 16, device=device)).square().sum()
        loss.backward()
        got += [loss.detach().clone(), *(p.grad.clone() for p in model.parameters())]
    return got


def _against_thunder_without_graphs(
    steps, device: str = "cpu", module: type[torch.nn.Module] = Mlp
) -> tuple[FusionGuard, GuardedCUDAGraphs]:
    """``steps(compiled, model)`` guarded with ``GuardedCUDAGraphs`` and under unguarded Thunder without graphs, each
    on its own ``module`` (``Mlp``) of the same weights: the same bits. The guard and the transform, to read what they
    did."""
    torch.manual_seed(0)
    model = module().to(device)
    guard, graphs = FusionGuard(), GuardedCUDAGraphs()
    got = steps(thunder.jit(model, transforms=[guard, graphs]), model, device=device)
    torch.manual_seed(0)
    plain = module().to(device)
    assert_same(got, steps(thunder.jit(plain), plain, device=device))
    return guard, graphs


def test_a_graph_whose_parameters_moved_is_captured_anew_with_them_copied_in(cpu_graphs):
    """A captured graph reads a parameter at the memory it had when captured: where the parameter lies elsewhere at
    a later call (FSDP2's unsharded parameters), each graph reading it is captured anew with it copied in, and the
    values are unguarded Thunder's without graphs, step after step; a decision per graph names the inputs."""
    guard, _ = _against_thunder_without_graphs(_moving)
    moved = guard.report.filter(code="capture_moved")
    assert {d.trace for d in moved} == {"forward", "backward"} and len(moved) == 2, "captured anew once, then copied"
    forward = next(d for d in moved if d.trace == "forward")
    assert len(forward.facts["moved_inputs"]) == 4 and forward.facts["moved_inputs"] == forward.details["moved_inputs"]
    assert (
        not forward.facts["writes_moved"]
        and "uncaptured" not in forward.details
        and forward.region.startswith("CUDAGraph")
        and _reworded(forward)
    )


def test_a_graph_that_writes_an_input_that_moved_runs_uncaptured(cpu_graphs):
    """A graph that writes an input it reads in place: once that input moved, a copy in would leave the caller's
    tensor unwritten, so the graph's ops run uncaptured on the arguments, and it is said."""
    from thunder.transforms.cudagraph import CUDAGraphRunner

    from thunder_fusion_guard._thunder.graph_calls import GraphCall

    runner = CUDAGraphRunner()
    runner.python_callables["G"] = (lambda w, x: (w.add_(x) * 2,), (True, False))
    call, told = GraphCall(runner, "G"), []
    call.input_names, call.written = ["w", "x"], frozenset({0})
    call.on_moved = lambda name, names, uncaptured: told.append((name, names, uncaptured))
    w, x = torch.zeros(4), torch.ones(4)
    call(w, x)  # captured (the stand-in's capture runs the ops too, as Thunder's warm-up does)
    assert told == [] and call.pinned
    w.data = torch.full((4,), 10.0)
    (out,) = call(w, x)
    assert told == [("G", ["w"], True)] and call.uncaptured is not None
    assert torch.equal(w, torch.full((4,), 11.0)) and torch.equal(out, torch.full((4,), 22.0))


def _twice(compiled, model: torch.nn.Module, steps: int = 3, device: str = "cpu") -> list:
    """Loss and gradients of ``steps`` steps, each calling the compiled model twice before one backward (one
    compiled block run for two blocks, as ThunderFX runs each block under FSDP2)."""
    got = []
    for seed in range(steps):
        torch.manual_seed(seed)
        model.zero_grad(set_to_none=True)
        x, y = torch.randn(8, 16, device=device), torch.randn(8, 16, device=device)
        loss = compiled(x).square().sum() + compiled(y).tanh().sum()
        loss.backward()
        got += [loss.detach().clone(), *(p.grad.clone() for p in model.parameters())]
    return got


def test_a_forward_run_again_before_its_backward_runs_uncaptured_with_thunders_values(cpu_graphs):
    """A replay writes a graph's outputs into the same buffers: a forward called again before the backward of its
    earlier call would overwrite what autograd holds for that backward. From the second call on, the graphs of
    that forward and its backward run uncaptured: unguarded Thunder's values over three steps, one decision."""
    guard, graphs = _against_thunder_without_graphs(_twice)
    (reentered,) = guard.report.filter(code="capture_reentered")
    (forward,) = guard.report.filter(code="captured", trace="forward")
    assert reentered.trace == "forward" and reentered.region == forward.details["captures"][0] and _reworded(reentered)
    assert reentered.details["uncaptured"] == reentered.region
    assert not graphs.cuda_graph_runner.cuda_graph_cache, "every capture dropped: both traces run uncaptured"


def test_a_forward_and_its_backward_in_turn_stay_captured(cpu_graphs):
    """Forward, backward, forward, backward: each forward replays after the backward of the one before; nothing
    runs uncaptured and nothing is said."""
    torch.manual_seed(0)
    model = Mlp()
    guard, graphs = FusionGuard(), GuardedCUDAGraphs()
    _train(thunder.jit(model, transforms=[guard, graphs]), model, steps=4)
    assert not guard.report.filter(code="capture_reentered") and len(graphs.cuda_graph_runner.cuda_graph_cache) == 2


@pytest.mark.cuda
@pytest.mark.parametrize("steps", [_moving, _twice], ids=["parameters-moved", "forward-run-again"])
def test_moved_parameters_and_a_forward_run_again_give_thunders_bits_on_cuda(steps):
    """Real captures read the memory they were captured with and replay into the same buffers: with parameters that
    moved, and with a forward run again before its backward, the steps keep unguarded Thunder's bits, each said."""
    guard, _ = _against_thunder_without_graphs(steps, device="cuda")
    code = "capture_moved" if steps is _moving else "capture_reentered"
    assert guard.report.filter(code=code)


class Scaled(torch.nn.Module):
    """One op forward (no graph to capture there), a backward of several."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(8, 16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.weight


def _shared_input(compiled, model: torch.nn.Module, steps: int = 3, device: str = "cpu") -> list:
    """Loss and gradients of ``steps`` steps, each calling the compiled model twice on one intermediate before one
    backward: autograd holds the gradient the first backward call returns for that intermediate until the second
    one's arrives (one compiled block run for several blocks)."""
    got = []
    for seed in range(steps):
        torch.manual_seed(seed)
        model.zero_grad(set_to_none=True)
        x = torch.randn(8, 16, device=device, requires_grad=True)
        h = x.sin()
        loss = compiled(h).square().sum() + compiled(h).tanh().sum()
        loss.backward()
        got += [loss.detach().clone(), x.grad.clone(), *(p.grad.clone() for p in model.parameters())]
    return got


def test_a_backward_run_twice_in_one_backward_pass_runs_uncaptured_with_thunders_values(cpu_graphs):
    """A forward with nothing to capture gives no sign of being run for two blocks; its backward graph then runs twice
    in one backward pass, and a replay would overwrite the gradient its first call returned while autograd still
    holds it (summed with the second's). From the second call on, the graphs run uncaptured: unguarded Thunder's
    values step after step, one decision naming the backward graph."""
    guard, graphs = _against_thunder_without_graphs(_shared_input, module=Scaled)
    (reentered,) = guard.report.filter(code="capture_reentered")
    (backward,) = guard.report.filter(code="captured", trace="backward")
    (forward,) = guard.report.filter(code="captured", trace="forward")
    assert forward.details["captures"] == [], "the forward is one op: nothing captured"
    assert reentered.region == backward.details["captures"][0] and reentered.facts["in_backward"]
    assert _reworded(reentered) and not graphs.cuda_graph_runner.cuda_graph_cache


@pytest.mark.cuda
def test_a_backward_run_twice_in_one_backward_pass_gives_thunders_bits_on_cuda():
    """The same on real captures: a replay writes the memory autograd still holds; uncaptured from the second call."""
    guard, _ = _against_thunder_without_graphs(_shared_input, device="cuda", module=Scaled)
    assert [d.facts["in_backward"] for d in guard.report.filter(code="capture_reentered")] == [True]


@pytest.mark.parametrize("steps, module", [(_twice, Mlp), (_shared_input, Scaled)], ids=["forward", "backward"])
def test_without_sharing_a_program_run_again_runs_uncaptured_with_thunders_values(cpu_graphs, steps, module):
    """Thunder's grouping and copies (``share_buffers=False``) replay over outputs autograd still holds as Thunder's
    runner does (a version-counter error, or other values without one): its graphs are called as the shared ones
    are, so a forward run again before its backward, or a backward graph run twice in one backward pass, runs
    uncaptured from then on, recorded: unguarded Thunder's values."""
    torch.manual_seed(0)
    model = module()
    guard = FusionGuard()
    got = steps(thunder.jit(model, transforms=[guard, GuardedCUDAGraphs(share_buffers=False)]), model)
    torch.manual_seed(0)
    plain = module()
    assert_same(got, steps(thunder.jit(plain), plain))
    (reentered,) = guard.report.filter(code="capture_reentered")
    assert reentered.facts["in_backward"] == (steps is _shared_input) and _reworded(reentered)
