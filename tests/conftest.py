import dataclasses
import gc
import os
import shutil
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

# Read by torch._inductor.config when it is first imported (the imports below import it): set first.
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
# Inductor's first CPU compile in each process checks that the compiler builds each vector ISA the CPU
# has, every check importing torch in a fresh Python: about 5 s per process (the suite, every README
# snippet, every rank). With TORCHINDUCTOR_VEC_ISA_OK=1 the CPU's flags decide (its bf16/VNNI/AMX extras
# are still checked): the ISA those checks pick wherever the compiler builds it. Set it empty to check as
# torch does by default (0 turns vectorization off).
if os.environ.get("TORCHINDUCTOR_VEC_ISA_OK") is None:
    os.environ["TORCHINDUCTOR_VEC_ISA_OK"] = "1"
# The suite opts in to enable_nvfuser_direct() itself (below) and checks processes without it: a process-wide
# TFG_NVFUSER_DIRECT=1 from the shell (the GPU harness sets it) is left out of this process and its children.
os.environ.pop("TFG_NVFUSER_DIRECT", None)

import pytest
import torch
from torch.utils._pytree import tree_flatten

import thunder_fusion_guard.measure.breakeven as breakeven
import thunder_fusion_guard.measure.cache as cache
import thunder_fusion_guard.measure.calibrate as calibrate
import thunder_fusion_guard.whole_graph as whole_graph
from thunder_fusion_guard.measure.timing import HostDevice

warnings.filterwarnings("ignore")


_REAL_TIME = breakeven.RegionMeasurer._time
NOT_CALIBRATED_IN_TESTS = "the test suite never calibrates for real (conftest _no_real_timings)"
NOT_TIMED_IN_TESTS = "not timed: the test suite decides without real timings (conftest _no_real_timings)"


class NoCalibrationInTests(RuntimeError):
    """What calibrate.measure raises in the suite (see _no_real_timings)."""


@pytest.fixture(autouse=True, scope="session")
def _private_cache(tmp_path_factory):
    """Tests never read or write this machine's calibration and measurement caches."""
    patch = pytest.MonkeyPatch()
    patch.setenv("TFG_CACHE_DIR", str(tmp_path_factory.mktemp("tfg-cache")))
    _seed_for_subprocesses()
    yield
    patch.undo()


@pytest.fixture(autouse=True, scope="session")
def _unguarded_nvfuser_runs():
    """The CUDA tests compare with unguarded Thunder, whose nvFuser regions fail as shipped on builds with only
    ``nvfuser_direct``: this process opts in (``enable_nvfuser_direct``); test_nvfuser checks a process without it."""
    if torch.cuda.is_available():
        from thunder_fusion_guard import enable_nvfuser_direct

        enable_nvfuser_direct()
    yield


def _seed_for_subprocesses() -> None:
    """The suite's processes of their own (README snippets, the command line) see this machine's real CPU:
    the private cache holds the shipped CPU constants for it at each thread count they may use (what
    ``fusion-guard calibrate`` leaves behind), so they decide as the tests in this process do, uncalibrated."""
    constants = calibrate.shipped("cpu", "torchcompile")
    patch = pytest.MonkeyPatch()
    try:
        for threads in sorted({1, torch.get_num_threads(), os.cpu_count() or 1}):
            patch.setattr(cache, "cpu_threads", lambda threads=threads: threads)
            calibrate.save_constants("cpu", "torchcompile", constants)
    finally:
        patch.undo()


@pytest.fixture(autouse=True, scope="module")
def _older_objects_frozen():
    """Objects alive when a test module starts leave the garbage collector's sight (``gc.freeze``): the libraries
    imported and the caches earlier modules filled, over 1.5 million objects by the end of a run, which every full
    collection walked again, as ``translate_library_ops`` does at each call (``gc.get_objects``, looking for e3nn
    modules made before it: 2 s a call late in a run, where tests/test_translations.py took 126 s against 58 s run
    alone). A test's own objects are made after its module starts: both still see them. Garbage at the start of a
    module is collected first.
    """
    gc.collect()
    gc.freeze()
    yield


# The CPU every test runs on, whatever the machine: the shipped CPU constants are pinned to it (_pinned_cpu).
TEST_CPU = ("test CPU (conftest)", 2, 1)  # model, cores, torch threads


