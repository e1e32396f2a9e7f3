"""The report's text, Markdown and HTML from hand-made decisions: grouping by ThunderFX subgraph, counts in words."""

import re
from pathlib import Path
from typing import get_args

import pytest

import thunder_fusion_guard
from thunder_fusion_guard.decisions import ACTIONS, Action, Decision, Details, Subgraph, trace_place
from thunder_fusion_guard.reasons import words
from thunder_fusion_guard.render.table import (
    NOT_THUNDERFX,
    compilations_note,
    markdown_table,
    plural,
    sections,
    text_table,
)
from thunder_fusion_guard.report import Report, format_markdown


def _decision(region: str, action: str = "keep", subgraph: str | None = None, **kw) -> Decision:
    return Decision("forward", region, "nvfuser", ["mul", "add"], action, f"why {region}", subgraph=subgraph, **kw)


def _mixed_report() -> Report:
    """One ThunderFX subgraph with a decision, and a decision from a plain ``thunder.jit`` function."""
    report = Report()
    report.add_subgraph(Subgraph("subgraph0", ["mul", "add"], name="dynamo graph 0, thunder_0"))
    report.add(_decision("nvFusion0", subgraph="subgraph0"))
    report.add(_decision("nvFusion1", "reject", function="f"))
    return report


def test_markdown_lists_decisions_outside_thunderfx_under_their_own_heading():
    report = _mixed_report()
    text = format_markdown(report.decisions, report.subgraphs)
    assert "## subgraph0 (dynamo graph 0, thunder_0)" in text
    outside = text.index("## not from ThunderFX")
    assert text.index("nvFusion0") < outside < text.index("nvFusion1")
    assert "why nvFusion1" in report.to_markdown()


def test_text_markdown_and_html_group_decisions_alike():
    """The three formats take their groups from one function: decisions outside ThunderFX come after the
    subgraphs' whatever order they were made in, under a heading of their own."""
    report = Report()
    report.add_subgraph(Subgraph("subgraph0", ["mul", "add"], name="dynamo graph 0, thunder_0"))
    report.add(_decision("nvFusion9", "reject", function="f"))  # made first, listed last
    report.add(_decision("nvFusion0", subgraph="subgraph0"))
    groups = sections(report.decisions, report.subgraphs)
    assert [(g.title, [d.region for d in g.decisions]) for g in groups] == [
        ("subgraph0 (dynamo graph 0, thunder_0)", ["nvFusion0"]),
        (NOT_THUNDERFX, ["nvFusion9"]),
    ]
    text, markdown, page = str(report), report.to_markdown(), report.to_html()
    assert text.index("nvFusion0") < text.index(f"\n{NOT_THUNDERFX}:\n") < text.index("nvFusion9")
    assert markdown.index("nvFusion0") < markdown.index(f"## {NOT_THUNDERFX}") < markdown.index("nvFusion9")
    assert page.index(">nvFusion0<") < page.index(">nvFusion9<")


def test_a_subgraph_without_decisions_keeps_its_heading():
    report = Report()
    report.add_subgraph(Subgraph("subgraph0", ["sin"]))
    report.add_subgraph(Subgraph("subgraph1", ["mul", "add"]))
    report.add(_decision("nvFusion0", subgraph="subgraph1"))
    lines = str(report).splitlines()
    assert lines[lines.index("subgraph0, 1 op: sin") + 1] == "  (no fusion region)"
    assert "## subgraph0\n\nops (1): sin\n\nno fusion region\n" in report.to_markdown()


def test_summaries_count_in_words():
    one = Report()
    one.add_subgraph(Subgraph("subgraph0", ["mul", "add"]))
    one.add(_decision("nvFusion0", subgraph="subgraph0"))
    one.measuring = {"timed": 1, "seconds": 0.5, "from_cache": 0}
    text = str(one)
    assert "FusionGuard: 1 decision (1 keep) in 1 subgraph" in text.splitlines()
    assert "measured near break-even: 1 region timed in 0.50 s, 0 from the cache" in text.splitlines()
    assert one.to_markdown().rstrip().endswith("1 decision (1 keep) in 1 subgraph")
    assert "(1: 1 keep) in 1 subgraph</h2>" in one.to_html()
    two = Report()
    for k in range(2):
        two.add_subgraph(Subgraph(f"subgraph{k}", ["mul"]))
        two.add(_decision(f"nvFusion{k}", subgraph=f"subgraph{k}"))
    assert str(two).splitlines()[-1] == "FusionGuard: 2 decisions (2 keep) in 2 subgraphs"
    empty = Report()
    empty.saw_trace([("torch", False)])
    assert "in the 1 trace it compiled" in str(empty)
    assert [plural(0, "op"), plural(1, "op"), plural(2, "op"), plural(2, "body", "bodies")] == [
        "0 ops",
        "1 op",
        "2 ops",
        "2 bodies",
    ]


