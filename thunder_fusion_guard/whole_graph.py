"""Under ThunderFX, a Dynamo graph that unguarded Thunder cannot run runs whole by Inductor where that is timed faster
than its split (runtime ``whole_graphs``).

ThunderFX splits each Dynamo graph into Thunder subgraphs and, for the ops Thunder does not support, pieces Inductor
compiles apart; every subgraph and piece is a call of its own, forward and backward. Where Thunder fails on a subgraph,
or would lose a gradient through it, the guard's rescue runs it another way (:mod:`.fx_rescue`); so it does where a
fusion region inside one fails, forward or backward, and its ops run unfused (:mod:`.passes.rescue`). Where unguarded
Thunder fails there, that failure ends the user's program, so the graph has no Thunder bits to keep. Whether unguarded
Thunder fails is checked, not assumed: the subgraph compiled again without the guard runs on copies of the failing
call's inputs (of the next call's, for a region), forward and backward; for a region, unless that compile's trace holds
the region op for op, which then fails there as it did (its compile is not repeated: Inductor's C++ of a NequIP backward
region of two thousand ops takes minutes before it fails). Then, at the graph's next call, its split and Inductor's
compile of the whole graph are timed on copies of that call's inputs, forward and backward, and Inductor runs it from
then on where it is faster by the margin, narrowed to the timing's spread where the timing is what the program sees (the
rule of a timed region's keep or reject). Inductor's options are then timed against its default compile: on CUDA, combo
kernels (independent kernels launched as one; torch's option, off by default); on any device, its small matmuls
decomposed into products and sums (its own rewrite), then those with small results summed in kernels (the guard's pass,
handed to that compile only), then those with larger results too. All of them are compiled together first, and where
that compile is faster than the default one it runs the graph: one compile instead of one an option (each takes seconds
to minutes). Only where it is not are they timed one after the other, each kept where faster than the compile before
it. On CUDA a compile with options is kept only where it is no dearer on the device too, host and device timed apart:
fewer launches win on the stream, but a step replayed in CUDA graphs pays the device alone. They compile at a call of
the user's program, so they have a budget (``option_compiles_s``): once they have taken that many seconds of one graph,
no more is started (the one under way finishes), recorded. Inductor's values are within its own rounding of eager's.
A graph that updates its inputs in place is not timed; should Inductor ever fail on a call, the split runs it again for
good.
"""

from __future__ import annotations

import contextlib
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from . import _thunder as th
from .cost import Measured
from .decisions import Decision, Details
from .fx_rescue import compile_fx_module, copy_input, updated_inputs
from .measure.timing import uses_cuda
from .options import OPTION_COMPILES_S
from .policy import dearer_on_device, measured_margin
from .reasons import OPTION_NAMES, Facts, Narrowing, ReasonCode, words
from .regions import find_regions, same_program
from .wording import error_line

__all__ = [
    "COMBO_KERNELS",
    "DECOMPOSED_MATMULS",
    "FEWER_REALIZED",
    "MATMUL_OPTIONS",
    "OPTION_COMPILES_S",
    "RUN_WITHOUT_THUNDER",
    "SUMMED_MATMULS",
    "WHOLE_GRAPH_OPTIONS",
    "WHOLE_GRAPH_TIMING_S",
    "WIDE_SUMMED_MATMULS",
    "UnguardedFailure",
    "WholeGraph",
    "WholeGraphRun",
    "decomposed_matmuls",
    "forward_backward_step",
    "has_matmuls",
    "random_state_kept",
    "unguarded_failure",
    "warn_back_to_split",
    "whole_graph_decision",
    "whole_or_split",
]

# The rescues of a subgraph (fx_rescue's ``Rescued.by``) after which no Thunder program runs it.
RUN_WITHOUT_THUNDER: frozenset[str] = frozenset({"Inductor", "eager PyTorch"})

