"""profile_regions on CPU: one row per region of the final traces, real inputs, decisions, JSON, plot."""

import contextvars
import html
import json

import pytest
import thunder
import torch
from einops import rearrange
from helpers import jit_cpu, regions

from thunder_fusion_guard import Costs, FusionGuard, profile_regions
from thunder_fusion_guard import _thunder as th
from thunder_fusion_guard.examine import profile_rows
from thunder_fusion_guard.examine.profile import RegionRow
from thunder_fusion_guard.wording import error_line

# The subject is not the code Inductor generates: regions run uncompiled (helpers.without_inductor).
pytestmark = pytest.mark.usefixtures("no_inductor_module")


def mixed(x, w):
    y = rearrange(x, "b h s d -> (b h) s d")
    return torch.tanh(y * w + 1.0), y.transpose(1, 2)


def broadcast_rows(x):
    """Metadata-only forward (rejected by the guard), a reducing backward (kept)."""
    return x.expand(3, -1, -1)


def bump(x):
    x.add_(1.0)
    return x * 2.0


def _inputs(requires_grad: bool):
    return torch.randn(2, 3, 4, 5, requires_grad=requires_grad), torch.randn(5, requires_grad=requires_grad)


def test_rows_describe_every_region_with_real_inputs():
    x, w = _inputs(requires_grad=True)
    jitted = jit_cpu(mixed)
    profile = profile_regions(jitted, x, w, reps=3, warmup=1)
    assert [(r.trace, r.region) for r in profile.rows] == [
        *(("forward", r.name) for r in regions(jitted)),
        *(("backward", r.name) for r in regions(jitted, backward=True)),
    ]
    assert {r.trace for r in profile.rows} == {"forward", "backward"}
    fwd = profile.rows[0]
    assert fwd.executor == "torchcompile" and fwd.n_ops == len(fwd.ops) and "tanh" in fwd.ops
    assert fwd.input_bytes == (x.numel() + w.numel()) * 4
    assert fwd.output_bytes > 0
    for row in profile.rows:
        assert row.host_us is not None and row.eager_us is not None and row.error is None
        assert row.device_us is None and row.kernels is None and row.overhead_us is None
        assert row.excess_us == pytest.approx(row.host_us - row.eager_us)
        assert row.action is None
    assert profile.device == "cpu" and profile.function == "mixed" and profile.decisions == []


def test_forward_only_when_nothing_requires_grad():
    profile = profile_regions(jit_cpu(mixed), *_inputs(requires_grad=False), reps=2, warmup=0)
    assert profile.rows and {r.trace for r in profile.rows} == {"forward"}


def test_decisions_attached_and_rejected_regions_listed():
    guard = FusionGuard(costs=Costs(cost_model=False))
    jitted = jit_cpu(broadcast_rows, guard)
    profile = profile_regions(jitted, torch.randn(1, 4, 5, requires_grad=True), reps=2, warmup=0)
    assert [r.trace for r in profile.rows] == ["backward"]
    assert profile.decisions and all(d.compile_index == 1 for d in profile.decisions)
    for row in profile.rows:
        (decision,) = [d for d in profile.decisions if (d.trace, d.region) == (row.trace, row.region)]
        assert (row.action, row.reason) == (decision.action, decision.reason)
    shown = {(r.trace, r.region) for r in profile.rows}
    gone = [d for d in profile.decisions if (d.trace, d.region) not in shown]
    assert gone and all(d.action == "reject" for d in gone)
    text = str(profile)
    assert "no longer in the traces" in text and "metadata-only" in text
    assert all(r.region in text for r in profile.rows)


def test_latest_compilation_decisions_only():
    guard = FusionGuard(costs=Costs(cost_model=False))
    jitted = jit_cpu(mixed, guard)
    jitted(*_inputs(requires_grad=False))
    profile = profile_regions(jitted, torch.randn(2, 3, 6, 5), torch.randn(5), reps=2, warmup=0)
    assert {d.compile_index for d in guard.report} == {1, 2}
    assert {d.compile_index for d in profile.decisions} == {2}


