"""Dataflow pictures: bytes at kernel boundaries before and after the guard, SVG/DOT/HTML output, the HTML
opened in a real headless browser, and peak-bandwidth arithmetic."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import textwrap
from contextlib import contextmanager
from html.parser import HTMLParser

import pytest
import thunder
import torch
from helpers import fragmenting_executor, jit_cpu

from thunder_fusion_guard import FusionGuard, Rewrites, profile_regions, trace_graphs
from thunder_fusion_guard.examine.bandwidth import gbps, peak_from_properties
from thunder_fusion_guard.examine.dataflow import graphs_to_dot, trace_graph
from thunder_fusion_guard.tools.cli import main

F32 = 4


def view_then_compute(x, w):
    a = x.reshape(4, 8).t()
    return (a * w).exp() + 1


@contextmanager
def uncompiled():
    """torch.compile as the identity while Thunder builds regions: the torch.compile executor's regions then
    run their ops uncompiled. These tests are about traces and bytes, not kernels, and this saves the
    inductor compilations (seconds each)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(torch, "compile", lambda fn, **kwargs: fn)
        yield


def _pair(guard: FusionGuard, *args):
    jitted = thunder.jit(view_then_compute, executors=[fragmenting_executor()], transforms=[guard])
    with uncompiled():
        jitted(*args)
    (pair,) = trace_graphs(jitted)
    return pair


def test_bytes_at_kernel_boundaries_drop_where_the_guard_rehomes_and_merges():
    """One region per op: reshape, t, mul, exp, add, each 32 floats. Before the guard every op reads and
    writes 128 B (mul also reads w); re-homing the views into mul, then merging, leaves one read and write."""
    x, w = torch.randn(32), torch.randn(8, 4)
    n = 32 * F32
    rehomed = _pair(FusionGuard(strict=True), x, w)
    merged = _pair(FusionGuard(strict=True, rewrites=Rewrites(merge_regions=True)), x, w)
    for pair in (rehomed, merged):
        before = pair.before
        assert pair.changed and before.stage == "before" and before.fusion_calls == 5
        assert (before.bytes_read, before.bytes_written) == (6 * n, 5 * n)
        assert [n.action for n in before.nodes if n.kind == "region"][:2] == ["reject", "reject"]
    assert (rehomed.after.fusion_calls, rehomed.after.bytes_read, rehomed.after.bytes_written) == (3, 4 * n, 3 * n)
    assert (merged.after.fusion_calls, merged.after.bytes_read, merged.after.bytes_written) == (1, 2 * n, n)
    assert merged.after.boundary_bytes < rehomed.after.boundary_bytes < rehomed.before.boundary_bytes
    (region,) = [node for node in merged.after.nodes if node.kind == "region"]
    assert region.ops == ["reshape", "permute", "mul", "exp", "add"]
    assert {"reshape moved in", "permute moved in", "TorchCompile2 merged in", "TorchCompile3 merged in"} <= set(
        region.notes
    )
    assert [node.action for node in merged.before.nodes if node.kind == "region"][2:4] == ["rehome", "rehome"]


def test_views_outside_fusions_move_no_bytes():
    def fn(x):
        return x.reshape(8, 4).t() * 2.0, x.sum()

    jitted = thunder.jit(fn, executors=[])
    jitted(torch.randn(32))
    graph = trace_graph(thunder.last_traces(jitted)[-1])
    kinds = {n.name: n.kind for n in graph.nodes}
    assert [k for k in kinds.values() if k == "view"] and graph.fusion_calls == 0
    assert graph.eager_ops == 2 and graph.view_ops == len(graph.nodes) - 4
    # mul reads the 128 B view and writes 128 B, sum reads x and writes 4 B
    assert (graph.bytes_read, graph.bytes_written) == (2 * 32 * F32, 32 * F32 + F32)
    edge = next(e for e in graph.edges if e.dst == "outputs" and any(t.nbytes == F32 for t in e.tensors))
    assert edge.tensors[0].text == "f32[]"


@pytest.fixture(scope="module")
def profile():
    """A guarded program with forward and backward in which the guard rejects, re-homes and merges."""
    x, w = torch.randn(32, requires_grad=True), torch.randn(8, 4, requires_grad=True)
    guard = FusionGuard(rewrites=Rewrites(merge_regions=True))
    jitted = thunder.jit(view_then_compute, executors=[fragmenting_executor()], transforms=[guard])
    with uncompiled():
        return profile_regions(jitted, x, w, reps=2, warmup=0)


