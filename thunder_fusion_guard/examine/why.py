"""Why an op is not in a fusion region: every op left outside the regions of a compiled program, with the
reason recovered by re-running Thunder's own decision steps (executor claims in ``executors_list`` order,
the fusion executor's ``can_fuse`` walking the op's decomposition, its checkers under the program's compile
options, the fusion pass's region rules), and each split, rematerialized and (nvFuser) segmented region.

Runs only when asked, after the program ran; it reads the last traces and changes neither them nor outputs.
"""

from __future__ import annotations

import html
import itertools
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from .. import _thunder as th
from .._thunder import partition as pt
from ..ops.metadata import runs_as_view
from ..passes.hoist_runtime import HOISTED_NAME
from ..render.table import plural, text_table, wrapped
from ..render.text import human_bytes
from ..transform import guards_of
from ..wording import WIDTH, error_line, fit

KINDS = (
    "outside_thunder",
    "claimed",
    "no_translation",
    "checker",
    "option",
    "region_refused",
    "split",
    "rematerialized",
    "segmented",
    "rescue",
    "not_analysed",
    "no_fusion_executor",
    "unknown",
)
NO_FIX = "none: no executor here can fuse it"


@dataclass
class WhyRow:
    """One op (or counted group of cost-free view ops, or one split/rematerialized/segmented region) and why
    it is not inside a fusion region."""

    trace: str
    subgraph: str | None
    op: str
    source: str | None
    kind: str
    reason: str
    established_by: str
    bytes: int | None
    try_: str
    count: int = 1
    executor: str | None = None
    ops: list[str] = field(default_factory=list)
    detail: str = ""  # what does not fit the one-line reason (nvFuser's verdicts, each edge tensor's bytes)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class WhyReport:
    """Every op outside a fusion region of a program's last forward and backward traces, with why."""

    rows: list[WhyRow]
    regions: int = 0
    kernels: int | None = None

    def ranked(self) -> list[WhyRow]:
        return sorted(self.rows, key=lambda r: (-(r.bytes or 0), r.trace, r.kind, r.op))

    def of_kind(self, kind: str) -> list[WhyRow]:
        return [r for r in self.rows if r.kind == kind]

    def summary(self) -> str:
        """One line of counts: ops outside fusions by kind, splits, rematerializations, segmented regions."""
        outside = [
            r for r in self.rows if r.kind not in ("split", "rematerialized", "segmented", "rescue", "not_analysed")
        ]
        n = sum(r.count for r in outside)
        parts = []
        claimed = [r for r in outside if r.kind == "claimed"]
        if claimed:
            by = sorted({r.executor or "?" for r in claimed})
            parts.append(f"{sum(r.count for r in claimed)} claimed by {'/'.join(by)}")
        labels = {
            "outside_thunder": "outside Thunder (ThunderFX split)",
            "no_translation": "no translation",
            "checker": "refused by a checker",
            "option": "behind a compile option",
            "region_refused": "in refused regions",
            "no_fusion_executor": "with no general fusion executor",
            "unknown": "unknown",
        }
        for kind, label in labels.items():
            count = sum(r.count for r in outside if r.kind == kind)
            if count:
                parts.append(f"{count} {label}")
        text = f"{plural(n, 'op')} outside fusions" + (f": {', '.join(parts)}" if parts else "")
        splits = len(self.of_kind("split"))
        if splits:
            text += f"; {plural(splits, 'region')} split"
        remat = self.of_kind("rematerialized")
        if remat:
            text += f"; {plural(len(remat), 'rematerialization')}"
        seg = self.of_kind("segmented")
        if seg:
            kernels = sum(r.count for r in seg)
            text += f"; {plural(len(seg), 'region')} run as {kernels} segments"
        rescued = self.of_kind("rescue")
        if rescued:
            text += f"; {plural(len(rescued), 'rescue')} (failed, run another way)"
        unread = self.of_kind("not_analysed")
        if unread:
            text += f"; {len(unread)} not analysed"
        return text

    def to_dict(self) -> dict[str, Any]:
        return {"summary": self.summary(), "regions": self.regions, "rows": [r.to_dict() for r in self.ranked()]}

    def __str__(self) -> str:
        return self.to_text()

    def to_text(self, wide: bool = False) -> str:
        """The summary and the ranked table: lines of at most 120 characters, long cells wrapped at spaces, never
        cut; ``wide``: one line per row, however long."""
        header = ("trace", "subgraph", "op", "kind", "bytes", "reason", "try", "source")
        lines = [
            (
                r.trace,
                r.subgraph or "",
                r.op + (f" x{r.count}" if r.count > 1 and r.kind not in ("segmented",) else ""),
                r.kind,
                _bytes(r.bytes),
                r.reason,
                r.try_,
                r.source or "",
            )
            for r in self.ranked()
        ]
        width = None if wide else WIDTH
        return "\n".join([*wrapped(self.summary(), width, "  "), _table(header, lines, width)])

    def to_html(self) -> str:
        """An HTML ``<section>`` with the summary and the ranked table (all text escaped)."""
        e = html.escape
        cells = "".join(
            "<tr>"
            + "".join(
                f"<td>{e(str(v))}</td>"
                for v in (
                    r.trace,
                    r.subgraph or "",
                    r.op,
                    r.count,
                    r.kind,
                    _bytes(r.bytes),
                    r.reason + (f" ({r.detail})" if r.detail else ""),
                    r.established_by,
                    r.try_,
                    r.source or "",
                )
            )
            + "</tr>"
            for r in self.ranked()
        )
        head = "".join(
            f"<th>{h}</th>"
            for h in ("trace", "subgraph", "op", "count", "kind", "bytes", "reason", "established by", "try", "source")
        )
        return (
            f'<section class="why-not-fused"><h2>Why not fused</h2><p>{e(self.summary())}</p>'
            f"<table><thead><tr>{head}</tr></thead><tbody>{cells}</tbody></table></section>"
        )


