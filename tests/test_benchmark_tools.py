"""Small pieces of the GPU benchmark scripts, without a GPU: path variants, and nvFuser's perf scopes summed from an
``NVFUSER_TRACE`` file, ways to compute one thing checked and timed, a
captured step's kernels paired with the same step's uncaptured."""

import json

import pytest
import torch
from helpers import load_benchmark


def test_a_variant_is_a_guarded_path_with_guard_options_keyed_by_its_label():
    seed = load_benchmark("gpu_seed_vs_inductor")
    key, options = seed.parse_variant('fx-guarded+cudagraph/choose={"choose_executor": true, "margin": 0.1}')
    assert key == "fx-guarded+cudagraph/choose" and options == {"choose_executor": True, "costs": {"margin": 0.1}}
    for bad in ("fx-cudagraph/x={}", "fx-guarded+cudagraph={}", "fx-guarded+cudagraph/x=[1]", 'fx/x={"margin": 0.1}'):
        with pytest.raises(ValueError, match="--variant"):
            seed.parse_variant(bad)
    key, options = seed.parse_variant('fx-guarded+backends/tc={"fusion": "torchcompile", "margin": 0.1}')
    assert key == "fx-guarded+backends/tc" and options == {"costs": {"margin": 0.1}, "fusion": "torchcompile"}
    for bad in ('fx-guarded+cudagraph/tc={"fusion": "torchcompile"}', 'fx-guarded/nv={"fusion": "nvfuser"}'):
        with pytest.raises(ValueError, match="'fusion' takes one of 'torchcompile', 'none'"):
            seed.parse_variant(bad)
    key, options = seed.parse_variant('fx-guarded+backends/none={"fusion": "none"}')
    assert key == "fx-guarded+backends/none" and options == {"fusion": "none"}
    # unguarded ThunderFX takes the fusion executor alone: the yardstick of a guarded variant on the same executor
    assert seed.parse_variant('fx/tc={"fusion": "torchcompile"}') == ("fx/tc", {"fusion": "torchcompile"})
    for bad in ('fx-cudagraph/tc={"fusion": "torchcompile"}', 'thunder/tc={"fusion": "torchcompile"}'):
        with pytest.raises(ValueError, match="--variant"):
            seed.parse_variant(bad)


@pytest.mark.parametrize(
    "variant, region",
    [('{"fusion": "torchcompile", "strict": true}', "TorchCompile"), ('{"fusion": "none", "strict": true}', None)],
)
def test_a_fusion_variant_runs_its_regions_on_its_executor_alone(variant, region):
    """The variant's program: guarded ThunderFX whose regions Thunder's torch.compile executor runs, or with no fusion
    executor none (every op on Thunder's torch executor: a first call without fusion compiles, for the job filling
    Inductor's caches with the whole-graph choice's), the guard given the variant's other options (on CPU here)."""
    import thunder

    from thunder_fusion_guard import _thunder as th

    seed = load_benchmark("gpu_seed_vs_inductor")
    _, options = seed.parse_variant(f"fx-guarded+backends/x={variant}")
    module = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    fn, guard = seed.compiled_with_fusion(module, options)
    x = torch.randn(4, 8)
    torch.testing.assert_close(fn(x), module(x))
    assert guard.options.strict
    traces = [str(thunder.last_traces(sub.jitted)[-1]) for sub in th.thunderfx_subgraphs(fn)]
    assert traces and not any("nvFusion" in t for t in traces)
    assert any("TorchCompile" in t for t in traces) == (region is not None)


def test_an_unguarded_fusion_variant_runs_thunderfx_without_a_guard():
    import thunder

    from thunder_fusion_guard import _thunder as th

    seed = load_benchmark("gpu_seed_vs_inductor")
    _, options = seed.parse_variant('fx/tc={"fusion": "torchcompile"}')
    module = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    fn, guard = seed.compiled_with_fusion(module, options, guarded=False)
    x = torch.randn(4, 8)
    torch.testing.assert_close(fn(x), module(x))
    assert guard is None
    traces = [str(thunder.last_traces(sub.jitted)[-1]) for sub in th.thunderfx_subgraphs(fn)]
    assert any("TorchCompile" in t for t in traces) and not any("FusionGuard" in t for t in traces)