# Inductor's options timed against its defaults on a whole graph it runs (combo kernels), where
# ``th.combo_kernels_on`` says (Triton's devices): the guard's one home for both is ``_thunder.combo``.
COMBO_KERNELS = th.COMBO_KERNELS
# Inductor's small matmuls decomposed into products and sums (its ``decompose_mm_pass``), timed after combo kernels.
DECOMPOSED_MATMULS = th.DECOMPOSED_MATMULS
decomposed_matmuls = th.decomposed_matmuls  # their thresholds, applied for one compile and its first calls
# The guard's pass summing each matmul with a small result in a kernel (``_thunder.matmul_sums``), timed after both.
SUMMED_MATMULS = th.SUMMED_MATMULS
# The same pass summing matmuls of larger results too, timed after it where it runs the graph.
WIDE_SUMMED_MATMULS = th.WIDE_SUMMED_MATMULS
# Inductor's fewer buffers realized, tried last where combo kernels run the graph.
FEWER_REALIZED = th.FEWER_REALIZED

# Seconds the timing of a graph's split against its whole may take, apart from the guard's measuring budget (which
# region timings may have spent): at least 3 rounds each run (a step of 100 ms on a CPU: about 1.5 s).
WHOLE_GRAPH_TIMING_S = 2.0

# The clock those compiles are timed by (the test suite stands a fixed one in: no real timing decides there).
clock: Callable[[], float] = time.perf_counter

# Times ``split`` against ``whole`` (two runs of one step, no arguments): the split's µs as ``region_us``, the whole
# graph's as ``eager_us``; or why they were not timed (``RegionMeasurer.pair``).
Timer = Callable[[Callable[[], Any], Callable[[], Any], tuple], "Measured | str"]


def _flat(out: Any) -> list[Any]:
    if isinstance(out, (tuple, list)):
        return [x for o in out for x in _flat(o)]
    return [out]


def forward_backward_step(fn: Callable, inputs: list[Any]) -> Callable[[], None]:
    """One forward of ``fn`` on ``inputs`` and, where its outputs require grad (in the caller's grad mode), the
    backward of their sum into the inputs (``torch.autograd.grad``: no ``.grad`` is touched)."""
    leaves = [t for t in inputs if isinstance(t, torch.Tensor) and t.requires_grad]

    def step() -> None:
        out = fn(*inputs)
        outs = [o for o in _flat(out) if isinstance(o, torch.Tensor) and o.requires_grad]
        if outs and leaves:
            torch.autograd.grad(outs, leaves, [torch.ones_like(o) for o in outs], allow_unused=True)

    return step


@dataclass(frozen=True)
class UnguardedFailure:
    """How Thunder without the guard's changes fails on a ThunderFX subgraph: ``error``, one line. ``same_region``:
    the region of its trace that holds, op for op, the guard's region that failed (``error`` is that region's, not
    run again); None where it ran and failed."""

    error: str
    same_region: str | None = None


def unguarded_failure(
    jitted: Any, guard: Any, recording: Any, args: tuple, failed: Decision | None = None
) -> UnguardedFailure | None:
    """How Thunder fails on the ThunderFX subgraph ``jitted`` (its ThunderModule) without ``guard``'s changes,
    compiled again with its other transforms and options, ``recording`` (a guard that changes nothing: its
    user-line shims raise Thunder's errors without interpreting torch.fx's printout of them, minutes on a CPU) in
    ``guard``'s place; None where it runs. ``failed``: the rescue of a region of ``jitted`` that failed at its last
    call. Where unguarded Thunder's trace holds that region op for op (:func:`.regions.same_program`), it fails as
    that region did, and nothing runs: its compile alone can take minutes (Inductor's C++ of two thousand ops). Else
    it runs on copies of ``args``, forward and, where outputs require grad, backward (a region may fail in either)."""
    with random_state_kept(args):
        try:
            copies = [copy_input(a) for a in args]
            again, traces = th.traced_again_without(jitted, guard, recording, copies)
        except Exception as e:  # whatever unguarded Thunder raises is the fact asked for
            return UnguardedFailure(error_line(e))
        if failed is not None:
            same = None
            with contextlib.suppress(Exception):  # a shortcut: where it cannot tell, the program runs
                same = _same_region(failed, th.last_traces(jitted), traces)
            if same is not None:
                return UnguardedFailure(failed.facts.get("error") or failed.reason, same)
        try:
            forward_backward_step(again, copies)()
        except Exception as e:  # as above
            return UnguardedFailure(error_line(e))
    return None


