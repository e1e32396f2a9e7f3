"""Index arithmetic, gathers and aranges give the same bits whoever runs them: regions of them are exact, and a
guard rejects them (cost permitting) with unguarded Thunder's bits; float sums and scatters stay inexact."""

import pytest
import torch
from helpers import ALWAYS_EAGER, check_three_ways, jit_cpu, regions

from thunder_fusion_guard import Costs, FusionGuard
from thunder_fusion_guard.ops import inexact_ops


def inexact_of(fn, *args) -> list[list[str]]:
    """``inexact_ops`` of each fusion region of unguarded Thunder's forward trace of ``fn(*args)``."""
    jitted = jit_cpu(fn)
    jitted(*args)
    return [inexact_ops(r) for r in regions(jitted)]


def int_cumsum(mask):
    return (mask != 0).cumsum(-1) - 1


def float_cumsum(x):
    return (x + 2).cumsum(-1)


def gathers(w, ids):
    picked = torch.nn.functional.embedding(ids, w)
    rows = torch.index_select(w, 0, ids[0])
    cols = torch.gather(w, 1, ids.t()[:, :1].expand(-1, w.shape[1]).clamp(max=w.shape[1] - 1))
    along = torch.take_along_dim(w, ids.t().clamp(max=w.shape[1] - 1), dim=1)
    return picked.neg(), rows.neg(), cols.neg(), along.neg()


def positions(x):
    return torch.arange(x.shape[-1]) + x


def test_integer_cumsum_is_exact_float_cumsum_is_not():
    mask = torch.tensor([[0, 1, 1, 0, 1], [1, 1, 0, 1, 1]])
    assert inexact_of(int_cumsum, mask) == [[]]
    assert inexact_of(float_cumsum, torch.randn(4, 8, generator=torch.Generator().manual_seed(0))) == [["cumsum"]]


def test_gathers_and_index_arithmetic_are_exact():
    gen = torch.Generator().manual_seed(1)
    w, ids = torch.randn(10, 5, dtype=torch.bfloat16, generator=gen), torch.randint(0, 10, (5, 10), generator=gen)
    assert inexact_of(gathers, w, ids) == [[]]
    assert inexact_of(positions, torch.randint(0, 9, (3, 7), generator=gen)) == [[]]


@pytest.mark.parametrize(
    "n, dtype, rounds",
    [
        (256, torch.bfloat16, False),
        (300, torch.bfloat16, True),
        (2048, torch.float16, False),
        (2050, torch.float16, True),
        (1 << 24, torch.float32, False),
    ],
)
def test_float_arange_is_exact_while_its_values_are_values_of_its_dtype(n, dtype, rounds):
    """A float arange is an integer iota converted: exact up to 2**significand bits (256 in bfloat16: 257 rounds)."""

    def fn(x):
        return torch.arange(n, dtype=dtype)[-x.shape[0] :] + x

    x = torch.zeros(4, dtype=dtype)
    (found,) = inexact_of(fn, x)
    assert bool(found) == rounds
    if rounds:
        assert found[0].endswith("a rounding the fusion may skip") and f"int64 rounded to {str(dtype)[6:]}" in found[0]


class TinyLM(torch.nn.Module):
    """Token and position embeddings with positions counted from a padding mask (an integer cumsum), then one
    token's row gathered: the forward of a GPT-style model's input, all index arithmetic and copies."""

    def __init__(self, vocab: int = 40, dim: int = 16, length: int = 12) -> None:
        super().__init__()
        self.wte = torch.nn.Embedding(vocab, dim, dtype=torch.bfloat16)
        self.wpe = torch.nn.Embedding(length, dim, dtype=torch.bfloat16)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        pos = ((mask != 0).cumsum(-1) - 1).clamp(min=0) + torch.arange(ids.shape[1]) * 0
        last = (mask.sum(-1, keepdim=True) - 1).clamp(min=0)
        tokens = torch.take_along_dim(self.wte(ids), last[:, :, None].expand(-1, 1, self.wte.embedding_dim), dim=1)
        return tokens + self.wpe(torch.take_along_dim(pos, last, dim=1))


def test_gpt_style_inputs_are_rejected_with_unguarded_bits():
    torch.manual_seed(0)
    model = TinyLM()
    gen = torch.Generator().manual_seed(2)
    ids = torch.randint(0, 40, (3, 12), generator=gen)
    mask = (torch.rand(3, 12, generator=gen) > 0.3).long()
    guard = FusionGuard(costs=Costs(calibration=ALWAYS_EAGER))
    guarded, plain = check_three_ways(lambda i, m: model(i, m), [ids, mask], guard, exact_eager=True)
    (forward,) = [d for d in guard.report.filter(trace="forward") if d.about_region]
    assert forward.action == "reject" and forward.details["decided_by"] == "model"
    assert {"cumsum", "embedding", "take_along_dim", "arange"} <= set(forward.ops)
    assert regions(guarded) == [] and len(regions(plain)) == 1
    # the backward adds the rows several tokens share in an order an executor picks: kept
    kept = [d for d in guard.report.filter(trace="backward") if "embedding_backward" in d.ops]
    assert kept and all(d.action == "keep" and d.details["decided_by"] == "exactness" for d in kept)


def test_a_float_cumsum_beside_them_keeps_the_region():
    def fn(ids, w):
        return torch.nn.functional.embedding(ids, w).cumsum(1)

    gen = torch.Generator().manual_seed(3)
    ids, w = torch.randint(0, 8, (2, 6), generator=gen), torch.randn(8, 4, dtype=torch.bfloat16, generator=gen)
    guard = FusionGuard(costs=Costs(calibration=ALWAYS_EAGER))
    guarded, _ = check_three_ways(fn, [ids, w], guard)
    (d,) = guard.report.filter(trace="forward")
    assert d.action == "keep" and d.details["decided_by"] == "exactness" and len(regions(guarded)) == 1


def test_integer_bounds_follow_an_arange_through_numbers():
    from thunder_fusion_guard import _thunder as th
    from thunder_fusion_guard.ops import integer_bounds

    def fn(x):
        return (7 - torch.arange(4) * 3) + x

    jitted = jit_cpu(fn)
    jitted(torch.zeros(4, dtype=torch.int64))
    (region,) = regions(jitted)
    leaves = [leaf for b in region.body for leaf in th.leaves(b)]
    found = integer_bounds(leaves)
    assert (0, 3) in found.values() and (0, 9) in found.values() and (-2, 7) in found.values()
