"""why_not_fused: each op outside a fusion region, with the reason Thunder's own decision steps give when
re-run. On CPU with Thunder's torch.compile executor and small executors of the tests' own."""

from __future__ import annotations

import json

import pytest
import thunder
import thunder.torch as ltorch
import torch
from helpers import cat_only, claims, opaque
from thunder.core import prims
from thunder.core.compile_data import get_compile_option
from thunder.executors.torch_compile import TorchCompileExecutor, torch_compile_ex
from thunder.extend import ImplInfo

from thunder_fusion_guard import Costs
from thunder_fusion_guard.examine.why import why_not_fused
from thunder_fusion_guard.examine.why_rows import NO_FIX, WhyKind
from thunder_fusion_guard.ops.kinds import compute_bound

# The rows are the subject, not the code Inductor generates: regions run uncompiled (helpers.without_inductor).
pytestmark = pytest.mark.usefixtures("no_inductor_module")

# A torch.compile fusion executor whose tanh needs a compile option and whose sin refuses 2-D tensors.
picky = TorchCompileExecutor(name="picky_tc")
picky._implmap = {k: v for k, v in torch_compile_ex._implmap.items() if k not in (ltorch.tanh.id, ltorch.sin.id)}
picky._implmap[prims.PrimIDs.TANH] = ImplInfo(checker=lambda a: bool(get_compile_option("picky_tanh", "tanh")))
picky._implmap[prims.PrimIDs.SIN] = ImplInfo(checker=lambda a: a.ndim < 2)


def f(x, w, v):
    y = x * 2
    b = torch.nn.functional.linear(torch.tanh(y) + 1, w)
    return (b * opaque(v)).sin().reshape(-1)


def _inputs():
    torch.manual_seed(0)
    return torch.randn(4, 4, requires_grad=True), torch.randn(4, 4, requires_grad=True), torch.randn(4, 4)


def _run(jitted, backward=True):
    args = _inputs()
    out = jitted(*args)
    if backward:
        out.sum().backward()
    return out, args


def _ops_in_regions(trace) -> set[str]:
    found = set()
    for b in trace.bound_symbols:
        if b.sym.is_fusion:
            stack = list(b.subsymbols)
            while stack:
                s = stack.pop()
                found.add(s.sym.name)
                stack.extend(s.subsymbols)
    return found


@pytest.fixture(scope="module")
def claimed_program():
    jf = thunder.jit(f, executors=[claims, torch_compile_ex])
    out, args = _run(jf)
    return jf, out, args


def test_claimed_no_translation_split_forward(claimed_program):
    jf, _, _ = claimed_program
    report = why_not_fused(jf)
    forward = [r for r in report.rows if r.trace == "forward"]
    [claimed] = [r for r in forward if r.kind == "claimed"]
    assert claimed.op == "ltorch.mul" and claimed.executor == "claims_mul"
    assert claimed.established_by == "executor order"
    assert claimed.facts == {"claimer": "claims_mul", "fuser": "torchcompile"}
    assert claimed.try_.startswith("put torchcompile before claims_mul")
    assert claimed.source is not None and claimed.source.endswith(f"test_why.py:{f.__code__.co_firstlineno + 1}")
    assert claimed.bytes == 2 * 4 * 4 * 4  # x read, y written (float32 4x4 each)
    [missing] = [r for r in forward if r.kind == "no_translation"]
    assert missing.op == "opaque_double" and missing.try_ == NO_FIX
    assert missing.established_by == "checker re-run" and missing.facts["refused"] == "opaque_double"
    [split] = [r for r in forward if r.kind == "split"]
    assert split.ops == ["opaque_double"] and split.established_by == "consecutive fusion re-run"
    assert split.executor == "torchcompile" and split.op == "TorchCompile0 | TorchCompile1"