def _bytes(n: int | None) -> str:
    return "?" if n is None else human_bytes(n)


def _table(header: Sequence[str], lines: Sequence[Sequence[str]], width: int | None = WIDTH) -> str:
    """The rows through the package's one text table, fitting ``width`` (subgraph, op, reason and try wrapped,
    the last column under its row where it has too little room, never cut; None: one line each)."""
    return "\n".join(text_table([list(header), *lines], last_free=True, width=width, wrap=(1, 2, 5, 6)))


# --- what to explain -------------------------------------------------------------------------------------


def why_not_fused(fn: Any, *args: Any, backward: bool = True, **kwargs: Any) -> WhyReport:
    """Why each op of ``fn``'s last run is outside a fusion region. ``fn``: a ``thunder.jit`` function or
    module, a ThunderFX-compiled module (``thunder.dynamo.thunderfx``) or its ``ThunderCompiler``, after it
    ran. Where a FusionGuard rewrote the traces, the traces as Thunder made them are read.

    Given ``args`` (and ``kwargs``), ``fn`` runs once more (and its backward, with ``backward``) to record each
    nvFuser region's arguments, and every region nvFuser ran as several kernels gets a ``segmented`` row."""
    rows: list[WhyRow] = []
    if th.is_thunderfx(fn):
        programs = [(sub.jitted, sub.label, "thunderfx") for sub in th.thunderfx_subgraphs(fn)]
        rows += [outside_thunder_row(op) for op in th.thunderfx_split_ops(fn)]
    elif th.is_jitted(fn):
        programs = [(fn, None, "thunder.jit")]
    else:
        raise TypeError(f"{type(fn).__name__} is neither a thunder.jit function nor a thunderfx object")
    rescues = rescue_rows(fn)
    rows += rescues
    regions = ran = 0
    for jitted, subgraph, frontend in programs:
        if getattr(th.module_call(jitted), "rescued", False) if frontend == "thunderfx" else False:
            continue  # Thunder failed on it: its rescue row says what runs it
        forward, backward = th.traces_before_guard(jitted)
        if forward is None:  # a subgraph compiled but not run yet
            continue
        ran += 1
        try:
            rows += _program_rows(jitted, forward, backward, subgraph, frontend)
        except Exception as e:  # the report is still returned, saying what it could not read
            rows.append(_not_analysed(subgraph, "forward", "the program's traces", e))
        regions += sum(1 for t in (forward, backward) if t is not None for b in t.bound_symbols if th.is_fusion(b))
    if not ran and not rows:
        raise RuntimeError("no trace to read: call the compiled function first")
    if args or kwargs:
        try:
            rows += _kernel_rows(fn, args, kwargs, backward)
        except Exception as e:
            rows.append(_not_analysed(None, "forward", "nvFuser's kernels of one more run", e))
    return WhyReport(_grouped(rows), regions)


