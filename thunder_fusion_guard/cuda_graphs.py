"""``GuardedCUDAGraphs``: this package's CUDA-graph capture, a Thunder ``CUDAGraphTransform`` passed by name in place
of Thunder's own, with fewer graphs and copies and the same ops, kernels and values (:mod:`._thunder.cudagraphs`
says what Thunder's costs and why)."""

from __future__ import annotations

from . import _thunder as th
from .ops import is_communication, writes_inputs

__all__ = ["GuardedCUDAGraphs"]


class GuardedCUDAGraphs(th.SharedBuffersCapture):
    """Thunder's ``CUDAGraphTransform`` that captures each run of consecutive ops as one graph, reads an earlier
    graph's output in place, hands gradients to autograd without a copy and copies written inputs back.

    Use as ``thunder.jit(fn, transforms=[FusionGuard(), GuardedCUDAGraphs()])``; a FusionGuard beside it records
    each capture (``capture`` decisions) and, under ThunderFX, recompiles a subgraph whose backward Thunder's checks
    refuse with the same capture adapted to it. ``share_buffers=False``: Thunder's own grouping and copies (inputs
    a graph writes still copied back). ``share_mem_pool``: Thunder's, one memory pool for all graphs.
    """

    _writes = staticmethod(writes_inputs)  # the guard's rule for an op that may write a tensor it reads
    _outside = staticmethod(is_communication)  # collectives and their waits run between graphs
    _adaptable = True  # capture_for_any_trace may adapt it (not a subclass of it)

    def __init__(self, *, share_buffers: bool = True, share_mem_pool: bool = False) -> None:
        for name, value in (("share_buffers", share_buffers), ("share_mem_pool", share_mem_pool)):
            if not isinstance(value, bool):
                raise ValueError(f"GuardedCUDAGraphs option {name!r} must be True or False, got {value!r}")
        super().__init__(share_mem_pool=share_mem_pool)
        self.share_buffers = share_buffers

    def __repr__(self) -> str:
        return f"GuardedCUDAGraphs(share_buffers={self.share_buffers})"
