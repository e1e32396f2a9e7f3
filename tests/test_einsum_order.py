"""Thunder's einsum traced alike whatever PYTHONHASHSEED: a guard with ``ordered_einsum`` (default: in a run of
several ranks) makes the label sets Thunder's einsum walks sorted, so two processes trace and decide the same."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import thunder
import torch

from thunder_fusion_guard import FusionGuard
from thunder_fusion_guard._thunder.einsum_order import SortedLabels


def test_sorted_labels_walk_sorted_and_stay_sorted_through_set_operations():
    labels = SortedLabels("dbca")
    assert list(labels) == ["a", "b", "c", "d"]
    plain = frozenset("cbaz")
    for made in (plain & labels, labels & plain, plain - labels, labels - plain, plain | labels, plain ^ labels):
        assert isinstance(made, SortedLabels)
        assert list(made) == sorted(made)
    assert plain & labels == frozenset("abc") and plain - labels == frozenset("z")
    assert frozenset("abcd") - frozenset("a") - labels == frozenset()
    with pytest.raises(TypeError):
        labels & "ab"


class Contract(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.einsum("abcd,abce->de", x, y)


def test_an_ordered_guard_contracts_einsums_labels_in_sorted_order():
    x, y = torch.randn(2, 3, 4, 5), torch.randn(2, 3, 4, 6)
    guard = FusionGuard(ordered_einsum=True)
    jitted = thunder.jit(Contract(), transforms=[guard])
    out = jitted(x, y)
    torch.testing.assert_close(out, Contract()(x, y))
    assert guard.report.einsums_ordered > 0  # Thunder traces an einsum more than once (its forward, its grad)
    assert guard.report.to_dict()["einsums_ordered"] == guard.report.einsums_ordered
    permutes = [b for b in thunder.last_traces(jitted)[-1].bound_symbols if b.sym.name == "permute"]
    # y's rest label e first (opt_einsum hands Thunder y, x), then the contracted labels a, b, c in sorted order
    # (in the order of the set opt_einsum returns otherwise)
    assert [tuple(b.args[1]) for b in permutes][:1] == [(3, 0, 1, 2)]


def test_by_default_only_a_run_of_several_ranks_orders_einsum(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert not FusionGuard().orders_einsum_labels
    guard = FusionGuard()
    thunder.jit(Contract(), transforms=[guard])(torch.randn(2, 3, 4, 5), torch.randn(2, 3, 4, 6))
    assert guard.report.einsums_ordered == 0
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    assert FusionGuard().orders_einsum_labels
    assert not FusionGuard(ordered_einsum=False).orders_einsum_labels


def test_ordered_einsum_is_checked():
    with pytest.raises(ValueError, match="ordered_einsum"):
        FusionGuard(ordered_einsum="yes")


_PROCESS = textwrap.dedent(
    """
    import hashlib, json, re, sys
    import torch, thunder
    from thunder_fusion_guard import FusionGuard
    from thunder_fusion_guard.distributed import decision_key

    class Contract(torch.nn.Module):
        def forward(self, x, y, z):
            return torch.einsum("abcd,abce,bf->def", x, y, z).sin() * 2

    def text(trace):
        lines = [line.split("  #")[0] for line in str(trace).splitlines() if not line.lstrip().startswith("#")]
        names = {}
        return "\\n".join(
            re.sub(r"\\b[A-Za-z_]*\\d+\\b", lambda m: names.setdefault(m.group(0), f"v{len(names)}"), line)
            for line in lines
        )

    g = torch.Generator().manual_seed(0)
    x, y, z = (torch.randn(*s, generator=g, dtype=torch.bfloat16) for s in ((2, 3, 4, 5), (2, 3, 4, 6), (3, 7)))
    x.requires_grad_(True)
    out = {}
    for name, guard in (("guarded", FusionGuard()), ("unguarded", None)):
        jitted = thunder.jit(Contract(), transforms=[guard] if guard else [])
        result = jitted(x, y, z)
        (grad,) = torch.autograd.grad(result.float().square().sum(), x)
        traces = text(thunder.last_traces(jitted)[-1]) + text(thunder.last_backward_traces(jitted)[-1])
        keys = repr([decision_key(d) for d in guard.report.decisions]) if guard else ""
        bits = result.view(torch.int16).tolist(), grad.view(torch.int16).tolist()
        out[name] = [hashlib.sha1(s.encode()).hexdigest() for s in (traces, keys, repr(bits))]
        out[name].append(guard.report.einsums_ordered if guard else 0)
    print(json.dumps(out))
    """
)


def _one_rank(seed: int, tmp_path) -> dict:
    script = tmp_path / "rank.py"
    script.write_text(_PROCESS)
    # torchrun's variables without a process group: the guard sees a run of 2 ranks
    env = {**os.environ, "PYTHONHASHSEED": str(seed), "WORLD_SIZE": "2", "RANK": str(seed % 2), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_ranks_with_different_hash_seeds_trace_decide_and_compute_alike(tmp_path):
    runs = [_one_rank(seed, tmp_path) for seed in (1, 2, 3, 4)]
    assert all(run["guarded"][3] >= 1 for run in runs)  # the einsum traced in sorted label order on every rank
    assert len({tuple(run["guarded"]) for run in runs}) == 1  # traces, decisions, bits (bf16 values and gradient)
    # unguarded Thunder's own traces follow each process's string hashing
    assert len({run["unguarded"][0] for run in runs}) > 1


class Einsum(torch.nn.Module):
    def __init__(self, equation: str) -> None:
        super().__init__()
        self.equation = equation

    def forward(self, *operands: torch.Tensor) -> torch.Tensor:
        return torch.einsum(self.equation, *operands)


# Equations of Thunder's own einsum samples (thunder/tests/opinfos.py): diagonals, batch and broadcast dims, outer
# products, ellipses, three and four operands: the contracted labels of each walked in sorted order.
EQUATIONS = [
    ([(3, 3, 3)], "iji->j"),
    ([(2, 2, 3, 3)], "iijj->ji"),
    ([(1, 3, 4), (4, 3)], "bij,jk->bki"),
    ([(2, 3, 3), (1, 3, 3)], "bij,bkj"),
    ([(3,), (2, 2)], "i,jk->jik"),
    ([(1, 2, 3, 4), (4, 3, 2)], "ijkl,lkj->i"),
    ([(2, 2, 2), (2, 2, 2)], "ijk,kji->i"),
    ([(2, 2, 2, 2), (2, 2, 2, 2)], "aijk,kjib->ba"),
    ([(1, 3, 4, 5), (2, 3, 2, 5)], "bnqd,bnkd->bnqk"),
    ([(1, 3, 4, 5), (4, 6, 5)], "bhld,lrd->bhlr"),
    ([(1, 2, 3), (3,)], "...ik, ...j->ij"),
    ([(2, 3, 2, 2), (3, 2, 2, 2)], "ij...,jk...->ik..."),
    ([(2, 2, 2), (2, 2, 2), (2, 2, 2)], "ijk,kji,jki->ij"),
    ([(1, 2, 3, 4), (1, 1, 5), (2, 1, 2)], "i...j,...k,l...m->ijklm"),
    ([(2, 2, 2), (2, 2, 2), (2, 2, 2), (2, 2, 2)], "...i,...j,...kl,mn...->ijkm"),
    ([(4, 2, 3), (4, 3, 5), (3, 5, 6)], "zui,zvj,ijk->zuvk"),  # e3nn's tensor-product contraction
]


@pytest.mark.parametrize(("shapes", "equation"), EQUATIONS, ids=[e for _, e in EQUATIONS])
def test_einsum_in_sorted_label_order_computes_what_torch_does(shapes, equation):
    generator = torch.Generator().manual_seed(0)
    operands = [torch.randn(*s, generator=generator, dtype=torch.float64, requires_grad=True) for s in shapes]
    guard = FusionGuard(ordered_einsum=True)
    jitted = thunder.jit(Einsum(equation), transforms=[guard])
    got = jitted(*operands)
    want = torch.einsum(equation, *operands)
    torch.testing.assert_close(got, want)
    cotangent = torch.randn(want.shape, generator=generator, dtype=torch.float64)
    torch.testing.assert_close(
        torch.autograd.grad(got, operands, cotangent), torch.autograd.grad(want, operands, cotangent)
    )
    assert guard.report.einsums_ordered > 0
