"""Hoisting: the part of a trace that does not depend on its inputs runs once per compiled program.

Thunder specialises each compiled trace on its inputs' shapes, dtypes and devices, so a tensor built
only from factory ops (``full``, ``arange``, ``zeros``, tensor constants) and what is computed from
them alone is the same on every call of that trace. litgpt's Mistral builds its sliding-window mask
that way each call: ``torch.full((T, T), -inf)`` and then one in-place setitem per row, 512 per layer.

The pass finds that work, takes it out of the trace and puts one call of a small operator in its
place; on the first call of the compiled program the operator runs the same bound symbols (the same
executors) and keeps their outputs, later calls get the kept tensors. Never hoisted: random ops, ops
that sync or talk to other processes, unknown torch functions, anything that reads an input or a
parameter (they are inputs of the trace), and any tensor that could be written after hoisting: the
trace's returned tensors and their views (a caller may write them), tensors an op outside the
hoisted part writes, and tensors read before a hoisted in-place write. Tensors saved for the
backward are hoisted (the backward trace is checked for writes to them, see :func:`check_backward`).

Inside a fusion region, the input-independent ops can be taken out too: the region is rebuilt
without them when ``may_rebuild`` allows it (the guard's ``exact_only`` rule: a rebuilt reduction
may round differently, and so may cos or pow where the executor's code for them depends on the fusion
around them, ``ops.hoist_keeps_bits``), or left whole when only its input-independent outputs are needed
by the hoisted part (they are then computed once more, by a region of the same executor, in the hoisted
call). On an executor that computes each element alike wherever an op sits (``ops.cut_can_move``:
nvFuser), the cut is placed so that no value handed across it is one the whole fusion may not have
stored as it is (``ops.cut_hazards``): a narrowing conversion (``cos.to(bfloat16)``, which the fusion
may skip before widening again) or a product (which it may contract with the addition that reads it)
stays with the rest of the region, which gets the value it is computed from; elsewhere such a value
makes ``may_rebuild`` refuse. Where ``may_rebuild`` refuses, the work is still reported (not hoisted),
with the refusal and the option that would hoist it.

A piece of hoisted work that computes exactly what an earlier one does (litgpt builds the same mask
in every layer) hands out the earlier one's tensors. Nothing moves across a communication op: each
stretch between two of them gets its own hoisted call.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from .. import _thunder as th
from ..ops import aliased_outputs, communication_segments, may_alias_inputs, writes_inputs
from .hoist_runtime import HOISTED_NAME, HoistedValues, hoisted_call
from .hoist_share import Signature, share_identical
from .hoist_units import (
    Groups,
    Hoist,
    MayRebuild,
    Refusal,
    Unit,
    alias_groups,
    analyse,
    components,
    reaches_input_write,
    readers_after,
    tensor_names,
)

__all__ = ["Hoist", "HoistLedger", "MayRebuild", "Refusal", "check_backward", "hoist_constants"]


def _describe(
    piece: list[int], units: dict[int, Unit], readers: dict[str, list[int]], groups: Groups, saved: set[str]
) -> Hoist:
    boundary = [p for pos in piece for p in units[pos].outs if p.name in readers]
    # Bytes kept: the tensors the piece allocates (views and in-place results share them) in the
    # memory groups of what it hands out.
    allocated: dict[str, int] = defaultdict(int)
    for pos in piece:
        unit = units[pos]
        shared = set(aliased_outputs(unit.bsym)) if th.subsymbols(unit.bsym) else set()
        for p in unit.outs:
            if p.name not in shared and (th.subsymbols(unit.bsym) or not may_alias_inputs(unit.bsym)):
                allocated[groups.find(p.name)] += th.tensor_nbytes(p) or 0
    nbytes = sum(allocated[g] for g in {groups.find(p.name) for p in boundary})
    ops = []
    for pos in piece:
        unit = units[pos]
        inner = th.fusion_body(unit.bsym)
        ops.extend([th.op_name(s) for s in inner] if unit.kind != "op" else [th.op_name(unit.bsym)])
    saved_groups = {groups.find(p.name) for p in boundary}
    return Hoist(
        ops=ops,
        outputs=[p.name for p in boundary],
        nbytes=nbytes,
        calls_saved=sum(1 for pos in piece if units[pos].leaves_trace),
        fused_ops_saved=sum(units[pos].fused_ops for pos in piece if units[pos].split),
        regions=[units[pos].bsym.sym.name for pos in piece if units[pos].kind == "region"],
        split=[units[pos].bsym.sym.name for pos in piece if units[pos].split],
        duplicated=[units[pos].bsym.sym.name for pos in piece if units[pos].kind == "part" and not units[pos].split],
        saved_for_backward=sorted(n for n in saved if groups.find(n) in saved_groups),
    )


def hoist_constants(
    trace: th.TraceCtx,
    may_rebuild: MayRebuild,
    max_bytes: int,
    metadata_ops: frozenset[str] = frozenset(),
) -> tuple[th.TraceCtx, list[Hoist], dict[str, HoistedValues]]:
    """``trace`` with its input-independent work replaced by a call that computes it once.

    Returns the new trace, one :class:`Hoist` per connected piece of such work that would save an op
    per call, in trace order (hoisted, or kept with the reason: its values reach an in-place write of
    an input, it spans a communication op, or its tensors would pass ``max_bytes``), then one kept piece
    for each piece of work that only ``may_rebuild``'s refusal keeps in the trace (with the refusal and
    the option that would hoist it), and the cache of each hoisted call by name (empty when nothing was
    hoisted). Pieces are taken by ops saved, most first, while their kept bytes fit under ``max_bytes``;
    a piece that computes exactly what an earlier one does shares its tensors. Nothing moves across a
    communication op: the pieces between two of them get a hoisted call of their own there.
    """
    bsyms = list(trace.bound_symbols)
    metadata_ops = frozenset(metadata_ops)
    refusals: dict[str, list[Refusal]] = defaultdict(list)

    def recorded(fusion: th.BoundSymbol, body: list[th.BoundSymbol], crossing: Sequence[th.Proxy]) -> Refusal | None:
        refusal = may_rebuild(fusion, body, crossing)
        if refusal is not None and refusal not in refusals[fusion.sym.name]:
            refusals[fusion.sym.name].append(refusal)
        return refusal

    found = analyse(trace, bsyms, recorded, metadata_ops)
    saved = set(th.returned_names(trace)[1])
    results: list[Hoist] = []
    pieces: list[tuple[list[int], Hoist]] = []
    if found is not None:
        units, groups, chosen = found
        readers = readers_after(bsyms, units, chosen)
        inputs = {groups.find(p.name) for p in th.trace_inputs(trace, unpacked=True)}
        segments = communication_segments(bsyms)
        for piece in components(units, chosen, groups):
            described = _describe(piece, units, readers, groups, saved)
            if not (described.ops_saved and described.outputs):
                continue
            described.segment = segments[piece[0]]
            if any(segments[pos] != described.segment for pos in piece):
                described.hoisted, described.not_taken = False, "communication"
            elif reaches_input_write(bsyms, units, chosen, set(described.outputs), groups, inputs):
                described.hoisted, described.not_taken = False, "input_write"
            pieces.append((piece, described))
        results = [d for _, d in pieces]
    if refusals:
        results += _refused(trace, bsyms, set() if found is None else found[2], refusals, metadata_ops)
    if not pieces:
        return trace, results, {}
    signatures = share_identical(pieces, units)
    kept = _within_budget(pieces, max_bytes)
    if not kept:
        return trace, results, {}
    new, caches = _rewrite(trace, bsyms, units, pieces, kept, signatures, segments)
    return new, results, caches


def _refused(
    trace: th.TraceCtx,
    bsyms: list[th.BoundSymbol],
    done: set[int],
    refusals: dict[str, list[Refusal]],
    metadata_ops: frozenset[str],
) -> list[Hoist]:
    """The work that would be hoisted were ``may_rebuild`` to allow everything, less what is (``done``): one kept
    piece each, with the refusals of its regions and the option setting that would hoist it."""
    found = analyse(trace, bsyms, lambda fusion, body, crossing: None, metadata_ops)
    if found is None:
        return []
    units, groups, chosen = found
    readers = readers_after(bsyms, units, chosen)
    saved = set(th.returned_names(trace)[1])
    kept = []
    for piece in components(units, chosen, groups):
        left = [pos for pos in piece if pos not in done]
        why = list(dict.fromkeys(r for pos in left for r in refusals.get(bsyms[pos].sym.name, ())))
        if not why:
            continue
        described = _describe(left, units, readers, groups, saved)
        if not (described.ops_saved and described.outputs):
            continue
        described.hoisted = False
        described.option = ", ".join(dict.fromkeys(r.option for r in why))
        described.refused = why
        kept.append(described)
    return kept


def _within_budget(pieces: list[tuple[list[int], Hoist]], max_bytes: int) -> set[int]:
    """The pieces taken (by index), by ops saved (most first) while their bytes fit; a piece sharing
    another's tensors is taken with it. The others are marked not hoisted with the reason."""
    left = max_bytes
    kept: set[int] = set()
    order = sorted(range(len(pieces)), key=lambda i: (-pieces[i][1].ops_saved, pieces[i][1].nbytes, i))
    for i in order:
        described = pieces[i][1]
        if not described.hoisted or described.same_as is not None:
            continue
        if described.nbytes <= left:
            left -= described.nbytes
            kept.add(i)
        else:
            described.hoisted, described.not_taken, described.budget_left = False, "budget", left
    for i, (_, described) in enumerate(pieces):
        if described.same_as is not None:
            if described.same_as in kept:
                kept.add(i)
            else:
                described.hoisted, described.not_taken = False, "same_as"
    return kept


