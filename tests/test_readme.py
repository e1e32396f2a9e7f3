"""README.md's Python snippets run as written, each alone in a fresh process in an empty folder (as a reader
pastes one into a new file), and print what the README says they print: on CPU with the default run, on
CUDA (nvFuser) with ``-m cuda``. In the default run the snippets run one at a time from the start of the
test run, beside the other tests (tests/conftest.py, BackgroundLane). README's options table is the one
GuardOptions' fields make, and every file under benchmarks/results is cited by RESULTS.md or README.md."""

import dataclasses
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
    "for t in tfg.translate_library_ops()": ("torch.tensordot: permute, reshape and matmul",),
    "translate_library_ops()  # before the first call of anything compiled": ("subgraph 0", "why not fused:"),
    "nequip_potential(device": ("forces within", "FusionGuard:"),
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


def missing_extra(code: str, result: subprocess.CompletedProcess) -> str | None:
    """The optional package a snippet failed without, where the snippet names its extra (``pip install ".[X]"``)."""
    found = re.search(r"ModuleNotFoundError: No module named '(\w+)", result.stderr)
    if result.returncode and found and f'pip install ".[{found.group(1)}]"' in code:
        return found.group(1)
    return None


def check(done: list[subprocess.CompletedProcess], device: str) -> None:
    """Every snippet ran and printed what README says; one whose optional extra is not installed here is
    skipped, with its reason, after the others were checked."""
    blocks = snippets()
    assert len(done) >= 3, "README lost its snippets"
    missing = []
    for i, (code, result) in enumerate(zip(blocks, done, strict=True)):
        where = f"README python block {i + 1}"
        extra = missing_extra(code, result)
        if extra:
            missing.append(f'{where} needs the extra {extra!r} (pip install ".[{extra}]")')
            continue
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
    if missing:
        pytest.skip("; ".join(missing))


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


def test_a_snippet_without_its_optional_extra_is_told_apart_from_a_failure():
    code = 'from thunder_fusion_guard.bench.zoo_potentials import nequip_potential  # pip install ".[nequip]"\n'
    lacking = subprocess.CompletedProcess([], 1, "", "ModuleNotFoundError: No module named 'nequip'\n")
    assert missing_extra(code, lacking) == "nequip"
    other = subprocess.CompletedProcess([], 1, "", "ModuleNotFoundError: No module named 'e3nn'\n")
    assert missing_extra(code, other) is None  # a package the snippet does not name as an extra: a failure
    assert missing_extra(code, subprocess.CompletedProcess([], 0, "", "")) is None


def options_table(text: str) -> list[str]:
    """The rows between README's ``<!-- options -->`` markers, header and rule left out."""
    found = re.search(r"^<!-- options -->\n(.*?)^<!-- /options -->", text, flags=re.M | re.S)
    assert found, "README.md lost its options markers"
    return [line for line in found.group(1).splitlines() if line.startswith("| `")]


def test_readme_options_table_is_the_one_guard_options_makes():
    from thunder_fusion_guard.options import GROUPS, GuardOptions, documented

    records = [GuardOptions, *GROUPS]
    undocumented = [f.name for r in records for f in dataclasses.fields(r) if "doc" not in f.metadata]
    assert not undocumented, f"option fields without a one-line metadata['doc']: {', '.join(undocumented)}"
    expected = [f"| `{name}` | `{default!r}` | {doc} |" for name, default, doc in documented()]
    assert options_table(README.read_text()) == expected


def test_readme_options_table_names_every_option_in_field_order():
    """Holds before the meanings are reconciled: one row per option (a group's fields after it, ``group.field``),
    in field order, with its default."""
    from thunder_fusion_guard.options import documented

    rows = [re.match(r"\| `([\w.]+)` \| `(.*?)` \|", row).groups() for row in options_table(README.read_text())]
    assert rows == [(name, repr(default)) for name, default, _ in documented()]


def test_readme_lists_every_public_name():
    import thunder_fusion_guard

    api = README.read_text().split("## Public API", 1)[1].split("\n## ", 1)[0]
    missing = [name for name in thunder_fusion_guard.__all__ if f"- `{name}" not in api]
    assert not missing, f"README's Public API does not list {missing}"


def test_every_result_file_is_cited():
    """Each file under benchmarks/results is named, by its path or a folder of it, in RESULTS.md or README.md."""
    results = REPO / "benchmarks" / "results"
    cited = (REPO / "benchmarks" / "RESULTS.md").read_text() + README.read_text()
    listed = subprocess.run(["git", "ls-files", "-z", "benchmarks/results"], cwd=REPO, capture_output=True, text=True)
    if listed.returncode == 0:  # the files in the repository, not a GPU run's output left in the folder
        files = [REPO / name for name in listed.stdout.split("\0") if name]
    else:  # a copy without git
        files = [p for p in results.rglob("*") if p.is_file()]
    uncited = []
    for path in sorted(files):
        parts = path.relative_to(results).parts
        folders = ["/".join(parts[:i]) + "/" for i in range(1, len(parts))]  # a folder is cited as `results/NAME/`
        names = [*folders, "/".join(parts)]
        if not any(re.search(rf"results/{re.escape(name)}(?![\w./-])", cited) for name in names):
            uncited.append("/".join(parts))
    assert not uncited, f"files under benchmarks/results named in neither RESULTS.md nor README.md: {uncited}"


def test_every_cited_result_file_exists():
    """The reverse: each `results/...` path that RESULTS.md or README.md names is there (a file, or a folder
    named with its trailing slash), so that a superseded file can leave the tree only with its citation."""
    cited = (REPO / "benchmarks" / "RESULTS.md").read_text() + README.read_text()
    names = set(re.findall(r"`results/([\w./-]+)`", cited))
    assert names, "RESULTS.md cites no result file"
    missing = sorted(n for n in names if not (REPO / "benchmarks" / "results" / n).exists())
    assert not missing, f"cited in RESULTS.md or README.md but not under benchmarks/results: {missing}"


def test_results_is_a_reference_not_a_notebook():
    """RESULTS.md holds each topic's current figure and a short history: at most 200 lines."""
    lines = (REPO / "benchmarks" / "RESULTS.md").read_text().count("\n")
    assert lines <= 200, f"RESULTS.md has {lines} lines; keep the current figure of each topic, history short"
