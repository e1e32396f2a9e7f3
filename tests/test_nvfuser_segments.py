"""Kernels per nvFusion region on a CUDA GPU: nanoGPT block, a small litgpt model, ThunderFX, the CLI.

Skipped without CUDA and nvFuser. Run with ``-s`` to see the reports (they are printed).
"""

import json
from pathlib import Path

import pytest
import thunder
import torch
from helpers import assert_same, run_with_grads
from test_thunderfx import Heads

from thunder_fusion_guard import FusionGuard, Rewrites, collect_segments, explain, profile_regions
from thunder_fusion_guard.ops import region_is_metadata_only
from thunder_fusion_guard.regions import find_regions
from thunder_fusion_guard.tools.cli import main

pytestmark = pytest.mark.cuda

REPO = Path(__file__).resolve().parents[1]
SCHEDULERS = {
    "pointwise",
    "reduction",
    "inner_persistent",
    "outer_persistent",
    "inner_outer_persistent",
    "transpose",
    "matmul",
    "resize",
    "no_op",
    "expr_eval",
    "greedy",
    "nvfuser",
    "aten",
}


def nv_regions(traces):
    return [(kind, r) for kind, t in traces for r in find_regions(t, executors=["nvfuser"])]


def jitted_traces(jitted):
    return [("forward", thunder.last_traces(jitted)[-1]), ("backward", thunder.last_backward_traces(jitted)[-1])]


def check_kernels(found, guard, expected):
    """Every nvFusion region of the final traces has its kernels listed, in the records and in its decision."""
    assert sorted((k.subgraph, k.trace, k.region) for k in found) == sorted(expected)
    for k in found:
        d = k.details
        assert d["kernels"] == len(d["kernel_names"]) == len(d["schedulers"]), k
        assert d["segmented"] == (d["kernels"] > 1)
        assert set(d["schedulers"]) <= SCHEDULERS, d["schedulers"]
        if "ops_per_kernel" in d:
            assert len(d["ops_per_kernel"]) == d["kernels"]
        (decision,) = [
            x
            for x in guard.report
            if (x.subgraph, x.trace, x.region) == (k.subgraph, k.trace, k.region) and "kernels" in x.details
        ]
        # kept, or kept as one compiled fusion shared with its twins (runtime.share_fusions)
        assert decision.action in ("keep", "share") and {k: decision.details.get(k) for k in d} == d
    assert any(k.details["kernels"] >= 1 and "nvfuser" in k.details["kernel_names"][0] for k in found)


def assert_same_as_unguarded_noise(guarded, plain, plain_again):
    """Bitwise equal to unguarded thunder, unless thunder itself differs run to run (the attention
    backward accumulates with atomics on CUDA); then within the tolerance of its own dtype."""
    try:
        assert_same(plain_again, plain)
    except AssertionError:
        for g, p in zip(guarded, plain, strict=True):
            torch.testing.assert_close(g, p)
        return
    assert_same(guarded, plain)


def show(title, text):
    print(f"\n===== {title} =====\n{text}")


