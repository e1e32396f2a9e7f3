"""Where the user wrote what the guard decided: every decision's ``details["source"]`` is the user's frame (the
first outside torch, Thunder and this package: the line calling an ``nn.Linear``, not ``torch/nn/modules``),
under ``thunder.jit`` and ThunderFX, and names the decision (``Decision.name``)."""

import inspect

import pytest
import torch
from helpers import jit_cpu
from test_hoist import mask_loop
from thunder.dynamo import thunderfx

from thunder_fusion_guard import FusionGuard, fusion_executors
from thunder_fusion_guard._thunder import stack_trace_source

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