def test_an_inductor_variant_is_an_inductor_path_given_more_of_its_options():
    seed = load_benchmark("gpu_seed_vs_inductor")
    key, options = seed.parse_inductor_variant('inductor/combo/mixed={"combo_kernel_allow_mixed_sizes": 2}')
    assert key == "inductor/combo/mixed"
    assert options == {**seed.INDUCTOR_OPTIONS["inductor/combo"], "combo_kernel_allow_mixed_sizes": 2}
    key, options = seed.parse_inductor_variant('inductor/tuned={"coordinate_descent_tuning": true}')
    assert (key, options) == ("inductor/tuned", {"coordinate_descent_tuning": True})  # from Inductor's defaults
    for bad in ("inductor-ro/x={}", "inductor/combo={}", "inductor/combo/x=[1]", "fx-guarded/x={}"):
        with pytest.raises(ValueError, match="--inductor-variant"):
            seed.parse_inductor_variant(bad)
    key, options = seed.parse_inductor_variant('inductor/combo/sum64k={"summed_most": 65536}')
    assert "summed_most" not in options and options["post_grad_custom_post_pass"].most == 65536


def test_bitwise_tells_signed_zeros_apart():
    seed = load_benchmark("gpu_seed_vs_inductor")
    assert seed.bitwise([torch.tensor(1.5)], [torch.tensor(1.5)])  # a 0-dim loss
    assert not seed.bitwise([torch.tensor(0.0)], [torch.tensor(-0.0)])
    a = [torch.tensor([0.0, 1.0]), None]
    assert seed.bitwise(a, [torch.tensor([0.0, 1.0]), None])
    assert not seed.bitwise(a, [torch.tensor([-0.0, 1.0]), None])
    assert not seed.bitwise(a, [torch.tensor([0.0, 1.0]), torch.zeros(1)])


def test_nvfuser_trace_sums_scopes_per_thread_and_counts_a_nested_repeat_once():
    trace = load_benchmark("nvfuser_trace")
    events = [
        ("FusionExecutorCache::runFusionWithInputs", "B", 7, 0),
        ("SegmentCandidateFinder::findSegments", "B", 7, 10),
        ("SegmentCandidateFinder::findSegments", "B", 7, 20),  # nested in itself: counted once
        ("SegmentCandidateFinder::findSegments", "E", 7, 1_000_020),
        ("SegmentCandidateFinder::findSegments", "E", 7, 2_000_010),
        ("executor_utils::NVRTC", "B", 9, 30),
        ("executor_utils::NVRTC", "E", 9, 500_030),
        ("FusionExecutorCache::runFusionWithInputs", "E", 7, 3_000_000),
        ("executor_utils::NVRTC", "B", 9, 3_000_100),  # a trace cut short: an open scope is left out
    ]
    lines = ["{", '"traceEvents": ['] + [
        f'{{ "name": "{n}", "ph": "{p}", "pid": 1, "tid": {t}, "ts": {ts} }},' for n, p, t, ts in events
    ]
    text = trace.summarize(lines)
    assert "thread totals s: {'main': 3.0, 'pool': 0.5}" in text
    inclusive = text.split("--- exclusive")[0]
    assert "main       2.00      1 SegmentCandidateFinder::findSegments" in inclusive
    assert "pool       0.50      1 executor_utils::NVRTC" in inclusive
    assert "main       1.00      1 FusionExecutorCache::runFusionWithInputs" in text.split("--- exclusive")[1]


def test_jobs_side_by_side_wait_until_all_have_compiled_or_the_time_is_up(tmp_path, monkeypatch):
    seed = load_benchmark("gpu_seed_vs_inductor")
    assert seed.all_compiled() is False  # not side by side: no wait
    monkeypatch.setenv("TFG_ZOO_READY", str(tmp_path))
    monkeypatch.setenv("TFG_ZOO_JOBS", "2")
    monkeypatch.setenv("TFG_ZOO_READY_BY", "0")  # the time is up: a job that never compiled is not waited for
    assert seed.all_compiled(poll_s=0.0) is False and len(list(tmp_path.glob("*.ready"))) == 1
    (tmp_path / "other.ready").touch()  # the other job has compiled
    assert seed.all_compiled(poll_s=0.0) is True


