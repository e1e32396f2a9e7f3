"""What the hoist pass leaves in a trace: a call that runs the hoisted sub-program on the first call of the
compiled program and hands its outputs back on every later one."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from .. import _thunder as th

HOISTED_NAME = "hoisted_constants"


class HoistedValues:
    """The outputs of a hoisted sub-program: computed on the first call, then handed back on every call.

    One object per compiled trace (a recompilation builds a new trace and so a new cache). ``computed``
    counts runs of the sub-program, ``reused`` the calls served from the cache. A run during CUDA graph
    capture is not kept (its tensors are only filled when the graph replays).
    """

    def __init__(self, name: str, fn: Callable, outputs: Sequence[str]) -> None:
        self.name = name
        self.fn = fn
        self.outputs = tuple(outputs)
        self.values: Any = None
        self.computed = 0
        self.reused = 0
        self.enabled = True

    def __call__(self) -> Any:
        values = self.values
        if values is not None:
            self.reused += 1
            return values
        values = tuple(self.fn())
        self.computed += 1
        if self.enabled and not th.capturing_cuda_graph():
            self.values = values
        return values

    def disable(self) -> None:
        """Compute on every call from now on (something writes a cached tensor)."""
        self.enabled = False
        self.values = None

    def __repr__(self) -> str:
        return (
            f"HoistedValues({self.name}: {len(self.outputs)} outputs, computed {self.computed}, reused {self.reused})"
        )


def hoisted_call(
    name: str,
    bsyms: Sequence[th.BoundSymbol],
    outputs: Sequence[th.Proxy],
    returns: Sequence[th.Proxy] | None = None,
) -> tuple[th.BoundSymbol, HoistedValues]:
    """One call, taking no argument, that runs ``bsyms`` once and then returns the same ``outputs`` every call.

    ``returns`` (default ``outputs``) are the proxies of ``bsyms`` handed out as ``outputs``, in order
    (one may be handed out under several names). The bound symbols run exactly as the trace would
    have run them (same symbols, same executors), through a Python function built the way Thunder's
    CUDA-graph transform builds its regions.
    """
    returns = list(outputs if returns is None else returns)
    body = [b for b in bsyms if not th.is_comment_or_del(b)]
    fn = th.python_callable_from_symbols(f"{name}_body", body, [], returns, free_values=True)
    values = HoistedValues(name, fn, [p.name for p in outputs])
    return th.guard_call(name, values, outputs, body), values


def hoisted_values(trace: th.TraceCtx) -> list[HoistedValues]:
    """The caches of the hoisted sub-programs of ``trace`` (empty when nothing was hoisted), also when
    a later transform moved the hoisted call into a region of its own (CUDA graphs)."""

    def walk(bsyms: Iterable[th.BoundSymbol]) -> Iterator[HoistedValues]:
        for bsym in bsyms:
            for fn in th.call_targets(bsym):
                if isinstance(fn, HoistedValues):
                    yield fn
            if bsym.sym.name != HOISTED_NAME:
                yield from walk(th.subsymbols(bsym))

    return list({id(v): v for v in walk(trace.bound_symbols)}.values())
