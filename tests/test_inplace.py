"""In-place writes in rejected regions: the torch lowering writes the same tensors, and aliasing (what
shares memory with what, which outputs show a later mutation of the inputs) stays as in eager."""

import pytest
import torch
from helpers import assert_same, check_three_ways, jit_cpu, regions
from opinfo_harness import EAGER_CHEAP

from thunder_fusion_guard import Costs, FusionGuard


def copy_into_input(x, buf):
    buf.copy_(x.t())
    return x.t(), buf.view(-1)


def copy_into_input_view(x, buf):
    buf[0].copy_(x[1])
    return buf[1:], x.t()


def add_into_input(x, buf):
    buf.add_(1.0)
    return buf.t(), x.reshape(-1)


def copy_into_intermediate(x, buf):
    y = x.t().clone()
    y.copy_(buf)
    return y, y[0], x.view(-1)


def copy_into_intermediate_view(x, buf):
    y = x.clone()
    y.t()[0].copy_(buf[0])
    return y.view(-1), y[:, 0]


def _storage(t):
    return t.untyped_storage().data_ptr()


def observe(fn, x, buf):
    """Outputs, the inputs after the call, which of (x, buf, outputs...) each output shares memory with,
    and which outputs change when x and buf are mutated after the call."""
    outs = list(fn(x, buf))
    tensors = [x, buf, *outs]
    sharing = [[_storage(o) == _storage(t) for t in tensors] for o in outs]
    before = [o.clone() for o in outs]
    inputs_after = [x.clone(), buf.clone()]
    x.add_(100.0)
    buf.add_(100.0)
    shows = [not torch.equal(b, o) for b, o in zip(before, outs, strict=True)]
    return before, inputs_after, sharing, shows


PROGRAMS = [copy_into_input, copy_into_input_view, add_into_input, copy_into_intermediate, copy_into_intermediate_view]


@pytest.mark.parametrize("fn", PROGRAMS, ids=lambda f: f.__name__)
def test_rejected_in_place_region_writes_and_aliases_as_eager(fn):
    # Eager looks cheaper for everything: every region of exact ops (copy_, add, views) is rejected.
    guard = FusionGuard(strict=True, costs=Costs(calibration=EAGER_CHEAP, margin=0.0))
    guarded, plain = jit_cpu(fn, guard), jit_cpu(fn)
    x, buf = torch.randn(3, 3), torch.randn(3, 3)
    got, unguarded, eager = (observe(f, x.clone(), buf.clone()) for f in (guarded, plain, fn))
    assert regions(plain), "unguarded thunder fuses the in-place write"
    assert regions(guarded) == [] and {d.action for d in guard.report} == {"reject"}
    assert not [d.error for d in guard.report if d.error]
    assert_same(got[0], unguarded[0])
    assert_same(got[0], eager[0])
    assert_same(got[1], eager[1]), "the inputs are written as in eager"
    assert got[2:] == eager[2:], f"aliasing: guarded {got[2:]}, eager {eager[2:]}"


def add_into_intermediate_with_grad(x, buf):
    y = x.t().clone()
    y.add_(buf.t())
    return y, y[0]


def test_rejected_in_place_region_with_grad():
    guard = FusionGuard(strict=True, costs=Costs(calibration=EAGER_CHEAP, margin=0.0))
    x, buf = torch.randn(3, 4, requires_grad=True), torch.randn(3, 4)
    check_three_ways(add_into_intermediate_with_grad, [x, buf], guard, exact_eager=True)
    assert guard.report.filter(trace="forward", action="reject")
    assert not [d.error for d in guard.report if d.error]
