"""Thunder's ``CUDAGraphTransform``: telling it apart, clearing what a failed compilation left in it, the same
capture for the traces its own checks refuse, and the capture of this package (:class:`SharedBuffersCapture`, the
public ``GuardedCUDAGraphs``) without the copies Thunder's makes.

Thunder 0.2.6's transform hands what a forward trace saves from its forward compilation to its backward one
through its own state and checks the backward trace by fixed positions: a backward trace that gets no saved
tensors (a ThunderFX subgraph whose gradient needs none of its values) fails an ``assert`` there, and a forward
compiled without a backward after it (or a compilation that failed between the two) makes the next forward
fail another. Neither says anything about the capture itself.

It also copies, at every replay, each input of a graph into the graph's own buffer unless the input is a
parameter or an output of a forward graph saved for the backward. Two things make that dear: it groups the ops
to capture with the compile option ``fusion_type``, which ThunderFX sets to ``"dataflow"``, so one trace becomes
several graphs, an output of one read by the next is copied at every replay, and a group holding nothing but
deletions becomes a graph of no work whose inputs are copied all the same; on the e3nn-built NequIP that was 4.7
GB a step. :class:`SharedBuffersCapture` groups consecutive ops, as Thunder does under ``thunder.jit``, captures no
group without work, and lets a graph read an earlier graph's output where it lies. The user chooses it by passing
it (``GuardedCUDAGraphs``); a ``CUDAGraphTransform`` passed is Thunder's and runs as Thunder's.

And it hands a backward graph's gradients to autograd as the tensors it keeps for the next replay, so autograd,
which takes over a gradient nobody else holds, copies each one into a ``.grad`` of its own (0.97 ms of the 4.41 ms
of GPU work of a litgpt step on an H100). This package's transform hands each on its own tensor over the
graph's buffer, and stops where one is still held when the graph would replay (an accumulated ``.grad``).

Thunder's runner warms a graph up on its capture stream before capturing it, so the cuBLAS workspace the
captured matmuls use was allocated outside the graph's memory pool, and the graph keeps its address. Whoever
clears cuBLAS's workspaces then (torch.compile's CUDA graphs do, before and after each capture) frees memory the
graph still writes at every replay: the next tensor allocated there is overwritten (an illegal memory access, or
wrong values, with Inductor's CUDA graphs in the same process). Each graph this package's transform makes is warmed
up on a stream of its own, so the capture's first matmul allocates the workspace in the graph's own pool, where no
other tensor is ever placed (:func:`own_blas_workspace`).
"""

from __future__ import annotations

import time
import traceback
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from thunder.core import prims, utils
from thunder.core.compile_data import get_compile_data
from thunder.core.proxies import FutureTensorProxy, Proxy, ProxyTag, unvariableify
from thunder.core.symbol import BoundSymbol, Symbol
from thunder.core.trace import TraceCtx, TraceProvenance, TraceTag, from_trace, reset_tracectx, set_tracectx
from thunder.executors.data_dependent_partition import Node, consecutive_fusion, fuse_bound_symbols
from thunder.executors.utils import Region
from thunder.transforms.cudagraph import CUDAGraphTransform

from .compiling import compiling_transforms
from .graph_calls import (
    GraphCall,
    Program,
    copying_back,
    handing_over,
    holds_a_write,
    own_blas_workspace,
    proxy_names,
    written_inputs,
)
from .lowering import with_call
from .traces import runs_distributed_prim, unbound_reads

__all__ = [
    "CaptureSummary",
    "SharedBuffersCapture",
    "capture_for_any_trace",
    "compiling_with_cuda_graphs",
    "forget_forward",
    "is_cudagraph_transform",
    "is_thunders_cudagraph_transform",
    "refused_by_its_checks",
]


def is_cudagraph_transform(transform: Any) -> bool:
    """True for Thunder's ``CUDAGraphTransform``, which only captures and replays: dropping it changes no value."""
    return isinstance(transform, CUDAGraphTransform)


def is_thunders_cudagraph_transform(transform: Any) -> bool:
    """True for exactly Thunder's ``CUDAGraphTransform`` class (not a subclass, which may capture otherwise)."""
    return type(transform) is CUDAGraphTransform


