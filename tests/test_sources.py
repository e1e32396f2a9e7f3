"""Where the user wrote what the guard decided: every decision's ``details["source"]`` is the user's frame (the
first outside torch, Thunder and this package: the line calling an ``nn.Linear``, not ``torch/nn/modules``),
under ``thunder.jit`` and ThunderFX, and names the decision (``Decision.name``)."""

import inspect

import pytest
import torch
from helpers import jit_cpu
from test_hoist import mask_loop
from thunder.dynamo import thunderfx

from thunder_fusion_guard import FusionGuard, fusion_executors, why_not_fused
from thunder_fusion_guard import _thunder as th
from thunder_fusion_guard._thunder import is_fusion, stack_trace_source

# The subject is not the code Inductor generates: regions run uncompiled (helpers.without_inductor).
pytestmark = pytest.mark.usefixtures("no_inductor_module")


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x):
        h = self.fc(x)  # the line every source of the linear must name
        return torch.nn.functional.gelu(h) * 2


LINE = next(i for i, text in enumerate(inspect.getsource(Block).splitlines()) if "self.fc(x)" in text)
HERE = f"{__file__}:{inspect.getsourcelines(Block)[1] + LINE}"


def _forward_region(guard):
    (d,) = [d for d in guard.report if d.about_region and d.trace == "forward"]
    return d


def test_a_regions_source_is_the_users_line_under_thunder_jit():
    guard = FusionGuard()
    jit_cpu(Block(), guard)(torch.randn(4, 8, requires_grad=True)).sum().backward()
    d = _forward_region(guard)
    assert d.ops[0] == "linear" and d.details["source"] == HERE
    assert d.name.startswith(f"test_sources.py:{HERE.rsplit(':', 1)[1]}: linear")
    assert not [x for x in guard.report if "torch/nn/modules" in x.details.get("source", "")]


def test_a_regions_source_is_the_users_line_under_thunderfx():
    guard = FusionGuard()
    compiled = thunderfx(Block(), executors=fusion_executors("cpu"), transforms=[guard])
    compiled(torch.randn(4, 8))
    assert _forward_region(guard).details["source"] == HERE


def test_op_decisions_are_named_by_the_users_line_too():
    guard = FusionGuard()
    jit_cpu(mask_loop, guard)(torch.randn(2, 8, 8))
    hoisted = [d for d in guard.report if d.action == "hoist"]
    assert hoisted and all("test_hoist.py:" in d.details.get("source", "") for d in hoisted)
    assert all(d.name.startswith("test_hoist.py:") for d in hoisted)


def test_a_recorded_stack_names_the_users_frame_not_torchs():
    """A torch.fx node's stack (outermost first), as Dynamo records it: the user's frame is the last outside
    torch, Thunder and this package."""
    stack = (
        '  File "/home/user/model.py", line 40, in forward\n    h = self.fc(x)\n'
        f'  File "{torch.nn.modules.linear.__file__}", line 134, in forward\n    return F.linear(x, w, b)\n'
    )
    assert stack_trace_source(stack) == "/home/user/model.py:40"
    assert stack_trace_source("") is None


def _sequential():
    """A model built of torch's modules alone: no line of it is the user's but the one that built it."""
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU(), torch.nn.Linear(8, 8))


def _sources(guard, rows) -> list[str]:
    """Every source a report and why_not_fused's rows show."""
    return [d.details.get("source") or d.region for d in guard.report] + [r.source for r in rows if r.source]


def _trained_once(model: torch.nn.Module, frontend: str, guard: FusionGuard):
    """``model`` compiled on CPU with ``guard`` through ``frontend`` (thunder.jit or ThunderFX), after one forward and
    backward of a 4x8 input."""
    if frontend == "thunder.jit":
        compiled = jit_cpu(model, guard)
    else:
        compiled = thunderfx(model, executors=fusion_executors("cpu"), transforms=[guard])
    compiled(torch.randn(4, 8, requires_grad=True)).sum().backward()
    return compiled


@pytest.mark.parametrize("frontend", ["thunder.jit", "thunderfx"])
def test_a_model_of_torchs_modules_alone_is_named_by_its_modules_not_torchs_files(frontend):
    """With no line of the user's in the forward (an ``nn.Sequential``), a region is named by the module of
    the model that made it (``model.0 (Linear)``), never by torch's files (``linear.py:134``, ``activation.py:816``)
    or Dynamo's generated program (``<eval_with_key>.4:5``)."""
    guard = FusionGuard()
    compiled = _trained_once(_sequential(), frontend, guard)
    forward = _forward_region(guard)
    assert forward.ops[0] == "linear" and forward.details["source"] == "model.0 (Linear)", forward.details
    assert forward.name.startswith("model.0 (Linear): linear")
    shown = _sources(guard, why_not_fused(compiled).rows)
    assert all(s.startswith("model") for s in shown), shown
    assert "model.1 (GELU)" in shown, shown


