"""Gradients autograd will not use: which inputs of the Thunder autograd node running backward the engine will send a
gradient on, and a backward trace whose program, at a call where some are unused, runs without the work only they
need (:mod:`..passes.unused_grads`).

``torch.autograd.grad(energy, positions)`` runs Thunder's backward, which returns every input's gradient, the
parameters' too; autograd drops those. Eager never computes them. The engine says which nodes it will run
(``torch._C._will_engine_execute_node``, as ``torch.utils.checkpoint`` asks it); the gradient of an input whose node
it will not run is unused. :class:`UnusedGradsBackward` prints and inspects as the trace it copies; its program is a
:class:`SkippingBackward`: the trace's own program where every gradient is used, else, per set of unused gradients,
the trace without the ops only they need (and, given ``prune``, its regions rebuilt without the outputs only they
need), built at the first such call and checked there against the trace's own program.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from thunder.core import prims
from thunder.core.proxies import TensorProxy
from thunder.core.trace import TraceCtx

from .exact_vjps import bitwise_equal
from .lowering import new_trace_like, rebuild_fusion, refresh_dels
from .sources import source_line
from .traces import BoundSymbol, is_fusion, unique_proxies

__all__ = [
    "GradientFeeds",
    "SkippingBackward",
    "UnusedGradsBackward",
    "Variant",
    "VariantRun",
    "backward_without",
    "gradient_feeds",
    "prune_region",
    "skipping_backward",
    "unused_gradients",
]

# The autograd node of Thunder's ThunderFunction, whose backward runs the compiled backward trace.
THUNDER_NODE = "ThunderFunctionBackward"
# Bound symbols the variants re-derive (Thunder's last-use pass) rather than keep.
_RE_DERIVED = ("python_del", "clear_mutable_collection")


def unused_gradients(positions: Sequence[int], count: int) -> frozenset[int] | None:
    """Which of ``positions`` (indices of the ``count`` inputs of the Thunder autograd node now running backward) the
    engine will send no gradient on; None where the caller is not that node or its inputs are not ``count``."""
    node = torch._C._current_autograd_node()
    if node is None or type(node).__name__ != THUNDER_NODE:
        return None
    edges = node.next_functions
    if len(edges) != count:
        return None
    unused = []
    for i in positions:
        fn = edges[i][0]
        if fn is None:
            unused.append(i)
            continue
        try:
            if not torch._C._will_engine_execute_node(fn):
                unused.append(i)
        except RuntimeError:  # an input autograd.grad() was asked for: the engine refuses the question, it is used
            pass
    return frozenset(unused)


def _returned(trace: TraceCtx) -> tuple | None:
    """The gradients a backward trace returns (a tuple, one entry per input), or None for another return."""
    ret = trace.bound_symbols[-1] if trace.bound_symbols else None
    if ret is None or ret.sym.name != "python_return" or len(ret.args) != 1 or not isinstance(ret.args[0], tuple):
        return None
    grads = ret.args[0]
    if not all(g is None or isinstance(g, TensorProxy) for g in grads):
        return None
    return grads


@dataclass(frozen=True)
class GradientFeeds:
    """Which returned gradients (by input index) the ops of a backward trace feed: ``count`` inputs, ``returned``
    those a gradient is returned for, ``of_op`` by the op's position in the trace (an op that must run whatever is
    used, or feeds nothing returned, is absent), ``of_output`` for each output of those that are fusion regions."""

    count: int
    returned: frozenset[int]
    of_op: dict[int, frozenset[int]]
    of_output: dict[str, frozenset[int]]

    def separable(self, prune: bool) -> frozenset[int]:
        """The inputs whose gradient has work of its own to leave out: in an op feeding fewer than every returned
        gradient (with ``prune``, or in an output of a region)."""
        sets = [s for s in self.of_op.values() if s != self.returned]
        if prune:
            sets += [s for s in self.of_output.values() if s and s != self.returned]
        return frozenset().union(*sets) if sets else frozenset()


def gradient_feeds(trace: TraceCtx, always: Callable[[BoundSymbol], bool]) -> GradientFeeds | None:
    """What each op of the backward ``trace`` feeds among the gradients it returns; ops ``always`` says must run
    whatever is used are left out. None where the trace's return is not one tuple of gradients."""
    grads = _returned(trace)
    if grads is None:
        return None
    of_value: dict[str, set[int]] = {}
    for i, g in enumerate(grads):
        if g is not None:
            of_value.setdefault(g.name, set()).add(i)
    of_op: dict[int, frozenset[int]] = {}
    of_output: dict[str, frozenset[int]] = {}
    for position in range(len(trace.bound_symbols) - 2, -1, -1):
        bsym = trace.bound_symbols[position]
        if bsym.sym.name in _RE_DERIVED:
            continue
        feeds: set[int] = set()
        for out in bsym.flat_proxy_outs:
            feeds |= of_value.get(out.name, set())
        if feeds and not _kept_whatever(bsym) and not always(bsym):
            of_op[position] = frozenset(feeds)
            if is_fusion(bsym):
                of_output.update({o.name: frozenset(of_value.get(o.name, ())) for o in bsym.flat_proxy_outs})
        for arg in bsym.flat_proxy_args:
            of_value.setdefault(arg.name, set()).update(feeds)
    returned = frozenset(i for i, g in enumerate(grads) if g is not None)
    return GradientFeeds(len(grads), returned, of_op, of_output)


