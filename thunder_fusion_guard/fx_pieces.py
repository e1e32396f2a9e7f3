"""Under ThunderFX, what runs eagerly where its compiler adds only a call (runtime ``eager_pieces``): a piece split off
to Inductor that only makes views or constants; one that only contracts (a matmul or ``tensordot`` among views), and a
Thunder subgraph Thunder fuses none of, once their eager runs gave the compiled bits, forward and gradients, on a call.

ThunderFX hands each op Thunder does not support, or supports only by its automatic registration (``narrow``,
``tensordot`` in Thunder 0.2.6), to Inductor as a piece of its own between the Thunder subgraphs; each call of such a
piece goes through AOTAutograd's wrappers, forward and backward, for an op that eagerly is a view or one BLAS call.
A view's values and its gradient (a copy into zeros, a concatenation) are the same bits whoever computes them, where
the views of one tensor in a piece do not overlap (else gradients are summed in another order); constants likewise.
A contraction is one BLAS call in both, but whether Inductor lays its operands out as eager does is not known before
it runs, and a subgraph of Thunder's torch executor runs torch's ops but Thunder's own gradients: each is checked
once, bitwise, on a real call's inputs (static sizes: every later call runs the same kernels). A subgraph that reads
an input it differentiates more than once stays Thunder's: eagerly each read hands autograd a gradient of its own,
summed with the input's other uses in another order than Thunder's one gradient (a norm on a residual stream).
"""

from __future__ import annotations

import contextlib
import itertools
import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import torch

from . import _thunder as th
from .cost import Measured
from .decisions import Decision, Details
from .fx_rescue import compile_fx_module, is_fake, subgraph_op_decision, updated_inputs
from .ops import is_random
from .reasons import Facts, ReasonCode, words

__all__ = [
    "EagerSubgraph",
    "PieceRun",
    "eager_module",
    "eager_subgraph",
    "piece_decision",
    "piece_kind",
    "run_pieces_eagerly",
    "same_bits",
    "subgraph_decision",
]

PieceKind = Literal["views", "contraction"]

_VIEWS = frozenset(
    {
        "narrow",
        "view",
        "reshape",
        "flatten",
        "unflatten",
        "permute",
        "transpose",
        "t",
        "unsqueeze",
        "squeeze",
        "select",
        "split",
        "chunk",
        "unbind",
        "contiguous",
        "clone",
        "size",
        "dim",
        "getitem",
        "__getitem__",
    }
)
_FACTORIES = frozenset(
    {"new_zeros", "new_ones", "new_full", "zeros", "ones", "full", "zeros_like", "ones_like", "full_like"}
)
_BROADCASTS = frozenset({"expand", "expand_as", "broadcast_to", "broadcast_tensors"})  # gradients are sums
_CONTRACTIONS = frozenset({"mm", "matmul", "bmm", "tensordot"})
_SLICES = frozenset({"narrow", "select"})  # views whose ranges are read from constants: disjointness is known


@dataclass(frozen=True)
class PieceRun:
    """What became of one Inductor piece: ``eager`` (runs eagerly now), its ``kind``, or why it stays (``kept``)."""

    name: str
    ops: list[str]
    kind: PieceKind | None
    eager: bool
    why: str = ""
    source: str | None = None


def _op_name(node: torch.fx.Node) -> str | None:
    """The name of a call node's op where it is torch's or a Tensor method (``narrow``), else None."""
    target = node.target
    if node.op == "call_method":
        return str(target)
    if node.op != "call_function":
        return None
    if target is operator.getitem:
        return "getitem"
    name = getattr(target, "__name__", None)
    if name and (getattr(torch, name, None) is target or getattr(torch.Tensor, name, None) is target):
        return name
    return None


def _example(node: Any) -> Any:
    return node.meta.get("example_value") if isinstance(node, torch.fx.Node) else None


def _needs_grad(graph: torch.fx.Graph) -> bool:
    """Whether any input of the piece may carry a gradient (an input without a fake example counts)."""
    for node in graph.find_nodes(op="placeholder"):
        value = _example(node)
        if value is None or (isinstance(value, torch.Tensor) and value.requires_grad):
            return True
    return False


def _static(graph: torch.fx.Graph) -> bool:
    """Whether every input has static sizes (a check on one call then holds for every call)."""
    for node in graph.find_nodes(op="placeholder"):
        value = _example(node)
        if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            return False
        if isinstance(value, torch.Tensor) and any(not isinstance(d, int) for d in (*value.shape, *value.stride())):
            return False
    return True


def _basic_index(index: Any) -> bool:
    items = index if isinstance(index, tuple) else (index,)
    for item in items:
        if isinstance(item, slice):
            if not all(b is None or isinstance(b, int) for b in (item.start, item.stop, item.step)):
                return False
        elif not (item is None or item is Ellipsis or isinstance(item, int)):
            return False
    return True


