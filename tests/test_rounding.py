"""Low precision: a region the guard rejects gives the bits unguarded Thunder gives, in bf16, fp16 and fp32.

A fusion skips the rounding between ops that Thunder's trace spells out (bf16 add = upcast, add, round),
and eager PyTorch rounds a Python number to a bf16/fp16 tensor's dtype before using it. The guard must only
reject regions for which neither changes a bit (``ops.rounding_hazards``). The random programs here are
element-wise DAGs of the ops the guard counts as exact, with casts between dtypes and numbers mixed in,
over inputs on a 0.1 grid (values that round in bf16 and fp16) with an infinity of each sign and a NaN
among them; every region the rule allows is rejected (a cost model that always prefers
eager), and the guarded run must equal unguarded Thunder to the bit, forward and backward: every element's
bits, infinities and the sign of zero included, NaNs where Thunder's are.

On CPU through Thunder's torch.compile executor: 4 bf16 programs in CI (fixed seeds, ``CI_SEEDS``; fp16 and
fp32, the control, only with ``--run-slow``), 24 per dtype with ``--run-slow``,
``TFG_ROUNDING_EXAMPLES`` per dtype when set; each run checks the same programs, and the bf16 and fp16
ones must include a rejected region of several ops. On CUDA through
nvFuser (``-m cuda``, 40 per dtype unless the variable says).
"""

from __future__ import annotations

import json
import os
import random
from collections import Counter
from dataclasses import dataclass

import pytest
import thunder
import torch
from helpers import ALWAYS_EAGER, jit_cpu

from thunder_fusion_guard import Costs, FusionGuard
from thunder_fusion_guard.ops import rounding_hazards

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
NUMBERS = (0.5, 0.1, 3, 257, -1.25, 1e-3, 2.0)
SIZES = ((1,), (3,), (64,), (4096,), (2, 3), (16, 33))
# Inputs: multiples of 0.1 (not a bf16 or fp16 value) times these scales; 300 * 300 overflows fp16.
SCALES = (1.0, 1e-2, 3e2)


# The seeds CI draws on CPU, per dtype: each low-precision list holds programs with rejected regions of
# several ops, and one whose bits change when the rule is off (checked with rounding_hazards returning []).
CI_SEEDS = {"bf16": (0, 1, 3, 7), "fp16": (1, 3, 4, 7), "fp32": (0, 1, 2, 3)}


def _seeds(device: str, dtype: str, slow: bool) -> tuple[int, ...]:
    count = os.environ.get("TFG_ROUNDING_EXAMPLES")
    if count is not None:
        return tuple(range(int(count)))
    if device == "cpu" and not slow:
        return CI_SEEDS[dtype]
    return tuple(range(24 if device == "cpu" else 40))


@dataclass
class Program:
    """A straight-line element-wise program over inputs ``a``, ``b``, ``c`` (written out as source)."""

    dtype: str
    shape: tuple[int, ...]
    seed: int
    grad: bool
    lines: list[str]
    outputs: list[str]

    @property
    def source(self) -> str:
        body = "\n".join(f"    {line}" for line in self.lines)
        return f"def prog(a, b, c):\n{body}\n    return {', '.join(self.outputs)},\n"

    def function(self):
        namespace = {"torch": torch}
        exec(compile(self.source, "<rounding program>", "exec"), namespace)
        return namespace["prog"]

    def inputs(self, device: str) -> list[torch.Tensor]:
        gen = torch.Generator().manual_seed(self.seed)
        grid = [torch.randint(-30, 31, self.shape, generator=gen) * 0.1 * s for s in SCALES]
        # an infinity of each sign and a NaN, where there is room: they meet (inf - inf) and spread
        for t, special, at in zip(grid, (float("nan"), float("inf"), -float("inf")), (1, 0, -1), strict=True):
            if t.numel() > 2:
                t.view(-1)[at] = special
        return [t.to(DTYPES[self.dtype]).to(device).requires_grad_(self.grad) for t in grid]

    def __repr__(self) -> str:
        return f"Program(dtype={self.dtype}, shape={self.shape}, seed={self.seed}, grad={self.grad})\n{self.source}"


# Selections: Thunder runs them in the tensors' own dtype (no upcast, no rounding to read again).
SELECT = ("torch.where({x} > {y}, {x}, {y})", "torch.where({x} > {y}, {y}, {x})", "torch.where({x} < 0, {y}, {x})")
# Sums: round once, at the end (a fusion and the op alone agree when nothing reads the rounded value).
SUM = ("{x} + {y}", "{x} - {y}", "{x} + {n}", "{x} - {n}")