def _program_rows(jitted: Any, forward: Any, backward: Any, subgraph: str | None, frontend: str) -> list[WhyRow]:
    rows: list[WhyRow] = []
    cd = pt.compile_data_of(jitted)
    context = _Context(cd, pt.executors_list(cd), subgraph, frontend, _auto_registered(jitted))
    for kind, trace in (("forward", forward), ("backward", backward)):
        if trace is not None:
            rows += explain_trace(trace, kind, context)
    if backward is not None:
        rows += _recomputed_in_backward(forward, backward, subgraph)
    rows += _numbering_gaps([("forward", forward), ("backward", backward)], subgraph)
    return rows


def _not_analysed(subgraph: str | None, trace: str, what: str, error: Exception, region: str = "-") -> WhyRow:
    return WhyRow(
        trace, subgraph, region, None, "not_analysed", f"{what} could not be analysed: {error_line(error)}",
        "FusionGuard", None, NO_FIX, detail=str(error),
    )  # fmt: skip


def rescue_rows(fn: Any) -> list[WhyRow]:
    """A ``rescue`` row for each region or ThunderFX subgraph the guards of ``fn`` rescued: it failed in Thunder
    or its fusion executor, and runs another way (the decision's ``details`` say how)."""
    rows = []
    for guard in guards_of(fn):
        for d in guard.report.filter(action="rescue"):
            if d.error is None:
                continue  # outputs restrided: nothing failed
            sub = guard.report.subgraphs.get(d.subgraph) if d.subgraph else None
            label = (sub.name or sub.id) if sub is not None else d.subgraph
            repro = "; details['reproduction'] reproduces it alone" if d.details.get("reproduction") else ""
            rows.append(
                WhyRow(
                    d.trace, label, d.region, d.details.get("source"), "rescue", d.reason, "FusionGuard rescue",
                    None, f"runs by {d.details.get('rescued_by', '?')} now{repro}", executor=d.executor,
                    ops=list(d.ops), detail=str(d.details.get("explanation", "")),
                )
            )  # fmt: skip
    return rows


# Rewrites that keep an op ThunderFX splits off inside Thunder, checked on thunder 0.2.6 (tests/test_why.py).
OUTSIDE_THUNDER_FIX = {
    "Tensor.index_add": "scatter_add(dim, index expanded to src's shape, src): Thunder has its gradient",
    "torch.index_add": "scatter_add(dim, index expanded to src's shape, src): Thunder has its gradient",
    "Tensor.norm": "x.pow(2).sum(dim).sqrt() (rounds differently from norm)",
    "torch.norm": "x.pow(2).sum(dim).sqrt() (rounds differently from norm)",
    "Tensor.new_zeros": "torch.zeros(shape, dtype=x.dtype, device=x.device)",
    "Tensor.new_ones": "torch.ones(shape, dtype=x.dtype, device=x.device)",
}
_SPLIT_REASONS = {
    "MISSING_OP_SUPPORT": "Thunder has no mapping for it",
    "UNSUPPORTED_NODE": "it is in a context Thunder does not support",
    "EXCEPTION_PROXY_THUNDER_OP": "Thunder failed to trace it",
    "EXCEPTION_META_THUNDER_OP": "Thunder failed to trace it",
}


