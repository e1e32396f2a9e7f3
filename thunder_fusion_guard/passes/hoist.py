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
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from .. import _thunder as th
from ..ops import (
    aliased_outputs,
    communication_segments,
    cut_can_move,
    cut_hazards,
    hoistable,
    may_alias_inputs,
    writes_inputs,
)
from .hoist_runtime import HOISTED_NAME, HoistedValues, hoisted_call
from .rewrite import readers as readers_map
from .rewrite import unique_proxies


@dataclass(frozen=True)
class Refusal:
    """Why ``may_rebuild`` refused, and the option setting under which it would not (``exact_only=False``)."""

    why: str
    option: str


# may_rebuild(fusion, body, crossing): None where the pass may rebuild ``fusion`` with ``body`` (empty: move it
# whole), where ``crossing`` are the values ``body`` hands to, or takes from, the other piece of a split region;
# otherwise why not.
MayRebuild = Callable[[th.BoundSymbol, list[th.BoundSymbol], Sequence[th.Proxy]], "Refusal | None"]


@dataclass
class _Unit:
    """Something the hoisted call could run: an op outside fusions, a whole region, or the
    input-independent part of a region (``part``), with the region left (``rest``) if it is split."""

    position: int
    kind: str  # "op", "region" or "part"
    bsym: th.BoundSymbol
    reads: list[str]
    outs: list[th.Proxy]
    split: bool = False
    rest: th.BoundSymbol | None = None
    fused_ops: int = 0

    @property
    def leaves_trace(self) -> bool:
        """Whether the original bound symbol is gone from the trace once this unit is hoisted."""
        return self.kind != "part" or (self.split and self.rest is None)


@dataclass
class Hoist:
    """One connected piece of input-independent work: hoisted, or kept (``hoisted=False``) and why."""

    ops: list[str]
    outputs: list[str]
    nbytes: int
    calls_saved: int
    fused_ops_saved: int
    hoisted: bool = True
    reason: str = ""
    regions: list[str] = field(default_factory=list)
    split: list[str] = field(default_factory=list)
    duplicated: list[str] = field(default_factory=list)
    saved_for_backward: list[str] = field(default_factory=list)
    same_as: int | None = None  # index (in trace order) of an identical piece whose tensors it shares
    option: str = ""  # for work ``may_rebuild`` refused: the option setting that would hoist it
    call: str = ""  # the hoisted call that hands out its tensors
    segment: int = 0  # how many communication ops come before it in the trace

    @property
    def ops_saved(self) -> int:
        return self.calls_saved + self.fused_ops_saved


class _Groups:
    """Union-find over proxy names: tensors that may share memory."""

    def __init__(self) -> None:
        self.parent: dict[str, str] = {}

    def find(self, name: str) -> str:
        root = name
        while self.parent.get(root, root) != root:
            root = self.parent[root]
        while self.parent.get(name, name) != root:
            self.parent[name], name = root, self.parent[name]
        return root

    def union(self, a: str, b: str) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[ra] = rb


def _tensor_names(proxies: Iterable[th.Proxy]) -> list[str]:
    return [p.name for p in proxies if isinstance(p, th.TensorProxy)]


def _alias_groups(bsyms: Iterable[th.BoundSymbol], metadata_ops: frozenset[str]) -> _Groups:
    groups = _Groups()
    for b in bsyms:
        if th.is_plumbing(b):
            continue
        if th.subsymbols(b):
            for out, ins in aliased_outputs(b, metadata_ops).items():
                for name in ins:
                    groups.union(out, name)
        elif may_alias_inputs(b, metadata_ops):
            for out in _tensor_names(b.flat_proxy_outs):
                for name in _tensor_names(b.flat_proxy_args):
                    groups.union(out, name)
    return groups