def _same_region(failed: Decision, guarded: tuple[Any, Any], unguarded: tuple[Any, Any]) -> str | None:
    """The name of the region of ``unguarded`` (forward and backward traces) that is the program of the region
    ``failed`` tells of, in ``guarded`` (the traces of the call it failed at), in the trace of the same direction; None
    where there is none."""
    backward = failed.trace == "backward"
    mine, theirs = guarded[backward], unguarded[backward]
    if mine is None or theirs is None:
        return None
    region = next((r for r in find_regions(mine) if r.name == failed.region), None)
    if region is None:
        return None
    return next((r.name for r in find_regions(theirs) if same_program(r, region)), None)


def random_state_kept(args: Any) -> contextlib.AbstractContextManager:
    """The random number generators of the CPU and of the CUDA devices ``args`` are on as they were before, after
    runs made only to check or to time (a random op in them would move the user's draws)."""
    devices = sorted({a.device.index or 0 for a in args if isinstance(a, torch.Tensor) and a.device.type == "cuda"})
    return torch.random.fork_rng(devices=devices)


class WholeGraphRun:
    """A Dynamo graph's split GraphModule's forward: Inductor's compile of the whole graph; should it ever fail on a
    call, the split runs it again for good (``on_failure`` is told, once)."""

    def __init__(self, whole: Callable, split: torch.fx.GraphModule, on_failure: Callable[[Exception], None]) -> None:
        self.whole, self.split, self.on_failure = whole, split, on_failure

    def __call__(self, *args: Any) -> Any:
        try:
            return self.whole(*args)
        except Exception as e:  # the split runs it as before; the call goes on
            vars(self.split).pop("forward", None)  # the class's forward again
            self.on_failure(e)
            return self.split(*args)


@dataclass
class WholeGraph:
    """What became of one Dynamo graph: ``inductor`` (its whole compile runs it now) or not, the timing that decided
    (``measured``: the split's µs as ``region_us``, Inductor's as ``eager_us``), or why it stays split (``why``; the
    inputs it updates in place, ``in_place``, or Inductor's failure on it, ``error``, where those are why).
    ``combo``: Inductor's default compile (``region_us``) timed against its compile with combo kernels
    (``eager_us``), ``combo_kernels`` where the latter runs it; ``combo_why``: why not, where it was not timed.
    ``decomposed``, ``decomposed_matmuls``, ``decomposed_why``: the same for Inductor's compile with its small matmuls
    decomposed into products and sums (:data:`DECOMPOSED_MATMULS`), timed after combo kernels; ``summed``,
    ``summed_matmuls``, ``summed_why``: its small-result matmuls summed in kernels (:data:`SUMMED_MATMULS`), after;
    ``wide``, ``wide_matmuls``, ``wide_why``: matmuls of larger results summed too (:data:`WIDE_SUMMED_MATMULS`),
    after, where the small-result ones run the graph. ``stacked``, ``all_options``, ``stacked_why``: the same for
    all of them together, timed first (where they run the graph, none is timed alone). ``realized``,
    ``fewer_realized``, ``realized_why``: Inductor's fewer buffers realized (:data:`FEWER_REALIZED`) added last to the
    compile that runs the graph with combo kernels. ``budget_s``: the seconds its compiles with options may take
    (:data:`OPTION_COMPILES_S`), ``compile_s`` what they took, ``over_budget`` the options (their ``runs`` fields) not
    compiled because ``compile_s`` had reached ``budget_s``."""

    label: str
    inductor: bool
    why: str = ""
    measured: Measured | None = None
    whole: Callable | None = None
    in_place: list[int] = field(default_factory=list)
    error: str = ""
    combo: Measured | None = None
    combo_kernels: bool = False
    combo_why: str = ""
    margin: float | None = None  # what the timing had to beat: costs.margin, or narrowed to its spread
    narrowed: str | None = None  # why narrowed (policy.measured_margin): synchronous, host_and_device
    decomposed: Measured | None = None  # the compile running it (region_us) against small matmuls decomposed
    decomposed_matmuls: bool = False
    decomposed_why: str = ""
    summed: Measured | None = None  # the compile running it (region_us) against small-result matmuls summed
    summed_matmuls: bool = False
    summed_why: str = ""
    wide: Measured | None = None  # the compile running it (region_us) against larger-result matmuls summed too
    wide_matmuls: bool = False
    wide_why: str = ""
    stacked: Measured | None = None  # the default compile (region_us) against all the options together
    all_options: bool = False
    stacked_why: str = ""
    realized: Measured | None = None  # the compile running it (region_us) against it with fewer buffers realized
    fewer_realized: bool = False
    realized_why: str = ""
    budget_s: float = OPTION_COMPILES_S
    compile_s: float = 0.0
    over_budget: tuple[str, ...] = ()


