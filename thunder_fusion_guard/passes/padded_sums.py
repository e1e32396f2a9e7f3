"""A sum of zero-padded pieces that tile a tensor, rebuilt as one concatenation.

Thunder's backward of slicing pads each slice's gradient back to the whole tensor and adds the pads up: the
gradient of e3nn's per-edge weights, eleven slices of a [9808, 17408] tensor, is ten adds of the whole tensor,
cut into regions at the matmuls between them, and each cut writes and reads all of it. Where the pieces lie side
by side along one dim and cover it, each element of the sum is one piece's value plus zeros, so
``cat(piece + 0.0 for each piece)`` has the same bits (a -0.0 becomes +0.0 in both, every other value passes
through both) and writes the tensor once, in the region of the last add: the add runs where each piece is made,
so an executor that writes each piece of a ``cat`` into its slice (Inductor) adds no pass over the whole tensor.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from .. import _thunder as th
from ..decisions import Decision, Details
from .context import PassContext, may_change
from .records import op_decision

Position = tuple[int, int]  # (a fusion call's index in the trace, an op's index in its body)


@dataclass(frozen=True)
class PaddedSum:
    """One sum of padded pieces concatenated: its result, how many pieces, the ops it replaced and the regions
    rebuilt (the one computing it first)."""

    output: str
    pieces: int
    ops: tuple[str, ...]
    regions: tuple[str, ...]
    executor: str
    ops_saved: int  # the ops replaced less those computing the concatenation


@dataclass(frozen=True)
class _Chain:
    """A sum of pads: the position of its last add, of its other adds, of its pads (in the order they tile)."""

    root: Position
    adds: frozenset[Position]
    pads: tuple[Position, ...]
    casts: frozenset[Position] = frozenset()  # widening conversions of the pads, as nvFuser's regions add in fp32

    @property
    def ops(self) -> frozenset[Position]:
        return self.adds | self.casts | set(self.pads)


def concatenate_padded_sums(
    trace: th.TraceCtx, may_rebuild: Callable[[th.BoundSymbol], bool], min_regions: int = 2
) -> tuple[th.TraceCtx, list[PaddedSum]]:
    """``trace`` with each sum of zero pads that tile their result, spread over ``min_regions`` or more of the fusion
    regions ``may_rebuild`` allows (each cut writes and reads the whole tensor), computed as
    ``cat(piece + 0.0 for each piece)`` where its last add was. Each pad and each add but the last must be read by
    the next add only; the regions that held them are rebuilt (a piece made in one region and now read in another
    becomes its output; a region left with no op is dropped)."""
    bsyms = list(trace.bound_symbols)
    ops: dict[Position, th.BoundSymbol] = {}
    made_at: dict[str, Position] = {}
    readers: Counter[str] = Counter()
    at_top = {p.name for p in trace.args if isinstance(p, th.Proxy)}  # the values any op of the trace may read
    outside: dict[str, th.BoundSymbol] = {}  # the ops outside fusion regions, by what they make
    for i, b in enumerate(bsyms):
        if th.is_comment_or_del(b):
            continue
        at_top.update(p.name for p in b.flat_proxy_outs)
        if not th.is_fusion(b):
            outside.update((p.name, b) for p in b.flat_proxy_outs)
        inside = th.is_fusion(b) and may_rebuild(b)
        for j, op in enumerate(th.subsymbols(b) if inside else [b]):
            for name in {p.name for p in op.flat_proxy_args}:
                readers[name] += 1
            if inside:
                ops[(i, j)] = op
                made_at.update((p.name, (i, j)) for p in op.flat_proxy_outs)
    chains: list[tuple[_Chain, list[th.BoundSymbol]]] = []
    taken: set[Position] = set()
    for position in sorted(ops, reverse=True):  # the last add of a chain before its others
        if position in taken:
            continue
        chain = _chain(position, ops, made_at, readers)
        if chain is None or taken & chain.ops or len({i for i, _ in chain.ops}) < min_regions:
            continue  # inside one region the partial sums never leave the fuser: nothing to save, a rebuild to risk
        added = _concatenation(trace, ops, chain, _merged(chain, ops, made_at, at_top, outside))
        if not all(th.executor_claims(bsyms[chain.root[0]], b) for b in added):
            continue  # the region's executor would not run the concatenation: the sum stays as it is
        taken |= chain.ops
        chains.append((chain, added))
    if not chains:
        return trace, []
    return _rebuilt(trace, bsyms, ops, chains, made_at)


def _chain(
    root: Position, ops: dict[Position, th.BoundSymbol], made_at: dict[str, Position], readers: Counter[str]
) -> _Chain | None:
    """The adds and pads of the sum whose last add is at ``root``, when its pads tile its result along one dim;
    None otherwise."""
    adds: set[Position] = set()
    casts: set[Position] = set()
    pads: list[Position] = []
    widened_pads = 0
    rounded_to: set = set()  # the dtypes partial sums are rounded to at a region's edge
    stack = [root]
    while stack:
        at = stack.pop()
        terms = th.plain_add(ops[at])
        if terms is None:
            return None
        adds.add(at)
        for term in terms:
            source = made_at.get(term.name)
            if source is None or readers[term.name] != 1:
                return None
            narrow = th.widened(ops[source])
            if narrow is None:
                if th.pad_piece(ops[source]) is not None:
                    pads.append(source)
                elif th.plain_add(ops[source]) is not None:
                    stack.append(source)
                else:
                    return None
                continue
            casts.add(source)  # converted to the sum's wider dtype (exact): a pad, or a partial sum rounded
            source = made_at.get(narrow.name)
            if source is None or readers[narrow.name] != 1:
                return None
            if th.pad_piece(ops[source]) is not None:
                pads.append(source)
                widened_pads += 1
                continue
            # A partial sum rounded to the pieces' dtype where it leaves a region (nvFuser's regions hand bf16 on):
            # each of its elements is one piece's value or zero, so the rounding is exact (checked below).
            partial = th.float_conversion(ops[source])
            inner = made_at.get(partial.name) if partial is not None else None
            if inner is None or readers[partial.name] != 1 or th.plain_add(ops[inner]) is None:
                return None
            casts.add(source)
            rounded_to.add(ops[source].output.dtype)
            stack.append(inner)
    pieces = sorted(((th.pad_piece(ops[p]), p) for p in pads), key=lambda pair: pair[0].start)
    out = ops[root].output
    if len({piece.dim for piece, _ in pieces}) != 1 or len({piece.tensor.dtype for piece, _ in pieces}) != 1:
        return None
    if pieces[0][0].tensor.dtype != out.dtype and widened_pads != len(pieces):
        return None  # pieces of another dtype than the sum's reach it only through widening conversions
    if rounded_to - {pieces[0][0].tensor.dtype}:
        return None  # a partial sum rounded to another dtype than the pieces' may have lost bits
    dim, start = pieces[0][0].dim, 0
    for piece, _ in pieces:
        shape = list(piece.tensor.shape)
        if piece.start != start or len(shape) != len(out.shape):
            return None
        if shape[:dim] + shape[dim + 1 :] != list(out.shape[:dim]) + list(out.shape[dim + 1 :]):
            return None
        start += shape[dim]
    if start != out.shape[dim]:
        return None
    return _Chain(root, frozenset(adds), tuple(p for _, p in pieces), frozenset(casts))


def _merged(
    chain: _Chain,
    ops: dict[Position, th.BoundSymbol],
    made_at: dict[str, Position],
    at_top: set[str],
    outside: dict[str, th.BoundSymbol],
) -> list[th.Proxy | th.SliceRange]:
    """``chain``'s pieces in order, each run of slices side by side of one source (the gradient of a ``cat``, as
    e3nn's irreps make it) taken as one slice of it, where the source can be read where the concatenation runs."""
    dim = th.pad_piece(ops[chain.pads[0]]).dim
    runs: list[tuple[th.SliceRange | None, list[th.Proxy]]] = []  # (the run's slice, the pieces it joins)
    for position in chain.pads:
        piece = th.pad_piece(ops[position]).tensor
        made = ops[made_at[piece.name]] if piece.name in made_at else outside.get(piece.name)
        cut = th.slice_range(made) if made is not None else None
        readable = cut is not None and (
            cut.source.name in at_top or made_at.get(cut.source.name, (-1,))[0] == chain.root[0]
        )
        last = runs[-1][0] if runs else None
        if not readable or cut.dim != dim:
            runs.append((None, [piece]))
        elif last is not None and last.source.name == cut.source.name and last.stop == cut.start:
            runs[-1] = (th.SliceRange(last.source, dim, last.start, cut.stop), [*runs[-1][1], piece])
        else:
            runs.append((cut, [piece]))
    return [cut if cut is not None and len(joined) > 1 else joined[0] for cut, joined in runs]


