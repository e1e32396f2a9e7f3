"""The zoo on CPU: three third-party models through Thunder unguarded and guarded (torch.compile executor), each in
a process of its own as `fusion-guard bench zoo` runs them. The guard must never turn a program that runs into one
that fails, and its outputs and gradients must equal unguarded Thunder's to the bit (or stay within Thunder's own
run-to-run difference). No timing: ``rounds=0``, and the guard decides by its cost model alone."""

from __future__ import annotations

import itertools
import json
import re
import sys
import time
from pathlib import Path

import pytest
import torch

from thunder_fusion_guard.bench import zoo, zoo_run
from thunder_fusion_guard.bench.zoo_models import ZOO
from thunder_fusion_guard.bench.zoo_output import HEADER, failure_lines, rescue_lines, summary_rows, table_rows, wrapped
from thunder_fusion_guard.bench.zoo_paths import (
    BACKEND_CHOICE,
    EAGER,
    GUARDED,
    MODEL_NAMES,
    PATH_NAMES,
    PATHS,
    ZooPath,
    path_groups,
    paths_for,
)
from thunder_fusion_guard.bench.zoo_records import KNOWN_LIMITATIONS, ModelResult, PathResult, Rescue, merge_groups
from thunder_fusion_guard.bench.zoo_run import ModelSpec, _compile_paths
from thunder_fusion_guard.bench.zoo_values import (
    _against_eager,
    _difference,
    _mismatch,
    compare_with_baselines,
    load_values,
    save_values,
)

# A path pair each model runs on with thunder 0.2.6 on CPU: ViT through thunder.jit; the nn.MultiheadAttention
# encoder and BERT only through ThunderFX (thunder.jit fails on both without the guard).
CPU_CASES = {"timm-vit": ("thunder", "guarded"), "nn-mha": ("fx", "fx-guarded"), "hf-bert": ("fx", "fx-guarded")}
# ViT (thunder.jit) in the default run; the two ThunderFX models, 80 s of a cold run, with --run-slow.
SLOW_CASES = {"nn-mha", "hf-bert"}
GUARD = {"costs": {"measure_budget_s": 0}}  # no real timing decides a region: the model does
P = ZooPath.parse


def _zoo(lane, folder, name):
    """One model's two paths in a process of its own (each parametrized test's own background job)."""
    if not ZOO[name].available():
        return None
    out = folder / f"{name}.json"
    spec = ModelSpec(name, "cpu", tuple(map(P, CPU_CASES[name])), 0, time.time() + 600, str(out), 1, GUARD)
    code = (
        "import sys; from thunder_fusion_guard.bench import zoo_run;"
        f"zoo_run.run_model(zoo_run.ModelSpec.from_json({spec.to_json()!r}), lambda m: print(m, file=sys.stderr))"
    )
    done = lane.run([sys.executable, "-c", code], timeout=600)
    return done.returncode, done.stderr[-2000:], json.loads(out.read_text()) if out.exists() else None


# Each model compiles beside the other tests (tests/conftest.py), one job a model.
@pytest.mark.parametrize(
    "name",
    [
        pytest.param(
            n, marks=[pytest.mark.background.with_args(_zoo, n), *([pytest.mark.slow] if n in SLOW_CASES else [])]
        )
        for n in CPU_CASES
    ],
)
def test_guard_runs_where_thunder_runs_and_keeps_its_bits(background, name):
    if background is None:
        pytest.skip(f"{ZOO[name].requires} is not installed")
    returncode, stderr, written = background
    assert returncode == 0 and written is not None, stderr
    result = ModelResult.from_dict(written)
    unguarded, guarded = map(P, CPU_CASES[name])
    rows = result.paths
    assert guarded.baseline == unguarded
    assert rows[unguarded].runs, rows[unguarded].error
    assert rows[guarded].runs, f"the guard broke a program Thunder runs: {rows[guarded].error}"
    assert rows[guarded].compared_with == unguarded
    assert rows[guarded].bits in ("bitwise", "within Thunder's own difference"), rows[guarded]
    assert sum(rows[guarded].actions.values()) > 0  # the guard saw the regions and decided each
    assert result.to_dict() == written  # what the process wrote reads back as it was


def test_zoo_models_are_from_four_libraries_at_least():
    assert len(ZOO) >= 10 and len({e.library for e in ZOO.values()}) >= 4


def _result(paths: dict, **kwargs) -> ModelResult:
    """A made-up model result: path names to PathResult keyword arguments."""
    return ModelResult("m", paths={P(p): PathResult(**row) for p, row in paths.items()}, **kwargs)


