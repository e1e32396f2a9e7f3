"""fusion-guard report TARGET: the shipped example, a file outside the repo, a module target, bad targets."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from thunder_fusion_guard.tools.cli import main
from thunder_fusion_guard.tools.report_cli import MakeFailed, TargetError, load_target, make_workload

# The report is the subject, not the code Inductor generates: regions run uncompiled (helpers.without_inductor).
pytestmark = pytest.mark.usefixtures("no_inductor_module")

REPO = Path(__file__).resolve().parents[1]

OUTSIDE = """
import torch

def scaled_views(x, *, scale):
    return (x.reshape(-1, 4).t() * scale).sum(), x.transpose(0, 1)

def make():
    return scaled_views, (torch.randn(3, 4, requires_grad=True),), {"scale": 2.0}
"""


def _file(tmp_path, text: str, name: str = "target.py") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def _thunderfx_report(lane, folder):
    out_json, out_md = folder / "out" / "report.json", folder / "report.md"
    out_json.parent.mkdir()  # an output's folder must exist (test_cli checks the error)
    argv = ["report", "examples/report_target.py:make", "--thunderfx", "--device", "cpu"]
    cmd = [sys.executable, "-m", "thunder_fusion_guard", *argv, "--json", str(out_json), "--markdown", str(out_md)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    done = lane.run(cmd, cwd=REPO, env=env)
    # Read at once, in the job: the test may run minutes later.
    return done, *(p.read_text() if p.exists() else f"{p}: not written" for p in (out_json, out_md))


@pytest.mark.background.with_args(_thunderfx_report)  # python -m, beside the other tests (tests/conftest.py)
def test_shipped_example_through_thunderfx(background):
    done, json_text, markdown = background
    assert done.returncode == 0, done.stderr[-3000:]
    printed = done.stdout
    assert "via thunderfx on cpu" in printed and "subgraph 1 (dynamo graph 1, thunder_0)" in printed
    assert "wrote " in done.stderr, done.stderr[-3000:]
    doc = json.loads(json_text)
    assert (doc["target"], doc["frontend"], doc["device"], doc["backward"]) == (
        "examples/report_target.py:make",
        "thunderfx",
        "cpu",
        True,
    )
    report = doc["report"]
    assert len(report["subgraphs"]) == 3 and all(s["ops"] for s in report["subgraphs"].values())
    assert {d["subgraph"] for d in report["decisions"]} == set(report["subgraphs"])
    assert {d["trace"] for d in report["decisions"]} == {"forward", "backward"}
    assert any(d["action"] == "reject" and d["details"]["decided_by"] == "metadata" for d in report["decisions"])
    assert markdown.startswith("# FusionGuard report: examples/report_target.py:make via thunderfx on cpu")
    assert markdown.count("\n## subgraph ") == 3 and "| trace | region |" in markdown


def test_shipped_example_jitted(capsys):
    assert main(["report", f"{REPO}/examples/report_target.py:make", "--device", "cpu"]) == 0
    printed = capsys.readouterr().out
    assert "via thunder.jit on cpu" in printed and "Attention#1:forward" in printed
    assert "subgraph" not in printed


def test_file_outside_the_repo_with_kwargs(tmp_path, capsys):
    target = _file(tmp_path, OUTSIDE)
    out = tmp_path / "r.json"
    assert main(["report", f"{target}:make", "--json", str(out)]) == 0
    decisions = json.loads(out.read_text())["report"]["decisions"]
    assert {d["trace"] for d in decisions} == {"forward", "backward"}
    assert all(d["function"] == "scaled_views" and d["subgraph"] is None for d in decisions)
    assert main(["report", f"{target}:make", "--no-backward", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["backward"] is False and {d["trace"] for d in doc["report"]["decisions"]} == {"forward"}


def test_module_target(tmp_path, monkeypatch):
    _file(tmp_path, OUTSIDE, "tfg_report_target_mod.py")
    monkeypatch.syspath_prepend(str(tmp_path))
    make = load_target("tfg_report_target_mod:make")
    fn, _, kwargs = make()
    assert fn.__name__ == "scaled_views" and kwargs == {"scale": 2.0}
    assert main(["report", "tfg_report_target_mod:make", "--device", "cpu"]) == 0


BAD_MAKES = {
    "tensor": (
        "import torch\ndef make():\n    return torch.ones(2)\n",
        r"must return \(model_or_fn, args\) .*got a Tensor",
    ),
    "four": ("def make():\n    return 1, 2, 3, 4\n", "got a tuple of 4"),
    "model": ("def make():\n    return 5, (1,)\n", "returned an int as the model"),
    "args": ("import torch\ndef make():\n    return torch.sin, torch.ones(2)\n", "as args: it must be a tuple"),
    "kwargs": ("import torch\ndef make():\n    return torch.sin, (torch.ones(2),), [1]\n", "as kwargs: it must be"),
}


@pytest.mark.parametrize("case", sorted(BAD_MAKES))
def test_bad_make_exits_2(tmp_path, capsys, case):
    text, message = BAD_MAKES[case]
    target = _file(tmp_path, text, f"bad_{case}.py")
    assert main(["report", f"{target}:make"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fusion-guard report: ")
    with pytest.raises(TargetError, match=message):
        make_workload(load_target(f"{target}:make"), "cpu")


def test_a_target_whose_import_raises_exits_1(tmp_path, capsys):
    """Importing TARGET's file runs the user's code: its failure is the work failing (exit 1 with the --traceback
    hint), not a bad argument."""
    target = _file(tmp_path, "import no_such_module_for_tfg\n", "bad_broken.py")
    assert main(["report", f"{target}:make"]) == 1
    assert capsys.readouterr().err.strip().endswith("(--traceback for the full traceback)")
    with pytest.raises(MakeFailed, match=r"importing .* raised ModuleNotFoundError"):
        load_target(f"{target}:make")


@pytest.mark.parametrize(
    "spec,message",
    [
        ("examples/report_target.py", "TARGET must look like 'path/to/file.py:make'"),
        ("examples/report_target.py:", "TARGET must look like"),
        ("nowhere/missing.py:make", "nowhere/missing.py: no such file"),
        ("examples/report_target.py:build", r"has no attribute 'build'; callables there: \['Attention', 'make'"),
        ("no_such_package_tfg.models:make", "no module named 'no_such_package_tfg'"),
        ("json:__doc__", "'__doc__' is a str, not a callable"),
    ],
)
def test_bad_target_exits_2(spec, message, capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    assert main(["report", spec]) == 2
    assert capsys.readouterr().err.startswith("fusion-guard report: ")
    with pytest.raises(TargetError, match=message):
        load_target(spec)


def test_cuda_without_a_gpu_exits_2(capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    assert main(["report", f"{REPO}/examples/report_target.py:make", "--device", "cuda"]) == 2
    assert "no CUDA device" in capsys.readouterr().err


@pytest.mark.slow
def test_python_dash_m_on_a_file_outside_the_repo(tmp_path):
    """End to end in a subprocess (the same report runs in-process in test_file_outside_the_repo_with_kwargs,
    and a bad target through ``python -m`` in test_cli.py)."""
    _file(tmp_path, OUTSIDE)
    (tmp_path / "out").mkdir()  # an output's folder must exist (test_cli checks the error)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, "-m", "thunder_fusion_guard", "report", "target.py:make", "--json", "out/r.json"]
    done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "FusionGuard report: target.py:make via thunder.jit" in done.stdout
    assert json.loads((tmp_path / "out" / "r.json").read_text())["report"]["decisions"]
    bad = subprocess.run(
        [sys.executable, "-m", "thunder_fusion_guard", "report", "missing.py:make"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert bad.returncode == 2 and "missing.py: no such file" in bad.stderr
