"""Where a compiled step's host time goes: each function's part by its file and name (a pure rule), and a step
of guarded Thunder profiled (the parts seen, by their calls: no timing is asserted)."""

from __future__ import annotations

import pytest
import thunder
import torch

from thunder_fusion_guard import FusionGuard, fusion_executors, host_time
from thunder_fusion_guard.examine import host_time as ht


@pytest.mark.parametrize(
    ("filename", "name", "caller", "part"),
    [
        ("~", "<built-in method torch._C._cuda_synchronize>", None, ht.WAITING),
        ("~", "<method 'run_backward' of 'torch._C._EngineBase' objects>", None, ht.ENGINE),
        ("~", "<method 'replay' of 'torch._C._CUDAGraph' objects>", None, ht.REPLAY),
        ("~", "<built-in method _foreach_copy_>", None, ht.COPIES),
        ("~", "<method 'copy_' of 'torch._C.TensorBase' objects>", ht.BOOKKEEPING, ht.COPIES),
        ("~", "<method 'copy_' of 'torch._C.TensorBase' objects>", ht.OPS, ht.OPS),
        ("~", "<built-in method builtins.isinstance>", ht.THUNDER, ht.THUNDER),
        ("/x/site-packages/thunder/transforms/cudagraph.py", "call_cuda_graph", None, ht.BOOKKEEPING),
        ("/x/thunder_fusion_guard/_thunder/graph_calls.py", "__call__", None, ht.BOOKKEEPING),
        ("/x/thunder_fusion_guard/_thunder/entry.py", "__call__", None, ht.THUNDER),
        ("/x/site-packages/thunder/executors/torch_autograd.py", "forward", None, ht.BRIDGE),
        ("/x/site-packages/torch/_dynamo/eval_frame.py", "_fn", None, ht.DYNAMO),
        ("/x/site-packages/thunder/__init__.py", "get_computation_and_inputs", None, ht.THUNDER),
        ("thunder.computation_10", "computation", None, ht.OPS),
        ("/x/site-packages/torch/_inductor/cudagraph_trees.py", "expired", None, ht.BOOKKEEPING),
        ("/x/site-packages/torch/_functorch/_aot_autograd/runtime_wrappers.py", "forward", None, ht.BRIDGE),
        ("~", "<built-in method torch._C._dynamo.guards._reinterpret_tensor>", ht.OTHER, ht.DYNAMO),
        ("/home/me/model.py", "forward", None, ht.OTHER),
    ],
)
def test_each_function_goes_to_its_part(filename, name, caller, part):
    assert ht.part_of(filename, name, caller) == part


def test_a_guarded_step_is_profiled_by_part():
    """A training step of guarded Thunder: Thunder's cache lookup, the autograd bridge and the autograd engine are
    seen at every step; wall and profiled times are reported."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    compiled = thunder.jit(model, executors=fusion_executors("cpu"), transforms=[FusionGuard()])
    x = torch.randn(4, 8)

    def step() -> None:
        compiled(x).sum().backward()

    found = host_time(step, steps=3, warmup=1)
    assert found.wall_ms > 0 and found.profiled_ms > 0
    assert {ht.THUNDER, ht.BRIDGE, ht.ENGINE} <= set(found.calls)
    assert all(part in ht.PARTS for part in found.parts_ms)
    assert "autograd bridge" in found.table()


def test_bad_counts_are_refused():
    with pytest.raises(ValueError, match="steps"):
        host_time(lambda: None, steps=0)