def test_every_zoo_path_is_parsed_from_its_name_and_printed_back_to_it():
    assert [p.name for p in PATHS] == list(PATH_NAMES) and len(set(PATHS)) == 12
    for path in PATHS:
        assert ZooPath.parse(path.name) == path and str(path) == path.name
    fx_cg = P("fx-guarded+cudagraph")
    assert (fx_cg.frontend, fx_cg.guarded, fx_cg.cudagraphs, fx_cg.backends) == ("ThunderFX", True, True, False)
    assert P("guarded") == ZooPath("thunder.jit", guarded=True) and P("inductor-ro").cuda_only
    assert P("fx-guarded+backends") == BACKEND_CHOICE and BACKEND_CHOICE.baseline is None
    assert {g.name: g.baseline.name for g in GUARDED} == {
        "guarded": "thunder", "guarded+cudagraph": "cudagraph", "fx-guarded": "fx",
        "fx-guarded+cudagraph": "fx-cudagraph",
    }  # fmt: skip
    assert [p.name for p in PATHS if p.is_baseline] == ["thunder", "cudagraph", "fx", "fx-cudagraph"]
    assert [p.name for p in paths_for("cpu")] == ["eager", "inductor", "thunder", "guarded", "fx", "fx-guarded",
                                                  "fx-guarded+backends"]  # fmt: skip
    for bad in ("cudagraph+guarded", "fx-", "thunder.jit", "fx-thunder", "guarded+guarded", "inductor+guarded"):
        with pytest.raises(ValueError, match="unknown zoo path"):
            P(bad)
    for bad in ("guarded+backends", "fx-backends"):  # the backend choice is guarded ThunderFX's alone
        with pytest.raises(ValueError, match="backend choice"):
            P(bad)
    with pytest.raises(ValueError, match="no guard"):
        ZooPath("eager", guarded=True)


def test_results_are_typed_and_read_back_from_the_json_they_write():
    result = _result(
        {
            "eager": {"runs": True, "samples_s": [0.004]},
            "fx": {"runs": False, "error": "RuntimeError: Attempting to reshape", "error_detail": "RuntimeError: x\ny"},
            "fx-guarded": {"runs": True, "compared_with": P("eager"), "difference": None, "bits": "different tensors",
                           "rescues": [Rescue("subgraph 0", "RuntimeError: Attempting to reshape", "Inductor")]},
        },
        translated=True, path_groups=[[P("eager"), P("fx"), P("fx-guarded")]],
    )  # fmt: skip
    written = json.loads(json.dumps(result.to_dict()))
    assert list(written["paths"]) == ["eager", "fx", "fx-guarded"] and written["path_groups"] == [
        list(written["paths"])
    ]
    assert written["paths"]["fx-guarded"]["compared_with"] == "eager"
    assert written["paths"]["fx-guarded"]["difference"] is None  # compared: null means other tensors
    assert written["paths"]["fx"]["error_detail"] == "RuntimeError: x\ny"  # the whole error
    assert written["paths"]["fx"]["known_limitation"] == (
        "tests/test_thunder_limitations.py::test_aliased_inputs_of_different_sizes_with_inplace"
    )
    assert ModelResult.from_dict(written) == result


RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
ZOO_RESULTS = sorted(  # paths under results/, folders of one run's reports included
    p.relative_to(RESULTS).as_posix() for p in RESULTS.rglob("zoo-*.json") if not p.name.startswith("zoo-kernels")
)


@pytest.mark.parametrize("name", ZOO_RESULTS)
def test_the_committed_zoo_results_read_as_typed_results(name):
    doc = json.loads((RESULTS / name).read_text())
    for record in doc["zoo"]:
        result = ModelResult.from_dict(record)
        assert [p.name for p in result.paths] == list(record["paths"])
        for path, row in result.paths.items():
            assert row.runs == record["paths"][path.name]["runs"] and row.bits == record["paths"][path.name].get("bits")
        assert summary_rows([result])  # the table can be made of it


def test_model_spec_is_one_json_argument_of_the_models_process(monkeypatch, tmp_path):
    spec = ModelSpec("nn-mha", "cpu", (P("eager"), P("fx-guarded")), 3, 12.5, str(tmp_path / "o.json"), 1,
                     {"costs": {"measure_budget_s": 0}}, True)  # fmt: skip
    assert ModelSpec.from_json(spec.to_json()) == spec
    seen = []
    monkeypatch.setattr(zoo, "run_model", lambda spec, log: seen.append(spec))
    assert zoo._main([spec.to_json()]) == 0 and seen == [spec]


