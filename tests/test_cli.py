"""The fusion-guard command line: one-line errors with exit status 2 for every bad argument, checked
before any work; --version; one line and a --traceback hint for a target that raises; the import-time
warnings of Thunder and torch silenced; --threads pinned for CPU timing."""

import argparse
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from thunder_fusion_guard.tools import cli, common
from thunder_fusion_guard.tools.cli import main

REPO = Path(__file__).resolve().parents[1]
NO_CUDA = not torch.cuda.is_available()


def _one_line_error(capsys, argv: list[str], code: int = 2) -> str:
    """Run ``fusion-guard argv``; assert the exit status and that stderr is one line; return it."""
    try:
        status = main(argv)
    except SystemExit as e:  # argparse errors
        status = e.code
    captured = capsys.readouterr()
    assert status == code, (status, captured.err)
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    return lines[0]


@pytest.fixture
def no_work(monkeypatch):
    """Fail the test if a command starts its work (compiling, timing) before rejecting its arguments."""

    def refuse(*args, **kwargs):
        raise AssertionError("the command started its work before checking its arguments")

    import thunder_fusion_guard.bench.decisions as bench_decisions
    import thunder_fusion_guard.examine.kernel_histogram as kernel_histogram
    import thunder_fusion_guard.measure.calibrate as calibrate
    import thunder_fusion_guard.tools.bench_cli as bench_cli
    import thunder_fusion_guard.tools.demo as demo
    import thunder_fusion_guard.tools.report_cli as report_cli

    monkeypatch.setattr(calibrate, "calibrate", refuse)
    monkeypatch.setattr(demo, "run_demo", refuse)
    monkeypatch.setattr(report_cli, "run_report", refuse)
    monkeypatch.setattr(bench_cli, "run_cases", refuse)
    monkeypatch.setattr(bench_decisions, "run", refuse)
    monkeypatch.setattr(kernel_histogram, "step_histogram", refuse)


@pytest.mark.parametrize(
    "argv,prefix,message",
    [
        (["calibrate", "--executor", "nope"], "calibrate", "--executor 'nope' is not a fusion executor calibrate can"),
        (
            ["calibrate", "--executor", "nvfuser", "--device", "cpu"],
            "calibrate",
            "--executor nvfuser runs on CUDA only",
        ),
        (["calibrate", "--bogus"], "calibrate", "unrecognized arguments: --bogus"),
        (["demo", "--reps", "0"], "demo", "argument --reps: expected an integer >= 1, got '0'"),
        (["demo", "--threads", "0"], "demo", "argument --threads: expected an integer >= 1"),
        (["demo", "--device", "tpu"], "demo", "argument --device: invalid choice: 'tpu'"),
        (["bench", "run", "--reps", "x"], "bench run", "argument --rounds/--reps"),
        (["bench", "compare", "a.json"], "bench compare", "compare needs BASE and HEAD files, or one TARGET"),
        (["report"], "report", "the following arguments are required: TARGET"),
        (["bench", "decisions", "--time-limit", "0"], "bench decisions", "argument --time-limit: expected a number"),
        (["bench", "decisions", "--time-limit", "-3"], "bench decisions", "argument --time-limit: expected a number"),
        (["bench", "decisions", "--region-s", "0"], "bench decisions", "argument --region-s: expected a number"),
        (["bench", "decisions", "--reps", "4"], "bench decisions", "argument --reps: expected an integer >= 5"),
        (["kernels", "x.py:make", "--top", "0"], "kernels", "argument --top: expected an integer >= 1"),
        (["kernels", "x.py:make", "--against", "eager"], "kernels", "argument --against: invalid choice"),
        (["kernels", f"{REPO}/examples/report_target.py:make", "--device", "cpu"], "kernels", "counts CUDA launches"),
        (["nope"], "", "invalid choice: 'nope'"),
        ([], "", "the following arguments are required: COMMAND"),
    ],
)
def test_bad_argument_is_one_line_and_exit_2(capsys, no_work, argv, prefix, message):
    line = _one_line_error(capsys, argv)
    assert line.startswith(f"fusion-guard{' ' if prefix else ''}{prefix}: "), line
    assert message in line, line


@pytest.mark.skipif(not NO_CUDA, reason="a CUDA device is present")
@pytest.mark.parametrize("command", ["demo", "calibrate", "report", "kernels", "bench run", "bench decisions"])
def test_cuda_without_a_device_is_one_line_and_exit_2(capsys, no_work, command):
    """Every command words a missing GPU alike."""
    target = [f"{REPO}/examples/report_target.py:make"] if command in ("report", "kernels") else []
    line = _one_line_error(capsys, [*command.split(), *target, "--device", "cuda"])
    assert line.startswith(f"fusion-guard {command}: --device cuda: "), line
    assert "no CUDA device" in line or "without CUDA" in line