def pin_cpu(monkeypatch, model: str, cores: int, threads: int) -> str:
    """Make the guard see a CPU of this model, cores and torch threads (its cache and shipped-constants
    identity, ``measure.cache.cpu_identity``); returns that identity."""
    monkeypatch.setattr(cache, "cpu_model", lambda: model)
    monkeypatch.setattr(cache, "cpu_cores", lambda: cores)
    monkeypatch.setattr(cache, "cpu_threads", lambda: threads)
    return cache.cpu_identity()


@pytest.fixture(autouse=True)
def _pinned_cpu(monkeypatch):
    """Every test sees the same CPU, :data:`TEST_CPU`, and the shipped CPU constants (which name no CPU) as
    measured on it: ``calibration="auto"`` uses them there without calibrating, on any machine and thread
    count, as it does on the machine they were measured on. A test of another CPU pins its own (``pin_cpu``)."""
    identity = pin_cpu(monkeypatch, *TEST_CPU)
    pinned = [(identity if key == "cpu" else key, ex, values) for key, ex, values in calibrate.SHIPPED]
    monkeypatch.setattr(calibrate, "SHIPPED", pinned)


@pytest.fixture(autouse=True)
def _no_real_timings(request, monkeypatch):
    """No real timing decides anything in the suite: a region near break-even is not timed (the model
    decides, the decision's ``not_measured`` says so), nor a ThunderFX subgraph against its eager run, and a
    calibration fails at once, before any probe runs: ``calibration="auto"`` then leaves the executor without
    constants ("no constants": regions kept),
    as it did before for the tests' own executors (helpers.fragmenting_executor and the like are not
    registered with Thunder, so their calibration failed). torchcompile itself uses its shipped constants
    (the tests' cache is empty, and ``_pinned_cpu`` makes them this CPU's), and tests/test_no_real_timings.py
    checks all of this.

    A test of measured decisions injects fixed timings with :func:`inject_timings`; a test of the
    calibration replaces ``calibrate.measure`` itself. Only a test marked ``real_timings`` (whose verdict
    holds whatever the clock says) may time or calibrate for real.
    """
    if ADVERSARY:
        _adversary(monkeypatch, ADVERSARY)
    if request.node.get_closest_marker("real_timings"):
        yield
        return

    def not_timed(self, trace, region, left_s, other=None):
        return NOT_TIMED_IN_TESTS

    def no_calibration(device, executor, budget_s=None, **_):
        raise NoCalibrationInTests(f"{executor} on {device}: {NOT_CALIBRATED_IN_TESTS}")

    monkeypatch.setattr(breakeven.RegionMeasurer, "_time", not_timed)
    monkeypatch.setattr(breakeven.RegionMeasurer, "pair", lambda self, compiled, eager, args, **_: NOT_TIMED_IN_TESTS)
    monkeypatch.setattr(calibrate, "measure", no_calibration)
    monkeypatch.setattr(breakeven, "remember", lambda *args, **kwargs: False)  # a profile's real timing decides nothing
    monkeypatch.setattr(whole_graph, "clock", lambda: 0.0)  # a whole graph's compiles with options take no time here
    yield


# TFG_TEST_ADVERSARY=eager-fast (or eager-slow): every interleaved timing says eager runs 10x faster (slower)
# than the fusion, so a verdict that a real timing could decide would change with it. The suite must pass
# alike under both (tests that inject their own timings override it).
ADVERSARY = os.environ.get("TFG_TEST_ADVERSARY")


def _adversary(monkeypatch, mode: str) -> None:
    import thunder_fusion_guard.measure.timing as timing

    if mode not in ("eager-fast", "eager-slow"):
        raise ValueError(f"TFG_TEST_ADVERSARY must be eager-fast or eager-slow, got {mode!r}")
    fused, eager = (100.0, 10.0) if mode == "eager-fast" else (10.0, 100.0)

    def interleaved_us(fns, args, **kwargs):
        return [[fused] * 5, *[[eager] * 5 for _ in fns[1:]]]

    monkeypatch.setattr(breakeven, "interleaved_us", interleaved_us)
    monkeypatch.setattr(timing, "interleaved_us", interleaved_us)


