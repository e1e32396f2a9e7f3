"""fusion-guard bench: threshold parsing, compare's exit status, a tiny run's JSON. No timing is asserted."""

import argparse
import json
import re
from pathlib import Path

import pytest

from thunder_fusion_guard.bench.cases import (
    ALL_VARIANTS,
    CASES,
    SUITES,
    VARIANTS,
    VARIANTS_ENV,
    parse_variants,
    requested_variants,
    select,
)
from thunder_fusion_guard.bench.run import sample_stats
from thunder_fusion_guard.tools.bench_cli import parse_threshold
from thunder_fusion_guard.tools.cli import main


@pytest.mark.parametrize("text,value", [("5%", 0.05), ("0.05", 0.05), ("12.5%", 0.125), ("0", 0.0), ("150%", 1.5)])
def test_threshold_accepts_percent_and_fraction(text, value):
    assert parse_threshold(text) == pytest.approx(value)


@pytest.mark.parametrize("text", ["abc", "", "-1%", "-0.1", "5", "nan", "inf%", "5%%"])
def test_threshold_rejects_bad_values(text):
    with pytest.raises(argparse.ArgumentTypeError, match="threshold"):
        parse_threshold(text)


def _doc(medians: dict[str, float]) -> dict:
    return {
        "machine_info": {},
        "commit_info": {},
        "datetime": "2026-11-21T00:00:00+00:00",
        "version": "5.1.0",
        "benchmarks": [
            {"name": name, "fullname": f"benchmarks/test_micro.py::{name}", "group": "g", "stats": {"median": m}}
            for name, m in medians.items()
        ],
    }


def _write(tmp_path, name: str, medians: dict[str, float]) -> str:
    path = tmp_path / name
    path.write_text(json.dumps(_doc(medians)))
    return str(path)


BASE = {"test_micro[a-thunder]": 10e-6, "test_micro[a-guarded]": 5e-6}


def test_compare_fails_on_planted_regression(tmp_path, capsys):
    base = _write(tmp_path, "base.json", BASE)
    head = _write(tmp_path, "head.json", {**BASE, "test_micro[a-guarded]": 6e-6})
    assert main(["bench", "compare", base, head, "--threshold", "5%"]) == 1
    out = capsys.readouterr().out
    assert "REGRESSED" in out and "1.200" in out
    assert out.strip().splitlines()[-1] == "1 of 2 regressed (threshold 5.0%): test_micro[a-guarded] (1.20x)"


def test_compare_names_every_regressed_case(tmp_path, capsys):
    base = _write(tmp_path, "base.json", BASE)
    head = _write(tmp_path, "head.json", {"test_micro[a-thunder]": 30e-6, "test_micro[a-guarded]": 10e-6})
    assert main(["bench", "compare", base, head]) == 1
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last == "2 of 2 regressed (threshold 5.0%): test_micro[a-guarded] (2.00x), test_micro[a-thunder] (3.00x)"


def test_compare_fits_120_columns_unless_wide(tmp_path, capsys):
    long = "benchmarks/test_models.py::test_training_step[" + "-".join(["mistral-7b"] * 8) + "-guarded]"
    base = _write(tmp_path, "base.json", {**BASE, long: 5e-6})
    head = _write(tmp_path, "head.json", {**BASE, long: 9e-6})
    assert main(["bench", "compare", base, head]) == 1
    out = capsys.readouterr().out
    assert max(map(len, out.splitlines())) <= 120 and "REGRESSED" in out
    assert "".join(line.strip() for line in out.splitlines()).count("mistral-7b") >= 8  # broken, never cut
    assert main(["bench", "compare", base, head, "--wide"]) == 1
    assert long in capsys.readouterr().out


