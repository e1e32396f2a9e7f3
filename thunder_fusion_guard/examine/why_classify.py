"""Why one op of a final trace is outside every fusion region, re-derived from Thunder's own decision steps:
the executor claims in ``executors_list`` order, the fusion executor's ``can_fuse`` walking the op's
decomposition, its checkers under the program's compile options and the fusion pass's region rules. Also why
ThunderFX's splitter left a node to torch, and why Dynamo ran a statement in Python (a graph break). Each a pure
function of the op and a :class:`WhyContext`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from .. import _thunder as th
from .._thunder import partition as pt
from ..ops.metadata import runs_as_view
from ..passes.hoist_runtime import HOISTED_NAME
from ..wording import fit
from .why_rows import NO_FIX, WhyKind, WhyRow

__all__ = [
    "WhyContext",
    "classify",
    "context_of",
    "graph_break_row",
    "graph_break_rows",
    "io_bytes",
    "is_cost_free",
    "is_work",
    "outside_thunder_fix",
    "outside_thunder_row",
    "takers_of",
]


@dataclass(frozen=True)
class WhyContext:
    """Where an op is: its program's compile data and executors in priority order, which trace ('forward' or
    'backward'), the ThunderFX subgraph's label (None under ``thunder.jit``), the frontend ('thunder.jit' or
    'thunderfx', the call a fix names) and the torch ops Thunder registered by itself for this program."""

    cd: Any
    executors: Sequence[Any]
    trace: str = "forward"
    subgraph: str | None = None
    frontend: str = "thunder.jit"
    auto_registered: frozenset[str] = frozenset()

    @property
    def fusers(self) -> list[Any]:
        return [ex for ex in self.executors if isinstance(ex, th.FusionExecutor)]

    def index(self, ex: Any) -> int:
        return next((i for i, e in enumerate(self.executors) if e is ex), len(self.executors))

    def option_fix(self, option: str) -> str:
        return f"{self.frontend}(fn, {option}=True)"


def context_of(
    jitted: Any, *, trace: str = "forward", subgraph: str | None = None, frontend: str = "thunder.jit"
) -> WhyContext:
    """The context of the ops of ``jitted`` (a ``thunder.jit`` result that ran): its compile data, executors
    and Thunder's own registrations."""
    cd = pt.compile_data_of(jitted)
    return WhyContext(cd, tuple(pt.executors_list(cd)), trace, subgraph, frontend, frozenset(_auto_registered(jitted)))


def _auto_registered(jitted: Any) -> set[str]:
    import thunder

    try:
        return set(thunder.get_auto_registered_torch_op_names(jitted) or ())
    except Exception:  # Thunder's API may be absent, or fail where nothing traced: then none is auto-registered
        return set()


def is_work(bsym: Any) -> bool:
    """True for an op that does work: not plumbing, the guard's hoisted calls or a fusion region."""
    return not (th.is_plumbing(bsym) or bsym.sym.name == HOISTED_NAME or th.is_fusion(bsym))


def is_cost_free(bsym: Any) -> bool:
    """True for a view or an op without tensors: it moves no bytes of its own."""
    return runs_as_view(bsym) or not th.tensor_proxies([*bsym.flat_args, *bsym.flat_outs])


def io_bytes(*bsyms: Any) -> int | None:
    """Bytes of the tensors ``bsyms`` read and write (each tensor once, by name); None where a size is not known."""
    total = 0
    values = [x for b in bsyms for x in (*b.flat_args, *b.flat_outs)]
    for p in th.unique_proxies(th.tensor_proxies(values)):
        n = th.tensor_nbytes(p)
        if n is None:
            return None
        total += n
    return total


class _Why(NamedTuple):
    kind: WhyKind
    reason: str
    established_by: str
    try_: str
    facts: dict[str, Any]


def classify(bsym: Any, context: WhyContext) -> WhyRow:
    """The row of ``bsym``, an op of a final trace outside every region: which step of Thunder's kept it out,
    in words, and the change that would fuse it. Reads; changes nothing."""
    claimer, _ = pt.implementing_executor(bsym, context.executors)
    original = pt.original_op(bsym, context.executors)
    why = _why(original, claimer, context)
    return WhyRow(
        trace=context.trace,
        subgraph=context.subgraph,
        op=pt.qualified_name(original),
        source=th.source_line(bsym, original),
        bytes=0 if is_cost_free(bsym) else io_bytes(bsym),
        executor=getattr(claimer, "name", None),
        **why._asdict(),
    )


