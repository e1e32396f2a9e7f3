"""ThunderFX: the guard in every split subgraph, the report grouped by subgraph, explain and profile through it."""

import html
import json
import re

import pytest
import thunder
import torch
from einops import rearrange
from helpers import assert_close_all, assert_same, clone_inputs, decision_text
from thunder.dynamo import ThunderCompiler, thunderfx
from thunder.executors.torch_compile import torch_compile_ex

from thunder_fusion_guard import Costs, FusionGuard, explain, profile_regions
from thunder_fusion_guard import _thunder as th
from thunder_fusion_guard.examine.explain import report_of
from thunder_fusion_guard.ops import region_is_metadata_only
from thunder_fusion_guard.regions import find_regions


class Heads(torch.nn.Module):
    """einops rearranges between graph breaks: the first and last subgraphs hold little else."""

    def __init__(self, heads: int = 2, dim: int = 8):
        super().__init__()
        self.heads = heads
        self.proj = torch.nn.Linear(dim, dim)

    def forward(self, x):
        y = rearrange(x, "b s (h d) -> b h s d", h=self.heads)
        torch._dynamo.graph_break()
        z = torch.tanh(self.proj(rearrange(y, "b h s d -> b s (h d)")))
        torch._dynamo.graph_break()
        return rearrange(z, "b s (h d) -> (b h) s d", h=self.heads), y.transpose(-1, -2)


def _model_and_input():
    torch.manual_seed(0)
    return Heads(), torch.randn(2, 3, 8, requires_grad=True)


def _outputs_and_grads(fn, model, x):
    """Outputs, and the gradients of the sum of the outputs for the input and the parameters."""
    (x,) = clone_inputs([x])
    out = fn(x)
    grads = torch.autograd.grad(sum(o.sum() for o in out), [x, *model.parameters()])
    return [o.detach() for o in out], list(grads)


def _final_regions(compiled):
    traces = compiled.last_traces + compiled.last_backward_traces
    return [r for t in traces for r in find_regions(t)]


def _metadata_only(compiled):
    return [r for r in _final_regions(compiled) if region_is_metadata_only(r.body)]


def _run_step(compiled, x):
    out = compiled(*clone_inputs([x]))
    sum(o.sum() for o in out).backward()


def check_against_unguarded_and_eager(make_guarded, make_plain):
    """Guarded equals unguarded ThunderFX to the bit and eager closely, outputs and gradients."""
    model, x = _model_and_input()
    guarded, plain = make_guarded(model), make_plain(model)
    out_g, grads_g = _outputs_and_grads(guarded, model, x)
    out_p, grads_p = _outputs_and_grads(plain, model, x)
    out_e, grads_e = _outputs_and_grads(model, model, x)
    assert_same(out_g, out_p)
    assert_same(grads_g, grads_p)
    assert_close_all(out_g, out_e)
    assert_close_all(grads_g, grads_e)
    return guarded, plain


def test_thunderfx_leaves_no_metadata_only_region_and_groups_the_report():
    guard = FusionGuard(strict=True)
    guarded, plain = check_against_unguarded_and_eager(
        lambda m: thunderfx(m, transforms=[guard], executors=[torch_compile_ex]),
        lambda m: thunderfx(m, executors=[torch_compile_ex]),
    )
    assert _metadata_only(plain), "unguarded ThunderFX has metadata-only regions (the rearranges alone)"
    assert _final_regions(plain) and not _metadata_only(guarded)

    report = report_of(guarded)
    assert len(report.subgraphs) >= 2
    subgraphs = th.thunderfx_subgraphs(guarded)
    assert len(subgraphs) == len(report.subgraphs) == 3
    for sub in subgraphs:
        key = guard.subgraph_of(sub.module)
        entry = report.subgraphs[key]
        assert entry.ops == th.fx_graph_ops(sub.module) and entry.ops
        assert entry.name == f"dynamo graph {sub.graph}, {sub.name}"
    assert "rearrange" in report.subgraphs["subgraph 0"].ops
    assert {d.subgraph for d in report} == set(report.subgraphs)
    for key in report.subgraphs:
        assert {d.trace for d in report.filter(subgraph=key)} == {"forward", "backward"}, key
    rejected = {d.subgraph for d in report.filter(action="reject")}
    assert "subgraph 0" in rejected, "the lone rearrange is rejected"

    text = explain(guarded)
    assert decision_text(text) == str(guard.report)
    headings = [line for line in text.splitlines() if line.startswith("subgraph ")]
    assert [h.split(" (")[0] for h in headings] == list(report.subgraphs)
    assert all("dynamo graph" in h and "rearrange" in h for h in headings)
    assert decision_text(text).splitlines()[-1].endswith("in 3 subgraphs")
    data = json.loads(report.to_json())
    assert set(data["subgraphs"]) == set(report.subgraphs)
    assert data["subgraphs"]["subgraph 1"]["ops"] == report.subgraphs["subgraph 1"].ops