def whole_or_split(
    label: str,
    original: torch.fx.GraphModule,
    split: Callable,
    inputs: list[Any],
    timer: Timer | str,
    margin: float,
    option_compiles_s: float = OPTION_COMPILES_S,
) -> WholeGraph:
    """Time ``split`` (how ThunderFX runs the Dynamo graph ``original`` now) against Inductor's compile of all of
    ``original``, forward and backward, on ``inputs`` (copies: the runs touch nothing of the caller's), by ``timer``;
    Inductor is chosen where it is faster by ``margin``, narrowed to the timing's spread (at least
    :data:`.policy.MEASURED_MARGIN_FLOOR`) where the timing is what the program sees, as for a measured keep or
    reject: on CPU, or on CUDA where Inductor's whole graph is no dearer on the host nor on the device, timed apart.
    Inductor's options (combo kernels, its small-matmul rewrites) are timed against its default compile, and where
    that loses to the split and an option is faster, the fastest compile is timed against the split again; no compile
    with options is started once those of this graph have taken ``option_compiles_s``. Not timed (``timer`` None, or
    it says why) keeps the split."""
    written = sorted(updated_inputs(original))
    if written:
        why = f"it updates its inputs {', '.join(map(str, written))} in place; not timed"
        return WholeGraph(label, False, why, in_place=written)
    if isinstance(timer, str):
        return WholeGraph(label, False, timer)
    try:
        whole = compile_fx_module(original, inputs, "inductor")
        forward_backward_step(whole, inputs)()
    except Exception as e:  # Inductor may fail on the whole graph in any way: then the split stays, no error
        error = error_line(e)
        return WholeGraph(label, False, f"Inductor failed on the whole graph: {error}", error=error)
    cuda = uses_cuda(*inputs)
    timed = _against_split(split, whole, inputs, timer, margin, cuda)
    if isinstance(timed, str):
        return WholeGraph(label, False, timed)
    measured, used, narrowed, wins = timed
    if wins:
        found = WholeGraph(
            label, True, measured=measured, whole=whole, margin=used, narrowed=narrowed, budget_s=option_compiles_s
        )
        return _with_options(found, original, inputs, timer)
    # Inductor's defaults lose, but its options may win by the margin: its small-matmul rewrites and combo kernels cut
    # a launch-bound graph's kernels by half or more (where its split is itself Inductor's, they are all it can add)
    found = WholeGraph(label, True, measured=measured, whole=whole, budget_s=option_compiles_s)
    tried = _with_options(found, original, inputs, timer)
    if tried.whole is whole:  # no option faster: the split stays, each option's timing recorded
        why = "Inductor's whole graph is not faster by the margin"
        return replace(tried, inductor=False, why=why, whole=None, margin=used, narrowed=narrowed)
    timed = _against_split(split, tried.whole, inputs, timer, margin, cuda)
    if isinstance(timed, str):
        return WholeGraph(label, False, timed)
    measured, used, narrowed, wins = timed
    if wins:
        return replace(tried, measured=measured, margin=used, narrowed=narrowed)
    why = "Inductor's whole graph is not faster by the margin, with its options either"
    split_kept = {"inductor": False, "whole": None} | {option.runs: False for option in WHOLE_GRAPH_OPTIONS}
    return replace(tried, why=why, measured=measured, margin=used, narrowed=narrowed, **split_kept)


