"""What every pass reads besides its trace (:class:`PassContext`), where a trace comes from (:class:`TraceContext`),
the errors strict mode raises, and the check that a new trace runs the communication ops of the old one."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .. import _thunder as th
from ..cost import CostConstants, Measured
from ..decisions import Decision
from ..ops import is_communication, rebuild_keeps_bits
from ..options import GuardOptions
from ..policy import ModelDoubt
from ..progress import Progress
from .collectives import communication_changes
from .hoist import HoistLedger


class FusionGuardError(RuntimeError):
    """Raised in strict mode where the default mode would keep a region and record the failure, and where a
    region fails that nothing else can run (:class:`UnrescuableRegion`)."""


class UnrescuableRegion(FusionGuardError, th.Unrescuable):
    """A fusion region failed and can run no other way (a backward region reading values Thunder lost): raised
    from the region's own error, saying why and what the user can do."""


class CommunicationChanged(FusionGuardError):
    """A pass would have added, dropped, reordered or moved something across a communication op."""


@dataclass(frozen=True)
class TraceContext:
    """Where a trace comes from, for the report."""

    trace: str
    function: str | None = None
    compile_index: int = 0
    subgraph: str | None = None
    compile_options: Mapping[str, Any] = field(default_factory=dict)  # passed to thunder.jit by name
    rank: int | None = None
    captured: bool = False  # replays in CUDA graphs: a CUDAGraphTransform, or compiled in capture_step's warm-up


ConstantsFor = Callable[[str, str], "CostConstants | None"]


@dataclass
class Alternative:
    """A region fused by another fusion ``executor`` as number ``counter``, built on first use and kept: the
    symbol a measurement times is the one a switch puts into the trace (one build, one compile)."""

    executor: Any
    fusion: th.BoundSymbol
    counter: int
    _built: th.BoundSymbol | None = None

    @property
    def name(self) -> str:
        return self.executor.name

    @property
    def label(self) -> str:
        """The executor's name with the Inductor options it compiles with, if any: what a cached timing is of."""
        options = th.inductor_options(self.executor)
        return self.name + "".join(f"+{key}={value}" for key, value in sorted(options.items()))

    def bsym(self) -> th.BoundSymbol:
        if self._built is None:
            self._built = th.fuse_with(self.executor, self.fusion, self.counter)
        return self._built


# Times a region on this machine (with, given, the region fused by another executor): a measurement, or why
# there is none.
MeasureRegion = Callable[[th.TraceCtx, Any, "Alternative | None"], "Measured | str"]


@dataclass(frozen=True)
class PassContext:
    """What a pass reads besides its trace: the options, where the trace comes from, the trace the guard was
    given, the decisions of the passes before it (read only), what the region pass and hoisting need, and
    ``record``, which takes a decision made later, while the program runs (a region rescued at a call)."""

    options: GuardOptions
    where: TraceContext
    original: th.TraceCtx
    decided: tuple[Decision, ...] = ()
    constants_for: ConstantsFor | None = None
    measure_region: MeasureRegion | None = None
    hoisted: HoistLedger = field(default_factory=HoistLedger)
    record: Callable[[Decision], None] | None = None
    doubt: ModelDoubt | None = None
    progress: Progress = field(default_factory=Progress.off)

    def region_decisions(self) -> dict[str, Decision]:
        """The decisions so far about each region of this trace, by region name."""
        return {d.region: d for d in self.decided if d.about_region and d.trace == self.where.trace}


# A pass: the trace it was given, or a new one, and the decisions it made. A decision about a whole region
# replaces the earlier one about that region (a pass that changes a region's fate returns its new decision).
PassFunction = Callable[[th.TraceCtx, PassContext], tuple[th.TraceCtx, list[Decision]]]


def check_communication(before: th.TraceCtx, after: th.TraceCtx) -> None:
    """Raise :class:`CommunicationChanged` when ``after`` does not run the communication ops of ``before``
    in the same order, with nothing moved across one."""
    problem = communication_changes(before, after)
    if problem is not None:
        raise CommunicationChanged(problem)


def may_change(options: GuardOptions, keep_bits: bool = True) -> Callable[[th.BoundSymbol], bool]:
    """Which fusion calls op passes may rebuild: guarded ones without communication ops, and with
    ``exact_only`` only those a rebuild cannot change the bits of (``keep_bits=False``: a rewrite the user opted
    into knowing it may round differently, which ``exact_only`` does not hold back)."""

    def may(fusion: th.BoundSymbol) -> bool:
        if not options.guards(th.executor_name(fusion)) or is_communication(fusion):
            return False
        if not keep_bits or not options.exact_only:
            return True
        return rebuild_keeps_bits(list(th.subsymbols(fusion)), options.rewrites.metadata_ops)

    return may