def _kept_whatever(bsym: BoundSymbol) -> bool:
    """Unpacking the trace's arguments, and ops making no value (their effect is the point): kept in every variant."""
    return bsym.sym.name.startswith("unpack") or not bsym.flat_proxy_outs


@dataclass(frozen=True)
class Variant:
    """A backward trace without the work of some unused gradients: the trace, the ops left out (names, in trace
    order), the fusion regions among them, the regions rebuilt without some outputs, and the user's line of the first
    op left out or rebuilt, where known."""

    trace: TraceCtx
    skipped: tuple[str, ...]
    regions: tuple[str, ...]
    pruned: tuple[str, ...]
    source: str | None = None


# Rebuilds a fusion region with only the outputs named (None: it cannot be, and runs whole).
PruneRegion = Callable[[BoundSymbol, frozenset[str]], BoundSymbol | None]


def backward_without(
    trace: TraceCtx, unused: frozenset[int], always: Callable[[BoundSymbol], bool], prune: PruneRegion | None = None
) -> Variant:
    """``trace`` returning None for the gradients of ``unused`` and without the ops only they needed (``always``: ops
    kept whatever); with ``prune``, a fusion region some outputs of which only they needed rebuilt without them."""
    grads = _returned(trace)
    if grads is None:
        raise ValueError("not a backward trace returning one tuple of gradients")
    kept_grads = tuple(None if i in unused else g for i, g in enumerate(grads))
    needed = {g.name for g in kept_grads if g is not None}
    kept: list[BoundSymbol] = []
    skipped: list[BoundSymbol] = []
    pruned: list[BoundSymbol] = []
    for bsym in reversed(trace.bound_symbols[:-1]):
        if bsym.sym.name in _RE_DERIVED:
            continue
        outs = {o.name for o in bsym.flat_proxy_outs}
        if not (outs & needed) and not _kept_whatever(bsym) and not always(bsym):
            skipped.append(bsym)
            continue
        if prune is not None and is_fusion(bsym) and not outs <= needed and not always(bsym):
            rebuilt = prune(bsym, frozenset(outs & needed))
            if rebuilt is not None:
                pruned.append(bsym)
                bsym = rebuilt
        kept.append(bsym)
        needed |= {a.name for a in bsym.flat_proxy_args}
    ret = prims.python_return.bind(kept_grads, output=None)
    new = refresh_dels(new_trace_like(trace, [*reversed(kept), ret]))
    skipped.reverse()
    pruned.reverse()
    return Variant(
        new,
        tuple(b.sym.name for b in skipped),
        tuple(b.sym.name for b in skipped if is_fusion(b)),
        tuple(b.sym.name for b in pruned),
        source_line(*skipped, *pruned),
    )


