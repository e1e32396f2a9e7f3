"""The zoo on CPU: three third-party models through Thunder unguarded and guarded (torch.compile executor), each in
a process of its own as `fusion-guard bench zoo` runs them. The guard must never turn a program that runs into one
that fails, and its outputs and gradients must equal unguarded Thunder's to the bit (or stay within Thunder's own
run-to-run difference). No timing: ``rounds=0``, and the guard decides by its cost model alone."""

from __future__ import annotations

import json
import sys

import pytest

from thunder_fusion_guard.bench import zoo
from thunder_fusion_guard.bench.zoo_models import ZOO

# A path pair each model runs on with thunder 0.2.6 on CPU: ViT through thunder.jit; the nn.MultiheadAttention
# encoder and BERT only through ThunderFX (thunder.jit fails on both without the guard).
CPU_CASES = {"timm-vit": ("thunder", "guarded"), "nn-mha": ("fx", "fx-guarded"), "hf-bert": ("fx", "fx-guarded")}
GUARD = {"measure_budget_s": 0}  # no real timing decides a region: the model does


def _zoo(lane, folder):
    results = {}
    for name, paths in CPU_CASES.items():
        if not ZOO[name].available():
            results[name] = None
            continue
        out = folder / f"{name}.json"
        code = (
            "import json, sys, time, torch; from pathlib import Path; torch.set_num_threads(1);"
            "from thunder_fusion_guard.bench import zoo;"
            f"zoo.run_model({name!r}, 'cpu', {list(paths)!r}, 0, time.time() + 600, Path({str(out)!r}),"
            f" lambda m: print(m, file=sys.stderr), {GUARD!r})"
        )
        done = lane.run([sys.executable, "-c", code], timeout=600)
        results[name] = (done.returncode, done.stderr[-2000:], json.loads(out.read_text()) if out.exists() else None)
    return results


@pytest.mark.background.with_args(_zoo)  # the models compile beside the other tests (tests/conftest.py)
@pytest.mark.parametrize("name", list(CPU_CASES))
def test_guard_runs_where_thunder_runs_and_keeps_its_bits(background, name):
    if background[name] is None:
        pytest.skip(f"{ZOO[name].requires} is not installed")
    returncode, stderr, result = background[name]
    assert returncode == 0 and result is not None, stderr
    unguarded, guarded = CPU_CASES[name]
    rows = result["paths"]
    assert rows[unguarded]["runs"], rows[unguarded].get("error")
    assert rows[guarded]["runs"], f"the guard broke a program Thunder runs: {rows[guarded].get('error')}"
    assert rows[guarded]["bits"] in ("bitwise", "within Thunder's own difference"), rows[guarded]
    assert sum(rows[guarded]["actions"].values()) > 0  # the guard saw the regions and decided each


def test_zoo_models_are_from_four_libraries_at_least():
    assert len(ZOO) >= 10 and len({e.library for e in ZOO.values()}) >= 4


def test_summary_rows_say_what_failed_and_compare_to_thunder():
    result = {
        "model": "m",
        "paths": {
            "eager": {"runs": True, "samples_s": [0.004, 0.004, 0.004]},
            "thunder": {"runs": True, "samples_s": [0.002, 0.002, 0.002], "first_call_s": 3.0},
            "guarded": {"runs": True, "samples_s": [0.001, 0.001, 0.001], "bits": "bitwise", "actions": {"keep": 2}},
            "fx": {"runs": False, "error": "AssertionError: expected size"},
            zoo.BACKEND_CHOICE: {"runs": True, "actions": {"keep": 1}, "backends": {"inductor": 2, "thunder": 1}},
        },
    }
    rows = {r[1]: r for r in zoo.summary_rows([result])[1:]}
    assert rows["guarded"][3] == "bitwise" and rows["guarded"][5] == "0.50" and rows["guarded"][6] == "0.25"
    assert rows["fx"][2].startswith("no: AssertionError") and rows["guarded"][9] == "2 keep"
    assert rows[zoo.BACKEND_CHOICE][9] == "1 keep; subgraphs to inductor 2, thunder 1"
    assert zoo.BACKEND_CHOICE not in zoo.BASELINE  # it may round differently: compared with no Thunder path


