"""Faults users meet: Ctrl-C during a first call, running out of memory, a cache that cannot be read or written or
that several processes write at once, and a compiled program called from two threads at once. The guard never breaks
the program, the user's own interrupt or out of memory reaches them unchanged, and what it records is what a clean
run records."""

from __future__ import annotations

import json
import multiprocessing
import os
import threading
from pathlib import Path

import pytest
import thunder
import torch
from conftest import pin_cpu
from helpers import NEAR_BREAK_EVEN, assert_same, jit_cpu

import thunder_fusion_guard._thunder as th
import thunder_fusion_guard.measure.breakeven as breakeven
import thunder_fusion_guard.measure.cache as cache
import thunder_fusion_guard.measure.calibrate as calibrate
import thunder_fusion_guard.passes.hoist_pass as hoist_pass
from thunder_fusion_guard import Costs, FusionGuard
from thunder_fusion_guard.cost import CostConstants
from thunder_fusion_guard.passes.hoist_runtime import hoisted_values


class Scaled(torch.nn.Module):
    """A parameter times an input-independent tensor: the tensor is hoisted and saved for the backward."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.linspace(0.5, 2.0, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x + torch.full((4,), 2.0) * self.w).transpose(0, 1) * 3.0


# The subject is the guard's handling of faults, not the code Inductor generates: regions run uncompiled.
pytestmark = pytest.mark.usefixtures("no_inductor_module")

FAKE = CostConstants(**NEAR_BREAK_EVEN, source="a calibration standing in")


def lone_add(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a + b


def facts(guard: FusionGuard) -> list[tuple]:
    """The guard's decisions as facts (no wording), in order."""
    return [
        (d.function, d.compile_index, d.trace, d.region, d.action, d.details.get("decided_by"), d.applied)
        for d in guard.report
    ]


def by_compile(guard: FusionGuard) -> dict[int, list[tuple]]:
    """Each compilation's decisions as facts, without the compile index."""
    out: dict[int, list[tuple]] = {}
    for f in facts(guard):
        out.setdefault(f[1], []).append(f[:1] + f[2:])
    return out


def jit_torch(model: torch.nn.Module, guard: FusionGuard | None = None):
    return thunder.jit(model, executors=[], transforms=[] if guard is None else [guard])


def step(jitted, model: Scaled, x: torch.Tensor) -> list[torch.Tensor]:
    """Output and the gradients of x and the parameter (not accumulated into ``.grad``)."""
    x = x.detach().clone().requires_grad_()
    out = jitted(x)
    return [out.detach(), *torch.autograd.grad(out.sum(), [x, model.w])]


# --- a compiled function called from two threads at once --------------------------------------------------------