def test_summary_rows_say_what_failed_and_compare_to_thunder():
    result = _result(
        {
            "eager": {"runs": True, "samples_s": [0.004, 0.004, 0.004]},
            "thunder": {"runs": True, "samples_s": [0.002, 0.002, 0.002], "first_call_s": 3.0},
            "guarded": {"runs": True, "samples_s": [0.001, 0.001, 0.001], "bits": "bitwise", "actions": {"keep": 2},
                        "compared_with": P("thunder"), "difference": 0.0},
            "fx": {"runs": False, "error": "AssertionError: expected size"},
            "fx-guarded+backends": {"runs": True, "actions": {"keep": 1}, "backends": {"inductor": 2, "thunder": 1}},
        }
    )  # fmt: skip
    rows = {r.path.name: r for r in summary_rows([result])}
    guarded = rows["guarded"]
    assert guarded.bits == "bitwise" and guarded.unguarded == P("thunder")
    assert guarded.x_unguarded == pytest.approx(0.5) and guarded.x_eager == pytest.approx(0.25)
    assert guarded.cells()[5] == "0.50 (thunder)" and guarded.cells()[9] == "2 keep"
    assert not rows["fx"].runs and rows["fx"].cells()[2] == "no: AssertionError"
    assert rows["fx-guarded+backends"].actions == "1 keep; subgraphs to inductor 2, thunder 1"
    assert BACKEND_CHOICE not in GUARDED  # it may round differently: compared with no Thunder path
    assert table_rows([result])[0] == list(HEADER) and len(table_rows([result])) == 6


def test_every_ratio_names_its_baseline_where_the_twin_with_cuda_graphs_failed():
    """fx-guarded+cudagraph whose twin fx-cudagraph failed is compared with fx: the table says fx, not thunder."""
    result = _result(
        {
            "fx": {"runs": True, "samples_s": [0.004] * 3},
            "fx-cudagraph": {"runs": False, "error": "AssertionError (no message) at thunder/cudagraph.py:359 in f"},
            "fx-guarded+cudagraph": {"runs": True, "samples_s": [0.002] * 3, "compared_with": P("fx"),
                                     "difference": 0.0, "bits": "bitwise"},
        }
    )  # fmt: skip
    rows = {r.path.name: r for r in summary_rows([result])}
    assert rows["fx-guarded+cudagraph"].unguarded == P("fx")
    assert rows["fx-guarded+cudagraph"].cells()[3:6] == ["bitwise (vs fx)", "2.00", "0.50 (fx)"]
    assert rows["fx-cudagraph"].cells()[2] == "no: AssertionError"
    assert "x thunder" not in HEADER and "x unguarded" in HEADER


def test_a_rescued_path_is_compared_with_eager_and_its_rescues_listed():
    import torch

    reshape = "RuntimeError: Attempting to reshape"
    result = _result(
        {
            "eager": {"runs": True, "samples_s": [0.004] * 3},
            "fx": {"runs": False, "error": reshape},
            "fx-guarded": {
                "runs": True, "samples_s": [0.006] * 3, "compared_with": P("eager"), "difference": 0.01,
                "bits": "within eager's tolerance",
                "rescues": [
                    Rescue("subgraph 0", reshape, "Inductor"),
                    Rescue("subgraph 1", reshape, "Inductor"),
                    Rescue("subgraph 2", "outputs 0 handed back in the strides Dynamo recorded"),
                ],
            },
        }
    )  # fmt: skip
    rows = {r.path.name: r for r in summary_rows([result])}
    assert rows["fx-guarded"].bits == "within eager's tolerance"
    assert rows["fx-guarded"].x_unguarded is None and rows["fx-guarded"].cells()[5] == "-"  # thunder failed
    assert rows["fx-guarded"].x_eager == pytest.approx(1.5)
    assert rows["fx"].cells()[2] == "no: RuntimeError (known Thunder limitation)"
    assert rescue_lines([result]) == [
        "m fx-guarded: rescue x2: Inductor: RuntimeError: Attempting to reshape",
        "m fx-guarded: rescue x1: restrided: outputs 0 handed back in the strides Dynamo recorded",
    ]
    eager = [torch.tensor([1.0, 2.0], dtype=torch.bfloat16)]
    assert _against_eager(eager, eager) == "bitwise equal to eager"
    assert _against_eager([eager[0] + 0.01], eager) == "within eager's tolerance"
    assert _against_eager([eager[0] + 1], eager) == "outside eager's tolerance (max abs difference 1)"