# Every command that writes a file, with its options: each output path is checked before any work.
WRITERS = {
    "report": (
        ["report", f"{REPO}/examples/report_target.py:make", "--device", "cpu"],
        ["--json", "--markdown", "--html", "--dot"],
    ),
    "bench run": (["bench", "run", "--device", "cpu", "--suite", "micro"], ["--json", "--markdown"]),
    "bench decisions": (["bench", "decisions", "--device", "cpu", "--quick"], ["--json"]),
    "calibrate": (["calibrate", "--device", "cpu", "--no-save"], ["--json"]),
}
BAD_OUTPUTS = {
    "under a regular file": ("file.txt/out.json", "file.txt is a file, not a folder"),
    "a folder": ("folder", "is a folder; name a file in it"),
    "in a missing folder": ("missing/out.json", "folder missing does not exist (create it first)"),
}


@pytest.mark.parametrize("bad", list(BAD_OUTPUTS))
@pytest.mark.parametrize("command, option", [(c, o) for c, (_, options) in WRITERS.items() for o in options])
def test_bad_output_path_is_one_line_and_exit_2_before_any_work(
    tmp_path, monkeypatch, capsys, no_work, command, option, bad
):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "file.txt").write_text("not a folder")
    (tmp_path / "folder").mkdir()
    path, message = BAD_OUTPUTS[bad]
    argv, _ = WRITERS[command]
    line = _one_line_error(capsys, [*argv, option, path])
    assert line == f"fusion-guard {command}: {option} {path}: {message}", line
    assert not (tmp_path / "missing").exists()  # nothing created


def test_traceback_keeps_the_status_of_a_usage_error(capsys, no_work):
    assert main(["calibrate", "--executor", "nope", "--traceback"]) == 2
    assert "calibrate: --executor 'nope'" in capsys.readouterr().err


@pytest.mark.skipif(not NO_CUDA, reason="a CUDA device is present")
def test_calibrate_nvfuser_missing_is_named(capsys, monkeypatch, no_work):
    monkeypatch.setattr(common, "resolve_device", lambda device: "cuda")
    monkeypatch.setattr(cli, "resolve_device", lambda device: "cuda")
    from thunder_fusion_guard import _thunder as th

    line = _one_line_error(capsys, ["calibrate", "--executor", "nvfuser"])
    assert line.startswith("fusion-guard calibrate: --executor nvfuser: nvfuser is not available here: "), line
    assert th.NVFUSER_INSTALL in line


@pytest.mark.parametrize("command", ["report", "why"])
def test_make_that_raises_is_one_line_with_a_hint_exit_1(tmp_path, capsys, command):
    """make() raising is the user's code failing, not a bad argument: exit 1, as README says of other failures."""
    target = tmp_path / "raising.py"
    target.write_text("def make():\n    raise RuntimeError('weights not found\\nsecond line')\n")
    assert main([command, f"{target}:make", "--device", "cpu"]) == 1
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line == (
        f"fusion-guard {command}: make() raised RuntimeError: weights not found (--traceback for the full traceback)"
    )
    # --traceback shows what make() raised, with its own frames, and keeps the status
    with pytest.raises(RuntimeError, match="weights not found"):
        main([command, f"{target}:make", "--device", "cpu", "--traceback"])


@pytest.mark.parametrize("command", ["report", "why"])
def test_a_target_that_raises_while_imported_is_one_line_with_a_hint_exit_1(tmp_path, capsys, command):
    """TARGET's module raising is the user's code failing, as make() raising: exit 1 (it was 2), and report and
    why word it alike, with the --traceback hint."""
    target = tmp_path / "broken.py"
    target.write_text("raise ImportError('no module for the weights')\n\ndef make():\n    pass\n")
    line = _one_line_error(capsys, [command, f"{target}:make", "--device", "cpu"], code=1)
    assert line == (
        f"fusion-guard {command}: importing {target} raised ImportError: no module for the weights "
        f"{common.TRACEBACK_HINT}"
    )


