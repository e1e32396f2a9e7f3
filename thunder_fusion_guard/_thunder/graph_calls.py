"""Calling a graph of Thunder's ``CUDAGraphRunner`` the way the guard's capture does: its inputs copied in one
batch per dtype (:class:`GraphCall`), the inputs it writes copied back (:func:`copying_back`), its warm-up on a
stream of the guard's own (:func:`own_blas_workspace`), and its gradients handed to autograd on its own buffers
(:func:`handing_over`); which inputs a region may write (:func:`written_inputs`). :mod:`.cudagraphs` says why each
is needed; this module holds the calls themselves."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from thunder.core import prims
from thunder.core.proxies import Proxy
from thunder.core.symbol import BoundSymbol

from ..phases import CAPTURE, timing

__all__ = [
    "UNCAPTURED_WHILE_HELD",
    "GraphCall",
    "Program",
    "capturing_cuda_graph",
    "copying_back",
    "handing_over",
    "holds_a_write",
    "own_blas_workspace",
    "proxy_names",
    "written_inputs",
]


# Words in the names of ops whose output may share memory with an input (a write to it writes the input).
_ALIASING_WORDS = (
    "alias", "view", "reshape", "slice", "getitem", "narrow", "select", "squeeze", "transpose", "permute",
    "expand", "broadcast", "flatten", "split", "chunk", "unbind", "movedim", "swapaxes", "diagonal", "strided",
    "unfold", "real", "imag", "contiguous", "copy", "detach", "t",
)  # fmt: skip


def _may_alias(bsym: BoundSymbol) -> bool:
    name = bsym.sym.name.lower()
    return name == "t" or any(w in name for w in _ALIASING_WORDS if w != "t")


def proxy_names(values: Any) -> set[str]:
    """The names of the proxies among ``values``."""
    return {v.name for v in values if isinstance(v, Proxy)}


def _write_targets(bsym: BoundSymbol) -> set[str] | None:
    """The tensors ``bsym`` (or an op inside it) writes: ``copy_``'s destination, an in-place op's first
    argument; None where it holds neither (an op ``writes`` flags for another reason: all its tensors count)."""
    found: set[str] | None = None
    for op in (bsym, *_deep(bsym)):
        name = op.sym.name
        if name.endswith("copy_") and len(op.args) > 1:
            found = (found or set()) | proxy_names(op.args[1:2])
        elif name.endswith("_") and not name.startswith("_") and op.args:
            found = (found or set()) | proxy_names(op.args[:1])
    return found


def written_inputs(
    bsyms: list[BoundSymbol], inputs: list[Any], writes: Callable[[BoundSymbol], bool] | None = None
) -> list[int]:
    """Positions of the ``inputs`` of a region made of ``bsyms`` that the region may write: the destination of an
    op that ``writes`` says may write what it is given (all its tensors where it names none; by default an op
    that holds an in-place op or a ``copy_``), or a tensor an op hands on as a view or alias (at any depth) to
    one; the region's return writes nothing. A graph that writes an input it copied into its own buffer leaves the
    caller's tensor unwritten unless the buffer is copied back."""
    writes = writes or holds_a_write
    written: set[str] = set()
    for b in bsyms:
        if b.sym.id is prims.PrimIDs.RETURN:  # hands its values out, writes none (Thunder's runner appends one)
            continue
        if writes(b):
            targets = _write_targets(b)
            written |= proxy_names(b.flat_args) if targets is None else targets
    if not written:
        return []
    aliasing = [op for b in bsyms for op in (b, *_deep(b)) if _may_alias(op)]
    grew = True
    while grew:  # to a fixed point: a view of a view of an input
        before = len(written)
        for op in aliasing:
            if proxy_names(op.flat_outs) & written:
                written |= proxy_names(op.flat_args)
        grew = len(written) > before
    return [i for i, p in enumerate(inputs) if isinstance(p, Proxy) and p.name in written]


def holds_a_write(bsym: BoundSymbol) -> bool:
    """Whether ``bsym`` holds an in-place op or a ``copy_`` (at any depth): it may write a tensor it reads."""
    return _write_targets(bsym) is not None