def _range(node: torch.fx.Node) -> tuple[int, int, int] | None:
    """(dim, start, stop) that a ``narrow`` or ``select`` with constant arguments takes of its input, else None."""
    name, args = _op_name(node), list(node.args[1:])
    for key in ("dim", "start", "length", "index"):
        if key in node.kwargs:
            args.append(node.kwargs[key])
    if not all(isinstance(a, int) for a in args):
        return None
    if any(a < 0 for a in args):  # counted from the end: the size would be needed
        return None
    if name == "narrow" and len(args) == 3:
        return args[0], args[1], args[1] + args[2]
    if name == "select" and len(args) == 2:
        return args[0], args[1], args[1] + 1
    return None


def _overlapping_reads(graph: torch.fx.Graph) -> str:
    """A value read by several views (or returned and viewed) whose gradients would be summed: its name, else ''.
    Several ``narrow``/``select`` of one dim over disjoint constant ranges are fine (their gradients never meet)."""
    for value in graph.nodes:
        if isinstance(_example(value), (tuple, list)):  # split, chunk, unbind: disjoint parts, read by getitem
            continue
        readers = [u for u in value.users if u.op == "output" or _op_name(u) not in (_FACTORIES | {"size", "dim"})]
        if len(readers) <= 1:
            continue
        ranges = [_range(u) if _op_name(u) in _SLICES and u.args and u.args[0] is value else None for u in readers]
        if any(r is None for r in ranges) or len({r[0] for r in ranges}) != 1:
            return value.name
        spans = sorted((r[1], r[2]) for r in ranges)
        if any(start < stop for (_, stop), (start, _) in itertools.pairwise(spans)):
            return value.name
    return ""


def piece_kind(graph: torch.fx.Graph) -> tuple[PieceKind | None, str]:
    """Whether the piece of ``graph`` runs eagerly with the same bits: ``views`` (views and constants only, by
    construction), ``contraction`` (one matmul-like op among views: checked on a call first), or None and why not."""
    calls = [n for n in graph.nodes if n.op in ("call_function", "call_method", "call_module")]
    if graph.find_nodes(op="get_attr") or any(n.op == "call_module" for n in calls):
        return None, "it reads module attributes"
    names = [_op_name(n) for n in calls]
    unknown = sorted(
        {str(n.target) if name is None else name for n, name in zip(calls, names, strict=True)}
        - _VIEWS
        - _FACTORIES
        - _BROADCASTS
        - _CONTRACTIONS
    )
    if unknown:
        return None, f"it computes ({', '.join(unknown[:3])})"
    for node, name in zip(calls, names, strict=True):
        tensor_index = name in ("getitem", "__getitem__") and not isinstance(_example(node.args[0]), (tuple, list))
        if tensor_index and not _basic_index(node.args[1]):
            return None, "it indexes with tensors or lists"
    grad = _needs_grad(graph)
    if grad and any(name in _BROADCASTS for name in names):
        return None, "it broadcasts an input that carries a gradient (its gradient is a sum)"
    overlap = _overlapping_reads(graph) if grad else ""
    if overlap:
        return None, f"views of {overlap} overlap (their gradients would be summed in another order)"
    contractions = sum(name in _CONTRACTIONS for name in names)
    if contractions == 0:
        return "views", ""
    if contractions > 1:
        return None, f"it runs {contractions} contractions"
    if not _static(graph):
        return None, "its sizes are symbolic (a check on one call would not hold for the next)"
    return "contraction", ""


def _differentiated_inputs_read_twice(graph: torch.fx.Graph, args: tuple) -> list[str]:
    """The inputs of ``graph`` that require grad (by ``args``) and that its ops read more than once. Thunder's backward
    hands autograd one gradient for each input, summed inside it; run eagerly, each read gives autograd a gradient of
    its own, added to those of the input's uses outside the subgraph in the order autograd gets them: other bits
    where the input is used elsewhere too (a residual stream), though the subgraph alone gives Thunder's."""
    inputs = [n for n in graph.nodes if n.op == "placeholder"]
    found = []
    for node, arg in zip(inputs, args, strict=False):
        if not (isinstance(arg, torch.Tensor) and arg.requires_grad):
            continue
        reads = sum(1 for user in node.users for a in _flat(user) if a is node)
        if reads > 1:
            found.append(node.name)
    return found


def _flat(node: torch.fx.Node) -> list[torch.fx.Node]:
    """Every node ``node`` takes as an argument, nested ones included, once for each time it takes it."""
    out: list[Any] = []
    torch.fx.node.map_arg((node.args, node.kwargs), out.append)
    return out


