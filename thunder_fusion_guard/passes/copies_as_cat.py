"""Copies into slices of a new zero tensor, computed out of place as one concatenation.

``out = x.new_zeros(...); out.narrow(d, a, n).copy_(src)`` (e3nn's ``Extract``, inside ``nn.Gate``, written in a
function) is traced by Thunder 0.2.6 as copies into views, and its grad transform loses their gradient: the
program returns eager's values and a wrong gradient, without an error. Where every write into the new tensor is
such a copy, into slices along one dim that do not overlap, and nothing reads the tensor before the last one,
``cat`` of the sources, with zeros in the gaps, is the same tensor: each element the value copied there or zero,
the same bits; Thunder differentiates ``cat``. This pass runs on the computation trace before Thunder
differentiates it (``transform_traces_pre_prologue``), only where it will (a tensor argument requires grad).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from itertools import pairwise

from .. import _thunder as th
from ..decisions import Decision, Details
from ..ops import writes_inputs
from .context import TraceContext
from .records import op_decision


@dataclass(frozen=True)
class CopiesJoined:
    """One new zero tensor computed as a concatenation: its name, the copies that wrote it and the user's line."""

    tensor: str
    copies: int
    source: str | None


_BASE = -1  # the role of the tensor's own names (a view's role is its index)


@dataclass
class _Family:
    """A new zero tensor and the names Thunder gives it and its views, followed through the trace: which views
    are written by a copy and which are only read, and where the tensor is first read."""

    base: th.TensorProxy
    start: int  # the op making it
    roles: dict[str, int] = field(default_factory=dict)  # name -> view index, or _BASE
    defined: dict[str, int] = field(default_factory=dict)  # name -> index of the op giving it
    proxies: dict[str, th.TensorProxy] = field(default_factory=dict)
    views: list[th.Span] = field(default_factory=list)
    view_ops: list[int] = field(default_factory=list)
    written: dict[int, tuple[int, th.TensorProxy]] = field(default_factory=dict)  # view -> (copy's index, source)
    updates: dict[int, tuple[tuple, tuple]] = field(default_factory=dict)  # its alias updates: tensors, new names
    first_read: int | None = None  # the first op reading the tensor or a view no copy writes

    def name(self, proxy: th.TensorProxy, role: int, at: int) -> None:
        self.roles[proxy.name], self.defined[proxy.name], self.proxies[proxy.name] = role, at, proxy

    @property
    def last_copy(self) -> int:
        return max(i for i, _ in self.written.values())

    @property
    def first(self) -> float:
        """The index of the first read (infinite where nothing reads it)."""
        return math.inf if self.first_read is None else self.first_read

    def removed(self) -> set[int]:
        """The ops the concatenation replaces: the zeros, the written views, the copies, the alias updates before
        the first read."""
        ops = {self.start, *(self.view_ops[k] for k in self.written), *(i for i, _ in self.written.values())}
        return ops | {i for i in self.updates if i < self.first}

    def after_first_read(self, result: th.TensorProxy) -> tuple[dict[int, list[int]], dict[str, th.TensorProxy]]:
        """The alias updates from the first read on, each with the positions it keeps (the other tensors'), and the
        names to replace: the tensor's before its first read by ``result``, each later one by the one it renames
        (nothing writes into the family then: the updates only order reads)."""
        renames: dict[str, th.TensorProxy] = {
            n: result for n, r in self.roles.items() if r == _BASE and self.defined[n] < self.first
        }
        kept: dict[int, list[int]] = {}
        for i, (aliases, outs) in self.updates.items():
            if i < self.first:
                continue
            kept[i] = [j for j, a in enumerate(aliases) if a.name not in self.roles]
            for a, o in zip(aliases, outs, strict=True):
                if a.name in self.roles:
                    renames[o.name] = renames.get(a.name, a)
        return kept, renames


def join_copies(trace: th.TraceCtx) -> tuple[th.TraceCtx, list[CopiesJoined]]:
    """``trace`` with each new zero tensor written only by copies into slices along one dim computed as ``cat``
    where its last copy was; ``trace`` itself where none is found or Thunder will not differentiate it."""
    if not th.trace_requires_grad(trace):
        return trace, []
    bsyms = list(trace.bound_symbols)
    done: list[tuple[_Family, int]] = []  # families joined, with their dim
    taken: set[int] = set()
    for i, bsym in enumerate(bsyms):
        zeros = th.new_zeros_of(bsym)
        family = _follow(bsyms, i, zeros) if zeros is not None else None
        dim = _dim(family) if family is not None else None
        touched = family.removed() | set(family.updates) if family is not None else set()
        if family is not None and dim is not None and not taken & touched:
            done.append((family, dim))
            taken |= touched
    if not done:
        return trace, []
    scratch = th.scratch_trace(trace)
    replaced: dict[int, list[th.BoundSymbol]] = {}
    removed: set[int] = set()
    trims: dict[int, list[int]] = {}
    renames: list[tuple[th.Proxy, th.Proxy]] = []
    joined: list[CopiesJoined] = []
    for family, dim in done:
        removed |= family.removed()
        pieces = sorted((family.views[k].start, src) for k, (_, src) in family.written.items())
        replaced[family.last_copy], result = th.joined_copies(scratch, family.base, dim, pieces)
        kept, names = family.after_first_read(result)
        trims.update(kept)
        renames += [(family.proxies[n], p) for n, p in names.items()]
        joined.append(CopiesJoined(family.base.name, len(family.written), th.source_line(bsyms[family.start])))
    new: list[th.BoundSymbol] = []
    for i, bsym in enumerate(bsyms):
        if i in replaced:
            new += replaced[i]
        elif i in trims:
            if trims[i]:
                new.append(th.swap_proxies(th.alias_update_keeping(bsym, trims[i]), renames))
        elif i not in removed:
            new.append(th.swap_proxies(bsym, renames))
    out = th.new_trace_like(trace, new)
    th.set_provenance(out, "FusionGuard: copies into slices of new zero tensors joined by cat")
    return out, joined