def compiling_with_cuda_graphs() -> bool:
    """Whether the compilation Thunder runs right now has a ``CUDAGraphTransform``: its program replays in graphs."""
    return any(is_cudagraph_transform(t) for t in compiling_transforms())


def forget_forward(transform: Any) -> None:
    """Clear what a ``CUDAGraphTransform`` kept of a forward trace for its backward, after a compilation that
    failed between the two (its next forward would otherwise assert)."""
    if is_cudagraph_transform(transform) and transform.outputs_from_forward is not None:
        transform.outputs_from_forward = None


def refused_by_its_checks(error: BaseException) -> bool:
    """Whether ``error`` is one of the checks of ``CUDAGraphTransform.transform_trace_post_optimization`` (an
    ``AssertionError`` raised in that method), not a failure of a capture."""
    if not isinstance(error, AssertionError):
        return False
    frames = list(traceback.walk_tb(error.__traceback__))
    if not frames:
        return False
    code = frames[-1][0].f_code
    return code.co_name == "transform_trace_post_optimization" and code.co_filename.endswith(
        ("transforms/cudagraph.py", "transforms\\cudagraph.py")
    )


@dataclass(eq=False)
class CaptureSummary:
    """What :class:`SharedBuffersCapture` captured in one trace, against what Thunder's own grouping would have
    captured there (one per trace: compared, and hashed, by identity)."""

    backward: bool
    captures: list[str]  # the graphs made, by name (``CUDAGraph3``)
    ops: int  # ops captured in them
    thunder_captures: int  # graphs Thunder's own grouping makes of the same trace
    thunder_empty: int  # of those, graphs of nothing but deletions (their inputs copied at each replay for no work)
    thunder_empty_inputs: int  # the inputs of those
    in_place: list[tuple[str, str, int]] = field(default_factory=list)  # (input, graph that wrote it, bytes) read
    # where it lies instead of copied at each replay
    written: list[str] = field(default_factory=list)  # earlier graphs' outputs a graph writes: still copied
    copied_back: list[tuple[str, str, int]] = field(default_factory=list)  # (input, graph, bytes): an input the
    # graph may write, copied from the graph's buffer back into the caller's tensor after each replay
    handed_over: list[tuple[str, str, int]] = field(default_factory=list)  # (gradient, graph, bytes): a gradient
    # the backward returns, handed to autograd on the graph's own buffer rather than copied by autograd
    own_workspace: list[str] = field(
        default_factory=list
    )  # graphs warmed up apart: their cuBLAS workspace in their pool
    copied_in: list[tuple[str, str, int]] = field(default_factory=list)  # (input, graph, bytes): copied into the
    # graph's own buffer at each replay, all of a graph's in one batched copy
    captured_by: str = ""  # the class of the transform that captured (of the one adapted: capture_for_any_trace)
    regrouped: list[str] = field(default_factory=list)  # names Thunder's own grouping read where unbound (deleted
    # or not yet assigned; ``share_buffers=False``): the trace was grouped by consecutive runs, with Thunder's copies


def _bytes(proxy: Any) -> int:
    """What a tensor proxy holds, in bytes (0 for anything else)."""
    try:
        return int(proxy.numel) * int(proxy.dtype.bytes)
    except (AttributeError, TypeError):
        return 0


def _deletes_a_future(bsym: BoundSymbol) -> bool:
    return bsym.sym.id is prims.PrimIDs.DEL and any(isinstance(a, FutureTensorProxy) for a in bsym.flat_args)


def _only_deletions(bsyms: list[BoundSymbol]) -> bool:
    return all(b.sym.id is prims.PrimIDs.DEL for b in bsyms)