def test_backward_rows_and_rematerialized(claimed_program):
    jf, _, _ = claimed_program
    report = why_not_fused(jf)
    backward = [r for r in report.rows if r.trace == "backward"]
    # the backward's mul by 2 (x * 2's gradient) is claimed too; tanh and add are recomputed, not saved
    assert any(r.kind == "claimed" and r.op == "ltorch.mul" for r in backward)
    remat = [r for r in backward if r.kind == "rematerialized"]
    assert remat and remat[0].established_by == "output names"
    assert list(remat[0].facts["regions"]) == ["forward", "backward"]  # computed in the forward, again in backward
    assert "prims.tanh" in remat[0].ops


def recomputed_convolution_row():
    """The rematerialized row of a convolution and the ops after it, computed again in backward."""
    from helpers import without_inductor

    conv = torch.nn.Conv2d(2, 4, 3, padding=1)

    def block(x):
        return torch.nn.functional.gelu(conv(torch.nn.functional.silu(x))) + 1

    with without_inductor():
        jitted = thunder.jit(block, executors=[torch_compile_ex])
        jitted(torch.randn(1, 2, 6, 6, requires_grad=True)).sum().backward()
        rows = [r for r in why_not_fused(jitted).rows if r.kind == "rematerialized"]
    (row,) = [r for r in rows if "prims.convolution" in r.ops]
    return row


def test_a_recomputed_convolution_row_counts_the_bytes_it_reads_and_writes():
    """A rematerialized row says how many bytes the recomputation reads and writes, not 0 B."""
    row = recomputed_convolution_row()
    output = 1 * 4 * 6 * 6 * 4  # the convolution's float32 output alone
    assert row.bytes is not None and row.bytes > output, row


def test_report_forms(claimed_program):
    jf, _, _ = claimed_program
    report = why_not_fused(jf)
    text = str(report)
    assert text.splitlines()[0] == report.summary() and "claimed by claims_mul" in report.summary()
    assert "1 region split" in report.summary() or "regions split" in report.summary()
    ranked = report.ranked()
    assert [r.bytes or 0 for r in ranked] == sorted((r.bytes or 0 for r in ranked), reverse=True)
    doc = json.loads(json.dumps(report.to_dict()))
    assert {row["kind"] for row in doc["rows"]} >= {"claimed", "no_translation", "split"}
    page = report.to_html()
    assert page.startswith('<section class="why-not-fused">') and "<script" not in page


def test_outputs_and_traces_unchanged(claimed_program):
    jf, out, _ = claimed_program
    before = (list(thunder.last_traces(jf)), list(thunder.last_backward_traces(jf)))
    printed = str(before[0][-1])
    why_not_fused(jf)
    after = (list(thunder.last_traces(jf)), list(thunder.last_backward_traces(jf)))
    assert all(a is b for a, b in zip(before[0] + before[1], after[0] + after[1], strict=True))
    assert str(after[0][-1]) == printed
    again, _ = _run(jf, backward=False)
    assert torch.equal(again, out)


def test_claimed_fix_puts_the_op_in_a_region():
    jf = thunder.jit(f, executors=[torch_compile_ex, claims])
    _run(jf)
    report = why_not_fused(jf)
    assert not [r for r in report.rows if r.kind == "claimed"]
    assert "mul" in _ops_in_regions(thunder.last_traces(jf)[-1])


def g(x):
    return torch.tanh(x).exp().sin()


def test_option_and_checker_and_option_fix():
    jg = thunder.jit(g, executors=[picky])
    with torch.no_grad():
        jg(torch.randn(4, 4))
    rows = why_not_fused(jg).rows
    [option] = [r for r in rows if r.kind == "option"]
    assert option.op == "ltorch.tanh" and option.established_by == "checker re-run"
    assert option.facts["option"] == "picky_tanh" and option.try_ == "thunder.jit(fn, picky_tanh=True)"
    [checker] = [r for r in rows if r.kind == "checker"]
    assert checker.op == "ltorch.sin"
    assert checker.facts == {"fuser": "picky_tc", "refused": "prims.sin", "args": ["float32[4, 4] on cpu"]}
    assert checker.try_ == NO_FIX and checker.established_by == "checker re-run"
    fixed = thunder.jit(g, executors=[picky], picky_tanh=True)
    with torch.no_grad():
        fixed(torch.randn(4, 4))
    assert not [r for r in why_not_fused(fixed).rows if r.kind == "option"]
    assert "tanh" in _ops_in_regions(thunder.last_traces(fixed)[-1])


