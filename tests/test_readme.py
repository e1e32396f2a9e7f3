"""README.md's Python snippets run as written, each alone in a fresh process in an empty folder (as a reader
pastes one into a new session), and print what the README says they print: on CPU with the default run, on
CUDA (nvFuser) with ``-m cuda``. In the default run the snippets run one at a time from the start of the
session, beside the other tests (tests/conftest.py, BackgroundLane)."""

import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
NO_REGION = ("nothing compiled yet", "made no fusion region", "no fusion region in the final traces")
# What each snippet prints (first line of the snippet that names it -> texts its output must hold).
EXPECTED = {
    "class BandedScores": ("FusionGuard:", "hoist", "x faster"),
    "print(profile)": ("profile of",),
    "thunderfx(Scores()": ("subgraph 0",),
    "choose_backends(compiled, x, w": ("dynamo graph 0, thunder_0: ", "dynamo graph 1, thunder_0: "),
    "report.html": ("wrote report.html and decisions.html",),
}


def snippets() -> list[str]:
    """The ```python blocks of README.md, in order (```python torchrun blocks, parts of a script torchrun
    starts, aside)."""
    return re.findall(r"^```python\n(.*?)^```", README.read_text(), flags=re.M | re.S)


def test_every_python_block_runs_or_says_why_not():
    fences = re.findall(r"^```python(.*)$", README.read_text(), flags=re.M)
    assert all(f in ("", " torchrun") for f in fences), fences
    assert fences.count(" torchrun") <= 1
    blocks = snippets()
    assert len(blocks) == len(EXPECTED), "a README snippet was added or removed: say what it prints in EXPECTED"
    for key in EXPECTED:
        assert sum(key in b for b in blocks) == 1, key


def _run_alone(code: str, index: int, folder: Path, popen=subprocess.Popen) -> subprocess.CompletedProcess:
    work = folder / f"block{index + 1}"
    work.mkdir()
    (work / "snippet.py").write_text(code)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)}
    env.pop("PYTHONWARNINGS", None)
    cmd = [sys.executable, "snippet.py"]
    process = popen(cmd, cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = process.communicate(timeout=600)
    except subprocess.TimeoutExpired:
        process.kill()
        out, err = process.communicate()
    return subprocess.CompletedProcess(cmd, process.returncode, out, err)


def run_snippets(folder: Path, at_once: int = 2, popen=subprocess.Popen) -> list[subprocess.CompletedProcess]:
    """Each snippet alone, in a fresh process and folder (``at_once`` at a time)."""
    blocks = snippets()
    with ThreadPoolExecutor(at_once) as pool:
        return list(pool.map(_run_alone, blocks, range(len(blocks)), [folder] * len(blocks), [popen] * len(blocks)))


def snippets_in_background(lane, folder: Path) -> list[subprocess.CompletedProcess]:
    """The default run's job (tests/conftest.py, BackgroundLane): one snippet at a time, beside the tests
    that run in the test process."""
    return run_snippets(folder, at_once=1, popen=lane.popen)


def check(done: list[subprocess.CompletedProcess], device: str) -> None:
    blocks = snippets()
    assert len(done) >= 4, "README lost its snippets"
    for i, (code, result) in enumerate(zip(blocks, done, strict=True)):
        where = f"README python block {i + 1}"
        assert result.returncode == 0, f"{where} failed on its own:\n{result.stderr[-3000:]}"
        assert not any(s in result.stdout for s in NO_REGION), f"{where} printed:\n{result.stdout}"
        (expected,) = [texts for key, texts in EXPECTED.items() if key in code]
        for text in expected:
            assert text in result.stdout, f"{where} did not print {text!r}:\n{result.stdout}"
        if "profile of" in expected and device == "cpu":  # CPU timings name the thread count
            assert "intra-op thread" in result.stdout
        # the guard is imported before thunder: no import-time notice reaches the console
        for notice in ("transformer_engine module not found", "CUDA_HOME"):
            assert notice not in result.stderr, f"{where} printed {notice!r}:\n{result.stderr}"


@pytest.mark.background.with_args(snippets_in_background)
def test_readme_snippets_run_alone_and_decide(background):
    done = background
    check(done, "cuda" if torch.cuda.is_available() else "cpu")
    first = done[0].stdout
    # the first example shows the guard acting (a non-keep decision) and a measured gain
    assert re.search(r"\b(hoist|fold|reject|remove)\b", first)
    assert re.search(r"unguarded [\d.]+ µs, guarded [\d.]+ µs per call: [\d.]+x faster", first), first


@pytest.mark.cuda
def test_readme_snippets_run_alone_and_decide_on_cuda(tmp_path):
    done = run_snippets(tmp_path)
    check(done, "cuda")
    assert "nvfuser" in done[0].stdout
