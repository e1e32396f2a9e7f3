"""A TorchScript function in a module's forward (e3nn 0.4.4's spherical harmonics in MACE): Thunder 0.2.6's
interpreter aborts the whole process on it. Guarded, ``thunder.jit`` raises first, naming the function and
ThunderFX, under which the same module runs."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import thunder
import torch
from thunder.dynamo import thunderfx

from thunder_fusion_guard import FusionGuard, fusion_executors
from thunder_fusion_guard.passes import FusionGuardError


@torch.jit.script
def harmonics(x: torch.Tensor) -> torch.Tensor:
    return torch.stack([x[..., 0] * x[..., 1], x[..., 2] * x[..., 2]], dim=-1)


def edge_features(x: torch.Tensor) -> torch.Tensor:  # a library's plain helper around the scripted function
    return harmonics(x) * 2


class Direct(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return harmonics(x).sum()


class ThroughHelper(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return edge_features(x).sum()


@pytest.mark.parametrize("model", [Direct(), ThroughHelper()], ids=["direct", "through_helper"])
def test_guarded_jit_raises_before_thunder_would_abort(model: torch.nn.Module) -> None:
    with pytest.raises(FusionGuardError, match=r"would abort this process.*test_scripted\.harmonics.*ThunderFX"):
        thunder.jit(model, executors=fusion_executors("cpu"), transforms=[FusionGuard()])


def test_under_thunderfx_it_runs_guarded() -> None:
    model, x = ThroughHelper(), torch.randn(4, 3)
    compiled = thunderfx(model, executors=fusion_executors("cpu"), transforms=[FusionGuard()])
    torch.testing.assert_close(compiled(x), model(x))


def test_unguarded_thunder_aborts_the_process(tmp_path) -> None:
    """What the guard's error spares: run apart, unguarded Thunder ends the process by SIGABRT."""
    program = textwrap.dedent(
        """
        import torch, thunder

        @torch.jit.script
        def harmonics(x: torch.Tensor) -> torch.Tensor:
            return x * 2

        thunder.jit(lambda x: harmonics(x))(torch.randn(3))
        """
    )
    script = tmp_path / "scripted.py"  # TorchScript reads the function's source
    script.write_text(program)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert done.returncode < 0, (done.returncode, done.stderr[-2000:])
    assert "tp_new_impl" in done.stderr