def test_one_rule_for_every_commands_errors(capsys):
    """tools.common.error_exit: a bad argument is one line and 2; any other failure one line ending in the one
    --traceback hint, and 1; with --traceback the failure goes on."""
    assert common.error_exit("fusion-guard x", common.UsageError("--bad: no"), False) == 2
    assert capsys.readouterr().err == "fusion-guard x: --bad: no\n"
    assert common.error_exit("fusion-guard x", RuntimeError("first\nsecond"), False) == 1
    assert capsys.readouterr().err == f"fusion-guard x: RuntimeError: first {common.TRACEBACK_HINT}\n"
    assert common.error_exit("fusion-guard x", common.CommandFailed("the model failed; here"), False) == 1
    assert capsys.readouterr().err == f"fusion-guard x: the model failed; here {common.TRACEBACK_HINT}\n"
    with pytest.raises(RuntimeError, match="first"):
        try:
            raise RuntimeError("first")
        except RuntimeError as e:
            common.error_exit("fusion-guard x", e, True)


SCATTER_TARGET = Path(__file__).with_name("scatter_target.py")


def test_a_model_failing_in_a_region_says_where_whose_and_what_to_try(capsys, monkeypatch):
    """A model Thunder cannot run (the torch.compile region holding scatter_reduce's automatic gradient; the guard
    told not to rescue it): the one line names the region, its ops and the user's line, says that it fails
    without the guard too but runs with --thunderfx, and gives what 'why --thunderfx' offers for the op; the hint
    once, exit 1."""
    import functools

    import thunder_fusion_guard.tools.report_cli as report_cli

    target = SCATTER_TARGET
    no_rescue = functools.partial(report_cli.run_report, guard_options={"rescue": False})
    monkeypatch.setattr(report_cli, "run_report", no_rescue)
    assert main(["report", f"{target}:make", "--device", "cpu"]) == 1
    *progress, line = capsys.readouterr().err.strip().splitlines()
    assert progress == ["fusion-guard report: the model failed; running it once more without the guard ..."]
    assert line.startswith(f"fusion-guard report: {target}:make failed under thunder.jit: Unsupported: "), line
    assert "; it fails unguarded too; with --thunderfx it runs" in line, line  # Inductor runs scatter_reduce there
    assert "; in the backward region TorchCompile" in line, line
    assert "scatter_reduce_vjp is the gradient of torch.scatter_reduce at scatter_target.py:8" in line, line
    assert "why --thunderfx on torch.scatter_reduce: Thunder has only an automatic torch fallback" in line, line
    assert "ThunderFX runs it with Inductor" in line and line.endswith(common.TRACEBACK_HINT), line
    assert line.count("--traceback") == 1


def test_model_that_fails_under_thunder_is_one_line_exit_1(tmp_path, capsys):
    target = tmp_path / "failing.py"
    target.write_text(
        textwrap.dedent(
            """
            import torch

            def broken(x):
                raise ValueError("shape mismatch in the model")

            def make():
                return broken, (torch.ones(2),)
            """
        )
    )
    assert main(["report", f"{target}:make", "--device", "cpu"]) == 1
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith(f"fusion-guard report: {target}:make failed under thunder.jit: ValueError: shape mismatch")
    assert "; it fails unguarded too" in line and "at failing.py:5" in line  # the line that raised
    assert "--thunderfx" not in line  # it fails through ThunderFX too
    assert line.endswith("(--traceback for the full traceback)")


DATA_DEPENDENT_BRANCH = """
import torch

def step(x):
    y = x.sin()
    if y.sum() > 0:  # thunder.jit cannot trace this branch; Dynamo breaks the graph at it
        y = y * 2
    return y.cos()

def make():
    return step, (torch.ones(4),)
"""


@pytest.mark.usefixtures("no_inductor")
def test_a_model_thunder_jit_cannot_trace_is_pointed_to_thunderfx(tmp_path, capsys):
    """Where the model fails under thunder.jit unguarded too but runs through ThunderFX, the one line says
    that --thunderfx works; a model that fails under ThunderFX too gets no such advice (the test above)."""
    target = tmp_path / "branch.py"
    target.write_text(DATA_DEPENDENT_BRANCH)
    assert main(["report", f"{target}:make", "--device", "cpu"]) == 1
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert "; it fails unguarded too; with --thunderfx it runs" in line, line
    assert main(["report", f"{target}:make", "--device", "cpu", "--thunderfx"]) == 0


INDEX_ADD_LAYER = """
import torch


class Scatter(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 3)

    def forward(self, src, index):
        return torch.zeros(4, 3).index_add(0, index, self.lin(src)).sum()


def make():
    return Scatter(), (torch.randn(5, 3), torch.tensor([0, 1, 1, 3, 2]))
"""


