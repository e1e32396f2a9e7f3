"""Every decision's reason is one whole line, never cut (text tables wrap it); the long story is in
``details["explanation"]``."""

import json
import re
import typing
from pathlib import Path

import pytest
import thunder
import torch
import torch.nn.functional as F
from helpers import ALWAYS_EAGER, NEAR_BREAK_EVEN, jit_cpu
from test_guard import metadata_chain, mixed
from test_hoist import grid, mask_loop
from test_hoist_rotary import relative_positions
from test_inplace import copy_into_input
from test_rescue import copy_into_input as copy_into_buffer
from test_rescue import failing_executor, inputs, program, step
from test_rewrites import sliding_window_mask
from thunder.dynamo import thunderfx

import thunder_fusion_guard.passes.decide as decide
import thunder_fusion_guard.passes.fold as fold
from thunder_fusion_guard import Costs, FusionGuard, fusion_executors, reasons
from thunder_fusion_guard.reasons import Facts, ReasonCode, words

# The subject is not the code Inductor generates: regions run uncompiled (helpers.without_inductor).
pytestmark = pytest.mark.usefixtures("no_inductor_module")

# Cost constants under which the fusion always wins by far (ALWAYS_EAGER's mirror).
ALWAYS_FUSED = {
    "fusion_call_us": 1e-6,
    "fusion_gbps": 1e6,
    "eager_op_us": 1e6,
    "eager_meta_us": 1e6,
    "eager_gbps": 1e-3,
    "overlapped": False,
}


def noisy(x):
    return F.dropout(torch.tanh(x) * 2, p=0.5, training=True) + 1


def long_chain(x, y):
    return torch.exp(torch.tanh(x * y + 1.0) - y.abs()).sum(-1)


PROGRAMS = [
    (metadata_chain, lambda: [torch.randn(3, 4, 6, 5, requires_grad=True)], {}),
    (mixed, lambda: [torch.randn(2, 3, 4, 5, requires_grad=True), torch.randn(5)], {}),
    (sliding_window_mask, lambda: [torch.randn(1, 2, 8, 8)], {}),
    (mask_loop, lambda: [torch.randn(2, 8, 8)], {}),
    (copy_into_input, lambda: [torch.randn(4, 4), torch.zeros(4, 4)], {}),
    (noisy, lambda: [torch.randn(8, 8)], {}),
    (long_chain, lambda: [torch.randn(8, 8), torch.randn(8, 8)], {}),
    (
        long_chain,
        lambda: [torch.randn(8, 8), torch.randn(8, 8)],
        {"exact_only": False, "costs": {"calibration": ALWAYS_EAGER}},
    ),
    (mixed, lambda: [torch.randn(2, 3, 4, 5), torch.randn(5)], {"report_only": True, "costs": {"cost_model": False}}),
    (mixed, lambda: [torch.randn(2, 3, 4, 5), torch.randn(5)], {"executors": [], "costs": {"calibration": "shipped"}}),
]


def _check(guard: FusionGuard) -> None:
    assert guard.report.decisions
    for d in guard.report:
        assert not d.reason.endswith("…") and "\n" not in d.reason, d.reason
        explanation = d.details.get("explanation")
        assert explanation is None or (explanation != d.reason and "\n" not in explanation)


@pytest.mark.parametrize("fn,make,options", PROGRAMS, ids=[f"{p[0].__name__}-{i}" for i, p in enumerate(PROGRAMS)])
def test_reasons_are_whole_single_lines(fn, make, options):
    guard = FusionGuard(**options)
    jit_cpu(fn, guard)(*make())
    _check(guard)


def test_every_code_has_its_wording_and_every_fact_it_reads_is_declared():
    """Each reason code is worded by a function of its facts, and each fact a wording reads is a key of Facts."""
    assert set(reasons._WORDS) == set(typing.get_args(ReasonCode))
    source = Path(reasons.__file__).read_text()
    read = set(re.findall(r"\bf\[[\"'](\w+)[\"']\]", source)) | set(re.findall(r"\bf\.get\([\"'](\w+)[\"']", source))
    assert {"ops", "measured", "refused", "before_code"} <= read  # the search finds them
    assert read <= set(Facts.__annotations__), sorted(read - set(Facts.__annotations__))


def _reworded_from_facts(guard: FusionGuard) -> set[str]:
    """Every decision with a code says what :func:`words` makes of its facts, and its facts survive JSON; the
    codes seen."""
    coded = [d for d in guard.report if d.code is not None]
    assert coded == guard.report.decisions  # every decision the guard makes has a code
    for d in coded:
        reason, told = words(d.code, d.facts)
        assert reason == d.reason, (d.code, d.facts)
        assert told.get("explanation") == d.details.get("explanation"), (d.code, d.facts)
    exported = json.loads(guard.report.to_json())["decisions"]
    assert [e["code"] for e in exported if e["code"] is not None] == [d.code for d in coded]
    assert all(isinstance(e["facts"], dict) for e in exported)
    return {d.code for d in coded}


@pytest.mark.parametrize("fn,make,options", PROGRAMS, ids=[f"{p[0].__name__}-{i}" for i, p in enumerate(PROGRAMS)])
def test_every_coded_decision_keeps_the_facts_its_reason_is_worded_from(fn, make, options):
    guard = FusionGuard(**options)
    jit_cpu(fn, guard)(*make())
    assert _reworded_from_facts(guard)