def _against_split(
    split: Callable, whole: Callable, inputs: list[Any], timer: Timer, margin: float, cuda: bool
) -> tuple[Measured, float, Narrowing | None, bool] | str:
    """``whole`` timed against ``split`` by ``timer``, forward and backward: the timing, the margin used, why it was
    narrowed (None where it was not), and whether ``whole`` is faster by it; or why it was not timed. No Thunder bits
    to keep (unguarded Thunder fails on the graph): the rule of a measured keep or reject, the margin narrowed to the
    timing's spread where the timing is what the program sees (:func:`.policy.measured_margin`)."""
    measured = timer(forward_backward_step(split, inputs), forward_backward_step(whole, inputs), (), apart=cuda)
    if isinstance(measured, str):
        return measured
    used, narrowed = measured_margin(margin, measured, overlapped=cuda)
    return measured, used, narrowed, measured.eager_us < measured.region_us * (1 - used)


def _with_options(found: WholeGraph, original: torch.fx.GraphModule, inputs: list[Any], timer: Timer) -> WholeGraph:
    """``found`` with Inductor's options in its compile's place where timed faster: all of them together where that
    is faster than ``found``'s compile (:func:`_with_all_options`); else combo kernels, then the small-matmul rewrites,
    one after the other (:data:`MATMUL_OPTIONS`), each added to the compile before it; then, where combo kernels run
    it, fewer buffers realized (:func:`_with_fewer_realized`)."""
    found = _with_all_options(found, original, inputs, timer)
    if not found.all_options:
        found = _with_combo_kernels(found, original, inputs, timer)
        if found.whole is not None and has_matmuls(original):  # a graph without matmuls is not compiled for them
            for option in MATMUL_OPTIONS:
                if not option.after or getattr(found, option.after):
                    found = _with_matmul_option(found, original, inputs, timer, option)
    return _with_fewer_realized(found, original, inputs, timer)


def _running_options(found: WholeGraph, upto: _MatmulOption | None = None) -> dict[str, Any]:
    """The options of the compile running the graph in ``found`` (combo kernels, the matmul rewrites whose flags are
    set, in their order: the last summed-matmul pass standing for the one before it), those before ``upto`` only."""
    options = dict(COMBO_KERNELS if found.combo_kernels else {})
    for option in MATMUL_OPTIONS[: MATMUL_OPTIONS.index(upto) if upto else None]:
        if getattr(found, option.runs):
            options.update(option.options)
    return options


def _matmul_scope(options: dict[str, Any]) -> Callable[[], contextlib.AbstractContextManager]:
    """Where ``options`` decompose small matmuls: Inductor reads their thresholds from its module, so they are applied
    while it compiles and runs first (:func:`th.decomposed_matmuls`)."""
    return th.decomposed_matmuls if DECOMPOSED_MATMULS.keys() <= options.keys() else contextlib.nullcontext


