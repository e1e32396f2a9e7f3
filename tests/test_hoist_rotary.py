"""Rotary tables built in every forward (arange, pow, cos, sin: input-independent work with transcendentals).

Hoisting them out of a fusion region means rebuilding the region without them, and neither fusion executor gives
the rebuilt region the same bits: Thunder's torch.compile executor on CPU computes cos and sin with SLEEF's vector
code or the C library's scalar code depending on the kernel around them (split out of its region, a cos table
broadcast along the vectorized dimension changed 4,031 of 16,384 outputs); nvFuser on an H100 computed the tables
alike but segmented the rebuilt rest otherwise, contracting ``q * cos`` with the addition that reads it where
Thunder's fusion rounded the product between two kernels (float32: 190 of 512 outputs differed). So the tables stay,
a decision says so and names the option that would hoist them, and a split whose rest adds a product is refused
where the executor contracts."""

import pytest
import thunder
import torch
import torch.nn.functional as F
from helpers import assert_same, regions
from test_hoist import cache_of, grid, hoists

from thunder_fusion_guard import Costs, FusionGuard, fusion_executors
from thunder_fusion_guard import _thunder as th
from thunder_fusion_guard.ops import cut_hazards, exactness, hoist_inexact_ops, hoist_keeps_bits
from thunder_fusion_guard.passes.hoist import hoist_constants
from thunder_fusion_guard.passes.hoist_runtime import HOISTED_NAME
from thunder_fusion_guard.regions import find_regions


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rotary_tables(x: torch.Tensor, head_dim: int, base: float = 10000.0) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin for every position of ``x`` (batch, tokens, ...), computed as Hugging Face's
    LlamaRotaryEmbedding does: inverse frequencies, their outer product with the position ids, cos and sin in
    float32, cast to the activations' dtype."""
    b, t = x.shape[0], x.shape[1]
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.int64, device=x.device).float() / head_dim))
    positions = torch.arange(t, device=x.device)[None].expand(b, -1)
    freqs = (inv_freq[None, :, None].expand(b, -1, 1) @ positions[:, None, :].float()).transpose(1, 2)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(x.dtype), emb.sin().to(x.dtype)


class RotaryAttention(torch.nn.Module):
    """A decoder attention block whose rotary tables are computed in each forward (``apply_rotary_pos_emb``
    on q and k, then causal attention)."""

    def __init__(self, dim: int = 32, heads: int = 2) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, dim // heads
        self.qkv = torch.nn.Linear(dim, 3 * dim, bias=False)
        self.out = torch.nn.Linear(dim, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, dim = x.shape
        q, k, v = (y.view(b, t, self.heads, self.head_dim).transpose(1, 2) for y in self.qkv(x).chunk(3, dim=-1))
        cos, sin = (table.unsqueeze(1) for table in rotary_tables(x, self.head_dim))
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(b, t, dim))


def block_and_input(dtype: torch.dtype, device: str = "cpu") -> tuple[RotaryAttention, torch.Tensor]:
    torch.manual_seed(0)
    return RotaryAttention().to(device, dtype), grid(dtype, 2, 8, 32).detach().to(device).requires_grad_()


def same_bits_as_unguarded(block: torch.nn.Module, x: torch.Tensor, guard: FusionGuard, device: str = "cpu"):
    """Output and the gradients of the input and every parameter over three calls: guarded == unguarded Thunder
    to the bit. Returns the guarded function."""
    guarded = thunder.jit(block, executors=fusion_executors(device), transforms=[guard])
    plain = thunder.jit(block, executors=fusion_executors(device))
    params = list(block.parameters())
    for _ in range(3):
        got, want = guarded(x), plain(x)
        assert_same([got], [want])
        assert_same(torch.autograd.grad(got.sum(), [x, *params]), torch.autograd.grad(want.sum(), [x, *params]))
    return guarded


def per_call_ops(jitted) -> list[str]:
    """Every op one forward call runs, inside regions too (the hoisted call's aside: it runs once)."""
    bsyms = [b for b in thunder.last_traces(jitted)[-1].bound_symbols if b.sym.name != HOISTED_NAME]
    return [th.op_name(leaf) for b in bsyms for leaf in th.leaves(b)]


