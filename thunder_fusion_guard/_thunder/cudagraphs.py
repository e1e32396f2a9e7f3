"""Thunder's ``CUDAGraphTransform``: telling it apart, clearing what a failed compilation left in it, the same
capture for the traces its own checks refuse, and the same capture without the copies it need not make.

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
GB a step. :func:`share_capture_buffers` makes a transform group consecutive ops, as it does under
``thunder.jit``, capture no group without work, and let a graph read an earlier graph's output where it lies.

And it hands a backward graph's gradients to autograd as the tensors it keeps for the next replay, so autograd,
which takes over a gradient nobody else holds, copies each one into a ``.grad`` of its own (0.97 ms of the 4.41 ms
of GPU work of a litgpt step on an H100). :func:`share_capture_buffers` hands each on its own tensor over the
graph's buffer, and stops where one is still held when the graph would replay (an accumulated ``.grad``).

Thunder's runner warms a graph up on its capture stream before capturing it, so the cuBLAS workspace the
captured matmuls use was allocated outside the graph's memory pool, and the graph keeps its address. Whoever
clears cuBLAS's workspaces then (torch.compile's CUDA graphs do, before and after each capture) frees memory the
graph still writes at every replay: the next tensor allocated there is overwritten (an illegal memory access, or
wrong values, with Inductor's CUDA graphs in the same process). Each graph made here is warmed up on a stream of
the guard's own, so the capture's first matmul allocates the workspace in the graph's own pool, where no other
tensor is ever placed (:func:`own_blas_workspace`).
"""

from __future__ import annotations

import time
import traceback
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from thunder.core import prims, utils
from thunder.core.compile_data import get_compile_data
from thunder.core.proxies import Proxy, ProxyTag, unvariableify
from thunder.core.symbol import BoundSymbol, Symbol
from thunder.core.trace import TraceCtx, TraceProvenance, TraceTag, from_trace, reset_tracectx, set_tracectx
from thunder.executors.data_dependent_partition import Node, consecutive_fusion, fuse_bound_symbols
from thunder.executors.utils import Region
from thunder.transforms.cudagraph import CUDAGraphTransform

from ..phases import CAPTURE, timing

__all__ = [
    "UNCAPTURED_WHILE_HELD",
    "CaptureSummary",
    "capture_for_any_trace",
    "forget_forward",
    "is_cudagraph_transform",
    "own_blas_workspace",
    "refused_by_its_checks",
    "share_capture_buffers",
    "transform_name",
    "written_inputs",
]


def is_cudagraph_transform(transform: Any) -> bool:
    """True for Thunder's ``CUDAGraphTransform``, which only captures and replays: dropping it changes no value."""
    return isinstance(transform, CUDAGraphTransform)


def forget_forward(transform: Any) -> None:
    """Clear what a ``CUDAGraphTransform`` kept of a forward trace for its backward, after a compilation that
    failed between the two (its next forward would otherwise assert)."""
    if is_cudagraph_transform(transform):
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
    """What a transform made of :func:`share_capture_buffers` captured in one trace, against what Thunder's own
    grouping would have captured there (one per trace: compared, and hashed, by identity)."""

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


def _bytes(proxy: Any) -> int:
    """What a tensor proxy holds, in bytes (0 for anything else)."""
    try:
        return int(proxy.numel) * int(proxy.dtype.bytes)
    except (AttributeError, TypeError):
        return 0


def _only_deletions(bsyms: list[BoundSymbol]) -> bool:
    return all(b.sym.id is prims.PrimIDs.DEL for b in bsyms)


# Words in the names of ops whose output may share memory with an input (a write to it writes the input).
_ALIASING_WORDS = (
    "alias", "view", "reshape", "slice", "getitem", "narrow", "select", "squeeze", "transpose", "permute",
    "expand", "broadcast", "flatten", "split", "chunk", "unbind", "movedim", "swapaxes", "diagonal", "strided",
    "unfold", "real", "imag", "contiguous", "copy", "detach", "t",
)  # fmt: skip


def _may_alias(bsym: BoundSymbol) -> bool:
    name = bsym.sym.name.lower()
    return name == "t" or any(w in name for w in _ALIASING_WORDS if w != "t")