def _with_fewer_realized(
    found: WholeGraph, original: torch.fx.GraphModule, inputs: list[Any], timer: Timer
) -> WholeGraph:
    """``found`` with Inductor's compile running it given fewer buffers realized too (:data:`FEWER_REALIZED`: more
    pointwise work recomputed inside the kernels that read it) in its place where ``timer`` finds it faster, and on
    CUDA no dearer on the device; tried only where combo kernels run the graph (Triton's devices), last, alone: it cut
    kernels on the small e3nn step and on MACE at a device time within run-to-run variance, so each graph decides."""
    if found.whole is None or not found.combo_kernels:
        return found
    options = _running_options(found) | FEWER_REALIZED
    found, compiled = _timed_compile(found, original, inputs, timer, _REALIZED, options, _matmul_scope(options))
    return replace(found, whole=compiled or found.whole, fewer_realized=compiled is not None)


def _with_all_options(found: WholeGraph, original: torch.fx.GraphModule, inputs: list[Any], timer: Timer) -> WholeGraph:
    """``found`` (Inductor's default compile of ``original`` runs it) with Inductor's compile given every option that
    applies in its place where ``timer`` finds it faster (any amount, as for each option alone): combo kernels where
    ``inputs`` are on Triton's devices, and where ``original`` computes a matmul, the small-matmul rewrites, the last
    summed-matmul pass standing for the one before it (it sums what that one sums, and more). Where fewer than two
    apply, nothing is compiled: the options one after the other are the same compiles."""
    combo = th.combo_kernels_on(a.device.type for a in inputs if isinstance(a, torch.Tensor))
    matmuls = has_matmuls(original)
    if combo + (len(MATMUL_OPTIONS) if matmuls else 0) < 2:
        return found
    options = dict(COMBO_KERNELS if combo else {})
    for option in MATMUL_OPTIONS if matmuls else ():
        options.update(option.options)
    found, compiled = _timed_compile(found, original, inputs, timer, _ALL_TOGETHER, options, _matmul_scope(options))
    if compiled is None:
        return found
    runs = {option.runs: True for option in MATMUL_OPTIONS} if matmuls else {}
    return replace(found, whole=compiled, all_options=True, combo_kernels=combo, **runs)


def _with_combo_kernels(
    found: WholeGraph, original: torch.fx.GraphModule, inputs: list[Any], timer: Timer
) -> WholeGraph:
    """``found`` (Inductor's default compile of ``original`` runs it) with Inductor's compile with combo kernels
    in its place where ``inputs`` are on Triton's devices (``th.combo_kernels_on``) and ``timer`` finds it faster (any
    amount: both are Inductor's compiles of the same graph); else as it was, ``combo_why`` saying why."""
    if found.whole is None or not th.combo_kernels_on(a.device.type for a in inputs if isinstance(a, torch.Tensor)):
        return found
    found, compiled = _timed_compile(found, original, inputs, timer, _COMBO, COMBO_KERNELS)
    return replace(found, whole=compiled or found.whole, combo_kernels=compiled is not None)


@dataclass(frozen=True)
class WholeGraphOption:
    """An option of Inductor's compile of a whole graph, by its :class:`WholeGraph` fields: whether it runs the graph
    (``runs``, also its name's key in :data:`.reasons.OPTION_NAMES`), its timing against the compile before it
    (``timed``) and why it was not timed (``why``)."""

    runs: str
    timed: str
    why: str

    @property
    def what(self) -> str:
        """The words of a failure of a compile given this option."""
        return f"with {OPTION_NAMES.get(self.runs, 'all its options')}"


@dataclass(frozen=True)
class _MatmulOption(WholeGraphOption):
    """A small-matmul rewrite handed to Inductor's compile of a whole graph: its config ``options``; ``after``: the
    ``runs`` field of the option it is tried after, only where that one runs the graph ('': always tried)."""

    options: dict[str, Any] = field(default_factory=dict)
    after: str = ""