class SharedBuffersCapture(CUDAGraphTransform):
    """``CUDAGraphTransform`` that captures each run of consecutive capturable ops as one graph whatever
    ``fusion_type`` says, captures no run of deletions alone, and lets a graph read an output of an earlier graph
    of the same trace in that graph's own buffer (the same tensor at every replay) instead of copying it in.
    An input a graph writes (an in-place op or ``copy_`` reading it, by ``_writes``) is copied as before, and
    copied back after each replay. Each capture is told to the compilation's transforms that take it
    (``cuda_graphs_captured``: a FusionGuard records it)."""

    # Whether an op may write a tensor it reads (the public subclass passes the guard's rule): by default, one that
    # holds an in-place op or a copy_.
    _writes: Callable[[BoundSymbol], bool] = staticmethod(holds_a_write)
    share_buffers = True  # False: Thunder's own grouping and copies (writes still copied back)
    _building: tuple[CaptureSummary, Program | None] | None = None  # the capture and program a trace's graphs join
    _captured_by: str | None = None  # the class named in its CaptureSummary (None: its own)
    # Whether an op runs between graphs, never inside one (the public subclass passes the guard's rule for
    # communication ops): a collective runs on its own stream, and a graph that waits for one launched outside it
    # cannot be captured (an FSDP all-gather before the graph, its wait inside: cudaErrorStreamCaptureIsolation).
    _outside: Callable[[BoundSymbol], bool] = staticmethod(runs_distributed_prim)

    def can_fuse(self, bsym: BoundSymbol) -> bool:
        """Thunder's rule for what a graph may hold, without the ops ``_outside`` keeps between graphs and without
        the deletion of a collective's future: a graph deleting one would take it as an input, a new one at each
        call (a new capture each step, and graphs reading another capture's buffers)."""
        return not self._outside(bsym) and not _deletes_a_future(bsym) and super().can_fuse(bsym)

    def _can_fuse_nodes(self, a: Node, b: Node) -> bool:
        """Thunder's grouping predicate for capture: a node of several ops, or one op this transform captures."""
        return all(len(n.group_bsyms) > 1 or self.can_fuse(n.group_bsyms[0]) for n in (a, b))

    def generate_fused_trace(self, trace: TraceCtx, **kwargs: Any) -> TraceCtx:
        program = self._program_for(trace)
        if not self.share_buffers:
            backward = trace.siginfo().name == "backward_fn"
            summary = self._summary(backward)
            self._building = (summary, program)
            try:
                fused = super().generate_fused_trace(trace, **kwargs)
            finally:
                self._building = None
            unbound = unbound_reads(fused)
            if not unbound:
                graphs = [b for b in fused.bound_symbols if b.sym.name in self.cuda_graph_runner.python_callables]
                summary.captures = [b.sym.name for b in graphs]
                summary.ops = sum(s.sym.id is not prims.PrimIDs.DEL for b in graphs for s in b.subsymbols)
                if backward and program is not None and summary.captures:
                    program.active = True  # a backward graph counts the backward's runs
                self._compare_with_thunders_grouping(trace, summary)
                _announce(summary)
                return fused
            # Thunder's dataflow grouping reorders the trace; where the order it gives reads a name that is
            # deleted or not yet assigned there, that trace fails with UnboundLocalError (ThunderFX + DDP on CUDA,
            # Thunder's own CUDAGraphTransform too). Consecutive runs keep the trace's order.
            return self._consecutive(trace, program, share=False, regrouped=unbound)
        return self._consecutive(trace, program, share=True)

    def _program_for(self, trace: TraceCtx) -> Program | None:
        """The :class:`Program` of ``trace``'s graphs: a forward with a backward and the backward compiled after it
        (Thunder transforms the two in turn) share one, so that a graph called again before its earlier call's
        outputs are let go stops capturing (graph_calls.Program); None for a trace of neither."""
        if trace.siginfo().name == "backward_fn":
            program, self._forward_program = getattr(self, "_forward_program", None), None
            return program
        self._forward_program = Program() if TraceTag.AUGMENTED_FORWARD in trace.tags else None
        return self._forward_program

    def _summary(self, backward: bool, regrouped: list[str] | None = None) -> CaptureSummary:
        summary = CaptureSummary(backward, [], 0, 0, 0, 0)
        summary.captured_by = self._captured_by or type(self).__name__
        summary.regrouped = list(regrouped or ())
        return summary

    def _consecutive(
        self, trace: TraceCtx, program: Program | None, *, share: bool, regrouped: list[str] | None = None
    ) -> TraceCtx:
        """``trace`` with each run of consecutive capturable ops one graph (of ``program``): buffers shared
        (``share``) or with Thunder's ``fuse`` and its copies; ``regrouped``: the names Thunder's grouping read where
        they were unbound."""
        began = time.perf_counter_ns()
        gradients = _gradients(trace)
        backward = trace.siginfo().name == "backward_fn"
        summary = self._summary(backward, regrouped)
        self._building = (summary, program)
        with _building_from(trace) as fused_trace:
            groups = consecutive_fusion(trace, self._can_fuse_nodes)
            producers, consumers = utils.producers_and_consumers(trace)
            captured: dict[str, str] = {}  # output name -> the graph that writes it
            fused = []
            for bsyms in groups:
                if len(bsyms) == 1 or not self.can_fuse(bsyms[0]) or _only_deletions(bsyms):
                    fused.extend(bsyms)
                    continue
                region = Region(producers, consumers, bsyms)
                if share:
                    fusion = self._fuse_sharing(region, captured, summary, consumers, gradients, program)
                else:
                    fusion = self.fuse(region, len(summary.captures))
                summary.captures.append(fusion.sym.name)
                summary.ops += sum(b.sym.id is not prims.PrimIDs.DEL for b in bsyms)
                captured.update((o.name, fusion.sym.name) for o in fusion.flat_proxy_outs)
                fused.append(fusion)
            fused_trace.bound_symbols = fused
            self._building = None
            if backward and program is not None and summary.captures:
                program.active = True  # a backward graph counts the backward's runs
            fused_trace.set_provenance(
                TraceProvenance(
                    f"CUDAGraph fusion, {'buffers shared' if share else 'consecutive runs'} "
                    f"(took {(time.perf_counter_ns() - began) // 10**6} ms)"
                )
            )
        self._compare_with_thunders_grouping(trace, summary)
        _announce(summary)
        return fused_trace

    def _fuse_sharing(
        self,
        region: Region,
        captured: dict[str, str],
        summary: CaptureSummary,
        consumers: Any,
        gradients: frozenset[str],
        program: Program | None = None,
    ) -> BoundSymbol:
        """Thunder's ``fuse``, with the static-input mask it would make from the inputs' tags widened to the
        outputs of earlier graphs that this graph does not write, and the ``gradients`` (names the backward
        returns) it outputs handed to autograd on its own buffers."""
        from thunder.executors.passes import _del_last_used

        inputs = [unvariableify(i) for i in region.inputs]
        outputs = [unvariableify(o) for o in region.outputs]
        inside = {id(b) for b in region.bound_symbols}
        region.bound_symbols = _del_last_used(region.bound_symbols, outputs)
        written = {a.name for b in region.bound_symbols if self._writes(b) for a in b.flat_args if isinstance(a, Proxy)}
        mask = []
        for i in inputs:
            static = isinstance(i, Proxy) and ProxyTag.STATIC_MEMORY_LOCATION in i.tags
            writer = captured.get(getattr(i, "name", None)) if isinstance(i, Proxy) else None
            if not static and writer is not None:
                if i.name in written:
                    summary.written.append(i.name)
                else:
                    static = True
                    summary.in_place.append((i.name, writer, _bytes(i)))
            mask.append(static)
        runner = self.cuda_graph_runner
        _, name = runner.make_cuda_graph_callable_from_symbols(region.bound_symbols, inputs, outputs, mask)
        if own_blas_workspace(runner, name):
            summary.own_workspace.append(name)
        writes_at = written_inputs(region.bound_symbols, inputs, self._writes)
        graph_call = _graph_call(runner, name, inputs, writes_at, summary, program)
        summary.copied_in += [
            (i.name, name, _bytes(i)) for i, m in zip(inputs, mask, strict=True) if not m and _bytes(i)
        ]
        back = [i for i in writes_at if not mask[i]]
        summary.copied_back += [(inputs[i].name, name, _bytes(inputs[i])) for i in back]
        call = copying_back(graph_call, back, graph_call.last_static_inputs)
        # A gradient the rest of the trace reads too stays the graph's own tensor: a later graph reads it in place
        # only while it is the same object at every replay.
        handed = {
            k: o.name
            for k, o in enumerate(outputs)
            if isinstance(o, Proxy)
            and o.name in gradients
            and all(id(b) in inside or b.sym.id in _LAST_USES for b in consumers.get(o, ()))
        }
        if handed:
            summary.handed_over += [(outputs[k].name, name, _bytes(outputs[k])) for k in handed]
            call = handing_over(graph_call, call, handed, _telling("cuda_graph_gradients_held", summary))
        # The meta gives the region's outputs, so that Thunder's trace checks (DebugOptions) can run over it.
        symbol = Symbol(name, meta=lambda *args, **kwargs: outputs, is_fusion=True, executor=self)
        return BoundSymbol(symbol, inputs, {}, outputs, region.bound_symbols, _call_ctx={name: call})

    def fuse(self, region: Region, fusion_counter: int) -> BoundSymbol:
        """Thunder's ``fuse`` (its own grouping and copies, where this transform does not share buffers), called as
        the guard's capture calls a graph (:class:`GraphCall`: the same copies and replay, a moved static input
        captured anew, a graph of a program run again uncaptured), with the inputs the graph may write copied back
        after each replay."""
        fused = super().fuse(region, fusion_counter)
        name = fused.sym.name
        runner = self.cuda_graph_runner
        own_blas_workspace(runner, name)
        inputs = [unvariableify(i) for i in region.inputs]
        static = runner.python_callables[name][1]
        writes_at = written_inputs(region.bound_symbols, inputs, self._writes)
        back = [i for i in writes_at if not (static and static[i])]
        summary, program = getattr(self, "_building", None) or (None, None)
        graph_call = _graph_call(runner, name, inputs, writes_at, summary, program)
        return with_call(fused, copying_back(graph_call, back, graph_call.last_static_inputs))

    def _compare_with_thunders_grouping(self, trace: TraceCtx, summary: CaptureSummary) -> None:
        """How many graphs Thunder's own grouping (``fusion_type``) makes of ``trace``, and how many of nothing
        but deletions, with their inputs (what :class:`CaptureSummary` reports beside this transform's)."""
        with _building_from(trace):
            producers, consumers = utils.producers_and_consumers(trace)
            for bsyms in fuse_bound_symbols(trace, self._can_fuse_nodes):
                if len(bsyms) == 1 or not self.can_fuse(bsyms[0]):
                    continue
                summary.thunder_captures += 1
                if _only_deletions(bsyms):
                    summary.thunder_empty += 1
                    summary.thunder_empty_inputs += len(Region(producers, consumers, bsyms).inputs)