def test_a_guarded_path_that_differs_from_a_wrong_thunder_or_rescued_a_capture_says_how_it_compares_with_eager():
    """Unguarded ThunderFX's loss is wrong (a write lost); the guarded path's is eager's: the verdict says both. A
    guarded path with CUDA graphs whose unguarded twin failed is compared with fx and with eager."""
    import torch

    names = ["loss", "the gradient of w"]
    eager = [torch.tensor(-799.92), torch.tensor([1.0, 2.0])]
    wrong = [torch.tensor(-1253.17), torch.tensor([1.0, 2.0])]
    values = {EAGER: eager, P("fx"): wrong, P("fx-guarded"): list(eager), P("fx-guarded+cudagraph"): list(wrong)}
    result = ModelResult("m", paths={
        EAGER: PathResult(runs=True),
        P("fx"): PathResult(runs=True, self_difference=0.0),
        P("fx-cudagraph"): PathResult(runs=False, error="AssertionError"),
        P("fx-guarded"): PathResult(runs=True),
        P("fx-guarded+cudagraph"): PathResult(runs=True),
    })  # fmt: skip
    assert compare_with_baselines(result, {p: names for p in values}, values) == {
        P("fx-guarded"),
        P("fx-guarded+cudagraph"),
    }
    assert result.paths[P("fx-guarded")].bits == "differs vs fx; bitwise equal to eager"
    got = result.paths[P("fx-guarded+cudagraph")].bits
    assert got == "bitwise vs fx; outside eager's tolerance (max abs difference 453)"
    rows = {r.path.name: r for r in summary_rows([result])}
    assert rows["fx-guarded"].cells()[3] == "differs vs fx; bitwise equal to eager"  # no second "(vs fx)"


def test_difference_is_zero_only_for_equal_bits():
    import torch

    a = [torch.tensor([1.0, 2.0]), None]
    assert _difference(a, [torch.tensor([1.0, 2.0]), None]) == 0.0
    assert _difference(a, [torch.tensor([1.0, 2.5]), None]) == 0.5
    assert _difference(a, [torch.tensor([1.0, 2.0]), torch.zeros(1)]) is None
    names = ["the loss", "the gradient of w"]
    assert _against_eager(a, [torch.tensor([1.0, 2.0]), torch.zeros(1)], names) == (
        "different tensors from eager (the gradient of w is None here, a tensor there); the tensors both have: "
        "bitwise equal"
    )
    # A lost gradient does not hide a wrong loss: the tensors both have are compared all the same.
    assert _against_eager(a, [torch.tensor([1.0, 9.0]), torch.zeros(1)], names) == (
        "different tensors from eager (the gradient of w is None here, a tensor there); the tensors both have: "
        "outside tolerance (max abs difference 7)"
    )
    assert _mismatch([torch.zeros(2)], [torch.zeros(3)], names) == (
        "the loss is (2,) torch.float32 here, (3,) torch.float32 there"
    )


def test_path_groups_keep_each_guarded_path_with_its_twin_and_eager_in_every_group():
    groups = [[p.name for p in g] for g in path_groups(paths_for("cuda"))]
    assert groups == [
        ["eager", "inductor", "inductor-ro"],
        ["eager", "thunder", "guarded"],
        ["eager", "cudagraph", "guarded+cudagraph"],
        ["eager", "fx", "fx-guarded"],
        ["eager", "fx-cudagraph", "fx-guarded+cudagraph"],
        ["eager", "fx-guarded+backends"],
    ]
    assert sorted({p for g in groups for p in g}) == sorted(PATH_NAMES)
    assert path_groups([P("fx"), P("thunder")]) == [[P("fx")], [P("thunder")]]


def test_apart_every_thunder_path_runs_in_a_process_of_its_own_headed_by_eager():
    paths = [P("eager"), P("inductor"), P("fx"), P("fx-guarded"), P("fx-cudagraph"), P("fx-guarded+cudagraph")]
    groups = [[p.name for p in g] for g in path_groups(paths, apart=True)]
    assert groups == [["eager", "inductor"], ["eager", "fx"], ["eager", "fx-guarded"], ["eager", "fx-cudagraph"],
                      ["eager", "fx-guarded+cudagraph"]]  # fmt: skip