def test_device_ways_keeps_a_failing_way_and_gives_gb_per_s_only_where_the_bytes_are_known(tmp_path, monkeypatch):
    """Each way is checked once; one that fails keeps its error and is not timed; the rest are timed together."""
    ways_module = load_benchmark("device_ways")
    timed_calls = []

    def fake_host_device_us(fns, args, reps, cuda):
        timed_calls.append(len(fns))
        return [type("HostDevice", (), {"device_us": 10.0 * (i + 1)})() for i in range(len(fns))]

    monkeypatch.setattr(ways_module, "host_device_us", fake_host_device_us)
    ways = {"ones": lambda: torch.ones(3), "fails": lambda: 1 / 0, "zeros": lambda: torch.zeros(3)}
    out = ways_module.device_ways(ways, lambda name, result: float(result.sum()), {"ones": 2_000_000})
    assert timed_calls == [2]
    assert out["ones"] == {"max_diff": 3.0, "us": 10.0, "GB/s": 200.0}
    assert out["zeros"] == {"max_diff": 0.0, "us": 20.0}
    assert out["fails"] == {"error": "ZeroDivisionError: division by zero"}
    ways_module.report(out, str(tmp_path / "ways.json"))
    assert json.loads((tmp_path / "ways.json").read_text()) == out


def test_a_script_runs_in_a_thread_with_the_stack_asked_or_here_without_one():
    seed = load_benchmark("gpu_seed_vs_inductor")
    import threading

    here = threading.get_ident()
    assert seed.in_thread(0, lambda: 0 if threading.get_ident() == here else 9) == 0
    assert seed.in_thread(16, lambda: 0 if threading.get_ident() != here else 9) == 0
    assert seed.in_thread(16, lambda: 1 / 0) == 1  # the thread raised: no exit code
    threading.stack_size(0)  # the default again for later threads


def test_captured_and_uncaptured_kernels_pair_by_name_in_launch_order_and_the_rest_is_listed_apart():
    anatomy = load_benchmark("gpu_region_anatomy")
    before = [("gemm", 10.0), ("memset", 1.0), ("triton_sum", 5.0), ("gemm", 8.0)]
    after = [("gemm", 11.0), ("triton_sum", 6.0), ("Memset (Unknown)", 1.5), ("gemm", 8.5)]
    paired = anatomy.paired_kernels(before, after)
    assert paired["kernels"] == [["gemm", 10.0, 11.0], ["triton_sum", 5.0, 6.0], ["gemm", 8.0, 8.5]]
    assert paired["uncaptured_only"] == [["memset", 1.0]] and paired["captured_only"] == [["Memset (Unknown)", 1.5]]
    assert (paired["kernels_uncaptured"], paired["kernels_captured"], paired["paired"]) == (4, 4, 3)
    assert (paired["us_uncaptured"], paired["us_captured"]) == (24.0, 27.0)


def test_a_steps_kernels_average_over_the_profiled_steps_or_are_the_last_steps_where_the_steps_differ(monkeypatch):
    """``kernel_sequence`` reads the profile through the package's ``launches`` (``step_launches``, shared with
    ``gpu_seed_vs_inductor``): injected here, no GPU."""
    import contextlib
    import sys

    import torch.profiler

    anatomy = load_benchmark("gpu_region_anatomy")
    from thunder_fusion_guard.examine.kernel_histogram import Launch

    def kernel(name, us):
        return Launch(name, "Triton", us, None, None, None)

    profiled: list[list] = []
    monkeypatch.setattr(torch.profiler, "profile", lambda **kw: contextlib.nullcontext(type("P", (), {"events": list})))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(sys.modules["step_launches"], "launches", lambda events: profiled.pop(0))
    profiled.append([kernel("a", 1.0), kernel("b", 4.0), kernel("a", 3.0), kernel("b", 6.0)])
    assert anatomy.kernel_sequence(lambda: None, steps=2) == [("a", 2.0), ("b", 5.0)]
    profiled.append([kernel("a", 1.0), kernel("b", 4.0), kernel("c", 3.0), kernel("b", 6.0)])  # the steps differ
    assert anatomy.kernel_sequence(lambda: None, steps=2) == [("c", 3.0), ("b", 6.0)]