def test_a_rescued_path_is_compared_with_eager_and_its_rescues_listed():
    import torch

    result = {
        "model": "m",
        "paths": {
            "eager": {"runs": True, "samples_s": [0.004] * 3},
            "fx": {"runs": False, "error": "RuntimeError: Attempting to reshape"},
            "fx-guarded": {
                "runs": True, "samples_s": [0.006] * 3, "compared_with": "eager", "bits": "within eager's tolerance",
                "rescues": [
                    {"where": "subgraph 0", "reason": "RuntimeError: Attempting to reshape", "rescued_by": "Inductor"},
                    {"where": "subgraph 1", "reason": "RuntimeError: Attempting to reshape", "rescued_by": "Inductor"},
                    {"where": "subgraph 2", "reason": "outputs 0 handed back in the strides Dynamo recorded"},
                ],
            },
        },
    }  # fmt: skip
    rows = {r[1]: r for r in zoo.summary_rows([result])[1:]}
    assert rows["fx-guarded"][3] == "within eager's tolerance"
    assert rows["fx-guarded"][5] == "-" and rows["fx-guarded"][6] == "1.50"  # no x thunder: thunder failed
    assert zoo.rescue_lines([result]) == [
        "m fx-guarded: rescue x2: Inductor: RuntimeError: Attempting to reshape",
        "m fx-guarded: rescue x1: restrided: outputs 0 handed back in the strides Dynamo recorded",
    ]
    eager = [torch.tensor([1.0, 2.0], dtype=torch.bfloat16)]
    assert zoo._against_eager(eager, eager) == "bitwise equal to eager"
    assert zoo._against_eager([eager[0] + 0.01], eager) == "within eager's tolerance"
    assert zoo._against_eager([eager[0] + 1], eager) == "outside eager's tolerance (max abs difference 1)"


def test_difference_is_zero_only_for_equal_bits():
    import torch

    a = [torch.tensor([1.0, 2.0]), None]
    assert zoo._difference(a, [torch.tensor([1.0, 2.0]), None]) == 0.0
    assert zoo._difference(a, [torch.tensor([1.0, 2.5]), None]) == 0.5
    assert zoo._difference(a, [torch.tensor([1.0, 2.0]), torch.zeros(1)]) is None
    names = ["the loss", "the gradient of w"]
    assert zoo._against_eager(a, [torch.tensor([1.0, 2.0]), torch.zeros(1)], names) == (
        "different tensors from eager (the gradient of w is None here, a tensor there)"
    )
    assert zoo._mismatch([torch.zeros(2)], [torch.zeros(3)], names) == (
        "the loss is (2,) torch.float32 here, (3,) torch.float32 there"
    )


def test_path_groups_keep_each_guarded_path_with_its_twin_and_eager_in_every_group():
    groups = zoo.path_groups(zoo.paths_for("cuda"))
    assert groups == [
        ["eager", "inductor", "inductor-ro"],
        ["eager", "thunder", "guarded"],
        ["eager", "cudagraph", "guarded+cudagraph"],
        ["eager", "fx", "fx-guarded"],
        ["eager", "fx-cudagraph", "fx-guarded+cudagraph"],
        ["eager", zoo.BACKEND_CHOICE],
    ]
    assert sorted({p for g in groups for p in g}) == sorted(zoo.paths_for("cuda"))
    assert zoo.path_groups(["fx", "thunder"]) == [["fx"], ["thunder"]]


def test_merge_groups_keeps_each_paths_first_record_and_every_problem():
    parts = [
        {"model": "m", "paths": {"eager": {"runs": True, "n": 1}, "inductor": {"runs": True}}},
        {"model": "m", "paths": {"eager": {"runs": True, "n": 2}, "thunder": {"runs": False}}, "problem": "a (x)"},
        {"model": "m", "paths": {}, "problem": "b (y)"},
    ]
    merged = zoo.merge_groups(parts)
    assert list(merged["paths"]) == ["eager", "inductor", "thunder"] and merged["paths"]["eager"]["n"] == 1
    assert merged["problem"] == "a (x); b (y)"
    assert "problem" not in zoo.merge_groups(parts[:1])