def _graph_call(
    runner: Any,
    name: str,
    inputs: list[Any],
    writes_at: list[int],
    summary: CaptureSummary | None,
    program: Program | None,
) -> GraphCall:
    """Graph ``name`` of ``runner`` called as this package calls a graph, telling what befalls it (an input that
    moved, a capture out of memory, a program run again) to the transforms that take it, about ``summary``'s capture;
    ``writes_at``: the positions of the inputs it may write."""
    graph_call = GraphCall(runner, name)
    if summary is not None:
        graph_call.on_uncaptured = _telling("cuda_graph_uncaptured", summary)
        graph_call.on_moved = _telling("cuda_graph_input_moved", summary)
    if program is not None and summary is not None:
        graph_call.program, graph_call.forward = program, not summary.backward
        graph_call.on_reentered = _telling("cuda_graph_reentered", summary)
    graph_call.input_names = [getattr(i, "name", None) for i in inputs]
    graph_call.written = frozenset(writes_at)
    return graph_call


_LAST_USES = (prims.PrimIDs.RETURN, prims.PrimIDs.DEL)


def _gradients(trace: TraceCtx) -> frozenset[str]:
    """The names a backward trace returns (the gradients autograd gets); none for any other trace."""
    if trace.siginfo().name != "backward_fn" or not trace.bound_symbols:
        return frozenset()
    last = trace.bound_symbols[-1]
    return frozenset(proxy_names(last.flat_args)) if last.sym.id is prims.PrimIDs.RETURN else frozenset()