def test_compare_passes_within_threshold(tmp_path, capsys):
    base = _write(tmp_path, "base.json", BASE)
    head = _write(tmp_path, "head.json", {**BASE, "test_micro[a-guarded]": 6e-6})
    assert main(["bench", "compare", base, head, "--threshold", "0.25"]) == 0
    assert main(["bench", "compare", base, base]) == 0
    faster = _write(tmp_path, "faster.json", {**BASE, "test_micro[a-thunder]": 5e-6})
    assert main(["bench", "compare", base, faster]) == 0
    assert "faster" in capsys.readouterr().out


def test_compare_bad_inputs_exit_2(tmp_path, capsys):
    base = _write(tmp_path, "base.json", BASE)
    other = _write(tmp_path, "other.json", {"test_micro[b-eager]": 1e-6})
    assert main(["bench", "compare", base, other]) == 2
    assert main(["bench", "compare", base, str(tmp_path / "missing.json")]) == 2
    (tmp_path / "junk.json").write_text("{}")
    assert main(["bench", "compare", base, str(tmp_path / "junk.json")]) == 2
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "compare", base, base, "--threshold", "lots"])
    assert exit_info.value.code == 2
    assert "threshold must be a percentage" in capsys.readouterr().err


def test_run_writes_pytest_benchmark_json(tmp_path, capsys):
    out, md = tmp_path / "run.json", tmp_path / "run.md"
    argv = ["bench", "run", "--suite", "micro", "--case", "view-small", "--device", "cpu", "--reps", "2"]
    assert main([*argv, "--warmup", "0", "--json", str(out), "--markdown", str(md)]) == 0
    doc = json.loads(out.read_text())
    assert {"machine_info", "commit_info", "benchmarks", "datetime", "version"} <= set(doc)
    assert doc["machine_info"]["device"] == "cpu" and "thunder" in doc["machine_info"]
    assert [b["params"]["variant"] for b in doc["benchmarks"]] == list(VARIANTS)
    for b in doc["benchmarks"]:
        assert b["group"] == "micro:view-small"
        assert b["name"] == f"test_micro[view-small-{b['params']['variant']}]"
        assert b["fullname"] == f"benchmarks/test_micro.py::{b['name']}"
        stats = b["stats"]
        assert stats["rounds"] == 2
        assert stats["min"] <= stats["median"] <= stats["max"] and stats["iqr"] >= 0 and stats["stddev"] >= 0
    captured = capsys.readouterr()
    assert "[1/1] micro:view-small" in captured.err
    assert "micro:view-small" in captured.out and "guarded/thunder" in captured.out
    row = next(line for line in captured.out.splitlines() if line.startswith("micro:view-small"))
    assert len(re.findall(r"\d+\.\d \(\d+\.\d-\d+\.\d\)", row)) == len(VARIANTS), row  # median (q1-q3)
    assert "timed with 1 intra-op thread" in captured.out
    assert md.read_text().startswith("| case |")
    assert main(["bench", "compare", str(out), str(out)]) == 0


def test_run_with_no_matching_case_exits_2(capsys):
    assert main(["bench", "run", "--suite", "models", "--case", "litgpt", "--device", "cpu"]) == 2
    assert "--heavy" in capsys.readouterr().err


def test_sample_stats_orders():
    stats = sample_stats([3.0, 1.0, 2.0, 10.0, 4.0, 2.5])
    assert stats["rounds"] == 6 and stats["min"] == 1.0 and stats["max"] == 10.0
    assert stats["q1"] <= stats["median"] <= stats["q3"]
    assert stats["ld15iqr"] >= stats["min"] and stats["hd15iqr"] < 10.0
    assert sample_stats([2.0])["stddev"] == 0.0