def test_profile_carries_graphs_and_no_bandwidth_on_cpu(profile):
    assert [(p.trace, p.changed) for p in profile.graphs] == [("forward", True), ("backward", True)]
    assert profile.peak is None
    for row in profile.rows:
        assert row.gbps is None and row.peak_fraction is None and row.kernel_us == [] and row.kernel_gbps == []
    forward = profile.graphs[0]
    measured = [n for n in forward.after.nodes if n.kind == "region"]
    assert measured and all(n.host_us is not None for n in measured)
    data = json.loads(profile.to_json())
    assert data["graphs"][0]["before"]["totals"]["boundary_bytes"] == forward.before.boundary_bytes
    assert "| GB/s" not in str(profile) and "GB/s" not in str(profile)


class _Collect(HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags: list[tuple[str, dict]] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))


def _parse(html_text: str) -> list[tuple[str, dict]]:
    parser = _Collect()
    parser.feed(html_text)
    return parser.tags


def test_html_is_self_contained_with_pictures_and_sortable_tables(profile):
    page = profile.to_html("pictures test")
    tags = _parse(page)
    svgs = [a for t, a in tags if t == "svg"]
    assert len(svgs) == 4 and {(a["data-trace"], a["data-stage"]) for a in svgs} == {
        (trace, stage) for trace in ("forward", "backward") for stage in ("before", "after")
    }
    nodes = [a["data-node"] for t, a in tags if t == "g" and "data-node" in a]
    expected = sum(len(g.nodes) for p in profile.graphs for g in (p.before, p.after))
    assert len(nodes) == expected and "TorchCompile4" in nodes
    assert {a.get("id") for t, a in tags if t == "table"} >= {"summary", "profile", "decisions"}
    assert all("sortable" in a.get("class", "") for t, a in tags if t == "table")
    assert not re.search(r"(src|href)=['\"]?(https?:)?//", page), "the page must open without a network"
    assert "\u2212" in page and "1 fusion call" in page


def _dot_statements(text: str) -> list[list[str]]:
    """Statements of a DOT document, as token lists; raises on unbalanced braces, brackets or quotes."""
    tokens = re.findall(r'"(?:[^"\\]|\\.)*"|->|[{}\[\];,=]|[A-Za-z_][\w.]*|-?[\d.]+|\S', text)
    assert all(t != '"' for t in tokens), "unterminated string"
    statements, current, depth, brackets = [], [], 0, 0
    for t in tokens:
        if t == "[":
            brackets += 1
        elif t == "]":
            brackets -= 1
            assert brackets >= 0
        if t in ("{", "}") and not brackets:
            depth += 1 if t == "{" else -1
            assert depth >= 0, "unbalanced braces"
            if current:
                statements.append(current)
            statements.append([t])
            current = []
        elif t == ";" and not brackets:
            statements.append(current)
            current = []
        else:
            current.append(t)
    assert depth == 0 and brackets == 0 and not current
    return statements


def check_dot(text: str) -> tuple[set[str], list[tuple[str, str]]]:
    """A small DOT checker for what we write: node statements, edges between declared nodes, attribute lists."""
    statements = _dot_statements(text)
    assert statements[0] == ["digraph", "fusion_guard"] and statements[1] == ["{"]
    nodes, edges = set(), []
    for s in statements:
        if s in (["{"], ["}"]) or s[0] in ("digraph", "graph", "node", "edge", "subgraph", "label"):
            continue
        head = s[: s.index("[")] if "[" in s else s
        attrs = s[s.index("[") :] if "[" in s else []
        if attrs:
            assert attrs[-1] == "]" and all(re.fullmatch(r"[a-z]+", a) for a in attrs[1:-1:4]), attrs[:8]
        if len(head) == 3 and head[1] == "->":
            edges.append((head[0], head[2]))
        else:
            assert len(head) == 1 and head[0].startswith('"'), s
            nodes.add(head[0])
    assert all(a in nodes and b in nodes for a, b in edges), "an edge names an undeclared node"
    return nodes, edges