def test_nanogpt_block_lists_kernels_per_region():
    from thunder.tests.nanogpt_model import Block, GPTConfig

    torch.manual_seed(0)
    config = GPTConfig(n_embd=256, n_head=4, block_size=128, dropout=0.0)
    block = Block(config).to(device="cuda", dtype=torch.bfloat16)
    x = torch.randn(2, 128, config.n_embd, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    guard = FusionGuard()
    jitted = thunder.jit(block, transforms=[guard])
    out_g, grads_g = run_with_grads(jitted, [x])
    plain = thunder.jit(block)
    out_p, grads_p = run_with_grads(plain, [x])
    assert_same(out_g, out_p)
    assert_same_as_unguarded_noise(grads_g, grads_p, run_with_grads(plain, [x])[1])
    found = collect_segments(jitted, x)
    check_kernels(found, guard, [(None, kind, r.name) for kind, r in nv_regions(jitted_traces(jitted))])
    text = explain(jitted)
    assert "kernels" in text.splitlines()[0].split()
    show("nanoGPT block: explain()", text)
    profile = profile_regions(jitted, x, reps=5, warmup=2)
    for row in profile.rows:
        if row.executor == "nvfuser":
            assert row.kernels is not None and len(row.kernel_names) == row.kernels == len(row.schedulers)
    show("nanoGPT block: profile_regions()", str(profile))


def test_litgpt_model_lists_kernels_per_region():
    litgpt = pytest.importorskip("litgpt")
    from litgpt.model import GPT

    torch.manual_seed(0)
    config = litgpt.Config.from_name(
        "Llama-2-7b-hf",
        n_layer=1,
        n_embd=256,
        n_head=4,
        n_query_groups=4,
        head_size=64,
        intermediate_size=512,
        vocab_size=1024,
        padded_vocab_size=1024,
        block_size=128,
    )
    with torch.device("cuda"):
        model = GPT(config).to(torch.bfloat16)
    model.max_seq_length = 128
    idx = torch.randint(0, config.padded_vocab_size, (1, 128), device="cuda")
    guard = FusionGuard()
    jitted = thunder.jit(model, transforms=[guard])
    jitted(idx).float().sum().backward()
    found = collect_segments(jitted, idx)
    check_kernels(found, guard, [(None, kind, r.name) for kind, r in nv_regions(jitted_traces(jitted))])
    show("litgpt Llama-2 (1 layer, 256 wide): explain()", explain(jitted))


def test_thunderfx_on_nvfuser_lists_kernels_by_subgraph():
    from thunder.dynamo import thunderfx

    torch.manual_seed(0)
    model = Heads(heads=4, dim=256).cuda()
    x = torch.randn(4, 128, 256, device="cuda", requires_grad=True)
    guard = FusionGuard(strict=True, rewrites=Rewrites(override_compile_options=True))
    guarded = thunderfx(model, transforms=[guard], nv_enable_shape_only_fusion=True)
    plain = thunderfx(model, nv_enable_shape_only_fusion=True)
    out_g, grads_g = run_with_grads(guarded, [x])
    out_p, grads_p = run_with_grads(plain, [x])
    assert_same(out_g, out_p)
    assert_same(grads_g, grads_p)

    def metadata_only(compiled):
        traces = [("forward", t) for t in compiled.last_traces] + [
            ("backward", t) for t in compiled.last_backward_traces
        ]
        return [r for _, r in nv_regions(traces) if region_is_metadata_only(r.body)]

    assert metadata_only(plain) and not metadata_only(guarded)
    found = collect_segments(guarded, x)
    assert found and {k.subgraph for k in found} <= set(guard.report.subgraphs)
    text = explain(guarded)
    assert "kernels" in text.splitlines()[0].split() and "subgraph 0 (dynamo graph 0, thunder_0)" in text
    show("ThunderFX, nvFuser: explain()", text)


def test_report_cli_on_cuda(tmp_path, capsys):
    out = tmp_path / "report.json"
    target = f"{REPO}/examples/report_target.py:make"
    assert main(["report", target, "--thunderfx", "--device", "cuda", "--json", str(out)]) == 0
    show("fusion-guard report --thunderfx --device cuda", capsys.readouterr().out)
    decisions = json.loads(out.read_text())["report"]["decisions"]
    latest = {}
    for d in decisions:
        latest[d["subgraph"]] = max(latest.get(d["subgraph"], 0), d["compile_index"])
    kept = [
        d
        for d in decisions
        if d["executor"] == "nvfuser"
        and d["action"] == "keep"
        and d["details"].get("scope") != "op"
        and d["compile_index"] == latest[d["subgraph"]]
    ]
    assert kept and all("kernels" in d["details"] for d in kept), [d for d in kept if "kernels" not in d["details"]]
