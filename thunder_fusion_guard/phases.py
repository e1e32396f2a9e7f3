"""The phases of a first call, and the ledger that times the guard's own part of them.

A first call under Thunder spends its time in phases that belong to different owners: Dynamo and Inductor (under
ThunderFX), Thunder's interpreter and transforms, the guard's own passes and measurements, the fusion executors
compiling each region at its first call, CUDA-graph capture, and the execution itself. While a window is open
(:func:`~.examine.first_call.first_call`), the guard times what it runs itself here: its passes, its calibration and
break-even timings, each region's first call (through the rescuing call it already puts around every region) and
the graph captures of its ``CUDAGraphTransform``. Thunder's and Dynamo's phases come from their own records.

No torch or Thunder import, so that any layer may time into the ledger.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

__all__ = [
    "CAPTURE",
    "DYNAMO",
    "EXECUTION",
    "FUSION_COMPILE",
    "GUARD_MEASUREMENTS",
    "GUARD_PASSES",
    "INDUCTOR",
    "OTHER",
    "PHASES",
    "THUNDERFX_SPLIT",
    "THUNDER_TRACING",
    "THUNDER_TRANSFORMS",
    "PhaseLedger",
    "active",
    "closing",
    "first_call_timer",
    "opening",
    "timed",
    "timing",
]

DYNAMO = "dynamo"
THUNDERFX_SPLIT = "thunderfx_split"
INDUCTOR = "inductor"
THUNDER_TRACING = "thunder_tracing"
THUNDER_TRANSFORMS = "thunder_transforms"
GUARD_PASSES = "guard_passes"
GUARD_MEASUREMENTS = "guard_measurements"
FUSION_COMPILE = "fusion_compile"
CAPTURE = "cuda_graph_capture"
EXECUTION = "first_execution"
OTHER = "other"

# Each phase, in the order a first call meets them, with what it holds and whose it is.
PHASES: dict[str, str] = {
    DYNAMO: "Dynamo tracing the user's code to FX graphs (ThunderFX)",
    THUNDERFX_SPLIT: "ThunderFX's backend splitting the graphs between Thunder and Inductor",
    INDUCTOR: "Inductor compiling the pieces ThunderFX's splitter left to it",
    THUNDER_TRACING: "Thunder's interpreter tracing the program",
    THUNDER_TRANSFORMS: "Thunder's transforms: autodiff, executors' passes (fusion), remat, callables",
    GUARD_PASSES: "the guard's own passes",
    GUARD_MEASUREMENTS: "the guard's calibration and break-even timings (first compiles included)",
    FUSION_COMPILE: "each fusion region's first call, where nvFuser or torch.compile compiles it",
    CAPTURE: "capturing CUDA graphs (the guard's capture path)",
    EXECUTION: "running Thunder's computation, its regions' first calls and captures aside",
    OTHER: "the rest: prologue, autograd, backward outside regions, glue, the user's code",
}

# Phases the guard times at run time: inside Thunder's computation when they run in its forward.
_RUN_TIME = (FUSION_COMPILE, CAPTURE)


class PhaseLedger:
    """Nanoseconds of the guard's own phases while a window is open: each phase's own time (a section timed inside
    another counts for its own phase only), each region's first call whole, and the outermost sections' time that
    lies inside Thunder's compilation (``compiling_ns``) or inside its forward computation (``executing_ns``).

    ``clock`` reads nanoseconds; ``in_backward`` says whether the autograd engine runs a backward now; ``probe``
    (optional) is read before and after each outermost run-time section (``probes``), so that other records made
    inside them (Dynamo compiling a torch.compile region) can be told apart."""

    def __init__(
        self,
        clock: Callable[[], int],
        in_backward: Callable[[], bool] = lambda: False,
        probe: Callable[[], Any] | None = None,
    ) -> None:
        self.clock = clock
        self.in_backward = in_backward
        self.probe = probe
        self.open = True
        self.own_ns: dict[str, int] = {}
        self.regions_ns: dict[str, int] = {}
        self.compiling_ns = 0
        self.executing_ns = 0
        self.probes: list[tuple[Any, Any]] = []
        self.label = ""  # where the guard compiles now (its subgraph and trace), naming the regions it wraps
        self._stack: list[list[int]] = []

    @contextlib.contextmanager
    def timed(self, phase: str, region: str | None = None) -> Iterator[None]:
        """Time what runs inside as ``phase`` (and as ``region``'s first call, given); nothing once closed."""
        if not self.open:
            yield
            return
        outermost = not self._stack
        backward = outermost and phase in _RUN_TIME and self.in_backward()
        before = self.probe() if outermost and phase in _RUN_TIME and self.probe else None
        start = self.clock()
        self._stack.append([0])
        try:
            yield
        finally:
            elapsed = self.clock() - start
            nested = self._stack.pop()[0]
            self.own_ns[phase] = self.own_ns.get(phase, 0) + elapsed - nested
            if region is not None:
                self.regions_ns[region] = self.regions_ns.get(region, 0) + elapsed
            if self._stack:
                self._stack[-1][0] += elapsed
            elif phase not in _RUN_TIME:
                self.compiling_ns += elapsed
            elif not backward:
                self.executing_ns += elapsed
            if before is not None:
                self.probes.append((before, self.probe()))

    def seconds(self, phase: str) -> float:
        return self.own_ns.get(phase, 0) / 1e9

    @property
    def timing(self) -> bool:
        """Whether a section is being timed now."""
        return bool(self._stack)


_lock = threading.Lock()
_active: PhaseLedger | None = None


def active() -> PhaseLedger | None:
    """The ledger of the window open now, if any."""
    ledger = _active
    return ledger if ledger is not None and ledger.open else None


def opening(ledger: PhaseLedger) -> None:
    """Open ``ledger``'s window: the guard's phases time into it until :func:`closing`. One window at a time."""
    global _active
    with _lock:
        if active() is not None:
            raise RuntimeError("a first call is timed already: one window at a time")
        _active = ledger


def closing(ledger: PhaseLedger) -> None:
    global _active
    with _lock:
        ledger.open = False
        if _active is ledger:
            _active = None


@contextlib.contextmanager
def timed(phase: str, label: str | None = None) -> Iterator[None]:
    """Time what runs inside as ``phase`` in the open window (nothing without one); ``label``: where the guard
    compiles now, the name its region timers get while inside."""
    ledger = active()
    if ledger is None:
        yield
        return
    before = ledger.label
    if label is not None:
        ledger.label = label
    try:
        with ledger.timed(phase):
            yield
    finally:
        ledger.label = before


def timing(phase: str, fn: Callable, where: Any = None) -> Callable:
    """``fn``, timed as ``phase`` in the window open now (``fn`` itself without one); ``where`` (a trace context:
    ``subgraph``, ``trace``) names the regions the guard wraps while ``fn`` runs."""
    if active() is None:
        return fn
    label = None
    if where is not None:
        label = "/".join(p for p in (getattr(where, "subgraph", None), getattr(where, "trace", None)) if p)

    def run(*args: Any, **kwargs: Any) -> Any:
        with timed(phase, label):
            return fn(*args, **kwargs)

    if hasattr(fn, "cached"):  # a region measurer's lookup of earlier timings, which times nothing
        run.cached = fn.cached  # type: ignore[attr-defined]
    return run


def first_call_timer(region: str) -> Callable[[Callable, tuple], Any] | None:
    """A function that runs a region's first call, ``run(fn, args)``, timed as that region's fusion compile in the
    window open now (None without one: the region is called as it is). Made while compiling, it times only while
    that window stays open: a first call after the window has closed adds nothing."""
    ledger = active()
    if ledger is None:
        return None
    name = f"{ledger.label} {region}".strip()

    def run(fn: Callable, args: tuple) -> Any:
        with ledger.timed(FUSION_COMPILE, region=name):
            return fn(*args)

    return run
