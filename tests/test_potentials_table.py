"""benchmarks/potentials_table.py: the jobs of gpu_potentials.sh as one result (potentials-<gpu>-<sha>.json): a row
per model and path, ``untranslated`` and ``cueq`` told apart, a path its job never timed said so, a dead process's
row given by hand; bad arguments exit 2 before any work."""

from __future__ import annotations

import json

import pytest
from helpers import load_benchmark


@pytest.fixture(scope="module")
def table():
    return load_benchmark("potentials_table")


def _job(tmp_path, name, model, rows, translated=True, commit="c" * 40, package=None):
    path = tmp_path / f"{name}.json"
    doc = {"commit": commit, "machine": {"device": "x"}, "translated": translated, "models": {model: rows}}
    path.write_text(json.dumps(doc | ({"package_sha256": package} if package else {})))
    return path


def test_jobs_merge_into_one_row_per_model_and_path(table, tmp_path):
    timed = {"ms": 1.2, "kernels": 449.0, "device_ms": 1.18, "first_call_s": 115.0, "max_abs_force_diff": 3e-7}
    guarded = {
        **timed,
        "codes": {"rescued": 1},
        "rescued": [{"where": "subgraph 2/forward", "error": "", "reproduction": None}],
    }
    jobs = [
        _job(tmp_path, "mace-inductor", "mace", {"eager": {"ms": 34.6}, "inductor+stepgraph": timed}, translated=False),
        _job(tmp_path, "mace-translated", "mace", {"eager": {"ms": 29.8}, "fx-guarded+stepgraph": guarded}),
        _job(
            tmp_path, "mace-cueq", "mace-cueq", {"eager": {"ms": 38.6}, "inductor+stepgraph": timed}, translated=False
        ),
        _job(
            tmp_path,
            "nequip-inductor",
            "nequip",
            {"eager": {"first_call_s": 0.7}, "inductor-ro": {"first_call_s": 516.5}},
        ),
    ]
    out = tmp_path / "out.json"
    failed = "mace/fx-guarded+stepgraph untranslated=segmentation fault"
    assert table.main([*map(str, jobs), "--commit", "d" * 40, "--json", str(out), "--failed", failed]) == 0
    doc = json.loads(out.read_text())
    assert doc["commit"] == "d" * 40
    mace = doc["models"]["mace"]
    assert set(mace) == {
        "eager",
        "inductor+stepgraph untranslated",
        "fx-guarded+stepgraph",
        "cueq eager",
        "cueq inductor+stepgraph untranslated",
        "fx-guarded+stepgraph untranslated",
    }
    assert mace["eager"]["eager_ms"] == 34.6  # the first job's eager is the model's
    assert mace["fx-guarded+stepgraph"]["eager_ms"] == 29.8 and mace["fx-guarded+stepgraph"]["job"] == "mace-translated"
    assert mace["fx-guarded+stepgraph"]["rescued"] == ["subgraph 2/forward: run eagerly from its first call"]
    assert mace["fx-guarded+stepgraph untranslated"] == {"error": "segmentation fault"}
    assert {k: mace["inductor+stepgraph untranslated"][k] for k in timed} == timed
    assert "not timed" in doc["models"]["nequip"]["inductor-ro"]["error"]


@pytest.mark.parametrize("bad", [["--failed", "no-slash=why"], ["--failed", "mace/path"], ["missing.json"]])
def test_bad_arguments_exit_2_before_writing(table, tmp_path, bad):
    job = _job(tmp_path, "j", "mace", {"eager": {"ms": 1.0}})
    out = tmp_path / "out.json"
    args = [str(job), "--commit", "d" * 40, "--json", str(out)]
    args = [bad[0], *args[1:]] if bad == ["missing.json"] else args + bad
    with pytest.raises(SystemExit) as exit_:
        table.main(args)
    assert exit_.value.code == 2 and not out.exists()