def test_a_steps_dearest_kernels_are_listed_by_device_time_beside_its_kinds(monkeypatch):
    """``kernels_and_device_ms`` over launches injected (no GPU): a step's kernels and device time averaged over the
    profiled steps, per kind and per kernel name, dearest first."""
    from thunder_fusion_guard.examine.kernel_histogram import Launch

    seed = load_benchmark("gpu_seed_vs_inductor")
    two_steps = [
        Launch("gemm", "GEMM", 10.0, None, None),
        Launch("tiny", "Triton", 1.0, None, None),
        Launch("tiny", "Triton", 1.0, None, None),
        Launch("wide", "Triton", 6.0, None, None),
    ] * 2
    monkeypatch.setattr(seed, "profiled_launches", lambda step, steps: two_steps)
    kernels, device_ms, families, top, dearest = seed.kernels_and_device_ms(lambda: None, steps=2)
    assert (kernels, device_ms) == (4.0, 0.018)
    assert families == {"GEMM": [1.0, 0.01], "Triton": [3.0, 0.008]}
    assert top["tiny"] == 2.0
    assert list(dearest.items()) == [("gemm", [1.0, 10.0]), ("wide", [1.0, 6.0]), ("tiny", [2.0, 2.0])]


class _FakeStep:
    """A potential's step: its loss (the energy) and its leaf's gradient (the forces), each call's values given."""

    def __init__(self, *calls):
        self.calls, self.leaves, self.done = list(calls), [object()], []

    def __call__(self):
        self.done.append(self.calls.pop(0))

    def values(self):
        energy, forces = self.done[-1]
        return [torch.tensor(energy), torch.tensor(forces)]


def test_a_potentials_rows_carry_eagers_run_to_run_difference_and_the_scale_of_their_own(monkeypatch):
    seed = load_benchmark("gpu_seed_vs_inductor")
    monkeypatch.setattr(seed, "kernels_and_device_ms", lambda step: (1.0, 0.1, {}, {}, {}))
    timed = type("Rounds", (), {"samples": {"eager": [0.002], "fx-guarded": [0.001]}})
    monkeypatch.setattr(seed, "interleaved_rounds", lambda steps, rounds, warmup: timed)  # no calls: none timed
    # eager: the compared step, then one more step whose forces differ by 0.25 (atomics, say)
    eager = _FakeStep((2.0, [1.0, -3.0]), (2.0, [1.25, -3.0]))
    other = _FakeStep((2.5, [1.0, -2.5]))
    steps, rows = {"eager": eager, "fx-guarded": other}, {"eager": {}, "fx-guarded": {}}
    seed._time_paths("m", steps, rows, rounds=1, host=False)
    assert rows["eager"]["run_to_run_max_abs_force_diff"] == 0.25
    guarded = rows["fx-guarded"]
    assert (guarded["max_abs_force_diff"], guarded["energy_diff"]) == (0.5, 0.5)
    assert (guarded["eager_max_abs_force"], guarded["eager_energy"]) == (3.0, 2.0)
    assert "eager_max_abs_force" not in rows["eager"]


