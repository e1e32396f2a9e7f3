"""Nothing Thunder or torch own stays changed by this package: importing it, constructing ``FusionGuard`` and a
guarded compilation leave every function the package ever wraps Thunder's own again, ``sys.meta_path`` and the
warning filters as they were, and an unguarded ``thunder.jit`` in that process gives the traces it gives in a
process without the package."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

_SCRIPT = r'''
import json, sys, warnings
import torch, thunder
import thunder.transforms.autodiff as autodiff
from thunder.core.interpreter import InterpreterRuntimeCtx
from thunder.core.trace import TraceCtx
import thunder.core.jit_ext as jit_ext
import thunder.torch as ltorch
from importlib import import_module
langctx = import_module("thunder.torch.langctx")
from thunder.core.transforms import _grad_fn_map
from thunder.dynamo import utils as fx_utils

DEVICE = sys.argv[2] if len(sys.argv) > 2 else "cpu"

def nvfuser_names():
    """Thunder's nvFuser names the package wraps while it compiles (None where nvFuser does not import)."""
    if DEVICE != "cuda":
        return {}
    from thunder.executors import nvfuserex_impl
    return {"compute_contiguity": nvfuserex_impl.compute_contiguity,
            "create_fusion_definition_wrapper": nvfuserex_impl.create_fusion_definition_wrapper}

def owned():
    """Everything of Thunder's the package has ever wrapped or written, by identity."""
    return {
        **nvfuser_names(),
        "get_current_user_source_location": InterpreterRuntimeCtx.get_current_user_source_location,
        "grad_transform_on_trace": autodiff.grad_transform_on_trace,
        "_should_recompute_bsym_in_backward": autodiff._should_recompute_bsym_in_backward,
        "pop_scope": TraceCtx.pop_scope,
        "torch_to_thunder": dict(ltorch._torch_to_thunder_function_map),
        "lookasides": dict(jit_ext._general_jit_lookaside_map),
        "views": set(ltorch._syms_returning_views),
        "grads": dict(_grad_fn_map),
        "methods": dict(langctx._method_name_to_fn_map),
        "split_off": set(fx_utils.auto_register_ops),
    }

class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = torch.nn.LayerNorm(8)
        self.linear = torch.nn.Linear(8, 8)

    def forward(self, x):
        return torch.nn.functional.gelu(self.linear(self.norm(x))).sum(0) * 2

def f(x, w):
    return (torch.sin(x) @ w).relu().sum()

def randn(*shape):
    return torch.randn(*shape, device=DEVICE, requires_grad=True)

def unguarded_traces():
    if DEVICE == "cuda":  # unguarded Thunder's nvFuser regions fail as shipped where only nvfuser_direct is installed
        return []
    torch.manual_seed(0)
    model = Block()
    x = torch.randn(4, 8, requires_grad=True)
    jm = thunder.jit(model)
    jm(x).sum().backward()
    jf = thunder.jit(f)
    jf(torch.randn(4, 8, requires_grad=True), torch.randn(8, 8, requires_grad=True)).backward()
    traces = (thunder.last_traces(jm), thunder.last_backward_traces(jm),
              thunder.last_traces(jf), thunder.last_backward_traces(jf))
    # each trace as printed, but for its header's compile time
    return ["\n".join(l for l in str(t[-1]).splitlines() if "(took " not in l) for t in traces]