def _outside_thunder_fix(target: str) -> str:
    """What keeps the op ``target`` in Thunder: the package's translation where it has one (no code to edit),
    else a rewrite, else nothing."""
    translation = th.translation_for([target])
    if translation is not None:
        return f"thunder_fusion_guard.translate_library_ops() before compiling: {translation.built_from} in Thunder"
    return OUTSIDE_THUNDER_FIX.get(target, "none here: ThunderFX runs it with Inductor")


def outside_thunder_row(op: th.FxSplitOp) -> WhyRow:
    """The row of a node ThunderFX kept out of Thunder: it runs through Inductor between Thunder subgraphs,
    each boundary a graph split (a Thunder program call more, and its inputs and outputs in memory)."""
    if "automatic torch fallback" in op.info:
        reason = "Thunder has only an automatic torch fallback for it"
    else:
        reason = _SPLIT_REASONS.get(op.kind, "ThunderFX split the graph here")
    if op.exception:
        reason += ": " + op.exception.strip().splitlines()[0]
    return WhyRow(
        "forward",
        f"dynamo graph {op.graph}",
        op.target,
        op.source,
        "outside_thunder",
        reason[:100],
        f"thunder.dynamo splitter ({op.kind})",
        op.nbytes,
        _outside_thunder_fix(op.target),
        detail=op.info + (f" ({op.exception})" if op.exception else ""),
    )


def _kernel_rows(fn: Any, args: tuple, kwargs: dict, backward: bool) -> list[WhyRow]:
    """``segmented`` rows for the nvFuser regions of one more run of ``fn`` (none off CUDA)."""
    from .calls import program_calls

    rows: list[WhyRow] = []
    for program in program_calls(fn, args, kwargs, backward):
        for call in program.calls:
            replay = call.replay_args()
            if call.region.executor != "nvfuser" or replay is None:
                continue
            region_fn = th.region_callable(call.region.bsym)
            if getattr(region_fn, "rescued", False):
                continue  # nvFuser failed on it: its rescue row says so
            try:
                region_fn(*replay)  # the most recent scheduled IR is then this region's, for these inputs
                rows += segmented_rows(region_fn, replay, call.trace, call.region.name, program.subgraph)
            except Exception as e:  # a region nvFuser's scheduler queries cannot analyse
                what = f"{call.region.name}'s nvFuser segments"
                rows.append(_not_analysed(program.subgraph, call.trace, what, e, call.region.name))
    return rows


def _auto_registered(jitted: Any) -> set[str]:
    import thunder

    try:
        return set(thunder.get_auto_registered_torch_op_names(jitted) or ())
    except Exception:
        return set()


@dataclass
class _Context:
    cd: Any
    executors: list[Any]
    subgraph: str | None
    frontend: str
    auto_registered: set[str]

    @property
    def fusers(self) -> list[Any]:
        return [ex for ex in self.executors if isinstance(ex, th.FusionExecutor)]

    def index(self, ex: Any) -> int:
        return next((i for i, e in enumerate(self.executors) if e is ex), len(self.executors))

    def option_fix(self, option: str) -> str:
        call = "thunderfx" if self.frontend == "thunderfx" else "thunder.jit"
        return f"{call}(fn, {option}=True)"


def _is_work(bsym: Any) -> bool:
    return not (th.is_plumbing(bsym) or bsym.sym.name == HOISTED_NAME or th.is_fusion(bsym))


def _io_bytes(bsym: Any) -> int | None:
    total = 0
    for p in {id(x): x for x in th.tensor_proxies([*bsym.flat_args, *bsym.flat_outs])}.values():
        n = th.tensor_nbytes(p)
        if n is None:
            return None
        total += n
    return total


