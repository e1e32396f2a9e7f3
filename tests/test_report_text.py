"""The report's text, Markdown and HTML from hand-made decisions: grouping by ThunderFX subgraph, counts in words."""

from thunder_fusion_guard.decisions import Decision, Subgraph
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