def _names(values: Any) -> set[str]:
    return {v.name for v in values if isinstance(v, Proxy)}


def _write_targets(bsym: BoundSymbol) -> set[str] | None:
    """The tensors ``bsym`` (or an op inside it) writes: ``copy_``'s destination, an in-place op's first
    argument; None where it holds neither (an op ``writes`` flags for another reason: all its tensors count)."""
    found: set[str] | None = None
    for op in (bsym, *_deep(bsym)):
        name = op.sym.name
        if name.endswith("copy_") and len(op.args) > 1:
            found = (found or set()) | _names(op.args[1:2])
        elif name.endswith("_") and not name.startswith("_") and op.args:
            found = (found or set()) | _names(op.args[:1])
    return found


def written_inputs(
    bsyms: list[BoundSymbol], inputs: list[Any], writes: Callable[[BoundSymbol], bool] | None = None
) -> list[int]:
    """Positions of the ``inputs`` of a region made of ``bsyms`` that the region may write: the destination of an
    op that ``writes`` says may write what it is given (all its tensors where it names none; by default an op
    that holds an in-place op or a ``copy_``), or a tensor an op hands on as a view or alias (at any depth) to
    one. A graph that writes an input it copied into its own buffer leaves the caller's tensor unwritten unless
    the buffer is copied back."""
    writes = writes or _holds_a_write
    written: set[str] = set()
    for b in bsyms:
        if writes(b):
            targets = _write_targets(b)
            written |= _names(b.flat_args) if targets is None else targets
    if not written:
        return []
    aliasing = [op for b in bsyms for op in (b, *_deep(b)) if _may_alias(op)]
    grew = True
    while grew:  # to a fixed point: a view of a view of an input
        before = len(written)
        for op in aliasing:
            if _names(op.flat_outs) & written:
                written |= _names(op.flat_args)
        grew = len(written) > before
    return [i for i, p in enumerate(inputs) if isinstance(p, Proxy) and p.name in written]


def _holds_a_write(bsym: BoundSymbol) -> bool:
    return _write_targets(bsym) is not None


def _deep(bsym: BoundSymbol) -> list[BoundSymbol]:
    return [d for s in bsym.subsymbols for d in (s, *_deep(s))]


