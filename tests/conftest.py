import dataclasses
import os
import sys
import warnings

import pytest
import torch

warnings.filterwarnings("ignore")
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")


@pytest.fixture(autouse=True, scope="session")
def _private_cache(tmp_path_factory):
    """Tests never read or write this machine's calibration and measurement caches."""
    patch = pytest.MonkeyPatch()
    patch.setenv("TFG_CACHE_DIR", str(tmp_path_factory.mktemp("tfg-cache")))
    yield
    patch.undo()


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


def pytest_addoption(parser):
    parser.addoption("--run-slow", action="store_true", default=False, help="run tests marked slow")


def _nvfuser_ready() -> bool:
    if not torch.cuda.is_available():
        return False
    from thunder.executors.nvfuserex import nvfuser_available

    return nvfuser_available()


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
