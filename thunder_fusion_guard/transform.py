"""FusionGuard, the Thunder transform: a thin shell that runs the guard pass on each optimized trace."""

from __future__ import annotations

import contextlib
import functools
import threading
import warnings
import weakref
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any

import thunder
import torch

from . import _thunder as th
from ._thunder import FusionExecutor
from .cost import CostConstants
from .decisions import Decision, Subgraph
from .distributed import compare_ranks, current_rank, world_size
from .fx_pieces import PieceRun, eager_subgraph, piece_decision, run_pieces_eagerly, subgraph_decision
from .fx_rescue import (
    Rescued,
    SubgraphRescue,
    copy_input,
    entry_decision,
    refusing_lost_gradients,
    rescue_decision,
)
from .measure import calibrate
from .measure.breakeven import RegionMeasurer
from .measure.cache import device_name
from .options import Costs, GuardOptions, Rewrites, Runtime, checked_options
from .passes import FusionGuardError, TraceContext, guard_trace
from .passes.alias_updates import alias_update_decisions, prune_alias_updates
from .passes.capture import (
    capture_decision,
    held_decision,
    moved_decision,
    recommend_decision,
    reentered_decision,
    uncaptured_decision,
)
from .passes.copies_as_cat import copies_joined_decisions, join_copies
from .passes.hoist import HoistLedger
from .passes.pipeline import pass_failed_decision, pass_failed_error
from .passes.records import op_calls_decisions
from .passes.rescue import announce, describe_inputs, runs_unfused
from .passes.traceable_grads import trace_gradients
from .phases import GUARD_MEASUREMENTS, GUARD_PASSES, timing
from .policy import ModelDoubt
from .reasons import WARNED, Doubt
from .replays import will_be_captured
from .report import Report
from .whole_graph import (
    RUN_WITHOUT_THUNDER,
    WHOLE_GRAPH_TIMING_S,
    WholeGraph,
    WholeGraphRun,
    random_state_kept,
    unguarded_failure,
    warn_back_to_split,
    whole_graph_decision,
    whole_or_split,
)
from .wording import error_line


class RankMismatch(FusionGuardError):
    """Ranks made different decisions for the same program (strict mode)."""


def _pre_grad(
    name: str, fn: Callable, trace: th.TraceCtx, options: GuardOptions, failed: list[tuple[str, Exception]]
) -> tuple[th.TraceCtx, list]:
    """``fn(trace)``, a pass before Thunder differentiates (none with ``rescue=False``); where it fails, ``trace``
    as it was and the failure noted in ``failed`` (strict mode: raised)."""
    if not options.rescue:
        return trace, []
    try:
        return fn(trace)
    except FusionGuardError:
        raise
    except Exception as e:  # an optimisation or rescue that fails keeps the trace as it was, and is reported
        if options.strict:
            raise pass_failed_error(name, "forward", e) from e
        failed.append((name, e))
        return trace, []