def _concatenation(
    trace: th.TraceCtx,
    ops: dict[Position, th.BoundSymbol],
    chain: _Chain,
    pieces: list[th.Proxy | th.SliceRange],
) -> list[th.BoundSymbol]:
    """The ops computing ``chain``'s result as ``cat(piece + 0.0 for each piece)``."""
    return th.concatenation(trace, pieces, th.pad_piece(ops[chain.pads[0]]).dim, ops[chain.root].output)


def _rebuilt(
    trace: th.TraceCtx,
    bsyms: list[th.BoundSymbol],
    ops: dict[Position, th.BoundSymbol],
    chains: list[tuple[_Chain, list[th.BoundSymbol]]],
    made_at: dict[str, Position],
) -> tuple[th.TraceCtx, list[PaddedSum]]:
    """``trace`` with each chain computed by its concatenation in place of its last add, the regions that held
    its ops rebuilt (a piece made in one and now read in another becomes its output; an emptied one dropped)."""
    gone = {p for chain, _ in chains for p in chain.ops}
    at_root = {chain.root: added for chain, added in chains}
    needed_elsewhere = {  # what a concatenation reads that another region makes
        value.name
        for chain, added in chains
        for b in added
        for value in b.flat_proxy_args
        if made_at.get(value.name, chain.root)[0] != chain.root[0]
    }
    new: list[th.BoundSymbol | None] = list(bsyms)
    for i in sorted({i for i, _ in gone}):
        body: list[th.BoundSymbol] = []
        for j, op in enumerate(th.subsymbols(bsyms[i])):
            if (i, j) in at_root:
                body.extend(at_root[(i, j)])
            elif (i, j) not in gone:
                body.append(op)
        new[i] = _region(bsyms[i], body, needed_elsewhere) if body else None
    done = []
    for chain, added in chains:
        regions = tuple(dict.fromkeys(bsyms[i].sym.name for i, _ in sorted(chain.ops)))
        names = tuple(th.op_name(ops[p]) for p in sorted(chain.ops))
        executor = th.executor_name(bsyms[chain.root[0]])
        output = ops[chain.root].output.name
        done.append(PaddedSum(output, len(chain.pads), names, regions, executor, len(names) - len(added)))
    return th.new_trace_like(trace, [b for b in new if b is not None]), done


