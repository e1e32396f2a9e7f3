"""capture_step: a whole step in one CUDA graph. On CPU the CUDA calls are stood in for (a replay that runs
nothing), so what is checked there is the wrapper's own work: the warm-up, the gradients handed back, the fallback;
the CUDA test compares real replays with the guarded step run uncaptured, bit for bit."""

from __future__ import annotations

import contextlib

import pytest
import torch

from thunder_fusion_guard import FusionGuard, capture_step
from thunder_fusion_guard import step_graph as sg
from thunder_fusion_guard.replays import will_be_captured


class _Graph:
    replays = 0

    def replay(self) -> None:
        _Graph.replays += 1


@pytest.fixture
def fake_cuda(monkeypatch):
    """torch.cuda as capture_step uses it, on CPU: streams that do nothing, a capture that runs the step once."""
    state = {}  # "fail": the step's capture fails; "graphs": captures begun

    @contextlib.contextmanager
    def graph(g):
        state["graphs"] = state.get("graphs", 0) + 1
        yield
        if state.get("fail") and state["graphs"] == 1:
            raise RuntimeError("operation not permitted when stream is capturing\nmore")

    class Stream:
        def wait_stream(self, other):
            pass

    monkeypatch.setattr(sg.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(sg.torch.cuda, "Stream", Stream)
    monkeypatch.setattr(sg.torch.cuda, "current_stream", Stream)
    monkeypatch.setattr(sg.torch.cuda, "stream", lambda s: contextlib.nullcontext())
    monkeypatch.setattr(sg.torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(sg.torch.cuda, "CUDAGraph", _Graph)
    monkeypatch.setattr(sg, "_one_kernel", lambda: None)
    monkeypatch.setattr(sg.torch.cuda, "graph", graph)
    _Graph.replays = 0
    return state


def _model_step():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    x = torch.randn(3, 4)
    calls = []

    def step():
        calls.append(1)
        for p in model.parameters():
            p.grad = None
        loss = model(x).square().sum()
        loss.backward()
        return loss

    return model, step, calls


def test_the_step_is_warmed_up_then_captured_and_replays_hand_the_gradients_back(fake_cuda):
    model, step, calls = _model_step()
    captured = capture_step(step, grads_of=model.parameters(), warmup=2)
    assert captured.captured and len(calls) == 3 and fake_cuda["graphs"] == 1  # two warm-ups and the capture
    grads = [p.grad for p in model.parameters()]
    model.zero_grad(set_to_none=True)  # between replays: the replay writes the same tensors again
    out = captured()
    assert len(calls) == 3 and _Graph.replays == 1  # the step's Python did not run
    assert out is captured.outputs and all(p.grad is g for p, g in zip(model.parameters(), grads, strict=True))


def test_what_the_warm_up_compiles_is_told_it_will_be_captured(fake_cuda):
    """The guard decides a step compiled during the warm-up on device time: the warm-up steps run inside
    ``warming_up_for_capture``; the capture, the replays and anything after do not."""
    model, step, _ = _model_step()
    seen = []

    def asking():
        seen.append(will_be_captured())
        return step()

    captured = capture_step(asking, grads_of=model.parameters(), warmup=2)
    assert seen == [True, True, False] and not will_be_captured()
    captured()
    assert seen == [True, True, False]


def test_a_step_that_cannot_be_captured_runs_as_it_is_and_says_why(fake_cuda):
    fake_cuda["fail"] = True
    model, step, calls = _model_step()
    with pytest.warns(RuntimeWarning, match="capture failed: RuntimeError: operation not permitted"):
        captured = capture_step(step, grads_of=model.parameters())
    assert not captured.captured and "more" not in captured.reason
    assert fake_cuda["graphs"] == 2  # the failed one, and one that ends the random generators' capture
    before = len(calls)
    captured()
    assert len(calls) == before + 1 and _Graph.replays == 0


def test_without_cuda_the_step_runs_as_it_is(monkeypatch):
    monkeypatch.setattr(sg.torch.cuda, "is_available", lambda: False)
    model, step, calls = _model_step()
    with pytest.warns(RuntimeWarning, match="no CUDA device"):
        captured = capture_step(step, grads_of=model.parameters())
    assert not calls  # nothing runs before the first call
    loss = captured()
    assert len(calls) == 1 and loss.ndim == 0 and all(p.grad is not None for p in model.parameters())


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"warmup": 0}, ValueError, "warmup must be an int >= 1"),
        ({"warmup": True}, ValueError, "warmup"),
        ({"grads_of": [1.0]}, TypeError, "grads_of must hold tensors"),
        ({"wramup": 2}, TypeError, "wramup"),
    ],
)
def test_bad_arguments_are_refused_in_one_line(kwargs, error, match):
    with pytest.raises(error, match=match):
        capture_step(lambda: None, **kwargs)
    with pytest.raises(TypeError, match="step must be callable"):
        capture_step(None)