def _head_and_its_package():
    import subprocess

    package_hash = load_benchmark("package_hash")
    head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=package_hash.ROOT)
    if head.returncode != 0:
        pytest.skip("needs the git repository")
    return head.stdout.strip(), package_hash.commit_package_sha256("HEAD")


def test_the_package_the_jobs_ran_is_recorded_and_jobs_of_two_packages_are_refused(table, tmp_path, capsys):
    head, package = _head_and_its_package()
    out = tmp_path / "out.json"
    same = [_job(tmp_path, f"j{i}", f"m{i}", {"eager": {"ms": 1.0}}, package=package) for i in range(2)]
    assert table.main([*map(str, same), "--commit", head, "--json", str(out)]) == 0
    assert json.loads(out.read_text())["package_sha256"] == package
    other = _job(tmp_path, "j2", "m2", {"eager": {"ms": 1.0}}, package="b" * 64)
    out.unlink()
    with pytest.raises(SystemExit) as exit_:
        table.main([str(same[0]), str(other), "--commit", head, "--json", str(out)])
    assert exit_.value.code == 2 and not out.exists()
    assert "ran different packages" in capsys.readouterr().err


def test_the_commit_must_be_the_one_whose_package_ran_and_rows_carry_it(table, tmp_path, capsys):
    """A job labelled with a stale commit (its git copy's) gets the checked commit, its label kept beside."""
    head, package = _head_and_its_package()
    out = tmp_path / "out.json"
    job = _job(tmp_path, "j", "m", {"eager": {"ms": 1.0}, "x": {"ms": 0.5}}, commit="c" * 40, package=package)
    assert table.main([str(job), "--commit", head, "--json", str(out)]) == 0
    row = json.loads(out.read_text())["models"]["m"]["x"]
    assert (row["commit"], row["job_commit"]) == (head, "c" * 40)
    ran_elsewhere = _job(tmp_path, "k", "m", {"eager": {"ms": 1.0}}, package="a" * 64)
    out.unlink()
    for commit, why in ((head, "the jobs ran aaaaaaaaaaaa"), ("d" * 40, "no such commit")):
        with pytest.raises(SystemExit) as exit_:
            table.main([str(ran_elsewhere), "--commit", commit, "--json", str(out)])
        assert exit_.value.code == 2 and not out.exists() and why in capsys.readouterr().err


def test_eager_row_gains_the_run_to_run_difference_of_a_later_job(table, tmp_path):
    spread = {"ms": 30.0, "run_to_run_max_abs_force_diff": 6e-7}
    jobs = [
        _job(tmp_path, "nequip-matmuls", "nequip", {"eager": {"ms": 28.2}, "inductor+stepgraph": {"ms": 1.3}}),
        _job(tmp_path, "nequip-eager", "nequip", {"eager": spread}),
        _job(tmp_path, "nequip-eager-again", "nequip", {"eager": {**spread, "run_to_run_max_abs_force_diff": 1.0}}),
    ]
    out, md = tmp_path / "out.json", tmp_path / "out.md"
    assert table.main([*map(str, jobs), "--commit", "d" * 40, "--json", str(out), "--markdown", str(md)]) == 0
    eager = json.loads(out.read_text())["models"]["nequip"]["eager"]
    assert eager["ms"] == 28.2 and eager["job"] == "nequip-matmuls"  # the first job's timing stays
    assert eager["run_to_run_max_abs_force_diff"] == 6e-7 and eager["run_to_run_job"] == "nequip-eager"
    assert "| nequip | eager | 28.2 |" in md.read_text() and "| 6.0e-07 |" in md.read_text()