@pytest.fixture
def inject_timings(monkeypatch, tmp_path):
    """``inject_timings(fused_us, eager_us, spread=0.0, other_us=None, host=None, device=None)``: regions near
    break-even are "timed" again, with fixed samples (the fusion and eager callables still run once each, on
    fresh tensors): medians ``fused_us`` and ``eager_us``, the median eager/fused ratio uncertain by
    ``spread`` (relative); the region fused by another executor, where one is timed, ``other_us``
    (None: ten times the slower of the two); host and device times apart, ``(fused, eager)`` µs each, or
    ``(fused, eager, other)`` (None: not known, as off CUDA). Returns the list of calls made to the timing (the
    number of callables timed in each). The measurements are cached in a cache of the test's own, so no other
    test reads them."""
    calls: list[int] = []
    monkeypatch.setenv("TFG_CACHE_DIR", str(tmp_path))
    breakeven.clear_memory_cache()

    def inject(
        fused_us: float,
        eager_us: float,
        spread: float = 0.0,
        other_us: float | None = None,
        host: tuple[float, float] | None = None,
        device: tuple[float, float] | None = None,
    ) -> list[int]:
        def samples(median: float, spread: float = 0.0) -> list[float]:
            half = median * spread / 2
            return [median - half, median - half, median, median + half, median + half]

        def interleaved_us(fns, args, **kwargs):
            calls.append(len(fns))
            # a third callable is the region fused by another executor: 'other_us', else slower than both
            third = [samples(other_us if other_us is not None else 10 * max(fused_us, eager_us))]
            # five rounds: the ratios' interquartile range over √5 is the measurement's 'spread'
            return [samples(fused_us), samples(eager_us, spread * 5**0.5), *third[: len(fns) - 2]]

        def host_device_us(fns, args, **kwargs):
            if host is None or device is None:
                return None
            return [HostDevice(h, d) for h, d in zip(host, device, strict=True)]

        monkeypatch.setattr(breakeven.RegionMeasurer, "_time", _REAL_TIME)
        monkeypatch.setattr(breakeven, "interleaved_us", interleaved_us)
        monkeypatch.setattr(breakeven, "host_device_us", host_device_us)
        return calls

    yield inject
    breakeven.clear_memory_cache()


@pytest.fixture(autouse=True, scope="session")
def _thunder_checks_every_trace():
    """Every jit of the suite (guarded or not, ThunderFX too) runs with Thunder's trace checking,
    ``DebugOptions(check_traces=True)``: a symbol the guard puts into a trace without a meta function, or
    with outputs Thunder cannot recompute, fails the suite. ``TFG_CHECK_TRACES=0`` turns it off.

    Thunder 0.2.6's torch.compile executor and CUDAGraphTransform build their fusion symbols without a meta
    function (nvFuser's have one), so trace checking fails on their regions, guard or not; here they get
    the meta nvFuser's regions have: the call gives its outputs."""
    if os.environ.get("TFG_CHECK_TRACES", "1") == "0":
        yield
        return
    from thunder.core.options import DebugOptions
    from thunder.executors.torch_compile import TorchCompileExecutor
    from thunder.transforms.cudagraph import CUDAGraphTransform

    def with_meta(fuse):
        def fuse_with_meta(self, region, fusion_counter):
            bsym = fuse(self, region, fusion_counter)
            output = bsym.output
            return bsym.from_bsym(sym=dataclasses.replace(bsym.sym, meta=lambda *args, **kwargs: output))

        return fuse_with_meta

    patch = pytest.MonkeyPatch()
    patch.setitem(DebugOptions._defaults, "check_traces", True)
    for fusing in (TorchCompileExecutor, CUDAGraphTransform):
        patch.setattr(fusing, "fuse", with_meta(fusing.fuse))
    yield
    patch.undo()


@pytest.fixture
def failing_rebuild(monkeypatch):
    """Every rebuild of a fusion region (``_thunder.rebuild_fusion``) raises ``RuntimeError: planted rebuild
    failure``: what the guard keeps and records, and what strict mode raises, where a rewrite cannot be built."""
    from thunder_fusion_guard import _thunder as th

    def fail(*args, **kwargs):
        raise RuntimeError("planted rebuild failure")

    monkeypatch.setattr(th, "rebuild_fusion", fail)


@pytest.fixture
def no_inductor():
    """helpers.without_inductor() for one test."""
    from helpers import without_inductor

    with without_inductor():
        yield


@pytest.fixture(scope="module")
def no_inductor_module():
    """helpers.without_inductor() for a whole test module, its module-scoped fixtures too
    (``pytestmark = pytest.mark.usefixtures("no_inductor_module")``)."""
    from helpers import without_inductor

    with without_inductor():
        yield


