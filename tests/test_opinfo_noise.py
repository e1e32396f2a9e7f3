"""The OpInfo harness tells the guard's doing from Thunder's own run-to-run noise (atomics on CUDA):
a bitwise mismatch fails only when both sides reproduce their bits and still differ."""

import itertools

import pytest
import torch
from opinfo_harness import RERUNS, Run, _mismatch_verdict
from torch.testing import assert_close

A = torch.tensor([1.0, 2.0, 3.0])
B = A + torch.tensor([0.0, 2.0**-22, 0.0])  # one ulp-ish away: another summation order
FAR = A + 1.0


def _run(grad: torch.Tensor) -> Run:
    return Run([A.clone()], [grad.clone()], [()], None, None)


class FakeCase:
    """Hands out preset unguarded and guarded runs, as Case.run would, in order."""

    def __init__(self, unguarded, guarded):
        self.unguarded, self.guarded = iter(unguarded), iter(guarded)
        self.calls = {"unguarded": 0, "guarded": 0}

    def run(self, guard):
        side = "unguarded" if guard is None else "guarded"
        self.calls[side] += 1
        return _run(next(self.unguarded if guard is None else self.guarded))


def _verdict(plain, guarded, unguarded_reruns, guarded_reruns):
    case = FakeCase(unguarded_reruns, guarded_reruns)
    note = _mismatch_verdict(case, _run(plain), _run(guarded), {}, assert_close, "default")
    assert case.calls == {"unguarded": RERUNS, "guarded": RERUNS}
    return note


def test_reproducible_difference_fails():
    """Both sides give the same bits every time, and they differ: the guard changed them."""
    with pytest.raises(AssertionError, match="each reproducible"):
        _verdict(A, B, itertools.repeat(A), itertools.repeat(B))


def test_flaky_unguarded_side_passes_bitwise_when_runs_match():
    """The H100 flake: the first unguarded run drew another summation order than every later run."""
    note = _verdict(B, A, itertools.repeat(A), itertools.repeat(A))
    assert "not reproducible" in note and "each guarded run equals an unguarded one bitwise" in note


def test_noisy_guarded_side_passes_within_tolerance():
    note = _verdict(A, B, itertools.repeat(A), [A, B, B, A])
    assert "not reproducible" in note, note


def test_noise_does_not_hide_a_real_difference():
    """Nondeterministic, but a guarded run lies beyond the op's tolerance: still a failure."""
    with pytest.raises(AssertionError, match="beyond the op's tolerance"):
        _verdict(A, FAR, [A, B, A, B], itertools.repeat(FAR))