class ForwardsFirst(FusionGuard):
    """The guard, with the forward traces of two threads' compilations both guarded before either backward trace:
    the interleaving that mixes up two compilations' records if the guard does not tell them apart."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.both_forwards = threading.Barrier(2, timeout=120)
        self.forward_caches: dict[int, set[int]] = {}

    def transform_trace_post_optimization(self, computation_trace, **kwargs):
        new = super().transform_trace_post_optimization(computation_trace, **kwargs)
        if not th.is_backward(computation_trace):
            self.forward_caches[threading.get_ident()] = {id(v) for v in hoisted_values(new)}
            self.both_forwards.wait()
        return new


def test_two_threads_compiling_at_once_record_each_compilation_as_one_thread_does(monkeypatch):
    torch.manual_seed(0)
    model, x = Scaled(), torch.randn(2, 4)
    alone = FusionGuard()
    want = step(jit_torch(model, alone), model, x)
    assert any(d.action == "hoist" for d in alone.report), "the test needs a hoisted tensor saved for the backward"
    assert_same(want, step(jit_torch(model), model, x))

    checked: dict[int, set[int]] = {}
    real_check = hoist_pass.check_backward

    def check_backward(trace, saved, metadata_ops=frozenset()):
        checked[threading.get_ident()] = {id(v) for v in saved.values()}
        return real_check(trace, saved, metadata_ops)

    monkeypatch.setattr(hoist_pass, "check_backward", check_backward)
    guard = ForwardsFirst()
    jitted = jit_torch(model, guard)
    got: dict[int, list[torch.Tensor]] = {}
    errors: list[BaseException] = []

    def call(i: int) -> None:
        try:
            got[i] = step(jitted, model, x)
        except BaseException as e:  # reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=call, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert thunder.cache_misses(jitted) == 2, "both threads compiled"
    for i in range(2):
        assert_same(got[i], want)
    # each backward checked the hoisted tensors of its own forward, not the other thread's
    assert checked == guard.forward_caches and all(checked.values())
    # each compilation recorded exactly what one thread alone records: no decision twice, none lost
    (reference,) = by_compile(alone).values()
    assert by_compile(guard) == {1: reference, 2: reference}
    # and the compiled programs still agree, called one after the other
    for _ in range(2):
        assert_same(step(jitted, model, x), want)


# --- the calibration and measurement cache ------------------------------------------------------------------------


def _write_entries(path: str, writer: int, count: int) -> None:
    for k in range(count):
        cache.update_json(Path(path), {f"writer {writer} entry {k}": [writer, k]})


def test_four_processes_updating_one_cache_at_once_keep_every_entry(tmp_path):
    path = tmp_path / "measurements.json"
    cache.update_json(path, {"before": 1})
    fork = multiprocessing.get_context("fork")  # the children only read and write JSON
    writers = [fork.Process(target=_write_entries, args=(str(path), w, 25)) for w in range(4)]
    for p in writers:
        p.start()
    for p in writers:
        p.join(120)
    assert [p.exitcode for p in writers] == [0] * 4
    data = json.loads(path.read_text())
    want = {"before": 1, **{f"writer {w} entry {k}": [w, k] for w in range(4) for k in range(25)}}
    assert data == want, f"{len(want) - len(data)} entries lost"
    assert not list(tmp_path.glob("*.tmp")), "no temporary file left behind"


def test_an_interrupted_cache_write_leaves_the_old_file_whole(tmp_path, monkeypatch):
    path = tmp_path / "calibration.json"
    cache.update_json(path, {"kept": 1})

    def interrupted(src, dst):
        raise KeyboardInterrupt

    monkeypatch.setattr(cache.os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        cache.update_json(path, {"new": 2})
    monkeypatch.undo()
    assert json.loads(path.read_text()) == {"kept": 1}
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock")) == ["calibration.json"]


def _corrupt(folder: Path, how: str) -> None:
    """Both cache files of ``folder`` made unusable ``how``."""
    for name in ("calibration.json", "measurements.json"):
        path = folder / name
        if how == "truncated":
            path.write_text(json.dumps({cache.cache_key("cpu", "torchcompile"): FAKE.to_dict()})[:40])
        elif how == "not an object":
            path.write_text("[1, 2, 3]")
        elif how == "entries of the wrong types":
            key = cache.cache_key("cpu", "torchcompile")
            path.write_text(json.dumps({key: {**FAKE.to_dict(), "fusion_call_us": "fast"}, "x": "y"}))
        elif how == "unreadable":  # a folder in its place: reading it fails, as does writing it
            path.mkdir()
        elif how == "unreadable by permissions":
            path.write_text(json.dumps({cache.cache_key("cpu", "torchcompile"): FAKE.to_dict()}))
            path.chmod(0)


CORRUPTIONS = ["truncated", "not an object", "entries of the wrong types", "unreadable", "unreadable by permissions"]


@pytest.fixture
def calibrates(monkeypatch):
    """calibrate.measure replaced by a call counter returning FAKE."""
    calls: list[str] = []

    def measure(device, executor, budget_s=None, **_):
        calls.append(executor)
        return FAKE

    monkeypatch.setattr(calibrate, "measure", measure)
    return calls


@pytest.mark.parametrize("how", CORRUPTIONS)
def test_a_cache_that_cannot_be_read_is_ignored_and_the_guard_still_decides(
    tmp_path, monkeypatch, inject_timings, how, calibrates
):
    if how == "unreadable by permissions" and os.geteuid() == 0:
        pytest.skip("root reads a file whatever its permissions")
    timings = inject_timings(10.0, 2.0)  # the cache: tmp_path
    _corrupt(tmp_path, how)
    guard = FusionGuard(costs=Costs(calibration="measure"))
    a, b = torch.randn(16, 16), torch.randn(16, 16)
    assert torch.equal(jit_cpu(lone_add, guard)(a, b), jit_cpu(lone_add)(a, b))
    assert calibrates == ["torchcompile"] and timings == [2], "calibrated and timed: nothing usable was read"
    (event,) = guard.report.calibrations
    (d,) = guard.report
    assert (d.action, d.details["decided_by"], d.details["measured_from"]) == ("reject", "measured", "timed")
    if how == "unreadable":  # nothing could be written either: said, not raised
        assert "not cached" in event["result"] and "not_cached" in guard.report.measuring
    else:  # the files are whole again, with this machine's entries
        assert "not cached" not in event["result"] and "not_cached" not in guard.report.measuring
        assert calibrate.cached("cpu", "torchcompile") == FAKE
        measured = json.loads((tmp_path / "measurements.json").read_text()).values()
        assert len([m for m in measured if isinstance(m, dict) and "region_us" in m]) == 1


def test_a_cache_folder_that_cannot_be_written_is_said_and_decisions_are_still_made(
    tmp_path, monkeypatch, inject_timings, calibrates
):
    """The cache folder cannot be made (a file is in the way: what a read-only folder does to a user who is not
    root): the guard calibrates and times as without a cache, and says that nothing was cached."""
    blocker = tmp_path / "a file"
    blocker.write_text("")
    timings = inject_timings(10.0, 2.0)
    monkeypatch.setenv("TFG_CACHE_DIR", str(blocker / "cache"))
    guard = FusionGuard(costs=Costs(calibration="measure"))
    a, b = torch.randn(16, 16), torch.randn(16, 16)
    assert torch.equal(jit_cpu(lone_add, guard)(a, b), jit_cpu(lone_add)(a, b))
    assert calibrates == ["torchcompile"] and timings == [2]
    (event,) = guard.report.calibrations
    (d,) = guard.report
    assert (d.action, d.details["decided_by"]) == ("reject", "measured")
    assert "not cached" in event["result"] and "not_cached" in guard.report.measuring


@pytest.mark.parametrize("other", ["torch version", "thunder version", "device", "dtype"])
def test_an_entry_made_under_other_software_another_device_or_dtype_is_never_used(
    tmp_path, monkeypatch, inject_timings, other
):
    timings = inject_timings(10.0, 2.0)
    versions = th.software_versions()
    dtype = torch.float64 if other == "dtype" else torch.float32
    with monkeypatch.context() as elsewhere:  # the cache is filled there
        if other == "device":
            pin_cpu(elsewhere, "another CPU", 2, 1)
        elif other != "dtype":
            changed = {**versions, other.split()[0]: "0.0.1"}
            elsewhere.setattr(th, "software_versions", lambda: changed)
        calibrate.save_constants("cpu", "torchcompile", FAKE)
        a, b = torch.randn(16, 16, dtype=dtype), torch.randn(16, 16, dtype=dtype)
        jit_cpu(lone_add, FusionGuard(costs=Costs(calibration=NEAR_BREAK_EVEN)))(a, b)
    assert timings == [2] and len(json.loads((tmp_path / "measurements.json").read_text())) == 1
    breakeven.clear_memory_cache()  # a fresh process here reads only the disk
    # a calibration holds for every dtype; made elsewhere, it is not this machine's
    assert calibrate.cached("cpu", "torchcompile") == (FAKE if other == "dtype" else None)
    guard = FusionGuard(costs=Costs(calibration=NEAR_BREAK_EVEN))
    jit_cpu(lone_add, guard)(torch.randn(16, 16), torch.randn(16, 16))
    assert timings == [2, 2], "timed again: the measurement made elsewhere is not used"
    (d,) = guard.report
    assert d.details["measured_from"] == "timed"
    assert len(json.loads((tmp_path / "measurements.json").read_text())) == 2, "both entries kept, apart"


# --- Ctrl-C during the first call ---------------------------------------------------------------------------------


class FailsFirst:
    """A stand-in for a fault: ``fault()`` raised at the first ``times`` calls, then ``then``."""

    def __init__(self, then, times: int = 1) -> None:
        self.then, self.left = then, times

    def fault(self) -> BaseException:
        raise NotImplementedError

    def __call__(self, *args, **kwargs):
        if self.left:
            self.left -= 1
            raise self.fault()
        return self.then(*args, **kwargs)


class Interrupts(FailsFirst):
    """The user pressing Ctrl-C: ``KeyboardInterrupt``."""

    def fault(self) -> BaseException:
        return KeyboardInterrupt()


def clean_facts(make_guard, fn, *args) -> list[tuple]:
    """The decisions of a guard that compiled ``fn`` uninterrupted."""
    guard = make_guard()
    jit_cpu(fn, guard)(*args)
    return facts(guard)


def test_ctrl_c_in_a_region_timing_reaches_the_user_and_leaves_nothing_half_measured(monkeypatch, inject_timings):
    timings = inject_timings(10.0, 2.0)
    a, b = torch.randn(16, 16), torch.randn(16, 16)
    want = clean_facts(lambda: FusionGuard(costs=Costs(calibration=NEAR_BREAK_EVEN)), lone_add, a, b)
    assert [f[4:6] for f in want] == [("reject", "measured")] and timings == [2]
    breakeven.clear_memory_cache()
    (cache.cache_dir() / "measurements.json").unlink()

    monkeypatch.setattr(breakeven, "interleaved_us", Interrupts(breakeven.interleaved_us))
    guard = FusionGuard(costs=Costs(calibration=NEAR_BREAK_EVEN))
    jitted = jit_cpu(lone_add, guard)
    with pytest.raises(KeyboardInterrupt):
        jitted(a, b)
    assert not guard.report.decisions, "no decision from a cut timing"
    assert not (cache.cache_dir() / "measurements.json").exists() and not breakeven._store(), "nothing cached"
    assert torch.equal(jitted(a, b), jit_cpu(lone_add)(a, b))
    assert timings == [2, 2], "timed again, in full"
    assert facts(guard) == [(*want[0][:1], 2, *want[0][2:])], "the decisions of an uninterrupted compilation"
    assert len(json.loads((cache.cache_dir() / "measurements.json").read_text())) == 1


def test_ctrl_c_in_a_calibration_reaches_the_user_and_leaves_nothing_half_calibrated(monkeypatch, inject_timings):
    inject_timings(10.0, 2.0)
    calls: list[str] = []

    def measure(device, executor, budget_s=None, **_):
        calls.append(executor)
        return FAKE

    monkeypatch.setattr(calibrate, "measure", Interrupts(measure))
    guard = FusionGuard(costs=Costs(calibration="measure"))
    jitted = jit_cpu(lone_add, guard)
    a, b = torch.randn(16, 16), torch.randn(16, 16)
    with pytest.raises(KeyboardInterrupt):
        jitted(a, b)
    assert not guard.report.decisions and not guard.report.calibrations
    assert calibrate.cached("cpu", "torchcompile") is None, "no calibration cached"
    assert torch.equal(jitted(a, b), jit_cpu(lone_add)(a, b))
    (event,) = guard.report.calibrations
    assert calls == ["torchcompile"] and event["result"].startswith("calibrated here")
    assert calibrate.cached("cpu", "torchcompile") == FAKE
    breakeven.clear_memory_cache()
    want = clean_facts(lambda: FusionGuard(costs=Costs(calibration=FAKE)), lone_add, a, b)
    assert facts(guard) == [(*want[0][:1], 2, *want[0][2:])]


def test_ctrl_c_while_thunder_traces_reaches_the_user_and_the_next_call_compiles_cleanly():
    pressed = [True]

    def traced(x: torch.Tensor) -> torch.Tensor:
        if pressed and pressed.pop():  # runs while Thunder traces: the first trace is interrupted
            raise KeyboardInterrupt
        return x.reshape(2, -1).transpose(0, 1) * 2.0

    x = torch.randn(4, 6)
    guard = FusionGuard()
    jitted = jit_cpu(traced, guard)
    with pytest.raises(KeyboardInterrupt):
        jitted(x)
    assert not guard.report.decisions
    assert torch.equal(jitted(x), jit_cpu(traced)(x))
    want = clean_facts(FusionGuard, traced, x)
    assert by_compile(guard) == {1: by_compile_of(want)}


def by_compile_of(found: list[tuple]) -> list[tuple]:
    """The facts of one compilation, without the compile index."""
    return [f[:1] + f[2:] for f in found]


class ExpScaled(torch.nn.Module):
    """One region the guard keeps (exp rounds differently alone): it runs through the guard's rescuing call."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.exp(x) * 2.0