def test_region_refused_by_required_ops():
    jg = thunder.jit(lambda x: x.exp() + 1, executors=[cat_only])
    with torch.no_grad():
        jg(torch.randn(4, 4))
    rows = [r for r in why_not_fused(jg).rows if r.kind != "rematerialized"]
    assert rows and all(r.kind == "region_refused" for r in rows)
    assert rows[0].facts["required"] == ["torch.cat"] and rows[0].established_by == "fusion pass re-run"


def test_thunderfx_subgraphs():
    from thunder.dynamo import thunderfx

    compiled = thunderfx(lambda x: (x * 2).tanh(), executors=[claims, torch_compile_ex])
    compiled(torch.randn(4, 4, requires_grad=True)).sum().backward()
    report = why_not_fused(compiled)
    claimed = [r for r in report.rows if r.kind == "claimed"]
    assert claimed and all(r.subgraph and "thunder_" in r.subgraph for r in claimed)


def _scatter_program(x, index, src, w):
    summed = torch.zeros(4, 3, 2).index_add(0, index, src * 2)  # no gradient in Thunder: split off
    return (summed * w).norm(dim=1).sum() + x.new_zeros(3).sum()  # only torch fallbacks: split off


def _scatter_program_rewritten(x, index, src, w):
    """_scatter_program with each outside_thunder row's try applied."""
    summed = torch.zeros(4, 3, 2).scatter_add(0, index[:, None, None].expand_as(src), src * 2)
    return (summed * w).pow(2).sum(1).sqrt().sum() + torch.zeros(3, dtype=x.dtype, device=x.device).sum()


def _scatter_inputs():
    torch.manual_seed(0)
    return torch.randn(3), torch.tensor([0, 2, 2]), torch.randn(3, 3, 2, requires_grad=True), torch.randn(4, 3, 2)


@pytest.mark.parametrize("guarded", [False, True])
def test_ops_thunderfx_keeps_out_of_thunder_and_their_fix(guarded):
    from thunder.dynamo import thunderfx

    from thunder_fusion_guard import FusionGuard

    transforms = [FusionGuard()] if guarded else []
    compiled = thunderfx(_scatter_program, executors=[torch_compile_ex], transforms=transforms)
    compiled(*_scatter_inputs()).backward()
    report = why_not_fused(compiled)
    rows = {r.op: r for r in report.of_kind("outside_thunder")}
    assert set(rows) == {"Tensor.index_add", "Tensor.norm", "Tensor.new_zeros"}
    assert "VJP for PrimIDs.INDEX_ADD is not implemented" in rows["Tensor.index_add"].facts["error"]  # Thunder's
    assert rows["Tensor.norm"].facts == {"split_kind": "MISSING_OP_SUPPORT", "error": None}
    for op in ("Tensor.index_add", "Tensor.norm"):
        assert rows[op].try_.startswith("thunder_fusion_guard.translate_library_ops() before compiling"), op
    line = _scatter_program.__code__.co_firstlineno
    assert rows["Tensor.index_add"].source.endswith(f"test_why.py:{line + 1}")
    assert rows["Tensor.new_zeros"].source.endswith(f"test_why.py:{line + 2}")
    assert rows["Tensor.index_add"].bytes == 4 * (24 + 24 + 18) + 8 * 3  # out, zeros, src, index
    assert all(r.subgraph == "dynamo graph 0" for r in rows.values())
    assert "3 outside Thunder (ThunderFX split)" in report.summary()
    # The translations applied: index_add (its gradient exists now) and norm stay in Thunder.
    from thunder_fusion_guard import library_ops_translated

    with library_ops_translated():
        translated = thunderfx(_scatter_program, executors=[torch_compile_ex], transforms=transforms)
        translated(*_scatter_inputs()).backward()
    assert {r.op for r in why_not_fused(translated).of_kind("outside_thunder")} == {"Tensor.new_zeros"}
    # Each rewrite applied: nothing is split off, one Thunder program runs it all.
    fixed = thunderfx(_scatter_program_rewritten, executors=[torch_compile_ex], transforms=transforms)
    fixed(*_scatter_inputs()).backward()
    assert why_not_fused(fixed).of_kind("outside_thunder") == []
    infos = fixed._backend.subgraph_infos
    assert len(infos) == 1 and not infos[0].split_reasons and len(infos[0].thunder_compiled_fns) == 1


