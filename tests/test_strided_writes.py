"""A fusion region that writes an input that is not contiguous (a ``narrow`` of a wider tensor, as e3nn's ``Gate``
hands a ThunderFX subgraph): nvFuser 0.2.36 loses or misplaces the write, so the input keeps its values. The
guard hands such a region a contiguous copy and copies it into the input after the call, and records it. On CPU a
torch.compile executor written here loses such a write as nvFuser does; on CUDA, nvFuser itself."""

from __future__ import annotations

import pytest
import thunder
import torch
from thunder.dynamo import thunderfx
from thunder.executors.torch_compile import TorchCompileExecutor, torch_compile_ex

from thunder_fusion_guard import FusionGuard, explain, fusion_executors
from thunder_fusion_guard._thunder import region_callable
from thunder_fusion_guard.passes import rescue

LOSES_WRITES = "tc_as_if_contiguous"


@pytest.fixture
def loses_strided_writes(monkeypatch: pytest.MonkeyPatch) -> list[TorchCompileExecutor]:
    """Executors: torch.compile, but a region handed an input that is not contiguous writes a contiguous copy of
    it instead, which it then drops (the write is lost); the guard treats it as it treats nvFuser."""

    class AsIfContiguous(TorchCompileExecutor):
        def fuse(self, region, fusion_counter):
            bsym = super().fuse(region, fusion_counter)
            fn = region_callable(bsym)

            def writes_elsewhere(*args):
                given = [
                    a.clone(memory_format=torch.contiguous_format)
                    if isinstance(a, torch.Tensor) and not a.is_contiguous()
                    else a
                    for a in args
                ]
                return fn(*given)

            bsym._call_ctx = {bsym.sym.name: writes_elsewhere}
            return bsym

    ex = AsIfContiguous(LOSES_WRITES)
    ex._implmap = dict(torch_compile_ex._implmap)
    monkeypatch.setattr(rescue, "LOSES_STRIDED_WRITES", rescue.LOSES_STRIDED_WRITES | {LOSES_WRITES})
    return [ex]


def write_view(view: torch.Tensor, x: torch.Tensor) -> None:
    view.copy_(torch.sin(x) * 2)


def narrowed(dtype: torch.dtype, device: str = "cpu") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A zero tensor, a narrow of it (not contiguous) and values for it whose sine rounds in ``dtype``."""
    torch.manual_seed(0)
    base = torch.zeros(6, 16, dtype=dtype, device=device)
    return base, base.narrow(-1, 4, 7), torch.randn(6, 7, dtype=dtype, device=device) * 3


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("frontend", ["jit", "fx"])
def test_a_write_into_a_narrowed_input_lands_where_eager_puts_it(loses_strided_writes, dtype, frontend):
    compile_ = thunder.jit if frontend == "jit" else thunderfx
    unguarded = compile_(write_view, executors=loses_strided_writes)
    want, want_view, x = narrowed(dtype)
    rows = torch.zeros_like(x)
    unguarded(rows, x)  # a contiguous destination: the fusion's own values, written where they belong
    want_view.copy_(rows)
    torch.testing.assert_close(want_view, torch.sin(x) * 2)

    base, view, _ = narrowed(dtype)
    unguarded(view, x)
    assert not base.any(), "the stand-in executor should lose the write, as nvFuser does"

    guard = FusionGuard()
    compiled = compile_(write_view, executors=loses_strided_writes, transforms=[guard])
    base, view, _ = narrowed(dtype)
    with pytest.warns(RuntimeWarning, match="loses writes into non-contiguous input .*; rescued"):
        compiled(view, x)
    assert torch.equal(base, want)  # bitwise the fusion's own values, where eager puts them
    base, view, _ = narrowed(dtype)
    compiled(view, x)
    assert torch.equal(base, want)
    (d,) = guard.report.filter(action="rescue")  # recorded once, at the first call that needed it
    assert d.executor == LOSES_WRITES and "error_type" not in d.details  # nothing failed: it loses writes
    assert d.details["rescued_by"] == f"{LOSES_WRITES}, through a contiguous copy of the input it writes"
    assert "stride (16, 1)" in " ".join(d.details["inputs"])
    assert d.error is None
    assert "rescue" in explain(compiled)


def test_a_contiguous_written_input_is_the_fusions_own_call(loses_strided_writes):
    guard = FusionGuard()
    compiled = thunder.jit(write_view, executors=loses_strided_writes, transforms=[guard])
    base, _, x = narrowed(torch.float32)
    whole = base.narrow(0, 1, 4)[:, :7]  # rows of a narrower tensor: still not contiguous
    compiled(whole, x[:4])
    rows = torch.zeros(6, 7)
    compiled(rows, x)  # contiguous: written by the fusion itself
    torch.testing.assert_close(rows, torch.sin(x) * 2)
    assert len(guard.report.filter(action="rescue")) == 1


def test_executors_that_write_strided_inputs_right_are_left_alone():
    guard = FusionGuard()
    compiled = thunder.jit(write_view, executors=fusion_executors("cpu"), transforms=[guard])
    _, view, x = narrowed(torch.float32)
    compiled(view, x)
    torch.testing.assert_close(view, torch.sin(x) * 2)
    assert not guard.report.filter(action="rescue")


@pytest.mark.cuda
def test_nvfuser_writes_a_narrowed_input_as_if_contiguous_and_the_guard_puts_it_right():
    """Unguarded, nvFuser's write into a narrow of a wider tensor lands elsewhere (nvFuser 0.2.36 on an H100); the
    guard's lands where eager's does. Should the unguarded assertion fail, nvFuser changed: say so in README."""
    executors = fusion_executors("cuda")
    want, want_view, x = narrowed(torch.float32, "cuda")
    write_view(want_view, x)
    base, view, _ = narrowed(torch.float32, "cuda")
    thunder.jit(write_view, executors=executors)(view, x)
    assert not torch.equal(base, want)
    guard = FusionGuard()
    base, view, _ = narrowed(torch.float32, "cuda")
    with pytest.warns(RuntimeWarning, match="loses writes into non-contiguous input"):
        thunder.jit(write_view, executors=executors, transforms=[guard])(view, x)
    torch.testing.assert_close(base, want)
    assert len(guard.report.filter(action="rescue")) == 1
