"""choose_backends: each ThunderFX subgraph run by the backend that times fastest (Thunder, Inductor, eager).

Timings are injected (``interleaved_us`` replaced): no verdict depends on the clock. Outputs stay Thunder's
bit for bit where Thunder is kept, and close to eager where another backend is chosen.
"""

from __future__ import annotations

import pytest
import torch
from thunder.dynamo import thunderfx

import thunder_fusion_guard.backend_choice as backends
import thunder_fusion_guard.whole_graph as whole_graph
from thunder_fusion_guard import FusionGuard, choose_backends, fusion_executors
from thunder_fusion_guard.measure.timing import HostDevice


def two_pieces(x, w):
    y = torch.nn.functional.gelu(x @ w) * 2.0
    torch._dynamo.graph_break()
    return (y.sin() + 1.0).sum()


def inputs():
    g = torch.Generator().manual_seed(0)
    return torch.randn(16, 16, generator=g).requires_grad_(), torch.randn(16, 16, generator=g).requires_grad_()


def compiled(guard=None):
    return thunderfx(two_pieces, executors=fusion_executors("cpu"), transforms=[guard] if guard else [])


@pytest.fixture(autouse=True)
def fresh_dynamo():
    """Every test compiles two_pieces afresh: Dynamo's per-function recompile limit would otherwise run it eagerly."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.fixture
def timings(monkeypatch):
    """``timings(thunder=..., inductor=..., eager=...)``: the median µs each backend is timed at."""
    calls: list[int] = []

    def set_times(**us: float) -> list[int]:
        def interleaved_us(fns, args, **kwargs):
            calls.append(len(fns))
            order = [n for n in backends.BACKENDS if n in us][: len(fns)]
            return [[us[n]] * 5 for n in order]

        monkeypatch.setattr(backends, "interleaved_us", interleaved_us)
        return calls

    return set_times


THUNDER_OR_EAGER = ("thunder", "eager")  # no Inductor compile (seconds per subgraph on a cold cache)


def run(fn, args):
    args = [a.detach().clone().requires_grad_() for a in args]
    out = fn(*args)
    out.backward()
    return out.detach(), [a.grad for a in args]


def assert_as_eager(fx) -> None:
    """``fx``'s output and gradients on fresh inputs, within tolerance of eager's (:func:`two_pieces`)."""
    out, grads = run(fx, inputs())
    expected, expected_grads = run(two_pieces, inputs())
    torch.testing.assert_close(out, expected)
    for got, want in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(got, want)


def runners(fx):
    """The type of what each split GraphModule calls for its Thunder piece."""
    return {type(info.split_graph_module.thunder_0).__name__ for info in fx._backend.subgraph_infos}


# Inductor compiles each subgraph forward and backward (seconds on a cold cache): its case is a long form; the
# README snippet runs it end to end in the default run.
@pytest.mark.parametrize("winner", ["eager", pytest.param("inductor", marks=pytest.mark.slow)])
def test_a_faster_backend_takes_the_subgraph_and_the_report_says_so(timings, winner):
    times = {"thunder": 100.0, "inductor": 40.0, "eager": 60.0} if winner == "inductor" else {"thunder": 100.0}
    times.setdefault("eager", 40.0)
    timings(**times)
    backends_asked = tuple(times) if winner == "inductor" else THUNDER_OR_EAGER
    g = FusionGuard()
    fx = compiled(g)
    choices = choose_backends(fx, *inputs(), backends=backends_asked, guard=g)
    assert [c.chosen for c in choices] == [winner, winner]
    assert all(c.backward and c.times_us == times for c in choices)
    assert all(n in choices[0].reason for n in ("60%", "100.0 µs", "40.0 µs")), choices[0].reason  # its numbers
    assert runners(fx) == {"_Chosen"}
    assert_as_eager(fx)
    assert [c["chosen"] for c in g.report.to_dict()["backend_choices"]] == [winner, winner]
    assert f"backend of dynamo graph 0, thunder_0: {winner}: {winner} is faster by 60%" in str(g.report)


def test_eager_can_be_chosen(timings):
    timings(thunder=100.0, eager=30.0)
    fx = compiled()
    assert [c.chosen for c in choose_backends(fx, *inputs(), backends=THUNDER_OR_EAGER)] == ["eager", "eager"]
    assert runners(fx) == {"_Chosen"}
    torch.testing.assert_close(run(fx, inputs())[0], run(two_pieces, inputs())[0])


@pytest.mark.parametrize("faster", [100.0, 95.0])  # Thunder fastest; another faster, but inside the 10% margin
def test_thunder_is_kept_with_its_bits_unless_another_beats_it_by_the_margin(timings, faster):
    timings(thunder=100.0, eager=faster)
    before = run(compiled(), inputs())
    fx = compiled()
    choices = choose_backends(fx, *inputs(), backends=THUNDER_OR_EAGER)
    assert [c.chosen for c in choices] == ["thunder", "thunder"]
    assert all(c.times_us == {"thunder": 100.0, "eager": faster} and not c.problems for c in choices)  # both timed
    assert runners(fx) == {"ThunderModule"}
    after = run(fx, inputs())
    assert torch.equal(after[0], before[0]) and all(map(torch.equal, after[1], before[1]))


def test_a_backend_that_fails_is_named_and_left_out(timings, monkeypatch):
    calls = timings(thunder=100.0, eager=50.0)

    def broken(*args, **kwargs):
        raise RuntimeError("no inductor today")

    monkeypatch.setattr(torch._inductor, "compile", broken)
    choices = choose_backends(compiled(), *inputs())
    assert [c.chosen for c in choices] == ["eager", "eager"]
    assert choices[0].problems == {"inductor": "RuntimeError: no inductor today"}
    assert calls == [2, 2]


def test_only_the_backends_asked_for_are_timed_and_chosen_subgraphs_stay_chosen(timings):
    calls = timings(thunder=100.0, eager=10.0)
    fx = compiled()
    assert [c.chosen for c in choose_backends(fx, *inputs(), backends=("thunder", "eager"))] == ["eager", "eager"]
    assert calls == [2, 2]
    assert choose_backends(fx, *inputs()) == []


def test_a_forward_only_call_is_timed_forward_only(timings):
    timings(thunder=100.0, eager=70.0)
    x, w = (t.detach() for t in inputs())
    choices = choose_backends(compiled(), x, w, backends=THUNDER_OR_EAGER)
    assert choices and not any(c.backward for c in choices)
    assert choices[0].times_us == {"thunder": 100.0, "eager": 70.0}  # a forward each, timed


@pytest.mark.parametrize(
    ("kwargs", "error", "text"),
    [
        ({"backends": ("inductor",)}, ValueError, "option 'backends' must name 'thunder'"),
        ({"backends": ("thunder", "tvm")}, ValueError, "option 'backends'"),
        ({"margin": 1.5}, ValueError, "option 'margin' must be a number in [0, 1)"),
        ({"rounds": 0}, ValueError, "option 'rounds' must be a whole number >= 1"),
        ({"option_compiles_s": -1}, ValueError, "option 'option_compiles_s' must be a finite number of seconds >= 0"),
        ({"option_compiles_s": float("inf")}, ValueError, "option 'option_compiles_s'"),
    ],
)
def test_bad_options_are_named(kwargs, error, text):
    with pytest.raises(error) as e:
        choose_backends(compiled(), *inputs(), **kwargs)
    assert text in str(e.value)


def test_not_a_thunderfx_object_is_a_type_error():
    with pytest.raises(TypeError, match="choose_backends: function is not a thunderfx"):
        choose_backends(two_pieces, *inputs())


def test_inputs_are_copied_with_their_strides():
    base = torch.randn(4, 6)
    view = base[:, 1:5].t()
    copied = backends.copy_input(view)
    assert copied.stride() == view.stride() and torch.equal(copied, view) and copied.data_ptr() != view.data_ptr()


def test_a_chosen_backend_failing_on_a_later_call_hands_the_subgraph_back_to_thunder(timings):
    timings(thunder=100.0, eager=30.0)
    g = FusionGuard()
    fx = compiled(g)
    choices = choose_backends(fx, *inputs(), backends=THUNDER_OR_EAGER, guard=g)
    first = next(info.split_graph_module.thunder_0 for info in fx._backend.subgraph_infos)

    class Broken(torch.nn.Module):
        def forward(self, *args):
            raise RuntimeError("stride mismatch")

    first.backend = Broken()
    with pytest.warns(RuntimeWarning, match="eager failed on dynamo graph 0, thunder_0 .*runs on Thunder from now on"):
        out = run(fx, inputs())
    torch.testing.assert_close(out[0], run(two_pieces, inputs())[0])
    assert choices[0].problems == {"eager": "failed on a call, back on Thunder: RuntimeError: stride mismatch"}
    assert "eager failed: failed on a call, back on Thunder: RuntimeError: stride mismatch" in str(g.report)
    assert runners(fx) == {"ThunderModule", "_Chosen"}


def test_each_subgraph_is_timed_on_inputs_made_after_the_choices_before_it(timings, monkeypatch):
    """A backend chosen for one subgraph may hand the next its tensors in other strides: the next is recorded
    on a call made after that choice (each piece's runner as the recording call saw it)."""
    timings(thunder=100.0, eager=30.0)
    fx = compiled()
    seen = []
    record = backends._record_inputs

    def spy(compiled_, subs, args, kwargs):
        pieces = [type(i.split_graph_module.thunder_0).__name__ for i in fx._backend.subgraph_infos]
        seen.append((subs[0].label, pieces))
        return record(compiled_, subs, args, kwargs)

    monkeypatch.setattr(backends, "_record_inputs", spy)
    choose_backends(fx, *inputs(), backends=THUNDER_OR_EAGER)
    assert seen == [
        ("dynamo graph 0, thunder_0", ["ThunderModule", "ThunderModule"]),
        ("dynamo graph 1, thunder_0", ["_Chosen", "ThunderModule"]),
    ]


def bucketed(x, table):
    """A second dynamo graph that adds to the index it receives in place, as Hugging Face T5's relative-position
    buckets do (``relative_buckets += ...``): every run of that graph on one set of inputs reads other indices."""
    idx = (x.abs() * 2).long() % 4
    torch._dynamo.graph_break()
    idx += 1
    return table[idx].sum() + x.sum()


def test_a_subgraph_that_updates_its_inputs_in_place_is_kept_on_thunder_untimed(timings):
    """Timed again and again on one recorded set of inputs, such a subgraph would index past its table (on CUDA
    a device-side assert that ends the process); it is kept on Thunder, the reason naming the input, and the
    program's results are unguarded Thunder's."""
    calls = timings(thunder=100.0, eager=10.0)
    g = torch.Generator().manual_seed(0)
    x, table = torch.randn(8, generator=g), torch.randn(5, generator=g)
    fx = thunderfx(bucketed, executors=fusion_executors("cpu"))
    expected = bucketed(x, table)
    choices = choose_backends(fx, x, table, backends=THUNDER_OR_EAGER)
    mutating = [c for c in choices if c.in_place]
    assert len(mutating) == 1 and mutating[0].chosen == "thunder" and mutating[0].times_us == {}
    assert mutating[0].in_place == [0]
    assert calls == [2] * (len(choices) - 1)  # the others were timed
    assert torch.equal(fx(x, table), expected)


def scaled_rows(x, row):
    return torch.sin(x) * row + 1.0


def test_a_subgraph_given_an_expanded_input_is_timed_on_a_copy_with_the_same_strides(timings):
    """An input whose elements share memory (an ``expand``, as T5's position bias) cannot be copied into its own
    layout; the copy keeps its sizes and strides all the same, and the choice is made and used."""
    calls = timings(thunder=100.0, eager=10.0)
    g = torch.Generator().manual_seed(0)
    x, row = torch.randn(4, 8, generator=g), torch.randn(1, 8, generator=g).expand(4, 8)
    fx = thunderfx(scaled_rows, executors=fusion_executors("cpu"))
    choices = choose_backends(fx, x, row, backends=THUNDER_OR_EAGER)
    assert [c.chosen for c in choices] == ["eager"] and calls == [2]
    assert torch.equal(fx(x, row), scaled_rows(x, row))
    copied = backends.copy_input(row)
    assert copied.stride() == (0, 1) and torch.equal(copied, row) and copied.data_ptr() != row.data_ptr()


def test_a_subgraph_whose_inputs_cannot_be_copied_stays_on_thunder_and_the_call_goes_on(monkeypatch, timings):
    calls = timings(thunder=100.0, eager=10.0)
    x, row = torch.randn(4, 8), torch.randn(1, 8).expand(4, 8)
    fx = thunderfx(scaled_rows, executors=fusion_executors("cpu"))
    expected = fx(x, row)

    def refuse(t):
        raise RuntimeError("no copy")

    monkeypatch.setattr(backends, "copy_input", refuse)
    [choice] = choose_backends(fx, x, row, backends=THUNDER_OR_EAGER)
    assert choice.chosen == "thunder" and calls == [] and choice.times_us == {}
    assert choice.problems == {"copy": "RuntimeError: no copy"} and not choice.in_place
    assert torch.equal(fx(x, row), expected)


def _time_in_turn(monkeypatch, times) -> None:
    """Timings injected: a subgraph timed on Thunder alone 1 µs (it stays there); each pair timed takes the next two
    of ``times`` (lists of samples)."""

    def interleaved_us(fns, args, **kwargs):
        if len(fns) == 1:
            return [[1.0] * 5]
        return [next(times), next(times)]

    monkeypatch.setattr(backends, "interleaved_us", interleaved_us)


def test_a_dynamo_graph_runs_whole_by_inductor_where_that_beats_its_split(monkeypatch):
    """``whole_graphs``: each Dynamo graph timed as ThunderFX runs it (its split) against Inductor's compile of
    all of it; the faster by the margin runs it, the values eager's within tolerance. Timings injected: the split
    of graph 0 slower, of graph 1 faster."""
    # graph 0: split, whole, then whole against all its options together (not faster), then one at a time: against
    # its small matmuls decomposed (not faster), then against its small-result matmuls summed (faster), then against
    # larger-result ones summed too (slower); graph 1: split, whole; then graph 1 again
    graph_0 = [[100.0] * 5, [40.0] * 5, [40.0] * 5, [42.0] * 5, [40.0] * 5, [45.0] * 5, [40.0] * 5, [30.0] * 5]
    graph_0 += [[30.0] * 5, [35.0] * 5]
    times = iter([*graph_0, [50.0] * 5, [60.0] * 5, [50.0] * 5, [60.0] * 5])
    _time_in_turn(monkeypatch, times)
    g = FusionGuard()
    fx = compiled(g)
    choices = choose_backends(fx, *inputs(), backends=("thunder",), guard=g, whole_graphs=True)
    whole = [c for c in choices if c.subgraph.endswith("(whole)")]
    assert [(c.subgraph, c.chosen) for c in whole] == [
        ("dynamo graph 0 (whole)", "inductor with small-result matmuls summed"),
        ("dynamo graph 1 (whole)", "split"),
    ]
    assert whole[0].times_us == {
        "split": 100.0,
        "inductor": 40.0,
        "inductor with all options": 42.0,
        "inductor with small matmuls decomposed": 45.0,
        "inductor with small-result matmuls summed": 30.0,
        "inductor with larger-result matmuls summed": 35.0,
    }
    assert whole[0].backward
    infos = fx._backend.subgraph_infos
    assert type(vars(infos[0].split_graph_module)["forward"]).__name__ == "WholeGraphRun"
    assert "forward" not in vars(infos[1].split_graph_module)
    assert_as_eager(fx)
    said = "backend of dynamo graph 0 (whole): inductor with small-result matmuls summed: Inductor runs the whole graph"
    assert said in str(g.report)
    # whole graphs first: graph 0, run whole, calls its piece no more, so the piece is never timed
    assert [c.subgraph for c in choices] == [
        "dynamo graph 0 (whole)",
        "dynamo graph 1 (whole)",
        "dynamo graph 1, thunder_0",
    ]
    again = choose_backends(fx, *inputs(), backends=("thunder",), whole_graphs=True)
    # graph 0, run whole now, is left as it is: neither it nor its piece is timed again
    assert [c.subgraph for c in again] == ["dynamo graph 1 (whole)", "dynamo graph 1, thunder_0"]


def test_a_dynamo_graph_runs_whole_by_inductors_faster_option_where_its_defaults_lose_to_the_split(monkeypatch):
    """Where Inductor's default whole graph is not faster than the split by the margin but its compile with its small
    matmuls rewritten is, that compile is timed against the split again and runs the graph. Timings injected."""
    # graph 0: split 100 against whole 95; whole 95 against all its options together 96; whole 95 against its
    # matmuls decomposed 50; that 50 against them summed 55; split 100 against the 50; graph 1 (no matmuls): split 50
    # against whole 60
    graph_0 = [[100.0] * 5, [95.0] * 5, [95.0] * 5, [96.0] * 5, [95.0] * 5, [50.0] * 5, [50.0] * 5, [55.0] * 5]
    graph_0 += [[100.0] * 5, [50.0] * 5]
    times = iter([*graph_0, [50.0] * 5, [60.0] * 5])
    _time_in_turn(monkeypatch, times)
    fx = compiled(FusionGuard())
    choices = choose_backends(fx, *inputs(), backends=("thunder",), whole_graphs=True)
    whole = [c for c in choices if c.subgraph.endswith("(whole)")]
    assert [c.chosen for c in whole] == ["inductor with small matmuls decomposed", "split"]
    assert whole[0].times_us == {
        "split": 100.0,
        "inductor": 50.0,
        "inductor with all options": 96.0,
        "inductor with small matmuls decomposed": 50.0,
        "inductor with small-result matmuls summed": 55.0,
    }
    assert type(vars(fx._backend.subgraph_infos[0].split_graph_module)["forward"]).__name__ == "WholeGraphRun"
    assert_as_eager(fx)


def test_a_dynamo_graph_runs_whole_by_inductor_with_all_its_options_compiled_once_where_they_are_faster(monkeypatch):
    """Inductor's options compiled together first: where that compile beats the default one, it runs the graph and
    no option is compiled alone. Timings injected."""
    # graph 0: split 100 against whole 40; whole 40 against all its options 20; graph 1 (no matmuls): split, whole
    times = iter([[100.0] * 5, [40.0] * 5, [40.0] * 5, [20.0] * 5, [50.0] * 5, [60.0] * 5])
    _time_in_turn(monkeypatch, times)
    fx = compiled(FusionGuard())
    choices = choose_backends(fx, *inputs(), backends=("thunder",), whole_graphs=True)
    whole = [c for c in choices if c.subgraph.endswith("(whole)")]
    chosen = "inductor with small matmuls decomposed and small-result matmuls summed and larger-result matmuls summed"
    assert [c.chosen for c in whole] == [chosen, "split"]
    assert whole[0].times_us == {"split": 100.0, "inductor": 40.0, "inductor with all options": 20.0}
    assert_as_eager(fx)


def test_with_no_seconds_for_inductors_options_none_is_compiled_and_each_says_why(monkeypatch):
    """``option_compiles_s=0``: Inductor's default compile of the whole graph is timed against the split and runs
    it; none of its options is compiled, each named with why. Timings injected."""
    times = iter([[100.0] * 5, [40.0] * 5, [50.0] * 5, [60.0] * 5])  # graph 0: split, whole; graph 1 the same
    _time_in_turn(monkeypatch, times)
    compiles = []
    real = whole_graph.compile_fx_module
    monkeypatch.setattr(whole_graph, "compile_fx_module", lambda *a: compiles.append(a[3:]) or real(*a))
    fx = compiled(FusionGuard())
    choices = choose_backends(fx, *inputs(), backends=("thunder",), whole_graphs=True, option_compiles_s=0)
    whole = [c for c in choices if c.subgraph.endswith("(whole)")]
    assert [c.chosen for c in whole] == ["inductor", "split"]
    assert compiles == [(), ()]  # each graph's default compile only
    assert set(whole[0].problems) == {
        "inductor with all options",
        "inductor with small matmuls decomposed",
        "inductor with small-result matmuls summed",
    }
    assert all(why.startswith("not compiled") for why in whole[0].problems.values())
    assert_as_eager(fx)


def test_inductors_options_faster_on_the_stream_but_dearer_on_the_device_are_not_taken(monkeypatch):
    """On CUDA (said so here) every compile of Inductor's is timed with host and device apart too: its options
    compiled together, faster on the stream for fewer launches but 20% dearer on the device, do not run the graph (a
    step replayed in CUDA graphs would be slower); the options one at a time then, each level on the device, do.
    Timings injected."""
    # graph 0: split 100 against whole 40; whole 40 against all options 20; against decomposed 45; against summed
    # 30; summed 30 against larger results summed 35; graph 1 (no matmuls): split 50 against whole 60
    graph_0 = [[100.0] * 5, [40.0] * 5, [40.0] * 5, [20.0] * 5, [40.0] * 5, [45.0] * 5, [40.0] * 5, [30.0] * 5]
    times = iter([*graph_0, [30.0] * 5, [35.0] * 5, [50.0] * 5, [60.0] * 5])
    _time_in_turn(monkeypatch, times)
    devices = iter([(10.0, 10.0), (10.0, 12.0), (10.0, 10.0), (10.0, 10.0), (10.0, 10.0), (10.0, 10.0)])

    def host_device_us(fns, args, **kwargs):
        assert kwargs["cuda"] is True and len(fns) == 2
        return [HostDevice(50.0, us) for us in next(devices)]

    monkeypatch.setattr(backends, "host_device_us", host_device_us)
    monkeypatch.setattr(whole_graph, "uses_cuda", lambda *a: True)
    fx = compiled(FusionGuard())
    choices = choose_backends(fx, *inputs(), backends=("thunder",), whole_graphs=True)
    whole = [c for c in choices if c.subgraph.endswith("(whole)")]
    assert [c.chosen for c in whole] == ["inductor with small-result matmuls summed", "split"]
    assert whole[0].times_us["inductor with all options"] == 20.0
    assert whole[0].problems == {"inductor with all options": "dearer on the device, so not taken"}
    assert "with all options 20.0 µs (12.0 on the device against 10.0)" in whole[0].reason
    assert next(devices, None) is None  # every pair timed apart


def test_whole_graphs_is_true_or_false():
    with pytest.raises(ValueError, match="choose_backends option 'whole_graphs' must be True or False, got 1"):
        choose_backends(compiled(), *inputs(), whole_graphs=1)
