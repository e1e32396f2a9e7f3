"""Thunder's ``CUDAGraphTransform``: telling it apart, clearing what a failed compilation left in it, and the same
capture for the traces its own checks refuse.

Thunder 0.2.6's transform hands what a forward trace saves from its forward compilation to its backward one
through its own state and checks the backward trace by fixed positions: a backward trace that gets no saved
tensors (a ThunderFX subgraph whose gradient needs none of its values) fails an ``assert`` there, and a forward
compiled without a backward after it (or a compilation that failed between the two) makes the next forward
fail another. Neither says anything about the capture itself.
"""

from __future__ import annotations

import traceback
import weakref
from typing import Any

from thunder.core.proxies import ProxyTag
from thunder.core.trace import TraceCtx, TraceTag
from thunder.transforms.cudagraph import CUDAGraphTransform

__all__ = ["capture_for_any_trace", "forget_forward", "is_cudagraph_transform", "refused_by_its_checks"]


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


class _CaptureForAnyTrace(CUDAGraphTransform):
    """``CUDAGraphTransform`` that finds a backward trace's saved tensors by name, not by position (none: nothing
    to mark as static memory), and takes a forward whose backward was never compiled; the capture is its own."""

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
    ``transform``; None where ``transform`` is not exactly Thunder's class (a subclass may capture otherwise)."""
    if type(transform) is not CUDAGraphTransform:
        return None
    adapted = _ADAPTED.get(transform)
    if adapted is None:
        adapted = _CaptureForAnyTrace()
        adapted.cuda_graph_runner = transform.cuda_graph_runner
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
