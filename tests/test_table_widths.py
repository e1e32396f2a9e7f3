"""Every text table the package prints (the report, ``why_not_fused``, ``profile_regions`` on CPU and CUDA, ``bench
run``) fits 120 columns with a real model's long names (a Hugging Face class, a source line with the library's line
after it, long ops, scheduler names): a name too long for its column goes on on the next line, broken at a joint,
nothing cut; ``wide`` keeps a row on one line. Built from records, no model run."""

from collections import Counter

import pytest

from thunder_fusion_guard.bench.cases import ALL_VARIANTS, BenchCase
from thunder_fusion_guard.bench.run import CaseResult, summary_rows, variant_rows
from thunder_fusion_guard.decisions import Decision, Subgraph
from thunder_fusion_guard.examine.profile import RegionProfile
from thunder_fusion_guard.examine.profile_rows import RegionRow
from thunder_fusion_guard.examine.why_rows import WhyKind, WhyReport, WhyRow
from thunder_fusion_guard.report import Report
from thunder_fusion_guard.tools.bench_cli import _table
from thunder_fusion_guard.wording import WIDTH, wrap

SOURCE = (
    "/home/someone/projects/a_rather_long_project_name/src/models/transformer_with_long_name.py:1234 "
    "(/home/someone/.venvs/tfg/lib/python3.11/site-packages/transformers/models/gpt_bigcode/modeling_gpt_bigcode.py:253)"
)
FUNCTION = "GPTBigCodeForCausalLMWithALongName"
OPS = ["scaled_dot_product_attention", "convert_element_type", "broadcast_in_dim", "reshape", "mul", "softmax"]
REASON = (
    "the cost model says eager is cheaper by 45% (est. 12.3 µs fused vs 8.1 µs eager; margin 20%) and the ops one "
    "by one give the same bits"
)


def _fits(text: str) -> None:
    assert max(len(line) for line in text.splitlines()) <= WIDTH, text


def _same_characters(text: str, wide: str) -> None:
    """Nothing cut: the wrapped text has every character of the wide one (rules of dashes aside)."""

    def chars(t: str) -> Counter:
        return Counter("".join(line for line in t.splitlines() if set(line) != {"-"}).replace(" ", ""))

    assert chars(text) == chars(wide)


def test_a_word_longer_than_a_line_goes_on_on_the_next_broken_at_a_joint():
    lines = wrap(f"in {SOURCE}", 40, indent="")
    assert lines == [  # the long word starts its own line and is broken after a joint, or before a "/" or "("
        "in",
        "/home/someone/projects/a_rather_long_",
        "project_name/src/models/transformer_",
        "with_long_name.py:1234",
        "(/home/someone/.venvs/tfg/lib/python3.11",
        "/site-packages/transformers/models/gpt_",
        "bigcode/modeling_gpt_bigcode.py:253)",
    ]
    assert wrap("a" * 25, 10, indent="") == ["a" * 10, "a" * 10, "a" * 5]  # no joint: at the line's end
    assert wrap("short words stay whole", 10, indent="") == ["short", "words stay", "whole"]


def test_the_report_fits_with_long_names():
    report = Report()
    split = "MISSING_OP_SUPPORT: node with name: scatter_reduce_default and target: torch.ops.aten.scatter_reduce.two"
    report.add_subgraph(Subgraph("subgraph 0", ["mul"], name="dynamo graph 12, thunder_3", split_reasons=[split]))
    kernels = {"kernels": 3, "schedulers": ["inner_persistent", "pointwise"], "segmented": True}
    for trace, executor, subgraph in (("backward", "torchcompile", "subgraph 0"), ("forward", "nvfuser", None)):
        details = {"source": SOURCE, **kernels}
        report.add(Decision(trace, "TorchCompile12", executor, OPS, "keep", REASON, FUNCTION, 3, subgraph=subgraph,
                            details=details))  # fmt: skip
    text, wide = str(report), report.to_text(wide=True)
    _fits(text)
    _same_characters(text, wide)
    assert (
        f"{FUNCTION}#3:backward" in wide and "transformer_with_long_name.py:1234 (modeling_gpt_bigcode.py:253)" in wide
    )
    assert max(len(line) for line in wide.splitlines()) > WIDTH