def test_a_path_after_choose_backends_is_timed_as_its_first_call_left_it_beside_the_paths_before_it(monkeypatch):
    """``time_before_choice`` (``--time-before-choice``): the guarded program before its choice, timed with the paths
    compiled before it under a key of its own; its step's failure is recorded, not raised (the choice goes on)."""
    seed = load_benchmark("gpu_seed_vs_inductor")
    monkeypatch.setattr(seed, "kernels_and_device_ms", lambda step: (1.0, 0.1, {}, {}, {}))
    path = "fx-guarded+backends/tc" + seed.STEP_GRAPH
    key = "fx-guarded+backends/tc before choice" + seed.STEP_GRAPH
    timed = type("Rounds", (), {"samples": {"eager": [0.002], key: [0.001]}})
    monkeypatch.setattr(seed, "interleaved_rounds", lambda steps, rounds, warmup: timed)
    eager = _FakeStep((2.0, [1.0, -3.0]), (2.0, [1.0, -3.0]))
    guarded = _FakeStep((2.0, [1.0, -3.0]), (2.0, [1.0, -2.0]))
    made = []

    def captured_step(model, fn):
        made.append(True)
        return guarded

    monkeypatch.setattr(seed, "_CapturedStep", captured_step)
    steps, rows = {"eager": eager}, {"eager": {}, path: {"before_choice_s": 12.5}}
    assert seed.time_before_choice("m", path, None, None, steps, rows, 1, False) == key
    assert made == [True] and list(steps) == ["eager"]  # captured whole, as its path; not timed again at the end
    assert rows[key]["before_choice_of"] == path and rows[key]["first_call_s"] == 12.5
    assert rows[key]["ms"] == 1.0 and rows[key]["max_abs_force_diff"] == 1.0 and rows["eager"]["ms"] == 2.0
    # what the paths beside it measured then, kept: their own rows are timed again after the choice
    assert rows[key]["beside"] == {"eager": {"ms": 2.0, "kernels": 1.0, "device_ms": 0.1}}

    def failing(model, fn):
        raise RuntimeError("capture failed")

    monkeypatch.setattr(seed, "_CapturedStep", failing)
    rows = {"eager": {}, path: {"before_choice_s": 3.0}}
    assert seed.time_before_choice("m", path, None, None, {"eager": eager}, rows, 1, False) == key
    assert "capture failed" in rows[key]["error"] and "ms" not in rows[key]


@pytest.mark.parametrize("before", [True, False])
def test_run_model_times_a_backends_path_before_its_choice_only_when_asked(monkeypatch, before):
    """``run_model``'s path after ``choose_backends`` with every compile, step and timing injected (no GPU): with
    ``time_before_choice_too`` the paths are timed once before the choice, with that path's own row among them, and
    once after; without, once. A budget given for the choice's compiles (``option_compiles_s``) reaches
    ``choose_backends`` and the path's row."""
    import contextlib
    import types

    import thunder_fusion_guard

    seed = load_benchmark("gpu_seed_vs_inductor")
    model = types.SimpleNamespace(module=None, inputs=())
    monkeypatch.setitem(seed.MODELS, "fake", lambda: model)
    report = types.SimpleNamespace(filter=lambda **kw: [], decisions=[])
    guard = types.SimpleNamespace(report=report)
    monkeypatch.setattr(seed, "_compile", lambda module, path, device, options: (object(), guard))
    monkeypatch.setattr(seed, "_Step", lambda model, fn, device: lambda: None)

    class Step:
        captured = types.SimpleNamespace(captured=True)

        def __init__(self, model, fn):
            pass

        def __call__(self):
            pass

    monkeypatch.setattr(seed, "_CapturedStep", Step)
    phases = types.SimpleNamespace(table=lambda width: "", to_dict=lambda digits: {})
    monkeypatch.setattr(seed, "first_call", lambda fn: contextlib.nullcontext(phases))
    monkeypatch.setattr(seed, "timing_choice_parts", lambda name: contextlib.nullcontext())
    order: list[str] = []
    asked: list[dict] = []
    monkeypatch.setattr(
        thunder_fusion_guard, "choose_backends", lambda *a, **k: asked.append(k) or order.append("choice") or []
    )
    timed: list[list[str]] = []

    def time_paths(name, steps, rows, rounds, host):
        order.append("timed")
        timed.append(list(steps))

    monkeypatch.setattr(seed, "_compare_values", lambda steps, rows: None)
    monkeypatch.setattr(seed, "_time_compared", time_paths)
    record = {"models": {}}
    path = "fx-guarded+backends" + seed.STEP_GRAPH
    budget = 50.0 if before else None
    seed.run_model("fake", ["eager", path], 1, None, record, time_before_choice_too=before, option_compiles_s=budget)
    assert asked[0].get("option_compiles_s") == budget and asked[0]["whole_graphs"] is True
    assert record["models"]["fake"][path].get("option_compiles_s") == budget
    key = "fx-guarded+backends before choice" + seed.STEP_GRAPH
    if before:
        assert order == ["timed", "choice", "timed"] and timed == [["eager", key], ["eager", path]]
        assert record["models"]["fake"][key]["before_choice_of"] == path
    else:
        assert order == ["choice", "timed"] and timed == [["eager", path]]
        assert key not in record["models"]["fake"]
    assert "error" not in record["models"]["fake"][path]


