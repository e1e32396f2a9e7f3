"""A whole training step (forward, loss, backward; an optimizer step too) captured in one CUDA graph and replayed.

A compiled step small enough to be host-bound spends most of its wall time in Python and in the autograd engine,
between the graphs ``CUDAGraphTransform`` captures: on the e3nn-built NequIP at 64 atoms, about 2.9 times its device
time. Captured whole, one replay launches every kernel of the step: nothing of Dynamo, Thunder, the autograd engine
or the user's Python runs again. This is PyTorch's "whole-network capture" (``torch.cuda.graph``), made for a
compiled step: the warm-up compiles, measures and allocates on a stream of its own, the capture runs once, and a
step that cannot be captured runs as it is, with a warning that says why. A guard compiling during the warm-up
decides its timed regions on device time, as under a ``CUDAGraphTransform``: replays spend no host time.

The contract is that of any CUDA graph: each replay reads the same input tensors (refill them in place) and writes
the same output and gradient tensors. The step decides how gradients start: one that sets them to None (or calls
``zero_grad()``) gets fresh gradients at each replay, handed back to the ``.grad`` of each tensor in ``grads_of``
(restored there if something set it to None between replays); one that accumulates keeps accumulating.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable
from typing import Any, Generic, TypeVar

import torch
from torch.utils._pytree import tree_map

from .replays import warming_up_for_capture

__all__ = ["CapturedStep", "capture_step"]

T = TypeVar("T")


class CapturedStep(Generic[T]):
    """A step captured by :func:`capture_step`: calling it replays the graph and returns the step's outputs (the
    same tensors at every call); ``captured`` says whether it replays, ``reason`` why not where it does not."""

    def __init__(self, step: Callable[[], T], grads_of: list[torch.Tensor]) -> None:
        self.step, self.grads_of = step, grads_of
        self.graph: torch.cuda.CUDAGraph | None = None
        self.outputs: Any = None
        self.grads: list[torch.Tensor | None] = []  # the .grad of each of grads_of the capture left: its buffers
        self.reason = ""

    @property
    def captured(self) -> bool:
        return self.graph is not None

    def __call__(self) -> T:
        if self.graph is None:
            return self.step()
        self.graph.replay()
        for t, grad in zip(self.grads_of, self.grads, strict=True):
            if grad is not None and t.grad is not grad:
                t.grad = grad  # set to None (zero_grad) since the last replay: the replay wrote this tensor again
        return self.outputs


def capture_step(step: Callable[[], T], *, grads_of: Iterable[torch.Tensor] = (), warmup: int = 3) -> CapturedStep[T]:
    """``step`` (no arguments; it reads its inputs from tensors it holds) run ``warmup`` times on a stream of its
    own (each a real step: compiling, the guard's measurements, the allocator's pools settle), then captured in
    one CUDA graph. ``grads_of``: the tensors whose ``.grad`` the step makes (parameters, input leaves), so that a
    gradient set to None between replays is handed back. Where the capture fails (an op that synchronizes with
    the host, a compile during the capture), the step runs uncaptured at each call and a ``RuntimeWarning`` says
    why (``CapturedStep.reason``)."""
    if not callable(step):
        raise TypeError(f"capture_step: step must be callable, got {type(step).__name__}")
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 1:
        raise ValueError(f"capture_step: warmup must be an int >= 1 (the warm-up compiles), got {warmup!r}")
    tensors = list(grads_of)
    if not all(isinstance(t, torch.Tensor) for t in tensors):
        raise TypeError("capture_step: grads_of must hold tensors (parameters, input leaves)")
    captured = CapturedStep(step, tensors)
    if not torch.cuda.is_available():
        return _uncaptured(captured, "no CUDA device: the step runs as it is")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), warming_up_for_capture():  # what compiles now decides on device time
        for _ in range(warmup):
            step()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            outputs = step()
    except Exception as error:  # a step that cannot be captured still runs, as it is
        torch.cuda.synchronize()
        first = error  # ending a failed capture raises too: the error the step met is the first of the chain
        while first.__context__ is not None:
            first = first.__context__
        reason = f"the capture failed: {type(first).__name__}: {(str(first).splitlines() or [''])[0]}"
        if "legacy stream" in str(first):
            reason += f" ({_HELD_GRAPH})"
        try:
            _end_generator_capture()
        except Exception as e:  # ending the capture is best effort: any failure of it goes into the reason, not raised
            reason += f"; random ops on CUDA may now fail (the generators' capture could not be ended: {e})"
        return _uncaptured(captured, reason)
    torch.cuda.synchronize()
    # Detached: the outputs' autograd graph, made during the capture, is not kept (its backward already ran).
    captured.graph, captured.outputs = (
        graph,
        tree_map(lambda x: x.detach() if isinstance(x, torch.Tensor) else x, outputs),
    )
    captured.grads = [t.grad for t in tensors]
    return captured


# Why a backward fails to capture where the same step runs: a gradient accumulator of a parameter or input, made by an
# earlier step on another stream, is still alive (something holds that step's loss or outputs with their graph), and
# the autograd engine accumulates on the stream it was made on.
_HELD_GRAPH = (
    "if an earlier step's loss or outputs are still held with their autograd graph, keep loss.detach() or "
    "loss.item() instead: the graph keeps its gradient accumulators, which run on the stream they were made on"
)


def _end_generator_capture() -> None:
    """Take the CUDA random generators out of capture mode after a capture that failed. PyTorch's
    ``CUDAGraph.capture_end`` raises before it ends the generators' capture, and from then on every random op on
    CUDA raises ``Offset increment outside graph capture encountered unexpectedly``; a capture that succeeds (one
    kernel, on a stream of its own, in a pool of its own, freed at once) ends it."""
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        _one_kernel()
    torch.cuda.synchronize()
    del graph


def _one_kernel() -> None:
    torch.zeros(1, device="cuda")


def _uncaptured(captured: CapturedStep[T], reason: str) -> CapturedStep[T]:
    captured.reason = reason
    warnings.warn(f"capture_step: {reason}", RuntimeWarning, stacklevel=3)
    return captured