def _why(original: Any, claimer: Any, context: WhyContext) -> _Why:
    fusers = context.fusers
    takers = takers_of(fusers, original, context)
    if not takers and all(f.name in th.NARROW_FUSERS for f in fusers):
        names = ", ".join(f.name for f in fusers)
        in_use = (
            f"no general fusion executor is in use (only {names}, fusing a few ops)"
            if fusers
            else "no fusion executor is in use"
        )
        return _Why(
            WhyKind.NO_FUSION_EXECUTOR,
            in_use,
            "executors_list",
            f"{context.frontend}(fn, executors=fusion_executors(device)), "
            "with from thunder_fusion_guard import fusion_executors",
            {"fusers": [f.name for f in fusers]},
        )
    if takers:
        fuser = takers[0]
        if (
            claimer is not None
            and not isinstance(claimer, th.FusionExecutor)
            and context.index(claimer) < context.index(fuser)
        ):
            return _Why(
                WhyKind.CLAIMED,
                f"{claimer.name} is before {fuser.name} in executors and claims it; {fuser.name} can fuse it",
                "executor order",
                f"put {fuser.name} before {claimer.name} in executors=[...], or drop {claimer.name}",
                {"claimer": claimer.name, "fuser": fuser.name},
            )
        return _refused_region(original, fuser, context)
    fuser = _primary(fusers)
    refusal = pt.first_refusal(fuser, original, context.cd)
    if refusal is None:  # can_fuse said no, the walk found nothing: say what was tried
        reason = f"{fuser.name}.can_fuse says no; its decomposition walk finds no refusing op"
        return _Why(WhyKind.UNKNOWN, reason, "decomposition walk", NO_FIX, {"fuser": fuser.name})
    refused = refusal.checker_refused
    if refused is not None:
        option = pt.refusing_option(fuser, refused, context.cd)
        what = pt.qualified_name(refused)
        facts: dict[str, Any] = {"fuser": fuser.name, "refused": what}
        if option is not None:
            reason = f"{fuser.name}'s checker for {what} needs compile option {option} (off)"
            return _Why(
                WhyKind.OPTION, reason, "checker re-run", context.option_fix(option), {**facts, "option": option}
            )
        args = _args(refused)
        reason = f"{fuser.name}'s checker for {what} refuses these arguments ({fit(', '.join(args), 60)})"
        return _Why(WhyKind.CHECKER, reason, "checker re-run", NO_FIX, {**facts, "args": args})
    leaf = refusal.leaf
    if leaf is original:
        reason, established_by = f"{fuser.name} has no translation for {pt.qualified_name(leaf)}", "checker re-run"
    else:
        reason = f"{fuser.name} cannot execute {pt.qualified_name(leaf)}, first in its decomposition"
        established_by = "decomposition walk"
    auto_registered = pt.is_auto_registered(original) or original.sym.id in context.auto_registered
    if auto_registered:
        reason += "; a torch fallback Thunder registered itself"
    facts = {"fuser": fuser.name, "refused": pt.qualified_name(leaf), "auto_registered": auto_registered}
    return _Why(WhyKind.NO_TRANSLATION, reason, established_by, NO_FIX, facts)


def takers_of(fusers: Sequence[Any], original: Any, context: WhyContext) -> list[Any]:
    """The fusion executors of ``fusers`` that can fuse ``original``."""
    return [f for f in fusers if pt.can_fuse(f, original, context.cd)]


def _primary(fusers: Sequence[Any]) -> Any:
    general = [f for f in fusers if f.name in th.GENERAL_FUSERS]
    return (general or list(fusers))[0]


def _args(bsym: Any) -> list[str]:
    """Each tensor argument of ``bsym`` as dtype, shape and device (``float32[4, 4] on cpu``), each number's repr."""
    parts = []
    for a in bsym.flat_args:
        if th.tensor_proxies([a]):
            spec = th.tensor_spec(a)
            parts.append(f"{spec[1]}{list(spec[0])} on {spec[2]}".replace("torch.", "") if spec else a.name)
        elif th.is_number_like(a):
            parts.append(repr(a))
    return parts


def _refused_region(original: Any, fuser: Any, context: WhyContext) -> _Why:
    """``fuser`` can fuse the op and no executor before it claims it, yet the fusion pass left it out: the
    pass's region rules re-run."""
    by = "fusion pass re-run"
    required = getattr(fuser, "required_ops", None)
    if required is not None and original.sym.id not in required:
        general = [f for f in context.fusers if f.name in th.GENERAL_FUSERS]
        names = sorted(map(str, required))
        reason = f"{fuser.name} makes regions only around {', '.join(names)}"
        facts = {"fuser": fuser.name, "rule": "required_ops", "required": names}
        return _Why(WhyKind.REGION_REFUSED, reason, by, "none needed" if general else NO_FIX, facts)
    if pt.has_cuda_io(fuser, original) is False:
        reason = f"{fuser.name} fuses ops with a CUDA tensor input or output only"
        return _Why(
            WhyKind.REGION_REFUSED,
            reason,
            by,
            "move the tensors to CUDA, or use a fusion executor for this device",
            {"fuser": fuser.name, "rule": "cuda_io"},
        )
    if fuser.name == "nvfuser" and pt.is_shape_only([original]):
        options = getattr(context.cd, "compile_options", None) or {}
        if not options.get("nv_enable_shape_only_fusion"):
            reason = "nvfuser makes no region of shape ops alone"
            fix = context.option_fix("nv_enable_shape_only_fusion")
            return _Why(WhyKind.REGION_REFUSED, reason, by, fix, {"fuser": fuser.name, "rule": "shape_only"})
    reason = (
        f"{fuser.name} can fuse it and no executor before it claims it; tried: region rules (required ops, "
        "CUDA input/output, shape-only), none applies"
    )
    facts = {"fuser": fuser.name, "tried": ["required_ops", "cuda_io", "shape_only"]}
    return _Why(WhyKind.UNKNOWN, reason, by, NO_FIX, facts)