@pytest.mark.parametrize("compare_first", [True, False])
def test_run_model_keeps_the_compared_values_of_a_job_stopped_before_its_timing(monkeypatch, tmp_path, compare_first):
    """With ``compare_first``, ``run_model`` writes each path's comparison with eager to its JSON before it waits for
    the other jobs and times: a job stopped while it waits (here at the wait, injected; no GPU) keeps its forces'
    difference. Without, the comparison waits too (a second call may still decide), so none is written."""
    import types

    seed = load_benchmark("gpu_seed_vs_inductor")
    model = types.SimpleNamespace(module=None, inputs=())
    monkeypatch.setitem(seed.MODELS, "fake", lambda: model)
    monkeypatch.setattr(seed, "_compile", lambda module, path, device, options: (object(), None))
    monkeypatch.setattr(seed, "_Step", lambda model, fn, device: lambda: None)

    def compare(steps, rows):
        rows["fx"]["max_abs_force_diff"] = 1e-7

    def stopped():
        raise KeyboardInterrupt

    monkeypatch.setattr(seed, "_compare_values", compare)
    monkeypatch.setattr(seed, "all_compiled", stopped)
    out = tmp_path / "job.json"
    with pytest.raises(KeyboardInterrupt):
        seed.run_model("fake", ["eager", "fx"], 1, out, {"models": {}}, compare_first=compare_first)
    row = json.loads(out.read_text())["models"]["fake"]["fx"]
    assert row.get("max_abs_force_diff") == (1e-7 if compare_first else None)


def test_run_model_says_again_after_the_timing_what_the_guard_decided_at_later_calls(monkeypatch):
    """A guard decides a Dynamo graph whole at its second call, after the row's first facts: ``run_model`` reads
    the guard's report again once the paths are timed (here the decision is injected during the timing; no GPU)."""
    import types

    seed = load_benchmark("gpu_seed_vs_inductor")
    model = types.SimpleNamespace(module=None, inputs=())
    monkeypatch.setitem(seed.MODELS, "fake", lambda: model)
    decisions: list = []
    report = types.SimpleNamespace(filter=lambda **kw: [], decisions=decisions)
    monkeypatch.setattr(
        seed, "_compile", lambda module, path, device, options: (object(), types.SimpleNamespace(report=report))
    )
    monkeypatch.setattr(seed, "_Step", lambda model, fn, device: lambda: None)
    monkeypatch.setattr(seed, "_compare_values", lambda steps, rows: None)
    whole = types.SimpleNamespace(
        code="whole_graph", action="switch", region="dynamo graph 0", reason="", details={"split_us": 100.0}
    )
    whole.subgraph, whole.trace, whole.estimates, whole.ops = "subgraph 1", "forward", {}, []
    monkeypatch.setattr(seed, "_time_compared", lambda *args: decisions.append(whole))
    record = {"models": {}}
    seed.run_model("fake", ["fx-guarded"], 1, None, record)
    row = record["models"]["fake"]["fx-guarded"]
    assert [w["graph"] for w in row["whole_graphs"]] == ["dynamo graph 0"] and row["codes"] == {"whole_graph": 1}