# float32 (the tables' own dtype, nothing rounded at a split) with --run-slow; bfloat16, where the activations round
# the tables, in the default run.
@pytest.mark.parametrize("dtype", [pytest.param(torch.float32, marks=pytest.mark.slow), torch.bfloat16])
def test_rotary_tables_stay_in_a_torch_compile_region_and_a_decision_names_the_option(dtype):
    block, x = block_and_input(dtype)
    guard = FusionGuard(strict=True)
    guarded = same_bits_as_unguarded(block, x, guard)
    assert not hoists(guard)
    (row,) = hoists(guard, action="keep")
    assert row.details["would_hoist_with"] == "exact_only=False" and row.details["split"] == ["TorchCompile0"]
    assert {"arange", "pow", "cos", "sin"} <= set(row.ops) and row.details["ops_saved_per_call"] >= 20
    assert row.code == "hoist_refused"
    # which ops torchcompile computes by code that depends on the fusion around them
    assert any(
        r["executor"] == "torchcompile" and r["per_element"] == ["cos", "exp", "pow", "sin"]
        for r in row.facts["refused"]
    ), row.facts["refused"]
    assert {"cos", "sin", "pow"} <= set(per_call_ops(guarded))  # still computed on every call


def test_exact_only_false_hoists_what_the_decision_said():
    """The option the decision names does what it says: the tables leave the per-call region (bits may change)."""
    block, x = block_and_input(torch.bfloat16)
    told = FusionGuard()
    with torch.no_grad():
        thunder.jit(block, executors=fusion_executors("cpu"), transforms=[told])(x)
    (row,) = hoists(told, action="keep")
    loose = FusionGuard(exact_only=False, costs=Costs(cost_model=False))
    guarded = thunder.jit(block, executors=fusion_executors("cpu"), transforms=[loose])
    with torch.no_grad():
        for _ in range(2):
            torch.testing.assert_close(guarded(x), block(x), atol=0.05, rtol=0.05)
    (done,) = hoists(loose)
    assert done.ops == row.ops and done.details["ops_saved_per_call"] == row.details["ops_saved_per_call"]
    assert not {"arange", "pow", "cos", "sin"} & set(per_call_ops(guarded))
    assert (cache_of(guarded).computed, cache_of(guarded).reused) == (1, 1)


def region_body(fn, *args) -> list:
    """The ops of the one torch.compile region of ``fn``."""
    jitted = thunder.jit(fn, executors=fusion_executors("cpu"))
    jitted(*args)
    (region,) = regions(jitted)
    return region.body


def reads_the_input(bsym) -> bool:
    return any(p.name == "x" for p in bsym.flat_proxy_args)


def test_cos_is_refused_in_a_rebuilt_fusion_unless_its_executor_computes_each_element_alike(monkeypatch):
    body = region_body(lambda x: x * torch.cos(torch.arange(8, dtype=torch.float32) * 0.25), torch.randn(8))
    table = [b for b in body if not reads_the_input(b)]
    for executor in ("torchcompile", "nvfuser"):  # none is known to (exactness.PER_ELEMENT_EXECUTORS)
        assert hoist_inexact_ops(table, executor=executor) == ["cos"]
    monkeypatch.setattr(exactness, "PER_ELEMENT_EXECUTORS", frozenset({"nvfuser"}))
    assert hoist_inexact_ops(table, executor="nvfuser") == [] and hoist_keeps_bits(table, executor="nvfuser")
    body = region_body(lambda x: x.sum(-1) * torch.cos(torch.arange(8, dtype=torch.float32)), torch.randn(8, 8))
    assert hoist_inexact_ops(body, executor="nvfuser") == ["sum"]  # a reduction's order follows the schedule


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_product_or_a_rounding_is_not_handed_across_a_cut(dtype):
    def scaled_positions(x):
        return x + (torch.arange(x.shape[-1], device=x.device) * 0.5).to(x.dtype)

    body = region_body(scaled_positions, torch.randn(4, 6).to(dtype))
    part = [b for b in body if not reads_the_input(b)]
    crossing = [p for b in body if reads_the_input(b) for p in b.flat_proxy_args if p.name != "x"]
    hazards = cut_hazards(part, crossing)
    assert list(hazards) == [p.name for p in crossing]
    assert ("rounded to bfloat16" in hazards[crossing[0].name]) == (dtype == torch.bfloat16)


def relative_positions(x):
    """Distances between positions, in the input's dtype (ALiBi's): beyond 256 they round in bfloat16."""
    t = x.shape[-1]
    positions = torch.arange(t, device=x.device)
    return x + (positions[None, :] - positions[:, None]).to(x.dtype)


