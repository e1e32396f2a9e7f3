"""Pieces of hoisted work that compute exactly what an earlier one does (litgpt builds the same mask in every
layer): found by a signature of what they compute, up to names, so that they hand out the earlier one's tensors."""

from __future__ import annotations

from .. import _thunder as th
from .hoist_units import Hoist, Unit


class Signature:
    """What a piece computes, up to the names of its proxies and regions (equal signatures, equal values),
    and which proxy of the piece stands at each place of it (to hand out one piece's tensors for another's)."""

    def __init__(self, piece: list[int], units: dict[int, Unit]) -> None:
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

    def counterpart(self, other: Signature, p: th.Proxy) -> th.Proxy:
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


def share_identical(pieces: list[tuple[list[int], Hoist]], units: dict[int, Unit]) -> dict[int, Signature]:
    """Mark each piece that computes exactly what an earlier piece between the same communication ops
    does (one mask per layer): it shares the earlier piece's tensors and keeps no bytes of its own.
    Returns the signatures of the pieces."""
    first: dict[tuple, int] = {}
    signatures: dict[int, Signature] = {}
    for index, (piece, described) in enumerate(pieces):
        if not described.hoisted:
            continue
        signatures[index] = signature = Signature(piece, units)
        key = (described.segment, signature.key)
        if key in first:
            described.same_as, described.nbytes = first[key], 0
        else:
            first[key] = index
    return signatures
