"""Thunder's alias updates: after an in-place op, Thunder (``insert_alias_updates``, before its grad transform)
renames each tensor that may share memory with the one written through ``prims.update_aliases``, so that later
reads follow the write. One read here, and rebuilt with fewer of its tensors."""

from __future__ import annotations

from collections.abc import Sequence

from thunder.core import prims
from thunder.core.proxies import TensorProxy
from thunder.core.symbol import BoundSymbol
from thunder.core.trace import TraceCtx

from .traces import is_comment_or_del

__all__ = ["alias_update_keeping", "is_alias_update", "op_before_each", "trace_requires_grad"]


def is_alias_update(bsym: BoundSymbol) -> bool:
    """Whether ``bsym`` is Thunder's ``prims.update_aliases``."""
    return bsym.sym.id == prims.PrimIDs.UPDATE_ALIASES


def op_before_each(bsyms: Sequence[BoundSymbol]) -> list[BoundSymbol | None]:
    """For each op of ``bsyms``, the last op before it that is neither an alias update nor a comment or ``del``:
    for an alias update, the op whose write it follows (a view, where the write came earlier)."""
    before: list[BoundSymbol | None] = []
    last: BoundSymbol | None = None
    for bsym in bsyms:
        before.append(last)
        if not is_alias_update(bsym) and not is_comment_or_del(bsym):
            last = bsym
    return before


def alias_update_keeping(bsym: BoundSymbol, keep: Sequence[int]) -> BoundSymbol:
    """The alias update ``bsym`` for the tensors at positions ``keep`` only (their new names as they were)."""
    (aliases,) = bsym.args
    return bsym.from_bsym(args=(tuple(aliases[i] for i in keep),), output=tuple(bsym.output[i] for i in keep))


def trace_requires_grad(trace: TraceCtx) -> bool:
    """Whether Thunder will differentiate ``trace``: one of its tensor arguments requires grad (Thunder's test)."""
    return any(isinstance(a, TensorProxy) and a.requires_grad for a in trace.args)