def explain_trace(trace: Any, kind: str, context: _Context) -> list[WhyRow]:
    """The rows of one final trace: each op outside a region, each split, each numbering gap and each output
    computed in two regions."""
    rows: list[WhyRow] = []
    views: dict[tuple[str, str], list[WhyRow]] = {}
    for bsym in trace.bound_symbols:
        if not _is_work(bsym):
            continue
        row = explain_op(bsym, kind, context)
        if runs_as_view(bsym) or not th.tensor_proxies([*bsym.flat_args, *bsym.flat_outs]):
            row.bytes = 0
            views.setdefault((row.kind, row.executor or ""), []).append(row)
        else:
            rows.append(row)
    for group in views.values():
        first = group[0]
        if len(group) > 1:
            names = [r.op for r in group]
            first.op = "views: " + ", ".join(dict.fromkeys(names))
            first.count = len(group)
            first.ops = names
            first.source = None
        rows.append(first)
    rows += _splits(trace, kind, context)
    rows += _rematerialized(trace, kind, context.subgraph)
    return rows


def explain_op(bsym: Any, kind: str, context: _Context) -> WhyRow:
    """Why ``bsym`` (an op of a final trace, outside every region) is not in a region."""
    claimer, _ = pt.implementing_executor(bsym, context.executors)
    original = pt.original_op(bsym, context.executors)
    name = pt.qualified_name(original)
    row = WhyRow(
        kind,
        context.subgraph,
        name,
        th.source_line(bsym, original),
        "unknown",
        "",
        "",
        _io_bytes(bsym),
        "",
        1,
        getattr(claimer, "name", None),
    )
    fusers = context.fusers
    takers = takers_of(fusers, original, context)
    if not takers and all(f.name in th.NARROW_FUSERS for f in fusers):
        row.kind, row.established_by = "no_fusion_executor", "executors_list"
        few = f" (only {', '.join(f.name for f in fusers)}, which fuses a few ops)" if fusers else ""
        row.reason = f"no general fusion executor in executors{few}"
        call = "thunderfx" if context.frontend == "thunderfx" else "thunder.jit"
        row.try_ = f"{call}(fn, executors=fusion_executors(device)) (thunder_fusion_guard)"
        return row
    if takers:
        fuser = takers[0]
        if (
            claimer is not None
            and not isinstance(claimer, th.FusionExecutor)
            and context.index(claimer) < context.index(fuser)
        ):
            row.kind, row.established_by = "claimed", "executor order"
            row.reason = f"{claimer.name} is before {fuser.name} in executors and claims it; {fuser.name} can fuse it"
            row.try_ = f"put {fuser.name} before {claimer.name} in executors=[...], or drop {claimer.name}"
            return row
        return _refused_region(row, bsym, original, fuser, context)
    fuser = _primary(fusers)
    refusal = pt.first_refusal(fuser, original, context.cd)
    if refusal is None:  # can_fuse said no, the walk found nothing: report what was tried
        row.reason = f"{fuser.name}.can_fuse says no; its decomposition walk finds no refusing op"
        row.established_by, row.try_ = "decomposition walk", NO_FIX
        return row
    refused = refusal.checker_refused
    if refused is not None:
        option = pt.refusing_option(fuser, refused, context.cd)
        what = pt.qualified_name(refused)
        if option is not None:
            row.kind, row.established_by = "option", "checker re-run"
            row.reason = f"{fuser.name}'s checker for {what} needs compile option {option} (off)"
            row.try_ = context.option_fix(option)
            return row
        row.kind, row.established_by = "checker", "checker re-run"
        row.reason = f"{fuser.name}'s checker for {what} refuses these arguments ({_args_text(refused)})"
        row.try_ = NO_FIX
        return row
    leaf = refusal.leaf
    row.kind = "no_translation"
    row.established_by = "checker re-run" if leaf is original else "decomposition walk"
    auto = pt.is_auto_registered(original) or original.sym.id in context.auto_registered
    where = "" if leaf is original else f" (first in its decomposition: {pt.qualified_name(leaf)})"
    row.reason = f"{fuser.name} has no translation for {pt.qualified_name(leaf)}{where if where else ''}" + (
        "; a torch fallback Thunder registered itself" if auto else ""
    )
    if leaf is not original:
        row.reason = f"{fuser.name} cannot execute {pt.qualified_name(leaf)}, first in its decomposition"
        if auto:
            row.reason += "; a torch fallback Thunder registered itself"
    row.try_ = NO_FIX
    return row