before = owned()
meta_path, filters = list(sys.meta_path), list(warnings.filters)
result = {"before": unguarded_traces()}
if sys.argv[1] == "with":
    import thunder_fusion_guard
    from thunder_fusion_guard import FusionGuard, shims
    from thunder_fusion_guard._thunder import sources
    guard = FusionGuard()
    model = Block().to(DEVICE)
    jm = thunder.jit(model, transforms=[guard])
    jm(randn(4, 8)).sum().backward()
    jf = thunder.jit(f, transforms=[FusionGuard()])
    jf(randn(4, 8), randn(8, 8)).backward()
    from thunder.dynamo import thunderfx
    fx = thunderfx(Block().to(DEVICE), transforms=[FusionGuard()])
    fx(randn(4, 8)).sum().backward()
    if DEVICE == "cuda":  # a region the guard keeps on nvFuser (test_nvfuser's), run through the scoped wrapper
        g = lambda x: torch.tanh(torch.sigmoid(torch.sin(x * 2.0 + 1.0) * x - 3.0).exp() + x.cos())
        x = torch.randn(256, 256, device="cuda")
        jg = thunder.jit(g, transforms=[FusionGuard(costs={"cost_model": False})])  # region kept
        result["equal"] = bool(torch.allclose(jg(x), g(x)))
        result["regions"] = [b.sym.name for b in thunder.last_traces(jg)[-1].bound_symbols]
    result["decisions"] = len(guard.report.decisions)
    result["applied"] = shims.applied_shims()
    result["in_scope"] = sources.applied_in_scope()
