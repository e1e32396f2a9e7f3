"""Re-running Thunder's own partition decisions on a finished trace: which executor claimed an op, whether a
fusion executor's ``can_fuse`` takes it (walking its decomposition as Thunder does), which checker refused it
and which compile option it read, the fusion pass's rules for refusing a region, and nvFuser's schedulers'
verdicts on a whole fusion (``examine/why_segments.py`` reads its segmented-fusion dump).

Every function reads; none changes a trace, an executor or the compile data of the program (checkers run
under a copy of the compile data and a throwaway stats object, so the compile options resolve as they did).
"""

from __future__ import annotations

import copy
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import thunder
from thunder.core import prims
from thunder.core.compile_data import compile_data_and_stats
from thunder.core.symbol import BoundSymbol, Symbol, has_tags
from thunder.core.trace import TraceCtx, reset_tracectx, set_tracectx
from thunder.extend import Executor, FusionExecutor, OperatorExecutor, get_always_executors

__all__ = [
    "Refusal",
    "can_fuse",
    "compile_data_of",
    "executors_list",
    "first_refusal",
    "fusion_type",
    "has_cuda_io",
    "implementing_executor",
    "is_auto_registered",
    "is_shape_only",
    "original_op",
    "qualified_name",
    "refusing_option",
    "run_checker",
    "scheduler_verdicts",
]

# The compile options whose checkers turn an nvFuser translation off by default.
NVFUSER_OPTIONS = ("nv_enable_linear", "nv_enable_matmul", "nv_enable_sdpa", "nv_enable_scatter")


def compile_data_of(jitted: Any) -> Any:
    """Thunder's compile data of a ``thunder.jit`` result (None if it is not one)."""
    try:
        return thunder.compile_data(jitted)
    except Exception:  # any object may be asked: whatever its attribute lookup raises means "not a thunder.jit result"
        return None


def executors_list(cd: Any) -> list[Executor]:
    """The executors a program was compiled with, in priority order (Thunder's always-executors last)."""
    found = list(getattr(cd, "executors_list", None) or ())
    return found + [ex for ex in get_always_executors() if ex not in found]


def fusion_type(cd: Any) -> str:
    """How the fusion pass groups ops: 'consecutive' (Thunder's default) or 'dataflow' (ThunderFX's)."""
    from thunder.executors.data_dependent_partition import _DEFAULT_FUSION_TYPE

    options = getattr(cd, "compile_options", None) or {}
    return options.get("fusion_type") or _DEFAULT_FUSION_TYPE


@contextmanager
def _resolving(cd: Any, overrides: dict[str, Any] | None = None) -> Iterator[dict[str, list]]:
    """Compile options resolve as they did for the program (plus ``overrides``); yields the options read."""
    data = cd
    if overrides:
        data = copy.copy(cd)
        data.compile_options = {**(getattr(cd, "compile_options", None) or {}), **overrides}
    stats = SimpleNamespace(last_compile_reasons=defaultdict(list))
    with compile_data_and_stats(data, stats):
        yield stats.last_compile_reasons


def can_fuse(ex: Executor, bsym: BoundSymbol, cd: Any) -> bool:
    """``ex.can_fuse(bsym)`` (an operator executor: ``can_execute``) with the program's compile options."""
    with _resolving(cd):
        try:
            return bool(ex.can_fuse(bsym) if isinstance(ex, FusionExecutor) else ex.can_execute(bsym))
        except Exception:  # an executor's checks are its own code and may raise anything: an error counts as a refusal
            return False


def run_checker(ex: Executor, bsym: BoundSymbol, cd: Any, overrides: dict[str, Any] | None = None) -> tuple[bool, list]:
    """(``ex``'s checker for ``bsym`` says yes, the compile options it read); True where it has no checker."""
    impl = ex.implmap.get(bsym.sym.id)
    if impl is None or impl.checker is None:
        return impl is not None, []
    with _resolving(cd, overrides) as read:
        try:
            verdict = bool(impl.checker(*bsym.args, **bsym.kwargs))
        except Exception:  # an executor's checker is its own code and may raise anything: an error counts as a refusal
            verdict = False
    return verdict, list(read)