def test_paths_run_apart_are_compared_through_the_results_their_processes_saved(tmp_path):
    """A guarded path and its twin from two processes: bitwise where every result is equal, within Thunder's own
    difference where the twin differed from itself by as much, 'differs' beyond it, and which result is not the
    same tensor; eager's results are not what a guarded path is compared with when its twin ran."""
    import torch

    names = ["the loss", "the gradient of w"]
    twin = [torch.tensor(1.0), torch.tensor([0.5, 0.25], dtype=torch.bfloat16)]
    cases = {
        "bitwise": [t.clone() for t in twin],
        "within Thunder's own difference": [twin[0] + 2**-10, twin[1]],
        "differs": [twin[0] + 0.5, twin[1]],
        "different tensors (the gradient of w is None here, a tensor there); the tensors both have: bitwise": [
            twin[0],
            None,
        ],
        "different tensors (the gradient of w is None here, a tensor there); the tensors both have: differs": [
            twin[0] * 0,
            None,
        ],
    }
    for want, guarded in cases.items():
        save_values(tmp_path / "twin.pt", {P("fx"): names}, {P("fx"): twin})
        save_values(tmp_path / "guarded.pt", {P("fx-guarded"): names}, {P("fx-guarded"): guarded})
        result = ModelResult("m", paths={
            P("fx"): PathResult(runs=True, self_difference=2**-9),
            P("fx-guarded"): PathResult(runs=True, bits="within eager's tolerance", compared_with=EAGER),
        })  # fmt: skip
        loaded = [load_values(tmp_path / f) for f in ("twin.pt", "guarded.pt")]
        names_of = {p: n for got, _ in loaded for p, n in got.items()}
        values = {p: v for _, got in loaded for p, v in got.items()}
        assert compare_with_baselines(result, names_of, values) == {P("fx-guarded")}
        row = result.paths[P("fx-guarded")]
        if not want.startswith(("bitwise", "within")):  # where it differs from fx, its process's word on eager
            want += " vs fx; within eager's tolerance"
        assert (row.bits, row.compared_with) == (want, P("fx")), want
    assert load_values(tmp_path / "no-such.pt") == ({}, {})  # a process that saved nothing


def test_merge_groups_keeps_each_paths_first_record_and_every_problem():
    parts = [
        _result({"eager": {"runs": True, "first_call_s": 1.0}, "inductor": {"runs": True}}),
        _result({"eager": {"runs": True, "first_call_s": 2.0}, "thunder": {"runs": False}}, problem="a (x)"),
        _result({}, problem="b (y)"),
    ]
    merged = merge_groups(parts)
    assert list(merged.paths) == [P("eager"), P("inductor"), P("thunder")]
    assert merged.paths[P("eager")].first_call_s == 1.0
    assert merged.problem == "a (x); b (y)" and merged.path_groups == [[P("eager"), P("inductor")],
                                                                       [P("eager"), P("thunder")], []]  # fmt: skip
    assert merge_groups(parts[:1]).problem is None and merge_groups(parts[:1]).path_groups is None


def test_with_split_each_path_is_compared_with_the_eager_timed_in_its_own_process():
    """Eager heads every group; a path's x eager uses its own group's eager, not the first group's."""
    ms = 1e-3
    parts = [
        _result({"eager": {"runs": True, "samples_s": [10 * ms]}, "inductor": {"runs": True, "samples_s": [5 * ms]}}),
        _result({"eager": {"runs": True, "samples_s": [20 * ms]}, "thunder": {"runs": True, "samples_s": [18 * ms]},
                 "guarded": {"runs": True, "bits": "bitwise", "samples_s": [16 * ms]}}),
    ]  # fmt: skip
    rows = {r.path.name: r.cells() for r in summary_rows([merge_groups(parts)])}
    assert rows["eager"][4] == "10.00" and rows["inductor"][6] == "0.50"
    assert rows["thunder"][6] == "0.90" and rows["guarded"][6] == "0.80"  # against 20 ms, not 10
    assert rows["guarded"][5] == "0.89 (thunder)" and rows["guarded"][7] == "3.20"
    one = _result({**{p.name: vars(r) for p, r in parts[0].paths.items()},
                   **{p.name: vars(r) for p, r in parts[1].paths.items()}})  # fmt: skip
    assert merge_groups([one]).paths[P("guarded")].eager_samples_s is None  # one process: one eager


def test_a_thunder_path_whose_compile_would_pass_the_deadline_is_not_started(monkeypatch, tmp_path):
    """The guess is the longest Thunder first call so far: once it would end past the deadline the path is
    recorded as not compiled and the paths that compiled are still there to time. No clock is read for real."""
    import torch

    from thunder_fusion_guard.bench import zoo_models

    model = zoo_models.ZooModel(torch.nn.Linear(2, 2), (torch.ones(1, 2),), zoo_models._sum)
    entry = zoo_models.ZooEntry("tiny", "torch", "a linear layer", lambda device: model, "torch")
    monkeypatch.setitem(zoo_models.ZOO, "tiny", entry)
    monkeypatch.setattr(zoo_run, "_compile", lambda module, path, device, options=None: (module, None))
    now = [1000.0]
    calls = iter([0.0, 0.0, 0.0, 40.0])  # perf_counter around each first call: eager's takes 0 s, thunder's 40 s

    monkeypatch.setattr(zoo_run.time, "perf_counter", lambda: next(calls))
    monkeypatch.setattr(zoo_run.time, "time", lambda: now[0])
    out = tmp_path / "r.json"
    paths = [P("eager"), P("thunder"), P("fx")]
    result, steps = _compile_paths("tiny", "cpu", paths, out, lambda m: None, None, deadline=1050.0)
    assert list(steps) == paths[:2]
    assert result.paths[P("fx")].error.startswith("not compiled: its compile (about 52 s) would end past")
    assert result.paths[P("fx")].error_kind == "not compiled"
    assert ModelResult.from_dict(json.loads(out.read_text())) == result  # saved as it went