# --- a node ThunderFX's splitter left to torch -------------------------------------------------------------

# Rewrites that keep an op ThunderFX splits off inside Thunder, checked on thunder 0.2.6 (tests/test_why.py).
OUTSIDE_THUNDER_FIX = {
    "Tensor.index_add": "scatter_add(dim, index expanded to src's shape, src): Thunder has its gradient",
    "torch.index_add": "scatter_add(dim, index expanded to src's shape, src): Thunder has its gradient",
    "Tensor.norm": "x.pow(2).sum(dim).sqrt() (rounds differently from norm)",
    "torch.norm": "x.pow(2).sum(dim).sqrt() (rounds differently from norm)",
    "Tensor.new_zeros": "torch.zeros(shape, dtype=x.dtype, device=x.device)",
    "Tensor.new_ones": "torch.ones(shape, dtype=x.dtype, device=x.device)",
}


def outside_thunder_fix(target: str) -> str:
    """What keeps the op ``target`` in Thunder: the package's translation where it has one (no code to edit),
    else a rewrite, else nothing."""
    translation = th.translation_for([target])
    if translation is not None:
        return f"thunder_fusion_guard.translate_library_ops() before compiling: {translation.built_from} in Thunder"
    return OUTSIDE_THUNDER_FIX.get(target, "none here: ThunderFX runs it with Inductor")


def outside_thunder_row(op: th.FxSplitOp) -> WhyRow:
    """The row of a node ThunderFX kept out of Thunder: it runs through Inductor between Thunder subgraphs,
    each boundary a graph split (a Thunder program call more, and its inputs and outputs in memory)."""
    reason = th.split_reason_words(op.kind, op.info)
    error = op.exception.strip().splitlines()[0] if op.exception else None
    if error is not None:
        reason += ": " + error
    return WhyRow(
        trace="forward",
        subgraph=th.dynamo_graph_label(op.graph),
        op=op.target,
        source=op.source,
        kind=WhyKind.OUTSIDE_THUNDER,
        reason=reason,
        established_by=f"thunder.dynamo splitter ({op.kind})",
        bytes=op.nbytes,
        try_=outside_thunder_fix(op.target),
        detail=op.info + (f" ({op.exception})" if op.exception else ""),
        facts={"split_kind": op.kind, "error": error},
    )


# --- a statement Dynamo ran in Python (a graph break) -------------------------------------------------------

# Dynamo's reason for a break inside a call it could not trace (a GRU module, say): no more than this word.
_BARE_STEP = "step_unsupported"
BREAK_FIX = "rewrite it so that Dynamo can trace it, or move it out of the compiled code"


def graph_break_rows(breaks: Sequence[th.GraphBreak]) -> list[WhyRow]:
    """A row per statement Dynamo broke its graph at, however many graphs it ended (a recompilation, or a break
    inside a call seen from the caller's frame and the callee's); said of the first that no graph resumed, if
    any."""
    same: dict[tuple, list[th.GraphBreak]] = {}
    for brk in breaks:
        same.setdefault((brk.source, brk.statement, brk.title, brk.explanation), []).append(brk)
    return [
        graph_break_row(next((b for b in group if not b.resumed), group[0]), graphs=[b.graph for b in group])
        for group in same.values()
    ]


def graph_break_row(brk: th.GraphBreak, graphs: Sequence[int] = ()) -> WhyRow:
    """The row of a statement Dynamo could not trace: it ends a Dynamo graph (those of ``graphs``, else its own)
    and runs in Python, uncompiled, never reaching Thunder; so does the rest of its function where no graph
    resumed it."""
    if brk.title == _BARE_STEP:
        reason = f"Dynamo could not trace this statement (its only reason: {_BARE_STEP})"
    else:
        reason = f"Dynamo cannot trace it: {brk.title}" + (f"; {brk.explanation}" if brk.explanation else "")
    if not brk.resumed:
        reason += f"; no Dynamo graph resumed {brk.function} after it: the code after it ran in Python too"
    fix = " ".join(brk.hints) or BREAK_FIX + (f" ({brk.link})" if brk.link else "")
    graphs = list(graphs) or [brk.graph]
    where = f"after dynamo graph{'s' if len(graphs) > 1 else ''} {', '.join(map(str, graphs))}"
    return WhyRow(
        trace="forward",
        subgraph=where,
        op=brk.statement or "graph break",
        source=brk.source,
        kind=WhyKind.GRAPH_BREAK,
        reason=reason,
        established_by="torch._dynamo (graph break)",
        try_=fix,
        detail=brk.text,
        facts={
            "title": brk.title,
            "explanation": brk.explanation,
            "function": brk.function,
            "resumed": brk.resumed,
            "graphs": graphs,
        },
    )