def refusing_option(ex: Executor, bsym: BoundSymbol, cd: Any) -> str | None:
    """The compile option, off for this program, without which ``ex``'s checker refuses ``bsym``: the checker
    is re-run with each option it read turned on; None when no such option makes it say yes."""
    verdict, read = run_checker(ex, bsym, cd)
    if verdict:
        return None
    options = getattr(cd, "compile_options", None) or {}
    for option in read:
        if options.get(option):
            continue
        if run_checker(ex, bsym, cd, {option: True})[0]:
            return option
    return None


@dataclass
class Refusal:
    """Why a fusion executor's ``can_fuse`` says no: the path from the op down its decomposition to the
    first op it cannot execute (``leaf``), and the deepest op on that path whose checker said no."""

    path: list[BoundSymbol] = field(default_factory=list)
    checker_refused: BoundSymbol | None = None

    @property
    def leaf(self) -> BoundSymbol:
        return self.path[-1]


def first_refusal(ex: FusionExecutor, bsym: BoundSymbol, cd: Any) -> Refusal | None:
    """Walk ``bsym``'s decomposition as ``Executor.can_fuse`` does; None where ``ex`` can fuse it."""
    with _resolving(cd):
        return _walk(ex, bsym, [])


def _walk(ex: FusionExecutor, bsym: BoundSymbol, path: list[BoundSymbol]) -> Refusal | None:
    here = [*path, bsym]
    if bsym.sym.is_fusion:
        return Refusal(here)
    impl = ex.implmap.get(bsym.sym.id)
    refused_here = False
    if impl is not None:
        try:
            ok = impl.checker is None or bool(impl.checker(*bsym.args, **bsym.kwargs))
        except Exception:  # an executor's checker is its own code and may raise anything: an error counts as a refusal
            ok = False
        if ok:
            return None
        refused_here = True
    if not bsym.subsymbols:
        return Refusal(here, bsym if refused_here else None)
    for sub in bsym.subsymbols:
        found = _walk(ex, sub, here)
        if found is not None:
            if found.checker_refused is None and refused_here:
                found.checker_refused = bsym
            return found
    return None


def implementing_executor(bsym: BoundSymbol, executors: Sequence[Executor]) -> tuple[Executor | None, Any]:
    """(The operator executor whose implementation ``bsym`` is, the id of the op it implements); the id is
    None where ``bsym`` is no executor's implementation of another op. Where one implementation serves
    several ops (the torch executor's for ``ltorch.tanh`` and ``prims.tanh``), the op ``bsym`` decomposes
    into wins, then a torch-level op over a prim."""
    ex = bsym.sym.executor
    for candidate in [ex, *executors] if ex is not None else executors:
        if not isinstance(candidate, OperatorExecutor):
            continue
        ids = [
            op_id
            for op_id, impl in candidate.implmap.items()
            if getattr(impl, "symbol", None) is not None and (impl.symbol is bsym.sym or impl.symbol.id == bsym.sym.id)
        ]
        if ids:
            inside = {sub.sym.id for sub in bsym.subsymbols}
            ids.sort(key=lambda i: (i not in inside, isinstance(i, prims.PrimIDs)))
            return candidate, ids[0]
    return ex, None


_SYMBOLS: dict[Any, Symbol] | None = None


def _symbol_by_id(op_id: Any) -> Symbol | None:
    global _SYMBOLS
    if _SYMBOLS is None:
        import thunder.clang as clang
        import thunder.torch as ltorch

        found: dict[Any, Symbol] = {}
        for module in (prims, clang, ltorch):
            for value in vars(module).values():
                if isinstance(value, Symbol):
                    found.setdefault(value.id, value)
        for value in getattr(ltorch, "_torch_to_thunder_function_map", {}).values():
            if isinstance(value, Symbol):
                found.setdefault(value.id, value)
        _SYMBOLS = found
    return _SYMBOLS.get(op_id)