def test_torch_compile_with_thunder_compiler_backend():
    guard = FusionGuard(strict=True)
    backends = {}

    def guarded(model):
        backends["guarded"] = ThunderCompiler(transforms=[guard], executors=[torch_compile_ex])
        return torch.compile(model, backend=backends["guarded"])

    def plain(model):
        backends["plain"] = ThunderCompiler(executors=[torch_compile_ex])
        return torch.compile(model, backend=backends["plain"])

    check_against_unguarded_and_eager(guarded, plain)
    backend = backends["guarded"]
    wrapped = thunderfx_view(backend)
    assert _metadata_only(thunderfx_view(backends["plain"])) and not _metadata_only(wrapped)
    assert decision_text(explain(backend)) == str(guard.report)
    assert len(guard.report.subgraphs) == 3
    assert all(sub.name for sub in guard.report.subgraphs.values()), "explain(backend) names the subgraphs"


def thunderfx_view(backend):
    """The last traces of a ThunderCompiler's subgraphs, the way a thunderfx object gives them."""
    from thunder.dynamo.compiler import ThunderFXCompiledObject

    return ThunderFXCompiledObject(backend, None)


def test_split_reasons_are_recorded():
    """An op Thunder does not support splits the Dynamo graph; the report says why."""

    def with_unsupported(x):
        y = x.reshape(4, 3).t()
        return torch.cummax(y * 2.0, 0)[0].reshape(-1) + 1.0

    guard = FusionGuard(strict=True)
    compiled = thunderfx(with_unsupported, transforms=[guard], executors=[torch_compile_ex])
    x = torch.randn(3, 4)
    torch.testing.assert_close(compiled(x), with_unsupported(x))
    report = report_of(compiled)
    assert len(report.subgraphs) == 2
    for sub in report.subgraphs.values():
        assert sub.split_reasons and "cummax" in sub.split_reasons[0]
    assert "  split: " in explain(compiled)


def _two_cats_thunder_cannot_trace(x):
    """Two ``torch.cat`` with an empty 1-d tensor (torch allows it, Thunder's meta not): ThunderFX splits at each."""
    a = torch.cat([x.sin(), torch.zeros(0)]).cos()
    return torch.cat([a.exp(), torch.zeros(0)]).tanh() * 2


@pytest.mark.usefixtures("no_inductor")
def test_a_split_note_is_listed_once_and_names_the_function_as_the_user_writes_it():
    """Every split at ``torch.cat`` for the same reason is one note, naming ``torch.cat`` (not the repr
    ``<built-in method cat of type object at 0x...>``), with Thunder's reason."""
    compiled = thunderfx(_two_cats_thunder_cannot_trace, executors=[torch_compile_ex], transforms=[FusionGuard()])
    compiled(torch.randn(2, 4))
    notes = {r for sub in report_of(compiled).subgraphs.values() for r in sub.split_reasons}
    assert len(notes) == 1, notes
    (note,) = notes
    assert note.startswith("torch.cat: ") and "concatenate" in note and "0x" not in note
    text = explain(compiled)
    split_lines = [line for line in text.splitlines() if line.lstrip().startswith("split: ") and "as " not in line]
    assert len(split_lines) == 1 and "0x" not in text, text


def test_jitted_report_has_no_subgraph_section():
    import thunder

    guard = FusionGuard()
    jitted = thunder.jit(lambda x: x.reshape(-1).t(), executors=[torch_compile_ex], transforms=[guard])
    jitted(torch.randn(3, 4))
    assert guard.report.subgraphs == {} and "subgraphs" not in guard.report.to_dict()
    text = explain(jitted)
    # no subgraph heading ('subgraph0 (dynamo graph 0, ...), N ops: ...'); a long name may wrap at its underscores
    assert not any(re.match(r"subgraph\d+ \(", line) for line in text.splitlines()), text
    assert decision_text(text).splitlines()[-1] == "FusionGuard: 1 decision (1 reject)"