def test_with_split_each_path_is_compared_with_the_eager_timed_in_its_own_process():
    """Eager heads every group; a path's x eager uses its own group's eager, not the first group's."""
    ms = 1e-3
    parts = [
        {"model": "m", "paths": {"eager": {"runs": True, "samples_s": [10 * ms]}, "inductor": {"runs": True,
                                                                                      "samples_s": [5 * ms]}}},
        {"model": "m", "paths": {"eager": {"runs": True, "samples_s": [20 * ms]},
                                 "thunder": {"runs": True, "samples_s": [18 * ms]},
                                 "guarded": {"runs": True, "bits": "bitwise", "samples_s": [16 * ms]}}},
    ]  # fmt: skip
    rows = {(r[0], r[1]): r for r in zoo.summary_rows([zoo.merge_groups(parts)])[1:]}
    assert rows["m", "eager"][4] == "10.00" and rows["m", "inductor"][6] == "0.50"
    assert rows["m", "thunder"][6] == "0.90" and rows["m", "guarded"][6] == "0.80"  # against 20 ms, not 10
    assert rows["m", "guarded"][5] == "0.89" and rows["m", "guarded"][7] == "3.20"
    one = {"model": "m", "paths": {**parts[0]["paths"], **parts[1]["paths"]}}  # one process: one eager
    assert "eager_samples_s" not in zoo.merge_groups([one])["paths"]["guarded"]


def test_a_thunder_path_whose_compile_would_pass_the_deadline_is_not_started(monkeypatch, tmp_path):
    """The guess is the longest Thunder first call so far: once it would end past the deadline the path is
    recorded as not compiled and the paths that compiled are still there to time. No clock is read for real."""
    import torch

    from thunder_fusion_guard.bench import zoo_models

    model = zoo_models.ZooModel(torch.nn.Linear(2, 2), (torch.ones(1, 2),), zoo_models._sum)
    entry = zoo_models.ZooEntry("tiny", "torch", "a linear layer", lambda device: model, "torch")
    monkeypatch.setitem(zoo_models.ZOO, "tiny", entry)
    monkeypatch.setattr(zoo, "_compile", lambda module, path, device, options=None: (module, None))
    now = [1000.0]
    calls = iter([0.0, 0.0, 0.0, 40.0])  # perf_counter around each first call: eager's takes 0 s, thunder's 40 s

    monkeypatch.setattr(zoo.time, "perf_counter", lambda: next(calls))
    monkeypatch.setattr(zoo.time, "time", lambda: now[0])
    result, steps = zoo._compile_paths(
        "tiny", "cpu", ["eager", "thunder", "fx"], tmp_path / "r.json", lambda m: None, None, deadline=1050.0
    )
    assert list(steps) == ["eager", "thunder"]
    assert result["paths"]["fx"]["error"].startswith("not compiled: its compile (about 52 s) would end past")


def test_bench_zoo_split_runs_path_groups_and_says_so(monkeypatch, capsys, tmp_path):
    """`bench zoo --split` hands split=True to run_zoo and the footnote says which paths were interleaved; a bad
    model name exits 2 before any work."""
    from thunder_fusion_guard.tools.cli import main

    seen = {}

    def fake_run_zoo(models, device, paths, rounds, limit, log, threads, jobs, split=False, translate=False):
        seen.update(models=models, paths=paths, jobs=jobs, split=split, translate=translate)
        return [{"model": models[0], "paths": {"eager": {"runs": True, "samples_s": [0.001]}}}]

    monkeypatch.setattr(zoo, "run_zoo", fake_run_zoo)
    out = tmp_path / "z.json"
    argv = ["bench", "zoo", "--device", "cpu", "--models", "nn-mha", "--paths", "eager,thunder,guarded"]
    assert main([*argv, "--split", "--jobs", "3", "--rounds", "1", "--translate", "--json", str(out)]) == 0
    want = {"models": ["nn-mha"], "paths": ["eager", "thunder", "guarded"], "jobs": 3, "split": True, "translate": True}
    assert seen == want
    printed = capsys.readouterr().out
    assert "paths of one process interleaved" in printed and "translate_library_ops()" in printed
    assert json.loads(out.read_text())["zoo"][0]["model"] == "nn-mha"
    seen.clear()
    assert main(["bench", "zoo", "--models", "no-such-model"]) == 2 and seen == {}
    assert "--models: unknown no-such-model" in capsys.readouterr().err


def test_help_names_every_zoo_model_and_failures_name_their_limitation():
    assert set(zoo.MODEL_NAMES) == set(ZOO)
    result = {
        "model": "m",
        "paths": {
            "thunder": {"runs": False, "error": "RuntimeError: Failed to find a gradient transform for bound symbol"},
            "fx": {"runs": False, "error": "RuntimeError: " + "x" * 300},
            "eager": {"runs": True},
        },
    }
    known, unknown = zoo.error_lines([result])
    assert known.endswith("[known Thunder limitation: ::test_index_add_grad]") and "Failed to find a gradient" in known
    assert len(known) <= 120 and len(unknown) == 120 and unknown.endswith("…")