def test_not_a_program():
    with pytest.raises(TypeError, match=r"neither a thunder\.jit function nor a thunderfx object"):
        why_not_fused(f)


@pytest.mark.cuda
def test_segmented_region_on_cuda():
    """The regions nvFuser ran as several kernels (as the kernel collector counts launches) are exactly those with
    a 'segmented' row, each naming its kernels, the tensors on its edges and the schedulers' verdicts."""
    from thunder_fusion_guard import _thunder as th
    from thunder_fusion_guard import collect_segments, why_not_fused

    def h(x):  # reductions over both axes in one region: nvFuser schedules them as separate kernels
        return (x * x.sum(0)).sum(1) + x.softmax(-1).amax(1)

    jh = thunder.jit(h, executors=th.fusion_executors("cuda"))
    x = torch.randn(1024, 2048, device="cuda")
    expected = jh(x)
    why = why_not_fused(jh, x, backward=False)
    assert torch.equal(jh(x), expected)  # the report changes nothing
    launched = {k.region: k.details["kernels"] for k in collect_segments(jh, x, backward=False)}
    segmented = {r.op: r for r in why.rows if r.kind == "segmented"}
    assert segmented, f"nvFuser ran every region as one kernel: {launched}"
    assert {region for region, n in launched.items() if n > 1} <= set(segmented)
    for row in segmented.values():
        assert row.count >= 2 and row.established_by == "scheduled IR + can_schedule"
        assert f"{row.count} segments" in row.reason and "on the whole fusion: " in row.detail  # the verdicts
        assert all(f"edge {tensor}: " in row.detail for tensor in row.ops)  # each edge tensor with its bytes
    assert "run as" in why.summary()


def test_segmented_dump_is_read_with_edge_bytes():
    """nvFuser 0.2.36's segmented-fusion dump: segments in order, each edge tensor's bytes from its extents
    (a broadcast dimension holds one element)."""
    from thunder_fusion_guard.examine.why_segments import segmented_groups

    dump = (
        "Segmented_Fusion{ \ngroups: \n  expr_eval{90}\n  resize{1, 7, 12}\n  pointwise{3, 9}\nedges: \n"
        "  e{ expr_eval{90} -> resize{1, 7, 12}(T48_g___bfloat[bS213{1}, iS214{512}, iS215{12288}]) }\n"
        "  e{ resize{1, 7, 12} -> pointwise{3, 9}(T25_g_float[bS107{1}, bS108{1 ex 32}, iS109{512}, iS110{128}]) }\n"
        "\ngroup details:\ng{(expr_eval)\n}\n} //Segmented_Fusion"
    )
    schedulers, edges = segmented_groups(dump)
    assert schedulers == ["expr_eval", "resize", "pointwise"]
    assert [(e.tensor, e.bytes) for e in edges] == [("T48_g___bfloat", 512 * 12288 * 2), ("T25_g_float", 512 * 128 * 4)]
    assert segmented_groups("%kernel {\n}") is None


def test_cli_bad_args_exit_2_and_writes(tmp_path, capsys):
    from thunder_fusion_guard.tools.cli import main

    assert main(["why", "examples/report_target.py:make", "--json", str(tmp_path / "no" / "x.json")]) == 2
    assert main(["why", "no_such_file.py:make"]) == 2
    out = tmp_path / "why.json"
    assert main(["why", "examples/report_target.py:make", "--device", "cpu", "--json", str(out)]) == 0
    assert "outside fusions" in capsys.readouterr().out
    assert "rows" in json.loads(out.read_text())


