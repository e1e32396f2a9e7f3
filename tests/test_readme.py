"""README.md's Python snippets run as written, in order, in one namespace (as a reader pastes them into
one session), and produce decisions: on CPU with the default run, on CUDA (nvFuser) with ``-m cuda``."""

import contextlib
import io
import os
import re
import tempfile
from pathlib import Path

import pytest
import torch

from thunder_fusion_guard import FusionGuard

README = Path(__file__).resolve().parents[1] / "README.md"
NO_REGION = ("nothing compiled yet", "made no fusion region", "no fusion region in the final traces")


def snippets() -> list[str]:
    """The ```python blocks of README.md, in order (```python torchrun blocks, parts of a script torchrun
    starts, aside)."""
    return re.findall(r"^```python\n(.*?)^```", README.read_text(), flags=re.M | re.S)


def test_every_python_block_runs_or_says_why_not():
    fences = re.findall(r"^```python(.*)$", README.read_text(), flags=re.M)
    assert all(f in ("", " torchrun") for f in fences), fences
    assert fences.count(" torchrun") <= 1


def run_snippets() -> tuple[dict, list[str]]:
    """Execute every snippet in one namespace, in a fresh folder (snippets write files); the namespace
    and what each snippet printed."""
    namespace: dict = {"__name__": "readme"}
    printed = []
    threads = torch.get_num_threads()
    here = os.getcwd()
    with tempfile.TemporaryDirectory() as folder:
        os.chdir(folder)
        try:
            _run(namespace, printed, threads)
        finally:
            os.chdir(here)
    return namespace, printed


def _run(namespace: dict, printed: list[str], threads: int) -> None:
    try:
        for i, code in enumerate(snippets()):
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                exec(compile(code, f"README.md python block {i + 1}", "exec"), namespace)
            printed.append(out.getvalue())
    finally:
        torch.set_num_threads(threads)  # the profile snippet pins one thread


def check(namespace: dict, printed: list[str]) -> None:
    assert len(printed) >= 3, "README lost its snippets"
    for i, text in enumerate(printed):
        assert not any(s in text for s in NO_REGION), f"README python block {i + 1} printed:\n{text}"
    guard = namespace["guard"]
    assert isinstance(guard, FusionGuard)
    assert [d for d in guard.report if d.about_region], "the first snippet's guard decided no region"
    assert "FusionGuard:" in printed[0] and "decisions" in printed[0]
    assert "profile of" in printed[1]
    if namespace["device"] == "cpu":  # CPU timings name the thread count; CUDA ones do not need it
        assert "intra-op thread" in printed[1]
    assert "subgraph 0" in printed[2], printed[2]


def test_readme_snippets_run_and_decide():
    namespace, printed = run_snippets()
    check(namespace, printed)
    assert namespace["device"] == ("cuda" if torch.cuda.is_available() else "cpu")


@pytest.mark.cuda
def test_readme_snippets_run_and_decide_on_cuda():
    namespace, printed = run_snippets()
    check(namespace, printed)
    assert namespace["device"] == "cuda"
    assert "nvfuser" in {d.executor for d in namespace["guard"].report}
