"""Which fusion executor runs where: fusion_executors(device), a missing or unloadable nvFuser named as such,
and explain()/profile_regions telling "not called yet" from "called, but Thunder made no fusion region"."""

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest
import thunder
import torch
from helpers import decision_text
from thunder.executors.torch_compile import torch_compile_ex

import thunder_fusion_guard
from thunder_fusion_guard import FusionGuard, explain, fusion_executors, nvfuser_problem, profile_regions
from thunder_fusion_guard import _thunder as th

NO_CUDA = not torch.cuda.is_available()


def scale_view(x):
    return (x * 2.0).reshape(-1)


def identity(x):
    return x


class _Unloadable:
    """A meta path finder under which ``nvfuser_direct`` fails as a build for another torch does."""

    @staticmethod
    def find_spec(name, path=None, target=None):
        if name == "nvfuser_direct":
            raise ImportError("/site/nvfuser_direct/_C_DIRECT.so: undefined symbol: _ZN3c1013MessageLoggerC1E")
        if name == "nvfuser":
            raise ModuleNotFoundError("No module named 'nvfuser'", name="nvfuser")
        return None


@pytest.fixture
def cuda_without_nvfuser(monkeypatch):
    if not NO_CUDA:
        pytest.skip("a CUDA device is present")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    for name in ("nvfuser_direct", "nvfuser"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    return monkeypatch


# Thunder's default executors as on a machine without nvFuser (the same list here or on a GPU machine).
CPU_DEFAULTS = [e for e in thunder.get_default_executors() if e.name != "nvfuser"]


def test_fusion_executors_per_device():
    assert fusion_executors("cpu") == [torch_compile_ex]
    assert fusion_executors(torch.device("cpu")) == [torch_compile_ex]
    if nvfuser_problem() is not None:
        assert fusion_executors("cuda") == [torch_compile_ex], "CUDA without nvFuser falls back to torch.compile"
    else:
        assert "nvfuser" in [e.name for e in fusion_executors("cuda")]


@pytest.mark.skipif(not NO_CUDA, reason="a CUDA device is present")
def test_nvfuser_without_cuda_is_named_not_unknown():
    with pytest.raises(ValueError) as info:
        FusionGuard(executors=["nvfuser"])
    message = str(info.value)
    assert message.startswith("FusionGuard option 'executors': nvfuser is not available here: "), message
    assert "no CUDA device" in message or "without CUDA" in message
    assert th.NVFUSER_INSTALL in message and "unknown" not in message


def test_nvfuser_install_advice_names_packages_on_the_registry():
    """This package is not on PyPI: the advice names nvFuser's own package and its torch, as the extra does."""
    pyproject = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text()  # tomllib: Python 3.11+
    (extra,) = re.findall(r"^nvfuser = (\[.*\])$", pyproject, flags=re.MULTILINE)
    assert tuple(ast.literal_eval(extra)) == th.NVFUSER_REQUIREMENTS
    assert all(f"'{r}'" in th.NVFUSER_INSTALL for r in th.NVFUSER_REQUIREMENTS)
    assert "thunder-fusion-guard[" not in th.NVFUSER_INSTALL


def test_unloadable_nvfuser_is_named_with_the_load_error(cuda_without_nvfuser):
    cuda_without_nvfuser.setattr(sys, "meta_path", [_Unloadable, *sys.meta_path])
    problem = nvfuser_problem()
    assert problem.startswith("nvfuser_direct fails to load: ") and "undefined symbol" in problem, problem
    assert f"an nvFuser build made for another torch than this {torch.__version__}" in problem
    with pytest.raises(ValueError, match="nvfuser is not available here: nvfuser_direct fails to load"):
        FusionGuard(executors=["nvfuser"])


def test_missing_nvfuser_is_named(cuda_without_nvfuser):
    cuda_without_nvfuser.setitem(sys.modules, "nvfuser_direct", None)  # None: import raises ModuleNotFoundError
    cuda_without_nvfuser.setitem(sys.modules, "nvfuser", None)
    assert nvfuser_problem() == "no nvFuser package is installed"


def test_other_unknown_executors_still_listed():
    with pytest.raises(ValueError, match=r"unknown fusion executors \['nope'\]; allowed here: \[.*'torchcompile'"):
        FusionGuard(executors=["nope"])


def test_explain_tells_not_called_from_no_region():
    guard = FusionGuard()
    jitted = thunder.jit(scale_view, executors=CPU_DEFAULTS, transforms=[guard])  # no general fusion executor
    assert "nothing compiled yet" in explain(jitted) and "call the jitted function first" in explain(jitted)
    jitted(torch.randn(3, 4))
    text = decision_text(explain(jitted))
    assert "with no general fusion executor" in explain(jitted)  # one piece of advice, not a row per op
    assert text.startswith("FusionGuard: called, but Thunder made no fusion region in the 1 trace it compiled")
    assert "executors in use: " in text and "torch, python" in text, text
    assert "executors=fusion_executors(device)" in text and th.NVFUSER_INSTALL in text
    assert guard.report.to_dict()["notice"] == text

    guard = FusionGuard()
    jitted = thunder.jit(scale_view, executors=fusion_executors("cpu"), transforms=[guard])
    jitted(torch.randn(3, 4))
    assert guard.report.notice() is None and "1 decision (" in explain(jitted)


def test_explain_with_a_fusion_executor_and_nothing_to_fuse():
    guard = FusionGuard()
    jitted = thunder.jit(identity, executors=fusion_executors("cpu"), transforms=[guard])
    jitted(torch.randn(3))
    assert "torchcompile found nothing to fuse here, so nothing to decide" in explain(jitted)


def test_profile_without_regions_says_why():
    jitted = thunder.jit(scale_view, executors=CPU_DEFAULTS)
    profile = profile_regions(jitted, torch.randn(3, 4), reps=2, warmup=0)
    text = str(profile)
    assert profile.rows == [] and "no fusion region in the final traces: executors in use: " in text, text
    assert "fusion_executors(device)" in text
    assert profile.to_dict()["executors"] and profile.threads == torch.get_num_threads()


def test_import_loads_neither_torch_nor_thunder():
    """``import thunder_fusion_guard`` is cheap (the CLI's --help and --version, quieting warnings first)."""
    code = (
        "import sys, thunder_fusion_guard as t; print(t.__version__, 'torch' in sys.modules, 'thunder' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.split() == [thunder_fusion_guard.__version__, "False", "False"], done.stderr
    assert set(thunder_fusion_guard.__all__) <= set(dir(thunder_fusion_guard))