def _capturing() -> bool:
    """Whether a CUDA graph is being captured on the current stream (no check runs inside a capture)."""
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def eager_module(graph: torch.fx.Graph, name: str) -> torch.fx.GraphModule:
    """A GraphModule running a copy of ``graph`` eagerly (the piece's own ops, as Dynamo recorded them)."""
    copied = torch.fx.Graph()
    out = copied.graph_copy(graph, {})
    copied.output(out)
    return torch.fx.GraphModule(torch.nn.Module(), copied, class_name=name)


def _forward_backward(fn: Callable, args: tuple) -> tuple[list[torch.Tensor], list[Any]]:
    """``fn``'s tensor outputs on copies of ``args`` detached from their history and, in the caller's grad mode, the
    gradients of the inputs that require grad, the cotangent of each output being its own value: one step of it."""
    inputs = [a.detach().requires_grad_(a.requires_grad) if isinstance(a, torch.Tensor) else a for a in args]
    out = fn(*inputs)
    outs = [o for o in (out if isinstance(out, (tuple, list)) else (out,)) if isinstance(o, torch.Tensor)]
    wanted = [i for i in inputs if isinstance(i, torch.Tensor) and i.requires_grad]
    diff = [o for o in outs if o.requires_grad]
    with torch.enable_grad():
        grads = (
            torch.autograd.grad(diff, wanted, [o.detach() for o in diff], allow_unused=True) if diff and wanted else []
        )
    return [o.detach() for o in outs], list(grads)


def same_bits(first: Callable, second: Callable, args: tuple) -> bool:
    """Whether ``first`` and ``second`` give the same outputs (values, dtypes, shapes, strides) and, in grad mode, the
    same gradients of the inputs that require grad, the cotangent of each output being its own value, on ``args``
    (read only), in the caller's grad mode."""
    try:
        (a_out, a_grad), (b_out, b_grad) = _forward_backward(first, args), _forward_backward(second, args)
    except Exception:
        return False
    if len(a_out) != len(b_out) or len(a_grad) != len(b_grad):
        return False
    for x, y in [*zip(a_out, b_out, strict=True), *zip(a_grad, b_grad, strict=True)]:
        if x is None or y is None:
            if x is not y:
                return False
        elif x.dtype != y.dtype or x.shape != y.shape or x.stride() != y.stride() or not torch.equal(x, y):
            return False
    return True


class _CheckedPiece(torch.nn.Module):
    """Stands for a contraction piece until its first call: runs Inductor's piece for the call, then checks the eager
    one against it on the call's inputs and puts whichever runs from then on in its place."""

    def __init__(
        self,
        owner: torch.fx.GraphModule,
        name: str,
        compiled: torch.nn.Module,
        eager: torch.nn.Module,
        told: Callable[[bool], None],
    ) -> None:
        super().__init__()
        self._where = (owner, name)
        self.compiled, self.eager, self._told = compiled, eager, told

    def forward(self, *args: Any) -> Any:
        out = self.compiled(*args)
        if _capturing() or any(is_fake(a) for a in args):  # shapes learnt on fakes: no call yet
            return out
        owner, name = self._where
        same = same_bits(self.compiled, self.eager, args)
        setattr(owner, name, self.eager if same else self.compiled)
        with contextlib.suppress(Exception):  # recording never breaks the call
            self._told(same)
        return out


def run_pieces_eagerly(owner: torch.fx.GraphModule, tell: Callable[[PieceRun], None]) -> None:
    """Decide each Inductor piece of the split GraphModule ``owner``: one of views and constants runs eagerly from its
    next call on, a contraction from the call after its check; ``tell`` hears of each piece run eagerly and each
    contraction kept after its check."""
    for name, compiled, graph in th.inductor_pieces(owner):
        kind, _ = piece_kind(graph)
        if kind is None:
            continue
        try:
            eager = eager_module(graph, name)
        except Exception:  # a graph fx cannot copy: Inductor's piece stays
            continue
        ops = th.fx_graph_ops(eager)
        source = th.fx_module_source(eager)
        if kind == "views":
            setattr(owner, name, eager)
            tell(PieceRun(name, ops, kind, True, source=source))
            continue

        def told(same: bool, name: str = name, ops: list[str] = ops, source: str | None = source) -> None:
            why = "" if same else "its eager run gave other bits than Inductor's on a real call"
            tell(PieceRun(name, ops, "contraction", same, why, source))

        setattr(owner, name, _CheckedPiece(owner, name, compiled, eager, told))


Timer = Callable[[Callable, Callable, tuple], "Measured | str"]


