"""The classifier behind why_not_fused, one op at a time: small programs jitted on CPU, each op outside a region
classified with its program's context (or that context changed), asserting the kind and the facts its reason is
worded from (``WhyRow.facts``); and the rows
of what is no single op: a node ThunderFX left to torch, a statement Dynamo ran in Python (a graph break), a
split, outputs computed twice, a missing region."""

from __future__ import annotations

from dataclasses import replace

import pytest
import thunder
import thunder.torch as ltorch
import torch
from helpers import cat_only, claims, opaque
from thunder.core import prims
from thunder.core.compile_data import get_compile_option
from thunder.executors.torch_compile import TorchCompileExecutor, torch_compile_ex
from thunder.extend import ImplInfo, get_executor

from thunder_fusion_guard import _thunder as th
from thunder_fusion_guard.examine.why import numbering_gap_rows, recomputed_rows, split_rows
from thunder_fusion_guard.examine.why_classify import (
    BREAK_FIX,
    WhyContext,
    classify,
    context_of,
    graph_break_row,
    graph_break_rows,
    is_work,
    outside_thunder_row,
)
from thunder_fusion_guard.examine.why_rows import NO_FIX, WhyKind

# The subject is not the code Inductor generates: regions run uncompiled (helpers.without_inductor).
pytestmark = pytest.mark.usefixtures("no_inductor_module")

# torch.compile fusion executors: one whose tanh needs a compile option, whose sin refuses 2-D tensors and which
# has no exp at all; one without Thunder's own torch fallback for norm (claims, opaque and cat_only: helpers.py).
picky = TorchCompileExecutor(name="unit_picky")
picky._implmap = {
    k: v
    for k, v in torch_compile_ex._implmap.items()
    if k not in (ltorch.tanh.id, ltorch.sin.id, ltorch.exp.id, prims.PrimIDs.EXP)
}
picky._implmap[prims.PrimIDs.TANH] = ImplInfo(checker=lambda a: bool(get_compile_option("unit_tanh", "tanh")))
picky._implmap[prims.PrimIDs.SIN] = ImplInfo(checker=lambda a: a.ndim < 2)
no_norm = TorchCompileExecutor(name="unit_no_norm")
no_norm._implmap = {k: v for k, v in torch_compile_ex._implmap.items() if k != "torch.norm"}


def _ran(fn, executors, *shape, **options):
    jitted = thunder.jit(fn, executors=executors, **options)
    with torch.no_grad():
        jitted(torch.randn(*shape or (4, 4)))
    return jitted


def _outside(jitted, context: WhyContext | None = None) -> dict:
    """op name -> the row of each op outside every region of the last forward trace."""
    context = context or context_of(jitted)
    rows = [classify(b, context) for b in thunder.last_traces(jitted)[-1].bound_symbols if is_work(b)]
    return {r.op: r for r in rows}


def claimed_between(x):
    return opaque((x.exp() * 2).sin())  # exp | claimed mul | sin: two regions; opaque after them


@pytest.fixture(scope="module")
def claimed_program():
    return _ran(claimed_between, [claims, torch_compile_ex])


def test_claimed_by_an_operator_executor_before_the_fuser(claimed_program):
    row = _outside(claimed_program)["ltorch.mul"]
    assert row.kind == WhyKind.CLAIMED and row.kind.of_ops and row.executor == "claims_mul"
    assert row.facts == {"claimer": "claims_mul", "fuser": "torchcompile"}
    assert row.established_by == "executor order"
    assert row.try_ == "put torchcompile before claims_mul in executors=[...], or drop claims_mul"
    assert row.bytes == 2 * 4 * 4 * 4 and row.trace == "forward" and row.subgraph is None
    assert row.source.endswith(f"test_why_classify.py:{claimed_between.__code__.co_firstlineno + 1}")