def takers_of(fusers: Sequence[Any], original: Any, context: _Context) -> list[Any]:
    """The fusion executors of ``fusers`` that can fuse ``original``."""
    return [f for f in fusers if pt.can_fuse(f, original, context.cd)]


def _grouped(rows: list[WhyRow]) -> list[WhyRow]:
    """Rows that say the same (trace, subgraph, kind, reason, try) of different ops as one row with a count, where
    they are of kind ``no_fusion_executor`` (one piece of advice, not one per op)."""
    out: list[WhyRow] = []
    groups: dict[tuple, WhyRow] = {}
    for r in rows:
        if r.kind != "no_fusion_executor":
            out.append(r)
            continue
        key = (r.trace, r.subgraph, r.kind, r.reason, r.try_)
        first = groups.get(key)
        if first is None:
            groups[key] = r
            r.ops = r.ops or [r.op]
            out.append(r)
            continue
        first.count += r.count
        first.ops.append(r.op)
        first.bytes = None if first.bytes is None or r.bytes is None else first.bytes + r.bytes
        first.op = f"{first.count} ops"
        first.source = None
    return out


def _primary(fusers: Sequence[Any]) -> Any:
    general = [f for f in fusers if f.name in th.GENERAL_FUSERS]
    return (general or list(fusers))[0]


def _args_text(bsym: Any) -> str:
    parts = []
    for a in bsym.flat_args:
        if th.tensor_proxies([a]):
            spec = th.tensor_spec(a)
            parts.append(f"{spec[1]}{list(spec[0])} on {spec[2]}".replace("torch.", "") if spec else a.name)
        elif th.is_number_like(a):
            parts.append(repr(a))
    return fit(", ".join(parts), 60)


def _refused_region(row: WhyRow, bsym: Any, original: Any, fuser: Any, context: _Context) -> WhyRow:
    """``fuser`` can fuse the op, yet the fusion pass left it out: re-run the pass's region rules."""
    row.established_by = "fusion pass re-run"
    required = getattr(fuser, "required_ops", None)
    if required is not None and original.sym.id not in required:
        row.kind = "region_refused"
        row.reason = f"{fuser.name} makes regions only around {', '.join(sorted(map(str, required)))}"
        row.try_ = NO_FIX if not [f for f in context.fusers if f.name in th.GENERAL_FUSERS] else "none needed"
        return row
    cuda = pt.has_cuda_io(fuser, original)
    if cuda is False:
        row.kind = "region_refused"
        row.reason = f"{fuser.name} fuses ops with a CUDA tensor input or output only"
        row.try_ = "move the tensors to CUDA, or use a fusion executor for this device"
        return row
    if fuser.name == "nvfuser" and pt.is_shape_only([original]):
        options = getattr(context.cd, "compile_options", None) or {}
        if not options.get("nv_enable_shape_only_fusion"):
            row.kind = "region_refused"
            row.reason = "nvfuser makes no region of shape ops alone"
            row.try_ = context.option_fix("nv_enable_shape_only_fusion")
            return row
    row.reason = (
        f"{fuser.name} can fuse it and no executor before it claims it; tried: region rules (required ops, "
        "CUDA input/output, shape-only), none applies"
    )
    row.try_ = NO_FIX
    return row


# --- regions: splits, rematerialization ------------------------------------------------------------------

_NUMBERED = re.compile(r"^(?P<stem>.*?)(?P<n>\d+)$")


def _regions(trace: Any) -> list[tuple[int, Any]]:
    return [(i, b) for i, b in enumerate(trace.bound_symbols) if th.is_fusion(b)]


def _names(values: Iterable[Any]) -> set[str]:
    return {getattr(p, "name", None) for p in th.tensor_proxies(list(values))} - {None}