class BackgroundLane:
    """Out-of-process work of the selected tests marked ``background`` (the README snippets, the two-rank
    runs), run one job after another on a thread of its own from the end of collection on: on a 2-core
    machine it overlaps the tests that run in this process instead of coming after them. A test gets its
    job's result from the ``background`` fixture (waiting for it, and raising what the job raised).

    ``@pytest.mark.background.with_args(job, *args)`` calls ``job(lane, folder, *args)`` with this lane and
    a fresh folder. A job starts its processes with :meth:`popen` (or hands a way to end them to
    :meth:`track`), so that whatever still runs when the test run ends is killed."""

    def __init__(self) -> None:
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="tests-background")
        self.jobs: dict[str, Future] = {}
        self.kills: list[Callable[[], None]] = []
        self.closing = False
        self.folder: str | None = None

    def start(self, item: pytest.Item) -> None:
        marker = item.get_closest_marker("background")
        self.folder = self.folder or tempfile.mkdtemp(prefix="tfg-background-")
        folder = Path(tempfile.mkdtemp(dir=self.folder))
        self.jobs[item.nodeid] = self.pool.submit(marker.args[0], self, folder, *marker.args[1:], **marker.kwargs)

    def popen(self, *args: Any, **kwargs: Any) -> subprocess.Popen:
        if self.closing:
            raise RuntimeError("the test run is over")
        process = subprocess.Popen(*args, **kwargs)
        self.track(lambda: process.poll() is None and process.kill())
        return process

    def run(self, cmd: list[str], timeout: float = 300, **kwargs: Any) -> subprocess.CompletedProcess:
        """``subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kwargs)`` through :meth:`popen`."""
        process = self.popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs)
        try:
            out, err = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            out, err = process.communicate()
        return subprocess.CompletedProcess(cmd, process.returncode, out, err)

    def track(self, kill: Callable[[], None]) -> None:
        self.kills.append(kill)

    def close(self) -> None:
        self.closing = True
        for job in self.jobs.values():
            job.cancel()
        for kill in self.kills:
            kill()
        self.pool.shutdown(wait=True)
        if self.folder:
            shutil.rmtree(self.folder, ignore_errors=True)


BACKGROUND = BackgroundLane()


def _in_background(item: pytest.Item) -> bool:
    return item.get_closest_marker("background") is not None and item.get_closest_marker("skip") is None


def pytest_collection_finish(session):
    """One test process: every background job starts now. A pytest-xdist worker collects every test but runs
    only the files handed to it (``--dist loadfile``), so it starts a file's jobs when it runs its first test."""
    if session.config.option.collectonly or hasattr(session.config, "workerinput"):
        return
    for item in session.items:
        if _in_background(item):
            BACKGROUND.start(item)


_FILES_STARTED: set[Path] = set()


def pytest_runtest_setup(item):
    if not hasattr(item.config, "workerinput") or item.path in _FILES_STARTED:
        return
    _FILES_STARTED.add(item.path)
    for other in item.session.items:
        if other.path == item.path and _in_background(other):
            BACKGROUND.start(other)


def pytest_sessionfinish(session, exitstatus):
    BACKGROUND.close()


@pytest.fixture
def background(request):
    """The result of this test's ``background`` job (see :class:`BackgroundLane`)."""
    job = BACKGROUND.jobs.get(request.node.nodeid)
    assert job is not None, f"{request.node.nodeid}: not marked background, or its job was not started"
    return job.result()


def pytest_addoption(parser):
    parser.addoption("--run-slow", action="store_true", default=False, help="run tests marked slow")


def _nvfuser_ready() -> bool:
    if not torch.cuda.is_available():
        return False
    from thunder.executors.nvfuserex import nvfuser_available

    return nvfuser_available()


# Codes of decisions recording that a part of the guard failed and was skipped (reasons.WARNED says them too).
GUARD_FAILURES = frozenset({"pass_failed", "rewrite_failed", "rebuild_failed"})


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "guard_failure_expected: the test makes a part of the guard fail (see _guard_parts_never_fail)"
    )


def _unlike_its_facts(decision) -> str | None:
    """What differs between a decision with a code and the words its code makes of its facts (None: nothing)."""
    from thunder_fusion_guard.reasons import words

    try:
        reason, told = words(decision.code, decision.facts)
    except Exception as e:  # a fact its wording reads is missing, or of the wrong kind
        return f"{decision.code}: its facts cannot be worded ({type(e).__name__}: {e})"
    if (reason, told.get("explanation")) == (decision.reason, decision.details.get("explanation")):
        return None
    return f"{decision.code}: reason {decision.reason!r}, but its facts say {reason!r} (or the explanation differs)"