@contextmanager
def _building_from(trace: TraceCtx) -> Iterator[TraceCtx]:
    """A new trace from ``trace``, current while the block builds regions into it (as Thunder's ``fuse`` does)."""
    built = from_trace(trace)
    built.clear_collection_names = set()
    token = set_tracectx(built)
    try:
        yield built
    finally:
        del built.clear_collection_names
        reset_tracectx(token)


def _announce(summary: CaptureSummary) -> None:
    """Hand ``summary`` to every transform of the compilation running now that takes one
    (``cuda_graphs_captured(summary)``: the guard records it)."""
    for hook in _hooks("cuda_graphs_captured"):
        hook(summary)


def _telling(method: str, summary: CaptureSummary) -> Callable[..., None]:
    """A callable that tells ``method(summary, *what)`` to every transform of the compilation running now that has
    it (found now, while compiling; called later, at a replay)."""
    hooks = _hooks(method)

    def tell(*what: Any) -> None:
        for hook in hooks:
            hook(summary, *what)

    return tell


def _hooks(method: str) -> list[Callable]:
    """The bound ``method`` of each transform of the compilation running now that has one."""
    try:
        transforms = getattr(get_compile_data(), "transforms", None) or ()
    except LookupError:
        return []
    return [hook for t in transforms if callable(hook := getattr(t, method, None))]