def _deep(bsym: BoundSymbol) -> list[BoundSymbol]:
    return [d for s in bsym.subsymbols for d in (s, *_deep(s))]


def _layout(args: tuple[Any, ...]) -> tuple[Any, ...]:
    """What Thunder's runner keys a graph's captures by (its ``to_arg_descriptor``): each tensor's dtype, sizes
    and strides, each other argument's type and value; hashable, and cheaper to make."""
    return tuple([(a.dtype, a.shape, a.stride()) if isinstance(a, torch.Tensor) else (type(a), a) for a in args])


class Program:
    """The graphs of one compiled forward and of its backward. A forward graph called again before any graph of the
    backward ran (one compiled function for several blocks, as ThunderFX with FSDP2 runs each block; a model
    called twice before its backward) would replay over the outputs of its earlier call, which autograd still
    holds for the backward; so would a backward graph called twice in one backward pass (the same, where the forward
    captured nothing to tell it: a forward of one op), over the gradients its first call returned. From then on every
    graph of both runs uncaptured (fresh outputs, the same kernels), and the graph that found it tells
    (``GraphCall.on_reentered``), once. Watching starts once a backward graph exists (``active``)."""

    def __init__(self) -> None:
        self.active = False
        self.backward_runs = 0  # calls of the backward's graphs so far
        self.reentered = False

    def entered(self, call: GraphCall) -> None:
        """Count ``call``'s call (a backward graph's: checked against the backward pass it ran in last) or check it
        (a forward graph's) before it runs."""
        if not self.active:
            return
        if not call.forward:
            self.backward_runs += 1
            task = _backward_pass()
            if task is not None and call.backward_pass == task:
                self._reentered(call, in_backward=True)
            call.backward_pass = task
        elif call.seen_at == self.backward_runs:
            self._reentered(call, in_backward=False)

    def _reentered(self, call: GraphCall, *, in_backward: bool) -> None:
        if self.reentered:
            return
        self.reentered = True
        if call.on_reentered is not None:
            call.on_reentered(call.name, in_backward)

    def returned(self, call: GraphCall) -> None:
        """A forward graph's call returned its outputs: autograd holds them until a backward graph runs."""
        if call.forward:
            call.seen_at = self.backward_runs


_graph_task_id: Callable[[], int] | None = getattr(torch._C, "_current_graph_task_id", None)


def _backward_pass() -> int | None:
    """The backward pass (autograd's graph task) running now, by its id; None outside one (or where torch does not
    say)."""
    if _graph_task_id is None:
        return None
    task = _graph_task_id()
    return task if task >= 0 else None


