"""The self-contained HTML report: decisions, profile with sortable columns, pictures; no network needed."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from ..decisions import ACTIONS, Decision, Subgraph
from .svg import graph_svg
from .table import (
    Section,
    action_text,
    estimate_text,
    explanation_text,
    kernels_text,
    plural,
    reason_text,
    region_text,
    sections,
)
from .text import ACTION_STYLE, HOST_LEGEND_CPU, HOST_LEGEND_CUDA, MINUS, attr, human_bytes, ops_summary, totals_text

_CSS = """
body { font-family: DejaVu Sans, Verdana, Helvetica, Arial, sans-serif; margin: 20px 28px; color: #212121; }
h1 { font-size: 22px; margin: 0 0 6px; } h2 { font-size: 18px; margin: 26px 0 8px; border-bottom: 1px solid #cfd8dc; }
h3 { font-size: 15px; margin: 20px 0 6px; } .meta { color: #546e7a; font-size: 13px; margin: 2px 0; }
nav a { margin-right: 14px; font-size: 13px; }
table { border-collapse: collapse; font-size: 12.5px; margin: 6px 0 12px; }
th, td { border: 1px solid #cfd8dc; padding: 3px 7px; text-align: left; vertical-align: top; }
th { background: #eceff1; } table.sortable th { cursor: pointer; user-select: none; }
table.sortable th:after { content: " ⇅"; color: #90a4ae; font-size: 11px; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
td.ops { max-width: 360px; } td.reason { max-width: 520px; color: #37474f; }
td.reason summary { cursor: pointer; } td.reason details p { margin: 4px 0 0; color: #546e7a; }
.down { color: #2e7d32; font-weight: bold; } .up { color: #c62828; font-weight: bold; }
.pair { display: flex; flex-wrap: wrap; gap: 18px; align-items: flex-start; }
figure { margin: 0; border: 1px solid #cfd8dc; border-radius: 6px; padding: 8px; background: #fff;
  width: min-content; max-width: 100%; } figcaption { min-width: 360px; }
figure .scroll { overflow: auto; max-height: 1400px; }
figcaption { font-size: 12.5px; margin-bottom: 6px; color: #37474f; }
figcaption b { color: #212121; } .legend span { display: inline-block; margin-right: 12px; font-size: 12px; }
.legend i { display: inline-block; width: 14px; height: 11px; border: 2px solid; border-radius: 3px; margin-right: 4px;
  vertical-align: -1px; }
.action-keep { color: #2e7d32; } .action-reject { color: #c62828; } .action-rehome { color: #1565c0; }
.action-switch { color: #e65100; }
.action-fold { color: #6a1b9a; } .action-remove { color: #b26a00; } .action-hoist { color: #00695c; }
"""

_JS = """
document.querySelectorAll("table.sortable th").forEach(function (th) {
  th.addEventListener("click", function () {
    var table = th.closest("table"), body = table.tBodies[0], i = th.cellIndex;
    var dir = th.dataset.dir === "asc" ? -1 : 1;
    table.querySelectorAll("th").forEach(function (h) { delete h.dataset.dir; });
    th.dataset.dir = dir === 1 ? "asc" : "desc";
    function key(row) {
      var cell = row.cells[i], v = cell.dataset.v !== undefined ? cell.dataset.v : cell.textContent.trim();
      var n = parseFloat(v);
      return v !== "" && !isNaN(n) && isFinite(v) ? n : v;
    }
    Array.prototype.slice.call(body.rows).sort(function (a, b) {
      var x = key(a), y = key(b);
      if (typeof x !== typeof y) { return (typeof x === "number" ? -1 : 1) * dir; }
      return (x > y ? 1 : x < y ? -1 : 0) * dir;
    }).forEach(function (row) { body.appendChild(row); });
  });
});
window.addEventListener("load", function () {
  document.querySelectorAll("svg.dataflow").forEach(function (svg) {
    var box = svg.getBBox();
    svg.dataset.bbox = Math.round(box.width) + "x" + Math.round(box.height);
    svg.dataset.rendered = String(svg.querySelectorAll("g.node").length);
  });
  document.body.dataset.height = String(document.documentElement.scrollHeight);
  document.body.dataset.rendered = "yes";
});
"""


def _cell(text: Any, value: Any = None, cls: str = "") -> str:
    data = "" if value is None else f' data-v="{attr(value)}"'
    klass = f' class="{cls}"' if cls else ""
    return f"<td{klass}{data}>{attr(text)}</td>"


def _num(value: float | int | None, digits: int = 1, suffix: str = "") -> str:
    if value is None:
        return _cell("-", "", "num")
    text = f"{value:.{digits}f}{suffix}" if isinstance(value, float) else f"{value}{suffix}"
    return _cell(text, value, "num")


def _where(subgraph: str | None, trace: str, subgraphs: dict[str, Subgraph]) -> str:
    if subgraph is None:
        return trace
    sub = subgraphs.get(subgraph)
    name = f" ({sub.name})" if sub is not None and sub.name else ""
    return f"{subgraph}{name} / {trace}"


def _table(header: Sequence[str], rows: Sequence[str], table_id: str) -> str:
    head = "".join(f"<th>{attr(h)}</th>" for h in header)
    body = "".join(rows)
    return f'<table class="sortable" id="{table_id}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _delta(before: int, after: int) -> str:
    if before == after:
        return _cell("=", 0, "num")
    cls = "num down" if after < before else "num up"
    sign = MINUS if after < before else "+"
    return _cell(f"{sign}{human_bytes(abs(after - before))}", after - before, cls)


def _summary_table(pairs: Sequence[Any], subgraphs: dict[str, Subgraph]) -> str:
    header = ["program / trace", "bytes before", "bytes after", "change", "fusion calls before → after"]
    header += ["ops outside fusions before → after", "views before → after"]
    with_kernels = any(p.after.kernels_per_call is not None or p.after.region_kernels is not None for p in pairs)
    header += ["kernels per call after"] if with_kernels else []
    rows = []
    for p in pairs:
        b, a = p.before, p.after
        kernels = a.kernels_per_call if a.kernels_per_call is not None else a.region_kernels
        where = "" if a.kernels_per_call is not None else " in fusions"
        kernel_text = "-" if kernels is None else f"{kernels}{where}"
        kernel_cell = _cell(kernel_text, kernels if kernels is not None else "", "num") if with_kernels else ""
        rows.append(
            "<tr>"
            + _cell(_where(p.subgraph, p.trace, subgraphs))
            + _cell(human_bytes(b.boundary_bytes), b.boundary_bytes, "num")
            + _cell(human_bytes(a.boundary_bytes), a.boundary_bytes, "num")
            + _delta(b.boundary_bytes, a.boundary_bytes)
            + _cell(f"{b.fusion_calls} → {a.fusion_calls}", a.fusion_calls, "num")
            + _cell(f"{b.eager_ops} → {a.eager_ops}", a.eager_ops, "num")
            + _cell(f"{b.view_ops} → {a.view_ops}", a.view_ops, "num")
            + kernel_cell
            + "</tr>"
        )
    total_b = sum(p.before.boundary_bytes for p in pairs)
    total_a = sum(p.after.boundary_bytes for p in pairs)
    foot = (
        f"<p class='meta'>All traces: <b>{human_bytes(total_b)}</b> before the guard, <b>{human_bytes(total_a)}</b> "
        "after, read and written at kernel boundaries per call (each tensor a kernel writes and another node reads "
        "or the function returns, once; each tensor a kernel reads, once per reader; views move nothing).</p>"
    )
    return _table(header, rows, "summary") + foot


def _reason_cell(d: Decision) -> str:
    """The short reason; where the decision has a long explanation, the reason opens it (and hovering shows it)."""
    reason, explanation = reason_text(d), explanation_text(d)
    if not explanation:
        return _cell(reason, cls="reason")
    return (
        f'<td class="reason" data-v="{attr(reason)}" title="{attr(explanation)}"><details><summary>{attr(reason)}'
        f"</summary><p>{attr(explanation)}</p></details></td>"
    )


def _region_cell(d: Decision) -> str:
    """Where the user wrote the region and its name in the traces; hovering shows the whole source path."""
    source = d.details.get("source")
    if not source:
        return _cell(region_text(d))
    return f'<td data-v="{attr(region_text(d))}" title="{attr(source)}">{attr(region_text(d))}</td>'


def _decision_table(groups: Sequence[Section], subgraphs: dict[str, Subgraph]) -> str:
    decisions = [d for group in groups for d in group.decisions]
    with_kernels = any("kernels" in d.details for d in decisions)
    header = ["where", "region", "executor", "ops", *(["kernels"] if with_kernels else [])]
    header += ["action", "est µs region / eager", "reason"]
    rows = []
    for d in decisions:
        where = _where(d.subgraph, d.trace, subgraphs)
        if d.function:
            where = f"{d.function}#{d.compile_index}: {where}"
        cells = [_cell(where), _region_cell(d), _cell(d.executor), _cell(ops_summary(d.ops), len(d.ops), "ops")]
        if with_kernels:
            cells.append(_cell(kernels_text(d.details)))
        cells += [
            f'<td class="action-{attr(d.action)}">{attr(action_text(d))}</td>',
            _cell(estimate_text(d), d.estimates.get("est_region_us", ""), "num"),
            _reason_cell(d),
        ]
        rows.append("<tr>" + "".join(cells) + "</tr>")
    return _table(header, rows, "decisions")


def _kernel_cell(row: Any) -> str:
    if row.kernels is None:
        return _cell("-", "")
    lines = [f"{row.kernels}: {'+'.join(row.schedulers)}" if row.schedulers else str(row.kernels)]
    for i, us in enumerate(row.kernel_us):
        name = row.kernel_names[i] if i < len(row.kernel_names) else f"kernel {i}"
        bw = row.kernel_gbps[i] if i < len(row.kernel_gbps) else None
        lines.append(f"{name}: {us:.1f} µs" + (f", {bw:.0f} GB/s" if bw is not None else ""))
    inner = "<br>".join(attr(line) for line in lines)
    return f'<td data-v="{row.kernels}">{inner}</td>'


def _profile_table(profile: Any, subgraphs: dict[str, Subgraph]) -> str:
    cuda = profile.device == "cuda"
    header = ["where", "region", "executor", "ops", "in KiB", "out KiB", "host µs", "eager µs"]
    header += ["device µs", "GB/s", "% of peak", "kernels", "overhead µs"] if cuda else [f"host {MINUS} eager µs"]
    header += ["action", "reason"]
    rows = []
    for r in profile.rows:
        cells = [_cell(_where(r.subgraph, r.trace, subgraphs)), _cell(r.region), _cell(r.executor)]
        cells.append(_cell(f"{r.n_ops}: {ops_summary(r.ops)}", r.n_ops, "ops"))
        cells += [_num(None if r.input_bytes is None else r.input_bytes / 1024)]
        cells += [_num(None if r.output_bytes is None else r.output_bytes / 1024)]
        cells += [_num(r.host_us), _num(r.eager_us)]
        if cuda:
            pct = None if r.peak_fraction is None else 100 * r.peak_fraction
            cells += [_num(r.device_us), _num(r.gbps, 0), _num(pct, 0, "%"), _kernel_cell(r), _num(r.overhead_us)]
        else:
            cells.append(_num(r.excess_us))
        reason = r.reason or ""
        if r.error:
            reason = f"{reason} [{r.error}]".strip()
        cells += [
            f'<td class="action-{attr(r.action or "")}">{attr(r.action or "-")}</td>',
            _cell(reason, cls="reason"),
        ]
        rows.append("<tr>" + "".join(cells) + "</tr>")
    what = (
        f"µs: median of {profile.reps} calls of each region's own callable with its real inputs. "
        f"{HOST_LEGEND_CUDA if cuda else HOST_LEGEND_CPU}."
    )
    if cuda:
        peak = "unknown" if profile.peak is None else f"{profile.peak.gbps:.0f} GB/s ({profile.peak.source})"
        what += (
            f" GB/s: input + output bytes over device time; peak memory bandwidth {peak}. Above 100%: the "
            "region reads less than its whole inputs (an embedding table, a gather)."
        )
    return f"<p class='meta'>{attr(what)}</p>" + _table(header, rows, "profile")


def _legend() -> str:
    items = [(a, *ACTION_STYLE[a]) for a in ACTIONS if a in ACTION_STYLE]
    spans = [f'<span><i style="background:{f};border-color:{s}"></i>region: {attr(a)}</span>' for a, f, s in items]
    spans.append(
        f'<span><i style="background:{ACTION_STYLE[None][0]};border-color:{ACTION_STYLE[None][1]}"></i>'
        "region (not guarded)</span>"
    )
    spans.append('<span><i style="background:#fff;border-color:#616161"></i>op outside a fusion (a kernel)</span>')
    spans.append(
        '<span><i style="background:#fafafa;border-color:#9e9e9e;border-style:dashed"></i>view (no kernel)</span>'
    )
    spans.append(
        "<span>edge: tensors handed over, labelled with their bytes (count); thicker = more bytes; "
        "hover for names and shapes</span>"
    )
    return '<p class="legend">' + "".join(spans) + "</p>"


def _program_title(subgraph: str | None, function: str | None, subgraphs: dict[str, Subgraph]) -> str:
    if subgraph is None:
        return function or "jitted function"
    sub = subgraphs.get(subgraph)
    return subgraph if sub is None or sub.name is None else f"{subgraph} ({sub.name})"


def _pictures(pairs: Sequence[Any], subgraphs: dict[str, Subgraph], groups: Sequence[Section]) -> str:
    """A heading per program (the function, or each ThunderFX subgraph), then its pictures side by side:
    forward and backward, before and after the guard (one picture where the guard changed nothing)."""
    parts = [_legend()]
    notes = {id(group.subgraph): group.notes for group in groups if group.subgraph is not None}
    splits = {id(group.subgraph): group.split_lines for group in groups if group.subgraph is not None}
    programs: dict[str | None, list[Any]] = {}
    for p in pairs:
        programs.setdefault(p.subgraph, []).append(p)
    for subgraph, mine in programs.items():
        parts.append(f"<h3>{attr(_program_title(subgraph, mine[0].function, subgraphs))}</h3>")
        sub = subgraphs.get(subgraph) if subgraph else None
        if sub is not None:
            parts.append(f"<p class='meta'>fx ops: {attr(', '.join(sub.ops))}</p>")
            parts += [f"<p class='meta'>{attr(split)}</p>" for split in splits.get(id(sub), [])]
            parts += [f"<p class='meta'>{attr(note)}</p>" for note in notes.get(id(sub), [])]
        parts.append('<div class="pair">')
        for p in mine:
            stages = [("before the guard", p.before), ("after the guard", p.after)] if p.changed else []
            for label, graph in stages or [("unchanged by the guard", p.after)]:
                parts.append(
                    f'<figure data-trace="{attr(p.trace)}" data-stage="{attr(graph.stage)}"><figcaption>'
                    f"<b>{attr(p.trace)}, {attr(label)}</b>: {attr(totals_text(graph))}</figcaption>"
                    f"<div class='scroll'>{graph_svg(graph)}</div></figure>"
                )
        parts.append("</div>")
    return "\n".join(parts)


def html_page(
    title: str,
    decisions: Sequence[Decision],
    subgraphs: dict[str, Subgraph] | None = None,
    *,
    profile: Any | None = None,
    graphs: Sequence[Any] = (),
    meta: Sequence[str] = (),
    recompiles: dict[str, list[str]] | None = None,
    extra_sections: Sequence[str] = (),
) -> str:
    """The HTML report: summary of bytes at kernel boundaries, the pictures, the profile, the decisions, and
    ``extra_sections`` (pre-rendered HTML, such as the why-not-fused table) last.
    A program Thunder compiled more than once gets a line saying so, why, and which compilation is shown."""
    subgraphs = subgraphs or {}
    groups = sections(decisions, subgraphs, recompiles)
    parts = []
    nav = []
    if graphs:
        nav += ['<a href="#summary">bytes at kernel boundaries</a>', '<a href="#pictures">pictures</a>']
        parts.append("<h2 id='summary'>Bytes at kernel boundaries, fusion calls and kernels</h2>")
        parts.append(_summary_table(graphs, subgraphs))
        pictures = _pictures(graphs, subgraphs, groups)
        parts.append("<h2 id='pictures'>Dataflow before and after the guard</h2>" + pictures)
    if profile is not None:
        nav.append('<a href="#profile">profile</a>')
        parts.append("<h2 id='profile'>Profile</h2>" + _profile_table(profile, subgraphs))
    nav.append('<a href="#decisions">decisions</a>')
    counts = Counter(d.action for d in decisions)
    summary = ", ".join(f"{counts[a]} {a}" for a in ACTIONS if counts[a]) or "none"
    where = f" in {plural(len(subgraphs), 'subgraph')}" if subgraphs else ""
    parts.append(f"<h2 id='decisions'>Decisions ({len(decisions)}: {attr(summary)}){where}</h2>")
    if profile is not None:
        parts.append("<p class='meta'>Of the latest compilation of each program: the one profiled and pictured.</p>")
    for group in groups:
        prefix = f"{group.title}: " if group.subgraph is not None else ""
        parts += [f"<p class='meta'>{attr(prefix + note)}</p>" for note in group.notes]
    parts.append(_decision_table(groups, subgraphs) if decisions else "<p>No fusion region seen.</p>")
    for i, section in enumerate(extra_sections):
        nav.append(f'<a href="#section-{i}">{"why not fused" if "why-not-fused" in section else "more"}</a>')
        parts.append(f"<div id='section-{i}'>{section}</div>")
    head_meta = "".join(f"<p class='meta'>{attr(m)}</p>" for m in meta)
    return (
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
        f"<title>{attr(title)}</title><style>{_CSS}</style></head>\n<body>"
        f"<h1>{attr(title)}</h1>{head_meta}<nav>{''.join(nav)}</nav>\n"
        + "\n".join(parts)
        + f"\n<script>{_JS}</script></body></html>\n"
    )