def test_cases_cover_every_suite_and_op():
    assert len({c.group for c in CASES}) == len(CASES)
    assert {c.suite for c in select()} == set(SUITES)
    assert not [c for c in select() if c.heavy]
    assert {c.name for c in select(["models"], heavy=True) if c.heavy} == {
        "litgpt-mistral-fwdbwd",
        "litgpt-llama2-fwdbwd",
        "litgpt-phi2-fwdbwd",
        "litgpt-llama2-decode",
    }
    micro = {c.name for c in select(["micro"])}
    for op in ("view", "reshape", "permute", "expand", "slice", "squeeze", "unsqueeze", "copy_", "add", "cast"):
        assert {f"{op}-small", f"{op}-large"} <= micro


@pytest.mark.parametrize(
    "text,variants",
    [
        ("thunder,guarded,eager", VARIANTS),
        ("inductor, inductor-ro", ("inductor", "inductor-ro")),
        ("eager inductor eager", ("eager", "inductor")),
        ("all", ALL_VARIANTS),
    ],
)
def test_parse_variants_keeps_order(text, variants):
    assert parse_variants(text) == variants


@pytest.mark.parametrize("text,named", [("thunder,nope", "'nope'"), ("inductor-max", "'inductor-max'"), (" , ", "no")])
def test_parse_variants_rejects_unknown(text, named):
    with pytest.raises(ValueError, match=named) as info:
        parse_variants(text)
    assert "allowed: thunder, guarded, eager, inductor, inductor-ro" in str(info.value)


def test_requested_variants_from_env(monkeypatch):
    monkeypatch.delenv(VARIANTS_ENV, raising=False)
    assert requested_variants() == VARIANTS
    monkeypatch.setenv(VARIANTS_ENV, "eager,inductor-ro")
    assert requested_variants() == ("eager", "inductor-ro")
    monkeypatch.setenv(VARIANTS_ENV, "eager,turbo")
    with pytest.raises(ValueError, match="turbo"):
        requested_variants()


