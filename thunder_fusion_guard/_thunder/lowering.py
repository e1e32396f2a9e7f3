"""Building and lowering traces: new traces and fusion calls made from bound symbols, ops lowered to
Thunder's torch executor, and Python callables run from bound symbols."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from inspect import Parameter, Signature
from typing import Any

import thunder
import torch
from thunder.core import prims
from thunder.core.proxies import Proxy, TensorProxy, variableify
from thunder.core.symbol import BoundSymbol, Symbol
from thunder.core.trace import TraceCtx, TraceProvenance, from_trace, tracectx
from thunder.core.transform_common import dce
from thunder.executors.passes import _del_last_used, _transform_for_operator_executor_execution, del_last_used
from thunder.extend import FusionExecutor, get_all_executors, get_always_executors

from .executors import ALTERNATIVE_FUSERS, guard_executor, torch_executor
from .sources import package_compilations
from .traces import fusion_body, is_backward, is_comment_or_del, is_fusion

__all__ = [
    "GUARD_PROVENANCE",
    "alternative_fuser",
    "executor_claims",
    "free_fusion_counter",
    "fuse_part",
    "fuse_with",
    "guard_call",
    "inplace_setitem",
    "lower_to_torch",
    "lowering_executor_names",
    "new_trace_like",
    "python_callable_from_symbols",
    "rebuild_fusion",
    "refresh_dels",
    "set_provenance",
    "swap_proxies",
    "with_call",
]


def new_trace_like(trace: TraceCtx, bound_symbols: list[BoundSymbol]) -> TraceCtx:
    """A trace with the signature, names and tags of ``trace`` and the given bound symbols."""
    new = from_trace(trace)
    new.bound_symbols = bound_symbols
    return new


GUARD_PROVENANCE = "FusionGuard"


def set_provenance(trace: TraceCtx, text: str) -> None:
    """Record in ``trace`` which pass made it (Thunder prints it above the trace)."""
    trace.set_provenance(TraceProvenance(text))


def refresh_dels(trace: TraceCtx) -> TraceCtx:
    """Re-derive the ``del`` statements after bound symbols moved (Thunder's own last-use pass)."""
    backward = is_backward(trace)
    if backward:
        # del_last_used adds the collection clears again; without this they would be doubled, and
        # positional readers of the backward trace (CUDAGraphTransform) would break.
        trace = new_trace_like(trace, [b for b in trace.bound_symbols if b.sym.name != "clear_mutable_collection"])
    return del_last_used(trace, clear_mutable_collections=backward)


def _lowering_executors() -> list[Any]:
    """Thunder's torch executor, then its always-on executors (Python, for numbers)."""
    return [torch_executor(), *[ex for ex in get_always_executors() if ex is not torch_executor()]]


def lowering_executor_names() -> frozenset[str]:
    """Names of the executors :func:`lower_to_torch` may hand operations to (torch, and Python for numbers)."""
    return frozenset(ex.name for ex in _lowering_executors())


def lower_to_torch(outer: TraceCtx, bsyms: Sequence[BoundSymbol], outputs: Sequence[Proxy]) -> list[BoundSymbol]:
    """The given bound symbols re-expressed as calls of Thunder's torch executor.

    The region trace shares the outer trace's name set, so any proxy the lowering creates gets a
    name that is free in the outer trace.
    """
    # Outputs that are the region's own inputs (passthroughs) are already defined outside it.
    produced = {o.name for b in bsyms for o in b.flat_proxy_outs}
    outputs = [o for o in outputs if o.name in produced]
    region = from_trace(outer)
    region.bound_symbols = [b for b in bsyms if not is_comment_or_del(b)]
    with tracectx(region):
        region.bound_symbols.append(prims.python_return.bind(list(outputs), output=None))
    with _call_defaults():
        lowered = dce(_transform_for_operator_executor_execution(region, _lowering_executors()))
    body = [b for b in lowered.bound_symbols if b.sym.id != prims.PrimIDs.RETURN]
    (returned,) = [b for b in lowered.bound_symbols if b.sym.id == prims.PrimIDs.RETURN]
    # The lowering gives re-created outputs fresh names; give them back the names the trace uses.
    renames = [
        (new, old)
        for new, old in zip(returned.args[0], outputs, strict=True)
        if isinstance(new, Proxy) and new.name != old.name
    ]
    if renames:
        body = [swap_proxies(b, renames) for b in body]
    # Each lowered op keeps the user's line of the op it came from (what a decision names): one for one where the
    # lowering kept the count of ops (it renames every value it makes), else by the name of the value it makes.
    originals = region.bound_symbols[:-1]
    made_by = {o.name: b for b in originals for o in b.flat_proxy_outs}
    origins = (
        originals
        if len(originals) == len(body)
        else [next((made_by[o.name] for o in b.flat_proxy_outs if o.name in made_by), None) for b in body]
    )
    return [
        b.from_bsym(
            source_filename=getattr(origin, "source_filename", None),
            source_positions=getattr(origin, "source_positions", None),
        )
        for b, origin in zip(body, origins, strict=True)
    ]


@contextmanager
def _call_defaults() -> Iterator[None]:
    """Thunder's record of a call's defaults (dtype, device), as ``thunder.jit`` makes one for each call, where no
    call made one: lowering ``arange``, ``full`` and the like after compiling (``profile_regions``) reads it."""
    try:
        thunder._get_cache_info()
    except LookupError:
        defaults = {"default_dtype": torch.get_default_dtype(), "default_device": torch.get_default_device()}
        token = thunder._cache_info_ctx.set(defaults)
        try:
            yield
        finally:
            thunder._cache_info_ctx.reset(token)
    else:
        yield


def swap_proxies(bsym: BoundSymbol, renames: Iterable[tuple[Proxy, Proxy]]) -> BoundSymbol:
    """``bsym`` (and its subsymbols) with each ``old`` proxy of the ``(old, new)`` pairs replaced."""
    swap = {variableify(old): new for old, new in renames}
    return bsym.from_bsym_swap_proxies(swap) if swap else bsym


@dataclass
class _FusedRegion:
    """What a fusion executor's ``fuse`` reads of a region."""

    inputs: tuple
    outputs: tuple
    bound_symbols: tuple


def with_call(bsym: BoundSymbol, fn: Callable) -> BoundSymbol:
    """A new bound symbol like ``bsym`` that calls ``fn`` under its name: built whole rather than edited, so the
    trace ``bsym`` belongs to keeps its own call; the symbol's bind hook is not run (nvFuser's would set its
    own call back)."""
    return dataclasses.replace(bsym, tags=set(bsym.tags), _call_ctx={bsym.sym.name: fn})


def rebuild_fusion(
    fusion: BoundSymbol, body: Sequence[BoundSymbol], inputs: Sequence[Proxy], outputs: Sequence[Proxy]
) -> BoundSymbol:
    """A new call of ``fusion``'s executor running ``body`` from ``inputs`` to ``outputs``, same region name.

    Built the way Thunder itself rebuilds a fusion after editing it (``passes._update_fusion_call_ctx``).
    """
    return _fuse(fusion.sym.executor, body, inputs, outputs, _fusion_number(fusion.sym.name) or 0)


def fuse_part(
    fusion: BoundSymbol, body: Sequence[BoundSymbol], inputs: Sequence[Proxy], outputs: Sequence[Proxy], counter: int
) -> BoundSymbol:
    """A new call of ``fusion``'s executor running ``body`` (some of ``fusion``'s ops) from ``inputs`` to
    ``outputs``, numbered ``counter`` (see :func:`free_fusion_counter`)."""
    return _with_meta(_fuse(fusion.sym.executor, body, inputs, outputs, counter))


def _with_meta(bsym: BoundSymbol) -> BoundSymbol:
    """``bsym``, or where its executor left its symbol without a meta function (Thunder 0.2.6's torch.compile
    executor) a copy with the one nvFuser's regions have, so that Thunder's trace checking passes."""
    if bsym.sym.meta is None:
        output = bsym.output
        bsym = bsym.from_bsym(sym=dataclasses.replace(bsym.sym, meta=lambda *args, **kwargs: output))
    return bsym


def _fuse(
    executor: Any, body: Sequence[BoundSymbol], inputs: Sequence[Proxy], outputs: Sequence[Proxy], counter: int
) -> BoundSymbol:
    region = _FusedRegion(tuple(variableify(p) for p in inputs), tuple(variableify(p) for p in outputs), tuple(body))
    with package_compilations():  # runs on nvFuser builds without the legacy module, once the compilation is over too
        return executor.fuse(region, counter)


def _fusion_number(name: str) -> int | None:
    """The number a fusion's name ends in (``nvFusion3``: 3), None where it ends in none."""
    digits = name[len(name.rstrip("0123456789")) :]
    return int(digits) if digits else None


def fuse_with(executor: Any, fusion: BoundSymbol, counter: int) -> BoundSymbol:
    """The region of the fusion call ``fusion`` (same body, inputs and outputs) fused by another fusion
    ``executor``, numbered ``counter`` (see :func:`free_fusion_counter`)."""
    return _with_meta(_fuse(executor, fusion.subsymbols, fusion.flat_proxy_args, fusion.flat_proxy_outs, counter))


def alternative_fuser(fusion: BoundSymbol) -> Any | None:
    """The executor that could run the fusion call ``fusion`` instead of its own (see
    :data:`ALTERNATIVE_FUSERS`), if it can run every op of it; None otherwise."""
    wanted = ALTERNATIVE_FUSERS.get(getattr(fusion.sym.executor, "name", ""))
    found = [ex for ex in get_all_executors() if isinstance(ex, FusionExecutor) and ex.name == wanted]
    if not found:
        return None
    try:
        claims = all(found[0].can_fuse(b) for b in fusion_body(fusion))
    except Exception:  # another executor's checks are its own code and may raise anything: no alternative then
        return None
    return found[0] if claims else None


def compiled_by_inductor(fusion: BoundSymbol) -> bool:
    """Whether the fusion call ``fusion`` is one Inductor compiles (Thunder's torch.compile executors, theirs
    subclassed too)."""
    from thunder.executors.torch_compile import TorchCompileExecutor

    return isinstance(getattr(fusion.sym, "executor", None), TorchCompileExecutor)


def free_fusion_counter(trace: TraceCtx) -> int:
    """A fusion number above every one in ``trace``: a region fused with it (and the next ones) takes a name
    no fusion call of the trace has, whatever its executor's prefix."""
    numbers = [_fusion_number(b.sym.name) for b in trace.bound_symbols if is_fusion(b)]
    return max([0] + [n + 1 for n in numbers if n is not None])


def executor_claims(fusion: BoundSymbol, bsym: BoundSymbol) -> bool:
    """Whether the executor of the fusion call ``fusion`` can run ``bsym`` inside it (Thunder's own check,
    the one its partitioner asks before fusing an op)."""
    try:
        return bool(fusion.sym.executor.can_fuse(bsym))
    except Exception:  # an executor's checks are its own code and may raise anything: an error counts as no claim
        return False


_INPLACE_SETITEM = None


def inplace_setitem() -> Any:
    """Our operator ``a[key] = value; return a``: a setitem and the ``copy_`` back into ``a``, folded."""
    global _INPLACE_SETITEM
    if _INPLACE_SETITEM is None:

        def meta(a, key, value, grad_enabled):
            return TensorProxy(like=a)

        def setitem_(a, key, value, grad_enabled):
            if grad_enabled and a.is_leaf and a.requires_grad:
                raise RuntimeError("a leaf Variable that requires grad is being used in an in-place operation.")
            a[key] = value
            return a

        _INPLACE_SETITEM = guard_executor().register_operator("inplace_setitem", meta=meta, fn=setitem_)
    return _INPLACE_SETITEM


def python_callable_from_symbols(
    name: str,
    bsyms: Sequence[BoundSymbol],
    inputs: Sequence[Proxy],
    outputs: Sequence[Proxy],
    *,
    free_values: bool = False,
) -> Callable:
    """A Python function running ``bsyms`` from ``inputs`` to ``outputs``; with ``free_values``, each value
    is deleted after its last use.

    Built the way Thunder's CUDA-graph transform builds its region functions
    (``CUDAGraphRunner.make_python_callable_from_symbols``).
    """
    if free_values:
        bsyms = _del_last_used(list(bsyms), list(outputs))

    def region_fn():
        pass

    region_fn.__signature__ = Signature([Parameter(p.name, Parameter.POSITIONAL_ONLY) for p in inputs])
    region_fn.__name__ = name
    trace = TraceCtx(region_fn)
    trace.args = list(inputs)
    trace.kwargs = {}
    trace.bound_symbols = [*bsyms, prims.python_return.bind(list(outputs), output=None)]
    return trace.python_callable()


def guard_call(name: str, fn: Callable[[], Any], outputs: Sequence[Proxy], body: Sequence[BoundSymbol]) -> BoundSymbol:
    """A call, taking no argument, of ``fn`` by the guard's own executor, giving ``outputs``; ``body`` holds
    the bound symbols it stands for (shown in the trace, run by ``fn``)."""
    outputs = tuple(outputs)

    def meta() -> tuple[Proxy, ...]:
        return outputs  # takes nothing, gives the same proxies, as Thunder's temporary fusion operations do

    sym = Symbol(name=name, meta=meta, executor=guard_executor())
    return BoundSymbol(sym, (), {}, outputs, tuple(body), _call_ctx={name: fn})