def _op(rng: random.Random, names: list[str], dtype: str, pool: tuple[str, ...] = ()) -> str:
    """One element-wise expression over earlier values (a DAG: any earlier name may be read)."""
    x, y = rng.choice(names), rng.choice(names)
    number = rng.choice(NUMBERS)
    if pool:
        return rng.choice(pool).format(x=x, y=y, n=number)
    other = DTYPES[rng.choice([d for d in DTYPES if d != dtype])]
    return rng.choice(
        [
            f"{x} + {y}",
            f"{x} - {y}",
            f"{x} + {number}",
            f"{x} - {number}",
            f"-{x}",
            f"{x}.abs()",
            f"torch.where({x} > {y}, {x}, {y})",
            f"torch.maximum({x}, {y})",
            f"torch.minimum({x}, {y})",
            f"torch.where({x} > 0, {x} + {y}, {y})",
            f"{x} * {y}",
            f"{x} * {number}",
            f"{x}.to({other}).to({y}.dtype)",
            f"({x}.to({other}) + {y}.to({other})).to({x}.dtype)",
            f"{x}.float() + {y}",
        ]
    )


def program(dtype: str, seed: int, device: str) -> Program:
    """The random program drawn from ``seed`` for ``dtype`` (the same on every run). Every other one is
    selections first and then sums, each reading only selected values: a region of several ops that
    rounds and that the rule lets go in bf16 and fp16 (where the sums' numbers are values of the dtype)."""
    rng = random.Random(f"rounding {dtype} {seed}")
    names = ["a", "b", "c"]
    lines = []
    if seed % 2:
        for i in range(rng.randint(1, 4)):
            lines.append(f"t{i} = {_op(rng, names, dtype, SELECT)}")
            names.append(f"t{i}")
        selected = list(names)
        for i in range(len(lines), len(lines) + rng.randint(1, 2)):
            lines.append(f"t{i} = {_op(rng, selected, dtype, SUM)}")
            names.append(f"t{i}")
    else:
        for i in range(rng.randint(2, 6)):
            lines.append(f"t{i} = {_op(rng, names, dtype)}")
            names.append(f"t{i}")
    extra = rng.sample(names[3:-1], min(len(names) - 4, rng.randint(0, 2)))
    # Thunder has no gradient for maximum and minimum
    grad = device == "cpu" and rng.random() < 0.3 and not any("imum(" in line for line in lines)
    return Program(dtype, rng.choice(SIZES), rng.randrange(2**16), grad, lines, [names[-1], *extra])


def _jit(fn, device: str, guard: FusionGuard | None):
    if device == "cpu":
        return jit_cpu(fn, guard)
    return thunder.jit(fn, transforms=[] if guard is None else [guard])


def _run(jitted, prog: Program, device: str) -> list[torch.Tensor]:
    args = prog.inputs(device)
    outs = list(jitted(*args))
    results = [o.detach() for o in outs]
    diff = [o for o in outs if o.requires_grad]
    if diff:
        gen = torch.Generator().manual_seed(prog.seed + 1)
        cot = [torch.randn(o.shape, generator=gen).to(o.dtype).to(device) for o in diff]
        results += [g for g in torch.autograd.grad(diff, args, cot, allow_unused=True) if g is not None]
    return results


BITS = {2: torch.int16, 4: torch.int32, 8: torch.int64}


def differing(got: torch.Tensor, expected: torch.Tensor) -> int:
    """How many elements differ: NaN against not NaN, or, where neither is NaN, in any bit (an infinity
    against the largest finite value, -0.0 against 0.0). NaNs may differ in payload only."""
    nan_g, nan_e = got.isnan(), expected.isnan()
    if not got.is_floating_point():
        return int((got != expected).sum())
    bits_g, bits_e = got.view(BITS[got.element_size()]), expected.view(BITS[expected.element_size()])
    return int(((nan_g != nan_e) | (~nan_g & ~nan_e & (bits_g != bits_e))).sum())


def check_program(prog: Program, device: str) -> FusionGuard:
    fn = prog.function()
    guard = FusionGuard(strict=True, costs=Costs(calibration=ALWAYS_EAGER))
    expected = _run(_jit(fn, device, None), prog, device)
    got = _run(_jit(fn, device, guard), prog, device)
    assert len(got) == len(expected), prog
    for i, (g, e) in enumerate(zip(got, expected, strict=True)):
        assert g.dtype == e.dtype and g.shape == e.shape, f"result {i}\n{prog!r}"
        wrong = differing(g, e)
        assert not wrong, f"result {i}: {wrong} elements differ from unguarded thunder\n{prog!r}\n{guard.report}"
    return guard


# Programs checked per (device, dtype, whether a region was rejected), printed with -s and written as JSON
# to TFG_ROUNDING_STATS when set: how much of the rule the random programs exercised.
STATS: Counter[str] = Counter()


def check_programs(device: str, dtype: str, seeds: tuple[int, ...]) -> None:
    """The programs of ``seeds`` for ``dtype``; a bf16 or fp16 run must reject a region of several ops."""
    rejected_ops = []
    for seed in seeds:
        prog = program(dtype, seed, device)
        guard = check_program(prog, device)
        rejected = [len(d.ops) for d in guard.report if d.about_region and d.action == "reject"]
        rejected_ops += rejected
        STATS[f"{device} {dtype}: {'some region rejected' if rejected else 'every region kept'}"] += 1
        STATS[f"{device} {dtype}: rejected regions of 2+ ops"] += sum(n >= 2 for n in rejected)
    rows = {k: v for k, v in sorted(STATS.items()) if k.startswith(f"{device} {dtype}")}
    print(f"\nrounding programs: {rows}")
    path = os.environ.get("TFG_ROUNDING_STATS")
    if path:
        with open(path, "w") as f:
            json.dump(dict(STATS), f, indent=1)
    if dtype != "fp32":
        assert max(rejected_ops, default=0) >= 2, f"no {dtype} program rejected a region of several ops"


