"""The core guard on CPU with Thunder's torch.compile executor: what is rejected, what stays, outputs."""

import json

import pytest
import torch
from einops import rearrange
from helpers import assert_same, check_three_ways, decision_text, jit_cpu, regions, run_with_grads

from thunder_fusion_guard import FusionGuard, Rewrites, explain
from thunder_fusion_guard.ops import region_is_metadata_only


def rearrange_heads(t):
    return rearrange(t, "b np sq sk -> (b np) sq sk")


def metadata_chain(x):
    y = x.reshape(x.shape[0], -1, x.shape[-1]).permute(0, 2, 1)[:, 1:, :]
    z = y.unsqueeze(1).expand(-1, 2, -1, -1).transpose(2, 3)
    return z.flatten(0, 1).squeeze(), x.unflatten(1, (2, 2)).view(-1)


def mixed(x, w):
    y = rearrange(x, "b h s d -> (b h) s d")
    return torch.tanh(y * w + 1.0), y.transpose(1, 2)


CASES = [
    (rearrange_heads, lambda: [torch.randn(2, 3, 4, 5, requires_grad=True)]),
    (metadata_chain, lambda: [torch.randn(3, 4, 6, 5, requires_grad=True)]),
]


@pytest.mark.parametrize("fn,make", CASES, ids=[c[0].__name__ for c in CASES])
def test_metadata_programs_leave_no_region_and_match(fn, make):
    guard = FusionGuard(strict=True)
    guarded, plain = check_three_ways(fn, make(), guard, exact_eager=True)
    assert regions(plain), "unguarded thunder should have made a region here"
    assert regions(guarded) == []
    assert not [r for r in regions(guarded, backward=True) if region_is_metadata_only(r.body)]
    rejected = guard.report.filter(action="reject")
    assert "forward" in {d.trace for d in rejected}
    assert all(d.details["decided_by"] == "metadata" for d in rejected)
    region_decisions = [d for d in guard.report if d.action in ("keep", "reject")]
    assert len(rejected) + len(regions(guarded, backward=True)) == len(region_decisions)


def test_outputs_that_are_views_in_eager_stay_views():
    x = torch.randn(2, 3, 4, 5)
    out = jit_cpu(rearrange_heads, FusionGuard())(x)
    assert out._base is x
    x.add_(1.0)
    assert torch.equal(out, rearrange_heads(x))


def test_compute_regions_stay():
    x, w = torch.randn(2, 3, 4, 5, requires_grad=True), torch.randn(5, requires_grad=True)
    guard = FusionGuard(strict=True)
    guarded, plain = jit_cpu(mixed, guard), jit_cpu(mixed)
    out_g, grad_g = run_with_grads(guarded, [x, w])
    out_p, grad_p = run_with_grads(plain, [x, w])
    assert_same(out_g, out_p)
    assert_same(grad_g, grad_p)
    assert [r.ops for r in regions(guarded)] == [r.ops for r in regions(plain)]
    assert guard.report.filter(action="reject") == []
    assert {d.action for d in guard.report} == {"keep"}


def test_report_fields_json_and_explain():
    guard = FusionGuard()
    jitted = jit_cpu(rearrange_heads, guard)
    jitted(torch.randn(2, 3, 4, 5, requires_grad=True)).sum().backward()
    (fwd,) = guard.report.filter(trace="forward")
    assert (fwd.region, fwd.executor, fwd.ops, fwd.action) == ("TorchCompile0", "torchcompile", ["reshape"], "reject")
    assert fwd.function == "rearrange_heads" and fwd.applied
    data = json.loads(json.dumps(guard.report.to_dict()))
    assert data["counts"] == {"reject": 2}
    assert {"trace", "region", "executor", "ops", "action", "reason"} <= set(data["decisions"][0])
    text = explain(jitted)
    assert fwd.code == "metadata_only" and fwd.reason in " ".join(text.split())  # the table shows the reason
    assert "TorchCompile0" in text and "2 reject" in text
    assert decision_text(text) == str(guard.report)


def test_decisions_accumulate_across_recompilations():
    guard = FusionGuard()
    jitted = jit_cpu(rearrange_heads, guard)
    jitted(torch.randn(2, 3, 4, 5))
    jitted(torch.randn(2, 3, 6, 5))
    jitted(torch.randn(2, 3, 6, 5))
    assert [d.compile_index for d in guard.report] == [1, 2]


def test_explain_needs_a_guard():
    with pytest.raises(ValueError, match="no FusionGuard"):
        explain(jit_cpu(rearrange_heads))


def test_report_only_changes_nothing():
    guard = FusionGuard(report_only=True)
    jitted = jit_cpu(rearrange_heads, guard)
    jitted(torch.randn(2, 3, 4, 5))
    assert len(regions(jitted)) == 1
    (d,) = guard.report
    assert d.action == "reject" and d.applied is False
    assert "not applied" in str(guard.report)


