"""Which ops count as metadata-only (ops.py's rule), checked on the ops Thunder really traces, and what
rejecting the regions they form does to values and aliasing."""

import pytest
import thunder
import torch
from helpers import check_three_ways, jit_cpu, regions, shares_storage

from thunder_fusion_guard import Costs, FusionGuard
from thunder_fusion_guard import _thunder as th
from thunder_fusion_guard.ops import is_metadata, only_numbers


def traced(fn, *args) -> dict[str, th.BoundSymbol]:
    """The top-level ops of ``fn``'s first computation trace, and everything they decompose into, by name
    (the first of each name)."""
    jitted = jit_cpu(fn)
    jitted(*args)
    found: dict[str, th.BoundSymbol] = {}

    def walk(bsym):
        found.setdefault(f"{'prims.' if isinstance(bsym.sym.id, thunder.prims.PrimIDs) else ''}{bsym.sym.name}", bsym)
        for sub in th.subsymbols(bsym):
            walk(sub)

    for bsym in thunder.last_traces(jitted)[0].bound_symbols:
        walk(bsym)
    return found


def test_bitcast_counts_only_when_the_item_size_stays():
    """view(dtype) is a view in eager for any strides when the item size is unchanged; to another item
    size eager needs a contiguous last dimension, which a trace does not tell."""

    def same(x):
        return x.view(torch.int32)

    def other(x):
        return x.view(torch.int16)

    x = torch.randn(4, 4)
    ops = traced(same, x)
    assert is_metadata(ops["prims.bitcast"]) and is_metadata(ops["view"])
    ops = traced(other, x)
    assert not is_metadata(ops["prims.bitcast"]) and not is_metadata(ops["view"])
    assert is_metadata(traced(lambda t: t.view(2, 8), x)["view"]), "a view by shape stays metadata"


@pytest.mark.parametrize(
    "fn,ops",
    [
        (lambda x: x.reshape(8, 2).flatten(), ["reshape", "flatten"]),
        (lambda x: x.unflatten(1, (2, 2)).movedim(0, -1), ["unflatten", "movedim"]),
        (lambda x: (x.split(2), x.chunk(2, 1), x.narrow(0, 1, 2)), ["split", "chunk", "narrow"]),
        (lambda x: (x.select(0, 1), x.diagonal()), ["select", "diagonal"]),
        (lambda x: (x.expand(2, 4, 4), x.t(), x.squeeze(), x[1:, ::2]), ["expand", "t", "squeeze", "getitem"]),
        (lambda x: torch.view_as_real(x.to(torch.complex64)), ["view_as_real"]),
    ],
    ids=[
        "reshape-flatten",
        "unflatten-movedim",
        "split-chunk-narrow",
        "select-diagonal",
        "expand-t-slice",
        "view_as_real",
    ],
)
def test_views_in_eager_count(fn, ops):
    found = traced(fn, torch.randn(4, 4))
    assert [op for op in ops if not is_metadata(found[op])] == []


@pytest.mark.parametrize(
    "fn,op",
    [
        (lambda x: x.as_strided((2, 2), (1, 2)), "as_strided"),
        (lambda x: torch.view_as_complex(x.unflatten(-1, (2, 2))), "view_as_complex"),
        (lambda x: x.to(torch.complex64).real, "real"),
        (lambda x: x.contiguous(memory_format=torch.channels_last), "contiguous"),
        (lambda x: x.sum().item(), "item"),
        (lambda x: x[torch.tensor([0, 2])], "getitem"),
    ],
    ids=["as_strided", "view_as_complex", "real", "stride_order", "item", "advanced-indexing"],
)
def test_ops_that_may_compute_or_copy_do_not_count(fn, op):
    x = torch.randn(4, 4) if op != "contiguous" else torch.randn(1, 2, 3, 4)
    assert not is_metadata(traced(fn, x)[op])