class _CaptureForAnyTrace(SharedBuffersCapture):
    """``CUDAGraphTransform`` that finds a backward trace's saved tensors by name, not by position (none: nothing
    to mark as static memory), and takes a forward whose backward was never compiled; the capture is that of the
    transform adapted: sharing buffers (:class:`SharedBuffersCapture`) where it does, Thunder's grouping else."""

    def transform_trace_post_optimization(self, trace: TraceCtx, **kwargs: Any) -> TraceCtx:
        if trace.siginfo().name != "backward_fn":
            if TraceTag.AUGMENTED_FORWARD in trace.tags:
                self.outputs_from_forward = None  # left by a forward whose backward was not compiled
            return super().transform_trace_post_optimization(trace, **kwargs)
        static = self.outputs_from_forward or []
        saved = _saved_tensors(trace)
        if len(saved) != len(static):
            raise AssertionError(f"the backward trace gets {len(saved)} saved values, its forward saved {len(static)}")
        for is_static, proxy in zip(static, saved, strict=True):
            if is_static:
                proxy.tags.add(ProxyTag.STATIC_MEMORY_LOCATION)
        self.outputs_from_forward = None
        return self.generate_fused_trace(trace, **kwargs)


_ADAPTED: weakref.WeakKeyDictionary[Any, CUDAGraphTransform] = weakref.WeakKeyDictionary()


def capture_for_any_trace(
    transform: Any, writes: Callable[[BoundSymbol], bool] | None = None
) -> CUDAGraphTransform | None:
    """The same capture as ``transform`` (its graphs and memory pool: one runner) for the traces above, one per
    ``transform``: sharing buffers as ``transform`` does (Thunder's own: sharing them, as Thunder's grouping
    fails on some of those traces), with its rule for writes (Thunder's own: ``writes``, where given). None where
    ``transform`` is not exactly Thunder's class or a class that says it may be adapted (``_adaptable`` in its own
    namespace, so not a subclass of it, which may capture otherwise)."""
    kind = type(transform)
    if kind is not CUDAGraphTransform and not vars(kind).get("_adaptable", False):
        return None
    adapted = _ADAPTED.get(transform)
    if adapted is None:
        adapted = _CaptureForAnyTrace()
        adapted.cuda_graph_runner = transform.cuda_graph_runner
        if isinstance(transform, SharedBuffersCapture):
            adapted.share_buffers, adapted._writes = transform.share_buffers, transform._writes
            adapted._outside = transform._outside
        elif writes is not None:
            adapted._writes = writes
        adapted._captured_by = kind.__name__
        _ADAPTED[transform] = adapted
    return adapted


def _saved_tensors(trace: TraceCtx) -> tuple[Any, ...]:
    """The values a backward trace unpacks from the tensors its forward saved (``C0`` of ``saved_for_backward``),
    () where it gets none."""
    collections = None
    for bsym in trace.bound_symbols:
        first = bsym.args[0] if bsym.args else None
        if bsym.sym.name != "unpack_sequence":
            continue
        if collections is None and getattr(first, "name", None) == "saved_for_backward":
            collections = bsym.output
        elif collections and first is collections[0]:
            return tuple(bsym.output)
    return ()
