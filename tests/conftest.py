import os
import warnings

import pytest
import torch

warnings.filterwarnings("ignore")
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")


def pytest_addoption(parser):
    parser.addoption("--run-slow", action="store_true", default=False, help="run tests marked slow")


def _nvfuser_ready() -> bool:
    if not torch.cuda.is_available():
        return False
    from thunder.executors.nvfuserex import nvfuser_available

    return nvfuser_available()


def pytest_collection_modifyitems(config, items):
    skip_cuda = None if _nvfuser_ready() else pytest.mark.skip(reason="needs a CUDA GPU with nvFuser")
    skip_slow = None if config.getoption("--run-slow") else pytest.mark.skip(reason="slow: opt in with --run-slow")
    for item in items:
        if skip_cuda and "cuda" in item.keywords:
            item.add_marker(skip_cuda)
        if skip_slow and "slow" in item.keywords:
            item.add_marker(skip_slow)