def original_op(bsym: BoundSymbol, executors: Sequence[Executor]) -> BoundSymbol:
    """The op ``bsym`` stood for before an operator executor claimed it, with its decomposition (what the
    fusion executors were asked about); ``bsym`` itself where it implements no other op."""
    _, op_id = implementing_executor(bsym, executors)
    if op_id is None or op_id == bsym.sym.id:
        return bsym
    for sub in bsym.subsymbols:
        if sub.sym.id == op_id:
            return sub
    symbol = _symbol_by_id(op_id)
    if symbol is None:
        return bsym
    # Thunder's detached_trace does not restore the trace context when the call raises: set and reset it here.
    scratch = TraceCtx(None)
    token = set_tracectx(scratch)
    try:
        symbol(*bsym.args, **bsym.kwargs)
    except Exception:  # retracing may fail in any of Thunder's meta functions: the op as claimed is still an answer
        return bsym
    finally:
        reset_tracectx(token)
    return scratch.bound_symbols[-1] if scratch.bound_symbols else bsym


def qualified_name(bsym: BoundSymbol) -> str:
    """The op's name as a trace prints it: ``ltorch.linear``, ``prims.tanh``, else the symbol's name."""
    module = getattr(getattr(bsym.sym, "module", None), "__name__", "")
    prefix = {"thunder.torch": "ltorch.", "thunder.core.prims": "prims.", "thunder.clang": "clang."}.get(module, "")
    return prefix + bsym.sym.name


def is_auto_registered(bsym: BoundSymbol) -> bool:
    """True for a torch op Thunder registered by itself at trace time (it runs as a torch fallback)."""
    return has_tags(bsym, {prims.OpTags.AUTO_REGISTERED})


def is_shape_only(bsyms: Sequence[BoundSymbol]) -> bool:
    """True when every op and its subsymbols are tagged shape ops (nvFuser's ``all_tagged``): nvFuser's fusion
    pass makes no region of those alone."""

    def all_tagged(bsym: BoundSymbol) -> bool:
        return all(has_tags(b, {prims.OpTags.SHAPE_OP}) for b in (bsym, *bsym.subsymbols))

    return bool(bsyms) and all(all_tagged(b) for b in bsyms)


def has_cuda_io(ex: FusionExecutor, bsym: BoundSymbol) -> bool | None:
    """nvFuser's own test that ``bsym`` has a CUDA tensor input or output; None for another executor."""
    test: Callable | None = getattr(ex, "has_cuda_input_or_output", None)
    return None if test is None else bool(test(bsym))


def scheduler_verdicts(fec: Any, inputs: Sequence[Any], schedulers: Sequence[str]) -> dict[str, str]:
    """For each scheduler name, nvFuser's own verdict on scheduling the whole fusion as one kernel with it:
    ``nvfuser_direct.schedule.can_schedule(fusion, SchedulerType.X, inputs)`` returns (bool, the rejection
    log); a scheduler or function this nvFuser does not expose is answered so."""
    try:
        import nvfuser_direct as nvd
    except ImportError:
        return {name: "not exposed: nvfuser_direct does not import" for name in schedulers}
    check = getattr(getattr(nvd, "schedule", None), "can_schedule", None)
    kinds = getattr(nvd, "SchedulerType", None)
    fusion_of = getattr(fec, "fusion", None)
    verdicts = {}
    for name in schedulers:
        if check is None or kinds is None or fusion_of is None:
            verdicts[name] = "not exposed: nvfuser_direct.schedule.can_schedule or SchedulerType is missing"
            continue
        kind = getattr(kinds, name, None)
        if kind is None:
            verdicts[name] = f"not exposed: SchedulerType has no {name}"
            continue
        try:
            ok, log = check(fusion_of(), kind, list(inputs))
        except Exception as e:  # nvFuser's C++ errors come through as any type: each is that scheduler's answer
            verdicts[name] = f"can_schedule raised {type(e).__name__}: {str(e).strip().splitlines()[:1]}"
            continue
        text = " ".join(str(log).split())
        verdicts[name] = "accepts the whole fusion" if ok else (text or "refused, no reason logged")
    return verdicts