def test_executors_option_limits_the_guard():
    guard = FusionGuard(executors=["torchcompile_cat"])
    jitted = jit_cpu(rearrange_heads, guard)
    jitted(torch.randn(2, 3, 4, 5))
    assert len(regions(jitted)) == 1
    (d,) = guard.report
    assert d.action == "keep" and d.details["decided_by"] == "option" and d.executor != "torchcompile_cat"


def test_metadata_ops_option_counts_extra_ops():
    def scale(x):
        return x * 2.0

    guard = FusionGuard(rewrites=Rewrites(metadata_ops=["mul"]))
    jitted = jit_cpu(scale, guard)
    x = torch.randn(4, 4)
    assert torch.equal(jitted(x), x * 2.0)
    assert regions(jitted) == []


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        ({"bogus": 1}, TypeError, "FusionGuard\\(\\) got an unexpected keyword argument .bogus."),
        ({"report_only": "yes"}, ValueError, "'report_only' must be True or False"),
        ({"strict": 1}, ValueError, "'strict'"),
        ({"executors": "nvfuser"}, ValueError, "'executors' must be a list"),
        ({"executors": ["no_such_executor"]}, ValueError, "unknown fusion executors \\['no_such_executor'\\]"),
        ({"rewrites": {"metadata_ops": [1]}}, ValueError, "'rewrites.metadata_ops'"),
    ],
)
def test_bad_options(kwargs, error, match):
    with pytest.raises(error, match=match):
        FusionGuard(**kwargs)


def test_positional_options_are_refused():
    with pytest.raises(TypeError):
        FusionGuard(True)


def test_signature_is_the_options():
    """FusionGuard takes exactly GuardOptions' fields, keyword-only, with their defaults: declared once."""
    import dataclasses
    import inspect

    from thunder_fusion_guard.options import GuardOptions

    params = inspect.signature(FusionGuard).parameters
    fields = dataclasses.fields(GuardOptions)
    assert list(params) == [f.name for f in fields]
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in params.values())
    assert [p.default for p in params.values()] == [f.default for f in fields]
    assert [p.annotation for p in params.values()] == [f.metadata["accepts"] or f.type for f in fields]
    assert FusionGuard().options == GuardOptions()
    # Written out in the source (what an IDE reads), not patched on at import.
    assert "__signature__" not in vars(FusionGuard.__init__)
    assert list(inspect.signature(FusionGuard.__init__.__wrapped__).parameters)[1:] == list(params)


def test_every_option_has_a_one_line_doc():
    from thunder_fusion_guard.options import documented

    for name, _, doc in documented():
        assert doc and "\n" not in doc, name


def test_unknown_option_lists_the_options():
    with pytest.raises(TypeError) as caught:
        FusionGuard(hoist=True, bogus=1)
    message = str(caught.value)
    assert "\n" not in message and "'bogus'" in message
    assert message.endswith(
        "its options are executors, report_only, strict, costs, exact_only, choose_executor, rewrites, "
        "compare_ranks, ordered_einsum, hoist, runtime, rescue"
    )


def _cummax_exp(x):
    y = torch.tanh(x * 2.0)
    return torch.cummax(y, 0)[0].exp() + 1.0  # cummax is not Thunder's: ThunderFX splits the graph


def test_explain_says_which_dynamo_graphs_run_the_split_without_inductors_whole_graph_timed():
    """Under ThunderFX, where unguarded Thunder runs a Dynamo graph the guard keeps its split (Thunder's bits) and never
    times Inductor's whole graph unasked: explain counts those graphs and names what times it; a graph whose whole
    graph was timed, or a choice made by choose_backends, ends the line; thunder.jit has none."""
    from helpers import without_inductor
    from thunder.dynamo import thunderfx

    from thunder_fusion_guard import fusion_executors
    from thunder_fusion_guard.examine.explain import report_of

    with without_inductor():
        compiled = thunderfx(_cummax_exp, executors=fusion_executors("cpu"), transforms=[FusionGuard()])
        compiled(torch.randn(4, 3))
    line = "inductor: Dynamo graphs run as ThunderFX split them, for unguarded Thunder's bits: 1 of 1;"
    assert line in " ".join(explain(compiled, wide=True).split())
    assert "whole_graphs=True" in explain(compiled)
    report = report_of(compiled)  # a graph whose whole graph was timed: tests/test_whole_graph.py
    report.backend_choices.append({"subgraph": "dynamo graph 0, thunder_0", "chosen": "thunder", "reason": "r"})
    assert "inductor: Dynamo graphs" not in explain(compiled)
    guard = FusionGuard()
    jitted = jit_cpu(lambda x: torch.tanh(x * 2.0).exp() + 1.0, guard)
    jitted(torch.randn(4, 3))
    assert "inductor: Dynamo graphs" not in explain(jitted)