def _readme_programs(device: str):
    """The programs of README's snippets: the banded mask, the MLP under thunder.jit, the scores under ThunderFX."""
    from thunder.dynamo import thunderfx

    from thunder_fusion_guard import FusionGuard, fusion_executors

    class BandedScores(torch.nn.Module):
        def forward(self, scores):
            t = scores.shape[-1]
            mask = torch.full((t, t), float("-inf"), device=scores.device)
            for i in range(t):
                mask[i, max(0, i - 3) : i + 1] = 0.0
            return scores + mask

    class Scores(torch.nn.Module):
        def forward(self, q, k):
            return torch.softmax(q @ k.transpose(-2, -1) * 0.125, dim=-1).flatten(0, 1)

    mlp = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64)).to(device)
    ex = fusion_executors(device)
    banded = thunder.jit(BandedScores(), executors=ex, transforms=[FusionGuard(costs=Costs(measure_budget_s=0))])
    banded(torch.randn(4, 16, 16, device=device))
    jitted = thunder.jit(mlp, executors=ex, transforms=[FusionGuard(costs=Costs(measure_budget_s=0))])
    jitted(torch.randn(32, 64, device=device, requires_grad=True)).sum().backward()
    q, k = (torch.randn(2, 4, 16, 8, device=device, requires_grad=True) for _ in range(2))
    compiled = thunderfx(Scores(), executors=ex, transforms=[FusionGuard(costs=Costs(measure_budget_s=0))])
    compiled(q, k).sum().backward()
    return [banded, jitted, compiled]


def test_readme_programs_have_no_unknown_row():
    """Every op outside a fusion in README's examples has a mechanism that explains it."""
    for program in _readme_programs("cpu"):
        why = why_not_fused(program)
        assert not why.of_kind("unknown"), [r.reason for r in why.of_kind("unknown")]


@pytest.mark.cuda
@pytest.mark.parametrize("option", ["nv_enable_linear", "nv_enable_matmul"])
def test_nvfuser_option_rows_and_their_fix_on_cuda(option):
    """nvFuser leaves linear and matmul to other executors unless asked: the row names the compile option, and
    jitting with it puts the op inside an nvFuser region."""
    from thunder_fusion_guard import _thunder as th

    def f(x, w):
        y = torch.nn.functional.linear(x, w) if option == "nv_enable_linear" else x @ w.t()
        return torch.relu(y) * 2

    x, w = torch.randn(64, 128, device="cuda"), torch.randn(96, 128, device="cuda")
    jf = thunder.jit(f, executors=th.fusion_executors("cuda"))
    expected = jf(x, w)
    rows = [r for r in why_not_fused(jf).rows if r.kind == "option"]
    assert rows and all(r.facts["option"] == option for r in rows), [r.reason for r in why_not_fused(jf).rows]
    assert rows[0].try_ == f"thunder.jit(fn, {option}=True)"
    fixed = thunder.jit(f, executors=th.fusion_executors("cuda"), **{option: True})
    torch.testing.assert_close(fixed(x, w), expected)
    trace = thunder.last_traces(fixed)[-1]
    inside = [s.sym.name for b in trace.bound_symbols if th.is_fusion(b) for s in th.fusion_body(b)]
    assert {"linear", "matmul"} & set(inside), inside
    assert not [r for r in why_not_fused(fixed).rows if r.kind == "option"]


def _block(x, w):
    return torch.tanh(x @ w).mul(2).add(1).sum()


@pytest.mark.parametrize("frontend", ["thunder.jit", "thunderfx"])
def test_without_a_fusion_executor_one_row_says_how_to_add_one(frontend):
    """Thunder's own CPU executors fuse nothing but cross entropy: one row for the whole program, forward and
    backward (and every ThunderFX subgraph), with the advice; not a row per op, trace or subgraph."""
    from thunder.dynamo import thunderfx

    def split_block(x, w):  # ThunderFX splits new_zeros off: two Thunder subgraphs
        return _block(x, w) + x.new_zeros(3).sum() + torch.sin(x).sum()

    compiled = thunder.jit(_block) if frontend == "thunder.jit" else thunderfx(split_block)
    compiled(torch.randn(4, 4, requires_grad=True), torch.randn(4, 4)).backward()
    report = why_not_fused(compiled)
    (row,) = report.of_kind("no_fusion_executor")
    assert row.trace == "forward, backward" and row.count >= 8 and len(row.ops) == row.count
    assert row.try_.startswith(f"{frontend}(fn, executors=fusion_executors(device))")
    assert "thunder_fusion_guard" in row.try_ and row.facts == {"fusers": ["torchcompile_xentropy"]}
    assert [r for r in report.rows if r.kind not in ("no_fusion_executor", "outside_thunder")] == []
    assert f"{row.count} with no general fusion executor" in report.summary()
    assert len(report.to_text(wide=True).splitlines()) == 2 + len(report.rows)  # the summary, the header, a row