def _region_part(
    fusion: th.BoundSymbol,
    position: int,
    constant: set[str],
    read_outside: Callable[[str], bool],
    may_rebuild: MayRebuild,
) -> _Unit | None:
    """The input-independent part of a region some of whose inputs are not, if it can be taken out.

    Split: the region is rebuilt without the part, which hands it what it still needs (never a value the
    whole fusion may not have stored as it is: :func:`_cut`). Otherwise, when the hoisted work outside needs
    some of the region's input-independent outputs, the ops making them are run once more in the hoisted
    call and the region is left whole.
    """
    body = th.fusion_body(fusion)
    known = {p.name for p in fusion.flat_proxy_args if p.name in constant}
    whole_part: list[th.BoundSymbol] = []
    for s in body:
        outs = s.flat_proxy_outs
        if outs and all(p.name in known for p in s.flat_proxy_args) and hoistable(s):
            if not _fixed(outs):
                return None
            whole_part.append(s)
            known.update(p.name for p in outs)
    if not whole_part or any(writes_inputs(s) for s in _others(body, whole_part)):
        return None
    region_outs = list(fusion.flat_proxy_outs)
    part = _cut(body, whole_part) if cut_can_move(th.executor_name(fusion)) else whole_part
    rest = _others(body, part)
    made = {p.name for s in part for p in s.flat_proxy_outs}
    inside = unique_proxies(p for s in rest for p in s.flat_proxy_args if p.name in made)
    outside = [p for p in region_outs if p.name in made and read_outside(p.name)]
    if part and rest and (inside or outside):
        refused = [may_rebuild(fusion, part, inside), may_rebuild(fusion, rest, inside)]
        if not any(refused):
            outs = unique_proxies([*inside, *outside])
            rest_outs = [p for p in region_outs if p.name not in made]
            rest_bsym = None
            if rest_outs:
                rest_ins = [p for p in fusion.flat_proxy_args if any(_reads(s, p.name) for s in rest)]
                rest_bsym = th.rebuild_fusion(fusion, rest, unique_proxies([*rest_ins, *inside]), rest_outs)
            return _part_unit(fusion, position, constant, part, outs, rest_bsym)
    made = {p.name for s in whole_part for p in s.flat_proxy_outs}
    outside = [p for p in region_outs if p.name in made and read_outside(p.name)]
    if not outside:
        return None
    part = _needed(whole_part, {p.name for p in outside})
    if may_rebuild(fusion, part, ()) is not None:
        return None
    unit = _part_unit(fusion, position, constant, part, outside, None)
    unit.split = False
    return unit


def _others(body: list[th.BoundSymbol], part: list[th.BoundSymbol]) -> list[th.BoundSymbol]:
    """The bound symbols of ``body`` not in ``part``, in order."""
    taken = {id(b) for b in part}
    return [b for b in body if id(b) not in taken]


def _cut(body: list[th.BoundSymbol], part: list[th.BoundSymbol]) -> list[th.BoundSymbol]:
    """``part`` less the ops that make a value it must not hand to the rest of the region (``ops.cut_hazards``:
    one the whole fusion may have kept unrounded, or a product it may have contracted), and less every op of
    ``part`` that reads what those make: they run with the rest, which then gets the values they read."""
    while True:
        made = {p.name for s in part for p in s.flat_proxy_outs}
        rest = _others(body, part)
        crossing = unique_proxies(p for s in rest for p in s.flat_proxy_args if p.name in made)
        hazards = cut_hazards(part, crossing)
        if not hazards:
            return part
        moved: set[str] = set(hazards)
        kept = []
        for s in part:
            outs = {p.name for p in s.flat_proxy_outs}
            if outs & moved or any(p.name in moved for p in s.flat_proxy_args):
                moved |= outs
            else:
                kept.append(s)
        part = kept


def _part_unit(fusion, position, constant, part, outs, rest_bsym) -> _Unit:
    reads = [p for p in fusion.flat_proxy_args if p.name in constant and any(_reads(s, p.name) for s in part)]
    bsym = th.rebuild_fusion(fusion, part, reads, outs)
    return _Unit(position, "part", bsym, [p.name for p in reads], list(outs), True, rest_bsym, len(part))