def test_the_long_explanation_shows_in_html_and_markdown_not_in_the_text_table():
    report = _mixed_report()
    report.decisions[1].details["explanation"] = "the long story | <with markup>"
    assert "long story" not in str(report)
    assert "why nvFusion1 — the long story \\| <with markup> |" in report.to_markdown()
    page = report.to_html()
    assert 'title="the long story | &lt;with markup&gt;"' in page
    assert "<summary>why nvFusion1</summary><p>the long story | &lt;with markup&gt;</p>" in page
    assert "why nvFusion0</td>" in page  # no explanation: the plain reason
    report.decisions[1].details["explanation"] = "why nvFusion1 (the estimates: 3 µs against 5)"
    markdown = report.to_markdown()
    assert "why nvFusion1 (the estimates: 3 µs against 5) |" in markdown and markdown.count("why nvFusion1") == 1


def test_a_trace_is_placed_by_function_compile_subgraph_and_trace_alike_everywhere():
    assert trace_place("forward") == "forward"
    assert trace_place("backward", "subgraph 0") == "subgraph 0/backward"
    assert trace_place("backward", "subgraph 0", "Block", 1) == "Block#1:subgraph 0/backward"
    d = Decision(trace="forward", region="nvFusion0", executor="nvfuser", ops=["add"], action="keep", reason="r")
    d.function, d.compile_index, d.subgraph = "f", 2, "subgraph 1"
    assert d.place() == "f#2:subgraph 1/forward" and d.place(subgraph=False) == "f#2:forward"


def test_table_lines():
    rows = [["a", "bb", "reason"], ["ccc", "d", "a long last cell"]]
    assert text_table(rows) == ["a    bb  reason", "ccc  d   a long last cell"]
    free = text_table(rows, last_free=True, rule=True)
    assert (
        free[0] == "a    bb  reason"
        and free[1] == "-" * (3 + 2 + 2 + 2 + 20)
        and free[2] == "ccc  d   a long last cell"
    )
    assert text_table([["x", ""], ["yy", ""]]) == ["x", "yy"]  # no trailing blanks
    assert markdown_table(["a", "b"], [["1|2", "x\ny"]]) == ["| a | b |", "| --- | --- |", "| 1\\|2 | x y |"]


def test_actions_and_details_are_typed_records():
    assert (
        ACTIONS
        == get_args(Action)
        == ("keep", "reject", "switch", "rehome", "remove", "fold", "hoist", "rescue", "capture", "enter", "share")
    )
    with pytest.raises(ValueError, match="unknown action 'drop'"):
        Report().add(_decision("nvFusion0", "drop"))


def test_details_lists_every_key_the_package_reads_or_writes():
    """Each ``details`` key used in the package's source is declared in :class:`Details`."""
    package = Path(thunder_fusion_guard.__file__).parent
    pattern = re.compile(
        r"details(?:\[|\.get\()\s*\"(\w+)\""  # details["key"], details.get("key"
        r"|details\.update\(((?:[^()]|\([^()]*\))*)\)"  # details.update(key=..., ...)
        r"|details=\{([^}]*)\}"  # details={"key": ...}
        r"|(?<!class )Details\(((?:[^()]|\([^()]*\))*)\)"  # Details(key=..., ...)
        r"|\"(\w+)\" in \w+\.details"  # "key" in d.details
    )
    used = set()
    for path in package.rglob("*.py"):
        for match in pattern.finditer(path.read_text()):
            key, update, literal, built, member = match.groups()
            used |= {key, member} - {None}
            used |= set(re.findall(r"(\w+)=", (update or "") + (built or "")))
            used |= set(re.findall(r"\"(\w+)\":", literal or ""))
    assert {"scope", "decided_by", "kernels", "into", "piece", "explanation"} <= used  # the search finds them
    assert used <= set(Details.__annotations__), sorted(used - set(Details.__annotations__))


def test_profile_title_counts_threads_in_words():
    from thunder_fusion_guard.examine.profile import RegionProfile

    assert "of 10 calls of each region's own callable with its real inputs; 1 intra-op thread)" in RegionProfile(
        "f", "cpu", 10, [], threads=1
    ).to_text(wide=True)
    assert "; 2 intra-op threads)" in " ".join(str(RegionProfile("f", "cpu", 10, [], threads=2)).split())


LONG_REASON = (
    "kept for exactness: ops ['cos', 'exp', 'log1p', 'reciprocal', 'rsqrt', 'sin', 'tanh'] could round differently "
    "outside the fusion, op by op"
)
OPS = ["tanh", "mul", "expand", "sub", "to", "scatter_reduce_vjp", "transpose", "matmul"]


