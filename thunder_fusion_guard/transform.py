"""FusionGuard, the Thunder transform: a thin shell that runs the guard pass on each optimized trace."""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterable
from typing import Any

import thunder

from . import _thunder as th
from .cost import CostConstants
from .measure import calibrate
from .options import DEFAULT_HOIST_MAX_BYTES, make_options
from .passes import TraceContext, guard_trace
from .passes.hoist import HoistLedger
from .report import Report, Subgraph


class FusionGuard(thunder.Transform):
    """Reject fusion regions that cost more than plain PyTorch, and record every decision.

    Use as ``thunder.jit(fn, transforms=[FusionGuard()])``. Options are keyword-only:

    - ``executors``: names (or objects) of the fusion executors to guard; default all of them.
    - ``metadata_ops``: extra operation names to count as metadata-only.
    - ``report_only``: decide and record, change nothing.
    - ``strict``: raise instead of keeping a region the guard could not rewrite (for tests).
    - ``cost_model``: also reject compute regions the cost model says eager PyTorch runs faster.
    - ``margin``: eager must be estimated at least this fraction cheaper to reject (default 0.2).
    - ``exact_only``: reject compute regions only when every op gives the same bits outside the fusion.
    - ``calibration``: cost constants: None (this machine's cached calibration, else shipped defaults),
      ``"measure"`` (calibrate now if nothing is cached), or a ``CostConstants``/dict set by hand.
    - ``fold_setitem``: fold Thunder's out-of-place setitem and its ``copy_`` back into one in-place setitem.
    - ``remove_identities``: remove ops that return their input unchanged (same-shape reshape, ...).
    - ``rehome``: move metadata ops run outside a fusion into the region that alone reads them.
    - ``merge_regions``: merge adjacent regions of one executor (off: the fused code may round differently).
    - ``hoist``: compute the input-independent part of each trace (masks, position ids built from shapes and
      constants) once per compiled program, on its first call, and reuse it.
    - ``hoist_max_bytes``: the most bytes of hoisted tensors one compiled trace keeps (default 64 MiB).
    """

    def __init__(
        self,
        *,
        executors: Iterable[str | th.FusionExecutor] | None = None,
        metadata_ops: Iterable[str] = (),
        report_only: bool = False,
        strict: bool = False,
        cost_model: bool = True,
        margin: float = 0.2,
        exact_only: bool = True,
        calibration: CostConstants | dict | str | None = None,
        fold_setitem: bool = True,
        remove_identities: bool = True,
        rehome: bool = True,
        merge_regions: bool = False,
        hoist: bool = True,
        hoist_max_bytes: int = DEFAULT_HOIST_MAX_BYTES,
    ) -> None:
        self.options = make_options(
            executors=executors,
            metadata_ops=metadata_ops,
            report_only=report_only,
            strict=strict,
            cost_model=cost_model,
            margin=margin,
            exact_only=exact_only,
            calibration=calibration,
            fold_setitem=fold_setitem,
            remove_identities=remove_identities,
            rehome=rehome,
            merge_regions=merge_regions,
            hoist=hoist,
            hoist_max_bytes=hoist_max_bytes,
        )
        self._constants: dict[tuple[str, str], CostConstants | None] = {}
        self.report = Report()
        self._lock = threading.Lock()
        self._compiles: dict[str | None, int] = {}
        self._subgraph_ids: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()
        self._hoisted = HoistLedger()

    def transform_trace_post_optimization(self, computation_trace: th.TraceCtx, **kwargs: Any) -> th.TraceCtx:
        with self._lock:
            backward = th.is_backward(computation_trace)
            function = th.compile_function_name()
            # Counted per function name, not per object: ThunderFX subgraphs are all "GraphModule", and
            # distinct indices keep (function, compile_index) naming one compilation in the report.
            if not backward:
                self._compiles[function] = self._compiles.get(function, 0) + 1
            where = TraceContext(
                trace="backward" if backward else "forward",
                function=function,
                compile_index=self._compiles.get(function, 0),
                subgraph=self._subgraph_id(th.compiling_fx_subgraph()),
            )
            return guard_trace(computation_trace, self.options, self.report, where, self.constants_for, self._hoisted)

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
        """The cost constants used for ``executor`` on ``device``, resolved once per guard."""
        key = (device, executor)
        if key not in self._constants:
            chosen = self.options.calibration
            if not isinstance(chosen, CostConstants):
                chosen = calibrate.lookup(device, executor)
                if chosen is None and self.options.calibration == "measure":
                    chosen = calibrate.calibrate(device, executor)
            self._constants[key] = chosen
        return self._constants[key]

    def __repr__(self) -> str:
        return f"FusionGuard({self.options})"