# Timed in this order, each with those before it that run the graph: Inductor's own decomposition of matmuls with a
# small inner and right dimension, then the guard's pass summing the matmuls with a small result it leaves (the
# weights' gradients), then the same pass summing larger results too, where the small ones paid (it sums what they
# sum and more). Each matmul summed in a kernel is a launch gone where a step is a queue of tiny GEMMs.
MATMUL_OPTIONS = (
    _MatmulOption("decomposed_matmuls", "decomposed", "decomposed_why", DECOMPOSED_MATMULS),
    _MatmulOption("summed_matmuls", "summed", "summed_why", SUMMED_MATMULS),
    _MatmulOption("wide_matmuls", "wide", "wide_why", WIDE_SUMMED_MATMULS, "summed_matmuls"),
)
_ALL_TOGETHER = WholeGraphOption("all_options", "stacked", "stacked_why")
_COMBO = WholeGraphOption("combo_kernels", "combo", "combo_why")
_REALIZED = WholeGraphOption("fewer_realized", "realized", "realized_why")
# Every option of a whole graph's compile, in the order they are tried and recorded: the one table of their fields.
WHOLE_GRAPH_OPTIONS: tuple[WholeGraphOption, ...] = (_ALL_TOGETHER, _COMBO, *MATMUL_OPTIONS, _REALIZED)


def _with_matmul_option(
    found: WholeGraph, original: torch.fx.GraphModule, inputs: list[Any], timer: Timer, option: _MatmulOption
) -> WholeGraph:
    """``found`` with Inductor's compile of ``original`` given ``option`` (and the options running it now: combo
    kernels, the rewrites before) in its place where ``timer`` finds it faster (any amount, as for combo kernels: two
    Inductor compiles of a graph with no Thunder bits); else as it was, ``option.why`` saying why not timed."""
    options = _running_options(found, upto=option) | option.options
    found, compiled = _timed_compile(found, original, inputs, timer, option, options, _matmul_scope(options))
    return replace(found, whole=compiled or found.whole, **{option.runs: compiled is not None})


def _timed_compile(
    found: WholeGraph,
    original: torch.fx.GraphModule,
    inputs: list[Any],
    timer: Timer,
    option: WholeGraphOption,
    options: dict[str, Any],
    scope: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
) -> tuple[WholeGraph, Callable | None]:
    """Inductor's compile of ``original`` with ``options`` (in ``scope``, its first forward and backward too: Inductor
    compiles the backward at its first call) timed against ``found.whole``: ``found`` with ``option``'s timing, or why
    it was not timed, and the seconds the compile took; and the compile where faster (on CUDA, and no dearer on the
    device, timed apart: :func:`.policy.dearer_on_device`), else None. Not compiled where the compiles with options
    before it have taken ``found.budget_s``. Inductor's option may fail on a graph in any way: then the compile found
    stays, why naming the option."""
    if found.compile_s >= found.budget_s:
        why = (
            f"not compiled: the compiles with options before it took {found.compile_s:.0f} s, "
            f"{found.budget_s:g} s allowed (option_compiles_s)"
        )
        return replace(found, over_budget=(*found.over_budget, option.runs), **{option.why: why}), None
    began = clock()
    try:
        with scope():
            compiled = compile_fx_module(original, inputs, "inductor", options)
            forward_backward_step(compiled, inputs)()
    except Exception as e:
        failed = f"Inductor {option.what} failed: {error_line(e)}"
        return replace(found, compile_s=found.compile_s + clock() - began, **{option.why: failed}), None
    found = replace(found, compile_s=found.compile_s + clock() - began)
    before, after = forward_backward_step(found.whole, inputs), forward_backward_step(compiled, inputs)
    timed = timer(before, after, (), apart=uses_cuda(*inputs))
    if isinstance(timed, str):
        return replace(found, **{option.why: timed}), None
    faster = timed.eager_us < timed.region_us and not dearer_on_device(timed)
    return replace(found, **{option.timed: timed}), (compiled if faster else None)


# Dynamo graph targets computing a matmul (the ops Inductor lowers to ``mm``/``bmm``): a graph without any is not
# compiled a third time.
_MATMULS = frozenset({"matmul", "mm", "bmm", "einsum", "linear", "addmm", "baddbmm", "tensordot", "__matmul__"})