def test_the_same_op_in_another_context(claimed_program):
    """The classifier is a function of the op and the context: with the fuser first nothing claims the mul, and
    nothing else known keeps it out (it would be in a region): unknown, saying what was tried."""
    context = context_of(claimed_program, trace="backward", subgraph="dynamo graph 0, thunder_1")
    reordered = replace(context, executors=(torch_compile_ex, claims, *context.executors[2:]))
    row = _outside(claimed_program, reordered)["ltorch.mul"]
    assert row.kind == WhyKind.UNKNOWN and row.try_ == NO_FIX
    assert row.established_by == "fusion pass re-run"
    assert row.facts == {"fuser": "torchcompile", "tried": ["required_ops", "cuda_io", "shape_only"]}
    assert (row.trace, row.subgraph) == ("backward", "dynamo graph 0, thunder_1")


def test_no_translation_for_an_opaque_op(claimed_program):
    row = _outside(claimed_program)["opaque_double"]
    assert row.kind == WhyKind.NO_TRANSLATION
    assert row.facts == {"fuser": "torchcompile", "refused": "opaque_double", "auto_registered": False}
    assert row.established_by == "checker re-run" and row.try_ == NO_FIX


def test_an_op_inside_a_region_is_unknown(claimed_program):
    """Asked about an op the fusion pass did put in a region, the classifier finds no rule that kept it out."""
    region = next(b for b in thunder.last_traces(claimed_program)[-1].bound_symbols if th.is_fusion(b))
    row = classify(region.subsymbols[0], context_of(claimed_program))
    assert row.op == "ltorch.exp" and row.kind == WhyKind.UNKNOWN and row.established_by == "fusion pass re-run"


def test_option_checker_and_the_first_untranslated_op_of_a_decomposition():
    jitted = _ran(lambda x: x.tanh().sin().exp(), [picky])
    rows = _outside(jitted)
    assert rows["ltorch.tanh"].kind == WhyKind.OPTION
    assert rows["ltorch.tanh"].facts == {"fuser": "unit_picky", "refused": "prims.tanh", "option": "unit_tanh"}
    assert rows["ltorch.tanh"].try_ == "thunder.jit(fn, unit_tanh=True)"
    under_thunderfx = _outside(jitted, replace(context_of(jitted), frontend="thunderfx"))
    assert under_thunderfx["ltorch.tanh"].try_ == "thunderfx(fn, unit_tanh=True)"
    assert rows["ltorch.sin"].kind == WhyKind.CHECKER and rows["ltorch.sin"].try_ == NO_FIX
    assert rows["ltorch.sin"].facts == {"fuser": "unit_picky", "refused": "prims.sin", "args": ["float32[4, 4] on cpu"]}
    assert rows["ltorch.exp"].kind == WhyKind.NO_TRANSLATION
    assert rows["ltorch.exp"].facts == {"fuser": "unit_picky", "refused": "prims.exp", "auto_registered": False}
    assert rows["ltorch.exp"].established_by == "decomposition walk"
    # Each reason names the op refused and the executor that refused it (the words are the classifier's).
    assert all(r.facts["refused"] in r.reason and "unit_picky" in r.reason for r in rows.values())


def test_no_translation_for_thunders_own_torch_fallback():
    row = _outside(_ran(lambda x: x.norm(dim=1).exp(), [no_norm], 4, 3))["ltorch.norm"]
    assert row.kind == WhyKind.NO_TRANSLATION
    assert row.facts == {"fuser": "unit_no_norm", "refused": "ltorch.norm", "auto_registered": True}


def test_region_refused_by_required_ops():
    jitted = _ran(lambda x: x.exp() + 1, [cat_only])
    rows = _outside(jitted)
    assert {r.kind for r in rows.values()} == {WhyKind.REGION_REFUSED}
    row = rows["ltorch.exp"]
    assert row.facts == {"fuser": "cat_only_tc", "rule": "required_ops", "required": ["torch.cat"]}
    assert row.try_ == NO_FIX
    assert row.established_by == "fusion pass re-run"
    beside_a_general_fuser = replace(context_of(jitted), executors=(cat_only, torch_compile_ex))
    assert _outside(jitted, beside_a_general_fuser)["ltorch.exp"].try_ == "none needed"


