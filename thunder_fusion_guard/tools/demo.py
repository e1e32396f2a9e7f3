"""The demo: an embedded example jitted with and without the guard, its decisions and per-call times.

Runs on CPU with Thunder's torch.compile executor, or with nvFuser when CUDA is present.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from einops import rearrange

from ..measure.timing import median_us


def rearrange_heads(scores: torch.Tensor) -> torch.Tensor:
    """The original report: an einops rearrange alone in a region."""
    return rearrange(scores, "b np sq sk -> (b np) sq sk")


def view_chain(x: torch.Tensor) -> torch.Tensor:
    """A chain of metadata ops: reshape, permute, slice, unsqueeze, expand."""
    y = x.reshape(x.shape[0], -1, x.shape[-1]).permute(0, 2, 1)[:, 1:, :]
    return y.unsqueeze(1).expand(-1, 2, -1, -1)


def scaled_softmax(x: torch.Tensor) -> torch.Tensor:
    """Compute worth a fusion: the guard keeps it."""
    return torch.softmax(x * 0.125 + 1.0, dim=-1)


@dataclass
class Case:
    name: str
    fn: Callable[..., torch.Tensor]
    shape: tuple[int, ...]


CASES = [
    Case("einops rearrange", rearrange_heads, (2, 8, 128, 128)),
    Case("view chain", view_chain, (4, 16, 32, 64)),
    Case("scaled softmax", scaled_softmax, (64, 1024)),
]


def _jit(fn, guard, cuda: bool):
    import thunder

    transforms = [] if guard is None else [guard]
    if cuda:
        # Thunder keeps nvFuser from forming shape-only regions by default; allow them so the guard has work.
        return thunder.jit(fn, transforms=transforms, nv_enable_shape_only_fusion=True)
    from thunder.executors.torch_compile import torch_compile_ex

    return thunder.jit(fn, executors=[torch_compile_ex], transforms=transforms)


def run_demo(*, device: str | None = None, reps: int = 200) -> str:
    """Run every case unguarded, guarded and eager; return the decisions and timing table as text."""
    from .. import FusionGuard
    from ..compat import applied_fixes

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    cuda = device == "cuda"
    guard = FusionGuard()
    lines = [
        f"thunder-fusion-guard demo on {torch.cuda.get_device_name() if cuda else 'CPU'} "
        f"({'nvFuser' if cuda else 'torch.compile executor'})"
    ]
    lines += [f"  compat: {fix}" for fix in applied_fixes()]
    rows = []
    for case in CASES:
        x = torch.randn(case.shape, device=device)
        plain, guarded = _jit(case.fn, None, cuda), _jit(case.fn, guard, cuda)
        if not torch.equal(plain(x), guarded(x)):
            raise AssertionError(f"{case.name}: guarded output differs from unguarded thunder")
        rows.append(
            (
                case.name,
                median_us(plain, x, reps=reps),
                median_us(guarded, x, reps=reps),
                median_us(case.fn, x, reps=reps),
            )
        )
    lines += ["", str(guard.report), "", f"{'case':<18} {'thunder µs':>11} {'guarded µs':>11} {'eager µs':>9}"]
    lines += [f"{n:<18} {a:>11.1f} {b:>11.1f} {c:>9.1f}" for n, a, b, c in rows]
    lines.append(f"(median of {reps} calls each; one process; outputs of guarded and unguarded are identical)")
    return "\n".join(lines)