# Thunder's message at nn.MultiheadAttention's backward, which the table once cut mid-word.
MHA_ERROR = (
    "NotImplementedError: Exception encountered when doing automatic registration for "
    "aten.multi_head_attention_forward, please use manual registration: the output at index 1 is None, which "
    "Thunder's automatic registration of torch operations to its vjp does not support; see the documentation of "
    "thunder.torch.register_default_torch_op for registering the operation with a vjp of its own by hand"
)


def test_bench_zoo_split_runs_path_groups_and_says_so(monkeypatch, capsys, tmp_path):
    """`bench zoo --split` hands split=True to run_zoo and the footnote says which paths were interleaved; the table
    fits 120 columns; every failure is under the table in full, wrapped between words to 120 columns, a known
    Thunder limitation with its test; the JSON has the whole error. A bad model name exits 2 before any work."""
    from thunder_fusion_guard.tools.cli import main

    seen = {}
    detail = MHA_ERROR + "\n  while tracing line 7 of the encoder's forward"

    def fake_run_zoo(models, device, paths, rounds, limit, log, threads, jobs, split=False, translate=False, **kw):
        seen.update(models=models, paths=paths, jobs=jobs, split=split, translate=translate)
        return [
            ModelResult(models[0], paths={
                P("eager"): PathResult(runs=True, samples_s=[0.001]),
                P("thunder"): PathResult(error=MHA_ERROR, error_detail=detail),
            })
        ]  # fmt: skip

    monkeypatch.setattr(zoo, "run_zoo", fake_run_zoo)
    out = tmp_path / "z.json"
    argv = ["bench", "zoo", "--device", "cpu", "--models", "nn-mha", "--paths", "eager,thunder,guarded"]
    assert main([*argv, "--split", "--jobs", "3", "--rounds", "1", "--translate", "--json", str(out)]) == 0
    want = {"models": ["nn-mha"], "paths": [P("eager"), P("thunder"), P("guarded")], "jobs": 3, "split": True,
            "translate": True}  # fmt: skip
    assert seen == want
    printed = capsys.readouterr().out
    lines = printed.splitlines()
    words = " ".join(printed.split())
    assert "paths of one process interleaved" in words and "translate_library_ops()" in words
    assert "x unguarded: against the unguarded path named in brackets" in words
    assert "no: NotImplementedError (known Thunder" in printed and "  limitation)" in printed  # broken, never cut
    assert all(len(line) <= 120 for line in lines)  # the table too: long cells go on onto further lines
    first = next(i for i, line in enumerate(lines) if line.startswith("nn-mha thunder: NotImplementedError"))
    note = [lines[first], *itertools.takewhile(lambda line: line.startswith("    "), lines[first + 1 :])]
    assert len(note) > 2
    label = "[known Thunder limitation: tests/test_thunder_limitations.py::test_multihead_attention_backward]"
    assert " ".join(line.strip() for line in note) == (
        f"nn-mha thunder: {MHA_ERROR} {label} (the JSON has the whole message)"
    )  # every word whole, none left out
    doc = json.loads(out.read_text())["zoo"][0]
    assert doc["model"] == "nn-mha" and doc["paths"]["thunder"]["error_detail"] == detail
    assert doc["paths"]["thunder"]["known_limitation"].endswith("::test_multihead_attention_backward")
    seen.clear()
    assert main(["bench", "zoo", "--models", "no-such-model"]) == 2 and seen == {}
    assert "--models: unknown no-such-model" in capsys.readouterr().err


def test_bench_zoo_runs_the_second_e3nn_built_model_on_cuda_split_and_translated(monkeypatch, capsys):
    """`fusion-guard bench zoo --device cuda --split --translate --models e3nn-nequip-modules-l3` asks run_zoo for
    that model on every path (no CUDA here: the device check is stood in for, nothing runs)."""
    from thunder_fusion_guard.tools import zoo_cli
    from thunder_fusion_guard.tools.cli import main

    seen = {}

    def fake_run_zoo(models, device, paths, rounds, limit, log, threads, jobs, split=False, translate=False, **kw):
        seen.update(models=models, device=device, paths=paths, split=split, translate=translate, apart=kw.get("apart"))
        return []

    monkeypatch.setattr(zoo, "run_zoo", fake_run_zoo)
    monkeypatch.setattr(zoo_cli, "resolve_device", lambda device: device)
    argv = ["bench", "zoo", "--device", "cuda", "--split", "--translate", "--models", "e3nn-nequip-modules-l3"]
    assert main(argv) == 0
    assert seen == {"models": ["e3nn-nequip-modules-l3"], "device": "cuda", "paths": list(PATHS), "split": True,
                    "translate": True, "apart": False}  # fmt: skip
    assert main([*argv[:4], "--apart", *argv[5:]]) == 0 and seen["apart"] and not seen["split"]
    assert "each Thunder path timed alone in a process of its own" in " ".join(capsys.readouterr().out.split())