def test_no_general_fusion_executor():
    """Thunder's CPU defaults fuse cross entropy only: the row says no general fusion executor is in use and how
    to add one, whatever op it is."""
    jitted = _ran(lambda x: x.exp(), [get_executor("sdpa"), get_executor("torchcompile_xentropy")])
    row = _outside(jitted)["ltorch.exp"]
    assert row.kind == WhyKind.NO_FUSION_EXECUTOR and row.established_by == "executors_list"
    assert row.facts == {"fusers": ["torchcompile_xentropy"]}
    assert row.try_ == (
        "thunder.jit(fn, executors=fusion_executors(device)), with from thunder_fusion_guard import fusion_executors"
    )
    none = replace(context_of(jitted), executors=(get_executor("torch"),), frontend="thunderfx")
    row = _outside(jitted, none)["ltorch.exp"]
    assert row.facts == {"fusers": []} and row.try_.startswith("thunderfx(fn, executors=")


def _split_op(target: str, kind: str, info: str, exception: str | None = None) -> th.FxSplitOp:
    return th.FxSplitOp(3, "node_1", target, kind, info, exception, "model.py:12", 96)


def test_outside_thunder_rows():
    """A node ThunderFX's splitter left to torch: the splitter's reason, and what keeps it in Thunder."""
    fallback = outside_thunder_row(_split_op("Tensor.new_zeros", "MISSING_OP_SUPPORT", "automatic torch fallback"))
    assert fallback.kind == WhyKind.OUTSIDE_THUNDER and fallback.subgraph == "dynamo graph 3"
    assert fallback.facts == {"split_kind": "MISSING_OP_SUPPORT", "error": None}
    assert fallback.detail == "automatic torch fallback"  # the splitter's own words, passed on
    assert fallback.try_ == "torch.zeros(shape, dtype=x.dtype, device=x.device)"
    assert (fallback.source, fallback.bytes, fallback.established_by) == (
        "model.py:12",
        96,
        "thunder.dynamo splitter (MISSING_OP_SUPPORT)",
    )
    failed = outside_thunder_row(
        _split_op(
            "Tensor.index_add", "EXCEPTION_META_THUNDER_OP", "failed", "VJP for PrimIDs.INDEX_ADD is not implemented"
        )
    )
    assert failed.facts == {
        "split_kind": "EXCEPTION_META_THUNDER_OP",
        "error": "VJP for PrimIDs.INDEX_ADD is not implemented",
    }
    assert failed.try_.startswith("thunder_fusion_guard.translate_library_ops() before compiling: ")
    long = outside_thunder_row(_split_op("torch.special.zeta", "UNSUPPORTED_NODE", "", "x" * 200 + "\nmore"))
    # whole, never cut (the table wraps it): the error's first line
    assert long.facts == {"split_kind": "UNSUPPORTED_NODE", "error": "x" * 200}
    assert long.reason.endswith(": " + "x" * 200)
    assert long.try_ == "none here: ThunderFX runs it with Inductor"


# Dynamo's message for a break, as torch 2.11 writes it (torch._dynamo.exc.format_graph_break_message).
_BREAK_TEXT = """Failed to trace builtin operator
  Explanation: Dynamo does not know how to trace builtin operator `print` with argument types ['str']
    (has_kwargs False)
  Hint: Avoid calling builtin `print` with argument types ['str'].
  Hint: Please report an issue to PyTorch.

  Developer debug context: builtin print [<class 'ConstantVariable'>] False

 For more details about this graph break, please visit: https://example.org/gb0059.html"""