def test_json_round_trip():
    profile = profile_regions(jit_cpu(mixed, FusionGuard()), *_inputs(requires_grad=True), reps=2, warmup=0)
    data = json.loads(profile.to_json())
    assert data["device"] == "cpu" and data["reps"] == 2
    assert len(data["rows"]) == len(profile.rows) and len(data["decisions"]) == len(profile.decisions)
    assert set(data["rows"][0]) == set(RegionRow.__dataclass_fields__)
    assert {"trace", "region", "action", "reason"} <= set(data["decisions"][0])


def test_program_is_restored_and_inplace_regions_replay_on_copies():
    a = torch.zeros(3)
    jitted = jit_cpu(bump)
    profile = profile_regions(jitted, a, reps=5, warmup=2)
    assert torch.equal(a, torch.full((3,), 2.0)), "only the two calls of the function itself may write into a"
    assert profile.rows and profile.rows[0].host_us is not None
    cache = thunder.compile_stats(jitted).interpreter_cache
    before = list(cache)
    jitted(a)
    assert [e is b for e, b in zip(cache, before, strict=True)] == [True] * len(before)


def test_recording_needs_a_compiled_program():
    with pytest.raises(RuntimeError, match="call the jitted function first"), th.recording_fusion_calls(jit_cpu(mixed)):
        pass
    with pytest.raises(TypeError, match=r"not a thunder\.jit function"), th.recording_fusion_calls(mixed):
        pass


def test_plot_writes_png(tmp_path):
    pytest.importorskip("matplotlib")
    profile = profile_regions(jit_cpu(mixed), *_inputs(requires_grad=False), reps=2, warmup=0)
    path = profile.plot(tmp_path / "regions.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_recording_survives_symbols_that_reset_their_call_context():
    """nvFuser's fusion symbols re-set their call context whenever they are bound; simulate that on CPU."""
    x = torch.randn(2, 3, 4, 5)
    w = torch.randn(5)
    jitted = jit_cpu(mixed)
    jitted(x, w)
    for region in regions(jitted):
        original = th.region_callable(region.bsym)

        def reset(bsym, name=region.name, fn=original):
            bsym._call_ctx = {name: fn}

        object.__setattr__(region.bsym.sym, "_bind_postprocess", reset)
    profile = profile_regions(jitted, x, w, reps=2, warmup=0)
    assert profile.rows and all(r.error is None and r.host_us is not None for r in profile.rows)


class TinyGPT(torch.nn.Module):
    """Token and position embeddings (positions from ``torch.arange``), a head and the cross-entropy loss."""

    def __init__(self, vocab: int = 11, width: int = 8, length: int = 5):
        super().__init__()
        self.tokens, self.positions = torch.nn.Embedding(vocab, width), torch.nn.Embedding(length, width)
        self.head = torch.nn.Linear(width, vocab)

    def forward(self, idx, targets):
        h = torch.tanh(self.tokens(idx) + self.positions(torch.arange(idx.shape[1])))
        logits = self.head(h)
        return torch.nn.functional.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))


def test_eager_column_is_measured_for_embedding_arange_and_cross_entropy():
    """The eager side is lowered after compiling, where ``arange`` reads the call's defaults Thunder records."""
    idx, targets = torch.randint(0, 11, (2, 5)), torch.randint(0, 11, (2, 5))
    profile = profile_regions(jit_cpu(TinyGPT()), idx, targets, reps=2, warmup=0)
    ops = {op for r in profile.rows for op in r.ops}
    assert {"embedding", "arange", "log_softmax"} <= ops
    assert {r.trace for r in profile.rows} == {"forward", "backward"}
    for row in profile.rows:
        assert row.error is None, row.error
        assert row.host_us is not None and row.eager_us is not None


def test_a_column_not_measured_says_why_on_one_line(monkeypatch):
    """Where the eager side cannot be built, the row says so in words, without an object's address."""
    variable: contextvars.ContextVar[int] = contextvars.ContextVar("some_setting")

    def unlowerable(trace, region):
        return variable.get()

    monkeypatch.setattr(profile_rows, "lower_region", unlowerable)
    profile = profile_regions(jit_cpu(mixed), *_inputs(requires_grad=False), reps=1, warmup=0)
    assert profile.rows
    for row in profile.rows:
        assert row.eager_us is None and row.host_us is not None
        assert row.error.startswith("eager not measured: ") and "some_setting" in row.error
        assert "\n" not in row.error and " 0x" not in row.error
    assert " 0x" not in str(profile) and " 0x" not in profile.to_html()