def _region(fusion: th.BoundSymbol, body: list[th.BoundSymbol], needed_elsewhere: set[str]) -> th.BoundSymbol:
    """``fusion`` rebuilt to run ``body``: its inputs what the body reads and does not make (in the order they
    came), its outputs those it still makes and the pieces another region now reads."""
    made = {p.name for b in body for p in b.flat_proxy_outs}
    read = th.unique_proxies(p for b in body for p in b.flat_proxy_args if p.name not in made)
    names = {p.name for p in read}
    inputs = th.unique_proxies([*(p for p in fusion.flat_proxy_args if p.name in names), *read])
    outputs = th.unique_proxies(
        [
            *(p for p in fusion.flat_proxy_outs if p.name in made),
            *(p for b in body for p in b.flat_proxy_outs if p.name in needed_elsewhere),
        ]
    )
    return th.rebuild_fusion(fusion, body, inputs, outputs)


def padded_sum_pass(trace: th.TraceCtx, context: PassContext) -> tuple[th.TraceCtx, list[Decision]]:
    """Concatenate the sums of zero-padded pieces that tile their result (:func:`concatenate_padded_sums`)."""
    new, sums = concatenate_padded_sums(trace, may_change(context.options))
    applied = not context.options.report_only
    made = []
    for s in sums:
        facts = {"count": s.pieces, "into": s.regions[-1] if s.regions else s.output, "ops_saved": s.ops_saved}
        details = Details(output=s.output, regions=list(s.regions), ops_saved_per_call=s.ops_saved)
        made.append(
            op_decision(
                context.where,
                s.regions[-1] if s.regions else s.output,
                s.executor,
                list(s.ops),
                "fold",
                "padded_sum_concatenated",
                facts,
                details,
                applied=applied,
            )
        )
    return (trace if context.options.report_only else new), made