def test_number_ops_count_but_not_tensor_to_number():
    """Shape arithmetic under symbolic values (ints in, ints out) counts; item (tensor to number) does not."""
    jitted = jit_cpu(lambda x: x.reshape(x.shape[0], -1), cache="symbolic values")
    jitted(torch.randn(2, 3, 4))
    numbers = []
    for bsym in thunder.last_traces(jitted)[0].bound_symbols:
        numbers += [s for s in (bsym, *th.subsymbols(bsym)) if only_numbers(s)]
    assert {"mul", "eq"} <= {th.op_name(s) for s in numbers}
    assert all(is_metadata(s) for s in numbers)
    item = traced(lambda x: x.sum().item(), torch.randn(3))["item"]
    assert not is_metadata(item) and not only_numbers(item)


def diagonal_views(x):
    return x.diagonal().unsqueeze(0), torch.view_as_real(x).transpose(0, 1)


def test_eager_views_thunder_computes_are_rejected_and_become_views():
    """Thunder decomposes diagonal into a gather; eager returns a view. Rejected, the region runs as
    torch.diagonal: same values, memory shared with the input as in eager."""
    x = torch.randn(4, 4, dtype=torch.complex64)
    guard = FusionGuard(strict=True)
    guarded, plain = check_three_ways(diagonal_views, [x], guard, exact_eager=True)
    assert regions(plain) and regions(guarded) == []
    out, out_e = guarded(x), diagonal_views(x)
    assert [shares_storage(o, x) for o in out] == [shares_storage(o, x) for o in out_e] == [True, True]


def as_strided_then_view(x):
    return x.t().as_strided((2, 2), (1, 2)).unsqueeze(0)


def test_as_strided_region_is_kept():
    x = torch.randn(4, 4)
    guard = FusionGuard(strict=True)
    guarded = jit_cpu(as_strided_then_view, guard)
    assert torch.equal(guarded(x), jit_cpu(as_strided_then_view)(x))
    assert [d.action for d in guard.report] == ["keep"]


@pytest.mark.usefixtures("no_inductor")
def test_random_ops_by_tag_or_name_and_normalize_is_not_one():
    import torch.nn.functional as F
    from helpers import jit_cpu, regions

    from thunder_fusion_guard import FusionGuard
    from thunder_fusion_guard.ops import random_ops

    def noisy(x):
        return F.dropout(x * 2, p=0.5, training=True) + 1

    def normalized(x):
        return F.normalize(x * 2, dim=-1) + 1

    x = torch.randn(4, 8)
    eager_cheap = dict(fusion_call_us=1e6, fusion_gbps=1e-3, eager_op_us=1e-6, eager_meta_us=1e-6, eager_gbps=1e6)
    guard = FusionGuard(exact_only=False, costs=Costs(calibration={**eager_cheap, "overlapped": False}))
    jitted = jit_cpu(noisy, guard)
    jitted(x)
    (kept,) = [d for d in guard.report if d.about_region]
    assert kept.action == "keep" and kept.details["decided_by"] == "rule" and not kept.estimates  # before pricing
    assert [bool(random_ops(r)) for r in regions(jitted)] == [True]
    plain = jit_cpu(normalized)
    plain(x)
    assert [random_ops(r) for r in regions(plain)] == [[]]


@pytest.mark.parametrize("training", [False, True])
def test_dropout_is_random_only_where_it_draws(training):
    """Eval-mode dropout (training=False, or nn.Dropout under eval()) draws nothing: a copy, free to leave the
    fusion. In training mode it draws and the region is kept by the random-ops rule."""
    import torch.nn.functional as F
    from helpers import jit_cpu, regions

    from thunder_fusion_guard import FusionGuard
    from thunder_fusion_guard.ops import random_ops

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Dropout(0.5)).train(training)

    def functional(x):
        return F.dropout(torch.tanh(x), 0.5, training=training) * 2

    x = torch.randn(4, 8)
    for fn in (model, functional):
        guard = FusionGuard()
        torch.manual_seed(1)
        got = jit_cpu(fn, guard)(x)
        torch.manual_seed(1)
        plain = jit_cpu(fn)
        expected = plain(x)
        assert torch.equal(got, expected)
        named = [d for d in guard.report if d.details.get("decided_by") == "rule"]  # the random-ops rule
        assert bool(named) == training, [d.reason for d in guard.report]
        if not training:
            assert all(random_ops(r) == [] for r in regions(plain))
            assert not any(d.code == "random" for d in guard.report)