def repeated(x):
    for _ in range(4):
        x = opaque(x)  # one line, four ops no fusion executor can take: one row, x4
    return x.sin()


def test_identical_rows_are_one_row_with_a_count():
    jitted = thunder.jit(repeated, executors=[claims, torch_compile_ex])
    with torch.no_grad():
        jitted(torch.randn(4, 4))
    report = why_not_fused(jitted)
    (row,) = report.of_kind("no_translation")
    assert row.op == "opaque_double" and row.repeats == 4 and row.count == 4
    assert row.source.endswith(f"test_why.py:{repeated.__code__.co_firstlineno + 2}")
    assert row.bytes == 4 * (2 * 4 * 4 * 4)  # each reads and writes a float32 4x4
    assert row.facts["refused"] == "opaque_double" and row.established_by == "checker re-run"
    assert "opaque_double \u00d74" in str(report) and row.to_dict()["repeats"] == 4
    assert "4 no translation" in report.summary()


def _splits_off(x):
    return (x * 2).sin() + x.new_zeros(x.shape)  # new_zeros: ThunderFX leaves it to torch


def test_ops_thunderfx_leaves_to_torch_appear_once():
    """A second shape makes Dynamo compile a second graph with the same split: the op has one row."""
    from thunder.dynamo import thunderfx

    compiled = thunderfx(_splits_off, executors=[torch_compile_ex])
    compiled(torch.randn(4, 3))
    compiled(torch.randn(5, 3))
    assert len(compiled._backend.subgraph_infos) == 2  # two Dynamo graphs, new_zeros split off in each
    report = why_not_fused(compiled)
    (row,) = report.of_kind("outside_thunder")
    assert row.op == "Tensor.new_zeros" and row.repeats == 2
    assert row.subgraph == "dynamo graph 0; dynamo graph 1"
    assert row.source.endswith(f"test_why.py:{_splits_off.__code__.co_firstlineno + 1}")
    assert report.to_text(wide=True).count("Tensor.new_zeros") == 1


def _breaks_on_item(x):
    y = (x * 2).sin()
    if y.sum().item() > 0:  # a Python branch on a tensor's value: Dynamo breaks the graph at .item()
        y = y + 1
    return y.cos().sum()


def test_dynamo_graph_break_has_a_row_with_dynamos_reason_and_the_users_line():
    """A statement Dynamo cannot trace runs in Python between two Dynamo graphs, never in Thunder: its row has
    Dynamo's reason and the user's line, and the ops outside Thunder are counted."""
    from thunder.dynamo import thunderfx

    from thunder_fusion_guard import FusionGuard

    compiled = thunderfx(
        _breaks_on_item, executors=[torch_compile_ex], transforms=[FusionGuard(costs=Costs(measure_budget_s=0))]
    )
    x = torch.randn(4, 3, requires_grad=True)
    compiled(x).backward()
    assert len(compiled._backend.subgraph_infos) == 2  # the graph before the break and the one resumed after it
    report = why_not_fused(compiled)
    (row,) = report.of_kind(WhyKind.GRAPH_BREAK)
    assert "Tensor.item()" in row.facts["title"] and "capture_scalar_outputs" in row.try_  # Dynamo's reason, hint
    assert row.source.endswith(f"test_why.py:{_breaks_on_item.__code__.co_firstlineno + 2}")
    assert row.op == "if y.sum().item() > 0:"  # the user's statement, without its comment
    assert row.subgraph == "after dynamo graph 0" and row.established_by == "torch._dynamo (graph break)"
    assert sum(r.count for r in report.rows if r.kind.of_ops) >= 1
    assert f"1 {WhyKind.GRAPH_BREAK.label}" in report.summary()