def test_dynamo_break_reason_is_read_and_its_row_made():
    """Dynamo's message split into its first line, explanation (over lines), hints that name a change and link;
    the row of the statement Dynamo ran in Python: that reason, its hints to try, the user's line."""
    title, explanation, hints, link = th.parse_break_reason(_BREAK_TEXT)
    assert title == "Failed to trace builtin operator"
    assert explanation.endswith("argument types ['str'] (has_kwargs False)")
    assert hints == ("Avoid calling builtin `print` with argument types ['str'].",)  # not "report an issue"
    assert link == "https://example.org/gb0059.html"
    brk = th.GraphBreak(1, title, explanation, hints, link, _BREAK_TEXT, "model.py:7", 'print("step")')
    row = graph_break_row(brk)
    assert (row.kind, row.op, row.source, row.subgraph) == (
        WhyKind.GRAPH_BREAK,
        'print("step")',
        "model.py:7",
        "after dynamo graph 1",
    )
    assert (row.facts["title"], row.facts["explanation"], row.facts["graphs"]) == (title, explanation, [1])
    assert row.try_ == hints[0] and row.detail == _BREAK_TEXT
    # No hint that names a change: the general fix, and Dynamo's page on the break.
    bare = graph_break_row(replace(brk, hints=(), statement=None))
    assert bare.try_.startswith(BREAK_FIX) and link in bare.try_ and bare.op == "graph break"
    # One statement seen breaking several graphs (a recompilation; a callee's break seen from its caller too) is
    # one row; the rest of the function ran in Python where no graph resumed it after any of them.
    (row,) = graph_break_rows([brk, replace(brk, graph=3, function="inner", resumed=False)])
    assert row.subgraph == "after dynamo graphs 1, 3" and row.count == 1
    assert (row.facts["function"], row.facts["resumed"], row.facts["graphs"]) == ("inner", False, [1, 3])
    assert graph_break_row(brk).facts["resumed"] is True


def test_split_rows_consecutive_and_dataflow(claimed_program):
    """Two torchcompile regions around the claimed mul: consecutive fusion could not take the op between,
    dataflow fusion would have made a cycle through it."""
    trace = thunder.last_traces(claimed_program)[-1]
    (row,) = split_rows(trace, context_of(claimed_program))
    assert row.kind == WhyKind.SPLIT and row.op == "TorchCompile0 | TorchCompile1" and row.ops == ["claimed_mul"]
    assert row.executor == "torchcompile"
    assert row.established_by == "consecutive fusion re-run" and row.try_ == "see the rows of the ops between"
    dataflow = _ran(claimed_between, [claims, torch_compile_ex], fusion_type="dataflow")
    (row,) = split_rows(thunder.last_traces(dataflow)[-1], context_of(dataflow))
    assert row.kind == WhyKind.SPLIT and row.ops == ["claimed_mul"]
    assert row.established_by == "dataflow re-run"


def recomputed(x):
    return torch.tanh(x * 2).sin()


def test_computed_in_forward_and_again_in_backward():
    jitted = thunder.jit(recomputed, executors=[torch_compile_ex])
    jitted(torch.randn(4, 4, requires_grad=True)).sum().backward()
    traces = [("forward", thunder.last_traces(jitted)[-1]), ("backward", thunder.last_backward_traces(jitted)[-1])]
    (row,) = recomputed_rows(traces, "dynamo graph 0, thunder_0")
    assert row.kind == WhyKind.REMATERIALIZED and not row.kind.of_ops and row.trace == "backward"
    assert row.facts == {"regions": {"forward": ["TorchCompile0"], "backward": ["TorchCompile1"]}}
    assert row.ops == ["ltorch.mul", "prims.tanh"] and row.count == 2
    assert row.bytes == 3 * 4 * 4 * 4  # what the recomputation reads and writes: x, x * 2 and its tanh (float32 4x4)
    assert row.try_ == "none needed: recomputing saves storing the result for backward"
    assert row.source.endswith(f"test_why_classify.py:{recomputed.__code__.co_firstlineno + 1}")
    assert numbering_gap_rows(traces, None) == []
    (gone,) = numbering_gap_rows(traces[1:], None)  # the backward alone: TorchCompile0 is missing
    assert gone.op == "TorchCompile0" and gone.kind == WhyKind.REMATERIALIZED and gone.trace == "forward"
    assert gone.established_by == "fusion numbering" and gone.executor == "torchcompile"


def test_kinds_know_their_words():
    assert WhyKind("claimed") is WhyKind.CLAIMED and WhyKind.CLAIMED == "claimed" and str(WhyKind.SPLIT) == "split"
    assert [k.rank for k in WhyKind] == list(range(len(WhyKind)))
    assert (WhyKind.SPLIT.label, WhyKind.SPLIT.labels) == ("region split", "regions split")
    assert [k.value for k in WhyKind if k.of_ops] == [
        "claimed",
        "outside_thunder",
        "graph_break",
        "no_translation",
        "checker",
        "option",
        "region_refused",
        "no_fusion_executor",
        "unknown",
    ]