def _splits(trace: Any, kind: str, context: _Context) -> list[WhyRow]:
    rows = []
    by_executor: dict[str, list[tuple[int, Any]]] = {}
    for i, b in _regions(trace):
        by_executor.setdefault(th.executor_name(b), []).append((i, b))
    mode = pt.fusion_type(context.cd)
    for executor, regions in by_executor.items():
        for (i, first), (j, second) in itertools.pairwise(regions):
            between = [b for b in trace.bound_symbols[i + 1 : j] if _is_work(b) and not th.is_fusion(b)]
            crossing = _names(first.flat_outs) & _names(second.flat_args)
            nbytes = 2 * sum(th.tensor_nbytes(p) or 0 for p in th.tensor_proxies(first.flat_outs) if p.name in crossing)
            names = [pt.qualified_name(b) for b in between]
            row = WhyRow(
                kind,
                context.subgraph,
                f"{first.sym.name} | {second.sym.name}",
                None,
                "split",
                "",
                "",
                nbytes,
                "",
                1,
                executor,
                names,
            )
            if mode == "consecutive" and between:
                row.reason = f"{len(between)} op(s) between that {executor} could not take: {', '.join(names[:4])}"
                row.established_by = "consecutive fusion re-run"
            elif between and _depends_through(trace, i, j, between):
                row.reason = f"merging would make a cycle through {', '.join(names[:4])}"
                row.established_by = "dataflow re-run"
            else:
                row.kind = "unknown"
                row.reason = f"two {executor} regions not merged; tried: ops between ({len(between)}), cycle check"
                row.established_by = f"{mode} fusion re-run"
            row.try_ = "see the rows of the ops between" if between else NO_FIX
            rows.append(row)
    return rows


def _depends_through(trace: Any, i: int, j: int, between: list[Any]) -> bool:
    """True when region ``j`` reads, through ops of ``between``, what region ``i`` wrote."""
    reached = _names(trace.bound_symbols[i].flat_outs)
    via = False
    for b in between:
        if _names(b.flat_args) & reached:
            reached |= _names(b.flat_outs)
            via = True
    return via and bool(_names(trace.bound_symbols[j].flat_args) & reached)


def _numbering_gaps(traces: list[tuple[str, Any]], subgraph: str | None) -> list[WhyRow]:
    """A row per fusion number missing across a program's traces (Thunder numbers the backward's regions on
    from the forward's): rematerialization moved that region's ops into its consumers and it was removed."""
    numbers: dict[tuple[str, str], dict[int, str]] = {}
    for kind, trace in traces:
        for _, region in _regions(trace) if trace is not None else []:
            match = _NUMBERED.match(region.sym.name)
            if match:
                numbers.setdefault((th.executor_name(region), match["stem"]), {})[int(match["n"])] = kind
    rows = []
    for (executor, stem), seen in numbers.items():
        for n in sorted(set(range(max(seen) + 1)) - set(seen)):
            kind = seen.get(max(k for k in seen if k < n), "forward") if any(k < n for k in seen) else "forward"
            rows.append(
                WhyRow(
                    kind, subgraph, f"{stem}{n}", None, "rematerialized",
                    f"{stem}{n} is gone: rematerialization moved its ops into the regions that consume them",
                    "fusion numbering", 0, "none needed: recomputing saves the write and read", 1, executor,
                )
            )  # fmt: skip
    return rows


def _rematerialized(trace: Any, kind: str, subgraph: str | None) -> list[WhyRow]:
    """A row per pair of regions of one trace that both compute the same outputs."""
    produced: dict[str, list[tuple[str, Any]]] = {}
    for _, region in _regions(trace):
        for sub in region.subsymbols:
            for name in _names(sub.flat_outs):
                produced.setdefault(name, []).append((region.sym.name, sub))
    rows = []
    pairs: dict[tuple[str, ...], list[Any]] = {}
    for places in produced.values():
        regions = tuple(dict.fromkeys(r for r, _ in places))
        if len(regions) > 1:
            pairs.setdefault(regions, []).append(places[0][1])
    for regions, subs in pairs.items():
        names = [pt.qualified_name(s) for s in subs]
        rows.append(
            WhyRow(
                kind, subgraph, ", ".join(dict.fromkeys(names)), th.source_line(*subs), "rematerialized",
                f"computed in each of {', '.join(regions)} (rematerialization)", "output names", 0,
                "none needed: recomputing saves the write and read", len(subs), None, names,
            )
        )  # fmt: skip
    return rows


