"""The demo: a case where the guard acts (the mask built in forward is hoisted), the gain, and Thunder's own
per-call cost named and measured. Timings are injected: nothing here depends on the machine's speed."""

import torch

import thunder_fusion_guard.tools.demo as demo
from thunder_fusion_guard.measure.timing import Timing


def test_demo_acts_on_cpu_and_names_thunders_per_call_cost(monkeypatch):
    mask = next(c for c in demo.CASES if c.fn is demo.banded_mask)
    monkeypatch.setattr(demo, "CASES", [demo.Case(mask.name, mask.fn, (2, 8, 8))])
    fake = iter([100.0, 50.0, 60.0, 30.0])  # thunder, guarded, eager, then the jitted identity
    monkeypatch.setattr(demo, "time_us", lambda fn, x, reps: Timing.of([next(fake)]))
    out = demo.run_demo(device="cpu", reps=3)
    assert "hoist" in out and "FusionGuard:" in out
    (row,) = [line for line in out.splitlines() if line.startswith(mask.name)]
    assert row.split()[-2:] == ["2.00x", "faster"], row
    assert "Thunder's per-call cost (prologue checks of the inputs, cache lookup, Python call): 30.0" in out
    assert "no trace rewrite removes it" in out


def test_the_demo_mask_case_is_exact_and_hoisted():
    x = torch.randn(2, 8, 8)
    assert torch.equal(demo.banded_mask(x)[0, 0, :1], x[0, 0, :1])