def test_dot_is_valid(profile, tmp_path):
    text = profile.to_dot()
    nodes, edges = check_dot(text)
    assert len(nodes) == sum(len(g.nodes) for p in profile.graphs for g in (p.before, p.after))
    assert len(edges) == sum(len(g.edges) for p in profile.graphs for g in (p.before, p.after))
    assert text.count("subgraph cluster_") == 4
    dot = shutil.which("dot")
    if dot:
        path = tmp_path / "g.dot"
        path.write_text(text)
        done = subprocess.run([dot, "-Tsvg", str(path)], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0 and "<svg" in done.stdout, done.stderr[-500:]


def _browser() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        found = shutil.which(name)
        if found:
            return found
    return None


def test_html_renders_in_a_headless_browser(profile, tmp_path):
    browser = _browser()
    if browser is None:
        pytest.skip("no headless browser: install Debian's 'chromium' package (apt-get install -y chromium)")
    path = tmp_path / "report.html"
    path.write_text(profile.to_html("browser test"))
    cmd = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=3000"]
    cmd += [f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom", path.as_uri()]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, done.stderr[-1000:]
    tags = _parse(done.stdout)
    body = next(a for t, a in tags if t == "body")
    assert body.get("data-rendered") == "yes", "the page's script did not run"
    svgs = [a for t, a in tags if t == "svg"]
    assert len(svgs) == 4
    expected = [len(g.nodes) for p in profile.graphs for g in (p.before, p.after)]
    assert sorted(int(a["data-rendered"]) for a in svgs) == sorted(expected)
    for a in svgs:
        width, height = (int(v) for v in a["data-bbox"].split("x"))
        assert width > 100 and height > 100, a["data-bbox"]


TARGET = """
import torch

def make():
    return (lambda x: (x.reshape(-1, 4).t() * 2.0).exp()), (torch.randn(3, 4, requires_grad=True),)
"""


def test_report_cli_writes_html_and_dot(tmp_path, capsys):
    target = tmp_path / "target.py"
    target.write_text(textwrap.dedent(TARGET))
    html_path, dot_path, json_path = tmp_path / "r.html", tmp_path / "r.dot", tmp_path / "r.json"
    argv = ["report", f"{target}:make", "--device", "cpu", "--html", str(html_path), "--dot", str(dot_path)]
    with uncompiled():
        assert main([*argv, "--json", str(json_path)]) == 0
    printed = capsys.readouterr()
    assert "profile of" in printed.out and f"wrote {html_path}" in printed.err
    tags = _parse(html_path.read_text())
    assert len([a for t, a in tags if t == "svg"]) >= 2
    check_dot(dot_path.read_text())
    html_text = html_path.read_text()
    assert '<section class="why-not-fused">' in html_text and 'href="#section-0">why not fused<' in html_text
    doc = json.loads(json_path.read_text())
    assert doc["graphs"] and doc["profile"]["rows"] and "outside fusions" in doc["why"]["summary"]
    with uncompiled():
        assert main(["report", f"{target}:make", "--device", "cpu", "--dot", str(dot_path)]) == 0
    assert "profile of" not in capsys.readouterr().out, "--dot alone does not profile"


def test_report_to_html_without_profile():
    guard = FusionGuard()
    jitted = jit_cpu(view_then_compute, guard)
    with uncompiled():
        jitted(torch.randn(32), torch.randn(8, 4))
    page = guard.report.to_html("decisions only")
    assert "<svg" not in page and 'id="decisions"' in page
    assert page.count("<svg") == 0 and guard.report.to_html("with", trace_graphs(jitted)).count("<svg") >= 1
    assert graphs_to_dot(trace_graphs(jitted)).startswith("digraph")


def test_peak_bandwidth_from_properties_or_spec_sheet():
    h100 = peak_from_properties("NVIDIA H100 80GB HBM3", 2619000, 5120)
    assert h100 is not None and h100.gbps == pytest.approx(3352.3, abs=0.1) and "2619 MHz" in h100.source
    table = peak_from_properties("NVIDIA H100 80GB HBM3", 0, 5120)
    assert table is not None and table.gbps == 3350 and "spec-sheet" in table.source
    assert peak_from_properties("NVIDIA H200", None, None).gbps == 4800
    assert peak_from_properties("NVIDIA H100 PCIe", 0, 0).gbps == 2000
    assert peak_from_properties("Some GPU", 0, 0) is None
    assert gbps(3_000_000, 1.5) == pytest.approx(2000.0) and gbps(10, 0.0) is None and gbps(None, 1.0) is None


@pytest.mark.cuda
def test_nvfuser_regions_show_bandwidth_and_kernels_per_call():
    from thunder.tests.nanogpt_model import Block, GPTConfig

    torch.manual_seed(0)
    config = GPTConfig(n_embd=256, n_head=4, block_size=128, dropout=0.0)
    block = Block(config).to(device="cuda", dtype=torch.bfloat16)
    x = torch.randn(2, 128, config.n_embd, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    jitted = thunder.jit(block, transforms=[FusionGuard()])
    profile = profile_regions(jitted, x, reps=5, warmup=2)
    assert profile.peak is not None and profile.peak.gbps > 100 and profile.peak.source
    nvfuser = [r for r in profile.rows if r.executor == "nvfuser"]
    assert nvfuser
    for row in nvfuser:
        assert (
            row.gbps is not None and row.gbps > 0 and row.peak_fraction == pytest.approx(row.gbps / profile.peak.gbps)
        )
        assert len(row.kernel_us) == row.kernels == len(row.kernel_gbps)
        assert (row.kernel_gbps[0] is not None) == (row.kernels == 1)
    for pair in profile.graphs:
        regions = [n for n in pair.after.nodes if n.kind == "region"]
        assert all(n.gbps is not None and n.kernels is not None for n in regions if n.executor == "nvfuser")
        assert pair.after.kernels_per_call is not None and pair.after.kernels_per_call >= pair.after.region_kernels
    text = str(profile)
    assert "GB/s" in text and "% peak" in text and "peak memory bandwidth" in text
    page = profile.to_html()
    assert "% of peak" in page and page.count("<svg") >= 2
    print(f"\n{text}")


def test_cuda_figures_are_computed_and_shown_without_a_gpu(profile):
    """The CUDA columns, filled by hand, through the bandwidth arithmetic, the text table, the HTML and the
    node labels (the real measurement is the cuda test above)."""
    from dataclasses import replace

    from thunder_fusion_guard.examine.bandwidth import Peak
    from thunder_fusion_guard.examine.profile import RegionProfile, _bandwidth
    from thunder_fusion_guard.render import node_lines

    one, two = (replace(r) for r in profile.rows[:2])
    for row, kernels in ((one, [1.5]), (two, [1.0, 2.0])):
        row.input_bytes, row.output_bytes, row.device_us, row.host_us = 3000, 1000, 2.0, 9.0
        row.kernels, row.kernel_us, row.overhead_us = len(kernels), kernels, 7.0
        row.kernel_names, row.schedulers = [f"nvfuser_pointwise_f0_c1_r0_g{i}" for i in kernels], ["pointwise"] * 2
    peak = Peak(4.0, "by hand")
    _bandwidth(one, peak)
    _bandwidth(two, peak)
    assert (one.gbps, one.peak_fraction) == (2.0, 0.5) and one.kernel_gbps == [pytest.approx(4000 / 1.5 / 1e3)]
    assert two.gbps == 2.0 and two.kernel_gbps == [None, None]
    cuda = RegionProfile("fn", "cuda", 2, [one, two], profile.decisions, profile.graphs, peak)
    text, wide = str(cuda), cuda.to_text(wide=True)
    assert "2.0 GB/s (50% peak)" in " ".join(text.split()) and "by hand" in text  # in each row's last part
    assert "GB/s" in wide and "% peak" in wide and " 50% " in wide  # a column each
    page = cuda.to_html()
    assert "% of peak" in page and "nvfuser_pointwise_f0_c1_r0_g1.5: 1.5 µs, 3 GB/s" in page
    region = next(n for n in profile.graphs[0].after.nodes if n.kind == "region")
    node = replace(region, device_us=2.0, kernels=2, schedulers=["pointwise", "reduction"])
    node.gbps, node.peak_fraction = 1500.0, 0.45
    assert {"2 kernels: pointwise+reduction", "1500 GB/s · 45% of peak"} <= set(node_lines(node))