class FusionGuard(thunder.Transform):
    """Reject fusion regions that cost more than plain PyTorch, and record every decision.

    Use as ``thunder.jit(fn, transforms=[FusionGuard()])``. The options are keyword-only, one per field of
    :class:`~.options.GuardOptions`, whose field docs (the README's options table) say what each does; ``costs``,
    ``rewrites`` and ``runtime`` group the finer ones (a :class:`Costs`, :class:`Rewrites`, :class:`Runtime`, or a
    dict of its fields).

    Communication ops (collectives, their waits, gradient buckets) are never rewritten, moved or moved
    across; :meth:`check_ranks` compares the decisions of all ranks.
    """

    reads_user_lines = True  # its compilations keep the user's line of each op (:func:`._thunder.user_lines`)

    @checked_options
    def __init__(
        self,
        *,
        executors: Iterable[str | FusionExecutor] | None = None,
        report_only: bool = False,
        strict: bool = False,
        costs: Costs | dict = Costs(),
        exact_only: bool = True,
        choose_executor: bool = False,
        rewrites: Rewrites | dict = Rewrites(),
        compare_ranks: bool = False,
        ordered_einsum: bool | None = None,
        hoist: bool = True,
        runtime: Runtime | dict = Runtime(),
        rescue: bool = True,
    ) -> None:
        options = dict(locals())  # the keywords above, each a field of GuardOptions, which checks them
        del options["self"]
        self.options = GuardOptions(**options)
        self._constants: dict[tuple[str, str], CostConstants | None] = {}
        self.report = Report()
        self.measurer = RegionMeasurer(self.options.costs.measure_budget_s)
        self.doubt = ModelDoubt()
        self._lock = threading.Lock()
        self._warned: set[str] = set()  # what a RuntimeWarning said already (reasons.WARNED)
        self._compiles: dict[str | None, int] = {}
        # Per thread (threads calling a program at once each compile it): the compile index of each function it
        # compiles and what its forward hoisted, so that its backward trace is recorded with its own forward.
        self._thread = threading.local()
        self._subgraph_ids: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()
        # The split graphs whose Inductor pieces were decided (runtime.eager_pieces).
        self._owners_decided: weakref.WeakSet[Any] = weakref.WeakSet()
        self._graphs_whole: weakref.WeakSet[Any] = weakref.WeakSet()  # split graphs unguarded Thunder fails on
        self._rescues: weakref.WeakSet[SubgraphRescue] = weakref.WeakSet()  # those a failed region may time whole
        self._captures: weakref.WeakKeyDictionary[th.CaptureSummary, Decision] = weakref.WeakKeyDictionary()
        self._recommended: weakref.WeakSet[Any] = weakref.WeakSet()  # Thunder's CUDAGraphTransforms a decision named

    def transform_traces_pre_prologue(
        self, prologue_trc: th.TraceCtx, computation_trc: th.TraceCtx, epilogue_trc: th.TraceCtx | None, **kwargs: Any
    ) -> tuple[th.TraceCtx, th.TraceCtx, th.TraceCtx | None]:
        """Before Thunder differentiates and optimizes: copies into slices of new zero tensors computed by ``cat``
        (:mod:`.passes.copies_as_cat`: Thunder would lose their gradient; strict mode raises instead), library ops
        whose automatic gradient torch.compile cannot run given gradients of Thunder's ops
        (:mod:`.passes.traceable_grads`; strict mode raises instead), then alias updates nothing reads pruned from
        the computation trace (:mod:`.passes.alias_updates`: Thunder's backward would read gradients it never
        defines), recorded with the forward's decisions; and, once for each of Thunder's own
        ``CUDAGraphTransform`` given beside the guard, a decision recommending
        :class:`~.cuda_graphs.GuardedCUDAGraphs` (the transforms are left as given)."""
        options = self.options
        failed: list[tuple[str, Exception]] = []  # a pass that fails keeps the trace as it was, recorded
        joined_trace, joined = _pre_grad("copies_as_cat", join_copies, computation_trc, options, failed)
        if joined and options.strict:  # raised before the compilation holds the user's lines
            lines = "; ".join(f"{j.tensor} ({j.source or 'no source line'})" for j in joined[:3])
            raise FusionGuardError(
                f"Thunder {th.software_versions()['thunder']} would lose the gradient of copies into slices of new "
                f"zero tensors without an error: {lines} (strict: not computed by cat)"
            )
        executors = [name for name, _ in th.compiling_executors()]
        traced_trace, traced = _pre_grad(
            "traceable_grads", lambda t: trace_gradients(t, executors), joined_trace, options, failed
        )
        if traced and options.strict:
            ops = ", ".join(f"{t.op} ({t.source or 'no source line'})" for t in traced)
            raise FusionGuardError(
                f"Thunder {th.software_versions()['thunder']}'s automatic gradients of {ops} fail in a torch.compile "
                "region (strict: not given gradients of Thunder's ops)"
            )
        th.compilation_begins(computation_trc)  # the backward's lines, until its forward trace is optimized
        pruned_trace, pruned = _pre_grad("alias_updates", prune_alias_updates, traced_trace, options, failed)
        with self._lock:
            given = th.compiling_transforms()
            graphs = [t for t in given if th.is_thunders_cudagraph_transform(t) and t not in self._recommended]
            made: list[Decision] = []
            if joined or traced or pruned or graphs or failed:  # recorded with the forward trace this becomes
                function = th.compile_function_name()
                where = replace(self._where("forward"), compile_index=self._compiles.get(function, 0) + 1)
                made += copies_joined_decisions(where, joined, applied=not options.report_only)
                made += op_calls_decisions(where, traced, "rescue", "gradient_traced", applied=not options.report_only)
                made += alias_update_decisions(where, pruned, applied=not options.report_only)
                made += [pass_failed_decision(where, name, error) for name, error in failed]
                for transform in graphs:
                    self._recommended.add(transform)
                    made.append(recommend_decision(where, type(transform).__name__))
            for decision in made:
                self.report.add(decision)
            if not options.report_only:
                computation_trc = pruned_trace
        self._announce(made)
        return prologue_trc, computation_trc, epilogue_trc

    def transform_trace_post_optimization(self, computation_trace: th.TraceCtx, **kwargs: Any) -> th.TraceCtx:
        with self._lock:
            backward = th.is_backward(computation_trace)
            if not backward:  # differentiated by now: Thunder's own grad transform again
                th.compilation_ends()
            self.report.saw_trace(th.compiling_executors())
            function = th.compile_function_name()
            # Counted per function name, not per object: ThunderFX subgraphs are all "GraphModule", and
            # distinct indices keep (function, compile_index) naming one compilation in the report.
            if not backward:
                self._compiles[function] = self._compiles.get(function, 0) + 1
                self._this_thread()[function] = self._compiles[function]
            where = self._where("backward" if backward else "forward")
            seen = len(self.report)
            measure = timing(GUARD_MEASUREMENTS, self.measurer) if self.options.costs.measure_budget_s > 0 else None
            try:
                new_trace = timing(GUARD_PASSES, guard_trace, where)(
                    computation_trace,
                    self.options,
                    self.report,
                    where,
                    self.constants_for,
                    measure,
                    self._thread.hoisted,
                    self.doubt,
                    self._record_at_run_time,
                )
            finally:
                if measure is not None:
                    self.measurer.flush()
                    self.report.measuring = self.measurer.to_dict()
            made = self.report.decisions[seen:]
        self._announce(made)
        if self.options.compare_ranks:  # a collective: outside the lock
            self._rank_problems(compare_ranks(made))
        return new_trace

    def _record_at_run_time(self, decision: Decision) -> None:
        """Record ``decision``, made while the program runs (a region's rescue); where it leaves a region of a
        ThunderFX subgraph to its ops one by one, the Dynamo graph calling that subgraph is checked at its next call
        as where Thunder fails on a subgraph (``_whole_graph_after``): where unguarded Thunder fails there too, its
        split is timed against Inductor's compile of the whole graph."""
        self.report.add(decision)
        if decision.subgraph is None or not runs_unfused(decision):
            return
        for rescue in list(self._rescues):
            check = rescue.on_region_failure
            if check is not None and self._subgraph_ids.get(rescue.module) == decision.subgraph:
                rescue.at_next_call(functools.partial(check, failed=decision))

    def _announce(self, made: list[Decision]) -> None:
        """Warn once for each decision of a code that warns (``reasons.WARNED``: a pass or rewrite that failed)."""
        for decision in made:
            if decision.code in WARNED:
                said = f"{decision.reason}: {decision.error.splitlines()[0]}" if decision.error else decision.reason
                if said not in self._warned:
                    self._warned.add(said)
                    warnings.warn(f"FusionGuard: {decision.trace} trace: {said}", RuntimeWarning, stacklevel=3)

    def _where(self, trace: str) -> TraceContext:
        """Where the trace Thunder compiles now comes from: function, compiled program, subgraph, rank."""
        function = th.compile_function_name()
        return TraceContext(
            trace=trace,
            function=function,
            compile_index=self._this_thread().get(function, self._compiles.get(function, 0)),
            subgraph=self._subgraph_id(th.compiling_fx_subgraph()),
            compile_options=th.explicit_compile_options(),
            rank=current_rank(),
            captured=th.compiling_with_cuda_graphs() or will_be_captured(),
        )

    def _this_thread(self) -> dict[str | None, int]:
        """The compile index of each function this thread compiled last (its hoist ledger made on first use)."""
        if not hasattr(self._thread, "compiles"):
            self._thread.compiles, self._thread.hoisted = {}, HoistLedger()
        return self._thread.compiles

    def cuda_graphs_captured(self, summary: th.CaptureSummary) -> None:
        """Record what a :class:`~.cuda_graphs.GuardedCUDAGraphs` captured in a trace of a program this guard
        compiles too (it calls this right after capturing)."""
        with self._lock:
            where = self._where("backward" if summary.backward else "forward")
            decision = capture_decision(where, summary)
            self.report.add(decision)
            self._captures[summary] = decision

    def _about_capture(self, summary: th.CaptureSummary, decide: Callable[[Decision], Decision]) -> None:
        """Record ``decide(capture)``, a decision about one graph of the capture ``summary`` tells of, where this guard
        recorded that capture (a compilation it takes part in)."""
        with self._lock:
            capture = self._captures.get(summary)
            if capture is not None:
                self.report.add(decide(capture))

    def cuda_graph_gradients_held(self, summary: th.CaptureSummary, graph: str, held: list[str]) -> None:
        """Record that ``graph`` (of the capture ``summary`` tells of) found gradients it had handed to autograd
        still held when it would replay: it runs uncaptured while they are held, and is captured anew after
        ``UNCAPTURED_WHILE_HELD`` such calls in a row (it calls this before the first of them)."""
        self._about_capture(summary, lambda capture: held_decision(capture, graph, held))

    def cuda_graph_input_moved(
        self, summary: th.CaptureSummary, graph: str, moved: list[str], uncaptured: bool
    ) -> None:
        """Record that inputs ``moved`` that ``graph`` reads in place lay elsewhere than at its capture (FSDP2's
        unsharded parameters): it is captured anew with them copied in, or runs uncaptured where it writes one."""
        self._about_capture(summary, lambda capture: moved_decision(capture, graph, moved, uncaptured))

    def cuda_graph_reentered(self, summary: th.CaptureSummary, graph: str, in_backward: bool = False) -> None:
        """Record that ``graph`` (of the capture ``summary`` tells of) ran again before its earlier call's outputs were
        let go: a forward graph before the backward of its earlier call, a backward graph twice in one backward pass
        (``in_backward``). The graphs of that forward and its backward run uncaptured from then on."""
        self._about_capture(summary, lambda capture: reentered_decision(capture, graph, in_backward))

    def cuda_graph_uncaptured(self, summary: th.CaptureSummary, graph: str, error: BaseException) -> None:
        """Record that capturing ``graph`` (of the capture ``summary`` tells of) ran out of device memory: its ops
        run uncaptured from then on (it calls this once, at that call). Strict mode: nothing falls back, the call
        raises ``FusionGuardError`` from the memory error (the decision still records it)."""
        self._about_capture(summary, lambda capture: uncaptured_decision(capture, graph, error))
        if self.options.strict:
            raise FusionGuardError(
                f"capturing {graph} ran out of device memory (strict: no uncaptured fallback): {error_line(error)}"
            ) from error

    def transform_module(self, model: Any) -> None:
        """Under ThunderFX, stand between each split subgraph and Thunder's compiled function, so that a subgraph
        Thunder fails on runs another way (:mod:`.fx_rescue`), recorded; strict mode: the failure is raised. The
        ThunderModule's call is wrapped, kept as the rescue's ``__wrapped__`` (``unwrap_module_call`` restores it).
        Any ThunderModule: each call through Thunder's own function keeps the user's lines while it runs
        (:func:`._thunder.calls_with_user_lines`), Thunder's functions its own again after."""
        module = th.thunderfx_subgraph_module(model)
        options = self.options
        if module is None:
            self._refuse_scripted(model)
        compiler = th.thunderfx_compiler_on_stack() if module is not None else None
        th.wrap_module_call(model, th.calls_with_user_lines)
        if module is not None and options.strict and not options.report_only:
            th.wrap_module_call(model, lambda call: refusing_lost_gradients(call, module, FusionGuardError))
        if module is None or not options.rescue or options.strict or options.report_only:
            return

        def on_rescue(what: Rescued) -> None:
            with self._lock:
                decision = rescue_decision(self._subgraph_id(module), module, what, describe_inputs)
                self.report.add(decision)
            if not what.fake:  # a call on fake tensors is no failure: recorded, not announced
                announce(decision)
            failed = what.error is not None or bool(what.lost_grad)  # Thunder failed, or would lose gradients
            if options.runtime.whole_graphs and what.by in RUN_WITHOUT_THUNDER and failed and compiler:
                with contextlib.suppress(Exception):  # a shortcut's check: never a reason to fail the call
                    self._whole_graph_after(model, module, what.received or what.args, compiler)

        def entered(why: str) -> None:
            with self._lock:
                subgraph = self._subgraph_id(module)
                decision = entry_decision(subgraph, module, why)
                self._at_latest_compilation(decision, subgraph)
                self.report.add(decision)

        def on_first_call(rescue: SubgraphRescue, args: tuple | None) -> None:
            if options.runtime.eager_pieces:
                self._decide_pieces(module, rescue.jitted)
            if options.runtime.direct_entry:
                entry, why = th.direct_entry(rescue.jitted, rescue.thunder_fn)
                if entry is not None:
                    rescue.enter(entry)
                    entry.on_leave = entered
                entered(why)
            if options.runtime.eager_pieces and args is not None:
                self._decide_eager_subgraph(module, rescue, args)

        runtime = options.runtime
        first = on_first_call if runtime.direct_entry or runtime.eager_pieces else None

        def rescuing(call: Callable) -> SubgraphRescue:
            rescue = SubgraphRescue(model, call, module, on_rescue, first)
            if runtime.whole_graphs and compiler is not None:  # a region of it that fails may leave no Thunder bits
                rescue.on_region_failure = functools.partial(self._whole_graph_after, model, module, compiler=compiler)
                self._rescues.add(rescue)
            return rescue

        th.wrap_module_call(model, rescuing)

    def _decide_eager_subgraph(self, module: Any, rescue: SubgraphRescue, args: tuple) -> None:
        """Run the ThunderFX subgraph ``module`` eagerly from now on where nothing was hoisted from it and its eager run
        gives Thunder's bits on this first call's ``args``, and Thunder fuses nothing of it or, timed (the cost model
        on), runs it slower by the margin (``fx_pieces.eager_subgraph``), recorded; else it stays Thunder's, recorded
        where a timing kept it."""
        subgraph = self._subgraph_id(module)
        if any(d.subgraph == subgraph and d.action == "hoist" for d in self.report):
            return
        costs = self.options.costs
        timer = self.measurer.pair if costs.cost_model and costs.measure_budget_s > 0 else None
        found = eager_subgraph(module, rescue.jitted, rescue.run, args, timer, costs.margin)
        if found.run is None and found.measured is None:
            return
        if found.run is not None:
            rescue.run_eagerly(found.run)
        with self._lock:
            if found.measured is not None:
                self.report.measuring = self.measurer.to_dict()
            decision = subgraph_decision(subgraph, module, found.measured, costs.margin, eager=found.run is not None)
            self._at_latest_compilation(decision, subgraph)
            self.report.add(decision)

    def _at_latest_compilation(self, decision: Decision, subgraph: str | None) -> None:
        """Name in ``decision`` the compilation it is about: the latest one that recorded a decision of ThunderFX
        subgraph ``subgraph`` (decisions about pieces beside it name none)."""
        compiled = [d for d in self.report if d.subgraph == subgraph and d.function is not None]
        if compiled:
            decision.function, decision.compile_index = compiled[-1].function, compiled[-1].compile_index

    def _whole_graph_after(
        self, jitted: Any, module: Any, args: tuple, compiler: Any, failed: Decision | None = None
    ) -> None:
        """Thunder failed on ThunderFX subgraph ``module`` (``jitted``) at a call on ``args``, or would have lost a
        gradient through it, or a fusion region of it failed and runs unfused (``failed``, its rescue): where Thunder
        without the guard's changes fails on it, the Dynamo graph calling it (found on the call stack) has no Thunder
        bits, so at its next call its split is timed against Inductor's compile of the whole graph, and the faster
        runs it from then on (:mod:`.whole_graph`), recorded."""
        owner = th.split_graph_owner(jitted)
        graph = None if owner is None else th.dynamo_graph_of(compiler, owner[0])
        if graph is None or owner[0] in self._graphs_whole:
            return
        split, (index, original) = owner[0], graph
        recording = FusionGuard(report_only=True, costs=Costs(cost_model=False))
        unguarded = unguarded_failure(jitted, self, recording, args, failed)
        if unguarded is None:  # Thunder's own runs this subgraph: another one may still show the graph has no bits
            return
        self._graphs_whole.add(split)
        subgraph, label = self._subgraph_id(module), th.dynamo_graph_label(index)
        costs = self.options.costs
        # its own allowance: one decision a graph, which region timings must not have spent the budget of
        timer: Any = functools.partial(self.measurer.pair, allowance_s=WHOLE_GRAPH_TIMING_S)
        if not costs.cost_model or costs.measure_budget_s <= 0:
            timer = "not timed: the cost model is off, or option 'costs.measure_budget_s' is 0"
        elif world_size() > 1:
            timer = f"not timed: a run of {world_size()} ranks keeps every split, so that every rank decides alike"

        def failed(error: Exception) -> None:
            warn_back_to_split(label, error)
            with self._lock:
                self.report.warnings.append(f"Inductor failed on {label} ({error_line(error)}); its split runs it")

        def decide(*call: Any) -> Any:
            try:
                with random_state_kept(call):
                    inputs = [copy_input(a) for a in call]
                    found = whole_or_split(
                        label, original, run_split, inputs, timer, costs.margin, self.options.runtime.option_compiles_s
                    )
            except Exception as e:  # copying or timing failed (out of memory, say): the split stays, the call goes on
                found = WholeGraph(label, False, f"not timed: {error_line(e)}")
            if found.inductor and found.whole is not None:
                split.forward = WholeGraphRun(found.whole, split, failed)
            else:
                vars(split).pop("forward", None)
            with self._lock:
                if found.measured is not None:
                    self.report.measuring = self.measurer.to_dict()
                self.report.add(whole_graph_decision(found, original, subgraph, unguarded, costs.margin))
            return split(*call)

        run_split = functools.partial(type(split).forward, split)
        split.forward = decide  # at the graph's next call; this one goes on as it is

    def _decide_pieces(self, module: Any, jitted: Any) -> None:
        """Once for the split graph calling ``jitted`` (found on the call stack): its Inductor pieces that give the
        same bits eagerly run eagerly (:mod:`.fx_pieces`), recorded."""
        found = th.split_graph_owner(jitted)
        if found is None or found[0] in self._owners_decided:
            return
        self._owners_decided.add(found[0])
        beside = self._subgraph_id(module)

        def tell(run: PieceRun) -> None:
            with self._lock:
                self.report.add(piece_decision(run, beside))

        run_pieces_eagerly(found[0], tell)

    def _refuse_scripted(self, model: Any) -> None:
        """Raise, before Thunder interprets ``model``, where its forward calls a TorchScript function: Thunder 0.2.6
        would abort the whole process there (:mod:`._thunder.scripted`)."""
        inner = getattr(model, "_model", None)
        if not isinstance(inner, torch.nn.Module):
            return
        calls = th.scripted_calls(inner)
        if calls:
            raise FusionGuardError(
                f"thunder.jit would abort this process: Thunder {th.software_versions()['thunder']} cannot interpret "
                f"TorchScript, and {type(inner).__name__} calls {'; '.join(calls[:3])}"
                f"{f' and {len(calls) - 3} more' if len(calls) > 3 else ''}. Compile it under ThunderFX "
                "(thunder.dynamo.thunderfx), whose Dynamo runs such functions as Python"
            )

    @property
    def orders_einsum_labels(self) -> bool:
        """Whether this guard's compilations trace einsum in sorted label order (``ordered_einsum``; None: when
        the run has several ranks), so that every rank traces it alike whatever ``PYTHONHASHSEED``."""
        ordered = self.options.ordered_einsum
        return world_size() > 1 if ordered is None else ordered

    def check_ranks(self, group: Any = None) -> list[str]:
        """Compare every decision so far with those of the other ranks; one line per rank that differs.

        A collective (``torch.distributed.all_gather_object`` over ``group``, default the default group):
        call it on every rank at the same point, e.g. after the first training step. Returns [] when
        all ranks agree or ``torch.distributed`` is not initialized. A difference raises
        :class:`RankMismatch` in strict mode; otherwise it is recorded in ``report.warnings`` and warned.
        """
        problems = compare_ranks(self.report.decisions, group)
        self._rank_problems(problems)
        return problems

    def _rank_problems(self, problems: list[str]) -> None:
        if not problems:
            return
        if self.options.strict:
            raise RankMismatch("; ".join(problems))
        for problem in problems:
            self.report.warnings.append(problem)
            warnings.warn(f"FusionGuard: {problem}", RuntimeWarning, stacklevel=3)

    def __deepcopy__(self, memo: dict) -> FusionGuard:
        """The guard itself: ThunderFX deep-copies split graphs, and under DDP or FSDP2 those reach its
        backend and this guard; a copy would split the report (and cannot copy the lock)."""
        return self

    def _subgraph_id(self, module: Any) -> str | None:
        """The id of a ThunderFX subgraph (``subgraph 0``, ...), given when it is first compiled."""
        if module is None:
            return None
        if module not in self._subgraph_ids:
            key = f"subgraph {len(self.report.subgraphs)}"
            self._subgraph_ids[module] = key
            self.report.add_subgraph(Subgraph(key, th.fx_graph_ops(module)))
        return self._subgraph_ids[module]

    def subgraph_of(self, module: Any) -> str | None:
        """The id this guard gave the ThunderFX subgraph ``module`` (None if it never compiled it)."""
        try:
            return self._subgraph_ids.get(module)
        except TypeError:
            return None

    def constants_for(self, device: str, executor: str) -> CostConstants | None:
        """The cost constants used for ``executor`` on ``device``, resolved once per guard (option
        ``costs.calibration``); with ``"auto"`` or ``"measure"`` this may calibrate, which never raises. Constants
        not calibrated on this machine (another CPU's shipped ones) put the model in doubt (:class:`ModelDoubt`)."""
        key = (device, executor)
        if key not in self._constants:
            mode = self.options.costs.calibration
            if isinstance(mode, CostConstants):
                chosen = mode
            elif mode == "shipped":
                chosen = calibrate.shipped_here(device, executor) or self._elsewhere(device, executor)
            elif mode == "measure":
                chosen = calibrate.cached(device, executor)
            else:
                chosen = calibrate.lookup(device, executor)
            ranks = world_size()
            if chosen is None and mode == "auto" and ranks > 1:
                # Each rank would measure its own constants and could decide differently: none measures.
                note = (
                    f"not calibrated: a run of {ranks} ranks calibrates nowhere, so that every rank decides alike "
                    "(run `fusion-guard calibrate` once on this machine, or pass costs=Costs(calibration='measure'))"
                )
                event = {"device": device, "executor": executor, "seconds": 0.0, "result": note}
                self.report.calibrations.append(event)
            elif chosen is None and mode in ("auto", "measure"):
                spent: dict[str, float] = {}
                budget = self.options.costs.calibration_budget_s
                chosen, note, seconds = timing(GUARD_MEASUREMENTS, calibrate.auto_calibrate)(
                    device, executor, budget, spent
                )
                event = {"device": device, "executor": executor, "seconds": round(seconds, 3), "result": note}
                self.report.calibrations.append({**event, **spent})
            if chosen is None and mode in ("auto", "cached"):
                chosen = self._elsewhere(device, executor)
            self._constants[key] = chosen
        return self._constants[key]

    def _elsewhere(self, device: str, executor: str) -> CostConstants | None:
        """Another CPU's shipped constants, where there are some, with the model in doubt: they stand in for
        constants of this machine only with every exact region timed."""
        chosen = calibrate.shipped_elsewhere(device, executor)
        if chosen is not None:
            self.doubt.note(device, executor, Doubt(by="shipped_elsewhere", device=device_name(device)))
        return chosen

    def __repr__(self) -> str:
        """The options that differ from their defaults, as they would be written: ``FusionGuard(strict=True)``."""
        options = getattr(self, "options", None)  # None while __init__ runs (a traceback's repr)
        return f"FusionGuard{repr(options).removeprefix('GuardOptions')}" if options is not None else "FusionGuard(...)"


def guards_of(obj: Any) -> list[Any]:
    """The FusionGuard instances attached to a ``thunder.jit`` result or a ThunderFX object."""
    found = [t for t in th.jitted_transforms(obj) if isinstance(t, FusionGuard)]
    for t in th.thunderfx_transforms(obj):
        if isinstance(t, FusionGuard) and t not in found:
            found.append(t)
    return found