def _needed(bsyms: list[th.BoundSymbol], wanted: set[str]) -> list[th.BoundSymbol]:
    """The bound symbols that ``wanted`` names depend on, in order."""
    wanted = set(wanted)
    kept = []
    for b in reversed(bsyms):
        if any(p.name in wanted for p in b.flat_proxy_outs):
            kept.append(b)
            wanted.update(p.name for p in b.flat_proxy_args)
    return kept[::-1]


def _fixed(outs: Iterable[th.Proxy]) -> bool:
    """Outputs that are the same on every call: static shapes, and nothing autograd must track."""
    return not any(th.has_symbolic_shape(p) or getattr(p, "requires_grad", False) for p in outs)


def _reads(bsym: th.BoundSymbol, name: str) -> bool:
    return any(p.name == name for p in bsym.flat_proxy_args)


def _units(bsyms: list[th.BoundSymbol], readers_of: dict[str, set[int]], may_rebuild: MayRebuild) -> dict[int, _Unit]:
    """Every bound symbol (or region part) computed only from constants and input-independent work."""
    units: dict[int, _Unit] = {}
    constant: set[str] = set()
    for i, b in enumerate(bsyms):
        if th.is_plumbing(b):
            continue
        reads = [p.name for p in unique_proxies(b.flat_proxy_args)]
        outs = list(b.flat_proxy_outs)
        whole = bool(outs) and all(n in constant for n in reads) and hoistable(b) and _fixed(outs)
        whole = whole and (not th.is_fusion(b) or may_rebuild(b, [], ()) is None)
        unit = None
        if whole:
            unit = _Unit(i, "region" if th.is_fusion(b) else "op", b, reads, outs)
        elif th.is_fusion(b):

            def read_outside(name: str, i: int = i) -> bool:
                return any(j != i for j in readers_of.get(name, ()))

            try:
                unit = _region_part(b, i, constant, read_outside, may_rebuild)
            except Exception:
                unit = None
        if unit is not None:
            units[i] = unit
            constant.update(p.name for p in unit.outs)
    return units


def _readers_after(bsyms: list[th.BoundSymbol], units: dict[int, _Unit], chosen: set[int]) -> dict[str, list[int]]:
    """For each name, the positions that read it once ``chosen`` units are hoisted (the return included)."""
    found: dict[str, list[int]] = defaultdict(list)
    for j, b in enumerate(bsyms):
        if th.is_comment_or_del(b):
            continue
        unit = units.get(j) if j in chosen else None
        if unit is not None and unit.kind != "part":
            continue
        if unit is not None and unit.split:
            if unit.rest is None:
                continue
            b = unit.rest
        for p in unique_proxies(b.flat_proxy_args):
            found[p.name].append(j)
    return found


def _settle(
    bsyms: list[th.BoundSymbol],
    units: dict[int, _Unit],
    chosen: set[int],
    groups: _Groups,
    caller: set[str],
) -> set[int]:
    """Drop units until what remains is safe to compute once (the rules are in the module docstring)."""
    chosen = set(chosen)
    caller_groups = {groups.find(n) for n in caller}
    writes: dict[int, bool] = {}

    def writes_at(b: th.BoundSymbol) -> bool:
        if id(b) not in writes:
            writes[id(b)] = not th.is_plumbing(b) and writes_inputs(b)
        return writes[id(b)]

    while True:
        drop = _unsafe(bsyms, units, chosen, groups, caller_groups, writes_at)
        if not drop:
            return chosen
        chosen -= drop