def test_a_measured_decision_keeps_its_timing_as_a_fact_and_exports_it(inject_timings):
    inject_timings(10.0, 9.7)
    guard = FusionGuard(costs=Costs(calibration=NEAR_BREAK_EVEN))
    x = torch.randn(64, 64)
    jit_cpu(lambda a, b: a + b, guard)(x, x)
    assert _reworded_from_facts(guard) == {"measured"}
    (d,) = guard.report
    assert (d.facts["measured"].region_us, d.facts["measured"].eager_us) == (10.0, 9.7)
    exported = json.loads(guard.report.to_json())["decisions"][0]["facts"]["measured"]
    assert (exported["region_us"], exported["eager_us"]) == (10.0, 9.7)


def test_hoist_decisions_keep_the_facts_their_reasons_are_worded_from():
    refused = FusionGuard(strict=True)  # a table rounded at the cut of a region: not hoisted, exact_only=False would
    x = grid(torch.bfloat16, 300, 300).detach()
    thunder.jit(relative_positions, executors=fusion_executors("cpu"), transforms=[refused])(x)
    assert "hoist_refused" in _reworded_from_facts(refused)
    over = FusionGuard(runtime={"hoist_max_bytes": 0})  # no byte to keep a hoisted tensor in
    jit_cpu(mask_loop, over)(torch.randn(2, 8, 8))
    assert "hoist_not_taken" in _reworded_from_facts(over)
    (d, *_) = [d for d in over.report if d.code == "hoist_not_taken"]
    assert (d.facts["not_taken"], d.facts["budget_left"]) == ("budget", 0)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_rescue_decisions_keep_the_facts_their_reasons_are_worded_from():
    guard = FusionGuard()
    step(thunder.jit(program, executors=[failing_executor("sin", [])], transforms=[guard]), *inputs())
    compiled = thunderfx(copy_into_buffer, executors=fusion_executors("cpu"), transforms=[guard])
    compiled(torch.zeros(4), torch.randn(4, requires_grad=True))
    assert {"rescued", "grad_update_rescued"} <= _reworded_from_facts(guard)


@pytest.mark.guard_failure_expected
def test_failure_reasons_are_whole_and_the_error_kept(monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("planted failure " + "x" * 200)

    monkeypatch.setattr(decide, "lower_region", broken)
    monkeypatch.setattr(fold, "fold_setitem_copies", broken)
    guard = FusionGuard()
    jit_cpu(metadata_chain, guard)(torch.randn(3, 4, 6, 5))
    jit_cpu(sliding_window_mask, guard)(torch.randn(1, 2, 8, 8))
    _check(guard)
    assert any(d.error and "planted failure" in d.error for d in guard.report)
    assert "rewrite_failed" in _reworded_from_facts(guard)


def test_the_long_story_stays_in_the_explanation():
    guard = FusionGuard(costs=Costs(calibration=ALWAYS_EAGER))  # the cost model would reject: exactness decides
    jit_cpu(long_chain, guard)(torch.randn(8, 8), torch.randn(8, 8))
    (d,) = [d for d in guard.report if d.about_region and d.trace == "forward"]
    assert d.reason.startswith("kept for exactness: ")
    assert "cost aside: estimated" in d.details["explanation"] and "cost aside" not in d.reason
    kept = FusionGuard(
        costs=Costs(calibration=ALWAYS_FUSED)
    )  # the cost model keeps it: the numbers lead, exactness aside
    jit_cpu(long_chain, kept)(torch.randn(8, 8), torch.randn(8, 8))
    (d,) = [d for d in kept.report if d.about_region and d.trace == "forward"]
    assert d.reason.startswith("cost model: fusion call is worth it") and d.details["decided_by"] == "model"
    assert "exactness would keep it too" in d.details["explanation"] and "exactness" not in d.reason


def many_rounding_ops(x):
    return torch.rsqrt(x.abs() + 1).reciprocal() * torch.tanh(x).exp().sin().cos().log1p()


def test_exactness_words_an_op_not_known_to_be_exact_apart_from_ops_that_round():
    """copy_with_setitem only moves data, but nobody showed it gives a fusion's bits outside it: the reason must
    not say that it rounds."""
    facts = {"inexact": ["copy_with_setitem"], "est_region_us": 2.0, "est_eager_us": 1.0}
    reason, told = words("exactness", facts)
    assert (
        reason == "kept for exactness: ops ['copy_with_setitem'] are not known to give the same bits outside the fusion"
    )
    assert told["explanation"].startswith(f"{reason} (option 'exact_only'); cost aside: ")
    assert "round" not in told["explanation"]


def test_a_long_reason_is_whole_in_json_and_html_and_wrapped_in_the_table():
    """The exactness reason naming seven ops (once cut at 100 characters, mid-name) is whole in the decision,
    its JSON and its HTML; the text table keeps it whole in lines of at most 120 characters, and the wide
    table on one line."""
    import html
    import json

    guard = FusionGuard(costs=Costs(calibration=ALWAYS_EAGER))  # the cost model would reject: exactness decides
    jit_cpu(many_rounding_ops, guard)(torch.randn(8, 8))
    (d,) = [d for d in guard.report if d.about_region]
    assert d.details["decided_by"] == "exactness"
    ops = ["'cos'", "'exp'", "'log1p'", "'reciprocal'", "'rsqrt'", "'sin'", "'tanh'"]
    assert len(d.reason) > 100 and all(op in d.reason for op in ops), d.reason
    assert "could round differently outside the fusion, op by op" in d.reason
    (saved,) = [x for x in json.loads(guard.report.to_json())["decisions"] if x["action"] == "keep"]
    assert saved["reason"] == d.reason
    assert html.escape(d.reason) in guard.report.to_html()
    text = str(guard.report)
    assert max(len(line) for line in text.splitlines()) <= 120, text
    assert d.reason in " ".join(text.split()), text  # every word, in order, broken only at spaces
    wide = guard.report.to_text(wide=True)
    assert any(line.endswith(d.reason) for line in wide.splitlines()), wide