class _SharedBuffers(CUDAGraphTransform):
    """``CUDAGraphTransform`` that captures each run of consecutive capturable ops as one graph whatever
    ``fusion_type`` says, captures no run of deletions alone, and lets a graph read an output of an earlier graph
    of the same trace in that graph's own buffer (the same tensor at every replay) instead of copying it in.
    An input a graph writes (an in-place op or ``copy_`` reading it, by ``_writes``) is copied as before."""

    # Whether an op may write a tensor it reads (the guard passes its own rule): by default, one that holds an
    # in-place op or a copy_.
    _writes: Callable[[BoundSymbol], bool] = staticmethod(_holds_a_write)
    _share = True  # False: Thunder's own grouping and copies (an adapted capture of a transform left as it was)

    def _can_fuse_nodes(self, a: Node, b: Node) -> bool:
        """Thunder's grouping predicate for capture: a node of several ops, or one op this transform captures."""
        return all(len(n.group_bsyms) > 1 or self.can_fuse(n.group_bsyms[0]) for n in (a, b))

    def generate_fused_trace(self, trace: TraceCtx, **kwargs: Any) -> TraceCtx:
        if not self._share:
            return super().generate_fused_trace(trace, **kwargs)
        began = time.perf_counter_ns()
        gradients = _gradients(trace)
        with _building_from(trace) as fused_trace:
            groups = consecutive_fusion(trace, self._can_fuse_nodes)
            producers, consumers = utils.producers_and_consumers(trace)
            summary = CaptureSummary(trace.siginfo().name == "backward_fn", [], 0, 0, 0, 0)
            captured: dict[str, str] = {}  # output name -> the graph that writes it
            fused = []
            for bsyms in groups:
                if len(bsyms) == 1 or not self.can_fuse(bsyms[0]) or _only_deletions(bsyms):
                    fused.extend(bsyms)
                    continue
                region = Region(producers, consumers, bsyms)
                fusion = self._fuse_sharing(region, captured, summary, consumers, gradients)
                summary.captures.append(fusion.sym.name)
                summary.ops += sum(b.sym.id is not prims.PrimIDs.DEL for b in bsyms)
                captured.update((o.name, fusion.sym.name) for o in fusion.flat_proxy_outs)
                fused.append(fusion)
            fused_trace.bound_symbols = fused
            fused_trace.set_provenance(
                TraceProvenance(
                    f"CUDAGraph fusion, buffers shared (took {(time.perf_counter_ns() - began) // 10**6} ms)"
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
        graph_call = _GraphCall(runner, name)
        summary.copied_in += [
            (i.name, name, _bytes(i)) for i, m in zip(inputs, mask, strict=True) if not m and _bytes(i)
        ]
        back = [i for i in written_inputs(region.bound_symbols, inputs, self._writes) if not mask[i]]
        summary.copied_back += [(inputs[i].name, name, _bytes(inputs[i])) for i in back]
        call = _copying_back(graph_call, back, graph_call.last_static_inputs)
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
            hooks = _hooks("cuda_graph_gradients_held")

            def on_held(graph: str, held: list[str]) -> None:
                for hook in hooks:
                    hook(summary, graph, held)

            call = _handing_over(graph_call, call, handed, on_held)
        # The meta gives the region's outputs, so that Thunder's trace checks (DebugOptions) can run over it.
        symbol = Symbol(name, meta=lambda *args, **kwargs: outputs, is_fusion=True, executor=self)
        return BoundSymbol(symbol, inputs, {}, outputs, region.bound_symbols, _call_ctx={name: call})

    def fuse(self, region: Region, fusion_counter: int) -> BoundSymbol:
        """Thunder's ``fuse`` (its own grouping and copies, where this transform does not share buffers), with
        the inputs the graph may write copied back after each replay."""
        fused = super().fuse(region, fusion_counter)
        name = fused.sym.name
        own_blas_workspace(self.cuda_graph_runner, name)
        inputs = [unvariableify(i) for i in region.inputs]
        static = self.cuda_graph_runner.python_callables[name][1]
        back = [i for i in written_inputs(region.bound_symbols, inputs, self._writes) if not (static and static[i])]
        if back:
            runner = self.cuda_graph_runner

            def static_inputs(args: tuple[Any, ...]) -> tuple[Any, ...]:
                return runner.cuda_graph_cache[runner.make_cache_key(name, *args)][1]

            fused._call_ctx[name] = _copying_back(fused._call_ctx[name], back, static_inputs)
        return fused

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


def _layout(args: tuple[Any, ...]) -> tuple[Any, ...]:
    """What Thunder's runner keys a graph's captures by (its ``to_arg_descriptor``): each tensor's dtype, sizes
    and strides, each other argument's type and value; hashable, and cheaper to make."""
    return tuple([(a.dtype, a.shape, a.stride()) if isinstance(a, torch.Tensor) else (type(a), a) for a in args])


class _GraphCall:
    """Graph ``name`` of Thunder's ``runner`` called as the runner calls it (captured by the runner on a miss, then
    its inputs copied into the graph's own buffers and the graph replayed), with two costs of the runner's call cut:
    the inputs are copied in one batched copy per dtype (``torch._foreach_copy_``: one C++ call and a few kernels)
    instead of one ``copy_`` each, and a capture is found by the same layout as the runner's key without making
    that key. The same bits in the same buffers before the same replay: a buffer of the runner's is never an
    argument of its own graph, so no copy reads what another writes."""

    def __init__(self, runner: Any, name: str) -> None:
        self.runner, self.name = runner, name
        self.static_inputs: tuple[Any, ...] = ()  # the graph's buffers at the last call
        self.captures: dict[tuple[Any, ...], tuple[Any, ...]] = {}  # layout -> the runner's cache entry
        self.__name__ = self.__qualname__ = f"{name}_fn"

    def __call__(self, *args: Any) -> Any:
        layout = _layout(args)
        entry = self.captures.get(layout)
        if entry is None:  # Thunder's runner captures it (and copies and replays as it does)
            runner = self.runner
            out = timing(CAPTURE, runner.call_cuda_graph)(self.name, *args)
            entry = self.captures[layout] = runner.cuda_graph_cache[runner.make_cache_key(self.name, *args)]
            self.static_inputs = entry[1]
            return out
        graph, static_inputs, static_outputs = entry
        batches: dict[Any, tuple[list[torch.Tensor], list[torch.Tensor]]] = {}
        for buffer, arg in zip(static_inputs, args, strict=True):
            if buffer is not arg and isinstance(buffer, torch.Tensor) and isinstance(arg, torch.Tensor):
                # One batch per dtype and device: torch's fused multi-tensor copy takes lists of one of each.
                buffers, given = batches.setdefault((arg.dtype, arg.device), ([], []))
                buffers.append(buffer)
                given.append(arg)
        for buffers, given in batches.values():
            torch._foreach_copy_(buffers, given)
        graph.replay()
        self.static_inputs = static_inputs
        return static_outputs

    def forget(self) -> None:
        """Drop every capture of this graph (the runner's and the layouts found here): the next call captures anew."""
        for key in [key for key in self.runner.cuda_graph_cache if key[0] == self.name]:
            del self.runner.cuda_graph_cache[key]
        self.captures.clear()

    def last_static_inputs(self, args: tuple[Any, ...]) -> tuple[Any, ...]:
        """The graph's buffers its last call copied ``args`` into."""
        return self.static_inputs


def _copying_back(
    call: Callable, positions: list[int], static_inputs: Callable[[tuple[Any, ...]], tuple[Any, ...]]
) -> Callable:
    """``call`` (a graph's), then each argument at ``positions`` overwritten with what the replay left in the
    graph's own copy of it (``static_inputs(args)``). Thunder's runner copies a graph's inputs into buffers of its
    own and replays on those, so an op of the graph that writes an input (``x += y`` on a tensor made before the
    graph) writes the buffer only: without this the caller's tensor keeps its old values."""
    if not positions:
        return call

    def replay(*args: Any) -> Any:
        out = call(*args)
        buffers = static_inputs(args)
        for i in positions:
            if buffers[i] is not args[i] and not _overlapping(args[i]):
                # Through .data: the write autograd saw when the graph was traced (Thunder's fusions write
                # their inputs' memory the same way), not a second in-place op on a view autograd tracks.
                args[i].data.copy_(buffers[i])
        return out

    replay.__name__ = replay.__qualname__ = getattr(call, "__name__", "replay")
    return replay


def _capturing() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def _cuda() -> bool:
    return torch.cuda.is_available()


_WARM_UP_STREAMS: dict[Any, Any] = {}  # device -> the stream the guard's graphs are warmed up on


def _on_warm_up_stream(fn: Callable, args: tuple[Any, ...]) -> Any:
    """``fn(*args)`` on a high-priority stream of the guard's own (never a stream Thunder's runner captures on: those
    come from the default-priority pool), ordered after and before the caller's stream."""
    current = torch.cuda.current_stream()
    side = _WARM_UP_STREAMS.get(current.device)
    if side is None:
        side = _WARM_UP_STREAMS[current.device] = torch.cuda.Stream(device=current.device, priority=-1)
    side.wait_stream(current)
    with torch.cuda.stream(side):
        out = fn(*args)
    current.wait_stream(side)
    return out


def own_blas_workspace(runner: Any, name: str) -> bool:
    """Make graph ``name`` of ``runner`` run its warm-up (the calls before its capture) on a stream of the guard's
    own instead of the stream it is then captured on. cuBLAS keeps a workspace per stream, allocated at the first
    matmul there: warmed up on the capture stream, the graph keeps a workspace allocated outside its memory pool
    and writes it at every replay, and whoever clears cuBLAS's workspaces (torch.compile's CUDA graphs do, at each
    capture) frees memory the graph still writes. Warmed up elsewhere, the capture's first matmul allocates the
    workspace in the graph's own pool; nothing of anyone else's is freed. True where done; False without CUDA or
    where the runner shares one pool among its graphs (a workspace there could be another graph's too)."""
    if getattr(runner, "mem_pool", None) is not None or not _cuda():
        return False
    fn, mask = runner.python_callables[name]

    def region(*args: Any) -> Any:
        return fn(*args) if _capturing() else _on_warm_up_stream(fn, args)

    region.__name__ = region.__qualname__ = getattr(fn, "__name__", name)
    region.uncaptured = fn  # type: ignore[attr-defined]  # the ops on the caller's stream, for a call not captured
    runner.python_callables[name] = (region, mask)
    return True


_LAST_USES = (prims.PrimIDs.RETURN, prims.PrimIDs.DEL)


def _gradients(trace: TraceCtx) -> frozenset[str]:
    """The names a backward trace returns (the gradients autograd gets); none for any other trace."""
    if trace.siginfo().name != "backward_fn" or not trace.bound_symbols:
        return frozenset()
    last = trace.bound_symbols[-1]
    return frozenset(_names(last.flat_args)) if last.sym.id is prims.PrimIDs.RETURN else frozenset()


_storage_use_count: Callable[[int], int] | None = getattr(torch._C, "_storage_Use_Count", None)


# Calls a graph whose handed-over gradients are still held runs its ops uncaptured (a .grad kept a few steps and
# accumulated into); past this many in a row (one kept for good), the graph is captured anew instead.
UNCAPTURED_WHILE_HELD = 8


def _handing_over(
    graph: _GraphCall, call: Callable, positions: dict[int, str], on_held: Callable[[str, list[str]], Any]
) -> Callable:
    """``call`` (of ``graph``), its outputs at ``positions`` (gradients the backward returns, by name) handed out as
    new tensors on the graph's own buffers (:class:`_Handover`)."""
    if not positions or _storage_use_count is None:
        return call
    return _Handover(graph, call, positions, on_held)


class _Handover:
    """A graph's call that hands each gradient it returns on a tensor of its own over the graph's buffer. Autograd
    takes over a gradient no other tensor holds as the parameter's ``.grad``, and copies one the runner holds
    (its static output): this saves the copy. Before each replay, where something other than the call's own
    arguments still holds such a buffer (a ``.grad`` kept across steps and accumulated into, a view of one), the
    replay would overwrite it: the call stops handing over, ``on_held(graph, gradients)`` is told,
    and while the buffers are held the graph's ops run uncaptured on the arguments (fresh outputs, the same
    kernels), up to :data:`UNCAPTURED_WHILE_HELD` calls in a row, after which the graph is captured anew (its old
    buffers left to their holders). Then its outputs are handed as Thunder hands them. An output on the memory of
    an input (a gradient passed through) is handed as Thunder hands it."""

    def __init__(
        self, graph: _GraphCall, call: Callable, positions: dict[int, str], on_held: Callable[..., Any]
    ) -> None:
        self.graph, self.call, self.positions, self.on_held = graph, call, positions, on_held
        self.runner, self.name = graph.runner, graph.name
        self.handing = True
        self.seen: dict[int, set[int]] = {}  # id(static outputs) -> the positions handed over from them
        self.watched: list[tuple[int, Any, int]] = []  # (position, storage, references the runner alone holds)
        self.uncaptured = 0  # calls in a row run uncaptured
        self.__name__ = self.__qualname__ = getattr(call, "__name__", self.name)

    def __call__(self, *args: Any) -> Any:
        if self.watched:
            held = self._held(args)
            if held:
                return self._while_held(held, args)
            if not self.handing:
                self.watched = []  # every buffer held when handing stopped is free again
        out = self.call(*args)
        if not self.handing:
            return out
        own = self.seen.get(id(out))
        if own is None:
            buffers = _own_buffers(self.graph.static_inputs, args, out, self.positions)
            own = self.seen[id(out)] = {k for k, _, _ in buffers}
            self.watched += buffers
        return type(out)(o.detach() if k in own else o for k, o in enumerate(out))

    def _held(self, args: tuple[Any, ...]) -> list[tuple[int, Any, int]]:
        """The watched buffers something holds now, other than the call's own arguments (an input gradient the
        replay before handed over, given back to this call: it is copied in before the replay writes)."""
        over = [(k, s, base) for k, s, base in self.watched if _storage_use_count(s._cdata) > base]
        if not over:
            return over
        given: dict[int, int] = {}
        for a in args:
            if isinstance(a, torch.Tensor):
                ptr = a.untyped_storage().data_ptr()
                given[ptr] = given.get(ptr, 0) + 1
        return [(k, s, base) for k, s, base in over if _storage_use_count(s._cdata) > base + given.get(s.data_ptr(), 0)]

    def _while_held(self, held: list[tuple[int, Any, int]], args: tuple[Any, ...]) -> Any:
        if self.handing:
            self.handing = False
            self.on_held(self.name, sorted({self.positions[k] for k, _, _ in held}))
        self.watched = held
        self.uncaptured += 1
        if self.uncaptured <= UNCAPTURED_WHILE_HELD:
            fn, _ = self.runner.python_callables[self.name]
            fn = getattr(fn, "uncaptured", fn)
            return fn(*args)
        self.graph.forget()  # its buffers are their holders' now; this call captures anew
        self.watched, self.uncaptured = [], 0
        return self.call(*args)


def _own_buffers(
    static_inputs: tuple[Any, ...], args: tuple[Any, ...], outputs: Any, positions: dict[int, str]
) -> list[tuple[int, Any, int]]:
    """Of a graph's static ``outputs`` at ``positions``, right after its capture, those on memory of the graph's own
    (not an input's: ``args``, its buffers ``static_inputs``): each position, its storage, and the references the
    runner holds on that storage (more before a replay: someone else holds the buffer)."""
    theirs = {t.untyped_storage().data_ptr() for t in (*args, *static_inputs) if isinstance(t, torch.Tensor)}
    storages = [(k, outputs[k].untyped_storage()) for k in positions if isinstance(outputs[k], torch.Tensor)]
    return [(k, s, _storage_use_count(s._cdata)) for k, s in storages if s.data_ptr() not in theirs]


def _overlapping(tensor: Any) -> bool:
    """Whether elements of ``tensor`` share memory (a broadcast): no op writes such a tensor, eagerly either."""
    return any(stride == 0 and size > 1 for stride, size in zip(tensor.stride(), tensor.shape, strict=True))


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


def _hooks(method: str) -> list[Callable]:
    """The bound ``method`` of each transform of the compilation running now that has one."""
    try:
        transforms = getattr(get_compile_data(), "transforms", None) or ()
    except LookupError:
        return []
    return [hook for t in transforms if callable(hook := getattr(t, method, None))]


def transform_name(transform: Any) -> str:
    """The name a user knows ``transform`` by: ``CUDAGraphTransform`` for one made to share buffers."""
    return "CUDAGraphTransform" if isinstance(transform, _SharedBuffers) else type(transform).__name__


def share_capture_buffers(transform: Any, writes: Callable[[BoundSymbol], bool], share: bool = True) -> bool:
    """Make ``transform``, Thunder's ``CUDAGraphTransform`` itself, capture as :class:`_SharedBuffers` does (the
    same ops, kernels and values; fewer graphs and copies; with ``share=False`` Thunder's own grouping and
    copies), each graph copying back the inputs it may write. ``writes(bsym)``: whether an op may write a tensor
    it reads. True where ``transform`` captures so now; False for anything else (a subclass may capture
    otherwise)."""
    if isinstance(transform, _SharedBuffers):
        return True
    if type(transform) is not CUDAGraphTransform:
        return False
    transform.__class__ = _SharedBuffers
    transform._writes = writes
    transform._share = share
    return True


class _CaptureForAnyTrace(_SharedBuffers):
    """``CUDAGraphTransform`` that finds a backward trace's saved tensors by name, not by position (none: nothing
    to mark as static memory), and takes a forward whose backward was never compiled; the capture is its own,
    sharing buffers (:class:`_SharedBuffers`) where the transform it stands for does."""

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


def capture_for_any_trace(transform: Any) -> CUDAGraphTransform | None:
    """The same capture as ``transform`` (its graphs and memory pool: one runner) for the traces above, one per
    ``transform``; None where ``transform`` is not exactly Thunder's class, or it made to share buffers (a subclass
    may capture otherwise)."""
    if type(transform) not in (CUDAGraphTransform, _SharedBuffers):
        return None
    adapted = _ADAPTED.get(transform)
    if adapted is None:
        adapted = _CaptureForAnyTrace()
        adapted.cuda_graph_runner = transform.cuda_graph_runner
        adapted._share = isinstance(transform, _SharedBuffers) and transform._share
        adapted._writes = getattr(transform, "_writes", adapted._writes)
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