def _unsafe(bsyms, units, chosen, groups, caller_groups, writes_at) -> set[int]:
    """The chosen units that must not be hoisted as things stand: an input not hoisted too; an output
    sharing memory with a returned tensor or with one an op left in the trace may write; a region left
    whole that still hands out what the hoisted call makes; a tensor read in the trace before a hoisted
    in-place write to it."""
    made = {p.name for pos in chosen for p in units[pos].outs}
    readers = _readers_after(bsyms, units, chosen)
    written_outside: set[str] = set()
    first_read: dict[str, int] = {}
    for name, positions in readers.items():
        g = groups.find(name)
        first_read[g] = min(first_read.get(g, positions[0]), positions[0])
        if any(writes_at(_run_at(bsyms, units, chosen, j)) for j in positions):
            written_outside.add(g)
    last_write: dict[str, int] = {}
    for pos in chosen:
        if writes_at(units[pos].bsym):
            for name in _tensor_names(units[pos].bsym.flat_proxy_args):
                g = groups.find(name)
                last_write[g] = max(last_write.get(g, pos), pos)

    def unsafe(unit: _Unit, p: th.Proxy) -> bool:
        g = groups.find(p.name)
        if g in caller_groups or g in written_outside:
            return True
        if unit.kind == "part" and not unit.split and p.name in readers:
            return True
        return g in last_write and first_read.get(g, last_write[g]) < last_write[g]

    return {
        pos
        for pos in chosen
        if any(n not in made for n in units[pos].reads) or any(unsafe(units[pos], p) for p in units[pos].outs)
    }


def _run_at(bsyms: list[th.BoundSymbol], units: dict[int, _Unit], chosen: set[int], j: int) -> th.BoundSymbol:
    """What runs at position ``j`` of the trace once ``chosen`` is hoisted (a split region: its rest)."""
    unit = units.get(j) if j in chosen else None
    if unit is not None and unit.split and unit.rest is not None:
        return unit.rest
    return bsyms[j]


def _components(units: dict[int, _Unit], chosen: set[int], groups: _Groups) -> list[list[int]]:
    """The chosen units in connected pieces (through the tensors they pass on or share memory with)."""
    links = _Groups()
    made = {p.name: pos for pos in chosen for p in units[pos].outs}
    by_group: dict[str, int] = {}
    for pos in sorted(chosen):
        links.find(str(pos))
        for n in units[pos].reads:
            links.union(str(pos), str(made[n]))
        for p in units[pos].outs:
            g = groups.find(p.name)
            if g in by_group:
                links.union(str(pos), str(by_group[g]))
            by_group[g] = pos
    pieces: dict[str, list[int]] = defaultdict(list)
    for pos in sorted(chosen):
        pieces[links.find(str(pos))].append(pos)
    return sorted(pieces.values())