after = owned()
result["changed"] = sorted(k for k in before if before[k] is not after[k] and before[k] != after[k])
result["meta_path"] = [m for m in (type(f).__module__ for f in sys.meta_path) if m.startswith("thunder_fusion")]
result["filters"] = list(warnings.filters) == filters
result["after"] = unguarded_traces()
print(json.dumps(result))
'''


def _run(tmp_path: Path, which: str, device: str = "cpu") -> dict:
    script = tmp_path / "scoped_check.py"
    script.write_text(_SCRIPT)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)}
    env.pop(ENV_OFF, None)
    done = subprocess.run(
        [sys.executable, str(script), which, device], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


ENV_OFF = "TFG_SHIMS_OFF"


def test_a_guarded_compilation_leaves_thunder_as_a_process_without_the_package(tmp_path):
    without = _run(tmp_path, "without")
    with_ = _run(tmp_path, "with")
    assert with_["decisions"] > 0  # the guard did compile and decide
    assert with_["changed"] == [] and with_["applied"] == [] and with_["in_scope"] is False
    assert with_["meta_path"] == [] and with_["filters"] is True
    assert with_["before"] == without["before"]
    assert with_["after"] == without["after"] == without["before"]


@pytest.mark.cuda
def test_a_guarded_compilation_on_cuda_leaves_nvfusers_names_thunders_own(tmp_path):
    """On CUDA the guard's regions carry nvfuser_direct's descriptors by a wrapper of their own: Thunder's
    ``compute_contiguity`` and ``create_fusion_definition_wrapper`` are its own after guarded compilations."""
    with_ = _run(tmp_path, "with", "cuda")
    assert with_["decisions"] > 0 and with_["equal"], with_
    assert any(r.startswith("nvFusion") for r in with_["regions"]), with_  # a guarded nvFuser region ran
    assert with_["changed"] == [] and with_["applied"] == [] and with_["in_scope"] is False


def test_importing_the_package_and_constructing_a_guard_change_nothing():
    code = (
        "import sys, warnings\n"
        "meta, filters = list(sys.meta_path), list(warnings.filters)\n"
        "import thunder_fusion_guard as t\n"
        "from thunder_fusion_guard import shims\n"
        "t.FusionGuard()\n"
        "mine = [f for f in sys.meta_path if type(f).__module__.startswith('thunder_fusion_guard')]\n"
        "print([type(f).__name__ for f in mine], list(warnings.filters) == filters,\n"
        "      shims.applied_shims())\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["[]", "True", "[]"]


def test_the_users_lines_are_held_only_while_a_guarded_compilation_runs():
    import thunder
    import torch
    from thunder.core.interpreter import InterpreterRuntimeCtx

    from thunder_fusion_guard import FusionGuard
    from thunder_fusion_guard._thunder import sources

    sources.compilation_ends()  # one an earlier test's failing compilation left open (the next one takes it over)
    original = InterpreterRuntimeCtx.get_current_user_source_location

    class Probe(thunder.Transform):
        """Notes, while Thunder compiles, whether the user's lines are held."""

        def __init__(self) -> None:
            self.held: list[bool] = []

        def transform_traces_pre_prologue(self, prologue, computation, epilogue, **kwargs):
            self.held.append(sources.applied_in_scope())
            return prologue, computation, epilogue

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    guarded, unguarded = Probe(), Probe()
    thunder.jit(model, transforms=[FusionGuard(), guarded])(torch.randn(2, 4))
    assert not sources.applied_in_scope() and InterpreterRuntimeCtx.get_current_user_source_location is original
    thunder.jit(model, transforms=[unguarded])(torch.randn(2, 4))
    assert guarded.held == [True] and unguarded.held == [False]


def test_a_failing_guarded_compilation_of_a_module_leaves_nothing_held():
    """A module's compilation that fails after the guard began holding the user's lines: the call closes it."""
    import pytest
    import thunder
    import torch
    from thunder.core.interpreter import InterpreterRuntimeCtx

    from thunder_fusion_guard import FusionGuard
    from thunder_fusion_guard._thunder import sources

    class Failing(thunder.Transform):
        def transform_traces_pre_prologue(self, prologue, computation, epilogue, **kwargs):
            raise RuntimeError("a transform after the guard failed")

    sources.compilation_ends()
    original = InterpreterRuntimeCtx.get_current_user_source_location
    model = torch.nn.Linear(4, 4)
    with pytest.raises(RuntimeError, match="after the guard failed"):
        thunder.jit(model, transforms=[FusionGuard(), Failing()])(torch.randn(2, 4))
    assert not sources.applied_in_scope() and InterpreterRuntimeCtx.get_current_user_source_location is original


def test_a_failing_guarded_compilation_of_a_function_leaves_nothing_held_once_its_error_is_handled():
    """A function's compilation that fails after the guard began holding the user's lines (no call of a module to
    close it): the hold ends when the failed compilation's trace is freed, once the error is handled."""
    import gc

    import thunder
    import torch
    from thunder.core.interpreter import InterpreterRuntimeCtx

    from thunder_fusion_guard import FusionGuard
    from thunder_fusion_guard._thunder import sources

    class FailingAfterTheGuard(thunder.Transform):
        def transform_traces_pre_prologue(self, prologue, computation, epilogue, **kwargs):
            assert sources.applied_in_scope()  # the guard's hold, for the backward's lines
            raise RuntimeError("a transform after the guard failed")

    sources.compilation_ends()
    original = InterpreterRuntimeCtx.get_current_user_source_location
    try:
        thunder.jit(lambda x: x.sin() * 2, transforms=[FusionGuard(), FailingAfterTheGuard()])(torch.randn(3))
    except RuntimeError as e:
        assert "after the guard failed" in str(e)
    gc.collect()
    assert not sources.applied_in_scope() and InterpreterRuntimeCtx.get_current_user_source_location is original
    # the next guarded compilation holds and lets go as ever
    assert thunder.jit(lambda x: x * 2, transforms=[FusionGuard()])(torch.ones(2)).tolist() == [2.0, 2.0]
    assert not sources.applied_in_scope() and InterpreterRuntimeCtx.get_current_user_source_location is original


def test_a_trace_freed_while_another_thread_holds_the_scope_is_closed_as_that_thread_lets_go():
    """A finalizer that finds the scope's lock taken leaves its compilation pending; the holder closes it as it
    lets go, even when the holder had already looked at what was pending (the window before its release)."""
    from thunder_fusion_guard._thunder import sources

    before = sources._SCOPE.holders
    with sources._locked():
        sources._hold_locked()
    compilation = sources._Compilation()
    sources._SCOPE.lock.acquire()  # a holder past its last look at what is pending
    sources._close(compilation)  # the finalizer, in another thread or a garbage collection: the lock is taken
    assert compilation.open and sources._PENDING.count(compilation) == len(sources._PENDING) == 1
    sources._unlock()
    assert not compilation.open and not sources._PENDING
    assert sources._SCOPE.holders == before