@pytest.fixture(autouse=True)
def _guard_parts_never_fail(request, monkeypatch):
    """A part of the guard that fails (a pass that raised, a rewrite or a rebuild that failed) is skipped and
    recorded, and the user's program runs on: in the suite it fails the test, unless the test makes it fail on
    purpose (marked ``guard_failure_expected``). So does a decision with a code whose reason or explanation is not
    what its code words its facts as. Decisions recorded in this process are seen."""
    from thunder_fusion_guard.report import Report

    failed, unlike = [], []
    add = Report.add

    def recording(self, decision):
        if decision.code in GUARD_FAILURES:
            failed.append(decision)
        if decision.code is not None:
            unlike.append(_unlike_its_facts(decision))
        add(self, decision)

    monkeypatch.setattr(Report, "add", recording)
    yield
    if failed and not request.node.get_closest_marker("guard_failure_expected"):
        said = "; ".join(f"{d.trace} {d.region}: {d.reason} ({d.error})" for d in failed[:3])
        pytest.fail(f"{len(failed)} part(s) of the guard failed: {said}", pytrace=False)
    unlike = [u for u in unlike if u is not None]
    if unlike:
        pytest.fail(f"{len(unlike)} decision(s) not worded from their facts: {'; '.join(unlike[:3])}", pytrace=False)


@pytest.fixture(autouse=True)
def _restore_torch_threads():
    """The CLI pins torch's intra-op threads for timing; keep that from leaking into later tests."""
    threads = torch.get_num_threads()
    yield
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)


def pytest_collection_modifyitems(config, items):
    skip_cuda = None if _nvfuser_ready() else pytest.mark.skip(reason="needs a CUDA GPU with nvFuser")
    skip_slow = None if config.getoption("--run-slow") else pytest.mark.skip(reason="slow: opt in with --run-slow")
    for item in items:
        if skip_cuda and item.get_closest_marker("cuda"):
            item.add_marker(skip_cuda)
        if skip_slow and item.get_closest_marker("slow"):
            item.add_marker(skip_slow)


def pytest_terminal_summary(terminalreporter):
    """The OpInfo differential test's coverage (ops tried, passed, skipped and why), if it ran."""
    harness = sys.modules.get("opinfo_harness")
    if harness is None or not harness.COVERAGE:
        return
    for line in harness.COVERAGE.summary_lines():
        terminalreporter.write_line(line)
    path = os.environ.get("TFG_COVERAGE_JSON")
    if path:
        harness.COVERAGE.write_json(path)
        terminalreporter.write_line(f"OpInfo coverage written to {path}")


@pytest.fixture
def one_rank(tmp_path):
    """A one-rank gloo process group (Thunder's collectives need one to be traced), destroyed afterwards."""
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        yield dist.new_group()
    finally:
        dist.destroy_process_group()


class _Replay:
    """A CPU stand-in for a captured graph: a replay runs the function on the static inputs again and writes its
    results into the tensors the capture returned. Like a captured graph, it reads each input at the memory it had
    when captured (an input given ``.data`` anew since is not read)."""

    def __init__(self, fn, inputs, outputs):
        self.fn, self.outputs = fn, tree_flatten(outputs)[0]
        self.inputs = tuple(a.detach() if isinstance(a, torch.Tensor) else a for a in inputs)

    def replay(self):
        for old, new in zip(self.outputs, tree_flatten(self.fn(*self.inputs))[0], strict=True):
            if isinstance(old, torch.Tensor):
                # a broadcast output (stride 0) is written through the one element each broadcast dim repeats
                one = tuple(0 if stride == 0 else slice(None) for stride in old.stride())
                old[one].copy_(new[one])


@pytest.fixture
def cpu_graphs(monkeypatch):
    """CUDA-graph captures on CPU, for Thunder's ``CUDAGraphTransform`` (and ``GuardedCUDAGraphs``, its subclass):
    static input buffers copied into at each replay unless the input is static, outputs written into the same
    tensors at every replay (:class:`_Replay`)."""
    from thunder.transforms.cudagraph import CUDAGraphRunner

    def build(self, fn, args, static_args_mask):
        inputs = tuple(
            a if static else self.get_static_buffer(a) for a, static in zip(args, static_args_mask, strict=True)
        )
        outputs = fn(*inputs)
        return _Replay(fn, inputs, outputs), inputs, outputs

    monkeypatch.setattr(CUDAGraphRunner, "build_cuda_graph", build)