def test_an_error_whose_message_is_an_object_repr_is_worded_without_the_address():
    variable: contextvars.ContextVar[int] = contextvars.ContextVar("some_setting")
    try:
        variable.get()
    except LookupError as e:
        line = error_line(e)
    assert line.startswith("LookupError: <ContextVar name='some_setting'> at ") and " 0x" not in line
    assert "test_profile.py:" in line


def test_op_level_decisions_are_not_listed_as_vanished_regions():
    def fill_rows(x):
        m = torch.zeros(4, 4)
        for i in range(4):
            m[i, : i + 1] = 1.0
        return x + m

    guard = FusionGuard()
    jitted = thunder.jit(fill_rows, executors=[], transforms=[guard])
    profile = profile_regions(jitted, torch.randn(4, 4), reps=2, warmup=1)
    assert len(guard.report.filter(action="fold")) == 4
    assert "no longer in the traces" not in str(profile)


def _row(host, eager):
    return RegionRow("forward", "TorchCompile0", "torchcompile", 2, ["mul", "add"], host_us=host, eager_us=eager)


def _decision(decided_by, **details):
    from thunder_fusion_guard import Decision

    d = Decision("forward", "TorchCompile0", "torchcompile", ["mul", "add"], "keep", "r")
    d.details = {"decided_by": decided_by, **details}
    d.estimates = {"est_region_us": 14.0, "est_eager_us": 15.0}
    return d


@pytest.mark.parametrize(
    "decided_by, details, expected",
    [
        ("exactness", {}, "fused 400% slower here; kept for exactness"),
        ("model", {}, "model estimate (14.0 vs 15.0 µs), not measured: estimates more than 3x apart"),
        ("model", {"not_measured": "measure budget spent"}, "not measured: measure budget spent"),
        ("measured", {"measured_region_us": 10.0, "measured_eager_us": 9.0}, "9.0 µs eager, within the margin"),
        ("option", {}, "kept by option"),
    ],
)
def test_profile_says_why_a_kept_region_is_slower_fused(decided_by, details, expected):
    from thunder_fusion_guard.examine.profile import disagreement

    d = _decision(decided_by, **details)
    assert expected in disagreement(_row(50.0, 10.0), d, [d])
    assert disagreement(_row(10.0, 50.0), d, [d]) is None  # fused faster: the profile agrees


def test_profile_names_a_region_hoisting_split_after_the_decision():
    from thunder_fusion_guard import Decision
    from thunder_fusion_guard.examine.profile import disagreement

    d = _decision("model")
    hoist = Decision("forward", "hoisted_constants", "fusion_guard", ["full"], "hoist", "r")
    hoist.details = {"scope": "op", "split": ["TorchCompile0"]}
    assert "before hoisting took the input-independent ones out" in disagreement(_row(50.0, 10.0), d, [d, hoist])


def test_profile_table_marks_disagreements_with_injected_timings(monkeypatch):

    timings = iter([(50.0, (49.0, 51.0)), (10.0, (9.0, 11.0))] * 10)  # every region: fused 50 µs, eager 10 µs
    monkeypatch.setattr(profile_rows, "_timed", lambda fn, args, reps, warmup: next(timings))
    guard = FusionGuard(costs=Costs(measure_budget_s=0))
    jitted = jit_cpu(lambda t: torch.softmax(t * 2.0, dim=-1), guard)
    profile = profile_regions(jitted, torch.randn(4, 8), reps=2, warmup=0)
    (row,) = profile.rows
    (decision,) = guard.report
    assert row.decided_by == "exactness" and decision.code == "exactness" and row.reason == decision.reason
    text, wide = " ".join(str(profile).split()), profile.to_text(wide=True)  # wrapped at 120 columns, or not
    assert "why kept though slower here: fused 400% slower here; kept for exactness" in text
    assert "why kept though slower here" in wide.splitlines()[1] and "fused 400% slower here; kept for" in wide
    assert "host: wall time of one call of the region's fusion callable, the fusion call's own overhead" in text