def has_matmuls(module: torch.fx.GraphModule) -> bool:
    """Whether the Dynamo graph ``module`` computes a matmul (a call of a matmul function, method or ``nn.Linear``)."""
    for node in module.graph.nodes:
        if node.op in ("call_function", "call_method"):
            name = node.target if isinstance(node.target, str) else getattr(node.target, "__name__", "")
            if name in _MATMULS:
                return True
        elif node.op == "call_module" and isinstance(module.get_submodule(str(node.target)), torch.nn.Linear):
            return True
    return False


def whole_graph_decision(
    found: WholeGraph, original: torch.fx.GraphModule, subgraph: str, unguarded: UnguardedFailure, margin: float
) -> Decision:
    """The decision recording ``found`` for the Dynamo graph ``original``, unguarded Thunder having failed on its
    subgraph ``subgraph`` as ``unguarded`` tells."""
    code: ReasonCode = "whole_graph" if found.inductor else "whole_graph_kept"
    used = margin if found.margin is None else found.margin
    facts = Facts(region=found.label, name=subgraph, error=unguarded.error, why=found.why, margin=used)
    if unguarded.same_region is not None:
        facts["same_region"] = unguarded.same_region
    details: Details = {"scope": "op", "decided_by": "measured" if found.measured is not None else "rule"}
    if found.measured is not None:
        facts["measured"] = found.measured
        details.update(margin=used, split_us=found.measured.region_us, inductor_us=found.measured.eager_us)
        if found.narrowed is not None and used != margin:  # narrowed to the timing's spread
            facts.update(margin_from=margin, narrowed=found.narrowed)
            details["margin_narrowed"] = found.narrowed
    for option in WHOLE_GRAPH_OPTIONS:
        runs, timed, why = (getattr(found, name) for name in (option.runs, option.timed, option.why))
        _record_option(facts, details, option.runs, option.timed, runs, timed, why)
    if found.compile_s:
        details["option_compiles_s"] = round(found.compile_s, 3)
    if found.over_budget:
        spent = {"option_compiles_s": found.compile_s, "option_budget_s": found.budget_s}
        facts.update(over_budget=list(found.over_budget), **spent)
        details.update(over_budget=list(found.over_budget), option_budget_s=found.budget_s)
    reason, told = words(code, facts)
    source = th.fx_module_source(original)
    if source:
        details["source"] = source
    return Decision(
        "forward",
        found.label,
        "inductor" if found.inductor else "thunder",
        th.fx_graph_ops(original),
        "switch" if found.inductor else "keep",
        reason,
        subgraph=subgraph,
        details={**told, **details},
        code=code,
        facts=dict(facts),
    )


def _record_option(
    facts: Facts, details: Details, flag: str, key: str, runs: bool, timed: Measured | None, why: str
) -> None:
    """Into ``facts`` and ``details``: one of Inductor's options tried on the whole graph, ``flag`` whether it runs the
    graph, ``key`` its timing against the compile before it (``<key>_us`` in details), ``<key>_why`` why not timed. An
    option run with all the others, not timed alone, has its flag only."""
    if timed is not None or why or runs:
        facts[flag] = details[flag] = runs
    if timed is not None:
        facts[key] = timed
        details[f"{key}_us"] = timed.eager_us
        if timed.device is not None:
            details[f"{key}_device_us"] = list(timed.device)
        if not runs and dearer_on_device(timed):  # faster on the stream, maybe, but not where only the device counts
            facts[f"{key}_dearer_on_device"] = details[f"{key}_dearer_on_device"] = True
    if why:
        facts[f"{key}_why"] = why


def warn_back_to_split(label: str, error: Exception) -> None:
    """Say that Inductor failed on a call of the Dynamo graph ``label`` and its split runs it from now on."""
    warnings.warn(
        f"FusionGuard: Inductor failed on {label} ({error_line(error)}); ThunderFX's split runs it from now on",
        RuntimeWarning,
        stacklevel=3,
    )
