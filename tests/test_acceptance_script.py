"""benchmarks/gpu_acceptance.py and benchmarks/package_hash.py without a GPU: the package hash, the newest
committed acceptance result against the commit it names, the script's small pieces, a CPU smoke run (slow)."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import load_benchmark

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def package_hash():
    return load_benchmark("package_hash")


@pytest.fixture(scope="module")
def acceptance():
    module = load_benchmark("gpu_acceptance")  # also puts benchmarks/ on sys.path for its gpu_models import
    yield module
    sys.modules.pop("gpu_acceptance", None)


def _git(*args):
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True)


def _write(root, files):
    for path, text in files:
        target = root / "thunder_fusion_guard" / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)


def test_package_hash_is_stable_and_sees_every_file_but_caches(package_hash, tmp_path):
    files = [("a.py", "x = 1\n"), ("sub/b.py", "y = 2\n"), ("data/table.json", "{}\n")]
    _write(tmp_path / "one", files)
    _write(tmp_path / "two", list(reversed(files)))  # written in another order: the same hash
    first = package_hash.package_sha256(tmp_path / "one")
    assert first == package_hash.package_sha256(tmp_path / "one") == package_hash.package_sha256(tmp_path / "two")
    assert first == package_hash.hash_files([(p, t.encode()) for p, t in files])
    _write(tmp_path / "one", [("__pycache__/a.cpython-312.pyc", "junk"), ("sub/__pycache__/b.pyc", "junk")])
    assert package_hash.package_sha256(tmp_path / "one") == first
    _write(tmp_path / "one", [("data/table.json", "{}\n\n")])
    assert package_hash.package_sha256(tmp_path / "one") != first
    # a path and its content cannot trade bytes: ("ab", "c") and ("a", "bc") differ
    assert package_hash.hash_files([("ab", b"c")]) != package_hash.hash_files([("a", b"bc")])


def test_working_tree_hash_equals_heads_when_the_package_is_clean(package_hash):
    if shutil.which("git") is None or _git("rev-parse", "HEAD").returncode:
        pytest.skip("not a git checkout")
    if _git("status", "--porcelain", "--", "thunder_fusion_guard").stdout.strip():
        pytest.skip("thunder_fusion_guard/ has uncommitted changes")
    assert package_hash.package_sha256(ROOT) == package_hash.commit_package_sha256("HEAD")


def test_newest_committed_acceptance_result_names_its_commits_package(package_hash):
    if shutil.which("git") is None or _git("rev-parse", "HEAD").returncode:
        pytest.skip("not a git checkout")
    paths = _git("ls-files", "benchmarks/results/acceptance-*.json").stdout.split()
    if not paths:
        pytest.skip("no acceptance result committed yet")
    newest = max(paths, key=lambda p: (int(_git("log", "-1", "--format=%ct", "--", p).stdout.strip() or 0), p))
    doc = json.loads(_git("show", f"HEAD:{newest}").stdout)
    assert doc.get("commit"), f"{newest} names no commit"
    if _git("cat-file", "-e", f"{doc['commit']}^{{commit}}").returncode:
        pytest.skip(f"{newest}: commit {doc['commit']} is not in this clone (shallow?)")
    assert package_hash.commit_package_sha256(doc["commit"]) == doc["package_sha256"], (
        f"{newest}: its package_sha256 is not the package of commit {doc['commit']}"
    )


def test_gpu_names_and_result_names(acceptance):
    assert acceptance.gpu_slug("NVIDIA H100 80GB HBM3") == "h100"
    assert acceptance.gpu_slug("NVIDIA H200") == "h200"
    assert acceptance.gpu_slug("NVIDIA A100-SXM4-80GB") == "a100"
    assert acceptance.gpu_slug("Some GPU!") == "some-gpu"
    assert acceptance.result_name("NVIDIA H100 80GB HBM3", "5ce3ff092767ec68", False) == "acceptance-h100-5ce3ff0"
    assert acceptance.result_name("cpu (smoke)", None, True) == "acceptance-cpu-smoke-nocommit"


def test_commit_comes_from_the_argument_then_the_environment(acceptance, monkeypatch):
    monkeypatch.setenv("TFG_COMMIT", "abc123")
    assert acceptance.resolve_commit("def456") == ("def456", "--commit")
    assert acceptance.resolve_commit(None) == ("abc123", "TFG_COMMIT")


def test_pytest_results_from_junit_xml_and_from_the_verbose_log(acceptance, tmp_path):
    xml = tmp_path / "r.xml"
    xml.write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase classname="tests.test_a" name="test_ok"/>'
        '<testcase classname="tests.test_a" name="test_bad"><failure message="boom"/></testcase>'
        '<testcase classname="tests.test_b" name="test_skip"><skipped message="needs a CUDA GPU"/></testcase>'
        '<testcase classname="tests.test_b" name="test_err"><error message="setup"/></testcase>'
        "</testsuite></testsuites>"
    )
    got = acceptance.pytest_results(xml)
    assert (got["passed"], got["failed"], got["errors"], got["skipped"]) == (1, 1, 1, 1)
    assert got["failures"] == ["tests.test_a::test_bad", "tests.test_b::test_err (error)"]
    assert got["skip_reasons"] == {"needs a CUDA GPU": 1}
    log = "\n".join(
        [
            "tests/test_a.py::test_ok PASSED                [ 25%]",
            "tests/test_a.py::test_bad[x-1] FAILED          [ 50%]",
            "tests/test_b.py::test_skip SKIPPED (needs a GPU) [ 75%]",
            "some other line",
        ]
    )
    got = acceptance.pytest_log_results(log)
    assert (got["passed"], got["failed"], got["skipped"]) == (1, 1, 1)
    assert got["failures"] == ["tests/test_a.py::test_bad[x-1]"]


def test_hoist_record_counts_hoist_decisions_bytes_and_reasons(acceptance):
    from thunder_fusion_guard import Decision

    def decision(region, action, reason, **details):
        return Decision("forward", region, "nvfuser", ["full"], action, reason, details=details)

    record = acceptance.hoist_record(
        [
            decision("nvFusion1", "hoist", "every input is input-independent"),
            decision("hoisted_constants", "hoist", "input-independent", bytes=1024, ops_saved_per_call=39),
            decision("hoisted_constants", "hoist", "input-independent", bytes=1024, ops_saved_per_call=39),
            decision("hoisted_constants", "keep", "over hoist_max_bytes"),
            decision("nvFusion2", "keep", "fusion call is worth it"),
        ]
    )
    assert (record["decisions"], record["bytes"], record["ops_saved_per_call"]) == (3, 2048, 78)
    assert record["reasons"] == {"every input is input-independent": 1, "input-independent": 2}
    assert record["kept"] == ["over hoist_max_bytes"]


def _doc(device, medians, equal=True, hoists=2):
    variants = {label: {"median_ms": ms} for label, ms in medians.items()}
    variants["guarded"]["hoist"] = {"decisions": hoists}
    for label in ("guarded", "guarded+cudagraph"):
        if label in variants:
            variants[label].update(output_equal=True, grads_equal=equal)
    builds = dict.fromkeys(medians, "")
    return {"device": device, "variants": variants, "builds": builds}


def test_done_when_on_an_h100_and_elsewhere(acceptance):
    """Gated: guarded against the guard without hoisting (<= 0.40x) and CUDA graphs against guarded (<= 0.90x),
    both within the run; the ratios to eager are reported, above the 0.35x line or not, and never fail the run."""
    medians = {"eager": 20.0, "guarded hoist=False": 14.0, "guarded": 5.0, "guarded+cudagraph": 4.0}
    checks = acceptance.done_when(_doc("NVIDIA H100 80GB HBM3", medians))
    assert checks["guarded_over_hoist_false"]["value"] == 0.357 and checks["guarded_over_hoist_false"]["pass"] is True
    assert checks["guarded_cudagraph_over_guarded"]["value"] == 0.8
    assert checks["guarded_cudagraph_over_guarded"]["pass"] is True and checks["all_pass"] is True
    assert checks["guarded_over_eager"]["value"] == 0.25 and checks["guarded_over_eager"]["above_watch_line"] is False
    slow = acceptance.done_when(_doc("NVIDIA H100 80GB HBM3", {**medians, "guarded": 6.2, "guarded+cudagraph": 6.0}))
    assert slow["guarded_over_hoist_false"]["pass"] is False and slow["guarded_cudagraph_over_guarded"]["pass"] is False
    assert slow["all_pass"] is False
    host_bound = acceptance.done_when(_doc("NVIDIA H100 80GB HBM3", {**medians, "eager": 12.0}))
    assert host_bound["guarded_over_eager"]["above_watch_line"] is True and host_bound["all_pass"] is True
    # A host twice as slow: the same ratios pass on it.
    h200 = acceptance.done_when(_doc("NVIDIA H200", {k: 2 * v for k, v in medians.items()}))
    assert h200["all_pass"] is True
    assert acceptance.done_when(_doc("NVIDIA H100", medians, equal=False))["all_pass"] is False
    assert acceptance.done_when(_doc("NVIDIA H100", medians, hoists=0))["all_pass"] is False
    no_graphs = {k: v for k, v in medians.items() if k != "guarded+cudagraph"}
    doc = _doc("NVIDIA H100", no_graphs)
    doc["builds"]["guarded+cudagraph"] = ""  # built, but skipped: the checks cannot pass
    assert acceptance.done_when(doc)["all_pass"] is False


@pytest.mark.slow
def test_smoke_run_on_cpu(tmp_path):
    """The whole script on CPU with a tiny Mistral (about 3 minutes on 2 cores: torch.compile compiles)."""
    pytest.importorskip("litgpt")
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gpu_acceptance.py"), "--smoke", "--rounds", "10"],
        cwd=ROOT,
        env={**__import__("os").environ, "OUT": str(tmp_path), "TFG_COMMIT": "0123456789abcdef"},
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    doc = json.loads((tmp_path / "acceptance-cpu-smoke-0123456.json").read_text())
    assert doc["commit"] == "0123456789abcdef" and len(doc["package_sha256"]) == 64
    assert set(doc["variants"]) == {"eager", "guarded hoist=False", "guarded"}
    assert all("median_ms" in v for v in doc["variants"].values())
    assert doc["done_when"]["bitwise_equal_to_hoist_false"]["pass"] is True
    assert doc["first_jit"]["cache_was_empty"] is True and "first_call_s" in doc["first_jit"]
    assert doc["pytest"]["rc"] is not None and doc["pytest"]["failed"] == 0
    assert (tmp_path / "acceptance-cpu-smoke-0123456.md").exists()
    assert "Gates:" in result.stdout