def test_run_unknown_variant_exits_2_with_one_line(capsys):
    assert main(["bench", "run", "--suite", "micro", "--device", "cpu", "--variants", "thunder,turbo"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("fusion-guard bench run: --variants: unknown variant 'turbo'")
    assert "inductor-ro" in err[0]


def test_run_inductor_variants_in_json_and_compare(tmp_path, capsys):
    out = tmp_path / "run.json"
    argv = ["bench", "run", "--suite", "micro", "--case", "view-small", "--device", "cpu", "--reps", "2"]
    assert main([*argv, "--warmup", "1", "--variants", "eager,inductor,inductor-ro", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert [b["params"]["variant"] for b in doc["benchmarks"]] == ["eager", "inductor", "inductor-ro"]
    builds = {b["params"]["variant"]: b["extra_info"] for b in doc["benchmarks"]}
    assert builds["inductor-ro"]["variant_build"] == 'torch.compile(fn, mode="reduce-overhead")'
    assert [builds[v]["compile_order"] for v in ("eager", "inductor", "inductor-ro")] == [0, 1, 2]
    assert all(info["first_call_s"] >= 0 and "recompiled_while_timing" not in info for info in builds.values())
    table = capsys.readouterr().out
    assert "inductor-ro µs" in table and "first call s inductor/inductor-ro" in table and "guarded/thunder" not in table

    slower = json.loads(out.read_text())
    for b in slower["benchmarks"]:
        if b["params"]["variant"] == "inductor":
            b["stats"]["median"] *= 2
    head = tmp_path / "head.json"
    head.write_text(json.dumps(slower))
    assert main(["bench", "compare", str(out), str(head)]) == 1
    compared = capsys.readouterr().out
    assert "test_micro[view-small-inductor-ro]" in compared
    regressed = [line for line in compared.splitlines() if "REGRESSED" in line]
    assert len(regressed) == 1 and "test_micro[view-small-inductor]" in regressed[0]


def test_shape_only_micro_cases_are_cuda_only_and_labelled():
    shape_only = [c for c in select(["micro"]) if c.name.endswith("-shapeonly")]
    assert shape_only and all(c.cuda_only for c in shape_only)
    assert not [c for c in select(["micro"], device="cpu") if c.cuda_only]
    assert {c.name.removesuffix("-shapeonly") for c in shape_only} <= {c.name for c in select(["micro"], device="cpu")}


def test_a_failing_variant_keeps_the_others(monkeypatch, tmp_path, capsys):
    import thunder_fusion_guard.bench.run as bench_run

    real = bench_run.make_step

    def failing(workload, variant, device):
        if variant == "guarded":
            raise RuntimeError("compiler broke\nmore lines")
        return real(workload, variant, device)

    monkeypatch.setattr(bench_run, "make_step", failing)
    out = tmp_path / "run.json"
    argv = ["bench", "run", "--suite", "micro", "--case", "view-small", "--device", "cpu", "--reps", "2"]
    assert main([*argv, "--warmup", "0", "--json", str(out)]) == 1
    doc = json.loads(out.read_text())
    assert sorted(b["params"]["variant"] for b in doc["benchmarks"]) == ["eager", "thunder"]
    assert doc["errors"] == [
        {"group": "micro:view-small", "variant": "guarded", "error": "RuntimeError: compiler broke"}
    ]
    assert "guarded FAILED: RuntimeError: compiler broke" in capsys.readouterr().err


def test_each_variants_first_call_compiles_with_empty_inductor_caches(monkeypatch, tmp_path):
    """The first-call column cannot favour a variant compiled later: each first call runs with a cache directory
    of its own, empty, and Inductor's in-memory caches cleared; the JSON says so."""
    import os

    import torch._inductor.codecache as codecache

    import thunder_fusion_guard.bench.run as bench_run

    seen = {}

    def step_seeing_the_caches(workload, variant, device):
        def step():
            if variant not in seen:  # the first call
                directory = os.environ["TORCHINDUCTOR_CACHE_DIR"]
                seen[variant] = (directory, os.listdir(directory), dict(codecache.PyCodeCache.modules))
                Path(directory, "kernel.py").write_text("# compiled by " + variant)  # what a compile leaves

        return step

    monkeypatch.setattr(bench_run, "make_step", step_seeing_the_caches)
    out = tmp_path / "run.json"
    argv = ["bench", "run", "--suite", "micro", "--case", "view-small", "--device", "cpu", "--reps", "2"]
    assert main([*argv, "--warmup", "0", "--json", str(out)]) == 0
    assert set(seen) == {"thunder", "guarded", "eager"}
    assert len({directory for directory, _, _ in seen.values()}) == 3  # a directory each
    assert all(listed == [] and modules == {} for _, listed, modules in seen.values())  # each empty
    assert not any(Path(directory).exists() for directory, _, _ in seen.values())  # removed after
    assert json.loads(out.read_text())["first_calls"] == bench_run.FIRST_CALLS


def test_an_error_every_variant_gives_is_said_once_with_the_variants(monkeypatch, capsys):
    import thunder_fusion_guard.bench.run as bench_run

    def failing(workload, variant, device):
        raise AttributeError("no attribute 'broadcast_to'")

    monkeypatch.setattr(bench_run, "make_step", failing)
    argv = ["bench", "run", "--suite", "micro", "--case", "view-small", "--device", "cpu", "--reps", "2"]
    assert main([*argv, "--warmup", "0"]) == 1
    err = capsys.readouterr().err
    assert err.count("no attribute 'broadcast_to'") == 1 and err.count("FAILED: as thunder") == 2
    assert (
        bench_run.errors_by_variant({"thunder": "E", "guarded": "E", "eager": "F"}) == "E (thunder, guarded); F (eager)"
    )


@pytest.mark.parametrize("columns", ["80", "100"])
def test_bench_zoo_help_names_every_model_and_path_whole(monkeypatch, capsys, columns):
    """Every zoo model and path is in `bench zoo --help`, each on one line as it is typed (argparse's own
    wrapping broke `e3nn-nequip-` from `rewritten` and `inductor-` from `ro`)."""
    from thunder_fusion_guard.bench.zoo_paths import MODEL_NAMES, PATH_NAMES

    monkeypatch.setenv("COLUMNS", columns)
    with pytest.raises(SystemExit) as done:
        main(["bench", "zoo", "--help"])
    assert done.value.code == 0
    words = set(re.split(r"[\s,]+", capsys.readouterr().out))
    assert set(MODEL_NAMES) <= words and set(PATH_NAMES) <= words
    assert "e3nn-nequip-modules-l3" in MODEL_NAMES


TINY_MODEL = """
import torch


def make():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
    return model, (torch.randn(4, 8),)
"""


@pytest.fixture
def tiny_target(tmp_path):
    """A tiny model file of the user's, ``file.py:make``."""
    path = tmp_path / "tiny_model.py"
    path.write_text(TINY_MODEL)
    return f"{path}:make"


@pytest.fixture
def refuse_timing(monkeypatch):
    """Fail the test if a bench command starts timing before rejecting its arguments."""
    import thunder_fusion_guard.tools.bench_cli as bench_cli

    def refuse(*args, **kwargs):
        raise AssertionError("the command started its work before checking its arguments")

    monkeypatch.setattr(bench_cli, "run_cases", refuse)


def _status(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as e:  # argparse's own errors
        return e.code


@pytest.mark.parametrize("command", [["bench", "run"], ["bench", "compare"]])
@pytest.mark.parametrize(
    "bad,named",
    [
        (["{dir}/missing.py:make"], "missing.py"),
        (["{nope}"], "'nope'"),
        (["{target}", "--rounds", "0"], "--rounds"),
        (["{target}", "--rounds", "x"], "--rounds"),
        (["{target}", "--device", "tpu"], "--device"),
    ],
)
def test_target_bad_input_is_one_line_and_exit_2_before_any_work(
    tmp_path, capsys, refuse_timing, tiny_target, command, bad, named
):
    nope = tiny_target.rpartition(":")[0] + ":nope"
    argv = [part.format(dir=tmp_path, target=tiny_target, nope=nope) for part in bad]
    assert _status([*command, *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"fusion-guard {' '.join(command)}: "), err
    assert named in err[0], err


@pytest.mark.parametrize(
    "argv",
    [
        ["bench", "run", "--thunderfx"],  # --thunderfx without a TARGET
        ["bench", "run", "{target}", "--case", "view"],  # built-in cases and a TARGET
        ["bench", "compare", "base.json"],  # one file
        ["bench", "compare", "a.json", "b.json", "--no-backward"],
    ],
)
def test_target_options_misused_exit_2(capsys, refuse_timing, tiny_target, argv):
    assert _status([part.format(target=tiny_target) for part in argv]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def _rows(out: str) -> dict[str, list[str]]:
    """The table's rows by their first cell (two spaces or more apart)."""
    return {cells[0]: cells for cells in (re.split(r"\s{2,}", line.strip()) for line in out.splitlines()) if cells}


@pytest.mark.usefixtures("no_inductor")  # the command is the subject, not Inductor's kernels
def test_run_times_the_users_model_three_ways(tmp_path, capsys, tiny_target):
    out = tmp_path / "run.json"
    argv = ["bench", "run", tiny_target, "--rounds", "2", "--warmup", "0", "--device", "cpu", "--json", str(out)]
    assert main(argv) == 0
    captured = capsys.readouterr()
    rows = _rows(captured.out)
    header = rows["variant"]
    assert header[:2] == ["variant", "built as"] and "rounds" in header and "x thunder" in header
    assert any(h.startswith("median") for h in header) and any(h.startswith("q1-q3") for h in header)
    assert any(h.startswith("min-max") for h in header)
    for variant in ("eager", "thunder", "guarded"):
        assert len(rows[variant]) == len(header), rows[variant]
        assert rows[variant][header.index("rounds")] == "2"
    assert "forward and backward" in captured.out and "user:tiny_model.py:make" in captured.err
    doc = json.loads(out.read_text())
    assert sorted(b["params"]["variant"] for b in doc["benchmarks"]) == ["eager", "guarded", "thunder"]
    assert {b["stats"]["rounds"] for b in doc["benchmarks"]} == {2}


@pytest.mark.usefixtures("no_inductor")
def test_compare_target_says_whether_guarded_is_slower(capsys, tiny_target):
    argv = ["bench", "compare", tiny_target, "--rounds", "2", "--warmup", "0", "--device", "cpu", "--no-backward"]
    status = main(argv)
    out = capsys.readouterr().out
    last = out.strip().splitlines()[-1]
    assert last.startswith("guarded is ") and "unguarded Thunder" in last, out
    assert status == (1 if ": slower" in last else 0)
    assert {"eager", "thunder", "guarded"} <= set(_rows(out)) and "forward a call" in out


def test_a_ratio_outside_a_tenth_of_one_says_when_the_spreads_overlap():
    """A model the guard does not change, timed 10 rounds on a noisy machine: guarded 0.71x unguarded by median, but
    the rounds spread 10-32 ms. The row and the verdict say the quartiles overlap (injected timings)."""
    from thunder_fusion_guard.bench.cases import BenchCase
    from thunder_fusion_guard.bench.run import CaseResult, guard_verdict, variant_rows

    noisy = [10.4, 12.0, 14.1, 17.3, 21.0, 24.2, 26.5, 28.0, 30.3, 31.9]
    samples = {"thunder": [t * 1e-3 for t in noisy], "guarded": [t * 0.71e-3 for t in noisy[::-1]]}
    samples["guarded"][0] = 10.4e-3
    result = CaseResult(BenchCase("user", "m.py:make", lambda device: None), samples)
    by_variant = {row[0]: row for row in variant_rows(result)[1:]}
    ratio, said = by_variant["guarded"][-1].split(", ")
    assert float(ratio) < 0.9 and said == "quartiles overlap"
    verdict, slower = guard_verdict(result, 0.05)
    assert "faster by median, but their quartiles overlap" in verdict and not slower
    apart = CaseResult(result.case, {"thunder": samples["thunder"], "guarded": [t / 10 for t in samples["thunder"]]})
    assert not variant_rows(apart)[2][-1].endswith("overlap") and "faster (" in guard_verdict(apart, 0.05)[0]


def test_variant_rows_name_the_frontend_the_spread_and_the_rounds():
    from thunder_fusion_guard.bench.cases import BenchCase
    from thunder_fusion_guard.bench.run import CaseResult, guard_verdict, variant_rows

    samples = {"thunder": [2e-3, 4e-3, 3e-3], "guarded": [1e-3, 2e-3, 1.5e-3], "eager": [1e-3, 1e-3, 1e-3]}
    case = BenchCase("user", "m.py:make", lambda device: None)
    result = CaseResult(case, samples, first_call_s=dict.fromkeys(samples, 1.0))
    header, *rows = variant_rows(result, "thunderfx")
    assert header[2:5] == ["median ms", "q1-q3 ms", "min-max ms"] and header[5] == "rounds"
    by_variant = {row[0]: row for row in rows}
    assert by_variant["guarded"][1] == "thunderfx(fn, transforms=[FusionGuard()])" and by_variant["eager"][1] == "fn"
    assert (
        by_variant["thunder"][2:6] == ["3", "2-4", "2-4", "3"]
        and by_variant["guarded"][-1] == "0.50, quartiles overlap"
    )
    assert guard_verdict(result, 0.05)[1] is False
    slower = CaseResult(result.case, {"thunder": samples["guarded"], "guarded": samples["thunder"]})
    assert guard_verdict(slower, 0.05)[1] is True