def test_why_not_fused_fits_with_long_names():
    row = WhyRow(
        trace="backward", op="ltorch.scaled_dot_product_attention", kind=WhyKind.OUTSIDE_THUNDER, reason=REASON,
        established_by="thunderfx split", try_="rewrite torch.ops.aten.scatter_reduce.two as index_add",
        subgraph="dynamo graph 12, thunder_3", source=SOURCE, bytes=123_456_789,
    )  # fmt: skip
    report = WhyReport([row])
    text, wide = str(report), report.to_text(wide=True)
    _fits(text)
    _same_characters(text, wide)
    header = text.splitlines()[1]
    assert header.index("try") - header.index("reason") >= 14  # the reason's column not squeezed to one word


def _profile_row(executor: str, cuda: bool) -> RegionRow:
    row = RegionRow("backward", "TorchCompile12", executor, len(OPS), OPS, host_us=1523.4, eager_us=1612.0)
    row.source, row.input_bytes, row.output_bytes, row.subgraph = SOURCE, 16_800_000, 8_200_000, "subgraph 12"
    row.host_spread_us, row.eager_spread_us, row.action, row.reason = (1443.4, 1603.4), (1543.4, 1703.4), "keep", REASON
    if cuda:
        row.device_us, row.overhead_us, row.kernels, row.gbps, row.peak_fraction = 1400.0, 123.4, 3, 1812.5, 0.543
        row.schedulers = ["inner_persistent", "pointwise"]
    return row


def test_the_cpu_profile_fits_with_long_names():
    profile = RegionProfile(FUNCTION, "cpu", 10, [_profile_row("torchcompile", False), _profile_row("torch", False)])
    text, wide = str(profile), profile.to_text(wide=True)
    _fits(text)
    _same_characters(text, wide)


def test_the_cuda_profile_fits_with_long_names_its_gpu_figures_in_each_rows_last_part():
    """The device time is a column; overhead, GB/s with the share of peak and the kernels lead the row's reason
    (``wide``: a column each)."""
    profile = RegionProfile(FUNCTION, "cuda", 10, [_profile_row("nvfuser", True)])
    text, wide = str(profile), profile.to_text(wide=True)
    _fits(text)
    flat = " ".join(text.split())
    assert (
        "overhead 123.4 µs, 1812.5 GB/s (54% peak), kernels 3 segmented: inner_persistent+pointwise; the cost" in flat
    )
    assert "device" in text.splitlines()[2] and "1400.0" in text
    header = next(line for line in wide.splitlines() if line.startswith("trace"))
    assert all(h in header for h in ("device", "GB/s", "% peak", "kernels", "overhead"))


@pytest.mark.parametrize("variants", [("thunder", "guarded", "eager"), ALL_VARIANTS])
def test_bench_run_tables_fit_with_long_names(variants):
    case = BenchCase("user", "a_long_model_file_name_for_the_user.py:make_the_model", lambda device: None)
    timed = CaseResult(
        case, {v: [1.2345e-3, 1.3e-3, 1.25e-3] for v in variants}, first_call_s=dict.fromkeys(variants, 12.3)
    )
    failed = CaseResult(case, error="RuntimeError: " + REASON)
    target = CaseResult(case, dict(timed.samples), first_call_s=dict(timed.first_call_s))
    target.variant_errors["guarded"] = "RuntimeError: " + REASON
    for rows in (summary_rows([timed, failed]), variant_rows(target, "thunderfx")):
        text, wide = _table(rows, False), _table(rows, True)
        _fits(text)
        _same_characters(text, wide)
