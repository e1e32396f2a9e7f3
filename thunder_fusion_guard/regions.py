"""Finding the fusion regions of an execution trace."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from . import _thunder as th


@dataclass(frozen=True)
class Region:
    """One fusion call of a trace: where it stands, who runs it and what it holds."""

    position: int
    name: str
    executor: str
    bsym: th.BoundSymbol

    @property
    def ops(self) -> list[str]:
        return [th.op_name(b) for b in self.body]

    @property
    def body(self) -> list[th.BoundSymbol]:
        return th.fusion_body(self.bsym)

    @property
    def deep_op_names(self) -> set[str]:
        """Every op name in the region, at every level of decomposition (the region's own name aside)."""
        return set().union(*(th.op_names_deep(b) for b in self.body))

    @property
    def inputs(self) -> list[th.Proxy]:
        return list(self.bsym.flat_proxy_args)

    @property
    def outputs(self) -> list[th.Proxy]:
        return list(self.bsym.flat_proxy_outs)


def find_regions(trace: th.TraceCtx, executors: Iterable[str] | None = None) -> list[Region]:
    """Every fusion region of ``trace``, in trace order; only those of ``executors`` when given."""
    wanted = None if executors is None else set(executors)
    found = []
    for position, bsym in enumerate(trace.bound_symbols):
        if not th.is_fusion(bsym):
            continue
        ex = th.executor_name(bsym)
        if wanted is None or ex in wanted:
            found.append(Region(position, bsym.sym.name, ex, bsym))
    return found


def same_program(a: Region, b: Region) -> bool:
    """Whether regions ``a`` and ``b`` (of any traces) are one program: the same executor, inputs of the same kinds
    in the same order, the same ops on them and the same values returned, whatever their traces named them. Such
    regions compile and run alike: where one fails, so does the other."""
    return a.executor == b.executor and _program(a) == _program(b)


def _program(region: Region) -> tuple[list[object], str]:
    """What a region's fusion compiles: its inputs' kinds (a tensor's shape, dtype, device and whether it requires
    grad; a number's value) and its ops, inputs first, as text."""
    kinds = [th.tensor_spec(p) or (type(p).__name__, th.number_value(p)) for p in region.inputs]
    return kinds, th.canonical_ops(region.body, region.inputs, region.outputs)