@pytest.mark.parametrize(
    "dtype", ["bf16", pytest.param("fp16", marks=pytest.mark.slow), pytest.param("fp32", marks=pytest.mark.slow)]
)
def test_random_low_precision_programs_keep_thunders_bits_cpu(dtype, request):
    check_programs("cpu", dtype, _seeds("cpu", dtype, request.config.getoption("--run-slow")))


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", sorted(DTYPES))
def test_random_low_precision_programs_keep_thunders_bits_nvfuser(dtype):
    check_programs("cuda", dtype, _seeds("cuda", dtype, True))


def test_exact_comparison_tells_infinities_zeros_and_nans_apart():
    inf = float("inf")
    fp16 = torch.tensor([inf, 65504.0, 0.0, -0.0, float("nan"), 1.0], dtype=torch.float16)
    assert differing(fp16, fp16.clone()) == 0
    assert differing(fp16, torch.tensor([65504.0, 65504.0, 0.0, 0.0, 1.0, 1.0], dtype=torch.float16)) == 3
    assert differing(torch.tensor([-inf]), torch.tensor([inf])) == 1


def test_issue_snippet_gives_unguarded_bits():
    """The report's example: bf16 a + b + c rounds once inside the fusion, twice op by op."""
    a = torch.tensor([1.0], dtype=torch.bfloat16)
    b = torch.tensor([0.0046875], dtype=torch.bfloat16)

    def f(a, b, c):
        return a + b + c

    guard = FusionGuard()
    assert jit_cpu(f)(a, b, b.clone()).item() == 1.0078125
    assert jit_cpu(f, guard)(a, b, b.clone()).item() == 1.0078125
    (decision,) = guard.report.decisions
    assert decision.action == "keep" and decision.code == "exactness"
    (hazard,) = decision.details["inexact"]  # no op that rounds alone: one rounding the fusion skips
    assert ": float32 rounded to bfloat16 and read again inside the region" in hazard, hazard


@pytest.mark.parametrize(
    "dtype,line,rejected",
    [
        ("bf16", "t0 = a + b", True),  # one op rounds once either way
        ("bf16", "t0 = a + b + c", False),  # intermediate rounding the fusion skips
        ("fp16", "t0 = -(a + b)", False),
        ("fp32", "t0 = a + b + c", True),  # float32 chains round at every op either way
        ("bf16", "t0 = a + 0.5", True),  # 0.5 is a bf16 value
        ("bf16", "t0 = a + 0.1", False),  # eager rounds 0.1 to bf16 first
        ("fp16", "t0 = a + 257", True),  # 257 is an fp16 value
        ("bf16", "t0 = a + 257", False),  # ... but not a bf16 one
        ("fp32", "t0 = a + 0.1", True),
        ("fp32", "t0 = a.to(torch.float16).to(torch.float32) + b", False),
        ("bf16", "t0 = a.float() + b", True),  # widening conversions never round
    ],
)
def test_which_regions_the_rule_lets_go(dtype, line, rejected):
    prog = Program(dtype, (64,), 1, False, [line], ["t0"])
    guard = check_program(prog, "cpu")
    actions = {d.action for d in guard.report if d.about_region}
    assert actions == ({"reject"} if rejected else {"keep"}), guard.report
    if not rejected:
        (kept,) = [d for d in guard.report if d.about_region]
        # kept for exactness, by roundings the fusion skips (the programs' ops are exact alone)
        assert kept.code == "exactness" and kept.details["inexact"]
        assert not [op for op in kept.details["inexact"] if op in kept.ops], kept.details["inexact"]


def test_rebuilds_follow_the_same_rule():
    """A region with a skipped rounding is not rebuilt either (identity removal would rebuild it)."""

    def f(a, b):
        t = (a + b).reshape(a.shape)  # same-shape reshape: an identity inside the region
        return t + a

    a, b = torch.randn(64, dtype=torch.bfloat16), torch.randn(64, dtype=torch.bfloat16)
    guard = FusionGuard(costs=Costs(cost_model=False))
    assert torch.equal(jit_cpu(f, guard)(a, b), jit_cpu(f)(a, b))
    assert not [d for d in guard.report if d.action == "remove" and d.region.startswith("TorchCompile")]


def test_hazards_read_the_innermost_ops():
    def f(a, b, c):
        return a + b + c

    x = torch.randn(8, dtype=torch.float16)
    jitted = jit_cpu(f)
    jitted(x, x, x)
    (region,) = [b for b in thunder.last_traces(jitted)[-1].bound_symbols if b.sym.is_fusion]
    hazards = rounding_hazards(region.subsymbols)
    assert len(hazards) == 1 and "float32 rounded to float16" in hazards[0]