def test_a_path_stopped_while_choosing_backends_keeps_its_first_call(table, tmp_path):
    rows = {"eager": {"ms": 40.0}, "fx-guarded+backends+stepgraph": {"before_choice_s": 285.2}}
    job = _job(tmp_path, "nequip-backends", "nequip", rows)
    out, md = tmp_path / "out.json", tmp_path / "out.md"
    assert table.main([str(job), "--commit", "d" * 40, "--json", str(out), "--markdown", str(md)]) == 0
    row = json.loads(out.read_text())["models"]["nequip"]["fx-guarded+backends+stepgraph"]
    assert row["before_choice_s"] == 285.2 and "ms" not in row
    assert "choose_backends" in row["error"] and "285.2" in row["error"]
    assert "| 285.2 before the choice |" in md.read_text()  # the table's error cell is cut short: said in its column
    assert "during choose_backends | |" in md.read_text()  # cut where the first call's clause begins, no half number


def test_a_path_stopped_after_its_choice_says_the_choice_ended(table, tmp_path):
    """A path whose choose_backends ended (``choose_s``) and whose job stopped before its timing is not said to have
    stopped while choosing."""
    path = "fx-guarded+backends+stepgraph"
    rows = {"eager": {"ms": 40.0}, path: {"before_choice_s": 68.0, "choose_s": 437.4, "first_call_s": 505.4}}
    job = _job(tmp_path, "nequip-backends", "nequip", rows)
    out, md = tmp_path / "out.json", tmp_path / "out.md"
    assert table.main([str(job), "--commit", "d" * 40, "--json", str(out), "--markdown", str(md)]) == 0
    row = json.loads(out.read_text())["models"]["nequip"][path]
    assert "during choose_backends" not in row["error"] and "437.4" in row["error"] and "ms" not in row


def test_a_row_timed_before_its_choice_keeps_the_paths_measured_beside_it(table, tmp_path):
    """The paths timed with a guarded step before its choice are timed again after it: that row keeps what they
    measured then (``beside``), its eager among them, and the table says it under the rows."""
    beside = {"eager": {"ms": 22.35, "kernels": 927.0}, "inductor+stepgraph": {"ms": 0.735, "kernels": 204.0}}
    rows = {
        "eager": {"ms": 27.06},
        "inductor+stepgraph": {"ms": 0.873, "kernels": 204.0},
        "fx-guarded before choice+stepgraph": {"ms": 0.603, "kernels": 141.0, "beside": beside},
    }
    out, md = tmp_path / "out.json", tmp_path / "out.md"
    job = _job(tmp_path, "mace-backends", "mace", rows)
    assert table.main([str(job), "--commit", "d" * 40, "--json", str(out), "--markdown", str(md)]) == 0
    mace = json.loads(out.read_text())["models"]["mace"]
    assert mace["fx-guarded before choice+stepgraph"]["beside"] == beside
    assert mace["fx-guarded before choice+stepgraph"]["eager_ms"] == 22.35  # the eager timed beside it
    assert mace["inductor+stepgraph"]["eager_ms"] == 27.06
    assert "inductor+stepgraph 0.735 ms, 204.0 kernels" in md.read_text()


def test_a_path_compared_with_eager_then_stopped_before_its_timing_keeps_its_force_difference(table, tmp_path):
    """A job stopped while it waited to time (the values are compared first): its row says so, with the forces'
    difference in the table's column."""
    rows = {"eager": {"first_call_s": 0.8}, "guarded": {"first_call_s": 191.7, "max_abs_force_diff": 8e-7}}
    job = _job(tmp_path, "nequip-jit-runs", "nequip", rows, translated=False)
    out, md = tmp_path / "out.json", tmp_path / "out.md"
    assert table.main([str(job), "--commit", "d" * 40, "--json", str(out), "--markdown", str(md)]) == 0
    row = json.loads(out.read_text())["models"]["nequip"]["guarded untranslated"]
    assert row["error"].endswith("its values compared") and row["max_abs_force_diff"] == 8e-7
    (line,) = [line for line in md.read_text().splitlines() if "guarded untranslated" in line]
    assert line.endswith("| 191.7 | 8.0e-07 |")