def test_a_table_cast_to_bfloat16_at_the_cut_of_a_torch_compile_region_is_not_hoisted():
    """Handed across rounded, or cast in the rest of the region, the table would change bits (Inductor casts an
    arange otherwise than a loaded tensor, ops.cut_can_move): a decision says why and which option would."""
    x = grid(torch.bfloat16, 300, 300).detach()
    guard = FusionGuard(strict=True)
    guarded = thunder.jit(relative_positions, executors=fusion_executors("cpu"), transforms=[guard])
    plain = thunder.jit(relative_positions, executors=fusion_executors("cpu"))
    for _ in range(2):
        assert_same([guarded(x)], [plain(x)])
    assert not hoists(guard)
    (row,) = hoists(guard, action="keep")
    assert row.details["would_hoist_with"] == "exact_only=False" and "arange" in row.ops
    assert row.code == "hoist_refused"
    # the rounding at the cut: a value rounded from int64 to bfloat16 inside the region, handed across the split
    assert "int64 rounded to bfloat16" in [how for r in row.facts["refused"] for how in r["cut"].values()]


def test_on_a_per_element_executor_the_cut_moves_before_the_cast(monkeypatch):
    """Where an executor computes each element alike wherever the op sits (nvFuser), the cast (and the product of
    ops.cut_hazards) stays with the rest of the region, which gets the integers: nothing rounded crosses."""
    monkeypatch.setattr(exactness, "PER_ELEMENT_EXECUTORS", frozenset({"torchcompile"}))
    plain = thunder.jit(relative_positions, executors=fusion_executors("cpu"))
    plain(torch.randn(300, 300, dtype=torch.bfloat16))
    trace = thunder.last_traces(plain)[-1]
    new, (piece,), _ = hoist_constants(trace, lambda fusion, body, crossing: None, 1 << 20)
    assert piece.hoisted and piece.split == ["TorchCompile0"] and "convert_element_type" not in piece.ops
    (call,) = [b for b in new.bound_symbols if b.sym.name == HOISTED_NAME]
    assert [str(p.dtype) for p in call.flat_proxy_outs] == ["thunder.dtypes.int64"]
    (rest,) = find_regions(new)
    assert rest.ops[0] == "to" and "arange" not in rest.ops  # the cast to bfloat16, then the add


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rotary_tables_stay_in_nvfuser_regions_and_a_decision_names_the_option(dtype):
    """Taken out of the region, the tables gave the float32 block other bits (H100, nvFuser 0.2.36: the rebuilt rest
    contracted a product with an addition): they stay, unguarded Thunder's bits kept, and a decision says which
    option would hoist them."""
    block, x = block_and_input(dtype, "cuda")
    guard = FusionGuard(strict=True)
    guarded = same_bits_as_unguarded(block, x, guard, "cuda")
    assert not any({"cos", "sin"} & set(d.ops) for d in hoists(guard))
    assert any(d.details.get("would_hoist_with") == "exact_only=False" for d in hoists(guard, action="keep"))
    assert {"cos", "sin"} <= set(per_call_ops(guarded))


def scaled_plus_positions(x):
    """A product read by an addition beside an input-independent table (a scaled score plus position biases)."""
    return x * 0.5 + torch.arange(x.shape[-1], dtype=x.dtype, device=x.device)


def test_a_split_whose_rest_adds_a_product_is_refused_where_the_executor_contracts(monkeypatch):
    """nvFuser contracts a product and the addition reading it into one multiply-add where both sit in one kernel,
    and a rebuilt fusion may be segmented otherwise (the float32 rotary block on the H100): where the executor
    contracts (stood in for by the CPU's torch.compile executor here), the split is refused and the decision says
    which products; where it does not, the same table is hoisted. Both keep unguarded Thunder's bits."""
    monkeypatch.setattr(exactness, "PER_ELEMENT_EXECUTORS", frozenset({"torchcompile"}))
    x = grid(torch.float32, 4, 6).detach()
    plain = thunder.jit(scaled_plus_positions, executors=fusion_executors("cpu"))
    for contracting in (False, True):
        pairs = exactness.CONTRACTING | ({("torchcompile", "cpu")} if contracting else set())
        monkeypatch.setattr(exactness, "CONTRACTING", pairs)
        guard = FusionGuard(strict=True)
        guarded = thunder.jit(scaled_plus_positions, executors=fusion_executors("cpu"), transforms=[guard])
        for _ in range(2):
            assert_same([guarded(x)], [plain(x)])
        if not contracting:
            (piece,) = hoists(guard)
            assert "arange" in piece.ops and not hoists(guard, action="keep")
            continue
        assert not hoists(guard)
        (row,) = hoists(guard, action="keep")
        assert row.details["would_hoist_with"] == "exact_only=False"
        assert row.code == "hoist_refused"  # products read by an addition, which torchcompile contracts
        assert any(r["executor"] == "torchcompile" and r["fma"] for r in row.facts["refused"]), row.facts["refused"]