class GraphCall:
    """Graph ``name`` of Thunder's ``runner`` called as the runner calls it (captured by the runner on a miss, then
    its inputs copied into the graph's own buffers and the graph replayed), with two costs of the runner's call cut:
    the inputs are copied in one batched copy per dtype (``torch._foreach_copy_``: one C++ call and a few kernels)
    instead of one ``copy_`` each, and a capture is found by the same layout as the runner's key without making
    that key. The same bits in the same buffers before the same replay: a buffer of the runner's is never an
    argument of its own graph, so no copy reads what another writes. A capture (or its warm-up) that runs out of
    device memory leaves the graph uncaptured: its ops run on the arguments from then on (the same kernels, fresh
    outputs), and ``on_uncaptured(name, error)`` is told once, before; where it raises, the error reaches the caller
    and nothing falls back.

    A graph reads a static input (a parameter, an earlier graph's output) at the address it had when captured. Where
    such an input lies elsewhere at a later call (FSDP2 allocates its unsharded parameters anew each step; a
    recaptured earlier graph has new outputs), a replay would read freed memory: the graph is captured anew with
    those inputs copied into its own buffers at each replay, and ``on_moved(name, inputs, uncaptured)`` is told
    (their names, ``input_names``); one the graph writes in place leaves it uncaptured instead, as above."""

    def __init__(self, runner: Any, name: str) -> None:
        self.runner, self.name = runner, name
        self.static_inputs: tuple[Any, ...] = ()  # the graph's buffers at the last call
        self.captures: dict[tuple[Any, ...], tuple[Any, ...]] = {}  # layout -> the runner's cache entry
        self.uncaptured: Callable | None = None  # the graph's ops, run as they are, once a capture ran out of memory
        self.on_uncaptured: Callable[[str, BaseException], Any] | None = None
        self.pinned: dict[tuple[Any, ...], tuple[tuple[int, int], ...]] = {}  # layout -> (position, address) of
        # each input the capture reads where it lay (not copied into a buffer of its own)
        self.input_names: list[str | None] = []  # the graph's inputs by name, for on_moved
        self.written: frozenset[int] = frozenset()  # positions of the inputs the graph may write
        self.on_moved: Callable[[str, list[str], bool], Any] | None = None
        self.program: Program | None = None  # the forward and backward this graph belongs to (a training program)
        self.forward = True  # a graph of the forward (else of the backward)
        self.seen_at: int | None = None  # the program's backward calls when this forward graph was last called
        self.backward_pass: int | None = None  # the backward pass this backward graph was last called in
        self._entered = False  # inside a call already told to the program (a wrapper of the call entered first)
        self.on_reentered: Callable[[str, bool], Any] | None = None  # told (name, in a backward pass) where this
        # graph found its program run again before its earlier call's outputs were let go (:class:`Program`)
        self.__name__ = self.__qualname__ = f"{name}_fn"

    def __call__(self, *args: Any) -> Any:
        with self.entering():
            out = self._call(*args)
        if self.program is not None:
            self.program.returned(self)
        return out

    def _call(self, *args: Any) -> Any:
        layout = _layout(args)
        entry = self.captures.get(layout)
        if entry is None:  # Thunder's runner captures it (and copies and replays as it does)
            if self.uncaptured is not None:
                self.static_inputs = args  # the ops wrote the arguments themselves: nothing to copy back
                return self.uncaptured(*args)
            runner = self.runner
            try:
                out = timing(CAPTURE, runner.call_cuda_graph)(self.name, *args)
            except torch.OutOfMemoryError as error:
                return self._without_graph(error, args)
            entry = self.captures[layout] = runner.cuda_graph_cache[runner.make_cache_key(self.name, *args)]
            read_in_place = zip(args, entry[1], strict=True)
            self.pinned[layout] = tuple(
                (i, a.data_ptr()) for i, (a, b) in enumerate(read_in_place) if a is b and isinstance(a, torch.Tensor)
            )
            self.static_inputs = entry[1]
            return out
        pinned = self.pinned[layout]
        if pinned and any(args[i].data_ptr() != address for i, address in pinned):
            return self._moved([i for i, address in pinned if args[i].data_ptr() != address], args)
        graph, static_inputs, static_outputs = entry
        batches: dict[Any, tuple[list[torch.Tensor], list[torch.Tensor]]] = {}
        for buffer, arg in zip(static_inputs, args, strict=True):
            # An input read where it lies is at its captured address (checked above): nothing to copy.
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

    @contextmanager
    def entering(self) -> Iterator[None]:
        """One call of this graph: its program told once (:meth:`enter`), however many wrappers of the call enter."""
        outermost = not self._entered
        if outermost:
            self._entered = True
            self.enter()
        try:
            yield
        finally:
            if outermost:
                self._entered = False

    def enter(self) -> None:
        """Tell the program of this call (:class:`Program`); where it was entered again before its earlier call's
        outputs were let go, drop this graph's captures (their outputs stay with their holders) and run its ops
        uncaptured from now on."""
        program = self.program
        if program is None:
            return
        program.entered(self)
        if program.reentered and self.uncaptured is None:
            self.forget()
            self.uncaptured = self.ops()

    def _without_graph(self, error: BaseException, args: tuple[Any, ...]) -> Any:
        """Out of memory while capturing: drop what the capture holds, run the graph's ops uncaptured from now on
        (this call too) and say so once. Another error, or one of the ops themselves, reaches the caller."""
        self.forget()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        if self.on_uncaptured is not None:  # may raise (strict mode): then nothing falls back, the next call captures
            self.on_uncaptured(self.name, error)
        self.uncaptured = self.ops()
        self.static_inputs = args
        return self.uncaptured(*args)

    def _moved(self, moved: list[int], args: tuple[Any, ...]) -> Any:
        """Inputs at ``moved`` that the capture reads in place lie elsewhere now: capture anew with them copied into
        the graph's own buffers (the runner's static mask without them), or, where the graph writes one of them,
        run uncaptured (a write to its buffer would not reach the caller's tensor)."""
        names = [str(self.input_names[i]) if i < len(self.input_names) else f"input {i}" for i in moved]
        uncaptured = bool(self.written.intersection(moved))
        if self.on_moved is not None:
            self.on_moved(self.name, names, uncaptured)
        self.forget()
        if uncaptured:
            self.uncaptured = self.ops()
            self.static_inputs = args
            return self.uncaptured(*args)
        fn, _ = self.runner.python_callables[self.name]
        was = self.runner.make_static_inputs_mask(self.name, *args)
        self.runner.python_callables[self.name] = (fn, tuple(m and i not in moved for i, m in enumerate(was)))
        return self._call(*args)

    def ops(self) -> Callable:
        """The graph's ops as they run uncaptured: on the caller's stream, on the call's arguments."""
        fn, _ = self.runner.python_callables[self.name]
        return getattr(fn, "uncaptured", fn)

    def forget(self) -> None:
        """Drop every capture of this graph (the runner's and the layouts found here): the next call captures anew."""
        for key in [key for key in self.runner.cuda_graph_cache if key[0] == self.name]:
            del self.runner.cuda_graph_cache[key]
        self.captures.clear()
        self.pinned.clear()

    def last_static_inputs(self, args: tuple[Any, ...]) -> tuple[Any, ...]:
        """The graph's buffers its last call copied ``args`` into."""
        return self.static_inputs