def prune_region(
    fusion: BoundSymbol, outputs: frozenset[str], writes: Callable[[BoundSymbol], bool] = lambda b: False
) -> BoundSymbol | None:
    """The fusion region ``fusion`` rebuilt by its executor with only the outputs named, without the ops only the
    others needed; an op ``writes`` says writes a tensor it is given is kept, with what it reads. None where it would
    keep no output, or the region runs rescued from its executor's failure."""
    wanted = [o for o in fusion.flat_proxy_outs if o.name in outputs]
    if not wanted or getattr((fusion._call_ctx or {}).get(fusion.sym.name), "rescued", False):
        return None  # nothing kept, or a region its executor failed on (the guard's rescue runs it another way)
    needed = set(outputs)
    body: list[BoundSymbol] = []
    for bsym in reversed(fusion.subsymbols):
        # a write is kept with what it reads, whatever it writes into: a view of a kept value may be its destination
        if writes(bsym) or {o.name for o in bsym.flat_proxy_outs} & needed:
            body.append(bsym)
            needed |= {a.name for a in bsym.flat_proxy_args}
    inputs = [a for a in unique_proxies(fusion.flat_proxy_args) if a.name in needed]
    return rebuild_fusion(fusion, list(reversed(body)), inputs, wanted)


@dataclass
class VariantRun:
    """How a variant's first call went: its :class:`Variant` (None where it could not be built), whether its used
    gradients equal the trace's own program's bit for bit, their largest difference, its error, and the seconds its
    build and run took (its regions' compiles included)."""

    unused: frozenset[int]
    variant: Variant | None = None
    bitwise: bool = False
    max_abs_diff: float | None = None
    error: str | None = None
    seconds: float = 0.0


# Builds a variant for a set of unused gradients: the variant and its program.
Build = Callable[[frozenset[int]], tuple[Variant, Callable]]


class SkippingBackward:
    """A backward program: ``full`` (the trace's own) where ``unused()`` finds no unused gradient (or None: the
    caller is not Thunder's autograd node), else a variant for the unused ones. ``attempts`` are tried in order, one
    a call: ``full`` runs (its gradients returned), then the attempt's build on copies of the saved values, the used
    gradients are compared, and its ``keep(run)`` says whether the variant runs from then on; after the last attempt
    kept nothing, ``full`` runs. ``on_first(run, kept)`` is told of each attempt that leaves something out."""

    def __init__(
        self,
        full: Callable,
        unused: Callable[[], frozenset[int] | None],
        attempts: Sequence[tuple[Build, Callable[[VariantRun], bool]]],
        on_first: Callable[[VariantRun, bool], None] | None = None,
    ) -> None:
        self.full = full
        self.unused = unused
        self.attempts = tuple(attempts)
        self.on_first = on_first
        self.variants: dict[frozenset[int], Callable | int] = {}  # the program chosen, or the next attempt's index

    def __call__(self, saved_for_backward: Any, cotangents: Any) -> Any:
        unused = self.unused()
        if not unused:
            return self.full(saved_for_backward, cotangents)
        run = self.variants.get(unused, 0)
        if isinstance(run, int):
            return self._attempt(run, unused, saved_for_backward, cotangents)
        return run(saved_for_backward, cotangents)

    def _attempt(self, index: int, unused: frozenset[int], saved_for_backward: Any, cotangents: Any) -> Any:
        saved, given = _copied(saved_for_backward), _copied(cotangents)  # the program clears what it reads
        want = self.full(saved_for_backward, cotangents)  # first: a region that fails is rescued before a copy is built
        build, keep = self.attempts[index]
        next_one = index + 1 if index + 1 < len(self.attempts) else self.full
        outcome = VariantRun(unused)
        fn = None
        began = time.perf_counter()
        try:
            outcome.variant, fn = build(unused)
            if not (outcome.variant.skipped or outcome.variant.pruned):  # nothing left out: the next attempt
                self.variants[unused] = next_one
                return want
            _compare(outcome, fn(saved, given), want)
        except Exception as e:  # a variant that cannot be built or run leaves the trace's own program to run
            outcome.error = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}".rstrip(": ")
        outcome.seconds = time.perf_counter() - began
        kept = fn is not None and outcome.error is None and keep(outcome)
        self.variants[unused] = fn if kept else next_one
        if self.on_first is not None:
            self.on_first(outcome, kept)
        return want