class GeluBlock(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc, self.act = torch.nn.Linear(8, 8), torch.nn.GELU()

    def forward(self, x):
        return self.act(self.fc(x)) * 2  # the line every source must name


GELU_LINE = f"{__file__}:{inspect.getsourcelines(GeluBlock.forward)[1] + 1}"


@pytest.mark.parametrize("frontend", ["thunder.jit", "thunderfx"])
def test_every_decision_and_row_of_a_user_module_names_the_users_line(frontend):
    """nn.Linear and nn.GELU (ops from torch's module files): every decision and why_not_fused row names the line
    of the user's forward, under thunder.jit and ThunderFX."""
    guard = FusionGuard()
    compiled = _trained_once(GeluBlock(), frontend, guard)
    shown = _sources(guard, why_not_fused(compiled).rows)
    assert shown and set(shown) == {GELU_LINE}, shown


def _library_line(cls, text: str) -> str:
    """``file:line`` of the line of ``cls``'s source that holds ``text``."""
    lines, first = inspect.getsourcelines(cls)
    return f"{inspect.getsourcefile(cls)}:{first + next(i for i, t in enumerate(lines) if text in t)}"


class WrapsALibraryModule(torch.nn.Module):
    """The user's module around a Hugging Face transformers module (an installed library's code, not the user's)."""

    def __init__(self):
        super().__init__()
        from transformers import GPTBigCodeConfig
        from transformers.models.gpt_bigcode.modeling_gpt_bigcode import GPTBigCodeMLP

        torch.manual_seed(0)
        self.mlp = GPTBigCodeMLP(16, GPTBigCodeConfig(n_embd=8, resid_pdrop=0.0))

    def forward(self, x):
        return self.mlp(x) * 2  # the user's line of every op of the MLP


@pytest.mark.parametrize("frontend", ["thunder.jit", "thunderfx"])
def test_an_op_in_a_librarys_module_is_named_by_the_users_line_and_the_librarys_after_it(frontend):
    """An op written in transformers' file is named by the line of the user's forward that called the library's
    module, the library's line kept in parentheses after it (``model.py:42 (modeling_gpt_bigcode.py:253)``), under
    thunder.jit and ThunderFX; tables name both by file name."""
    from transformers.models.gpt_bigcode.modeling_gpt_bigcode import GPTBigCodeMLP

    guard = FusionGuard()
    _trained_once(WrapsALibraryModule(), frontend, guard)
    user = f"{__file__}:{inspect.getsourcelines(WrapsALibraryModule.forward)[1] + 1}"
    library = _library_line(GPTBigCodeMLP, "self.c_fc(hidden_states)")
    forward = _forward_region(guard)
    assert forward.ops[0] == "linear" and forward.details["source"] == f"{user} ({library})", forward.details
    short = f"test_sources.py:{user.rsplit(':', 1)[1]} (modeling_gpt_bigcode.py:{library.rsplit(':', 1)[1]})"
    assert forward.name.startswith(f"{short}: linear"), forward.name
    sources = [d.details.get("source") or d.region for d in guard.report]
    assert all(s.startswith(f"{user} (") and "site-packages" in s for s in sources), sources


def test_a_recorded_stack_keeps_an_installed_librarys_frame_beside_the_users():
    """Innermost first after the user's frame: the first frame of an installed library (not torch's) is kept
    after the user's line; without a line of the user's, the library's line alone."""
    library = "/venv/lib/python3.11/site-packages/transformers/models/gpt2/modeling_gpt2.py"
    torch_frame = f'  File "{torch.nn.modules.linear.__file__}", line 134, in forward\n    return F.linear(x, w, b)\n'
    stack = (
        '  File "/home/user/model.py", line 40, in forward\n    h = self.block(x)\n'
        f'  File "{library}", line 310, in forward\n    h = self.c_fc(h)\n' + torch_frame
    )
    assert stack_trace_source(stack) == f"/home/user/model.py:40 ({library}:310)"
    assert stack_trace_source(stack.split("\n", 2)[2]) == f"{library}:310"


class LinearThenRelu(torch.nn.Module):
    """Nothing of its forward is computed again in backward: its backward ops have no position of their own."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x):
        h = self.fc(x)  # the line of the linear's gradient (its matmuls)
        return (h * 3).relu()  # the line of the relu's and the mul's gradients


@pytest.mark.parametrize("frontend", ["thunder.jit", "thunderfx"])
def test_a_backward_region_and_its_ops_are_named_by_the_line_of_their_forward(frontend):
    """Each backward op knows the user's line of the forward op it is part of the gradient of: the linear's
    matmuls the line calling ``self.fc``, the relu's ``where`` the line of the relu; the backward region is named
    by a line of its forward, and Thunder prints the backward trace as before (no position comments)."""
    import thunder

    first = inspect.getsourcelines(LinearThenRelu.forward)[1]
    linear, relu = f"{__file__}:{first + 1}", f"{__file__}:{first + 2}"
    guard = FusionGuard()
    compiled = _trained_once(LinearThenRelu(), frontend, guard)
    (backward,) = [d for d in guard.report if d.about_region and d.trace == "backward"]
    assert backward.details.get("source") in (linear, relu), backward.details
    (jitted,) = [compiled] if frontend == "thunder.jit" else [s.jitted for s in th.thunderfx_subgraphs(compiled)]
    traces = thunder.last_backward_traces(jitted)
    ops = [b for f in traces[-1].bound_symbols if is_fusion(f) for b in f.subsymbols]
    lines = {b.sym.name: set() for b in ops}
    for b in ops:
        lines[b.sym.name].add(th.source_line(b))
    assert lines["matmul"] == {linear} and lines["where"] == {relu}, lines
    assert "test_sources.py" not in str(traces[-1])