def _rewrite(
    trace: th.TraceCtx,
    bsyms: list[th.BoundSymbol],
    units: dict[int, Unit],
    pieces: list[tuple[list[int], Hoist]],
    kept: set[int],
    signatures: dict[int, Signature],
    segments: list[int],
) -> tuple[th.TraceCtx, dict[str, HoistedValues]]:
    """The trace with the kept pieces run by hoisted calls: one per stretch between communication ops,
    placed before the first op that reads it (at the latest where its stretch ends).

    A piece sharing another's tensors is not run: the call hands out the other's tensors under its names.
    """
    gone = {pos for i in kept for pos in pieces[i][0]}
    readers = readers_after(bsyms, units, gone)
    calls: dict[int, th.BoundSymbol] = {}
    caches: dict[str, HoistedValues] = {}
    for segment in sorted({pieces[i][1].segment for i in kept}):
        mine = sorted(i for i in kept if pieces[i][1].segment == segment)
        name = HOISTED_NAME if not caches else f"{HOISTED_NAME}_{len(caches)}"
        run = sorted(pos for i in mine if pieces[i][1].same_as is None for pos in pieces[i][0])
        outputs: list[th.Proxy] = []
        returns: list[th.Proxy] = []
        for i in mine:
            piece, described = pieces[i]
            described.call = name
            for p in (p for pos in piece for p in units[pos].outs if p.name in readers):
                outputs.append(p)
                same = described.same_as
                returns.append(p if same is None else signatures[i].counterpart(signatures[same], p))
        call, caches[name] = hoisted_call(name, [units[pos].bsym for pos in run], outputs, returns)
        end = next((j for j, s in enumerate(segments) if s > segment), len(bsyms) - 1)
        calls[min([end, *(readers[p.name][0] for p in outputs)])] = call
    new: list[th.BoundSymbol] = []
    for j, b in enumerate(bsyms):
        if j in calls:
            new.append(calls[j])
        if th.is_comment_or_del(b):
            continue
        unit = units.get(j) if j in gone else None
        if unit is None or (unit.kind == "part" and not unit.split):
            new.append(b)
        elif unit.kind == "part" and unit.rest is not None:
            new.append(unit.rest)
    return th.new_trace_like(trace, new), caches


class HoistLedger:
    """What one compilation's forward hoisted and saved for its backward, for :func:`check_backward`."""

    def __init__(self) -> None:
        self.saved: dict[str, HoistedValues] = {}

    def forward_done(self, saved: dict[str, HoistedValues]) -> None:
        self.saved = dict(saved)

    def take(self) -> dict[str, HoistedValues]:
        saved, self.saved = self.saved, {}
        return saved


def check_backward(
    trace: th.TraceCtx, saved: dict[str, HoistedValues], metadata_ops: frozenset[str] = frozenset()
) -> list[str]:
    """Turn off the cache of every hoisted tensor (saved for the backward) that the backward trace may
    write, or that shares memory with a tensor it may write; return their names."""
    present = {p.name for b in trace.bound_symbols for p in b.flat_proxy_outs} & set(saved)
    if not present:
        return []
    groups = alias_groups(trace.bound_symbols, frozenset(metadata_ops))
    written = {
        groups.find(name)
        for b in trace.bound_symbols
        if not th.is_plumbing(b) and writes_inputs(b)
        for name in tensor_names(b.flat_proxy_args)
    }
    hit = sorted(n for n in present if groups.find(n) in written)
    for name in hit:
        saved[name].disable()
    return hit