def copying_back(
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


def capturing_cuda_graph() -> bool:
    """Whether the current CUDA stream is capturing a graph now (False without CUDA): work done now only fills
    tensors when the graph replays, so nothing computed now may be kept for later calls."""
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
        return fn(*args) if capturing_cuda_graph() else _on_warm_up_stream(fn, args)

    region.__name__ = region.__qualname__ = getattr(fn, "__name__", name)
    region.uncaptured = fn  # type: ignore[attr-defined]  # the ops on the caller's stream, for a call not captured
    runner.python_callables[name] = (region, mask)
    return True


_storage_use_count: Callable[[int], int] | None = getattr(torch._C, "_storage_Use_Count", None)


# Calls a graph whose handed-over gradients are still held runs its ops uncaptured (a .grad kept a few steps and
# accumulated into); past this many in a row (one kept for good), the graph is captured anew instead.
UNCAPTURED_WHILE_HELD = 8


def handing_over(
    graph: GraphCall, call: Callable, positions: dict[int, str], on_held: Callable[[str, list[str]], Any]
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
        self, graph: GraphCall, call: Callable, positions: dict[int, str], on_held: Callable[..., Any]
    ) -> None:
        self.graph, self.call, self.positions, self.on_held = graph, call, positions, on_held
        self.runner, self.name = graph.runner, graph.name
        self.handing = True
        self.seen: dict[int, set[int]] = {}  # id(static outputs) -> the positions handed over from them
        self.watched: list[tuple[int, Any, int]] = []  # (position, storage, references the runner alone holds)
        self.uncaptured = 0  # calls in a row run uncaptured
        self.__name__ = self.__qualname__ = getattr(call, "__name__", self.name)

    def __call__(self, *args: Any) -> Any:
        with self.graph.entering():
            return self._call(*args)

    def _call(self, *args: Any) -> Any:
        if self.graph.uncaptured is not None:  # no capture, no buffers of its own: its outputs are fresh tensors
            return self.call(*args)
        if self.watched:
            held = self._held(args)
            if held:
                return self._while_held(held, args)
            if not self.handing:
                self.watched = []  # every buffer held when handing stopped is free again
        out = self.call(*args)
        if not self.handing or self.graph.uncaptured is not None:
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
            return self.graph.ops()(*args)
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