def test_stack_samples_runs_the_script_as_main_and_timestamps_its_warnings(tmp_path):
    """benchmarks/stack_samples.py: the script runs as ``__main__`` with its own arguments, each warning it raises is
    written to the samples' file with the seconds since the start; a sampling period that is not positive is refused
    in one line before the script runs."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    sampler = Path(__file__).resolve().parent.parent / "benchmarks" / "stack_samples.py"
    script = tmp_path / "s.py"
    script.write_text("import sys, warnings\nwarnings.warn('w1')\nprint(__name__, sys.argv[1:])\n")
    stacks = tmp_path / "stacks.txt"
    env = {**os.environ, "DIAG_STACKS": str(stacks), "DIAG_EVERY": "60"}
    done = subprocess.run([sys.executable, sampler, script, "a", "b"], env=env, capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.strip() == "__main__ ['a', 'b']"
    assert [line.split("] ", 1)[1] for line in stacks.read_text().splitlines()] == ["UserWarning: w1"]
    env["DIAG_EVERY"] = "0"
    refused = subprocess.run([sys.executable, sampler, script], env=env, capture_output=True, text=True)
    assert refused.returncode == 2 and refused.stderr.strip().splitlines() == [
        "DIAG_EVERY must be a positive number of seconds, not '0'"
    ]
    assert not refused.stdout


def test_alternative_check_keeps_the_rescues_own_signatures(monkeypatch, tmp_path):
    """benchmarks/gpu_alternative_check.py wraps the rescue's alternative and its first-call check: each wrapper
    passes every argument the rescue gives on (a wrapper of another arity would fail inside the rescue, hidden as a
    rescue that built no alternative) and keeps the check's verdict."""
    import inspect
    from types import SimpleNamespace

    from thunder_fusion_guard.passes import rescue

    tool = load_benchmark("gpu_alternative_check")
    seen = []
    monkeypatch.setattr(rescue, "_alternative", lambda *a, **k: seen.append(len(a) + len(k)) or "fusion")
    monkeypatch.setattr(rescue, "_checked_against", rescue._checked_against)
    wanted = inspect.signature(rescue._checked_against)
    log: list[str] = []
    tool._keep_checks(tmp_path, log)
    region = SimpleNamespace(body=["op"])
    assert rescue._alternative("trace", region, "lowered", "if_it_fails", "counter", "on_fail") == "fusion"
    assert seen == [6]
    assert inspect.signature(rescue._checked_against) == wanted
    x = torch.arange(4.0)
    assert torch.equal(rescue._checked_against(lambda t: t * 2, "torchcompile", lambda t: t * 2, (x,)), x * 2)
    assert log and "within rounding" in log[0] and (tmp_path / "check-0.pt").is_file()
    assert (tmp_path / "checks.txt").read_text() == log[0] + "\n"  # written as it is made
    with pytest.raises(rescue.AlternativeDiffers):
        rescue._checked_against(lambda t: t * 2, "torchcompile", lambda t: t * 3, (x,))


def test_against_float64_tells_a_sum_that_cancels_from_a_fusion_that_computes_something_else():
    """A sum whose terms cancel to about zero lands far from float64's in any order of its terms, the ops' own order
    too, so the rescue's check refuses a fusion that only sums in another order; a fusion that computes another
    value is far off where the ops are not."""
    from thunder_fusion_guard.passes import rescue

    tool = load_benchmark("gpu_alternative_check")
    terms = torch.randn(8192, generator=torch.Generator().manual_seed(0)) * 1e4
    terms = terms - terms.double().mean().float()  # a sum of about 1 over terms of about 1e4

    def ops(t):
        return (t.view(64, 128).sum(1).sum(0, keepdim=True), t[:4] * 2)

    def reordered(t):  # the same sums in another order, as a fusion may
        return (t.view(128, 64).sum(1).sum(0, keepdim=True), t[:4] * 2)

    def offs(line):
        fusion, ops_own = line.split("fusion ")[1].split(" off")[0].split(", ops ")
        return float(fusion), float(ops_own)

    lines = tool.against_float64(ops, reordered(terms), ops(terms), (terms,)).splitlines()
    assert all(off > 1e-3 for off in offs(lines[0]))  # both orders: far beyond float32's 1e-4 from the exact sum
    assert rescue._how_far(reordered(terms), ops(terms)) is not None  # so the check refuses the other order
    assert offs(lines[1]) == (0.0, 0.0)
    wrong = tool.against_float64(ops, (ops(terms)[0], terms[:4] * 3), ops(terms), (terms,)).splitlines()[1]
    assert offs(wrong) == (0.5, 0.0)
    refused = tool.against_float64(lambda t: torch.mm(t, torch.ones(1, 1)), None, None, (torch.ones(1, 1),))
    assert refused.startswith("not run in float64: RuntimeError")
