"""What hoisting could move: the units of input-independent work of a trace (ops outside fusions, whole regions,
the input-independent part of a region), the memory groups of its tensors, and the units safe to compute once."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from .. import _thunder as th
from ..ops import aliased_outputs, cut_can_move, cut_hazards, hoistable, may_alias_inputs, writes_inputs
from .rewrite import readers as readers_map


@dataclass(frozen=True)
class Refusal:
    """Why ``may_rebuild`` refused to rebuild ``region`` of ``executor``, as facts (``unguarded``: the executors
    option leaves it alone; else the ops and roundings that could change its bits), and the option setting under
    which it would not (``exact_only=False``)."""

    region: str
    executor: str
    option: str
    unguarded: bool = False
    inexact: tuple[str, ...] = ()  # ops that could round differently once rebuilt
    per_element: tuple[str, ...] = ()  # of those, the ones computed by code that depends on the fusion around them
    fma: tuple[str, ...] = ()  # products read by an addition the executor may contract
    cut: tuple[tuple[str, str], ...] = ()  # values rounded inside the region and handed across the split, and how

    def facts(self) -> dict[str, Any]:
        """The refusal as plain values (what :func:`..reasons.refusal_words` words)."""
        return {
            "region": self.region,
            "executor": self.executor,
            "unguarded": self.unguarded,
            "inexact": list(self.inexact),
            "per_element": list(self.per_element),
            "fma": list(self.fma),
            "cut": dict(self.cut),
        }


# Why a piece of input-independent work that may be rebuilt is not hoisted: it spans a communication op, its values
# reach an in-place write of an input, its outputs do not fit the byte budget, or it is the same as a piece not hoisted.
NotTaken = Literal["communication", "input_write", "budget", "same_as"]


# may_rebuild(fusion, body, crossing): None where the pass may rebuild ``fusion`` with ``body`` (empty: move it
# whole), where ``crossing`` are the values ``body`` hands to, or takes from, the other piece of a split region;
# otherwise why not.
MayRebuild = Callable[[th.BoundSymbol, list[th.BoundSymbol], Sequence[th.Proxy]], "Refusal | None"]


@dataclass
class Unit:
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
    not_taken: NotTaken | None = None  # why a piece that may be rebuilt is kept
    budget_left: int = 0  # with not_taken "budget": the bytes left under runtime.hoist_max_bytes
    refused: list[Refusal] = field(default_factory=list)  # why its regions may not be rebuilt
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


class Groups:
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


def tensor_names(proxies: Iterable[th.Proxy]) -> list[str]:
    return [p.name for p in proxies if isinstance(p, th.TensorProxy)]


def alias_groups(bsyms: Iterable[th.BoundSymbol], metadata_ops: frozenset[str]) -> Groups:
    groups = Groups()
    for b in bsyms:
        if th.is_plumbing(b):
            continue
        if th.subsymbols(b):
            for out, ins in aliased_outputs(b, metadata_ops).items():
                for name in ins:
                    groups.union(out, name)
        elif may_alias_inputs(b, metadata_ops):
            for out in tensor_names(b.flat_proxy_outs):
                for name in tensor_names(b.flat_proxy_args):
                    groups.union(out, name)
    return groups


def _region_part(
    fusion: th.BoundSymbol,
    position: int,
    constant: set[str],
    read_outside: Callable[[str], bool],
    may_rebuild: MayRebuild,
) -> Unit | None:
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
    inside = th.unique_proxies(p for s in rest for p in s.flat_proxy_args if p.name in made)
    outside = [p for p in region_outs if p.name in made and read_outside(p.name)]
    if part and rest and (inside or outside):
        refused = [may_rebuild(fusion, part, inside), may_rebuild(fusion, rest, inside)]
        if not any(refused):
            outs = th.unique_proxies([*inside, *outside])
            rest_outs = [p for p in region_outs if p.name not in made]
            rest_bsym = None
            if rest_outs:
                rest_ins = [p for p in fusion.flat_proxy_args if any(_reads(s, p.name) for s in rest)]
                rest_bsym = th.rebuild_fusion(fusion, rest, th.unique_proxies([*rest_ins, *inside]), rest_outs)
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
        crossing = th.unique_proxies(p for s in rest for p in s.flat_proxy_args if p.name in made)
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


def _part_unit(fusion, position, constant, part, outs, rest_bsym) -> Unit:
    reads = [p for p in fusion.flat_proxy_args if p.name in constant and any(_reads(s, p.name) for s in part)]
    bsym = th.rebuild_fusion(fusion, part, reads, outs)
    return Unit(position, "part", bsym, [p.name for p in reads], list(outs), True, rest_bsym, len(part))


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


def _units(bsyms: list[th.BoundSymbol], readers_of: dict[str, set[int]], may_rebuild: MayRebuild) -> dict[int, Unit]:
    """Every bound symbol (or region part) computed only from constants and input-independent work."""
    units: dict[int, Unit] = {}
    constant: set[str] = set()
    for i, b in enumerate(bsyms):
        if th.is_plumbing(b):
            continue
        reads = [p.name for p in th.unique_proxies(b.flat_proxy_args)]
        outs = list(b.flat_proxy_outs)
        whole = bool(outs) and all(n in constant for n in reads) and hoistable(b) and _fixed(outs)
        whole = whole and (not th.is_fusion(b) or may_rebuild(b, [], ()) is None)
        unit = None
        if whole:
            unit = Unit(i, "region" if th.is_fusion(b) else "op", b, reads, outs)
        elif th.is_fusion(b):

            def read_outside(name: str, i: int = i) -> bool:
                return any(j != i for j in readers_of.get(name, ()))

            try:
                unit = _region_part(b, i, constant, read_outside, may_rebuild)
            except Exception:  # hoisting is an optimisation: any failure to split the region hoists nothing of it
                unit = None
        if unit is not None:
            units[i] = unit
            constant.update(p.name for p in unit.outs)
    return units


def readers_after(bsyms: list[th.BoundSymbol], units: dict[int, Unit], chosen: set[int]) -> dict[str, list[int]]:
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
        for p in th.unique_proxies(b.flat_proxy_args):
            found[p.name].append(j)
    return found


def _settle(
    bsyms: list[th.BoundSymbol],
    units: dict[int, Unit],
    chosen: set[int],
    groups: Groups,
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
    readers = readers_after(bsyms, units, chosen)
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
            for name in tensor_names(units[pos].bsym.flat_proxy_args):
                g = groups.find(name)
                last_write[g] = max(last_write.get(g, pos), pos)

    def unsafe(unit: Unit, p: th.Proxy) -> bool:
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


def _run_at(bsyms: list[th.BoundSymbol], units: dict[int, Unit], chosen: set[int], j: int) -> th.BoundSymbol:
    """What runs at position ``j`` of the trace once ``chosen`` is hoisted (a split region: its rest)."""
    unit = units.get(j) if j in chosen else None
    if unit is not None and unit.split and unit.rest is not None:
        return unit.rest
    return bsyms[j]


def components(units: dict[int, Unit], chosen: set[int], groups: Groups) -> list[list[int]]:
    """The chosen units in connected pieces (through the tensors they pass on or share memory with)."""
    links = Groups()
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


def analyse(
    trace: th.TraceCtx, bsyms: list[th.BoundSymbol], may_rebuild: MayRebuild, metadata_ops: frozenset[str]
) -> tuple[dict[int, Unit], Groups, set[int]] | None:
    """The units of input-independent work, the memory groups, and the units safe to compute once; None: no unit."""
    units = _units(bsyms, readers_map(bsyms), may_rebuild)
    if not units:
        return None
    caller, _ = th.returned_names(trace)
    groups = alias_groups([*bsyms, *(u.rest for u in units.values() if u.rest is not None)], metadata_ops)
    for u in units.values():
        if u.kind == "part":
            for out, ins in aliased_outputs(u.bsym, metadata_ops).items():
                for name in ins:
                    groups.union(out, name)
    return units, groups, _settle(bsyms, units, set(units), groups, caller)


def reaches_input_write(bsyms, units, chosen, outputs: set[str], groups: Groups, inputs: set[str]) -> bool:
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
        if writes_inputs(run) and any(groups.find(n) in inputs for n in tensor_names(run.flat_proxy_args)):
            return True
        tainted.update(p.name for p in run.flat_proxy_outs)
    return False