def test_the_second_e3nn_built_model_is_the_first_at_l3_with_three_blocks_and_more_channels_on_cpu(
    monkeypatch,
):
    import torch

    from thunder_fusion_guard.bench import zoo_equivariant

    entry = ZOO["e3nn-nequip-modules-l3"]
    assert entry.library == entry.requires == "e3nn" and not entry.small  # the CPU suite runs it only --run-slow
    made = []

    class Recorded(torch.nn.Module):
        def __init__(self, **kwargs):
            super().__init__()
            made.append(kwargs)

    monkeypatch.setattr(zoo_equivariant, "E3nnNequIP", Recorded)
    monkeypatch.setattr(zoo_equivariant, "_atoms", lambda device: ())
    for name in ("e3nn-nequip-modules", "e3nn-nequip-modules-l3"):
        for device in ("cpu", "cuda"):
            ZOO[name].build(device)
    assert made == [
        {"channels": 8, "lmax": 2, "layers": 2}, {"channels": 32, "lmax": 2, "layers": 2},
        {"channels": 16, "lmax": 3, "layers": 3}, {"channels": 32, "lmax": 3, "layers": 3},
    ]  # fmt: skip


def test_help_names_every_zoo_model_and_failures_name_their_limitation():
    import ast
    from pathlib import Path

    assert list(MODEL_NAMES) == list(ZOO)
    result = _result(
        {
            "thunder": {"error": "RuntimeError: Failed to find a gradient transform for bound symbol"},
            "fx": {"error": "RuntimeError: " + "word " * 60},
            "eager": {"runs": True},
        }
    )
    known, unknown = failure_lines([result])
    assert known.endswith("[known Thunder limitation: tests/test_thunder_limitations.py::test_index_add_grad]")
    assert unknown == "m fx: RuntimeError: " + "word " * 60  # whole: the printing wraps it
    assert all(len(line) <= 120 for line in wrapped([unknown])) and len(wrapped([unknown])) == 3
    tree = ast.parse((Path(__file__).parent / "test_thunder_limitations.py").read_text())
    tests = {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}
    assert set(KNOWN_LIMITATIONS.values()) <= tests  # every label points at a test that is there


def test_the_zoo_extra_installs_every_library_of_the_zoo():
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text()
    extra = re.search(r"^zoo = \[(.*)\]$", text, re.MULTILINE).group(1)
    names = {re.split(r"[<>=!~\[ ]", r.strip().strip('"'))[0].replace("-", "_") for r in extra.split(",")}
    # mace-torch pins e3nn 0.4.4, the others need 0.6: an environment of its own (README)
    apart = {"mace", "mace,cuequivariance_torch"}
    assert {e.requires for e in ZOO.values()} - {"torch"} - apart <= names


def test_a_model_needing_two_libraries_is_available_only_with_both(monkeypatch):
    """mace-cueq needs MACE and cuequivariance-torch: without either it is skipped, never built as plain MACE."""
    import importlib.util

    found = {"mace": object(), "cuequivariance_torch": None}
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: found.get(name, object()))
    assert ZOO["mace-cueq"].requires.split(",") == ["mace", "cuequivariance_torch"]
    assert not ZOO["mace-cueq"].available() and ZOO["mace"].available()
    found["cuequivariance_torch"] = object()
    assert ZOO["mace-cueq"].available()


def test_the_cuequivariance_anchor_is_the_e3nn_built_model_with_other_layers():
    """cueq-nequip swaps e3nn's tensor products, linear layers and spherical harmonics for cuequivariance-torch's
    (its plain PyTorch method on CPU): the same parameters from the same seed, the same energy, and the same forces
    to float32 rounding, so its GPU step times read against e3nn-nequip-modules'."""
    pytest.importorskip("cuequivariance_torch")
    import torch

    ours, theirs = ZOO["e3nn-nequip-modules"].build("cpu"), ZOO["cueq-nequip"].build("cpu")
    assert [p.numel() for p in ours.module.parameters()] == [p.numel() for p in theirs.module.parameters()]
    energies, forces = [], []
    for model in (ours, theirs):
        energy = model.module(*model.inputs)
        (force,) = torch.autograd.grad(energy, [model.inputs[0]])
        energies.append(energy.detach())
        forces.append(force)
    torch.testing.assert_close(energies[0], energies[1])
    torch.testing.assert_close(forces[0], forces[1])