class _Recurrent(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.gru, self.head = torch.nn.GRU(4, 4, batch_first=True), torch.nn.Linear(4, 2)

    def forward(self, x):
        y = (x * 2).tanh()
        y, _ = self.gru(y)  # Dynamo does not trace a GRU: the graph ends here
        return self.head(y).sum()


def test_a_gru_breaks_the_graph_and_the_code_after_it_runs_in_python():
    """A conv + GRU model: Dynamo stops at the GRU and resumes no graph after it (the head and the loss run in
    Python too): the GRU's line has a row saying so."""
    from thunder.dynamo import thunderfx

    from thunder_fusion_guard import _thunder as th

    model = _Recurrent()
    compiled = thunderfx(model, executors=[torch_compile_ex])
    compiled(torch.randn(2, 3, 4)).backward()
    (brk,) = th.graph_breaks(compiled)
    assert (brk.graph, brk.function, brk.resumed) == (0, "forward", False)
    (row,) = why_not_fused(compiled).of_kind(WhyKind.GRAPH_BREAK)
    assert row.op == "y, _ = self.gru(y)" and (row.facts["function"], row.facts["resumed"]) == ("forward", False)
    assert row.source.endswith(f"test_why.py:{_Recurrent.forward.__code__.co_firstlineno + 2}")


def test_grouping_rows_that_say_the_same():
    """Rows alike in trace, kind, op, source, reason and try are one (their bytes and ops added, their subgraphs
    named); every no-fusion-executor row is one; a segmented row, whose count is its segments, stays apart."""
    from thunder_fusion_guard.examine.why_rows import WhyKind, WhyReport, WhyRow, grouped

    def row(op="ltorch.mul", trace="forward", kind="claimed", subgraph=None, source="m.py:3", nbytes=8, count=1):
        return WhyRow(
            trace=trace, subgraph=subgraph, op=op, source=source, kind=kind, reason="r", established_by="e",
            bytes=nbytes, try_="t", count=count,
        )  # fmt: skip

    rows = grouped(
        [
            row(subgraph="g0"),
            row(subgraph="g1"),
            row(subgraph="g1", nbytes=None),
            row(source="m.py:4"),
            row(trace="backward"),
            row(op="exp", kind="no_fusion_executor", subgraph="g0"),
            row(op="sin", kind="no_fusion_executor", trace="backward", subgraph="g1"),
            row(op="nvFusion0", kind="segmented", count=3),
            row(op="nvFusion0", kind="segmented", count=3),
        ]
    )
    assert [(r.op, r.trace, r.repeats, r.count) for r in rows] == [
        ("ltorch.mul", "forward", 3, 3),
        ("ltorch.mul", "forward", 1, 1),
        ("ltorch.mul", "backward", 1, 1),
        ("2 ops", "forward, backward", 1, 2),
        ("nvFusion0", "forward", 1, 3),
        ("nvFusion0", "forward", 1, 3),
    ]
    assert rows[0].subgraph == "g0; g1" and rows[0].bytes is None and rows[0].kind is WhyKind.CLAIMED
    assert rows[3].ops == ["exp", "sin"] and rows[3].bytes == 16 and rows[3].source is None
    summary = WhyReport(rows).summary()
    assert (
        summary
        == "7 ops outside fusions: 5 claimed by ?, 2 with no general fusion executor; 2 regions run as 6 segments"
    )


def test_a_recomputed_convolution_is_not_free_and_its_row_says_so():
    """Recomputing a convolution in backward costs its FLOPs again: its row does not offer "none needed" as a row
    of elementwise ops recomputed does, and names the convolution."""
    row = recomputed_convolution_row()
    assert not row.try_.startswith("none needed") and "prims.convolution" in row.try_, row.try_
    assert compute_bound(row.ops) == ["prims.convolution"]
    assert compute_bound(["prims.tanh", "ltorch.mul", "prims.convert_element_type"]) == []