@dataclass(frozen=True)
class EagerSubgraph:
    """What an eager run of a ThunderFX subgraph came to: ``run`` (None: Thunder's stays), why not, and where Thunder
    fuses some of it, the timing that decided (``measured``: Thunder's step as ``region_us``, eager's as
    ``eager_us``)."""

    run: Callable | None
    why: str = ""
    measured: Measured | None = None


def eager_subgraph(
    module: torch.fx.GraphModule,
    jitted: Any,
    run: Callable,
    args: tuple,
    timer: Timer | None = None,
    margin: float = 0.0,
) -> EagerSubgraph:
    """An eager run of the ThunderFX subgraph ``module`` where Thunder, which compiled it as ``jitted`` and runs it as
    ``run``, gives the same bits eagerly on ``args`` (the first call's) and either fuses nothing of it or, timed by
    ``timer`` (forward and backward), runs it slower than eager by more than ``margin``; else why not. Eagerly, a
    subgraph skips Thunder's per-call work (its entry, autograd's Function) and its fusions' calls."""
    forward, backward = th.last_traces(jitted)
    if forward is None:
        return EagerSubgraph(None, "Thunder has not traced it")
    fused = any(th.is_fusion(b) for t in (forward, backward) if t is not None for b in t.bound_symbols)
    if fused and timer is None:
        return EagerSubgraph(None, "Thunder fuses some of it")
    if any(is_random(b) for b in forward.bound_symbols):  # a second run would draw again: the random state moves
        return EagerSubgraph(None, "it draws random numbers")
    if any(th.is_cudagraph_transform(t) for t in th.jitted_transforms(jitted)) or _capturing():
        return EagerSubgraph(None, "it runs in CUDA graphs")
    if updated_inputs(module):
        return EagerSubgraph(None, "it updates an input in place")
    if not _static(module.graph):
        return EagerSubgraph(None, "its sizes are symbolic (a check on one call would not hold for the next)")
    read_twice = _differentiated_inputs_read_twice(module.graph, args)
    if read_twice:
        return EagerSubgraph(
            None,
            f"it reads {', '.join(read_twice)}, whose gradient it gives, more than once: autograd would add each "
            "read's gradient to those of the input's other uses one at a time, in another order than Thunder's one sum",
        )
    eager = compile_fx_module(module, list(args), "eager")
    if not same_bits(run, eager, args):
        return EagerSubgraph(None, "its eager run gave other bits than Thunder's on a real call")
    if not fused:
        return EagerSubgraph(eager)
    measured = timer(lambda *a: _forward_backward(run, a), lambda *a: _forward_backward(eager, a), args)
    if isinstance(measured, str):
        return EagerSubgraph(None, measured)
    if measured.eager_us >= measured.region_us * (1 - margin):
        return EagerSubgraph(None, "Thunder's run is faster, or not enough slower", measured)
    return EagerSubgraph(eager, measured=measured)


def piece_decision(run: PieceRun, beside: str | None) -> Decision:
    """The decision recording ``run``, a piece of the split graph that calls ThunderFX subgraph ``beside``."""
    code: ReasonCode = "piece_eager" if run.eager else "piece_kept"
    facts = Facts(region=run.name, ops=run.ops, why=run.why, name=run.kind or "")
    reason, told = words(code, facts)
    details: Details = {"scope": "op", **told, "decided_by": "exactness" if run.kind == "views" else "checked"}
    if run.source:
        details["source"] = run.source
    region = f"{run.name} beside {beside}" if beside else run.name
    return Decision(
        "forward",
        region,
        "inductor",
        run.ops,
        "reject" if run.eager else "keep",
        reason,
        subgraph=beside,
        details=details,
        code=code,
        facts=dict(facts),
    )


def subgraph_decision(
    subgraph: str,
    module: torch.fx.GraphModule,
    measured: Measured | None = None,
    margin: float = 0.0,
    eager: bool = True,
) -> Decision:
    """The decision recording that ThunderFX subgraph ``subgraph`` (its fx ``module``) runs eagerly from now on;
    ``measured``: Thunder fuses some of it, and this timing decided, eager cheaper by more than ``margin``. Not
    ``eager``: the timing kept Thunder's run (eager not cheaper by the margin), recorded so the choice can be read."""
    facts = Facts(region=subgraph, ops=th.fx_graph_ops(module), name="subgraph")
    details: Details = {"decided_by": "checked"}
    if measured is not None:
        facts.update(measured=measured, margin=margin)
        details = {"decided_by": "measured", "margin": margin, **measured.as_record()}  # type: ignore[typeddict-item]
    if not eager:
        return subgraph_op_decision(subgraph, module, "keep", "piece_kept", facts, details)
    return subgraph_op_decision(subgraph, module, "reject", "piece_eager", facts, details)
