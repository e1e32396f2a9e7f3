"""Every trace the guard makes passes Thunder's own consistency checks (``DebugOptions(check_traces=...)``),
and the fail-safe holds under ``python -OO``. tests/conftest.py turns trace checking on for the whole suite."""

import contextlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
import thunder
import torch
from helpers import assert_same, nvfuser_shaped_executor, run_with_grads
from test_hoist import mask_softmax

from thunder_fusion_guard import Costs, FusionGuard


def test_the_suite_checks_every_trace():
    jitted = thunder.jit(mask_softmax)
    jitted(torch.randn(4, 4))
    assert thunder.compile_data(jitted).debug_options.check_traces is True


# check_traces=True: every jit of the suite runs with it already (tests/conftest.py); here with --run-slow.
@pytest.mark.parametrize("check_traces", [pytest.param(True, marks=pytest.mark.slow), 2])
@pytest.mark.parametrize(
    "executors, actions", [("thunder defaults", {"hoist", "fold"}), ("nvfuser-shaped torch.compile", {"hoist"})]
)
def test_guarded_traces_pass_thunder_checks(check_traces, executors, actions):
    """With Thunder's CPU defaults (no fusion executor: the hoisted call and the folded setitems sit among
    plain ops, as in Thunder's own test_litgpt_variants) and with torch.compile regions the mask is taken
    out of, forward and backward."""
    options = {"debug_options": thunder.DebugOptions(check_traces=check_traces)}
    if executors != "thunder defaults":
        options["executors"] = [nvfuser_shaped_executor()]
    guard = FusionGuard(strict=True, costs=Costs(calibration="shipped"))
    x = torch.randn(3, 8, 8, requires_grad=True)
    got = run_with_grads(thunder.jit(mask_softmax, transforms=[guard], **options), [x])
    expected = run_with_grads(thunder.jit(mask_softmax, **options), [x])
    assert_same(got[0], expected[0])
    assert_same(got[1], expected[1])
    assert actions <= {d.action for d in guard.report.decisions}


def test_split_regions_and_thunderfx_pass_thunder_checks():
    from test_hoist_split import inputs, rope_attention
    from thunder.dynamo import thunderfx

    debug = thunder.DebugOptions(check_traces=2)
    guard = FusionGuard(strict=True, costs=Costs(calibration="shipped"))
    args = inputs(torch.bfloat16)
    jitted = thunder.jit(rope_attention, executors=[nvfuser_shaped_executor()], transforms=[guard], debug_options=debug)
    run_with_grads(jitted, args)
    assert any(d.action == "hoist" and d.details["split"] for d in guard.report.decisions)

    guard = FusionGuard(strict=True, costs=Costs(calibration="shipped"))
    x = torch.randn(3, 8, 8, requires_grad=True)
    executors = [nvfuser_shaped_executor()]
    compiled = thunderfx(mask_softmax, executors=executors, transforms=[guard], debug_options=debug)
    plain = thunderfx(mask_softmax, executors=executors, debug_options=debug)
    got, expected = run_with_grads(compiled, [x]), run_with_grads(plain, [x])
    assert_same(got[0], expected[0])
    assert_same(got[1], expected[1])
    assert any(d.action == "hoist" for d in guard.report.decisions)


# A pass made to fail on a program with a setitem to fold; prints the decision that records the failure: its code,
# its facts, whether its reason is what the code words them as, and its error.
# No assert statements: -OO removes them.
PLANTED_FAILURE = """
import thunder, torch
from thunder.executors.torch_compile import torch_compile_ex
import thunder_fusion_guard.passes.fold as fold
from thunder_fusion_guard import FusionGuard
from thunder_fusion_guard.reasons import words

if fold.fold_pass.__doc__ is not None or FusionGuard.__doc__ is not None:
    raise SystemExit("the docstrings are still there")
def broken(*args, **kwargs):
    raise RuntimeError("planted failure")
fold.fold_setitem_copies = broken

def f(x):
    m = torch.zeros(4, 4)
    m[0, :2] = 1.0
    return x + m
guard = FusionGuard(costs={"calibration": "shipped"})
x = torch.randn(4, 4)
out = thunder.jit(f, executors=[torch_compile_ex], transforms=[guard])(x)
if not torch.equal(out, f(x)):
    raise SystemExit("the output changed")
(failed,) = [d for d in guard.report.decisions if d.error]
said = words(failed.code, failed.facts)[0] == failed.reason
print(failed.code, failed.facts["step"], failed.facts["moved"], said, "|", failed.error)
"""
# The command line builds its help without docstrings too.
REPORT_HELP = """
from thunder_fusion_guard.tools.cli import main
try:
    main(["report", "--help"])
except SystemExit as e:
    if e.code != 0:
        raise
print("report --help: ok")
"""


def _drop_docstrings(monkeypatch) -> None:
    """What -OO does to the package's docstrings (modules, classes, functions, methods), undone afterwards."""
    for name, module in list(sys.modules.items()):
        if not name.startswith("thunder_fusion_guard") or module is None:
            continue
        monkeypatch.setattr(module, "__doc__", None)
        for value in list(vars(module).values()):
            if getattr(value, "__module__", None) != name:
                continue
            members = list(vars(value).values()) if isinstance(value, type) else []
            for item in [value, *members]:
                if callable(item) and getattr(item, "__doc__", None) is not None:
                    with contextlib.suppress(AttributeError, TypeError):  # a built-in's
                        monkeypatch.setattr(item, "__doc__", None)


@pytest.mark.guard_failure_expected
def test_a_failing_pass_is_kept_and_recorded_without_docstrings(monkeypatch, capsys):
    """The short form of the -OO test below, in this process: the package's docstrings removed as -OO
    removes them, a pass that fails still leaves the trace as it was and says which."""
    import thunder_fusion_guard.passes.fold as fold
    from thunder_fusion_guard import FusionGuard  # noqa: F401 (loaded, so that its docstrings go too)

    _drop_docstrings(monkeypatch)
    monkeypatch.setattr(fold, "fold_setitem_copies", fold.fold_setitem_copies)  # restored afterwards
    exec(compile(PLANTED_FAILURE, "planted_failure", "exec"), {})
    out = capsys.readouterr().out
    assert "pass_failed fold_pass False True | RuntimeError: planted failure" in out


def test_the_command_line_builds_its_help_without_docstrings(monkeypatch, capsys):
    import thunder_fusion_guard.tools.cli
    import thunder_fusion_guard.tools.report_cli  # noqa: F401 (loaded, so that its docstring goes too)

    _drop_docstrings(monkeypatch)
    exec(compile(REPORT_HELP, "report_help", "exec"), {})
    assert capsys.readouterr().out.endswith("report --help: ok\n")


@pytest.mark.slow
def test_a_failing_pass_is_kept_and_recorded_under_python_OO(tmp_path):
    """Under -OO docstrings and asserts are gone; a pass that fails still leaves the trace as it was and says
    which. Slow: -OO byte-compiles torch and thunder again (about 20 s); the test above is its short form."""
    path = tmp_path / "oo.py"
    path.write_text(PLANTED_FAILURE + REPORT_HELP)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}  # this checkout's package
    done = subprocess.run([sys.executable, "-OO", str(path)], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.endswith("report --help: ok\n")
    assert "pass_failed fold_pass False True | RuntimeError: planted failure" in done.stdout