def _describe(
    piece: list[int], units: dict[int, _Unit], readers: dict[str, list[int]], groups: _Groups, saved: set[str]
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

    found = _analyse(trace, bsyms, recorded, metadata_ops)
    saved = set(th.returned_names(trace)[1])
    results: list[Hoist] = []
    pieces: list[tuple[list[int], Hoist]] = []
    if found is not None:
        units, groups, chosen = found
        readers = _readers_after(bsyms, units, chosen)
        inputs = {groups.find(p.name) for p in th.trace_inputs(trace, unpacked=True)}
        segments = communication_segments(bsyms)
        for piece in _components(units, chosen, groups):
            described = _describe(piece, units, readers, groups, saved)
            if not (described.ops_saved and described.outputs):
                continue
            described.segment = segments[piece[0]]
            if any(segments[pos] != described.segment for pos in piece):
                described.hoisted = False
                described.reason = "it spans a communication op (nothing is moved across one)"
            elif _reaches_input_write(bsyms, units, chosen, set(described.outputs), groups, inputs):
                described.hoisted = False
                described.reason = "its values reach an in-place write of an input (an effect outside the trace)"
            pieces.append((piece, described))
        results = [d for _, d in pieces]
    if refusals:
        results += _refused(trace, bsyms, set() if found is None else found[2], refusals, metadata_ops)
    if not pieces:
        return trace, results, {}
    signatures = _share_identical(pieces, units)
    kept = _within_budget(pieces, max_bytes)
    if not kept:
        return trace, results, {}
    new, caches = _rewrite(trace, bsyms, units, pieces, kept, signatures, segments)
    return new, results, caches


def _analyse(
    trace: th.TraceCtx, bsyms: list[th.BoundSymbol], may_rebuild: MayRebuild, metadata_ops: frozenset[str]
) -> tuple[dict[int, _Unit], _Groups, set[int]] | None:
    """The units of input-independent work, the memory groups, and the units safe to compute once; None: no unit."""
    units = _units(bsyms, readers_map(bsyms), may_rebuild)
    if not units:
        return None
    caller, _ = th.returned_names(trace)
    groups = _alias_groups([*bsyms, *(u.rest for u in units.values() if u.rest is not None)], metadata_ops)
    for u in units.values():
        if u.kind == "part":
            for out, ins in aliased_outputs(u.bsym, metadata_ops).items():
                for name in ins:
                    groups.union(out, name)
    return units, groups, _settle(bsyms, units, set(units), groups, caller)


def _refused(
    trace: th.TraceCtx,
    bsyms: list[th.BoundSymbol],
    done: set[int],
    refusals: dict[str, list[Refusal]],
    metadata_ops: frozenset[str],
) -> list[Hoist]:
    """The work that would be hoisted were ``may_rebuild`` to allow everything, less what is (``done``): one kept
    piece each, with the refusals of its regions and the option setting that would hoist it."""
    found = _analyse(trace, bsyms, lambda fusion, body, crossing: None, metadata_ops)
    if found is None:
        return []
    units, groups, chosen = found
    readers = _readers_after(bsyms, units, chosen)
    saved = set(th.returned_names(trace)[1])
    kept = []
    for piece in _components(units, chosen, groups):
        left = [pos for pos in piece if pos not in done]
        why = list(dict.fromkeys(r for pos in left for r in refusals.get(bsyms[pos].sym.name, ())))
        if not why:
            continue
        described = _describe(left, units, readers, groups, saved)
        if not (described.ops_saved and described.outputs):
            continue
        described.hoisted = False
        described.option = ", ".join(dict.fromkeys(r.option for r in why))
        described.reason = "; ".join(r.why for r in why)
        kept.append(described)
    return kept


def _reaches_input_write(bsyms, units, chosen, outputs: set[str], groups: _Groups, inputs: set[str]) -> bool:
    """Whether values computed from ``outputs`` (through the ops left in the trace) reach an op that may
    write a tensor sharing memory with an input of the trace."""
    tainted = set(outputs)
    for j, b in enumerate(bsyms):
        unit = units.get(j) if j in chosen else None
        if th.is_plumbing(b) or (unit is not None and unit.leaves_trace):
            continue
        run = _run_at(bsyms, units, chosen, j)
        if not any(p.name in tainted for p in run.flat_proxy_args):
            continue
        if writes_inputs(run) and any(groups.find(n) in inputs for n in _tensor_names(run.flat_proxy_args)):
            return True
        tainted.update(p.name for p in run.flat_proxy_outs)
    return False


class _Signature:
    """What a piece computes, up to the names of its proxies and regions (equal signatures, equal values),
    and which proxy of the piece stands at each place of it (to hand out one piece's tensors for another's)."""

    def __init__(self, piece: list[int], units: dict[int, _Unit]) -> None:
        self.names: dict[str, int] = {}
        self.proxies: dict[int, th.Proxy] = {}
        self.key = tuple(
            (units[pos].kind, units[pos].split, units[pos].rest is None, self._of(units[pos].bsym)) for pos in piece
        )

    def _canon(self, x: object) -> object:
        if isinstance(x, th.Proxy):
            index = self.names.setdefault(x.name, len(self.names))
            self.proxies.setdefault(index, x)
            meta = (tuple(x.shape), repr(x.dtype), repr(x.device)) if isinstance(x, th.TensorProxy) else None
            return ("proxy", index, type(x).__name__, meta)
        if isinstance(x, (list, tuple)):
            return (type(x).__name__, tuple(self._canon(v) for v in x))
        if isinstance(x, dict):
            return ("dict", tuple((k, self._canon(v)) for k, v in sorted(x.items(), key=lambda kv: str(kv[0]))))
        if isinstance(x, slice):
            return ("slice", self._canon(x.start), self._canon(x.stop), self._canon(x.step))
        return ("constant", type(x).__name__, repr(x))

    def _of(self, b: th.BoundSymbol) -> tuple:
        name = "fusion" if th.is_fusion(b) else b.sym.name
        executor = th.executed_by(b)
        pairs = _alias_update_pairs(b)
        if pairs is not None:
            # Thunder lists the tensors of an alias update in no fixed order: take them by place in the piece.
            pairs.sort(key=lambda pair: self.names.get(pair[0].name, len(self.names)))
            return (name, executor, tuple((self._canon(a), self._canon(o)) for a, o in pairs))
        subs = tuple(self._of(s) for s in th.fusion_body(b))
        return (name, executor, self._canon(b.args), self._canon(b.kwargs), self._canon(b.output), subs)

    def counterpart(self, other: _Signature, p: th.Proxy) -> th.Proxy:
        """The proxy of ``other`` (an equal signature) at the place ``p`` has in this one."""
        return other.proxies[self.names[p.name]]


def _alias_update_pairs(b: th.BoundSymbol) -> list[tuple[th.Proxy, th.Proxy]] | None:
    if b.sym.name != "update_aliases" or len(b.args) != 1 or b.kwargs:
        return None
    (args,) = b.args
    outs = b.output
    if not isinstance(args, (tuple, list)) or not isinstance(outs, (tuple, list)) or len(args) != len(outs):
        return None
    if not all(isinstance(x, th.Proxy) for x in (*args, *outs)):
        return None
    return list(zip(args, outs, strict=True))


def _share_identical(pieces: list[tuple[list[int], Hoist]], units: dict[int, _Unit]) -> dict[int, _Signature]:
    """Mark each piece that computes exactly what an earlier piece between the same communication ops
    does (one mask per layer): it shares the earlier piece's tensors and keeps no bytes of its own.
    Returns the signatures of the pieces."""
    first: dict[tuple, int] = {}
    signatures: dict[int, _Signature] = {}
    for index, (piece, described) in enumerate(pieces):
        if not described.hoisted:
            continue
        signatures[index] = signature = _Signature(piece, units)
        key = (described.segment, signature.key)
        if key in first:
            described.same_as, described.nbytes = first[key], 0
        else:
            first[key] = index
    return signatures


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
            described.hoisted = False
            described.reason = f"its outputs take {described.nbytes} bytes, {left} left under hoist_max_bytes"
    for i, (_, described) in enumerate(pieces):
        if described.same_as is not None:
            if described.same_as in kept:
                kept.add(i)
            else:
                described.hoisted = False
                described.reason = f"the same as piece {described.same_as}, which is not hoisted"
    return kept


def _rewrite(
    trace: th.TraceCtx,
    bsyms: list[th.BoundSymbol],
    units: dict[int, _Unit],
    pieces: list[tuple[list[int], Hoist]],
    kept: set[int],
    signatures: dict[int, _Signature],
    segments: list[int],
) -> tuple[th.TraceCtx, dict[str, HoistedValues]]:
    """The trace with the kept pieces run by hoisted calls: one per stretch between communication ops,
    placed before the first op that reads it (at the latest where its stretch ends).

    A piece sharing another's tensors is not run: the call hands out the other's tensors under its names.
    """
    gone = {pos for i in kept for pos in pieces[i][0]}
    readers = _readers_after(bsyms, units, gone)
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
    groups = _alias_groups(trace.bound_symbols, frozenset(metadata_ops))
    written = {
        groups.find(name)
        for b in trace.bound_symbols
        if not th.is_plumbing(b) and writes_inputs(b)
        for name in _tensor_names(b.flat_proxy_args)
    }
    hit = sorted(n for n in present if groups.find(n) in written)
    for name in hit:
        saved[name].disable()
    return hit