def test_profile_regions_through_thunderfx():
    model, x = _model_and_input()
    guard = FusionGuard(costs=Costs(cost_model=False))
    compiled = thunderfx(model, transforms=[guard], executors=[torch_compile_ex])
    _run_step(compiled, x)
    profile = profile_regions(compiled, x, reps=2, warmup=0)
    assert profile.function == "Heads" and profile.device == "cpu"
    expected = []
    for sub in th.thunderfx_subgraphs(compiled):
        key = guard.subgraph_of(sub.module)
        fwd, bwd = th.last_traces(sub.jitted)
        expected += [(key, "forward", r.name) for r in find_regions(fwd)]
        expected += [(key, "backward", r.name) for r in find_regions(bwd)]
    assert expected, "compute regions stay"
    assert [(r.subgraph, r.trace, r.region) for r in profile.rows] == expected
    for row in profile.rows:
        assert row.host_us is not None and row.eager_us is not None and row.error is None
    by_key = {(d.subgraph, d.trace, d.region): d for d in profile.decisions}
    for row in profile.rows:
        decision = by_key[(row.subgraph, row.trace, row.region)]
        assert (row.action, row.reason) == (decision.action, decision.reason)
    assert {d.subgraph for d in profile.decisions} == set(guard.report.subgraphs)
    text = str(profile)
    assert "subgraph 0/forward" in text and "no longer in the traces" in text


def test_profile_regions_through_thunderfx_without_a_guard():
    model, x = _model_and_input()
    compiled = thunderfx(model, executors=[torch_compile_ex])
    profile = profile_regions(compiled, x, reps=2, warmup=0)
    labels = {sub.label for sub in th.thunderfx_subgraphs(compiled)}
    assert profile.rows and {r.subgraph for r in profile.rows} <= labels
    assert profile.decisions == []


@pytest.mark.parametrize("bad", [lambda x: x, object()])
def test_thunderfx_subgraphs_needs_a_thunderfx_object(bad):
    with pytest.raises(TypeError, match="not a thunderfx object"):
        th.thunderfx_subgraphs(bad)


class SharedInputs(torch.nn.Module):
    """A graph break between an unbind and its readers: the second subgraph's inputs are views of one tensor."""

    def forward(self, x):
        q, k, v = (x * 2).unbind(0)
        torch._dynamo.graph_break()
        return torch.tanh(q * k + v)


@pytest.mark.usefixtures("no_inductor")
def test_profiling_runs_the_compiled_subgraphs_and_a_recompile_is_labelled():
    """The profiler feeds each subgraph copies of its inputs that share memory as the originals did (else
    Thunder compiled the subgraph again for unaliased inputs, and the report listed it twice, unexplained);
    a subgraph Thunder does compile again is labelled with how often and what differed."""
    x = torch.randn(3, 4, 5, requires_grad=True)
    guard = FusionGuard(costs=Costs(cost_model=False))
    compiled = thunderfx(SharedInputs(), transforms=[guard], executors=[torch_compile_ex])
    _run_step(compiled, x)
    profile_regions(compiled, x, reps=2, warmup=0)
    subs = th.thunderfx_subgraphs(compiled)
    assert len(subs) == 2 and [thunder.cache_misses(s.jitted) for s in subs] == [1, 1]
    second = guard.subgraph_of(subs[1].module)
    assert {d.compile_index for d in guard.report if d.subgraph == second} == {2}
    assert "compiled 2 times" not in explain(compiled)

    # Thunder compiles the second subgraph again for inputs that no longer share memory
    q, k, v = (t.detach().clone().requires_grad_() for t in (x * 2).unbind(0))
    subs[1].jitted(q, k, v)
    assert thunder.cache_misses(subs[1].jitted) == 2
    text = explain(compiled, wide=True)  # the note on one line
    note = (
        "compiled 2 times (GraphModule#2, #3), each time for inputs the compilation before did not accept: "
        "#3 inputs sharing memory: 0,1,2 -> none; each compilation made the same decisions, listed for each"
    )
    assert f"  {note}" in text.splitlines(), text
    report = report_of(compiled)
    assert report.subgraphs[second].recompiles == ["inputs sharing memory: 0,1,2 -> none"]
    assert f"- {note}" in report.to_markdown()
    page = profile_regions(compiled, x, reps=2, warmup=0).to_html()
    shown = "compiled 2 times, each time for inputs the compilation before did not accept: compilation 2 inputs "
    assert html.escape(shown) in page and "shown: the latest compilation" in page
