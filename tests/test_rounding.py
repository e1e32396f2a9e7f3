"""Low precision: a region the guard rejects gives the bits unguarded Thunder gives, in bf16, fp16 and fp32.

A fusion skips the rounding between ops that Thunder's trace spells out (bf16 add = upcast, add, round),
and eager PyTorch rounds a Python number to a bf16/fp16 tensor's dtype before using it. The guard must only
reject regions for which neither changes a bit (``ops.rounding_hazards``). The random programs here are
element-wise DAGs of the ops the guard counts as exact, with casts between dtypes and numbers mixed in;
every region the rule allows is rejected (a cost model that always prefers eager), and the guarded run
must equal unguarded Thunder to the bit, forward and backward.

On CPU through Thunder's torch.compile executor (CI runs ``TFG_ROUNDING_EXAMPLES`` programs per dtype,
default 8, derandomized); on CUDA through nvFuser (``-m cuda``, 40 per dtype unless the variable says).
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
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from thunder_fusion_guard import FusionGuard
from thunder_fusion_guard.ops import rounding_hazards

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
NUMBERS = (0.5, 0.1, 3, 257, -1.25, 1e-3, 2.0)
SIZES = ((1,), (3,), (64,), (4096,), (2, 3), (16, 33))


def _examples(device: str) -> int:
    default = "8" if device == "cpu" else "40"
    return int(os.environ.get("TFG_ROUNDING_EXAMPLES", default))


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
        scales = (1.0, 1e-2, 3e2)
        made = [(torch.randn(self.shape, generator=gen) * s).to(DTYPES[self.dtype]) for s in scales]
        return [t.to(device).requires_grad_(self.grad) for t in made]

    def __repr__(self) -> str:
        return f"Program(dtype={self.dtype}, shape={self.shape}, seed={self.seed}, grad={self.grad})\n{self.source}"


def _op(rng: random.Random, names: list[str], dtype: str) -> str:
    """One element-wise expression over earlier values (a DAG: any earlier name may be read)."""
    x, y = rng.choice(names), rng.choice(names)
    number = rng.choice(NUMBERS)
    other = rng.choice([d for d in DTYPES if d != dtype])
    return rng.choice(
        [
            f"{x} + {y}",
            f"{x} - {y}",
            f"{x} + {number}",
            f"{x} - {number}",
            f"-{x}",
            f"{x}.abs()",
            f"torch.where({x} > {y}, {x}, {y})",
            f"torch.where({x} > 0, {x} + {y}, {y})",
            f"torch.maximum({x}, {y})",
            f"torch.minimum({x}, {y})",
            f"{x} * {y}",
            f"{x} * {number}",
            f"{x}.to(torch.{DTYPES[other]}).to({y}.dtype)",
            f"({x}.to(torch.{DTYPES[other]}) + {y}.to(torch.{DTYPES[other]})).to({x}.dtype)",
            f"{x}.float() + {y}",
        ]
    )


@st.composite
def programs(draw, device: str) -> Program:
    rng = draw(st.randoms(use_true_random=True))
    dtype = draw(st.sampled_from(sorted(DTYPES)))
    names = ["a", "b", "c"]
    lines = []
    for i in range(rng.randint(1, 6)):
        lines.append(f"t{i} = {_op(rng, names, dtype)}")
        names.append(f"t{i}")
    extra = rng.sample(names[3:-1], min(len(names) - 4, rng.randint(0, 2)))
    grad = device == "cpu" and rng.random() < 0.3
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


def check_program(prog: Program, device: str) -> FusionGuard:
    fn = prog.function()
    guard = FusionGuard(calibration=ALWAYS_EAGER, strict=True)
    expected = _run(_jit(fn, device, None), prog, device)
    got = _run(_jit(fn, device, guard), prog, device)
    assert len(got) == len(expected), prog
    for i, (g, e) in enumerate(zip(got, expected, strict=True)):
        assert g.dtype == e.dtype and g.shape == e.shape, f"result {i}\n{prog!r}"
        same = torch.equal(g, e) or (torch.equal(g.isnan(), e.isnan()) and torch.equal(g.nan_to_num(), e.nan_to_num()))
        assert same, (
            f"result {i}: {int((g != e).sum())} elements differ from unguarded thunder\n{prog!r}\n{guard.report}"
        )
    return guard


# Programs checked per (device, dtype, whether a region was rejected), printed with -s and written as JSON
# to TFG_ROUNDING_STATS when set: how much of the rule the random programs exercised.
STATS: Counter[str] = Counter()


def _property(device: str):
    @settings(
        max_examples=_examples(device),
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    @given(programs(device))
    def check(prog):
        guard = check_program(prog, device)
        rejected = any(d.action == "reject" for d in guard.report)
        what = f"{device} {prog.dtype}: {'some region rejected' if rejected else 'every region kept'}"
        event(what)
        STATS[what] += 1

    return check


def _report(device: str) -> None:
    rows = {k: v for k, v in sorted(STATS.items()) if k.startswith(device)}
    print(f"\nrounding programs ({device}): " + "; ".join(f"{k.split(' ', 1)[1]}: {v}" for k, v in rows.items()))
    path = os.environ.get("TFG_ROUNDING_STATS")
    if path:
        with open(path, "w") as f:
            json.dump(dict(STATS), f, indent=1)


def test_random_low_precision_programs_keep_thunders_bits_cpu():
    _property("cpu")()
    _report("cpu")


@pytest.mark.cuda
def test_random_low_precision_programs_keep_thunders_bits_nvfuser():
    _property("cuda")()
    _report("cuda")


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
    assert decision.action == "keep"
    assert "float32 rounded to bfloat16 and read again inside the region" in decision.reason


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
        assert "could round differently outside the fusion" in kept.reason


def test_rebuilds_follow_the_same_rule():
    """A region with a skipped rounding is not rebuilt either (identity removal would rebuild it)."""

    def f(a, b):
        t = (a + b).reshape(a.shape)  # same-shape reshape: an identity inside the region
        return t + a

    a, b = torch.randn(64, dtype=torch.bfloat16), torch.randn(64, dtype=torch.bfloat16)
    guard = FusionGuard(cost_model=False)
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
