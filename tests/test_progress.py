"""Progress of long work on stderr: a guarded program's first call, why_not_fused and report show their phase and
regions done of regions found where asked (TFG_PROGRESS=1) or on a terminal, rewritten in place there, and print
nothing where stderr is no terminal and nothing asks."""

import io
import re
import sys

import pytest
import torch
from helpers import jit_cpu

from thunder_fusion_guard import FusionGuard
from thunder_fusion_guard.examine.why import why_not_fused
from thunder_fusion_guard.progress import ENV, Progress

pytestmark = pytest.mark.usefixtures("no_inductor")  # the lines are the subject, not Inductor's kernels


def f(x):
    return torch.sin(x) * 2.0 + torch.cos(x)


COUNT = re.compile(r"(\d+)/(\d+) regions")


class Terminal(io.StringIO):
    """A stderr that says it is a terminal."""

    def isatty(self) -> bool:
        return True


def _first_call():
    """A guarded program's first call (forward and backward); the guard."""
    guard = FusionGuard()
    x = torch.randn(8, 8, requires_grad=True)
    jitted = jit_cpu(f, guard)
    jitted(x).sum().backward()
    return jitted, guard


def test_first_call_and_why_show_phases_and_regions_when_asked(monkeypatch, capsys):
    monkeypatch.setenv(ENV, "1")
    jitted, guard = _first_call()
    err = capsys.readouterr().err
    regions = {t: sum(d.about_region and d.trace == t for d in guard.report) for t in ("forward", "backward")}
    assert regions["forward"] >= 1 and regions["backward"] >= 1, err
    for trace, found in regions.items():
        lines = [line for line in err.splitlines() if f"{trace} trace" in line]
        counts = [tuple(map(int, m.groups())) for line in lines for m in [COUNT.search(line)] if m]
        assert counts and counts[-1] == (found, found), err  # the last line: every region found is done
        assert all(done <= total == found for done, total in counts), err
    why_not_fused(jitted)
    err = capsys.readouterr().err
    assert "why_not_fused" in err and re.search(r"1/1 programs", err), err


def test_quiet_without_a_terminal(monkeypatch, capsys):
    monkeypatch.delenv(ENV, raising=False)
    assert not sys.stderr.isatty()
    jitted, _ = _first_call()
    why_not_fused(jitted)
    err = capsys.readouterr().err
    assert not COUNT.search(err) and "why_not_fused" not in err, err


def test_off_on_a_terminal_when_told(monkeypatch):
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    monkeypatch.setenv(ENV, "0")
    _first_call()
    assert terminal.getvalue() == ""


def test_a_terminal_line_is_rewritten_in_place_and_ended_once(monkeypatch):
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    monkeypatch.delenv(ENV, raising=False)
    with Progress("task") as shown:
        for done in range(4):
            shown.update("step", done, 3, "regions")
    text = terminal.getvalue()
    assert text.endswith("\n") and text.count("\n") == 1 and text.startswith("\r"), repr(text)
    assert "3/3 regions" in text.rsplit("\r", 1)[-1], repr(text)


def test_a_task_inside_another_starts_a_line_of_its_own(monkeypatch):
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    monkeypatch.delenv(ENV, raising=False)
    with Progress("outer") as outer:
        outer.update("first")
        with Progress("inner") as inner:
            inner.update("work", 1, 1, "regions")
        outer.update("second", 1, 1, "regions")
    lines = terminal.getvalue().split("\n")
    assert [line.rsplit("\r", 1)[-1].split(":")[0] for line in lines if line] == ["outer", "inner", "outer"], lines


def test_a_long_phase_on_a_terminal_shows_how_long_it_has_run(monkeypatch):
    """A compile that says nothing for a while (one Inductor graph) still moves its line: the phase's elapsed time,
    on a terminal only. The clock is handed in: no real wait."""
    import thunder_fusion_guard.progress as progress

    monkeypatch.setattr(progress, "HEARTBEAT_S", 1.0)
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    monkeypatch.delenv(ENV, raising=False)
    with Progress("first call") as shown:
        shown._stop.set()  # the beating thread stops: the test beats by hand
        shown.update("compiling TorchCompile3")
        began = shown.since
        shown.beat(shown.last + 0.5)  # too soon: nothing
        assert "(" not in terminal.getvalue()
        shown.beat(began + 12.2)
        assert terminal.getvalue().rsplit("\r", 1)[-1].rstrip() == "first call: compiling TorchCompile3 (12 s)"
        shown.update("deciding", 1, 2, "regions")
    assert terminal.getvalue().rsplit("\r", 1)[-1].rstrip() == "first call: deciding 1/2 regions"
    piped = io.StringIO()
    monkeypatch.setattr(sys, "stderr", piped)
    monkeypatch.setenv(ENV, "1")
    with Progress("task") as logged:
        logged.update("compiling")
        logged.beat(logged.since + 30)
        assert logged._heart is None  # no terminal: no heartbeat
    assert piped.getvalue() == "task: compiling\n"