@pytest.mark.parametrize("make", [ExpScaled, Scaled], ids=["kept-region", "hoisted-region"])
def test_ctrl_c_in_a_fusion_compile_reaches_the_user_and_no_region_is_rescued(make):
    from thunder.executors.torch_compile import TorchCompileExecutor, torch_compile_ex

    class FirstCallInterrupted(TorchCompileExecutor):
        """torch.compile regions: the first call of the first region called (its compile) is interrupted."""

        interrupts = 1

        def fuse(self, region, fusion_counter):
            bsym = super().fuse(region, fusion_counter)
            fused = th.region_callable(bsym)

            def call(*args):
                if self.interrupts:
                    self.interrupts -= 1
                    raise KeyboardInterrupt
                return fused(*args)

            return th.with_region_callable(bsym, call)

    def run(guard: FusionGuard | None) -> tuple[list[torch.Tensor], object]:
        ex = FirstCallInterrupted("tc_interrupted")
        ex._implmap = dict(torch_compile_ex._implmap)
        torch.manual_seed(0)
        jitted = thunder.jit(make(), executors=[ex], transforms=[] if guard is None else [guard])
        x = torch.randn(2, 4)
        with pytest.raises(KeyboardInterrupt):
            jitted(x)
        return [jitted(x).detach(), jitted(x).detach()], jitted

    got, guarded = run(guard := FusionGuard())
    want, plain = run(None)
    assert_same(got, want)
    assert thunder.cache_misses(guarded) == thunder.cache_misses(plain) == 1, "the finished compilation is reused"
    assert not [d for d in guard.report if d.action == "rescue"], "an interrupt is no failure to rescue"
    assert {d.compile_index for d in guard.report} == {1}
    if make is ExpScaled:
        (d,) = guard.report
        assert d.action == "keep" and "rescue" not in d.details, "called through the guard's rescuing call"