def _follow(bsyms: list[th.BoundSymbol], start: int, zeros: th.TensorProxy) -> _Family | None:
    """The family of ``zeros`` (made at ``start``) where every write into it is a copy into a view of it (or into
    all of it), each view written once, all before the tensor or a view no copy writes is first read, and only
    alias updates of the family alone come before that read; None otherwise."""
    family = _Family(zeros, start)
    family.name(zeros, _BASE, start)
    shared: set[str] = set()  # after the first read, the tensors Thunder's alias updates tie to the family
    for i in range(start + 1, len(bsyms)):
        bsym = bsyms[i]
        if th.is_comment_or_del(bsym):
            continue
        names = [p.name for p in bsym.flat_proxy_args]
        read = [n for n in names if n in family.roles]
        if th.is_alias_update(bsym) and (read or shared.intersection(names)):
            (aliases,) = bsym.args
            if family.first_read is None and len(read) != len(aliases):
                return None  # the tensor may share memory with another
            if family.first_read is not None:
                shared.update(names, (out.name for out in bsym.output))
            if not read:
                continue
            for alias, out in zip(aliases, bsym.output, strict=True):
                if alias.name in family.roles:
                    family.name(out, family.roles[alias.name], i)
            family.updates[i] = (tuple(aliases), tuple(bsym.output))
            continue
        if shared.intersection(names) and writes_inputs(bsym):
            return None  # after the first read, a write into memory the tensor may share
        if not read:
            continue
        roles = [family.roles[n] for n in read]
        span, copy = th.span_of(bsym), th.copy_into(bsym)
        if span is not None and roles == [_BASE]:
            family.name(bsym.output, len(family.views), i)
            family.views.append(span)
            family.view_ops.append(i)
            continue
        if copy is not None and len(read) == 1 and read[0] == copy[0].name and family.first_read is None:
            k = roles[0]
            if k == _BASE:  # into the whole tensor
                if family.views or zeros.ndim == 0:
                    return None
                k = len(family.views)
                family.views.append(th.Span(zeros, zeros.ndim - 1, 0, zeros.shape[-1]))
                family.view_ops.append(start)
            if k in family.written:
                return None
            family.written[k] = (i, copy[1])
            family.name(bsym.output, k, i)
            continue
        if any(r in family.written for r in roles) or writes_inputs(bsym):
            return None  # a view a copy writes, read; or an op that may write into the tensor
        if family.first_read is None:  # the tensor read, or a view no copy writes (read from its making)
            family.first_read = min([i, *(family.view_ops[r] for r in roles if r != _BASE)])
    if not family.written or (family.first_read is not None and family.first_read < family.last_copy):
        return None
    # Every view no copy writes is read as part of the concatenation: none may be made before the last copy.
    if any(family.view_ops[k] < family.last_copy for k in range(len(family.views)) if k not in family.written):
        return None
    # cat reads each source at the last copy: no other write may come between the first copy and it.
    copies = {i for i, _ in family.written.values()}
    if any(writes_inputs(bsyms[i]) for i in range(min(copies), family.last_copy) if i not in copies):
        return None
    return family


def _dim(family: _Family) -> int | None:
    """The one dim the views copies write slice, their slices not overlapping; None otherwise."""
    dims = {family.views[k].dim for k in family.written}
    if len(dims) != 1:
        return None
    (dim,) = dims
    spans = sorted((family.views[k].start, family.views[k].stop) for k in family.written)
    if spans[0][0] < 0 or spans[-1][1] > family.base.shape[dim]:
        return None
    if any(a[1] > b[0] for a, b in pairwise(spans)):
        return None
    return dim


def copies_joined_decisions(where: TraceContext, joined: list[CopiesJoined], applied: bool) -> list[Decision]:
    """One decision (action ``rescue``) for each new zero tensor computed as a concatenation."""
    made = []
    for j in joined:
        details = Details(tensor=j.tensor, copies=j.copies)
        if j.source:
            details["source"] = j.source
        facts = {"name": j.tensor, "count": j.copies}
        made.append(
            op_decision(where, j.tensor, "torch", ["copy_"], "rescue", "copies_joined", facts, details, applied=applied)
        )
    return made