def test_bench_zoo_by_default_leaves_out_models_whose_library_is_missing(monkeypatch, capsys):
    """All models by default: one whose library is not installed (mace here, as on CI) is left out with a line saying
    so; asked for by name, it is a usage error (exit 2), as before any work."""
    from thunder_fusion_guard.bench.zoo_base import ZooEntry
    from thunder_fusion_guard.tools import zoo_cli
    from thunder_fusion_guard.tools.cli import main

    seen = {}
    monkeypatch.setattr(zoo, "run_zoo", lambda models, *a, **k: seen.update(models=models) or [])
    monkeypatch.setattr(zoo_cli, "resolve_device", lambda device: device)
    missing = ZooEntry("mace", "mace-torch", "MACE", ZOO["mace"].build, "no_such_module_here")
    monkeypatch.setitem(ZOO, "mace", missing)
    assert main(["bench", "zoo", "--device", "cpu"]) == 0
    assert "mace" not in seen["models"] and "hf-bert" in seen["models"]
    assert "mace: skipped, mace-torch is not installed here (import no_such_module_here)" in capsys.readouterr().err
    seen.clear()
    assert main(["bench", "zoo", "--device", "cpu", "--models", "mace"]) == 2 and seen == {}
    assert "--models: mace need libraries not installed here" in capsys.readouterr().err


def test_the_field_potentials_are_listed_with_their_packages():
    assert (ZOO["nequip"].requires, ZOO["mace"].requires) == ("nequip", "mace")
    assert not ZOO["nequip"].small and not ZOO["mace"].small  # compiled only outside the CPU suite


def test_mace_from_its_package_has_the_same_weights_in_every_build():
    """MACE draws its weights from a fixed seed (as nequip's model does), so a step timed in one process and its
    forces compared in another are of one model; the process's generator is left where it was."""
    pytest.importorskip("mace")
    before = torch.get_rng_state()
    first, second = (ZOO["mace"].build("cpu").module for _ in range(2))
    assert torch.equal(torch.get_rng_state(), before)
    pairs = list(zip(first.state_dict().values(), second.state_dict().values(), strict=True))
    assert pairs and all(torch.equal(a, b) for a, b in pairs)


def test_nequip_from_its_package_gives_energy_and_forces():
    pytest.importorskip("nequip")
    built = ZOO["nequip"].build("cpu")
    energy = built.loss(built.module(*built.inputs))
    energy.backward()
    forces = built.inputs[0].grad
    assert bool(energy.isfinite()) and forces is not None and forces.shape == built.inputs[0].shape
    assert built.inputs[2].shape[1] > 10 * built.inputs[0].shape[0]  # a neighbour list of ~16 an atom


def test_building_nequip_leaves_the_process_as_it_was():
    """nequip builds only after its ``set_global_state()``, which turns on Dynamo's ``capture_scalar_outputs``
    (a later ``.item()`` then breaks Dynamo's graph with another reason), seeds every generator, makes float64 the
    default and sets environment variables: the zoo puts every one of them back."""
    pytest.importorskip("nequip")
    import os
    import random

    import nequip.model  # noqa: F401  (its import draws from Python's generator: not the build's doing)
    import torch
    from nequip.utils.global_state import global_state_initialized

    def state():
        return (
            torch._dynamo.config.get_config_copy(),
            torch.get_default_dtype(),
            dict(os.environ),
            torch.random.get_rng_state(),
            random.getstate(),
            torch.multiprocessing.get_sharing_strategy(),
            global_state_initialized(),
        )

    before = state()
    ZOO["nequip"].build("cpu")
    after = state()
    assert before[0] == after[0] and not after[0]["capture_scalar_outputs"]
    assert before[1:3] == after[1:3] and torch.equal(before[3], after[3]) and before[4:] == after[4:]


@pytest.mark.parametrize(
    ("build", "package", "says"),
    [
        ("nequip_potential", "nequip", 'pip install ".[nequip]" in a clone of thunder-fusion-guard'),
        ("mace_potential", "mace", "pip install mace-torch==0.3.16"),
    ],
)
def test_a_potential_whose_package_is_missing_says_in_one_line_what_to_install(monkeypatch, build, package, says):
    from thunder_fusion_guard.bench import zoo_potentials

    real = zoo_potentials.importlib.util.find_spec
    monkeypatch.setattr(
        zoo_potentials.importlib.util, "find_spec", lambda name, *a: None if name == package else real(name, *a)
    )
    with pytest.raises(ModuleNotFoundError) as raised:
        getattr(zoo_potentials, build)("cpu")
    assert raised.value.name == package and says in str(raised.value) and "\n" not in str(raised.value)
