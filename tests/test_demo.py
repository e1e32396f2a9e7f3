"""The demo: a case where the guard acts (the mask built in forward is hoisted), the gain, and Thunder's own
per-call cost named and measured. Timings are injected: nothing here depends on the machine's speed."""

import pytest
import torch

import thunder_fusion_guard.tools.demo as demo


@pytest.mark.usefixtures("no_inductor")  # timings injected: the text is the subject
def test_demo_acts_on_cpu_and_names_thunders_per_call_cost(monkeypatch):
    mask = next(c for c in demo.CASES if c.fn is demo.banded_mask)
    monkeypatch.setattr(demo, "CASES", [demo.Case(mask.name, mask.fn, (2, 8, 8))])
    fake = iter([100.0, 50.0, 60.0, 30.0])  # thunder, guarded, eager, then the jitted identity
    monkeypatch.setattr(demo, "_timings", lambda fns, x, reps: [[next(fake)] for _ in fns])
    out = demo.run_demo(device="cpu", reps=3)
    assert "hoist" in out and "FusionGuard:" in out
    (row,) = [line for line in out.splitlines() if line.startswith(mask.name)]
    assert row.split()[-2:] == ["2.00x", "faster"], row
    flat = " ".join(out.split())
    assert "Thunder's per-call cost (prologue checks of the inputs, cache lookup, Python call): 30.0" in flat
    assert "no trace rewrite removes it" in flat
    assert max(len(line) for line in out.splitlines()) <= 120, out  # every line fits 120 columns, wrapped


def test_the_demo_mask_case_is_exact_and_hoisted():
    """The demo's mask case as run_demo compiles it on CPU: the guard records a hoist of the mask, and the
    guarded outputs equal the unguarded ones and eager's bit for bit, on the whole tensor, call after call."""
    from thunder_fusion_guard import FusionGuard
    from thunder_fusion_guard._thunder import fusion_executors

    executors = fusion_executors("cpu")
    guard = FusionGuard()
    plain = demo._jit(demo.banded_mask, None, executors, nvfuser=False)
    guarded = demo._jit(demo.banded_mask, guard, executors, nvfuser=False)
    for _ in range(2):  # the second call runs with the mask computed once, at the first
        x = torch.randn(2, 8, 8)
        out = guarded(x)
        assert torch.equal(out, plain(x)) and torch.equal(out, demo.banded_mask(x))
    hoists = [d for d in guard.report if d.action == "hoist"]
    assert hoists, [(d.action, d.reason) for d in guard.report]


@pytest.mark.usefixtures("no_inductor")
def test_every_demo_decision_names_the_demo_line_that_made_it():
    """The demo's functions are the user's code here: each decision's source is a line of tools/demo.py, not
    Thunder's (a reshape's innermost frame) or einops' (rearrange's own code)."""
    from thunder_fusion_guard import FusionGuard
    from thunder_fusion_guard._thunder import fusion_executors, user_lines
    from thunder_fusion_guard.tools import cli

    assert "demo" in cli._NAMES_USER_LINES  # the demo command holds your lines while it runs, as here
    cases = ((demo.rearrange_heads, (2, 4, 8, 8)), (demo.view_chain, (2, 8, 8)), (demo.banded_mask, (2, 8, 8)))
    for fn, shape in cases:
        guard = FusionGuard()
        with user_lines():
            demo._jit(fn, guard, fusion_executors("cpu"), nvfuser=False)(torch.randn(*shape))
        sources = {d.details.get("source") for d in guard.report}
        assert sources and all(s and s.startswith(demo.__file__ + ":") for s in sources), (fn.__name__, sources)
    # thunder.jit of a function outside such a command: nothing of Thunder's is wrapped, so an op einops makes
    # has no line of yours (a module's call holds them itself)
    guard = FusionGuard()
    demo._jit(demo.rearrange_heads, guard, fusion_executors("cpu"), nvfuser=False)(torch.randn(2, 4, 8, 8))
    assert {d.details.get("source") for d in guard.report} == {None}


def test_the_demo_times_its_variants_in_interleaved_rounds():
    """Each round times every variant once, in a balanced order (each first, and right after each other, equally
    often): a slow moment of the machine (another process, a page-cache flush after an install) or what one variant
    leaves behind weighs on all variants alike, not on the one timed then."""
    calls = []
    fns = [lambda x, i=i: calls.append(i) for i in range(3)]
    timings = demo._timings(fns, torch.zeros(1), reps=40)
    warmup = 2 * len(fns)
    assert calls[warmup : warmup + 12] == [0, 0, 1, 1, 2, 2, 1, 1, 2, 2, 0, 0]  # 2 calls a sample, 20 rounds
    assert len(calls) == warmup + 40 * len(fns)
    assert [len(t) for t in timings] == [20, 20, 20]


def test_the_demo_calls_a_difference_within_the_rounds_spread_level():
    """Guarded against unguarded from paired rounds: a difference the rounds' own spread holds is ``level``, not a
    speed-up or a slow-down (a region the guard kept runs the same code as unguarded)."""
    assert demo._speedup([100.0] * 4, [90.0, 110.0, 95.0, 105.0]).startswith("level")
    assert demo._speedup([100.0] * 4, [50.0, 52.0, 49.0, 51.0]).endswith("x faster")
    assert demo._speedup([50.0] * 4, [100.0] * 4) == "2.00x slower"