# A backward region's ops, as Thunder lists them: long names repeated, the list longer than any column.
def c(text: str) -> str:
    """``text`` with each ``*`` the multiplication sign the tables count ops with (``mul*2``: ``mul`` twice)."""
    from thunder_fusion_guard.render.table import TIMES

    return text.replace("*", TIMES)


BACKWARD_OPS = ["transpose", "mul", "transpose", "reshape", "mul", "transpose", "broadcast_in_dim", "sum", "add"]


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_profile_tables_say_what_host_means_and_count_ops_without_cutting_them(device):
    from thunder_fusion_guard.examine.profile import RegionProfile
    from thunder_fusion_guard.render import HOST_LEGEND_CPU, HOST_LEGEND_CUDA

    row = RegionRow("backward", "TorchCompile1", "torchcompile", len(BACKWARD_OPS), BACKWARD_OPS, host_us=9.0)
    row.eager_us = 12.0
    # figures as wide as a real model's (130-145 columns); the table still fits 120
    row.source, row.input_bytes, row.output_bytes = "/home/user/unet.py:27", 16_800, 8_200
    row.host_spread_us, row.eager_spread_us, row.action = (530.9, 616.9), (1443.4, 1603.4), "keep"
    if device == "cuda":
        row.device_us, row.overhead_us, row.kernels, row.gbps, row.peak_fraction = 4.0, 5.0, 3, 812.5, 0.243
    profile = RegionProfile("f", device, 10, [row])
    text, page = profile.to_text(wide=True), profile.to_html()
    legend = HOST_LEGEND_CUDA if device == "cuda" else HOST_LEGEND_CPU
    assert legend in text.splitlines() and html.escape(legend) in page
    assert legend in " ".join(str(profile).split())  # wrapped, whole
    assert max(len(line) for line in str(profile).splitlines()) <= 120, str(profile)  # CUDA's figures too
    assert "each torchcompile region's own callable" in " ".join(str(profile).split())  # its one executor, named once
    assert legend.startswith("host: wall time of one call") and "own overhead included" in legend
    assert ("synchronised" in legend) == (device == "cuda")
    # the ops column: counted groups, whole names only, and how many were left out
    (line,) = [ln for ln in text.splitlines() if ln.startswith("backward")]
    assert c("9: transpose*3, mul*2, … +4 ops") in line
    assert html.escape(c("9: transpose*3, mul*2, reshape, broadcast_in_dim, sum, add")) in page


def test_decision_tables_count_ops_and_never_cut_a_name():
    from thunder_fusion_guard import Decision
    from thunder_fusion_guard.render.table import op_groups, ops_text
    from thunder_fusion_guard.report import Report

    assert op_groups(BACKWARD_OPS) == [c("transpose*3"), c("mul*2"), "reshape", "broadcast_in_dim", "sum", "add"]
    assert ops_text(BACKWARD_OPS, None) == c("transpose*3, mul*2, reshape, broadcast_in_dim, sum, add")
    assert ops_text(BACKWARD_OPS, 32) == c("transpose*3, mul*2, … +4 ops")
    assert ops_text(["a_long_name_longer_than_the_limit", "b"], 10) == "a_long_name_longer_than_the_limit, … +1 op"
    for limit in range(1, 60):  # whole groups only, whatever the width
        shown = ops_text(BACKWARD_OPS, limit).split(", ")
        assert all(g in op_groups(BACKWARD_OPS) or g.startswith("… +") for g in shown), (limit, shown)
    report = Report()
    report.add(Decision("backward", "TorchCompile1", "torchcompile", BACKWARD_OPS, "keep", "kept"))
    (row,) = [ln for ln in str(report).splitlines() if ln.startswith("backward")]
    assert c("transpose*3, mul*2, reshape, … +3 ops  keep") in row
    assert c("| transpose*3, mul*2, reshape, broadcast_in_dim, sum, add |") in report.to_markdown()
    assert html.escape(c("transpose*3, mul*2, reshape, broadcast_in_dim, sum, add")) in report.to_html()