def _recomputed_in_backward(forward: Any, backward: Any, subgraph: str | None) -> list[WhyRow]:
    """Ops a forward region computes and a backward region computes again instead of reading it saved."""
    made = {}
    for _, region in _regions(forward):
        for sub in region.subsymbols:
            for name in _names(sub.flat_outs):
                made[name] = region.sym.name
    pairs: dict[tuple[str, str], list[Any]] = {}
    for _, region in _regions(backward):
        for sub in region.subsymbols:
            hit = [made[n] for n in _names(sub.flat_outs) if n in made]
            if hit:
                pairs.setdefault((hit[0], region.sym.name), []).append(sub)
    rows = []
    for (fwd, bwd), subs in pairs.items():
        names = [pt.qualified_name(s) for s in subs]
        rows.append(
            WhyRow(
                "backward", subgraph, ", ".join(dict.fromkeys(names)), th.source_line(*subs), "rematerialized",
                f"computed in forward {fwd} and again in backward {bwd} instead of saved", "output names", 0,
                "none needed: recomputing saves storing the result for backward", len(subs), None, names,
            )
        )  # fmt: skip
    return rows


# --- nvFuser: one region run as several kernels ----------------------------------------------------------


def segmented_rows(
    region_fn: Any, inputs: Sequence[Any], trace: str, region: str, subgraph: str | None = None
) -> list[WhyRow]:
    """A row for an nvFuser region that ran as several kernels (CUDA only, after a run): the groups and edge
    tensors of nvFuser's segmented-fusion dump in its most recent scheduled IR, and for each scheduler used
    ``nvfuser_direct.schedule.can_schedule`` on the whole fusion (why that scheduler could not take it all).
    ``region_fn`` is the region's callable (Thunder's ``FusionDefinitionWrapper``), ``inputs`` its last
    arguments. [] where the region ran as one kernel; a row saying what is missing where nvFuser does not
    expose the IR."""
    fec = getattr(getattr(region_fn, "last_used", None), "fec", None)
    ir = th.nvfuser_scheduled_ir(region_fn)
    if ir is None:
        return [
            WhyRow(
                trace, subgraph, region, None, "unknown",
                "nvFuser's scheduled IR is not exposed here (no fec.get_most_recent_scheduled_ir)",
                "scheduled IR", None, NO_FIX, 1, "nvfuser",
            )
        ]  # fmt: skip
    groups = pt.segmented_groups(ir)
    if groups is None or len(groups[0]) < 2:
        return []
    schedulers, edges = groups
    kernels = [name for name in schedulers if name != "expr_eval"]
    verdicts = pt.scheduler_verdicts(fec, inputs, [name for name in dict.fromkeys(kernels)])
    known = [e.bytes for e in edges if e.bytes is not None]
    crossing = 2 * sum(known) if edges and len(known) == len(edges) else None  # written once, read back once
    counted = ", ".join(f"{n} {name}" for name, n in Counter(schedulers).items())
    through = f"{plural(len(edges), 'edge tensor')}" + (
        f", {human_bytes(crossing)} written and read back" if crossing else ""
    )
    first = next(iter(verdicts.items()), None)
    why = f"; {first[0]}: {first[1][:60]}" if first else ""
    detail = "; ".join(
        [f"segments in nvFuser's order: {', '.join(schedulers)}"]
        + [f"edge {e.tensor}: {human_bytes(e.bytes)}" for e in edges]
        + [f"{name} on the whole fusion: {text}" for name, text in verdicts.items()]
        + ["expr_eval segments run through nvFuser's expression evaluator (ATen or aliasing), no generated kernel"]
    )
    return [
        WhyRow(
            trace, subgraph, region, None, "segmented",
            f"{len(schedulers)} segments ({counted}), {through}{why}",
            "scheduled IR + can_schedule", crossing, NO_FIX, len(schedulers), "nvfuser",
            [e.tensor for e in edges], detail,
        )
    ]  # fmt: skip