# --- out of memory ------------------------------------------------------------------------------------------------


class OutOfMemory(FailsFirst):
    """The device running out of memory: ``torch.OutOfMemoryError``."""

    def fault(self) -> BaseException:
        return torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (a stand-in)")


def test_out_of_memory_in_a_region_timing_leaves_the_region_to_the_model_and_records_why(monkeypatch, inject_timings):
    timings = inject_timings(10.0, 2.0)
    monkeypatch.setattr(breakeven, "interleaved_us", OutOfMemory(breakeven.interleaved_us))
    a, b = torch.randn(16, 16), torch.randn(16, 16)
    guard = FusionGuard(costs=Costs(calibration=NEAR_BREAK_EVEN))
    assert torch.equal(jit_cpu(lone_add, guard)(a, b), jit_cpu(lone_add)(a, b))
    (d,) = guard.report
    # the model decides a region it could not time; the measurement's error is kept beside the decision
    assert d.about_region and d.details["decided_by"] != "measured" and timings == []
    assert "OutOfMemoryError" in d.details["not_measured"]
    assert not breakeven._store() and not (cache.cache_dir() / "measurements.json").exists(), "nothing cached"


def test_the_users_own_out_of_memory_reaches_them_unchanged():
    def wants_too_much(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.exp(x) * 2.0, x.new_empty(x.shape[0], 2**42) + x[:, None]  # 64 TiB on the CPU

    x = torch.randn(4)
    raised = []
    for guard in (None, FusionGuard()):
        with pytest.raises(RuntimeError) as error:
            jit_cpu(wants_too_much, guard)(x)
        raised.append((type(error.value), str(error.value)))
    assert raised[0] == raised[1] and "can't allocate memory" in raised[0][1]