def _copied(collection: Any) -> Any:
    """A copy of a backward argument (a list the program clears as it reads it), its lists copied too."""
    if isinstance(collection, list):
        return [_copied(x) for x in collection]
    return collection


def _compare(outcome: VariantRun, got: Sequence, want: Sequence) -> None:
    """Set ``outcome``'s bitwise and largest difference over the gradients ``got`` returns (the used ones)."""
    pairs = [
        (g, w)
        for i, (g, w) in enumerate(zip(got, want, strict=True))
        if i not in outcome.unused and isinstance(w, torch.Tensor)
    ]
    if any(not isinstance(g, torch.Tensor) for g, _ in pairs):
        outcome.error = "a used gradient came back empty"
        return
    outcome.bitwise = bitwise_equal([g for g, _ in pairs], [w for _, w in pairs])
    diffs = [float((g.double() - w.double()).abs().max()) for g, w in pairs if g.numel() and g.shape == w.shape]
    outcome.max_abs_diff = max(diffs, default=0.0)


@dataclass(frozen=True)
class _Plan:
    positions: tuple[int, ...]
    count: int
    always: Callable[[BoundSymbol], bool]
    # each attempt: its way to rebuild a region (None: it leaves out whole ops only), and whether its variant is kept
    attempts: tuple[tuple[PruneRegion | None, Callable[[VariantRun], bool]], ...]
    on_first: Callable[[VariantRun, bool], None] | None


class UnusedGradsBackward(TraceCtx):
    """A copy of a backward trace, printed and inspected as it, whose program (``python_callable``) is a
    :class:`SkippingBackward` over the trace's own."""

    _plan: _Plan

    def python_callable(self, **kwargs: Any) -> Callable:
        plan = self._plan
        full = super().python_callable(**kwargs)

        def attempt(prune: PruneRegion | None) -> Build:
            def build(unused: frozenset[int]) -> tuple[Variant, Callable]:
                variant = backward_without(self, unused, plan.always, prune)
                return variant, variant.trace.python_callable(**kwargs)

            return build

        unused = functools.partial(unused_gradients, plan.positions, plan.count)
        return SkippingBackward(full, unused, [(attempt(p), keep) for p, keep in plan.attempts], plan.on_first)


def skipping_backward(
    trace: TraceCtx,
    positions: Sequence[int],
    count: int,
    always: Callable[[BoundSymbol], bool],
    attempts: Sequence[tuple[PruneRegion | None, Callable[[VariantRun], bool]]],
    on_first: Callable[[VariantRun, bool], None] | None = None,
) -> UnusedGradsBackward:
    """``trace`` as an :class:`UnusedGradsBackward`: the same bound symbols, names and signature. Its variants leave
    out what ``always`` does not keep; each of ``attempts`` (tried in order, see :class:`SkippingBackward`) rebuilds
    regions its way (None: never) and says whether its variant is kept."""
    new = UnusedGradsBackward(trace.fn)
    new.args, new.kwargs = trace.args, trace.kwargs
    new.name_ctr, new.obj_name_ctr, new.names = trace.name_ctr, trace.obj_name_ctr, trace.names
    new._tags = set(trace._tags)
    new._siginfo = trace._siginfo
    new.bound_symbols = list(trace.bound_symbols)
    new._plan = _Plan(tuple(positions), count, always, tuple(attempts), on_first)
    return new