@pytest.mark.parametrize("width", [60, 90, 120])
def test_text_tables_fit_their_width_and_cut_nothing(width):
    """A table wraps long cells at spaces to fit its width: every line fits, every word is there whole (the
    free last column on lines of its own where its row leaves it too little room); without a width, a row is
    one line, as before."""
    rows = [
        ["trace", "region", "ops", "reason"],
        ["backward", "model.py:12 (TorchCompile2)", ", ".join(OPS), LONG_REASON],
    ]
    lines = text_table(rows, last_free=True, rule=True, width=width, wrap=(1, 2))
    assert max(len(line) for line in lines) <= width, lines
    words = " ".join(lines).split()
    assert all(op in words or f"{op}," in words for op in OPS), lines  # no op name broken
    assert LONG_REASON in " ".join(words), lines  # the reason whole, in order
    assert "…" not in "".join(lines)
    assert len(text_table(rows, last_free=True)) == 2


def test_the_report_wraps_to_120_columns_and_wide_keeps_one_line_a_decision():
    report = Report()
    report.add(Decision("backward", "TorchCompile2", "torchcompile", OPS, "keep", LONG_REASON, function="layer"))
    text, wide = str(report), report.to_text(wide=True)
    assert max(len(line) for line in text.splitlines()) <= 120, text
    assert LONG_REASON in " ".join(text.split()) and "…" not in LONG_REASON
    (row,) = [line for line in wide.splitlines() if line.startswith("layer#0:backward")]
    assert row.endswith(LONG_REASON) and len(row) > 120


def test_split_reasons_shared_by_subgraphs_are_listed_once():
    """ThunderFX gives every subgraph of a Dynamo graph the same split reasons: a report lists each once, and
    the later subgraphs point at the one that lists them."""
    split = "MISSING_OP_SUPPORT: node with name: out and target: scatter_reduce only has an automatic torch fallback"
    report = Report()
    for k in range(4):
        report.add_subgraph(
            Subgraph(f"subgraph {k}", ["mul"], name=f"dynamo graph 0, thunder_{k}", split_reasons=[split])
        )
        report.add(_decision(f"nvFusion{k}", subgraph=f"subgraph {k}"))
    text, markdown = report.to_text(wide=True), report.to_markdown()
    assert " ".join(text.split()).count(split) == 1 and markdown.count(split) == 1
    assert text.count("split: as subgraph 0 (dynamo graph 0, thunder_0)") == 3
    assert markdown.count("- split: as subgraph 0 (dynamo graph 0, thunder_0)") == 3


def test_decisions_are_named_by_the_users_line_and_ops_the_trace_name_kept():
    """A decision's region is named for a reader by the user's line and its ops (``name``, in JSON too); the
    tables show the line with the trace's name beside it (``region``, unchanged, for those who read traces)."""
    d = Decision("forward", "t953", "torch", ["copy_with_setitem", "copy_"], "fold", "folded", details={"scope": "op"})
    assert d.name == "t953: copy_with_setitem, copy_"  # no line known: the trace's name
    d.details["source"] = "/home/user/project/model.py:12"
    assert d.name == "model.py:12: copy_with_setitem, copy_"
    saved = d.to_dict()
    assert saved["name"] == d.name and saved["region"] == "t953" and saved["details"]["source"].endswith("model.py:12")
    report = Report()
    report.add(d)
    assert "model.py:12 (t953)" in str(report) and "model.py:12 (t953)" in report.to_markdown()
    assert 'title="/home/user/project/model.py:12">model.py:12 (t953)</td>' in report.to_html()


def test_a_compilation_for_the_same_inputs_is_told_apart_from_one_for_other_inputs():
    """A compilation whose checks are those of the one before (reason '') was made by a thread compiling at once
    with another; one for other inputs says what differed."""
    decisions = [_decision("nvFusion0", function="f", compile_index=i) for i in (1, 2, 3)]
    note = compilations_note(decisions, ["input x shape (4,) -> (5,)", ""])
    assert "did not accept: #2 input x shape (4,) -> (5,)" in note, note
    assert "#3 by 2 threads at once, for the same inputs" in note, note


def test_a_run_of_decisions_alike_is_one_row_in_text_and_markdown_and_each_in_json():
    """18 identity ops removed from one region (exact_only=False) are one row, ops counted, saying how many more
    it stands for; a decision with another code, or with estimates, breaks the run; the JSON keeps each."""
    report = Report()
    for i in range(18):
        d = _decision("TorchCompile0", "remove")
        d.ops, d.code, d.facts = ["shallow_copy"], "identity_removed", {"why": "a shallow copy", "replaced_by": f"t{i}"}
        d.reason = words(d.code, d.facts)[0]
        report.add(d)
    other = _decision("TorchCompile0", "remove")
    other.ops, other.code = ["shallow_copy"], "folded"
    other.reason, other.details = words("folded", {})
    report.add(other)
    text, markdown = report.to_text(wide=True), report.to_markdown()
    counted = "shallow_copy\N{MULTIPLICATION SIGN}18"
    assert counted in text and text.count("identity op") == 1 and "and 17 more alike" in text
    assert counted in markdown and markdown.count("identity op") == 1
    assert "folded" in text and len(report.to_dict()["decisions"]) == 19