@pytest.mark.usefixtures("no_inductor")
def test_a_model_that_runs_translated_is_pointed_to_translate_library_ops(tmp_path, capsys):
    """index_add has no gradient in Thunder 0.2.6: the one line names translate_library_ops(), which gives it one,
    and leaves the translations as they were."""
    from thunder_fusion_guard import library_ops_translated
    from thunder_fusion_guard._thunder import library_ops_are_translated

    target = tmp_path / "gnn.py"
    target.write_text(INDEX_ADD_LAYER)
    assert main(["report", f"{target}:make", "--device", "cpu", "--backward"]) == 1
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert "prims.index_add" in line and "; it fails unguarded too; after " in line, line
    assert "translate_library_ops() it runs" in line, line
    assert not library_ops_are_translated()
    with library_ops_translated():  # already translated: nothing to suggest
        assert main(["report", f"{target}:make", "--device", "cpu", "--backward"]) == 0


def test_version(capsys):
    assert main(["--version"]) == 0
    out = capsys.readouterr().out.strip()
    assert out.startswith("fusion-guard 0.1.0 (torch ") and "lightning-thunder 0.2.6" in out and "nvFuser" in out


def test_help_is_written_for_users(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for text in ("examples:", "fusion-guard demo", "fusion-guard report model.py:make", "--traceback", "exit 2"):
        assert text in out, text


def test_threads_are_pinned_for_cpu_timing():
    threads = torch.get_num_threads()
    try:
        assert common.pin_threads(None, "cpu").startswith("timed with 1 intra-op thread ")
        assert torch.get_num_threads() == 1
        assert "timed with 2 intra-op threads" in common.pin_threads(2, "cpu")
        assert torch.get_num_threads() == 2
        assert common.pin_threads(None, "cuda") == ""
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("command", ["demo", "report", "calibrate", "bench run", "bench decisions", "bench versus"])
def test_every_timing_command_takes_threads(command, capsys):
    """One thread setting for every command that times on CPU: --threads N, one intra-op thread by default."""
    with pytest.raises(SystemExit) as e:
        main([*command.split(), "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert e.value.code == 0 and "--threads N" in out and "(default 1:" in out, out


@pytest.mark.usefixtures("no_inductor")  # the pinning is the subject, not the kernels
def test_report_pins_one_thread_and_says_so(capsys):
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert main(["report", "examples/report_target.py:make", "--device", "cpu"]) == 0
        assert torch.get_num_threads() == 1
        out = capsys.readouterr().out
        assert out.strip().splitlines()[-1].startswith("(timed with 1 intra-op thread ")
        assert max(len(line) for line in out.splitlines()) <= 120, out  # tables fit 120 columns
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("command", ["report", "why", "demo"])
def test_every_command_printing_a_table_takes_wide(command, capsys):
    """Tables fit 120 columns, long text wrapped; --wide prints each row on one line."""
    with pytest.raises(SystemExit) as e:
        main([command, "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert e.value.code == 0 and "--wide print each table row on one line, however long" in out, out


def _env() -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    env.pop("PYTHONWARNINGS", None)
    return env


def _bad_target(lane, folder):
    cmd = [sys.executable, "-m", "thunder_fusion_guard", "report", "missing.py:make", "--device", "cpu"]
    return lane.run(cmd, cwd=folder, env=_env())


@pytest.mark.background.with_args(_bad_target)  # its process runs beside the other tests (tests/conftest.py)
def test_python_dash_m_bad_target_is_one_line_without_import_warnings(background):
    """Through a real process: Thunder's and torch's import-time warnings do not reach the user."""
    done = background
    assert done.returncode == 2
    assert done.stderr.strip() == "fusion-guard report: missing.py: no such file", done.stderr
    assert done.stdout == ""


@pytest.mark.parametrize(
    "argv", [["bench", "run"], ["bench", "compare"], ["bench", "decisions"], ["bench", "versus"], ["report"]]
)
def test_every_command_help_has_a_description(capsys, argv):
    with pytest.raises(SystemExit) as exit_info:
        main([*argv, "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    description = out.split("\n\n")[1]  # after the usage lines
    assert len(description.split()) >= 15 and not description.lstrip().startswith(("positional", "options")), out
    assert "``" not in out, out


def _every_parser(parser, name="fusion-guard"):
    """(command, parser) of ``parser`` and of each subcommand under it, however deep."""
    yield name, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub_name, sub in action.choices.items():
                yield from _every_parser(sub, f"{name} {sub_name}")


def test_no_help_shows_a_doubled_percent_sign(monkeypatch):
    """argparse unescapes %% in an option's help only; a description or epilog shows it as typed."""
    monkeypatch.setenv("COLUMNS", "120")
    helps = {name: parser.format_help() for name, parser in _every_parser(cli.build_parser())}
    assert "fusion-guard bench decisions" in helps and "5%" in helps["fusion-guard bench decisions"]
    assert [name for name, text in helps.items() if "%%" in text] == []


def test_calibrate_prints_a_readable_summary_and_json_on_request(tmp_path, capsys, monkeypatch):
    import json

    import thunder_fusion_guard.measure.calibrate as calibrate
    from thunder_fusion_guard.cost import CostConstants
    from thunder_fusion_guard.shipped_constants import SHIPPED

    constants = CostConstants.from_dict(SHIPPED[0][2])
    monkeypatch.setattr(calibrate, "calibrate", lambda device, executor, save: constants)
    threads = torch.get_num_threads()
    try:
        assert main(["calibrate", "--device", "cpu", "--no-save", "--json", str(tmp_path / "c.json")]) == 0
    finally:
        torch.set_num_threads(threads)
    out = capsys.readouterr().out
    assert out.startswith("cost constants for torchcompile on cpu (timed with 1 intra-op thread")
    for label in (
        "fusion call overhead   13.4 µs per call",
        "eager op dispatch",
        "bandwidth",
        "eager GB/s by size",
        "compute, ns/element    var_mean 4.32",
        "matmul                 117 GFLOP/s",
        "not saved (--no-save)",
    ):
        assert label in out, (label, out)
    assert "{" not in out  # no raw JSON on the console
    assert json.loads((tmp_path / "c.json").read_text())["fusion_call_us"] == 13.408


KEEP_THE_LOGGER = """
import logging, sys
seen = []
class Keep(logging.Handler):
    def emit(self, record):
        seen.append((record.levelno, record.getMessage()))
logging.getLogger("thunder_fusion_guard").addHandler(Keep())
logging.getLogger("thunder_fusion_guard").setLevel(logging.DEBUG)
"""  # a script's start: what the package logs, kept in `seen`

IMPORT_WITH_A_LOGGER = KEEP_THE_LOGGER + textwrap.dedent(
    """
    from thunder_fusion_guard import FusionGuard
    import thunder, torch.utils.cpp_extension
    print([m for level, m in seen if level == logging.DEBUG and "transformer_engine" in m])
    """
)


def _library_import(lane, folder):
    return lane.run([sys.executable, "-c", IMPORT_WITH_A_LOGGER], cwd=folder, env=_env())


@pytest.mark.background.with_args(_library_import)  # its process runs beside the other tests (tests/conftest.py)
def test_library_import_prints_nothing_to_stderr(background):
    """Importing the guard (which imports Thunder and the torch module that looks for CUDA_HOME) prints none
    of their optional-dependency notices; they go to the thunder_fusion_guard logger at DEBUG. (The README
    test checks the same for compiling, on every snippet.)"""
    done = background
    assert done.returncode == 0, done.stderr
    assert done.stderr == "", done.stderr
    assert "transformer_engine module not found" in done.stdout  # on the logger, at DEBUG


PLAIN_IMPORT_THEN_THUNDER = KEEP_THE_LOGGER + textwrap.dedent(
    """
    import thunder_fusion_guard
    print(sorted(m for m in ("torch", "thunder") if m in sys.modules))
    import thunder
    print([m for level, m in seen if level == logging.DEBUG and "transformer_engine" in m])
    """
)


def _plain_import_then_thunder(lane, folder):
    return lane.run([sys.executable, "-c", PLAIN_IMPORT_THEN_THUNDER], cwd=folder, env=_env())


@pytest.mark.background.with_args(_plain_import_then_thunder)  # its process runs beside the other tests
def test_plain_package_import_leaves_the_users_import_of_thunder_as_it_is(background):
    """After a plain ``import thunder_fusion_guard`` (which imports neither torch nor Thunder), the user's own
    ``import thunder`` is Thunder's: whatever it prints, it prints (nothing of it reaches our logger), as in a
    process without the package."""
    done = background
    assert done.returncode == 0, done.stderr
    light, logged = done.stdout.splitlines()
    assert light == "[]" and logged == "[]"
    alone = subprocess.run([sys.executable, "-c", "import thunder"], capture_output=True, text=True, env=_env())
    assert ("transformer_engine" in done.stderr) == ("transformer_engine" in alone.stderr)