@pytest.mark.cuda
def test_a_captured_guarded_step_gives_the_uncaptured_steps_bits_on_cuda():
    """Guarded ThunderFX (nvFuser regions, cuBLAS), the whole step captured: at every replay, inputs refilled in
    place, the loss and every gradient equal the same step run uncaptured, bit for bit, in bf16."""
    from thunder.dynamo import thunderfx

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 64))
    model = model.to("cuda", torch.bfloat16)
    compiled = thunderfx(model, transforms=[FusionGuard()])
    x = torch.randn(32, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    leaves = [*model.parameters(), x]

    def step():
        for t in leaves:
            t.grad = None
        loss = compiled(x).float().square().mean()
        loss.backward()
        return loss

    captured = capture_step(step, grads_of=leaves)
    assert captured.captured, captured.reason
    for seed in range(3):
        torch.manual_seed(seed)
        with torch.no_grad():
            x.copy_(torch.randn_like(x))
        loss = captured().clone()
        got = [loss, *(t.grad.clone() for t in leaves)]
        want = [step().detach(), *(t.grad for t in leaves)]
        assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))  # the next replay hands its own back


@pytest.mark.cuda
def test_a_step_whose_earlier_graph_is_still_held_runs_uncaptured_and_says_what_to_keep_on_cuda():
    """An earlier step's loss kept with its autograd graph keeps the parameters' gradient accumulators, made on the
    default stream: the captured backward would accumulate there. The step runs uncaptured, its values unchanged,
    and the warning says to keep loss.detach() or loss.item()."""
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 16).to("cuda")
    x = torch.randn(8, 16, device="cuda")

    def step():
        model.zero_grad(set_to_none=True)
        loss = model(x).square().sum()
        loss.backward()
        return loss

    held = step()  # with its graph
    with pytest.warns(RuntimeWarning, match=r"legacy stream.*loss\.detach\(\)"):
        captured = capture_step(step, grads_of=model.parameters())
    assert not captured.captured and held.grad_fn is not None
    assert torch.equal(captured(), step())
    torch.randn(4, device="cuda")  # the random generator is out of capture mode again


@pytest.mark.cuda
def test_a_captured_step_with_its_optimizer_step_gives_the_uncaptured_steps_bits_on_cuda():
    """Forward, backward and Adam's update (``capturable=True``) captured whole, guarded ThunderFX in bf16: after the
    warm-up's real steps and three replays, every parameter equals that of the same steps run uncaptured on a copy
    of the model, bit for bit."""
    import copy

    from thunder.dynamo import thunderfx

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 64))
    model = model.to("cuda", torch.bfloat16)
    twin = copy.deepcopy(model)
    initial = [p.detach().clone() for p in model.parameters()]
    x = torch.randn(32, 64, device="cuda", dtype=torch.bfloat16)

    def training(module):
        compiled = thunderfx(module, transforms=[FusionGuard()])
        optimizer = torch.optim.Adam(module.parameters(), lr=1e-2, capturable=True)

        def step():
            optimizer.zero_grad(set_to_none=True)
            loss = compiled(x).float().square().mean()
            loss.backward()
            optimizer.step()
            return loss.detach()

        return step

    captured = capture_step(training(model), grads_of=model.parameters(), warmup=3)
    assert captured.captured, captured.reason
    for _ in range(3):
        captured()
    uncaptured = training(twin)
    for _ in range(3 + 3):
        uncaptured()
    torch.cuda.synchronize()
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), twin.parameters(), strict=True))
    assert not any(torch.equal(a, b) for a, b in zip(model.parameters(), initial, strict=True))  # they were trained
